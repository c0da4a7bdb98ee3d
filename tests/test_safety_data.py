"""Adversarial training and evaluation data: what jaxbert reads from a task's rows is what the reference reads
(sentence-transformers' data collator, transformers' run_*.py), or the row is refused in one line naming file, line
and column, exit 1, nothing written."""

import dataclasses
import json
import os

import numpy as np
import pytest
from conftest import cli_fails, model_dir, train_args

from jaxbert.cli import main
from jaxbert.tokenizer import WordPiece
from jaxbert.train import task_scored
from jaxbert.train.task_data import Row, read_rows
from jaxbert.train.task_embedding_rows import triplet_columns

st = pytest.importorskip("sentence_transformers")


def _rows(*records):
    return [Row("data.jsonl", i + 1, r, True) for i, r in enumerate(records)]


def _collated(record) -> tuple[str, ...]:
    """The text columns sentence-transformers' data collator reads from `record`, in the order its losses take them
    (anchor, positive, negatives; or the pair of a scored loss)."""
    from sentence_transformers.sentence_transformer.data_collator import SentenceTransformerDataCollator

    seen = []

    def preprocess(texts, prompt=None, task=None):
        seen.append(texts[0])
        return {"input_ids": [[0]]}

    SentenceTransformerDataCollator(preprocess_fn=preprocess)([record])
    return tuple(next(k for k, v in record.items() if v == text) for text in seen)


# A multi-dataset row's `dataset_name` (what sentence-transformers' trainer adds for a DatasetDict): the collator drops
# it before reading the columns by position. jaxbert read it as a further negative (after an anchor and a positive
# named or first), as the anchor (first), or as the first text of a scored pair.
DATASET_NAME_ROWS = [
    {"anchor": "a", "positive": "p", "dataset_name": "nli"},
    {"dataset_name": "nli", "query": "q", "answer": "r"},
    {"query": "q", "answer": "r", "dataset_name": "nli"},
    {"query": "q", "answer": "r", "hard": "h", "dataset_name": "nli"},
    {"dataset_name": "nli", "anchor": "a", "positive": "p", "negative": "n", "other": "o"},
]


@pytest.mark.parametrize("record", DATASET_NAME_ROWS)
def test_dataset_name_is_no_text_as_the_collator_drops_it(record):
    read = triplet_columns(_rows(record), (None, None, None))
    assert tuple(c for c in read if c in record) == _collated(record)


@pytest.mark.parametrize(
    "record",
    [
        {"dataset_name": "sts", "s1": "a", "s2": "b", "score": 0.5},
        {"s1": "a", "dataset_name": "sts", "s2": "b", "score": 1},
    ],
)
def test_dataset_name_is_no_text_of_a_scored_pair(record):
    first, second, _ = task_scored.pair_columns(_rows(record), (None, None, None))
    assert (first, second) == _collated(record)


# Label columns: sentence-transformers' data collator drops only the FIRST of label, labels, score, scores it finds and
# reads any other as a text by position (a negative, or a text of a pair). jaxbert dropped all four: a second one
# holding texts went unread, one holding numbers was ignored where sentence-transformers' model fails on them
# ("Unsupported input type: float") and which column holds the scores is unclear.
LABEL_ROWS = {
    "mnrl": [
        {"anchor": "a", "positive": "p", "label": 1, "labels": "other"},
        {"label": 0, "anchor": "a", "positive": "p", "score": "x"},
        {"anchor": "a", "positive": "p", "negative": "n", "scores": "m", "label": 1},
        {"anchor": "a", "positive": "p", "score": 0.5},
        {"anchor": "a", "positive": "p", "label": 1, "score": 0.5},
        {"anchor": "a", "positive": "p", "negative": "n", "labels": 2, "scores": 0.5},
    ],
    "cosent": [
        {"s1": "a", "s2": "b", "score": 0.5, "scores": "x"},
        {"scores": "x", "s1": "a", "s2": "b", "score": 0.5},
        {"s1": "a", "s2": "b", "label": 1, "score": 0.5},
        {"sentence1": "a", "sentence2": "b", "score": 0.5, "label": 1},
        {"s1": "a", "s2": "b", "labels": 1, "scores": 0.5},
    ],
}


@pytest.fixture(scope="module")
def st_model(tiny):
    return st.SentenceTransformer(tiny, device="cpu")


