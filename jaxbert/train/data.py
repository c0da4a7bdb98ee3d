"""Training data: local text files tokenized once (batched, with the checkpoint's fast tokenizer), cached on disk
as memory-mapped token arrays, and served as deterministic batches: the batch of step s depends only on
(seed, s), so a resumed run sees exactly the data the uninterrupted one would have."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os

import numpy as np

from jaxbert.files import atomic_file, existing_file
from jaxbert.packing import first_fit_decreasing
from jaxbert.tokenizer import WordPiece


@dataclasses.dataclass
class Tokens:
    """Tokenized rows: `ids` [N, L] int32 and, beside them, `segments` [N, L] (uint8 or uint16): the line each token
    belongs to (1, 2, ... within a packed row, 0 on padding). Kept apart from the ids because no id marks a line: a
    line may hold a literal "[CLS]" or "[PAD]", which the tokenizer reads as that special token (as transformers'
    does) and which run_mlm.py attends to as text within its line. Indexing rows gives [..., 2, L] int32 (ids,
    segments); the two stay separate on disk so the segments cost one or two bytes a token, not four."""

    ids: np.ndarray
    segments: np.ndarray

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, rows) -> np.ndarray:
        return np.stack([np.asarray(self.ids[rows]), np.asarray(self.segments[rows], np.int32)], axis=-2)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        rows = self[:]
        return rows if dtype is None else rows.astype(dtype)


def _tokenize(
    tok: WordPiece, texts: list[str], seq_len: int, line_by_line: bool, pad_id: int, pack: bool = False
) -> Tokens:
    if line_by_line:  # one example per line, truncated; padded to seq_len, or packed (several lines per row)
        enc = tok.encode(texts, max_length=seq_len, truncation=True)
        lengths = np.asarray([len(ids) for ids in enc.ids])
        rows = first_fit_decreasing(lengths, seq_len) if pack else [[i] for i in range(len(texts))]
        ids = np.full((len(rows), seq_len), pad_id, np.int32)
        most = max((len(members) for members in rows), default=0)
        segments = np.zeros((len(rows), seq_len), np.uint8 if most <= 255 else np.uint16)  # [CLS] [SEP]: <= L/2
        for r, members in enumerate(rows):
            flat = [t for i in members for t in enc.ids[i]]
            ids[r, : len(flat)] = flat
            segments[r, : len(flat)] = np.repeat(np.arange(1, len(members) + 1), lengths[members])
        return Tokens(ids, segments)
    # As transformers' run_mlm: [CLS] text [SEP] for every line, all concatenated, cut into seq_len blocks, every
    # token attended (group_texts' attention_mask is all ones). Cut once, not per datasets.map batch of 1,000 lines
    # as there: only the last partial block is dropped (README says so).
    enc = tok.encode(texts, truncation=False, max_length=10**9)
    flat = np.fromiter((i for ids in enc.ids for i in ids), np.int32)
    blocks = len(flat) // seq_len
    return Tokens(flat[: blocks * seq_len].reshape(blocks, seq_len), np.ones((blocks, seq_len), np.uint8))


def tokenized(
    tok: WordPiece,
    texts: list[str],
    seq_len: int,
    line_by_line: bool,
    pad_id: int,
    cache_dir: str,
    name: str,
    tokenizer_key: str,
    pack: bool = False,
) -> Tokens:
    """Token rows of seq_len (see Tokens), from the cache when the same texts were tokenized the same way before.
    With `line_by_line` and `pack`, the lines share rows (first-fit decreasing)."""
    # "segments": an entry's ids come with its segments (entries of ids alone, from before, are never read back).
    key = [tokenizer_key, seq_len, line_by_line, "segments"] + ([True] if pack else [])
    key += [pad_id] if line_by_line else []  # config.json's, which tokenizer_key does not cover: rows padded with it
    h = hashlib.sha256(json.dumps(key).encode())
    for text in texts:
        h.update(text.encode("utf-8") + b"\n")
    path = os.path.join(cache_dir, f"{name}-{h.hexdigest()[:20]}")
    paths = (path + ".npy", path + ".segments.npy")
    if not all(os.path.isfile(p) for p in paths):
        tokens = _tokenize(tok, texts, seq_len, line_by_line, pad_id, pack and line_by_line)
        os.makedirs(cache_dir, exist_ok=True)
        # The ids last: an entry is read back only when both are there. A crash mid-write leaves neither a
        # truncated file nor debris (atomic_file).
        for p, array in zip(paths[::-1], (tokens.segments, tokens.ids)):
            with atomic_file(p, suffix=".npy") as tmp:
                np.save(tmp, array)
    return Tokens(*(np.load(p, mmap_mode="r") for p in paths))


def positions(segment_ids: np.ndarray) -> np.ndarray:
    """position_ids of packed rows [..., L] from their segment ids: positions restart where a segment starts."""
    col = np.broadcast_to(np.arange(segment_ids.shape[-1]), segment_ids.shape)
    prev = np.concatenate([np.full_like(segment_ids[..., :1], -1), segment_ids[..., :-1]], -1)
    first = np.maximum.accumulate(np.where(segment_ids != prev, col, 0), axis=-1)
    return (col - first).astype(np.int32)


# The files the tokenizer reads: those of the first key, then the special and added tokens' (read since; kept apart so
# that checkpoints' tokenizer_sha256 of the first three stays comparable).
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json")
SPECIAL_TOKEN_FILES = ("special_tokens_map.json", "added_tokens.json")


def tokenizer_key(directory: str, names: tuple[str, ...] = TOKENIZER_FILES + SPECIAL_TOKEN_FILES) -> str:
    """A hash of the tokenizer files `names`, part of the cache key and of a checkpoint's meta. They are read
    through files.existing_file, so a symlink leading out of the model directory is refused as the tokenizer
    itself would refuse it."""
    from jaxbert.sentence_dir import transformer_dir

    h, directory = hashlib.sha256(), transformer_dir(directory)
    for name in names:
        path = existing_file(directory, name)
        if path is not None:
            with open(path, "rb") as f:
                h.update(f.read())
    return h.hexdigest()


class TooFewForAStep(ValueError):
    """A training set smaller than one optimizer step (Batches); `of_file` names its file."""


def of_file(path: str, packed: bool, make):
    """make() (a Batches), its refusal of a set smaller than one step naming the training file `path` (the message
    named no file, and its count of packed rows looked like lines lost)."""
    try:
        return make()
    except TooFewForAStep as e:
        hint = " (its lines share packed rows: --no-pack reads one a row)" if packed else ""
        raise ValueError(f"{path}: {e}{hint}") from None


@dataclasses.dataclass
class Batches:
    """Deterministic batches of `blocks`: step s uses rows of a per-epoch permutation seeded by (seed, epoch). Every
    block is in one step of each epoch: when the step size does not divide the set, the epoch's last step takes the
    rest and padding rows (no tokens, nothing to learn from), as transformers' Trainer keeps its last batch."""

    blocks: np.ndarray | Tokens  # [N, ...]: one row each
    batch_size: int  # global, per micro-batch
    accum: int
    seed: int

    def __post_init__(self):
        self.per_step = self.batch_size * self.accum
        self.steps_per_epoch = -(-len(self.blocks) // self.per_step)
        if len(self.blocks) < self.per_step:
            raise TooFewForAStep(
                f"the training set has {len(self.blocks)} sequences, fewer than one step needs "
                f"({self.batch_size} per batch × {self.accum} accumulation steps)"
            )

    def position(self, step: int) -> dict:
        return {"epoch": step // self.steps_per_epoch, "offset": (step % self.steps_per_epoch) * self.per_step}

    def shape(self, step: int) -> tuple[int, int]:
        """[accum, rows] of step `step`'s batch (every process knows it before reading its share)."""
        return self.accum, self.batch_size

    def examples(self, step: int) -> np.ndarray:
        """The examples of optimizer step `step`, micro-batch after micro-batch (fewer in an epoch's last step)."""
        pos = self.position(step)
        order = np.random.default_rng([self.seed, pos["epoch"]]).permutation(len(self.blocks))
        return order[pos["offset"] : pos["offset"] + self.per_step]

    def index(self, step: int) -> np.ndarray:
        """[accum, batch_size] examples of step `step`; -1 marks padding rows (after an epoch's last example)."""
        index = np.full(self.per_step, -1, np.int64)
        examples = self.examples(step)
        index[: len(examples)] = examples
        return index.reshape(self.accum, self.batch_size)

    def __call__(self, step: int, rows: slice | None = None, fill=0) -> np.ndarray:
        """The blocks of optimizer step `step`: [accum, batch_size, ...]; with `rows`, only those rows of each
        micro-batch (a process's share: only they are read from the memory-mapped blocks). Padding rows are
        `fill` (broadcast to a block)."""
        index = self.index(step)
        index = index[:, rows] if rows is not None else index
        flat = index.reshape(-1)
        blocks = np.asarray(self.blocks[np.maximum(flat, 0)])
        blocks[flat < 0] = fill
        return blocks.reshape(*index.shape, *blocks.shape[1:])
