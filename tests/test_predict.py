"""`jaxbert predict` on a multiple-choice model: examples batched (several per call, any mix of option counts and
lengths) give, in input order, the softmax over each example's options that transformers' PyTorch model gives;
predict reads texts at the length `evaluate` scores them at."""

import json

import numpy as np
import pytest
from conftest import cli_fails, model_dir

from jaxbert.cli import main

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

EXAMPLES = [
    ("The cat sat on the mat.", ["It slept.", "It flew away over the sea and never came back.", "It ate."]),
    ("Rain fell all day.", ["We stayed in.", "We swam."]),
    ("A long context " + "about many things " * 12, ["yes", "no", "maybe"]),
    ("Short.", ["a", "b"]),
    ("The train was late again this morning.", ["We waited.", "We ran.", "We sang."]),
]


def test_multiple_choice_predict_equals_pytorch(tmp_path):
    directory = model_dir(tmp_path / "mc", "BertForMultipleChoice", max_position_embeddings=128)
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"context": c, "choices": o}) + "\n" for c, o in EXAMPLES))
    out = tmp_path / "p.jsonl"
    assert main(["predict", directory, "--input", str(data), "--output", str(out), "--batch-size", "2"]) == 0
    got = [json.loads(line) for line in out.read_text().splitlines()]
    tok = transformers.BertTokenizerFast.from_pretrained(directory)
    model = transformers.BertForMultipleChoice.from_pretrained(directory).eval()
    assert len(got) == len(EXAMPLES)
    for (context, options), row in zip(EXAMPLES, got):
        enc = tok([context] * len(options), options, padding=True, return_tensors="pt")
        with torch.no_grad():
            logits = model(**{k: v[None] for k, v in enc.items()}).logits[0].double()
        want = torch.softmax(logits, -1).numpy()
        np.testing.assert_allclose(row["scores"], want, atol=1e-5)
        assert row["label"] == int(want.argmax())


def test_predict_reads_texts_at_the_length_evaluate_scores(tmp_path):
    """A classifier trained at --max-seq-length 16 (kept in its config.json) was predicted at its 40 positions and
    evaluated at 16 tokens: on texts longer than 16 tokens, the predictions were not the ones evaluate scored (the
    loss of predict's scores 1.1163, evaluate's 1.1130). predict now defaults to the trained length, as evaluate
    does, and both take --max-seq-length."""
    directory = model_dir(tmp_path / "cls", "BertForSequenceClassification", num_labels=3)
    config = json.loads((tmp_path / "cls" / "config.json").read_text())
    config["jaxbert_text_columns"] = {"text": "text", "pair": None, "max_seq_length": 16}
    (tmp_path / "cls" / "config.json").write_text(json.dumps(config))
    rng = np.random.default_rng(0)
    words = "the river city runs past old walls and green hills under a grey sky".split()
    rows = [{"text": " ".join(rng.choice(words, 30)), "label": i % 3} for i in range(8)]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for length in ([], ["--max-seq-length", "24"]):
        out, metrics = tmp_path / "p.jsonl", tmp_path / "m.json"
        assert main(["predict", directory, "--input", str(data), "--output", str(out), *length]) == 0
        args = ["--task", "sequence-classification", "--file", str(data), "--output", str(metrics), *length]
        assert main(["evaluate", directory, *args]) == 0
        got = [json.loads(line)["scores"] for line in out.read_text().splitlines()]
        loss = np.mean([-np.log(p[f"LABEL_{r['label']}"]) for p, r in zip(got, rows, strict=True)])
        assert abs(loss - json.loads(metrics.read_text())["loss"]) < 1e-5, length
        out.unlink(), metrics.unlink()


