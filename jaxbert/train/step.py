"""The pure training and evaluation steps, one for every task: the head table (heads.forward) computes the loss
from the batch's target keys. Masked-LM batches (they carry "positions") take the loss only at the masked
positions, gathered before the vocabulary projection."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from jaxbert.config import BertConfig
from jaxbert.heads import forward, mlm_logits
from jaxbert.losses import cross_entropy, token_losses
from jaxbert.model import bert
from jaxbert.train.state import TrainState


def masked_lm(params, config: BertConfig, batch: dict, *, rng=None, dtype=jnp.float32, remat: bool = False):
    """Logits [B, K, V] at the gathered positions. Master params stay float32; compute runs in `dtype`."""
    params = jax.tree_util.tree_map(lambda x: x.astype(dtype), params)
    out = bert(
        params["bert"],
        config,
        batch["input_ids"],
        batch["attention_mask"],
        position_ids=batch.get("position_ids"),  # packed line-by-line rows (train/data.py)
        segment_ids=batch.get("segment_ids"),
        rng=rng,
        remat=remat,
    )
    hidden = jnp.take_along_axis(out.last_hidden_state, batch["positions"][..., None], axis=1)
    return mlm_logits(params["cls"], config, params["bert"]["embeddings"]["word_embeddings"]["embedding"], hidden)


# heads.forward's loss inputs
TARGET_KEYS = ("labels", "start_positions", "end_positions", "sample_weight", "choice_mask")


def task_forward(
    params,
    config: BertConfig,
    head: str,
    batch: dict,
    *,
    rng=None,
    dtype=jnp.float32,
    remat: bool = False,
    label_smoothing: float = 0.0,
):
    """heads.forward on a task batch: its outputs and the head's loss (padding rows carry -100 / weight 0)."""
    params = jax.tree_util.tree_map(lambda x: x.astype(dtype), params)
    return forward(
        params,
        config,
        head,
        batch["input_ids"],
        batch["attention_mask"],
        batch.get("token_type_ids"),
        batch.get("position_ids"),  # packed rows (train/task_pack.py): positions restart per example
        rng=rng,
        segment_ids=batch.get("segment_ids"),
        segment_starts=batch.get("segment_starts"),
        remat=remat,
        label_smoothing=label_smoothing,
        **{k: batch[k] for k in TARGET_KEYS if k in batch},
    )


def _loss(params, config, head, batch, rng, dtype, remat, label_smoothing, loss_fn=None):
    if loss_fn is not None:  # a loss no head computes (sentence embeddings: task_embedding.train_loss)
        logits, loss, labels = loss_fn(params, batch, rng, dtype, remat)
        valid = labels != -100
        return loss, (jnp.sum((logits.argmax(-1) == labels) & valid), valid.sum(), _items(batch))
    if "positions" in batch:
        logits = masked_lm(params, config, batch, rng=rng, dtype=dtype, remat=remat)
        loss = cross_entropy(logits, batch["labels"], label_smoothing=label_smoothing)
    else:
        out = task_forward(
            params, config, head, batch, rng=rng, dtype=dtype, remat=remat, label_smoothing=label_smoothing
        )
        logits, loss = out.logits, out.loss
    labels = batch.get("labels")
    if labels is None or not jnp.issubdtype(labels.dtype, jnp.integer):  # scores / label sets: no accuracy
        return loss, (jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32), _items(batch))
    valid = labels != -100
    return loss, (jnp.sum((logits.argmax(-1) == labels) & valid), valid.sum(), _items(batch))


def _items(batch: dict) -> jax.Array:
    """What the micro-batch's loss is a mean over (float32): real rows (`sample_weight`), else labelled tokens,
    positions or rows (not -100), else rows."""
    if "sample_weight" in batch:
        return batch["sample_weight"].sum().astype(jnp.float32)
    for key in ("labels", "start_positions"):
        if key in batch and jnp.issubdtype(batch[key].dtype, jnp.integer):
            return (batch[key] != -100).sum().astype(jnp.float32)
    return jnp.asarray(batch["input_ids"].shape[0], jnp.float32)


