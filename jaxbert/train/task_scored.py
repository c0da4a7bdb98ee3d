"""Sentence-embedding training on scored pairs (`jaxbert train --task embedding --loss cosent|cosine-similarity|angle`):
(sentence1, sentence2, score) rows, as sentence-transformers fine-tunes on STS data with CoSENTLoss,
CosineSimilarityLoss or AnglELoss, validated as its EmbeddingSimilarityEvaluator (Pearson and Spearman
correlations of the pairs' similarities with the scores).

Examples are the embedding task's [B, 2, L] batches (task_embedding.py) with a float score each; the loss runs over
the whole (global) micro-batch, padding rows out, as the in-batch ranking loss does.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float

from jaxbert import metrics
from jaxbert.train import task_encode as E
from jaxbert.train.task_labels import Labels

SCORED = ("cosent", "cosine-similarity", "angle")  # config.EMBEDDING_LOSSES but mnrl
SCALE = 20.0  # CoSENTLoss's and AnglELoss's default scale
# The label columns sentence-transformers' data collator takes, the first found (its DEFAULT_LABEL_COLUMNS).
LABEL_COLUMNS = ("label", "labels", "score", "scores")
# The column sentence-transformers' data collator removes before it reads the others by position (a multi-dataset
# row's name of its dataset): never a text, neither an anchor, a positive nor a negative.
DATASET_NAME = "dataset_name"
F32_MAX = float(np.finfo(np.float32).max)


DEFAULT_PAIR = ("sentence1", "sentence2")


# -- data ------------------------------------------------------------------------------------------------------
def label_column(rows, given: str | None) -> str:
    """The score column: --label-column, else the first of LABEL_COLUMNS the first row has."""
    if given is not None:
        return given
    found = next((c for c in LABEL_COLUMNS if c in rows[0].values), None)
    if found is None:
        names = ", ".join(map(repr, rows[0].values)) or "none"
        raise ValueError(
            f"{rows[0].path}:{rows[0].line}: no score column ({', '.join(LABEL_COLUMNS)}; its columns: {names}); "
            "pass --label-column"
        )
    return found


def dropped_label(rows) -> str | None:
    """The label column sentence-transformers' data collator drops: the first of LABEL_COLUMNS among the columns
    (every row's, as `datasets` gives each row all of them), or None."""
    keys = {c for row in rows for c in row.values}
    return next((c for c in LABEL_COLUMNS if c in keys), None)


def other_labels(rows, first: str | None) -> None:
    """Refuses a number (or any value but a text) in a label column after `first`: sentence-transformers' data
    collator drops only the first label column it finds and reads the others as texts by position, so its model
    fails on the number ("Unsupported input type: float", naming no column), and which column holds the scores is
    not clear. A text there is read as the collator reads it (a negative, or a text of a pair by position)."""
    for row in rows:
        for c in (c for c in LABEL_COLUMNS if c != first and row.values.get(c) is not None):
            value = row.label(c) if row.values[c] != "" else ""
            if not isinstance(value, str):
                raise ValueError(
                    f"{row.path}:{row.line}: columns {first!r} and {c!r}: sentence-transformers' data collator drops "
                    f"only the first label column it finds ({first!r}) and reads {c!r} as a text, which holds "
                    f"{value!r}: keep one label column (or rename {c!r})"
                )


def pair_columns(rows, cols) -> tuple:
    """The two text columns: as named (--text-column, --text-pair-column; one alone: the other's default), else
    sentence1 and sentence2 where the first row has both, else the first row's first two columns but the score,
    in its order (a CSV/TSV's header, a JSON line's keys), as sentence-transformers' data collator takes every
    column but the label by position (text_columns). Read by position, a row holding the two in the other order
    is refused: its pair would be swapped (by name it is not, by position it is)."""
    first, second, label = cols

    def refused(head, texts) -> str:
        names = ", ".join(map(repr, head.values))
        return (
            f"no pair of text columns beside the score {label_column(rows, label)!r} (columns: {names}); name them "
            "with --text-column and --text-pair-column"
        )

    score = lambda: (label_column(rows, label),)  # noqa: E731 - read only by position: named pairs need none yet
    if label is None:  # a named --label-column is the score whatever else the rows hold
        other_labels(rows, label_column(rows, None))
    return (*text_columns(rows, (first, second), DEFAULT_PAIR, 2, refused, exclude=score), label)


def text_columns(
    rows, given: tuple, defaults: tuple, columns: int | None, refused, *, hints=(), exclude=tuple
) -> tuple:
    """The text columns read, in the three steps of both embedding losses' data: `given` (the column flags, or
    the columns a model records) as named, each unnamed one its default (`defaults`); else `defaults` where the
    first row has their first two (or one of `hints`: columns that say what the rows are, named by the encoder);
    else the first row's columns but `exclude()` (the score), in its order, as sentence-transformers' data
    collator reads every column but the label by position: the first `columns` of them (None: every one), checked
    on every row by by_position and padded with None to len(defaults). Fewer than two are refused with
    `refused(first row, its text columns)`, a message after the first row's file:line."""
    head = rows[0]
    if any(c is not None for c in given) or all(c in head.values for c in defaults[:2]):
        return tuple(c or d for c, d in zip(given, defaults))
    if any(c in head.values for c in hints):
        return tuple(defaults)
    skipped = (*exclude(), DATASET_NAME)
    texts = [c for c in head.values if c not in skipped]
    if len(texts) < 2:
        raise ValueError(f"{head.path}:{head.line}: {refused(head, texts)}")
    taken = by_position(rows, texts[:columns])
    return (*taken, *[None] * (len(defaults) - len(taken)))


def by_position(rows, taken: list) -> list:
    """`taken`, the first row's text columns read by position (as sentence-transformers' data collator reads
    them), checked against every row: one holding them in another order is refused, since by name its texts would
    be the first row's, by position swapped."""
    head = rows[0]
    for row in rows:
        seen = [c for c in row.values if c in taken]
        if len(seen) == len(taken) and seen != taken:
            raise ValueError(
                f"{row.path}:{row.line}: columns {', '.join(map(repr, seen))} in another order than the first row's "
                f"({head.path}:{head.line}), which reads the texts by position as sentence-transformers does: write "
                "every row's keys in one order, or name the columns (--text-column, --text-pair-column)"
            )
    return taken


def _score(row, column: str, loss: str) -> float:
    value = row.label(column)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{row.where(column)}: score {value!r} is not a number")
    if not (math.isfinite(value) and abs(value) <= F32_MAX):
        raise ValueError(f"{row.where(column)}: score {value!r} is not finite (in float32)")
    # The loss fits the cosine to the score: one outside [-1, 1] cannot be reached (STS-B's 0..5 unscaled).
    if loss == "cosine-similarity" and not -1 <= value <= 1:
        raise ValueError(
            f"{row.where(column)}: score {value!r} outside [-1, 1], which --loss cosine-similarity fits the cosine to "
            "(scale the scores, e.g. STS-B's 0..5 to 0..1)"
        )
    return float(value)


def encode(tok, rows, columns, labels, max_len: int, prompts=("", ""), column_prompts=None, loss: str = "cosent"):
    """(sentence1, sentence2) of every row, its score the target (float32, as the collator's torch.tensor);
    `prompts` / `column_prompts` as task_embedding_rows.encode_pairs."""
    from jaxbert.train.task_embedding_rows import _text, given_prompts

    first, second, label = columns
    cols, label = (first, second), label_column(rows, label)
    if column_prompts is not None:
        prompts = given_prompts(column_prompts, cols, rows[0].path)
    texts = [[p + _text(row, c) for p, c in zip(prompts, cols)] for row in rows]
    targets = np.asarray([_score(row, label, loss) for row in rows], np.float32)
    flat = [t for pair in texts for t in pair]
    build = lambda: E._pack(tok.encode(flat, None, max_length=max_len), 2, targets)  # noqa: E731
    return [texts, targets.tolist(), label], build


# -- the losses ------------------------------------------------------------------------------------------------
def _unit(x):
    return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)  # torch's F.normalize


