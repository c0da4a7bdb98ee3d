"""`jaxbert train --task embedding --prompts`: sentence-transformers' training prompts (one prompt for every column,
or COLUMN=PROMPT pairs) put before the texts as its trainer's data collator puts them, their tokens left out of
the pooling with include_prompt false; a directory's default prompt is not put (its trainer puts only `prompts`);
one optimizer step equals sentence-transformers' own; OUT/final records the prompts; bad prompts are one line."""

import json
import os

import numpy as np
import pytest
from conftest import adamw_as_trainer, cli_fails, model_dir, train_args
from safetensors.numpy import load_file
from test_train_embedding import CLIP, DECAY, LR, SMALL, _log, _records, _st_loss

import jaxbert
from jaxbert.cli import main
from jaxbert.sentence_out import write_sentence_files

torch = pytest.importorskip("torch")
st = pytest.importorskip("sentence_transformers")
from sentence_transformers.base.trainer import BaseTrainer  # noqa: E402
from sentence_transformers.sentence_transformer.data_collator import SentenceTransformerDataCollator  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:The MultipleNegativesSymmetricRankingLoss is deprecated")

DEFAULT = {"prompts": {"query": "query: ", "passage": "passage: "}, "default_prompt_name": "query"}
CASES = {  # name: (pooling, include_prompt, negatives, --prompts values, sentence-transformers' prompts)
    "one-prompt-cls-included": ("cls", True, False, ["represent this sentence: "], "represent this sentence: "),
    "pairs-cls-left-out": (
        "cls", False, True, ["anchor=search query: ", "negative=doc: "],
        {"anchor": "search query: ", "negative": "doc: "},
    ),
    "pairs-mean-left-out": (
        "mean", False, False, ["anchor=query: ", "positive=a much longer passage prompt: "],
        {"anchor": "query: ", "positive": "a much longer passage prompt: "},
    ),
}  # fmt: skip


def _source(root, pooling, include) -> str:
    """A sentence-transformers directory with a default prompt (which training does not put, as its trainer)."""
    # One layer, not SMALL's two: the prompts are the point (a step's depth is test_train_embedding.py's), and
    # compiling the train and eval steps' unrolled layers was most of each run's time.
    model = model_dir(root / "model", **{**SMALL, "num_hidden_layers": 1})
    write_sentence_files(model, 32, pooling, False, 32, include_prompt=include)
    (root / "model" / "config_sentence_transformers.json").write_text(json.dumps(DEFAULT))
    return model


def _flags(*extra):
    flags = ["--max-seq-length", 32, "--max-steps", 1, "--learning-rate", LR, "--weight-decay", DECAY]
    return [*flags, "--max-grad-norm", CLIP, "--logging-steps", 1, "--global-batch-size", 8, *extra]


def _st_step(model_path, records, prompts):
    """One step of sentence-transformers' trainer's pieces: its data collator with `prompts` (prompt_length
    included), collect_features, MNRL, AdamW as the Trainer's -> (loss, model)."""
    model = st.SentenceTransformer(model_path, device="cpu")
    model.train()
    opt = adamw_as_trainer(model, LR, DECAY)
    batch = SentenceTransformerDataCollator(preprocess_fn=model.preprocess, prompts=prompts)(records)
    features, labels = BaseTrainer.collect_features(None, batch)
    loss = _st_loss(False, model)(features, labels)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
    opt.step()
    return float(loss.detach()), model