def test_evaluate_counts_the_words_it_does_not_score(tmp_path, capsys):
    """evaluate cuts a token-classification example at its length, as training does, but said nothing of it (the
    training log names the words it cuts): a 63-word sentence on a model of 40 positions was scored on its first
    38 words, the metrics' file not saying that 25 gold tags were left out. It now counts them."""
    directory = model_dir(tmp_path / "tag", "BertForTokenClassification", num_labels=3)
    words = "the river city runs past old walls".split()
    rows = [{"tokens": words * k, "ner_tags": [i % 3 for i in range(7 * k)]} for k in (1, 2, 9)]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    metrics = tmp_path / "m.json"
    args = ["evaluate", directory, "--task", "token-classification", "--file", str(data), "--output", str(metrics)]
    for flags, unscored in (([], 63 - 38), (["--max-seq-length", "16"], 63 - 14)):
        assert main([*args, *flags]) == 0
        assert json.loads(metrics.read_text())["words_not_scored"] == unscored
        assert f"words_not_scored {unscored}\n" in capsys.readouterr().out
        metrics.unlink()


def test_predict_lines_stay_one_per_input_and_a_tagger_refuses_pairs(tmp_path, capsys):
    """predict wrote label names holding U+2028 / U+2029 raw: valid JSON, but `str.splitlines` (and many line
    readers) split there, so 2 inputs read back as 4 lines. And a tagger given --text-pair-column tagged the first
    column alone, without a word."""
    names = {"0": "line\u2028break", "1": "para\u2029graph"}
    directory = model_dir(
        tmp_path / "cls",
        "BertForSequenceClassification",
        num_labels=2,
        id2label=names,
        label2id={v: int(k) for k, v in names.items()},
    )
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"text": t, "other": t}) + "\n" for t in ("a day", "the night")))
    out = tmp_path / "p.jsonl"
    assert main(["predict", directory, "--input", str(data), "--output", str(out)]) == 0
    lines = out.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 2 and {json.loads(line)["label"] for line in lines} <= set(names.values())
    tagger = model_dir(tmp_path / "tag", "BertForTokenClassification", num_labels=3)
    args = ["predict", tagger, "--input", data, "--output", tmp_path / "t.jsonl", "--text-pair-column", "other"]
    capsys.readouterr()
    cli_fails(capsys, tmp_path, *args, match="--text-pair-column other: a token classification model tags single")
    assert not (tmp_path / "t.jsonl").exists()


def test_multiple_choice_reads_the_columns_it_was_trained_on(tmp_path):
    """A multiple-choice model trained with --text-column sent1 --text-pair-column endings keeps them in its
    config.json, as a sequence classifier does, but predict and evaluate read only context / choices: on data in
    the trained columns both failed ("no column 'context'") where they answer for a sequence classifier."""
    directory = model_dir(tmp_path / "mc", "BertForMultipleChoice", max_position_embeddings=128)
    config = json.loads((tmp_path / "mc" / "config.json").read_text())
    config["jaxbert_text_columns"] = {"text": "sent1", "pair": "endings", "max_seq_length": 64}
    (tmp_path / "mc" / "config.json").write_text(json.dumps(config))
    three = [(c, o) for c, o in EXAMPLES if len(o) == 3]
    answers = {}
    for names in (("context", "choices"), ("sent1", "endings")):
        data = tmp_path / f"{names[0]}.jsonl"
        rows = [{names[0]: c, names[1]: o, "label": i % 3} for i, (c, o) in enumerate(three)]
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
        flags = ["--text-column", "context", "--text-pair-column", "choices"] if names[0] == "context" else []
        out, scored = tmp_path / f"{names[0]}.p.jsonl", tmp_path / f"{names[0]}.m.json"
        assert main(["predict", directory, "--input", str(data), "--output", str(out), *flags]) == 0
        args = ["evaluate", directory, "--task", "multiple-choice", "--file", str(data), "--output", str(scored)]
        assert main([*args, *flags]) == 0
        metrics = {k: v for k, v in json.loads(scored.read_text()).items() if k not in ("file",)}
        answers[names] = [json.loads(line) for line in out.read_text().splitlines()], metrics
    assert answers[("context", "choices")] == answers[("sent1", "endings")]