def _reference(model, record):
    """(the text columns, in order, the label) as sentence-transformers' data collator reads `record` through the
    model's own preprocessing; None where it fails."""
    from sentence_transformers.sentence_transformer.data_collator import SentenceTransformerDataCollator

    try:
        batch = SentenceTransformerDataCollator(preprocess_fn=model.preprocess)([record])
    except ValueError:
        return None
    label = float(batch["label"][0]) if "label" in batch else None
    return tuple(k[: -len("_input_ids")] for k in batch if k.endswith("_input_ids")), label


@pytest.mark.parametrize("loss, record", [(k, r) for k, rows in LABEL_ROWS.items() for r in rows])
def test_label_columns_are_read_as_the_collator_reads_them_or_refused(st_model, loss, record):
    ref = _reference(st_model, record)
    rows = _rows(record)
    if ref is None:  # a number in a second label column: refused, naming both columns
        first = next(c for c in task_scored.LABEL_COLUMNS if c in record)
        second = next(c for c in task_scored.LABEL_COLUMNS if c in record and c != first)
        match = f"data.jsonl:1: columns {first!r} and {second!r}: sentence-transformers' data collator drops only"
        with pytest.raises(ValueError, match=match):
            triplet_columns(rows, (None, None, None)) if loss == "mnrl" else task_scored.pair_columns(
                rows, (None, None, None)
            )
        return
    texts, label = ref
    if loss == "mnrl":
        assert tuple(c for c in triplet_columns(rows, (None, None, None)) if c in record) == texts
    else:  # the pair losses read the first two texts and the label
        first, second, _ = task_scored.pair_columns(rows, (None, None, None))
        assert (first, second) == texts[:2]
        assert rows[0].label(task_scored.label_column(rows, None)) == label


def test_a_number_in_a_second_label_column_of_a_csv_is_refused(tiny, tmp_path, capsys):
    path = tmp_path / "train.csv"
    path.write_text("s1,s2,label,score\na b,c d,1,0.5\ne f,g h,0,0.25\n")
    match = (
        "train.csv:2: columns 'label' and 'score': sentence-transformers' data collator drops only the first label "
        "column it finds ('label') and reads 'score' as a text, which holds 0.5: keep one label column (or rename "
        "'score')"
    )
    rows = [{"s1": "a b", "s2": "c d", "label": 1}, {"s1": "e f", "s2": "g h", "label": 0}]
    _refused(tiny, tmp_path, capsys, "embedding", None, rows, "--loss", "cosent", match=match, data=path)


# -- bad rows: one line naming file, line and column; exit 1; nothing written ---------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return model_dir(tmp_path_factory.mktemp("tiny"), max_position_embeddings=64, num_hidden_layers=1)


def _jsonl(path, records) -> str:
    path.write_text(records if isinstance(records, str) else "".join(json.dumps(r) + "\n" for r in records))
    return str(path)


GOOD = [{"text": "fine", "label": "pos"}, {"text": "bad", "label": "neg"}]


def _refused(tiny, tmp_path, capsys, task, train, val, *flags, match, data=None):
    """`jaxbert train` on `train` (records, or a file's text at `data`) and `val` exits 1 with `match` alone on
    stderr, writing nothing."""
    data = str(data) if data is not None else _jsonl(tmp_path / "train.jsonl", train)
    held = _jsonl(tmp_path / "val.jsonl", val)
    args = train_args(task, tiny, data, tmp_path / "out", "--max-seq-length", "32", "--validation-file", held, *flags)
    cli_fails(capsys, tmp_path, *args, match=match)
    assert not (tmp_path / "out").exists()


def test_a_regression_label_beyond_float32_is_refused(tiny, tmp_path, capsys):
    # 1e39 is a finite JSON number but inf as the float32 target: the run stopped at step 1's loss (inf), its cache
    # and checkpoints written.
    rows = '{"text": "a", "label": 1e39}\n{"text": "b", "label": 0.5}\n'
    match = "train.jsonl:1: column 'label': regression label 1e+39 is not finite (in float32)"
    flags = ("--problem-type", "regression", "--per-device-batch-size", "2", "--max-steps", "1")
    _refused(tiny, tmp_path, capsys, "sequence-classification", rows, rows, *flags, match=match)