def angle_similarity(a: Float[Array, "B E"], b: Float[Array, "B E"]) -> Float[Array, " B"]:
    """sentence-transformers' pairwise_angle_sim: |cos + sin| of the unit vectors, each split into halves (an odd
    width padded with a zero) read as the real and imaginary parts."""
    if a.shape[-1] % 2:
        a, b = (jnp.pad(x, ((0, 0), (0, 1))) for x in (a, b))
    a, b = _unit(a), _unit(b)
    (ra, ia), (rb, ib) = jnp.split(a, 2, axis=-1), jnp.split(b, 2, axis=-1)
    return jnp.abs(jnp.sum(a * b, -1) + jnp.sum(ia * rb - ra * ib, -1))


def pair_loss(
    a: Float[Array, "B E"], b: Float[Array, "B E"], labels: Float[Array, " B"], valid: Bool[Array, " B"], loss: str
) -> tuple[Float[Array, " B"], Float[Array, ""]]:
    """(each pair's similarity, the loss) over the real rows (valid): cosine-similarity, the mean squared error of
    the cosine and the label; cosent (and angle, by the angle similarity), log(1 + Σ exp(s_i − s_j)) over the pairs
    of rows whose labels order them (label_i < label_j), s = SCALE × similarity: CoSENTLoss's sum, written over
    the [B, B] pairs instead of its sorted suffixes."""
    a, b = a.astype(jnp.float32), b.astype(jnp.float32)
    sim = angle_similarity(a, b) if loss == "angle" else jnp.sum(_unit(a) * _unit(b), -1)
    if loss == "cosine-similarity":
        return sim, jnp.sum(jnp.where(valid, (sim - labels) ** 2, 0.0)) / jnp.maximum(valid.sum(), 1)
    s = SCALE * sim
    ordered = valid[:, None] & valid[None, :] & (labels[:, None] < labels[None, :])
    terms = jnp.where(ordered, s[:, None] - s[None, :], jnp.finfo(jnp.float32).min).reshape(-1)
    return sim, jax.nn.logsumexp(jnp.concatenate([jnp.zeros(1, jnp.float32), terms]))


