"""Labels of a fine-tuning task: their names (id -> name), the problem type, and each row's label as a target.

Names come from the model when it has its own (a label2id whose names are not transformers' LABEL_i defaults, or a
checkpoint that already is the task's head; never another task's classifier) and the training data fit them (every
string among the names, every integer in range); otherwise from the training data: strings sorted, integers used as
ids 0..max. Data that do not fit the model's names raise `LabelMismatch`: `evaluate` reports it, a fine-tune catches
it and lets the data decide (with a new classifier: reusing one under a different mapping would be silently wrong).
A label the names do not know (a string seen only in the validation file) is an error naming file, line and column,
and so is a label of the other kind than the training data's (an integer among string labels would silently be read
as an index into the sorted names).
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter

from jaxbert.train.config import F32_MAX

# Integer labels are class ids 0..max: from this max on, ids of which the data use at most half are refused (a label
# 1000000000 had built a billion-class classifier).
SPARSE_IDS = 1000
PROBLEM_TYPES = ("regression", "single_label_classification", "multi_label_classification")


class LabelMismatch(ValueError):
    """The training data's labels are not the model's: a fine-tune initializes a new classifier instead."""


@dataclasses.dataclass(frozen=True)
class Labels:
    names: tuple[str, ...]
    problem_type: str | None = None  # sequence classification only
    # (path, line, label) of the data's first label: every other file must use its kind (strings or ids), since
    # an integer is an index into the names and a string a name. Not part of the labels' identity.
    first: tuple | None = dataclasses.field(default=None, compare=False)

    @property
    def ids(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.names)}


# Heads whose `classifier` scores their own task's labels: a checkpoint of one of them fine-tuned for another (a
# tagger for sentences, say) has names and weights meaning nothing there, and the same parameter names and shapes.
CLASSIFIER_HEADS = ("BertForSequenceClassification", "BertForTokenClassification", "BertForMultipleChoice")


def other_classifier(config, head: str) -> str | None:
    """The checkpoint's architecture when it is another task's classifier than `head`'s, else None."""
    arch = (config.architectures or ("",))[0]
    return arch if arch != head and arch in CLASSIFIER_HEADS and head in CLASSIFIER_HEADS else None


def model_labels(config, head: str) -> tuple[str, ...] | None:
    """The model's own label names, or None when the data should decide them (always for another task's
    classifier: an NER tagger's B-PER, I-PER are no sentence classes)."""
    if other_classifier(config, head) or getattr(config, "is_encoder_decoder", False):  # a bert2bert has no labels
        return None
    names = tuple(config.id2label[i] for i in range(config.num_labels))
    named = any(name != f"LABEL_{i}" for i, name in enumerate(names))
    return names if named or (config.architectures or ("",))[0] == head else None


def _kind(value) -> str:
    if isinstance(value, bool):
        return "true/false"
    kinds = {int: "an integer", float: "a number", str: "a string", list: "a list", dict: "an object"}
    return "null" if value is None else kinds.get(type(value), type(value).__name__)