@pytest.mark.parametrize("name", list(CASES))
def test_one_step_with_prompts_equals_sentence_transformers(name, tmp_path):
    pooling, include, negatives, given, prompts = CASES[name]
    model = _source(tmp_path, pooling, include)
    records = _records(negatives=negatives)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main(train_args("embedding", model, data, tmp_path / "out", *_flags("--prompts", *given))) == 0
    initial = load_file(os.path.join(model, "model.safetensors"))
    loss, pt = _st_step(model, records, prompts)
    step1 = next(r for r in _log(tmp_path / "out") if r["step"] == 1 and "loss" in r)
    assert abs(step1["loss"] - loss) <= 1e-5 * max(1, loss), (step1, loss)
    ours = load_file(str(tmp_path / "out" / "final" / "model.safetensors"))
    theirs = {k: v.detach().numpy() for k, v in pt[0].auto_model.state_dict().items()}
    # Adam's first step moves an element by lr·g/(|g| + eps): where g nearly cancels (within a hundred eps of 0,
    # as the attention key bias's exact zero), it follows g's rounding; those few are held to Adam's bound
    # (as test_train_tasks.after_one_step), every other element to 1e-6.
    grads = {k: p.grad.numpy() for k, p in pt[0].auto_model.named_parameters() if p.grad is not None}
    diff, loose = {}, 0
    for k in ours:
        d, g = np.abs(ours[k] - theirs[k]), np.abs(grads.get(k, np.zeros(ours[k].shape)))
        near = (g > 0) & (g < 100 * 1e-8) | k.endswith("attention.self.key.bias")
        assert d[near].max(initial=0.0) <= 2 * LR, k
        diff[k], loose = float(d[~near].max(initial=0.0)), loose + int(near.sum() * (not k.endswith("key.bias")))
    assert max(diff.values()) <= 1e-6, sorted(diff.items(), key=lambda kv: -kv[1])[:3]
    assert loose <= 0.001 * sum(v.size for v in ours.values()), loose
    noise = [k for k in ours if k.endswith("attention.self.key.bias")]
    moved = {k: float(np.abs(ours[k] - initial[k]).max()) for k in ours if k not in noise}
    assert min(v for k, v in moved.items() if not k.startswith("pooler.")) > LR / 10
    # Without the prompts (or, with include_prompt false, pooling their tokens) the step is another one.
    if not include:
        assert main(train_args("embedding", model, data, tmp_path / "plain", *_flags())) == 0
        plain = next(r for r in _log(tmp_path / "plain") if r["step"] == 1 and "loss" in r)
        assert abs(plain["loss"] - loss) > 1e-3


def test_the_trained_model_records_its_prompts_and_embeds_queries_with_them(tmp_path):
    """OUT/final names the anchors' prompt "query" and the positives' "document" (sentence-transformers'
    encode_query / encode_document read those names) beside the source's prompts and default, and keeps
    include_prompt false: embed(prompt_name="query") and evaluate give sentence-transformers' vectors."""
    model = _source(tmp_path, "cls", False)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _records()))
    flags = _flags("--prompts", "anchor=search query: ", "positive=doc: ")
    assert main(train_args("embedding", model, data, tmp_path / "out", *flags)) == 0
    final = str(tmp_path / "out" / "final")
    settings = json.load(open(os.path.join(final, "config_sentence_transformers.json")))
    assert settings["prompts"] == {"query": "search query: ", "passage": "passage: ", "document": "doc: "}
    assert settings["default_prompt_name"] == "query"
    assert json.load(open(os.path.join(final, "1_Pooling", "config.json")))["include_prompt"] is False
    texts = ["a lazy fox", "the weather in paris"]
    theirs = st.SentenceTransformer(final, device="cpu")
    want = theirs.encode_query(texts, convert_to_numpy=True)
    np.testing.assert_allclose(jaxbert.load(final).embed(texts, prompt_name="query"), want, atol=1e-5)
    np.testing.assert_allclose(
        jaxbert.load(final).embed(texts, prompt_name="document"), theirs.encode_document(texts), atol=1e-5
    )
    # evaluate reads queries and corpus with them (encode_query's and encode_document's, as sentence-transformers'
    # retrieval evaluator): the training run's last validation numbers
    out = str(tmp_path / "m.json")
    assert main(["evaluate", final, "--task", "embedding", "--file", str(data), "--output", out]) == 0
    got, last = json.load(open(out)), _log(tmp_path / "out")[-1]
    for key in ("loss", "accuracy@1", "mrr@10"):
        assert abs(got[key] - last[f"eval_{key}"]) <= 1e-5, key


@pytest.mark.parametrize(
    "given, match",
    [
        (["anchr=query: "], "has no column 'anchr' to put a prompt before (its columns: 'anchor', 'positive')"),
        (["negative=doc: "], "data.jsonl has no column 'negative'"),
        (["anchor=query: ", "passage: "], "--prompts 'passage: ': expected COLUMN=PROMPT"),
        (["=query: "], "--prompts '=query: ': expected COLUMN=PROMPT"),
        (["anchor=a", "anchor=b"], "--prompts: column 'anchor' given twice"),
    ],
)  # fmt: skip
def test_bad_prompts_are_one_line(given, match, tmp_path, capsys):
    model = model_dir(tmp_path / "model", **SMALL)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _records()))
    out = tmp_path / "out"
    capsys.readouterr()
    cli_fails(capsys, tmp_path, *train_args("embedding", model, data, out, *_flags("--prompts", *given)), match=match)
    assert not (out / "final").exists() and not (out / "cache").exists()


def test_prompts_belong_to_the_embedding_task(tmp_path, capsys):
    args = ["train", "--task", "sequence-classification", "--model", str(tmp_path), "--train-file", "x.jsonl"]
    match = "--prompts applies to --task embedding only"
    cli_fails(capsys, tmp_path, *args, "--output-dir", str(tmp_path / "o"), "--prompts", "q: ", match=match)
