"""`jaxbert train --task embedding` on several hard negatives: sentence-transformers' MultipleNegativesRankingLoss
(and its symmetric form) takes (anchor, positive, negative_1, ..., negative_n), every column after the anchor and
the positive a candidate (its data collator reads every column but a label, by position). One CLI step on three
negatives equals sentence-transformers' step (collator + loss + AdamW) on the same rows, named (JSON lines) and by
position (TSV); the validation loss counts every negative; evaluate of OUT/final and of its export reads them as
trained; a row with other negatives than the first row's is named by file and line."""

import json
import os

import numpy as np
import pytest
from conftest import assert_step_equals_sentence_transformers, cli_fails, model_dir
from test_train_embedding import SMALL, WORDS, _train_args, collated_step

from jaxbert.cli import main
from jaxbert.train.task_data import Row
from jaxbert.train.task_embedding_rows import encode_pairs, triplet_columns

st = pytest.importorskip("sentence_transformers")

pytestmark = pytest.mark.filterwarnings("ignore:The MultipleNegativesSymmetricRankingLoss is deprecated")

NAMED = ("anchor", "positive", "negative_1", "negative_2", "negative_3")
UNNAMED = ("query", "answer", "hard_a", "hard_b", "hard_c")  # read by position
TRIPLET = ("anchor", "positive", "negative")


def _records(names, n=8):
    rng = np.random.default_rng(7)
    text = lambda: " ".join(rng.choice(WORDS, int(rng.integers(2, 9))))  # noqa: E731
    return [{name: text() for name in names} for _ in range(n)]


def _write(path, records):
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    else:  # a header, then the cells
        lines = [list(records[0]), *(r.values() for r in records)]
        path.write_text("".join("\t".join(cells) + "\n" for cells in lines))


def _log(out):
    return [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]


@pytest.mark.parametrize(
    "names, suffix, symmetric",
    [(NAMED, "jsonl", False), (NAMED, "jsonl", True), (UNNAMED, "tsv", False)],
    ids=["named", "named-symmetric", "by-position-tsv"],
)
def test_three_negatives_step_equals_sentence_transformers(names, suffix, symmetric, tmp_path):
    """One step on 8 rows of three negatives each = sentence-transformers' (the loss within 1e-5, every parameter
    within 1e-6); step 0's validation loss (the set's forward MNRL, here the step's rows) is sentence-transformers'
    MNRL over all 8 x 4 candidates; `jaxbert evaluate` of OUT/final, and of its export, gives training's last
    numbers on the same file (the negatives read as trained)."""
    model = model_dir(tmp_path / "model", **SMALL)
    records = _records(names)
    data = tmp_path / f"data.{suffix}"
    _write(data, records)
    out = tmp_path / "out"
    assert main(_train_args(model, data, out, "mean", False, symmetric, "--global-batch-size", "8")) == 0
    value, forward, pt = collated_step(model, records, symmetric)
    assert_step_equals_sentence_transformers(out, value, pt)
    log = _log(out)
    assert log[0]["step"] == 0 and abs(log[0]["eval_loss"] - forward) <= 1e-5 * max(1, forward), (log[0], forward)
    last = log[-1]
    assert main(["export", str(out / "final"), str(tmp_path / "pt")]) == 0
    for directory in (out / "final", tmp_path / "pt"):
        written = tmp_path / f"{directory.name}.json"
        args = ["evaluate", directory, "--task", "embedding", "--file", data, "--output", written]
        assert main([str(a) for a in args]) == 0
        got = json.load(open(written))
        for name in ("loss", "accuracy@1", "mrr@10"):
            assert abs(got[name] - last[f"eval_{name}"]) <= 1e-5, (directory, name, got, last)


def _rows(*records):
    return [Row("data.jsonl", i + 1, r, True) for i, r in enumerate(records)]


