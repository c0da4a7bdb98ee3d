"""Sequence packing: several short sequences share one row of a batch, so padding is not computed.

Each sequence keeps its own tokens, token types and positions (restarting at 0) and attends only within itself:
`segment_ids` number the sequences of a row 1, 2, ... (0 is padding) and attention allows a key only from the
query's segment (attention.keys_for). Its outputs are then the outputs it has alone; relative position scores
agree too, since they depend only on distances within a segment.

Rows are filled first-fit decreasing. A sequence's own rows are those of the smallest length bucket at least twice
its length (a row's attention spans the whole row, so a short sequence in a long row would pay for the row's
length), and one too long for that gets a row of its own; rows of one length are batched together. The room such
rows leave is then filled with shorter sequences, longest first (fill_gaps): that room is computed anyway, so
they ride free and fewer short rows run (benchmark.py's mix: 89% of the computed positions were text, now 98%).
A row left with room to spare (few texts to fill it: one text of 128 tokens is homed in a row of 256) then runs
at the shortest bucket that holds its sequences (shrink), with that length's rows.
How many segments a row can hold follows from its length alone (segments), so the programs stay bounded by
(row length, batch rows) buckets. A length's rows go out in batches that fill their batch bucket exactly
(16 + 4 + 1 rows, not 21 padded to 32; with several devices the last may be padded to a multiple of their
count).
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from jaxbert import batching
from jaxbert.tokenizer import Encoded


@dataclasses.dataclass(frozen=True)
class PackedBatch:
    """One batch of packed rows: `texts[r]` the indices of the sequences in row r, in segment order."""

    texts: list[list[int]]
    rows: int  # batch rows (a batch bucket); rows beyond len(texts) are all padding
    length: int  # row length (a length bucket)
    segments: int  # the most segments a row of this length can hold (see segments)


def row_length(n: int, buckets: tuple[int, ...]) -> int:
    """The row length a sequence of n tokens is packed into: the smallest bucket >= 2n, else the one >= n."""
    return next((b for b in buckets if b >= 2 * n), batching.bucket(n, buckets))


@functools.cache  # called for every row length of every plan; the search below runs row_length up to `length` times
def max_segments(length: int, buckets: tuple[int, ...]) -> int:
    """The most sequences a row of `length` can hold: it holds only sequences of n tokens with row_length(n) ==
    length (n > length / 4, but down to 1 for the smallest bucket)."""
    shortest = next(n for n in range(1, length + 1) if row_length(n, buckets) == length)
    return length // shortest


class _Rooms:
    """The room left in each of a list of rows, in a tree of maxima: the first row with room for n tokens in
    O(log rows). Scanning the rows instead took 12.7 s to plan 100,000 texts, now 0.7."""

    def __init__(self, rooms: list[int]):
        self.size = 1 << max(len(rooms) - 1, 0).bit_length()
        self.tree = [-1] * (2 * self.size)  # tree[k]: the most room under node k; the leaves from `size` are rows
        self.tree[self.size : self.size + len(rooms)] = rooms
        for k in range(self.size - 1, 0, -1):
            self.tree[k] = max(self.tree[2 * k], self.tree[2 * k + 1])

    def first(self, n: int) -> int | None:
        """The first row with room for n tokens (None: none has)."""
        if self.tree[1] < n:
            return None
        k = 1
        while k < self.size:
            k = 2 * k if self.tree[2 * k] >= n else 2 * k + 1
        return k - self.size

    def take(self, row: int, n: int):
        """n tokens of the row's room taken."""
        self.set(row, self.tree[self.size + row] - n)

    def set(self, row: int, room: int):
        k = self.size + row
        self.tree[k] = room
        while k > 1:
            k //= 2
            self.tree[k] = max(self.tree[2 * k], self.tree[2 * k + 1])


def first_fit_decreasing(lengths: np.ndarray, capacity: int) -> list[list[int]]:
    """Indices of `lengths` grouped into rows of at most `capacity` tokens, longest first into the first row
    with room (a longer one alone in a row of its own)."""
    lengths = np.asarray(lengths)
    rooms = _Rooms([capacity] * len(lengths))  # rows not yet opened count as empty: a new row opens at the first
    rows: list[list[int]] = []
    for i in np.argsort(-lengths, kind="stable"):
        n = int(lengths[i])
        r = rooms.first(n)
        if r is None or r == len(rows):
            r = len(rows)
            rows.append([])
        rows[r].append(int(i))
        rooms.take(r, n)
    return rows


