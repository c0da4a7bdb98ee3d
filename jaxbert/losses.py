"""Losses with PyTorch's semantics (transformers' reference): integer-label cross-entropy ignoring -100, the
sequence-classification losses chosen by `problem_type`, and the extractive-QA span loss."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from jaxtyping import Array, Bool, Float, Int

from jaxbert.config import BertConfig


def cross_entropy(
    logits: Float[Array, "... C"],
    labels: Int[Array, ...],
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    classes: Bool[Array, "... C"] | None = None,
) -> Float[Array, ""]:
    """Mean integer-label cross-entropy over labels != ignore_index (PyTorch's CrossEntropyLoss semantics).

    `classes` marks each row's own classes (multiple choice with fewer options than the batch's widest example):
    the others take no probability, and label smoothing spreads over the row's own classes only, so a row's loss
    is the one it has alone."""
    valid = labels != ignore_index
    return token_losses(logits, labels, ignore_index, label_smoothing, classes).sum() / jnp.maximum(valid.sum(), 1)


def token_losses(
    logits: Float[Array, "... C"],
    labels: Int[Array, ...],
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    classes: Bool[Array, "... C"] | None = None,
) -> Float[Array, ...]:
    """cross_entropy's per-label terms (0 where ignored), float32: the validation steps sum them as they need
    (per row, per batch) with the smoothing training has, as Trainer evaluates through the same LabelSmoother."""
    valid = labels != ignore_index
    logits = logits.astype(jnp.float32)
    if classes is not None:
        logits = jnp.where(classes, logits, jnp.finfo(jnp.float32).min)
    logp = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(logp, jnp.where(valid, labels, 0)[..., None], axis=-1)[..., 0]
    if label_smoothing:
        if classes is None:
            spread = logp.mean(-1)
        else:  # a padding row has no classes: max(.., 1) keeps its (ignored) loss and gradient finite
            spread = jnp.where(classes, logp, 0.0).sum(-1) / jnp.maximum(classes.sum(-1), 1)
        nll = (1.0 - label_smoothing) * nll - label_smoothing * spread
    return jnp.where(valid, nll, 0.0)


def causal_lm_loss(
    logits: Float[Array, "B L V"], labels: Int[Array, "B L"], label_smoothing: float = 0.0
) -> Float[Array, ""]:
    """Next-token cross-entropy: position t predicts label t+1 (labels are the inputs, -100 ignored), as
    transformers' ForCausalLMLoss."""
    return cross_entropy(logits[:, :-1], labels[:, 1:], label_smoothing=label_smoothing)


def sequence_classification_loss(
    config: BertConfig,
    logits: Float[Array, "*B C"],
    labels: Array,
    label_smoothing: float = 0.0,
    sample_weight: Float[Array, " B"] | None = None,
) -> Float[Array, ""]:
    """transformers' loss for `problem_type` (inferred as it does when unset). `sample_weight` (1 real, 0
    padding rows of a bucketed batch) makes the mean over real rows only; single-label padding rows carry -100."""
    problem = config.problem_type
    if problem is None:  # transformers infers it from num_labels and the label dtype
        integer = jnp.issubdtype(labels.dtype, jnp.integer)
        problem = (
            "regression"
            if config.num_labels == 1
            else "single_label_classification"
            if integer
            else "multi_label_classification"
        )
    if problem == "single_label_classification":
        return cross_entropy(logits, labels.reshape(logits.shape[:-1]), label_smoothing=label_smoothing)
    if problem == "regression":
        preds = (logits[..., 0] if config.num_labels == 1 else logits).astype(jnp.float32)
        each = jnp.square(preds - labels.reshape(preds.shape).astype(jnp.float32))
    else:
        each = optax.sigmoid_binary_cross_entropy(logits.astype(jnp.float32), labels.astype(jnp.float32))
    if sample_weight is None:
        return each.mean()
    w = sample_weight.astype(jnp.float32)  # [B] or, packed, [B, S]: one weight per example
    w = jnp.broadcast_to(w.reshape(w.shape + (1,) * (each.ndim - w.ndim)), each.shape)
    return jnp.sum(each * w) / jnp.maximum(w.sum(), 1.0)


def span_loss(
    start_logits: Float[Array, "B L"],
    end_logits: Float[Array, "B L"],
    start: Int[Array, " B"],
    end: Int[Array, " B"],
    label_smoothing: float = 0.0,
) -> Float[Array, ""]:
    """QA loss: positions outside the sequence are clamped to L and ignored, as in transformers, which also takes
    positions [B, 1] (squeezed)."""
    L = start_logits.shape[-1]
    start, end = (jnp.clip(jnp.reshape(p, start_logits.shape[:-1]), 0, L) for p in (start, end))
    return (
        cross_entropy(start_logits, start, L, label_smoothing) + cross_entropy(end_logits, end, L, label_smoothing)
    ) / 2
