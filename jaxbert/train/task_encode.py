"""Task examples tokenized once (cached in OUT/cache like the MLM blocks) and served as dynamically padded
batches: each batch is padded only to the shape bucket (batching.py) of its longest sequence, so a run compiles
at most one step per length bucket, and the batch of step s still depends only on (seed, s)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable

import numpy as np

from jaxbert import batching
from jaxbert.files import atomic_file
from jaxbert.inputs import first_outside
from jaxbert.train import data as D
from jaxbert.train.task_labels import Labels, label_id, sequence_target, tag_lists

IGNORE = -100  # transformers' ignored label: sub-tokens after a word's first, special tokens, padding


@dataclasses.dataclass
class Encodedset:
    """Every example's token sequences, concatenated: sequence s is ids[starts[s]:starts[s + 1]]; an example
    has `choices` consecutive sequences (multiple choice) or one. An example with fewer options than `choices`
    has empty sequences for the rest (an option's sequence has at least [CLS] and [SEP])."""

    ids: np.ndarray  # [T] int32
    types: np.ndarray  # [T] int8
    starts: np.ndarray  # [S + 1] int64
    tags: np.ndarray  # [T] int32 token labels, or [0] when the labels are per example
    targets: np.ndarray  # [N] int32 / float32 or [N, C] float32 (multi-label); [0] for token classification
    choices: int = 1
    truncated: int = 0  # words without a labelled token (token classification)
    extra: dict = dataclasses.field(default_factory=dict)  # a task's own arrays (question answering: task_qa.py)

    def __len__(self) -> int:
        return (len(self.starts) - 1) // self.choices

    def lengths(self) -> np.ndarray:
        return np.diff(self.starts).reshape(-1, self.choices).max(1)

    def options(self) -> np.ndarray:
        """[N] each example's number of options (multiple choice)."""
        return (np.diff(self.starts).reshape(-1, self.choices) > 0).sum(1)

    def batch(self, rows, n_rows: int, length: int, pad_id: int) -> dict:
        """Examples `rows` (-1: a padding row), padded to n_rows × length; padding rows have label -100
        (per-example labels: weight 0)."""
        C = self.choices
        ids = np.full((n_rows, C, length), pad_id, np.int32)
        types, mask = np.zeros_like(ids), np.zeros_like(ids)
        tags = np.full((n_rows, length), IGNORE, np.int32)
        rows = np.asarray(rows, np.int64)
        real = np.zeros(n_rows, bool)
        real[: len(rows)] = rows >= 0  # -1: a padding row (an epoch's last training step, data.Batches.index)
        for r, e in enumerate(rows):
            if e < 0:
                continue
            for c in range(C):
                a, b = self.starts[e * C + c], self.starts[e * C + c + 1]
                ids[r, c, : b - a], types[r, c, : b - a], mask[r, c, : b - a] = self.ids[a:b], self.types[a:b], 1
                if len(self.tags):
                    tags[r, : b - a] = self.tags[a:b]
        squeeze = (lambda a: a) if C > 1 else (lambda a: a[:, 0])
        batch = {"input_ids": squeeze(ids), "attention_mask": squeeze(mask), "token_type_ids": squeeze(types)}
        if C > 1:  # which options each example has (heads.forward's choice_mask)
            batch["choice_mask"] = mask.any(-1)
        if len(self.tags):
            # No row weights: a token loss is a mean over labelled tokens, and the step weighs micro-batches by
            # what their losses are over (step._items), so rows would weigh them wrongly (as packed rows have none).
            return {**batch, "labels": tags}
        pad = IGNORE if self.targets.dtype == np.int32 else 0
        labels = np.full((n_rows, *self.targets.shape[1:]), pad, self.targets.dtype)
        labels[real] = self.targets[rows[rows >= 0]]
        weight = real.astype(np.float32)
        return {**batch, "labels": labels, "sample_weight": weight}


def _pack(enc, choices: int, targets: np.ndarray, tags=None, truncated: int = 0) -> Encodedset:
    starts = np.zeros(len(enc) + 1, np.int64)
    starts[1:] = np.cumsum([len(x) for x in enc.ids])
    flat = lambda lists, dtype: np.fromiter((v for x in lists for v in x), dtype, int(starts[-1]))  # noqa: E731
    return Encodedset(
        flat(enc.ids, np.int32),
        flat(enc.type_ids, np.int8),
        starts,
        np.zeros(0, np.int32) if tags is None else flat(tags, np.int32),
        targets,
        choices,
        truncated,
    )


def cached(cache_dir: str, name: str, key: list, build) -> tuple[Encodedset, Callable[[], None]]:
    """(the examples, write): build() once per distinct (tokenizer, inputs, labels), later runs and resumes read
    OUT/cache; write() stores what was built (nothing when it was read), once every set has been checked."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    path = os.path.join(cache_dir, f"{name}-{digest}.npz")
    if os.path.isfile(path):
        with np.load(path) as f:
            return Encodedset(
                **{k: f[k] for k in ("ids", "types", "starts", "tags", "targets")},
                choices=int(f["choices"]),
                truncated=int(f["truncated"]),
                extra={k.removeprefix("extra_"): f[k] for k in f.files if k.startswith("extra_")},
            ), lambda: None
    data = build()

    def write() -> None:
        os.makedirs(cache_dir, exist_ok=True)
        with atomic_file(path, suffix=".npz") as tmp:  # never a truncated cache entry
            np.savez(
                tmp,
                **{k: getattr(data, k) for k in ("ids", "types", "starts", "tags", "targets")},
                choices=data.choices,
                truncated=data.truncated,
                **{f"extra_{k}": v for k, v in data.extra.items()},
            )

    return data, write


def check_tables(data: Encodedset, config, rows) -> None:
    """Every token id and token type id of the encoded `rows` inside the model's embedding tables: JAX clamps an
    out-of-range gather (each such token read as the table's last row, and trained as it) where PyTorch raises an
    IndexError. A tokenizer larger than the model, or text pairs for a model of one token type, are named by row."""
    tables = (
        ("token id", data.ids, config.vocab_size, "vocab_size", "the tokenizer does not match the model"),
        (
            "token type id",
            data.types,
            config.type_vocab_size,
            "type_vocab_size",
            "the second text of a pair has token type 1",
        ),
    )
    for label, values, upper, what, why in tables:
        found = first_outside(values, data.starts, upper)
        if found:
            sequence, _, value = found
            example = sequence // data.choices
            if "example" in data.extra:  # question answering: a window of that example's context
                example = int(data.extra["example"][example])
            row = rows[example]
            raise ValueError(f"{row.path}:{row.line}: {label} {value} is outside [0, {what}={upper}) ({why})")


# The encoders check every row and return (cache key parts, build): the caller tokenizes (build) only once the
# training and validation rows have both been checked, so a bad validation row leaves nothing in OUT/cache.
def encode_sequences(tok, rows, columns, labels: Labels, max_len: int):
    text, pair, label = columns
    texts = [r.text(text) for r in rows]
    pairs = [r.text(pair) for r in rows] if pair else None
    dtype = np.int32 if labels.problem_type == "single_label_classification" else np.float32
    targets = np.asarray([sequence_target(r, label, labels) for r in rows], dtype)
    return [texts, pairs, targets.tolist()], lambda: _pack(tok.encode(texts, pairs, max_length=max_len), 1, targets)


def _b_to_i(names: tuple[str, ...]) -> list[int]:
    """Per label id, the id a word's later sub-tokens take: I-X's for B-X where the labels have it, else its own."""
    inside = [n.replace("B-", "I-") if n.startswith("B-") else n for n in names]  # run_ner.py's str.replace
    return [names.index(x) if x in names else i for i, x in enumerate(inside)]


def encode_tags(tok, rows, columns, labels: Labels, max_len: int, label_all_tokens: bool = False):
    """Each word's label on its first sub-token, -100 on the rest (transformers' default); with
    `label_all_tokens`, the rest take it too, a B-X as I-X where there is one (run_ner.py's b_to_i_label). Words cut
    off by --max-seq-length (or without any token) are counted in `truncated`."""
    words_col, _, tags_col = columns
    later = _b_to_i(labels.names) if label_all_tokens else None
    tagged = tag_lists(rows, words_col, tags_col)
    words = [w for _, w, _ in tagged]
    if not any(words):  # the metrics need a word; found here, not at the first evaluation after compiling
        raise ValueError(f"{rows[0].path}: column {words_col!r}: no words to score (every list is empty)")
    ids = [[label_id(row, tags_col, t, labels) for t in tags] for row, _, tags in tagged]

    def build():
        enc = tok.encode_words(words, max_length=max_len)
        tags, truncated = [], 0
        for word_ids, word_labels in zip(enc.word_ids, ids):
            seen, out = set(), []
            for w in word_ids:
                first = w >= 0 and w not in seen
                out.append(word_labels[w] if first else IGNORE if later is None or w < 0 else later[word_labels[w]])
                seen.add(w)
            truncated += len(word_labels) - len(seen - {-1})
            tags.append(out)
        return _pack(enc, 1, np.zeros(0, np.int32), tags, truncated)

    return [words, ids, *(["label_all_tokens"] if label_all_tokens else [])], build


def encode_choices(tok, rows, columns, labels: Labels, max_len: int):
    """SWAG-style: each (context, option) pair is one sequence; the label is the right option's index. Examples
    may have different numbers of options (ARC's 3 to 5): each is padded to the most with empty sequences."""
    context, options, label = columns
    contexts = [r.text(context) for r in rows]
    lists = [r.texts(options) for r in rows]
    targets = []
    for row, opts in zip(rows, lists):
        if len(opts) < 2:
            raise ValueError(f"{row.where(options)}: {len(opts)} options; an example needs at least 2")
        value = row.label(label)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < len(opts):
            raise ValueError(
                f"{row.where(label)}: label {value!r} out of range: expected the index of the right "
                f"option, an integer in [0, {len(opts)})"
            )
        targets.append(value)
    targets = np.asarray(targets, np.int32)
    firsts = [c for c, opts in zip(contexts, lists) for _ in opts]
    seconds = [o for opts in lists for o in opts]

    def build():
        enc = tok.encode(firsts, seconds, max_length=max_len)
        n = max(len(opts) for opts in lists)
        # option k of example e is sequence e * n + k; the sequences after an example's last option stay empty
        place = np.concatenate([e * n + np.arange(len(opts)) for e, opts in enumerate(lists)])
        lengths = np.zeros(len(lists) * n, np.int64)
        lengths[place] = [len(x) for x in enc.ids]
        packed = _pack(enc, n, targets)
        packed.starts = np.concatenate([[0], np.cumsum(lengths)])
        return packed

    return [contexts, lists, targets.tolist()], build


@dataclasses.dataclass
class TaskBatches(D.Batches):
    """D.Batches' deterministic order over examples; each step padded to its own length bucket."""

    buckets: tuple[int, ...] = (128,)
    pad_id: int = 0

    def __call__(self, step: int, rows: slice | None = None) -> dict:
        """The batch of optimizer step `step`: every leaf [accum, batch_size, ...]; with `rows`, only those rows of
        each micro-batch (a process's share), padded to the length bucket of the whole step."""
        length = batching.bucket(int(self.blocks.lengths()[self.examples(step)].max()), self.buckets)
        chosen = self.index(step)[:, slice(None) if rows is None else rows]  # -1: padding rows
        batch = self.blocks.batch(chosen.reshape(-1), chosen.size, length, self.pad_id)
        return {k: v.reshape(*chosen.shape, *v.shape[1:]) for k, v in batch.items()}


def eval_batches(data: Encodedset, batch_size: int, buckets, multiple: int, pad_id: int):
    """(example indices, padded batch) in length order: bucketed rows and lengths, few compiled shapes."""
    for idx, rows, length in batching.plan(data.lengths(), batch_size, buckets, multiple):
        yield idx, data.batch(idx, rows, length, pad_id)
