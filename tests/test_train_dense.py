"""`jaxbert train --task embedding` of a sentence-transformers model with Dense modules (LaBSE's kind) trains them
with the model, as sentence-transformers does: one optimizer step through the CLI equals one PyTorch step of the
SentenceTransformer (loss, gradient norm, every parameter, the Dense ones included), and OUT/final is a directory
that SentenceTransformer reads with encode = jaxbert's embed."""

import json
import os

import numpy as np
import pytest
from conftest import adamw_as_trainer, model_dir, train_args
from safetensors.numpy import load_file

import jaxbert
from jaxbert.cli import main

torch = pytest.importorskip("torch")
st = pytest.importorskip("sentence_transformers")
from sentence_transformers.sentence_transformer import losses  # noqa: E402
from sentence_transformers.sentence_transformer.modules import Dense, Dropout, Normalize, Pooling  # noqa: E402

SMALL = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, max_position_embeddings=64, num_hidden_layers=2)
LR, DECAY, CLIP = 5e-5, 0.1, 0.05
WORDS = "the quick brown fox jumps over lazy dogs while sophisticated researchers contemplate paris weather".split()
TEXTS = ["a lazy fox", "the weather in paris", "sophisticated researchers contemplate the quick brown dogs"]


def _records(n=8):
    rng = np.random.default_rng(5)
    text = lambda: " ".join(rng.choice(WORDS, int(rng.integers(2, 9))))  # noqa: E731
    return [{"anchor": text(), "positive": text(), "negative": text()} for _ in range(n)]


def _source(root) -> str:
    """A small random BERT saved by sentence-transformers as Transformer, Pooling cls, Dropout, three Dense
    (tanh; GELU with residual; Identity without bias, residual projected 24 -> 16), Normalize."""
    base = st.SentenceTransformer(model_dir(root / "model", **SMALL), device="cpu")
    base[0].max_seq_length = 32
    torch.manual_seed(0)
    dense = [
        Dense(32, 24, activation_function=torch.nn.Tanh()),
        Dense(24, 24, activation_function=torch.nn.GELU(), use_residual=True),
        Dense(24, 16, bias=False, activation_function=None, use_residual=True),
    ]
    with torch.no_grad():
        for layer in dense:
            layer.linear.weight.mul_(3.0)
    modules = [base[0], Pooling(32, "cls"), Dropout(0.0), *dense, Normalize()]
    st.SentenceTransformer(modules=modules, device="cpu").save(str(root / "st"))
    return str(root / "st")


def _torch_step(model_path, records):
    """One step of SentenceTransformer + MNRL + AdamW (no decay on biases and LayerNorm, clipping) on the batch."""
    model = st.SentenceTransformer(model_path, device="cpu")
    model.train()
    opt = adamw_as_trainer(model, LR, DECAY)
    features = [model.preprocess([r[k] for r in records]) for k in ("anchor", "positive", "negative")]
    loss = losses.MultipleNegativesRankingLoss(model)(features, None)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
    opt.step()
    return float(loss.detach()), float(norm), model


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("dense")
    source = _source(root)
    data = root / "data.jsonl"
    records = _records()
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    flags = ["--max-seq-length", 32, "--max-steps", 1, "--learning-rate", LR, "--weight-decay", DECAY]
    flags += ["--max-grad-norm", CLIP, "--logging-steps", 1, "--global-batch-size", 8]
    assert main(train_args("embedding", source, data, root / "out", *flags)) == 0  # no --pooling: the model's
    return root, source, records


def test_one_step_trains_the_dense_modules_as_pytorch(trained):
    root, source, records = trained
    loss, norm, pt = _torch_step(source, records)
    log = [json.loads(line) for line in open(root / "out" / "metrics.jsonl")]
    step1 = next(r for r in log if r["step"] == 1 and "loss" in r)
    assert abs(step1["loss"] - loss) <= 1e-5 * max(1, loss), (step1, loss)
    assert abs(step1["grad_norm"] - norm) <= 1e-4 * norm and norm > CLIP
    final = root / "out" / "final"
    modules = json.load(open(final / "modules.json"))
    assert [m["type"].rsplit(".", 1)[1] for m in modules] == ["Transformer", "Pooling", "Dropout", "Dense", "Dense",
                                                              "Dense", "Normalize"]  # fmt: skip
    ours = load_file(str(final / "model.safetensors"))
    theirs = {k: v.detach().numpy() for k, v in pt[0].auto_model.state_dict().items()}
    initial = load_file(os.path.join(source, "model.safetensors"))
    pairs = [(k, ours[k], theirs[k], initial[k]) for k in ours if not k.endswith("attention.self.key.bias")]
    for i in (3, 4, 5):  # the Dense modules, in sentence-transformers' own files on both sides
        mine = load_file(str(final / modules[i]["path"] / "model.safetensors"))
        start = load_file(os.path.join(source, f"{i}_Dense", "model.safetensors"))
        want = {k: v.detach().numpy() for k, v in pt[i].state_dict().items()}
        assert sorted(mine) == sorted(want), (sorted(mine), sorted(want))
        pairs += [(f"{i}_Dense/{k}", mine[k], want[k], start[k]) for k in mine]
    assert any(k == "5_Dense/residual.weight" for k, *_ in pairs)
    diff = {k: float(np.abs(a - b).max()) for k, a, b, _ in pairs}
    assert max(diff.values()) <= 1e-6, sorted(diff.items(), key=lambda kv: -kv[1])[:3]
    for k, a, _, start in pairs:  # everything but the pooler moved
        moved = float(np.abs(a - start).max())
        assert moved == 0 if k.startswith("pooler.") else moved > LR / 10, (k, moved)


def test_the_trained_directory_is_read_by_sentence_transformers(trained):
    root, _, _ = trained
    final = str(root / "out" / "final")
    want = st.SentenceTransformer(final, device="cpu").encode(TEXTS, convert_to_numpy=True)
    got = jaxbert.load(final).embed(TEXTS)
    assert got.shape == want.shape == (3, 16) and np.abs(got - want).max() <= 1e-5


def test_a_dropout_after_normalize_is_refused_and_pooling_trains_without_the_modules(trained, tmp_path):
    """jaxbert drops out before it normalizes; a Dropout after Normalize would be another pipeline in training."""
    import shutil

    from jaxbert.train.config import TrainConfig
    from jaxbert.train.task_embedding import pipeline_steps

    _, source, _ = trained
    model = str(shutil.copytree(source, tmp_path / "m"))
    cfg = lambda **kw: TrainConfig(model=model, task="embedding", train_file="x", output_dir="o", **kw)  # noqa: E731
    assert [type(s).__name__ for s in pipeline_steps(cfg())] == ["DropoutSpec", *["DenseSpec"] * 3]
    assert pipeline_steps(cfg(pooling="mean")) == ()  # jaxbert's own pipeline
    modules = json.load(open(os.path.join(model, "modules.json")))
    modules.append({"idx": 7, "name": "7", "path": "7_Dropout", "type": "sentence_transformers.models.Dropout"})
    json.dump(modules, open(os.path.join(model, "modules.json"), "w"))
    os.makedirs(os.path.join(model, "7_Dropout"))
    json.dump({"dropout": 0.1}, open(os.path.join(model, "7_Dropout", "config.json"), "w"))
    with pytest.raises(ValueError, match=r"the Dropout at '7_Dropout' after Normalize is not trained by jaxbert"):
        pipeline_steps(cfg())