def train_step(
    state: TrainState,
    batch: dict,
    rng: jax.Array,
    *,
    config: BertConfig,
    tx,
    schedule,
    head: str = "BertForMaskedLM",
    dtype=jnp.float32,
    remat: bool = False,
    label_smoothing: float = 0.0,
    loss_fn=None,
):
    """(state, batch [A micro-batches, B, ...], rng) -> (state, metrics); one optimizer update. `loss_fn`
    (params, micro-batch, rng, dtype, remat) -> (logits, loss, labels) replaces the head's loss."""
    micro = jax.tree_util.tree_leaves(batch)[0].shape[0]
    # Micro-batches are weighted by what their mean losses are over (labelled tokens, real rows), so that
    # accumulating A micro-batches gives the gradient of the whole batch's loss, however its tokens are spread.
    # (transformers 5's Trainer sums the micro-batches' means for BERT: its models ignore num_items_in_batch.)
    # The weights depend on the batch alone, so they scale each loss before its gradient: a scalar at the root
    # of the backward pass instead of passes over the whole gradient tree (one micro-batch: none at all).
    items = jax.vmap(_items)(batch)  # [A]
    weights = jnp.where(items > 0, items / jnp.maximum(items.sum(), 1e-9), 0.0)

    def scaled(params, mb, i):
        rng_i = jax.random.fold_in(rng, i)
        loss, aux = _loss(params, config, head, mb, rng_i, dtype, remat, label_smoothing, loss_fn)
        return loss * weights[i], (jnp.where(weights[i] > 0, loss, 0.0) * weights[i], aux[:2])

    grad_fn = jax.value_and_grad(scaled, has_aux=True)
    first = jax.tree_util.tree_map(lambda x: x[0], batch)
    (_, (loss, (correct, count))), grads = grad_fn(state.params, first, 0)
    if micro > 1:

        def accumulate(carry, xs):
            grads, loss, correct, count = carry
            mb, i = xs
            (_, (mb_loss, (c, n))), g = grad_fn(state.params, mb, i)
            return (jax.tree_util.tree_map(jnp.add, grads, g), loss + mb_loss, correct + c, count + n), None

        rest = jax.tree_util.tree_map(lambda x: x[1:], batch)
        (grads, loss, correct, count), _ = jax.lax.scan(
            accumulate, (grads, loss, correct, count), (rest, jnp.arange(1, micro))
        )
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    new = state.replace(step=state.step + 1, params=optax.apply_updates(state.params, updates), opt_state=opt_state)
    metrics = {
        "loss": loss,
        "accuracy": correct / jnp.maximum(count, 1),
        "grad_norm": optax.tree.norm(grads),
        "learning_rate": schedule(state.step),
        "masked_tokens": count,
    }
    if not jnp.issubdtype(batch["labels"].dtype, jnp.integer):
        del metrics["accuracy"]
    return new, metrics


def eval_step(params, batch: dict, *, config: BertConfig, dtype=jnp.float32, label_smoothing=0.0):
    """Sums over the masked tokens of one batch: (negative log-likelihood, smoothed as training's since Trainer's
    evaluation (run_mlm's eval_loss, its perplexity) goes through the same LabelSmoother; correct predictions,
    count)."""
    logits = masked_lm(params, config, batch, dtype=dtype).astype(jnp.float32)
    labels = batch["labels"]
    valid = labels != -100
    nll = token_losses(logits, labels, label_smoothing=label_smoothing)
    return nll.sum(), jnp.sum((logits.argmax(-1) == labels) & valid), valid.sum()


def task_eval_step(params, batch: dict, *, config: BertConfig, head: str, dtype=jnp.float32, label_smoothing=0.0):
    """A task batch's logits (float32) and mean loss over its real labels, smoothed as training's (Trainer's
    evaluation goes through the same LabelSmoother; `jaxbert evaluate` gives the plain loss)."""
    out = task_forward(params, config, head, batch, dtype=dtype, label_smoothing=label_smoothing)
    return out.logits.astype(jnp.float32), out.loss
