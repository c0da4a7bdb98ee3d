"""Packed task batches (`--pack`, the default for sequence and token classification): the examples of an
optimizer step, the same ones TaskBatches would take, share rows of --max-seq-length tokens (packing.py), so the
step computes (almost) no padding.

Each example keeps its own attention, positions and pooled [CLS] (segment_ids, position_ids, segment_starts);
sequence labels are per segment ([rows, segments], -100 / weight 0 where a row has fewer examples), token labels
per column. The step's loss is the unpacked batch's: the same examples, the same means (train/step.py weights
micro-batches by what their means are over, so how examples fall into micro-batches does not matter). The row
count of a step varies with the lengths drawn: it is padded to a batch bucket, so few programs compile.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxbert import batching, packing
from jaxbert.train.task_encode import IGNORE, Encodedset, TaskBatches


def segments_per_row(data: Encodedset, length: int) -> int:
    """How many examples a row of `length` can hold, from the shortest example (a power of two)."""
    shortest = max(1, int(data.lengths().min()))
    return 1 << (max(1, length // shortest) - 1).bit_length()


def padded_positions(data: Encodedset, batches: TaskBatches) -> tuple[float, float]:
    """The share of computed positions that are padding over one epoch's steps: bucketed (each step padded to
    its longest example's bucket) and packed into rows of batches.length."""
    lengths, real, bucketed, packed = data.lengths(), 0, 0, 0
    for step in range(batches.steps_per_epoch):
        rows = batches.examples(step)
        real += int(lengths[rows].sum())
        bucketed += len(rows) * batching.bucket(int(lengths[rows].max()), batches.buckets)
        packed += len(packing.first_fit_decreasing(lengths[rows], batches.length)) * batches.length
    return 1 - real / max(bucketed, 1), 1 - real / max(packed, 1)


@dataclasses.dataclass
class PackedTaskBatches(TaskBatches):
    length: int = 128  # row length: --max-seq-length
    segments: int = 1  # segments per row (segments_per_row)
    multiple: int = 1  # rows per micro-batch divide across this many devices

    def _packed(self, step: int) -> tuple[list[list[int]], int]:
        """Step `step`'s rows (the examples in each; empty rows last) and how many rows a micro-batch has (a
        batch bucket). Only lengths are read: every process plans the whole step, cheaply, then builds its rows."""
        examples = self.examples(step)
        rows = [
            [int(examples[i]) for i in row]
            for row in packing.first_fit_decreasing(self.blocks.lengths()[examples], self.length)
        ]
        n = batching.bucket(-(-len(rows) // self.accum), batching.batch_buckets(self.batch_size, self.multiple))
        return rows + [[]] * (self.accum * n - len(rows)), n

    def shape(self, step: int) -> tuple[int, int]:
        return self.accum, self._packed(step)[1]

    def __call__(self, step: int, rows: slice | None = None) -> dict:
        """The batch of optimizer step `step`: every leaf [accum, rows, ...], rows a batch bucket; with `rows`,
        only those rows of each micro-batch (a process's share)."""
        packed, n = self._packed(step)
        mine = range(n)[slice(None) if rows is None else rows]
        batch = self._arrays([packed[a * n + i] for a in range(self.accum) for i in mine], self.accum * len(mine))
        return {k: v.reshape(self.accum, len(mine), *v.shape[1:]) for k, v in batch.items()}

    def _arrays(self, rows: list[list[int]], n_rows: int) -> dict:
        data, L, S = self.blocks, self.length, self.segments
        ids = np.full((n_rows, L), self.pad_id, np.int32)
        types, mask, positions, segments = (np.zeros((n_rows, L), np.int32) for _ in range(4))
        starts = np.zeros((n_rows, S), np.int32)
        tags = np.full((n_rows, L), IGNORE, np.int32)
        per_example = not len(data.tags)
        pad = IGNORE if data.targets.dtype == np.int32 else 0
        labels = np.full((n_rows, S, *data.targets.shape[1:]), pad, data.targets.dtype)
        weight = np.zeros((n_rows, S), np.float32)
        for r, members in enumerate(rows):
            at = 0
            for s, e in enumerate(members):
                a, b = data.starts[e], data.starts[e + 1]
                cols = slice(at, at + b - a)
                ids[r, cols], types[r, cols], mask[r, cols] = data.ids[a:b], data.types[a:b], 1
                positions[r, cols], segments[r, cols], starts[r, s] = np.arange(b - a), s + 1, at
                if per_example:
                    labels[r, s], weight[r, s] = data.targets[e], 1.0
                else:
                    tags[r, cols] = data.tags[a:b]
                at += b - a
        batch = {
            "input_ids": ids,
            "attention_mask": mask,
            "token_type_ids": types,
            "position_ids": positions,
            "segment_ids": segments,
        }
        if per_example:
            return {**batch, "segment_starts": starts, "labels": labels, "sample_weight": weight}
        return {**batch, "labels": tags}