def test_a_quote_left_open_to_the_end_of_a_csv_file_is_refused(tiny, tmp_path, capsys):
    # The csv module (not strict) ends the open cell at the end of the file: rows 3 and 4 became part of row 2's text,
    # which trained as one example, two rows lost without a word (pandas, behind `datasets`, refuses the file).
    path = tmp_path / "train.csv"
    path.write_text('label,text\npos,fine\nneg,"bad\npos,good\nneg,awful\n')
    with pytest.raises(ValueError, match=r"train.csv:3: a quoted cell is never closed"):
        read_rows(str(path))
    match = "train.csv:3: a quoted cell is never closed (its quote runs to the end of the file)"
    _refused(tiny, tmp_path, capsys, "sequence-classification", path.read_text(), GOOD, match=match, data=path)
    closed = tmp_path / "closed.csv"  # a quoted cell over two lines, closed, is one text with its line break
    closed.write_text('label,text\npos,fine\nneg,"bad\nday"\npos,good\n')
    assert [r.values["text"] for r in read_rows(str(closed))] == ["fine", "bad\nday", "good"]


@pytest.mark.parametrize(
    "task, row, match",
    [
        # A null word or option was "expected a list of strings, got a list": neither the item nor what it is.
        (
            "token-classification",
            {"tokens": ["Anna", None], "ner_tags": ["B-PER", "O"]},
            "train.jsonl:1: column 'tokens': expected a list of strings; item 1 is null",
        ),
        (
            "multiple-choice",
            {"context": "he sat", "choices": ["down", 3], "label": 0},
            "train.jsonl:1: column 'choices': expected a list of strings; item 1 is an integer",
        ),
        # -100 (transformers' ignored label) as a tag id: the bound was printed as a placeholder, "[0, n)".
        (
            "token-classification",
            {"tokens": ["Anna", "x"], "ner_tags": [-100, 0]},
            "train.jsonl:1: column 'ner_tags': label -100 out of range (integer labels are class ids, from 0)",
        ),
    ],
)
def test_a_bad_item_of_a_list_is_named(tiny, tmp_path, capsys, task, row, match):
    rows = [row, {"tokens": ["Bob"], "ner_tags": [1]} if task == "token-classification" else row]
    _refused(tiny, tmp_path, capsys, task, rows, rows, match=match)


@pytest.mark.parametrize("short", ["train", "val"])
def test_mlm_text_shorter_than_one_block_names_its_file(tiny, tmp_path, capsys, short):
    # Grouped MLM cuts the concatenated texts into whole blocks: a file shorter than one has none. The training file
    # was "the training set has 0 sequences, fewer than one step needs (8 per batch ...)", the validation file "the
    # validation set is shorter than one --max-seq-length block", neither naming the file.
    text = {"train": "the cat sat on the mat\n" * 40, "val": "the dog ran far away\n" * 40}
    text[short] = "hi\n"
    for name, content in text.items():
        (tmp_path / f"{name}.txt").write_text(content)
    args = ["train-mlm", "--model", tiny, "--train-file", tmp_path / "train.txt", "--output-dir", tmp_path / "out"]
    args += ["--validation-file", tmp_path / "val.txt", "--max-seq-length", "32", "--no-progress"]
    cli_fails(capsys, tmp_path, *args, match=f"{short}.txt: shorter than one --max-seq-length block (32 tokens")
    assert not (tmp_path / "out").exists()


def test_a_resume_refused_for_changed_data_leaves_out_as_it_was(tiny, tmp_path, capsys):
    # The refusal comes after the new data is tokenized: its cache entries stayed in OUT/cache (a run with an earlier
    # run's metrics.jsonl kept whatever it wrote), one set per refused attempt.
    out = tmp_path / "out"
    good = [{"text": "good film", "label": "pos"}, {"text": "bad film", "label": "neg"}] * 2
    data, held = _jsonl(tmp_path / "train.jsonl", good), _jsonl(tmp_path / "val.jsonl", good)
    flags = ("--max-seq-length", "32", "--per-device-batch-size", "2", "--save-steps", "1", "--validation-file", held)
    args = train_args("sequence-classification", tiny, data, out, *flags)
    assert main([*args, "--max-steps", "1"]) == 0
    state = lambda: (os.path.getsize(out / "metrics.jsonl"), sorted(os.listdir(out / "cache")))  # noqa: E731
    before = state()
    _jsonl(tmp_path / "train.jsonl", [{"text": "great film", "label": "pos"}, *good])
    capsys.readouterr()
    cli_fails(capsys, tmp_path, *args, "--max-steps", "2", "--resume", match="was made with train_file_sha256=")
    assert state() == before
    assert os.listdir(out / "checkpoints") == ["1"]