def _class_label(row, column: str, value, first, sentence: bool) -> None:
    """An integer or a non-empty string, of the same kind as `first` (path, line, label) when given. A number for a
    sentence label (`sentence`) points at regression, which only `train --problem-type regression` makes (evaluate
    has no such flag; tags are never scores)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        scores = sentence and isinstance(value, float)
        hint = " (scores are a regression model's labels: train one with --problem-type regression)" if scores else ""
        raise ValueError(
            f"{row.where(column)}: label {value!r} is {_kind(value)}; classification labels are "
            f"integers or strings{hint}"
        )
    if isinstance(value, str) and not value.strip():
        raise ValueError(f"{row.where(column)}: label {value!r} is empty; expected a label name")
    if first is not None and type(value) is not type(first[2]):
        raise ValueError(
            f"{row.where(column)}: label {value!r} is {_kind(value)}, but {first[0]}:{first[1]} has "
            f"{_kind(first[2])} {first[2]!r}: use one kind"
        )


def _names(items, column: str, fixed, path: str, sentence: bool) -> tuple[tuple[str, ...], tuple | None]:
    """Names for (row, value) pairs of integers or strings, and the first (path, line, label); mixing the two
    kinds is an error naming the row."""
    first = None
    for row, value in items:
        _class_label(row, column, value, first, sentence)
        first = first or (row.path, row.line, value)
        if isinstance(value, int) and value < 0:
            ids = f"[0, {len(fixed)})" if fixed else "(integer labels are class ids, from 0)"
            raise ValueError(f"{row.where(column)}: label {value} out of range {ids}")
        if fixed and isinstance(value, int) and value >= len(fixed):
            raise LabelMismatch(f"{row.where(column)}: label {value} out of range [0, {len(fixed)})")
        if fixed and isinstance(value, str) and value not in fixed:
            raise LabelMismatch(f"{row.where(column)}: unknown label {value!r} (labels: {_listed(fixed)})")
        if fixed:
            _ambiguous_id(row, column, value, fixed)
    if fixed:
        return tuple(fixed), first
    if first is None:
        raise ValueError(f"{path}: column {column!r}: no labels (every list is empty)")
    if isinstance(first[2], str):
        return tuple(sorted({v for _, v in items})), first
    top = max(items, key=lambda item: item[1])
    seen = len({v for _, v in items})
    if top[1] >= SPARSE_IDS and seen <= top[1] // 2:  # a typo or an identifier, not a class id
        raise ValueError(
            f"{top[0].where(column)}: label {top[1]} would make {top[1] + 1:,} classes (integer labels are class ids "
            f"0..max) for the {seen} distinct labels of the data; give the labels as names (strings), or number "
            "them from 0"
        )
    return tuple(f"LABEL_{i}" for i in range(top[1] + 1)), first


def _path(rows) -> str:
    return next((row.path for row in rows), "the data")


def _listed(names) -> str:
    return ", ".join(map(repr, names[:20])) + (" ..." if len(names) > 20 else "")


def _named_cell(row, column: str, value, names) -> object:
    """A CSV/TSV cell that is one of the label names is that name, though it reads as an integer: for a model named
    "1", "2", "3" the cell 1 is the name "1", not the id of "2" (JSON keeps its types: "1" is a name, 1 an id, refused
    where it is also a name: _ambiguous_id)."""
    cell = None if row.typed else row.values.get(column)  # None: numbered columns, whose items stay as parsed
    if names and type(value) is int and isinstance(cell, str) and cell.strip() in names:
        return cell.strip()
    return value


def label_id(row, column: str, value, labels: Labels) -> int:
    value = _named_cell(row, column, value, labels.names)
    _class_label(row, column, value, labels.first, labels.problem_type is not None)
    if isinstance(value, str):
        if value not in labels.ids:
            raise ValueError(f"{row.where(column)}: unknown label {value!r} (labels: {_listed(labels.names)})")
        return labels.ids[value]
    if not 0 <= value < len(labels.names):
        raise ValueError(f"{row.where(column)}: label {value} out of range [0, {len(labels.names)})")
    _ambiguous_id(row, column, value, labels.names)
    return value


def _ambiguous_id(row, column: str, value, names) -> None:
    """A JSON integer is a label id, but where the names hold its digits at another id (a model named "1".."5" for
    star ratings: id 0 is "1") the file may mean that name: 2 read as id 2 ("3") shifted every label by one without
    a word. Refused, as the file cannot say which (a CSV cell is that name: _named_cell)."""
    if type(value) is int and str(value) in names and names[value] != str(value):
        raise ValueError(
            f"{row.where(column)}: label {value} is an integer, so a label id ({names[value]!r}), but the labels also "
            f'name {str(value)!r} (id {names.index(str(value))}): write the name as a string ("{value}") or the id '
            "of the label meant"
        )


def _infer(values) -> str:
    if any(isinstance(v, list) for _, v in values):
        return "multi_label_classification"
    if any(isinstance(v, float) and not v.is_integer() for _, v in values):
        return "regression"
    return "single_label_classification"


def _list(row, column: str, value) -> list:
    if not isinstance(value, list):
        raise ValueError(f"{row.where(column)}: multi-label: expected a list of labels, got {_kind(value)}")
    # A 0/1 indicator vector ([0, 1, 1, 0], transformers' multi-label targets) reads as the ids 0 and 1 in every
    # row: a two-label model learning nothing, without an error. A list of ids names each once.
    repeated = next((v for v, n in Counter(v for v in value if type(v) is int).items() if n > 1), None)
    if repeated is not None:
        ones = [i for i, v in enumerate(value) if v == 1]
        raise ValueError(
            f"{row.where(column)}: multi-label: {value!r} gives id {repeated} more than once; a list holds each "
            f"label's id (or name) once: a 0/1 indicator vector is written as the ids of its 1s ({ones})"
        )
    return value


def sequence_labels(rows, column: str, problem_type: str | None, fixed) -> Labels:
    """The label names and problem type of sequence-classification training rows."""
    values = [(row, _named_cell(row, column, row.label(column), fixed)) for row in rows]
    problem = problem_type or _infer(values)
    if problem == "regression":
        for row, value in values:
            regression_target(row, column, value)
        if fixed and len(fixed) != 1:
            raise LabelMismatch(f"regression needs one output; the model has {len(fixed)} labels")
        return Labels(tuple(fixed or ("LABEL_0",)), problem)
    if problem == "multi_label_classification":
        _two_label_vectors(values, column)
        values = [(row, item) for row, value in values for item in _list(row, column, value)]
    names, first = _names(values, column, fixed, _path(rows), True)
    return Labels(names, problem, first)


def _two_label_vectors(values, column: str) -> None:
    """Two-label 0/1 indicator vectors repeat no id (_list finds the longer ones): read as ids, [0, 1] and [1, 0]
    alike give every row both labels, a constant target learned and scored without a word."""
    if len(values) > 1 and all(isinstance(v, list) and sorted(map(repr, v)) == ["0", "1"] for _, v in values):
        row, value = values[0]
        raise ValueError(
            f"{row.where(column)}: multi-label: every row's labels are [0, 1] or [1, 0], which as label ids give "
            f"every row both labels (nothing to learn): a 0/1 indicator vector is written as the ids of its 1s "
            f"([{value.index(1)}] for {value!r})"
        )


def check_scorable(rows, labels: Labels, where: str = "") -> None:
    """Rows to score can be scored: correlations (regression) need two examples. Checked before training, which
    would otherwise stop at its first evaluation, its cache and checkpoints written. `where`: which rows these are,
    when not a whole file."""
    if labels.problem_type == "regression" and len(rows) < 2:
        raise ValueError(
            f"{_path(rows)}: {len(rows)} example to score{where}; Pearson and Spearman correlations need at least 2"
        )


def regression_target(row, column: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{row.where(column)}: regression label {value!r} is not a number")
    # Targets are float32: 1e39 became inf there and the run stopped at step 1's loss, its cache and checkpoints
    # written (transformers trains on the inf).
    if not (math.isfinite(value) and abs(value) <= F32_MAX):
        raise ValueError(f"{row.where(column)}: regression label {value!r} is not finite (in float32)")
    return float(value)


def sequence_target(row, column: str, labels: Labels):
    """One row's target: a class id, a score, or a 0/1 indicator list over the labels."""
    value = row.label(column)
    if labels.problem_type == "regression":
        return regression_target(row, column, value)
    if labels.problem_type == "multi_label_classification":
        out = [0.0] * len(labels.names)
        for item in _list(row, column, value):
            out[label_id(row, column, item, labels)] = 1.0
        return out
    return label_id(row, column, value, labels)


def tag_lists(rows, words_column: str, tags_column: str):
    """Per row (words, tags): equal-length lists, else an error naming the row."""
    out = []
    for row in rows:
        words, tags = row.texts(words_column), row.label(tags_column)
        if not isinstance(tags, list):
            raise ValueError(f"{row.where(tags_column)}: expected a list of tags, got {_kind(tags)}")
        if len(tags) != len(words):
            raise ValueError(
                f"{row.where(tags_column)}: {len(tags)} tags for {len(words)} tokens in column {words_column!r}"
            )
        out.append((row, words, tags))
    return out


def tag_labels(tagged, column: str, fixed) -> Labels:
    items = [(row, t) for row, _, tags in tagged for t in tags]
    names, first = _names(items, column, fixed, _path(row for row, _, _ in tagged), False)
    return Labels(names, first=first)
