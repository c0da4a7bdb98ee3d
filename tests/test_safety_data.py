"""Adversarial training and evaluation data: what jaxbert reads from a task's rows is what the reference reads
(sentence-transformers' data collator, transformers' run_*.py), or the row is refused in one line naming file, line
and column, exit 1, nothing written."""

import pytest

from jaxbert.train import task_scored
from jaxbert.train.task_data import Row
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
