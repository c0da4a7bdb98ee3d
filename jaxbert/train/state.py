"""Train state and optimizer: AdamW (no weight decay on biases and LayerNorm), linear warm-up then linear decay,
global-norm clipping. Gradient accumulation happens inside the step (a scan over micro-batches), so one step
is one optimizer update and checkpoints never fall mid-accumulation."""

from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp
import optax
from flax import traverse_util

from jaxbert.checkpoint import load_params
from jaxbert.config import BertConfig
from jaxbert.params import init_params


@flax.struct.dataclass
class TrainState:
    step: jax.Array
    params: dict
    opt_state: optax.OptState


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    learning_rate: float = 5e-5
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8
    max_grad_norm: float = 1.0
    warmup_steps: int = 0
    total_steps: int = 1

    @classmethod
    def from_train(cls, cfg, warmup_steps: int, total_steps: int) -> OptimConfig:
        """The optimizer's share of a TrainConfig (same field names), with the resolved step counts."""
        names = {f.name for f in dataclasses.fields(cls)} - {"warmup_steps", "total_steps"}
        return cls(**{n: getattr(cfg, n) for n in names}, warmup_steps=warmup_steps, total_steps=total_steps)


def decay_mask(params) -> dict:
    """True where weight decay applies: not on biases, not on LayerNorm parameters (as transformers' Trainer)."""
    flat = traverse_util.flatten_dict(params)
    return traverse_util.unflatten_dict({path: path[-1] != "bias" and "LayerNorm" not in path for path in flat})


def schedule(cfg: OptimConfig) -> optax.Schedule:
    warmup = optax.linear_schedule(0.0, cfg.learning_rate, max(cfg.warmup_steps, 1))
    decay = optax.linear_schedule(cfg.learning_rate, 0.0, max(cfg.total_steps - cfg.warmup_steps, 1))
    return optax.join_schedules([warmup, decay], [cfg.warmup_steps]) if cfg.warmup_steps else decay


def optimizer(cfg: OptimConfig) -> optax.GradientTransformation:
    adamw = optax.adamw(
        schedule(cfg),
        b1=cfg.adam_beta1,
        b2=cfg.adam_beta2,
        eps=cfg.adam_epsilon,
        weight_decay=cfg.weight_decay,
        mask=decay_mask,
    )
    return optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), adamw) if cfg.max_grad_norm else adamw


def mlm_params(directory: str, config: BertConfig, seed: int) -> tuple[dict, list[str]]:
    """The checkpoint as BertForMaskedLM. A checkpoint without an MLM head (e.g. a sentence encoder) gets a
    fresh one, initialized as transformers does and tied to the word embeddings; its keys are returned."""
    params, report = load_params(directory, config, "BertForMaskedLM", allow_missing_head=True)
    if report.missing:
        fresh = init_params(config, jax.random.key(seed), "BertForMaskedLM")
        params = {**params, "cls": jax.device_get(fresh["cls"])}
    return jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), params), report.missing


def init_state(params, tx) -> TrainState:
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))
