"""Shape buckets: pad every batch to one of a few (batch, length) shapes so a stream of texts of any lengths
compiles at most len(length buckets) × len(batch buckets) programs, and sort by length so little is padded."""

from __future__ import annotations

import numpy as np

LENGTH_BUCKETS = (16, 32, 64, 128, 256, 512)


def length_buckets(max_positions: int) -> tuple[int, ...]:
    """The length buckets a model can use: the standard ones below its limit, then the limit itself."""
    return tuple(b for b in LENGTH_BUCKETS if b < max_positions) + (max_positions,)


def batch_buckets(batch_size: int, multiple: int = 1) -> tuple[int, ...]:
    """Powers of two up to batch_size (and batch_size itself), each rounded up to a multiple of the device count
    so every batch splits evenly across devices."""
    sizes, b = set(), 1
    while b < batch_size:
        sizes.add(b)
        b *= 2
    sizes.add(batch_size)
    return tuple(sorted({-(-s // multiple) * multiple for s in sizes}))


def bucket(n: int, buckets: tuple[int, ...]) -> int:
    for b in buckets:
        if n <= b:
            return b
    raise ValueError(f"{n} exceeds the largest bucket {buckets[-1]}")


def plan(lengths: np.ndarray, batch_size: int, buckets: tuple[int, ...], multiple: int = 1):
    """Yield (indices, rows, length): indices of the texts in one batch (sorted by length, longest first so a
    too-large batch fails early), padded to `rows` × `length` with length one of `buckets`."""
    if batch_size < 1:
        raise ValueError(f"batch_size {batch_size}: must be at least 1")
    order = np.argsort(-np.asarray(lengths), kind="stable")
    lb, bb = buckets, batch_buckets(batch_size, multiple)
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        yield idx, bucket(len(idx), bb), bucket(int(lengths[idx].max()), lb)