def test_evaluate_names_a_length_too_short_for_any_word(tmp_path, capsys):
    """evaluate takes --max-seq-length from 1 on (training from 8): a token-classification file read at 1 token
    failed with "4 exceeds the largest bucket 1" (the tokenizer cannot cut [CLS] and [SEP], and encode_words did not
    say so as encode does), and at 2 tokens with "gold_tags holds no tokens", naming neither the length nor the
    file."""
    directory = model_dir(tmp_path / "tag", "BertForTokenClassification", num_labels=3)
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"tokens": ["the", "river"], "ner_tags": [0, 1]}) + "\n")
    args = ["evaluate", directory, "--task", "token-classification", "--file", data, "--output", tmp_path / "m.json"]
    capsys.readouterr()
    cli_fails(capsys, tmp_path, *args, "--max-seq-length", 1, match="--max-seq-length 1: too short for the 2 special")
    cli_fails(capsys, tmp_path, *args, "--max-seq-length", 2, match="rows.jsonl: no word fits in 2 tokens")
    assert main([*map(str, args), "--max-seq-length", "3"]) == 0


def test_evaluate_reads_a_taggers_words_from_the_column_it_was_trained_on(tmp_path, capsys):
    """A tagger trained with --text-column words keeps it in config.json, but evaluate read the words from the
    task's default column alone: its own validation file failed ("no column 'tokens'")."""
    directory = model_dir(tmp_path / "tag", "BertForTokenClassification", num_labels=3)
    config = json.loads((tmp_path / "tag" / "config.json").read_text())
    config["jaxbert_text_columns"] = {"text": "words", "pair": None, "max_seq_length": 16}
    (tmp_path / "tag" / "config.json").write_text(json.dumps(config))
    rows = [{"words": "the river city runs".split(), "ner_tags": [0, 1, 2, 0]}, {"words": ["walls"], "ner_tags": [1]}]
    results = []
    for column, flags in (("tokens", ["--text-column", "tokens"]), ("words", [])):
        data = tmp_path / f"{column}.jsonl"
        data.write_text("".join(json.dumps({column: r["words"], "ner_tags": r["ner_tags"]}) + "\n" for r in rows))
        out = tmp_path / f"{column}.json"
        args = ["evaluate", directory, "--task", "token-classification", "--file", str(data), "--output", str(out)]
        assert main([*args, *flags]) == 0, capsys.readouterr().err
        results.append({k: v for k, v in json.loads(out.read_text()).items() if k != "file"})
    assert results[0] == results[1]


def test_multiple_choice_predict_names_the_line_and_option_of_a_token_outside_the_vocabulary(tmp_path, capsys):
    """A tokenizer larger than the model: multiple-choice predict named the token by its place in a length-sorted
    batch, "token id 1996 at position (0, 0, 1)", which reads as line 1's first option, where "hello" (7592) is; the
    token named was line 2's (its longer example sorted first). It now names the line and option, as classify names
    the text."""
    directory = model_dir(tmp_path / "mc", "BertForMultipleChoice", vocab_size=1000)
    data = tmp_path / "in.jsonl"
    rows = [("hello", ["a", "b"]), ("the weather in paris", ["researchers", "b"])]
    data.write_text("".join(json.dumps({"context": c, "choices": o}) + "\n" for c, o in rows))
    capsys.readouterr()
    args = ["predict", directory, "--input", data, "--output", tmp_path / "p.jsonl"]
    cli_fails(capsys, tmp_path, *args, match="in.jsonl:1: column 'choices': option 0: token id 7592 at position 1")
    assert not (tmp_path / "p.jsonl").exists()


def _models_and_inputs(tmp_path, *heads):
    texts, rows = tmp_path / "in.txt", tmp_path / "in.jsonl"
    texts.write_text("a day in paris\nthe night\n")
    row = {"text": "the night", "other": "a day", "question": "what?", "context": "a day here", "choices": ["a", "b"]}
    rows.write_text(json.dumps(row) + "\n")
    labels = {"BertForSequenceClassification": 2, "BertForTokenClassification": 3, "BertForQuestionAnswering": 2}
    made = [model_dir(tmp_path / head, head, num_labels=labels.get(head, 5)) for head in heads]
    return (*made, texts, rows, tmp_path / "p.jsonl")


