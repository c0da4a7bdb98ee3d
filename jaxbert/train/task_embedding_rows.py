"""The rows of sentence-embedding training (`jaxbert train --task embedding`, task_embedding.py): which columns are
the anchor, the positive and the negatives (as sentence-transformers' data collator reads them), each row's texts
checked and encoded as consecutive sequences, and the prompts put before them (--prompts).
"""

from __future__ import annotations

import numpy as np

from jaxbert.train import task_encode as E
from jaxbert.train import task_scored

TRIPLET = ("anchor", "positive", "negative")  # the default columns of --text-column, --text-pair-column, --label-column
# Read as the further negatives, a column whose text is bad names why it is read at all.
FURTHER = "it is read as a negative, as sentence-transformers' data collator reads every column after the anchor and \
the positive but a label"


def _text(row, column: str, negative: bool = False) -> str:
    """The row's text in `column`; a `negative`'s error says why that column is read (FURTHER)."""
    try:
        value = row.text(column)
        if not value.strip():
            raise ValueError(f"{row.where(column)}: empty text")
    except ValueError as e:
        raise ValueError(f"{e}; {FURTHER}" if negative else str(e)) from None
    return value


def encode_pairs(tok, rows, columns, labels, max_len: int, prompts: tuple[str, str] = ("", ""), column_prompts=None):
    """(anchor, positive, the negatives the first row has) for every row: `columns` is (anchor, positive, each
    negative column) as triplet_columns reads them, and every row needs the first row's negatives (a batch is
    [B, C, L], sentence-transformers' collator one column per negative). `prompts` (query, corpus) put before
    the anchors and before the others (evaluate's, as encode puts them); `column_prompts` (training's --prompts)
    replace them, each column's (given_prompts)."""
    anchor, positive, *negatives = columns
    if anchor not in rows[0].values and any(c in rows[0].values for c in task_scored.LABEL_COLUMNS):
        names = ", ".join(map(repr, rows[0].values))
        raise ValueError(
            f"{rows[0].path}:{rows[0].line}: no column {anchor!r} (columns: {names}): scored pairs train with "
            "--loss cosent, cosine-similarity or angle"
        )
    has = lambda row, column: column is not None and row.values.get(column) not in (None, "")  # noqa: E731
    cols = (anchor, positive, *(c for c in negatives if has(rows[0], c)))
    if column_prompts is not None:
        prompts = given_prompts(column_prompts, cols, rows[0].path)
    texts = []
    for row in rows:
        for c in negatives:
            if has(row, c) != (c in cols):
                first, n = f"{rows[0].path}:{rows[0].line}", len(cols) - 2
                want = f"a {c!r} like the first row ({first})" if c in cols else f"none, as {first} has none"
                raise ValueError(f"{row.where(c)}: every example needs {want}: {n} negative(s) each")
        texts.append([prompts[min(i, len(prompts) - 1)] + _text(row, c, i > 1) for i, c in enumerate(cols)])
    flat = [t for group in texts for t in group]
    targets = np.zeros(len(rows), np.int32)  # no labels: the batch's own rows are the answers
    return [texts], lambda: E._pack(tok.encode(flat, None, max_length=max_len), len(cols), targets)


def triplet_columns(rows, cols) -> tuple:
    """(anchor, positive, each negative column): the anchor and the positive as named (one not named: its
    default), else those names where the first row has an anchor and a positive (or a score column: encode_pairs
    names the scored losses), else the first row's columns in their order (task_scored.text_columns), as
    sentence-transformers' data collator reads every column but a label by position (MultipleNegativesRankingLoss:
    the anchor, the positive, then every other column a negative). The negatives: --label-column's column if
    named, then, where the anchor and the positive are the first row's first two columns (a label aside; in either
    order: jaxbert reads them by name), every other column of the rows but a label, in their order (further_negatives),
    as the collator reads them; where they are not (the collator would read other columns as the anchor), the named
    negative alone, the others unread as before. Without any, (anchor, positive, --label-column or "negative")."""

    def refused(head, texts) -> str:
        return (
            f"{len(texts)} text column(s) ({', '.join(map(repr, texts))}) and none named anchor and positive: "
            "--task embedding trains (anchor, positive[, negative_1, ...]) rows; name them with --text-column, "
            "--text-pair-column, --label-column"
        )

    read = task_scored.text_columns(rows, cols, TRIPLET, None, refused, hints=task_scored.LABEL_COLUMNS)
    task_scored.other_labels(rows, task_scored.dropped_label(rows))
    named = () if cols[2] is None else (cols[2],)
    further = further_negatives(rows, (*read[:2], *named))
    return (*read[:2], *named, *further) if further else read


def further_negatives(rows, read: tuple) -> tuple[str, ...]:
    """The columns beyond `read` (anchor, positive[, the named negative]) that sentence-transformers' collator
    reads as negatives: every column of any row but those, the first label column and dataset_name (which the
    collator drops; a further label column is a text to it, other_labels), in the order first met, where the first
    row's first two (those aside) are the anchor and the positive; none where they are not."""
    skip = {*read, task_scored.dropped_label(rows), task_scored.DATASET_NAME}
    lead = [c for c in rows[0].values if c in read or c not in skip][:2]
    if set(lead) != set(read[:2]):
        return ()
    return tuple(dict.fromkeys(c for row in rows for c in row.values if c not in skip))


def given_prompts(given, cols: tuple[str, ...], where: str = "the data") -> tuple[str, ...]:
    """Each column's prompt as sentence-transformers' data collator takes it from the trainer's `prompts`: a str
    is every column's, a mapping (TrainConfig's pairs) each named column's and "" (none) for the others. A column
    named there that the data lacks is an error (sentence-transformers would train without that prompt)."""
    if isinstance(given, str):
        return (given,) * len(cols)
    named = dict(given)
    if lacking := [c for c in named if c not in cols]:
        have = ", ".join(map(repr, cols))
        missing = f"--prompts: {where} has no column {lacking[0]!r}"
        raise ValueError(f"{missing} to put a prompt before (its columns: {have})")
    return tuple(named.get(c, "") for c in cols)