# -- validation ------------------------------------------------------------------------------------------------
def _unit_np(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def _pairwise(a: np.ndarray, b: np.ndarray, name: str) -> np.ndarray:
    """sentence-transformers' pairwise_{cos_sim, dot_score, euclidean_sim, manhattan_sim, angle_sim}."""
    if name == "angle":
        if a.shape[1] % 2:
            a, b = (np.pad(x, ((0, 0), (0, 1))) for x in (a, b))
        a, b = _unit_np(a), _unit_np(b)
        (ra, ia), (rb, ib) = np.split(a, 2, axis=1), np.split(b, 2, axis=1)
        return np.abs((a * b).sum(1) + (ia * rb - ra * ib).sum(1))
    if name == "cosine":
        return (_unit_np(a) * _unit_np(b)).sum(1)
    if name == "dot":
        return (a * b).sum(1)
    return -np.linalg.norm(a - b, axis=1) if name == "euclidean" else -np.abs(a - b).sum(1)


def metric_names(similarity: str) -> tuple[str, ...]:
    """EmbeddingSimilarityEvaluator's keys by default (similarity_fn_names None: the model's own similarity function
    alone), spearman first: its primary metric, the default best-model metric."""
    return (f"spearman_{similarity}", f"pearson_{similarity}")


def set_loss(a: np.ndarray, b: np.ndarray, labels: np.ndarray, loss: str) -> float:
    """pair_loss over a whole set, in float64 and O(N log N) memory as CoSENTLoss computes it (labels sorted, each
    score against the log-sum-exp of the higher-labelled suffix): the [N, N] pairs of a large validation set would
    not fit in memory (50,000 pairs: 10 GB a float32 array)."""
    sim = _pairwise(a, b, "angle" if loss == "angle" else "cosine")
    if loss == "cosine-similarity":
        return float(np.mean((sim - labels) ** 2))
    order = np.argsort(labels, kind="stable")
    labels, s = labels[order], SCALE * sim[order]
    suffix = np.append(np.logaddexp.accumulate(-s[::-1])[::-1], -np.inf)  # suffix[k]: log Σ_{j >= k} exp(-s_j)
    terms = s + suffix[np.searchsorted(labels, labels, side="right")]
    return float(np.logaddexp.reduce(np.append(terms, 0.0)))


def score(outputs, data: E.Encodedset, labels, loss: str = "cosent", similarity: str = "cosine") -> dict:
    """The set's loss as one batch (independent of the evaluation batch size) and EmbeddingSimilarityEvaluator's
    Pearson and Spearman correlations of each pair's similarity with its score, by the model's own similarity
    function alone, as that evaluator scores by default (cosine is not added beside dot, euclidean or manhattan)."""
    emb = np.stack(outputs).astype(np.float64)  # [N, 2, E]
    a, b, gold = emb[:, 0], emb[:, 1], data.targets.astype(np.float64)
    sims = _pairwise(a, b, similarity)
    pearson, spearman = metrics.pearson(sims, gold), metrics.spearman(sims, gold)
    return {"loss": set_loss(a, b, gold, loss), f"pearson_{similarity}": pearson, f"spearman_{similarity}": spearman}


def task(loss: str, similarity: str = "cosine"):
    """The embedding task (task_table) on scored pairs with `loss`, ranking metrics replaced by correlations."""
    from jaxbert.train.task_table import TASKS

    embedding = TASKS["embedding"]
    return dataclasses.replace(
        embedding,
        columns=(None, None, None),  # pair_columns: sentence1 and sentence2, else by position
        resolve=pair_columns,
        labels=lambda rows, cols, problem, fixed: Labels((), "regression"),  # scores: correlations need 2 rows
        encode=functools.partial(encode, loss=loss),
        score=functools.partial(score, loss=loss, similarity=similarity),
        metrics=lambda labels: metric_names(similarity),
    )