def _datasets_cut(rows: int, percentage: int) -> int:
    """Where run_mlm.py / run_clm.py's `train[:P%]` ends: datasets' _pct_to_abs_closest (its default rounding)."""
    return int(round(percentage * rows / 100.0))


def _line_by_line(tiny, tmp_path, lines: list[str], percentage: int):
    """The prepared line-by-line MLM run of `lines`, --validation-split-percentage `percentage`."""
    from jaxbert.train.config import TrainConfig
    from jaxbert.train.plan import prepare

    (tmp_path / "t.txt").write_text("\n".join(lines) + "\n")
    cfg = TrainConfig(
        tiny, str(tmp_path / "t.txt"), str(tmp_path / "o"), max_seq_length=16, global_batch_size=2,
        line_by_line=True, pack=False, validation_split_percentage=percentage,
    )  # fmt: skip
    return prepare(cfg)


@pytest.mark.parametrize("rows, percentage", [(30, 5), (70, 5), (50, 5), (27, 10)])
def test_the_validation_split_holds_out_the_lines_run_mlm_holds_out(tiny, tmp_path, rows, percentage):
    # jaxbert took the floor of P% of the lines, datasets rounds to the closest: 30 lines at 5% held out 1 line where
    # run_mlm.py validates on 2 (and trains on one line fewer).
    lines = [f"line {i} of the corpus" for i in range(rows)]
    run = _line_by_line(tiny, tmp_path, lines, percentage)
    cut = _datasets_cut(rows, percentage)
    assert (len(run.val), len(run.train.blocks)) == (cut, rows - cut)
    tok = WordPiece.from_dir(tiny)
    assert [tok.decode([int(i) for i in row[0] if i > 102]) for row in run.val] == lines[:cut]
    # A checkpoint cut by the floor (an earlier version's meta, without the key) is refused where the cuts differ.
    floor = rows * percentage // 100
    assert run.split == ({"validation_rows": cut} if cut != floor else {})