def test_predict_refuses_columns_of_a_txt_file(tmp_path, capsys):
    """predict read a .txt file a text a line and took --text-column (or --text-pair-column) without reading it: a
    classifier or a tagger given `--input in.txt --text-column other` wrote its predictions of the lines as if the
    column had been read. Now one line naming the flag and the file, exit 1, nothing written; in a .jsonl the
    column is read."""
    cls, tagger, texts, rows, out = _models_and_inputs(
        tmp_path, "BertForSequenceClassification", "BertForTokenClassification"
    )
    for model, flag in ((cls, "--text-column"), (tagger, "--text-column"), (cls, "--text-pair-column")):
        capsys.readouterr()
        args = ["predict", model, "--input", texts, "--output", out, flag, "other"]
        cli_fails(capsys, tmp_path, *args, match=f"{flag} other: {texts} is a .txt file, one text a line, no columns")
        assert not out.exists()
    assert main(["predict", tagger, "--input", str(rows), "--output", str(out), "--text-column", "other"]) == 0
    assert [w["word"] for w in json.loads(out.read_text())["words"]] == ["a", "day"]


def test_predict_refuses_ignore_labels_for_a_model_that_is_no_tagger(tmp_path, capsys):
    """--ignore-labels for a classifier or a multiple-choice model was answered 'give --aggregation-strategy too',
    which was then refused: the labels left out of a tagger's entities mean nothing for them. Now one line naming
    the flag and the model, exit 1, nothing written."""
    cls, choice, _, rows, out = _models_and_inputs(tmp_path, "BertForSequenceClassification", "BertForMultipleChoice")
    for model, head in ((cls, "BertForSequenceClassification"), (choice, "BertForMultipleChoice")):
        capsys.readouterr()
        args = ["predict", model, "--input", rows, "--output", out, "--ignore-labels", "O"]
        cli_fails(
            capsys,
            tmp_path,
            *args,
            match=f"--ignore-labels: labels left out of a token classification model's entities; this is {head}",
        )
        assert not out.exists()


def test_a_null_score_threshold_needs_null_answers(tmp_path, capsys):
    """--null-score-diff-threshold for a question answering model without SQuAD 2.0 null answers (not fine-tuned
    here, or trained without them) was taken by predict and evaluate and changed nothing (any threshold, the same
    answers and scores), as run_qa's postprocessing reads it only with version_2_with_negative. Now one line naming
    the flag and the model, exit 1, nothing written; a model trained with null answers (its config.json's
    question_answering) still takes it: a threshold every null answer beats abstains."""
    (qa, _, rows, out) = _models_and_inputs(tmp_path, "BertForQuestionAnswering")
    capsys.readouterr()
    args = ["predict", qa, "--input", rows, "--output", out, "--null-score-diff-threshold", "3"]
    cli_fails(
        capsys,
        tmp_path,
        *args,
        match="--null-score-diff-threshold 3.0: decides SQuAD 2.0's null answers, and this question answering model",
    )
    assert not out.exists()
    evaluated = ["evaluate", qa, "--task", "question-answering", "--file", rows, "--output", tmp_path / "m.json"]
    cli_fails(capsys, tmp_path, *evaluated, "--null-score-diff-threshold", "3", match="give --version-2-with-negative")
    assert not (tmp_path / "m.json").exists()
    config = json.loads((tmp_path / "BertForQuestionAnswering" / "config.json").read_text())
    config["question_answering"] = {"version_2_with_negative": True}
    (tmp_path / "BertForQuestionAnswering" / "config.json").write_text(json.dumps(config))
    for threshold, abstains in (("1e9", False), ("-1e9", True)):
        flags = ["--output", str(out), f"--null-score-diff-threshold={threshold}"]
        assert main(["predict", qa, "--input", str(rows), *flags]) == 0
        assert (json.loads(out.read_text())["answer"] == "") == abstains, threshold