def plan(lengths, batch_size: int, buckets: tuple[int, ...], multiple: int = 1, exact: bool = True):
    """Yield PackedBatch: every sequence once, rows of one length per batch, at most batch_size rows each (each
    length's last rows padded to one batch bucket unless `exact`: see _chunks)."""
    if batch_size < 1:
        raise ValueError(f"batch_size {batch_size}: must be at least 1")
    lengths = np.asarray(lengths)
    homes = np.asarray([row_length(int(n), buckets) for n in lengths], dtype=np.int64)
    placed = np.zeros(len(lengths), bool)
    moved: dict[int, list[list[int]]] = {}  # rows that went down to a shorter length (shrunk), by that length
    for length in sorted(set(buckets), reverse=True):  # longest first: shrunk rows go to lengths still to come
        members = np.flatnonzero((homes == length) & ~placed)
        rows = moved.pop(length, [])
        if members.size == 0 and not rows:  # all went into the gaps of longer rows, or none were this long
            continue
        most = segments(length, buckets)
        rows += [[int(members[j]) for j in row] for row in first_fit_decreasing(lengths[members], length)]
        fill_gaps(rows, lengths, np.flatnonzero((homes < length) & ~placed), length, most)
        for row in rows:
            placed[row] = True
        rows = shrink(rows, lengths, length, buckets, moved)
        for chunk, rows_bucket in _chunks(rows, batch_size, batching.batch_buckets(batch_size, multiple), exact):
            yield PackedBatch(chunk, rows_bucket, length, most)


def shrink(rows: list[list[int]], lengths: np.ndarray, length: int, buckets: tuple[int, ...], moved: dict) -> list:
    """The rows that stay at `length`; each one whose sequences fit a shorter bucket (and whose segments that
    bucket's rows can hold) goes to `moved` under that bucket instead, to run there with its rows (and take
    their gap-filling). A row runs whole, so a half-filled one costs what a full one does: with few texts to
    fill them (a call of one text of 128 tokens, which row_length puts in a row of 256), rows would run at
    twice the length their texts need."""
    stay = []
    for row in rows:
        shorter = batching.bucket(int(lengths[row].sum()), buckets)
        if shorter < length and len(row) <= segments(shorter, buckets):
            moved.setdefault(shorter, []).append(row)
        else:
            stay.append(row)
    return stay


def segments(length: int, buckets: tuple[int, ...]) -> int:
    """The most sequences a row of `length` holds: its own (max_segments) and as many again from the gaps."""
    return min(2 * max_segments(length, tuple(buckets)), length)


def fill_gaps(rows: list[list[int]], lengths: np.ndarray, shorter: np.ndarray, capacity: int, most: int):
    """Put sequences of `shorter` (indices of `lengths` whose own rows are shorter) into the room left in `rows`,
    longest first into the first row with room and a segment to spare. That room is computed anyway (a row
    runs whole), so the sequences it takes cost nothing there and leave fewer of the shorter rows to run."""
    rooms = _Rooms([capacity - int(lengths[row].sum()) if len(row) < most else -1 for row in rows])
    for i in shorter[np.argsort(-lengths[shorter], kind="stable")]:
        n = int(lengths[i])
        r = rooms.first(n)
        if r is not None:
            rows[r].append(int(i))
            if len(rows[r]) < most:
                rooms.take(r, n)
            else:
                rooms.set(r, -1)  # no segment to spare


def _chunks(rows: list, batch_size: int, sizes: tuple[int, ...], exact: bool = True):
    """(rows, batch bucket) chunks of `rows`, at most batch_size rows each.

    `exact`: each chunk the largest bucket that the rows left fill, the last padded to the smallest bucket (a
    multiple of the device count): 21 rows run as 16 + 4 + 1. Otherwise a length's last rows are one chunk padded
    to the smallest bucket that holds them (21 rows as 32). Exact chunks compute less padding but need more
    programs: on benchmark.py's mix of 2,000 texts (MiniLM int8, AMX Xeon), 18 against 8, so a first call compiles
    for 17 s where padding takes 9.5, and once every program is compiled padding costs 2-11% (2,000 / 256
    texts). Bert therefore pads on an entry point's first call and runs exact chunks from its second on
    (inference_tasks.packed_batches): a one-off call, or a `jaxbert` command, compiles least, and a process that
    keeps calling gets the exact chunks' speed, from the same bounded set of (row length, batch bucket)."""
    start = 0
    while start < len(rows):
        left = len(rows) - start
        if exact:
            size = max((b for b in sizes if b <= left), default=sizes[0])
            take = min(size, batch_size, left)  # a bucket rounded up to the device count may pass batch_size
        else:
            take = min(batch_size, left)
            size = batching.bucket(take, sizes)
        yield rows[start : start + take], size
        start += take


def pad_packed(enc: Encoded, batch: PackedBatch, pad_id: int) -> dict[str, np.ndarray]:
    """The batch's arrays: input_ids, token_type_ids, attention_mask, position_ids, segment_ids [rows, length],
    and starts [rows, segments] (each segment's first column; 0 for absent segments)."""
    shape = (batch.rows, batch.length)
    ids = np.full(shape, pad_id, np.int32)
    types, mask, positions, segments = (np.zeros(shape, np.int32) for _ in range(4))
    starts = np.zeros((batch.rows, batch.segments), np.int32)
    for r, texts in enumerate(batch.texts):
        at = 0
        for s, i in enumerate(texts):
            n = len(enc.ids[i])
            cols = slice(at, at + n)
            ids[r, cols], types[r, cols], mask[r, cols] = enc.ids[i], enc.type_ids[i], 1
            positions[r, cols], segments[r, cols], starts[r, s] = np.arange(n), s + 1, at
            at += n
    return {
        "input_ids": ids,
        "token_type_ids": types,
        "attention_mask": mask,
        "position_ids": positions,
        "segment_ids": segments,
        "starts": starts,
    }