@pytest.mark.parametrize(
    "blank, rows, percentage", [((0, 2), 30, 10), ((0,), 32, 5), ((5, 6), 40, 5), ((1,), 41, 5), ((30,), 41, 5)]
)
def test_line_by_line_splits_every_line_then_drops_the_empty_ones_as_run_mlm(tiny, tmp_path, blank, rows, percentage):
    # run_mlm.py splits the rows datasets reads, empty lines included, and drops those only when tokenizing line by
    # line; jaxbert cut the non-empty lines alone: 30 lines at 10% with lines 0 and 2 empty, run_mlm validates on
    # line 1 alone (train[:3]), jaxbert held out lines 1, 3 and 4 (3 of the 28 non-empty).
    from jaxbert.train.checkpoints import check_meta
    from jaxbert.train.config import held_out

    lines = [[" \t", ""][i % 2] if i in blank else f"line {i} of the corpus" for i in range(rows)]
    run = _line_by_line(tiny, tmp_path, lines, percentage)
    cut = _datasets_cut(rows, percentage)
    want = [line for line in lines[:cut] if line.strip()]
    tok = WordPiece.from_dir(tiny)
    assert [tok.decode([int(i) for i in row[0] if i > 102]) for row in run.val] == want
    assert len(run.train.blocks) == sum(bool(line.strip()) for line in lines[cut:])
    # Checkpoints of the versions that cut the non-empty lines (at the floor of P%, then rounded): resumed exactly
    # where they held out the same lines.
    n, base = rows - len(blank), {"model_config": {"hidden_size": 32}, "validation_split_percentage": percentage}
    for held, meta in ((n * percentage // 100, {}), held_out(n, percentage)):
        if held == len(want):
            check_meta({**base, **meta}, {**base, **run.split}, "checkpoint 1")
        else:
            with pytest.raises(ValueError, match=r"was made with validation_rows="):
                check_meta({**base, **meta}, {**base, **run.split}, "checkpoint 1")


def test_a_task_s_validation_split_holds_out_the_rows_run_clm_holds_out(tiny, tmp_path):
    from jaxbert.train.config import TrainConfig
    from jaxbert.train.task_plan import prepare

    rows = [{"text": f"text number {i}", "label": ["pos", "neg"][i % 2]} for i in range(30)]
    data = _jsonl(tmp_path / "t.jsonl", rows)
    cfg = TrainConfig(tiny, data, str(tmp_path / "o"), task="sequence-classification", max_seq_length=16,
                      global_batch_size=2, validation_split_percentage=5)  # fmt: skip
    run = prepare(cfg)
    assert (len(run.val), len(run.train.blocks)) == (_datasets_cut(30, 5), 28) == (2, 28)
    assert run.split == {"validation_rows": 2}  # the floor held out 1
    held = dataclasses.replace(cfg, validation_file=data, validation_split_percentage=None)
    assert prepare(held).split == {}


def test_a_checkpoint_cut_by_the_floor_is_refused_where_the_cut_moved():
    from jaxbert.train.checkpoints import check_meta
    from jaxbert.train.config import held_out

    earlier = {"model_config": {"hidden_size": 32}, "validation_split_percentage": 5}  # no validation_rows
    moved = {**earlier, **held_out(30, 5)[1]}  # 30 lines: the floor held out 1, datasets' rounding 2
    with pytest.raises(ValueError, match=r"was made with validation_rows=None, this run has 2$"):
        check_meta(earlier, moved, "checkpoint 1")
    check_meta(earlier, {**earlier, **held_out(40, 5)[1]}, "checkpoint 1")  # 40 lines: 2 either way, resumed


@pytest.mark.parametrize(
    "task, flags, match",
    [
        ("sequence-classification", (), "train.jsonl: the training set has 2 sequences, fewer than one step needs (8"),
        # 4 lines packed into one row: "1 sequences" read as lines lost
        ("mlm", ("--line-by-line",), "train.txt: the training set has 1 sequences, fewer than one step needs (2 per "),
    ],
)
def test_a_batch_larger_than_the_training_set_names_the_file(tiny, tmp_path, capsys, task, flags, match):
    # The refusal named no file (transformers' Trainer would train on a short batch; jaxbert refuses, as before).
    if task == "mlm":
        path = tmp_path / "train.txt"
        path.write_text("the cat sat\nthe dog ran\nbirds fly\nfish swim\n")
        flags = (*flags, "--per-device-batch-size", "2")
        match += "batch × 1 accumulation steps) (its lines share packed rows: --no-pack reads one a row)"
    else:
        path = _jsonl(tmp_path / "train.jsonl", GOOD)
    args = train_args(task, tiny, path, tmp_path / "out", "--max-seq-length", "32", *flags)
    cli_fails(capsys, tmp_path, *args, match=match)
    assert not (tmp_path / "out").exists()


# An empty CSV cell is a missing value to `datasets` (pandas reads it as NaN, None in the dataset), not a text: a SWAG
# option's ending1 trained as an empty option (run_swag formats it as the text "None"), a classification text, a word
# of numbered token columns or a QA question as "" (the run_*.py scripts fail on None). Refused by file, line and the
# cell's column. A JSON "" is written as a text and stays one.
EMPTY_CELLS = {
    "multiple-choice": (
        "context,ending0,ending1,ending2,label\nhe sat,down,,up,0\n",
        {"context": "he sat", "choices": ["down", "up"], "label": 0},
        ("--text-pair-column", "ending"),
        "train.csv:2: column 'ending1': the cell is empty; expected a text (item 1 of 'ending')",
    ),
    "multiple-choice-context": (
        "context,ending0,ending1,label\n,down,up,0\n",
        {"context": "he sat", "choices": ["down", "up"], "label": 0},
        ("--text-pair-column", "ending"),
        "train.csv:2: column 'context': the cell is empty; expected a text",
    ),
    "sequence-classification": (
        "text,label\ngood,pos\n,neg\n",
        {"text": "fine", "label": "pos"},
        (),
        "train.csv:3: column 'text': the cell is empty; expected a text",
    ),
    "token-classification": (
        "tokens0,tokens1,ner_tags0,ner_tags1\nJohn,,B-PER,O\n",
        {"tokens": ["Anna", "x"], "ner_tags": ["B-PER", "O"]},
        (),
        "train.csv:2: column 'tokens1': the cell is empty; expected a text (item 1 of 'tokens')",
    ),
    "question-answering": (
        'question,context,answers\n,some context,"{""text"": [""some""], ""answer_start"": [0]}"\n',
        {"question": "q?", "context": "some context", "answers": {"text": ["some"], "answer_start": [0]}},
        ("--doc-stride", "8"),
        "train.csv:2: column 'question': the cell is empty; expected a text",
    ),
}


@pytest.mark.parametrize("case", list(EMPTY_CELLS))
def test_an_empty_text_cell_of_a_csv_is_refused(tiny, tmp_path, capsys, case):
    content, val, flags, match = EMPTY_CELLS[case]
    path = tmp_path / "train.csv"
    path.write_text(content)
    task = case.removesuffix("-context")
    _refused(tiny, tmp_path, capsys, task, None, [val], *flags, match=match, data=path)


def test_an_empty_string_of_json_is_still_a_text():
    rows = _rows({"context": "c", "choices": ["a", ""], "label": 0}, {"text": "", "label": "x"})
    assert rows[0].texts("choices") == ["a", ""] and rows[1].text("text") == ""


def _run_mlm_blocks(tok, texts, length):
    """run_mlm.py's grouped examples of `texts` (fewer than 1,000: one map batch): each text tokenized with the
    special tokens, an empty one [CLS] [SEP], all concatenated and cut into `length` blocks (group_texts)."""
    ids = [i for text in texts for i in tok(text)["input_ids"]]
    return np.asarray(ids[: len(ids) // length * length]).reshape(-1, length)


@pytest.mark.parametrize("suffix", [".txt", ".jsonl"])
def test_grouped_mlm_keeps_empty_lines_as_run_mlm_does(tiny, tmp_path, suffix):
    # `datasets`' text loader yields every line, an empty one as "" (and a JSON "text" of "" is one too), which
    # run_mlm.py tokenizes as [CLS] [SEP] into the stream it groups (only --line_by_line drops them). jaxbert dropped
    # them: other blocks, and a validation split cut over fewer lines.
    transformers = pytest.importorskip("transformers")
    from jaxbert.train.config import TrainConfig
    from jaxbert.train.plan import prepare

    words = "the cat sat on a mat while paris is the capital of france".split()
    lines = [" ".join(words[i % 7 : i % 7 + 3 + i % 5]) if i % 4 else ["", "  ", ""][i % 3] for i in range(60)]
    path = tmp_path / f"t{suffix}"
    path.write_text("".join((json.dumps({"text": t}) if suffix == ".jsonl" else t) + "\n" for t in lines))
    cfg = TrainConfig(tiny, str(path), str(tmp_path / "o"), max_seq_length=16, global_batch_size=2)
    cfg = dataclasses.replace(cfg, validation_split_percentage=20)
    run = prepare(cfg)
    tok = transformers.AutoTokenizer.from_pretrained(tiny)
    cut = _datasets_cut(len(lines), 20)
    assert np.array_equal(np.asarray(run.val)[:, 0], _run_mlm_blocks(tok, lines[:cut], 16))
    assert np.array_equal(np.asarray(run.train.blocks)[:, 0], _run_mlm_blocks(tok, lines[cut:], 16))
    assert run.split["empty_lines_kept"] == sum(not t.strip() for t in lines) == 15
    assert "15 empty lines kept as [CLS] [SEP], as run_mlm.py reads them" in run.log[0]
    # --line-by-line drops them, as run_mlm.py's filter does; so does a file without any: neither has the key.
    assert "empty_lines_kept" not in prepare(dataclasses.replace(cfg, line_by_line=True)).split
    (tmp_path / "full.txt").write_text("".join(t + "\n" for t in lines if t.strip()))
    assert "empty_lines_kept" not in prepare(dataclasses.replace(cfg, train_file=str(tmp_path / "full.txt"))).split


def test_a_grouped_mlm_checkpoint_that_dropped_empty_lines_is_refused():
    # Made by the earlier rule, its meta has no empty_lines_kept: its blocks are not this run's where empty lines are
    # kept (refused, saying why), and are where there were none (no key either way: resumed).
    from jaxbert.train.checkpoints import check_meta

    earlier = {"model_config": {"hidden_size": 32}, "validation_split_percentage": 5}
    match = r"was made with empty_lines_kept=None, this run has 15 \(jaxbert dropped the empty lines of grouped MLM"
    with pytest.raises(ValueError, match=match):
        check_meta(earlier, {**earlier, "empty_lines_kept": 15}, "checkpoint 1")
    check_meta(earlier, earlier, "checkpoint 1")