@pytest.mark.parametrize(
    "row, flags, read",
    [
        # Every column after anchor and positive, as the collator reads them (a label column is not a text).
        (dict.fromkeys(NAMED, "t"), (None, None, None), NAMED),
        ({**dict.fromkeys(NAMED, "t"), "score": 1}, (None, None, None), NAMED),
        # --label-column names the first negative; the others follow where the collator would read them too.
        (dict.fromkeys(("q", "p", "n1", "n2")), ("q", "p", "n2"), ("q", "p", "n2", "n1")),
        (dict.fromkeys(("q", "p", "hard")), ("q", "p", "hard"), ("q", "p", "hard")),
        # The collator would read the id as the anchor: by name, the named columns alone, as before.
        (dict.fromkeys(("id", "anchor", "positive", "negative", "other")), (None, None, None), TRIPLET),
        (dict.fromkeys(("anchor", "positive")), (None, None, None), TRIPLET),
    ],
)
def test_which_columns_are_negatives(row, flags, read):
    assert triplet_columns(_rows(row), flags) == read


def test_each_file_trains_the_negatives_of_its_first_row():
    """A validation file of other negatives than the training file's (as with one negative, where a set without
    any validated on pairs): the columns are read over both, each set encodes its own first row's negatives."""
    train, val = _rows(*[dict.fromkeys(NAMED, "t")] * 2), _rows(*[{**dict.fromkeys(TRIPLET, "t"), "x": "t"}] * 2)
    cols = triplet_columns([*train, *val], (None, None, None))
    assert cols == (*NAMED, "negative", "x")
    (texts,), _ = encode_pairs(None, train, cols, None, 16)
    assert [len(t) for t in texts] == [5, 5]
    (texts,), _ = encode_pairs(None, val, cols, None, 16)
    assert [len(t) for t in texts] == [4, 4]


# -- bad input -------------------------------------------------------------------------------------------------
ROW = dict(zip(NAMED, ("a b", "c d", "e f", "g h", "i j")))


@pytest.mark.parametrize(
    "rows, suffix, match",
    [
        (
            [ROW, {k: v for k, v in ROW.items() if k != "negative_3"}],
            "jsonl",
            [
                "data.jsonl:2: column 'negative_3': every example needs a 'negative_3' like the first row (",
                "data.jsonl:1): 3 negative(s) each",
            ],
        ),
        (
            [ROW, {**ROW, "negative_4": "k l"}],
            "jsonl",
            [
                "data.jsonl:2: column 'negative_4': every example needs none, as ",
                "data.jsonl:1 has none: 3 negative(s) each",
            ],
        ),
        (
            [dict(zip(UNNAMED, ROW.values())), dict(zip(UNNAMED, [*list(ROW.values())[:4], ""]))],
            "tsv",
            [
                "data.tsv:3: column 'hard_c': every example needs a 'hard_c' like the first row (",
                "data.tsv:2): 3 negative(s)",
            ],
        ),
        (
            [{**ROW, "id": 7}],
            "jsonl",
            [
                "data.jsonl:1: column 'id': expected a string, got an integer; it is read as a negative, as "
                "sentence-transformers' data collator reads every column after the anchor and the positive but a label"
            ],
        ),
        (
            [ROW, {**ROW, "negative_2": "  "}],
            "jsonl",
            ["data.jsonl:2: column 'negative_2': empty text; it is read as a negative"],
        ),
    ],
)
def test_rows_of_other_negatives_name_file_and_line(rows, suffix, match, tmp_path, capsys):
    model = model_dir(tmp_path / "model", **SMALL)
    data = tmp_path / f"data.{suffix}"
    _write(data, rows)
    out = tmp_path / "out"
    capsys.readouterr()  # the model's own writing progress
    args = _train_args(model, data, out, "mean", False, False, "--global-batch-size", "8")
    line = cli_fails(capsys, tmp_path, *args, match=match[0])  # the first row's file:line is the whole path
    assert all(part in line for part in match), line
    assert not (out / "final").exists() and not (out / "cache").exists()
