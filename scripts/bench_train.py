"""The training-step and conversion measurements behind scripts/benchmark.py (see bench_peers.py for how the
children run)."""

from __future__ import annotations

import os
import time


def child_convert(src: str, dst: str) -> dict:
    from jaxbert.transfer import convert_checkpoint

    start = time.perf_counter()
    convert_checkpoint(src, dst, force=True)
    return {"seconds": time.perf_counter() - start}


def child_transformers_resave(src: str, dst: str) -> dict:
    import transformers

    start = time.perf_counter()
    transformers.BertModel.from_pretrained(src).save_pretrained(dst)
    return {"seconds": time.perf_counter() - start}


def child_baseline(src: str, dst: str) -> dict:
    import jaxbert.transfer  # noqa: F401 - the interpreter + jax + jaxbert, for the RSS baseline

    return {"seconds": 0.0}


TRAIN_BATCH, TRAIN_LEN, TRAIN_STEPS = 8, 128, 4


def _mlm_batch(seed: int = 0):
    """One bert-base-vocabulary batch with 15% of positions labelled, as the MLM collator would give."""
    import numpy as np

    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, 30000, (TRAIN_BATCH, TRAIN_LEN)).astype(np.int32)
    labels = np.where(rng.random(ids.shape) < 0.15, ids, -100).astype(np.int32)
    return ids, labels


def _jax_train(dtype: str, remat: bool, measure_only: bool = False) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import jaxbert
    from jaxbert.train.loop import micro_batch_tokens
    from jaxbert.train.masking import default_max_predictions
    from jaxbert.train.state import OptimConfig, init_state, optimizer, schedule
    from jaxbert.train.step import train_step

    if dtype == "bfloat16":
        jaxbert.cpu.bf16_matmuls()  # as `jaxbert train --dtype bfloat16` does
    config = jaxbert.BertConfig()
    opt = OptimConfig(learning_rate=1e-4, weight_decay=0.01, total_steps=100)
    tx = optimizer(opt)
    state = init_state(jaxbert.init_params(config, jax.random.key(0), "BertForMaskedLM"), tx)
    ids, labels = _mlm_batch()
    k = default_max_predictions(TRAIN_LEN, 0.15)
    positions = np.argsort(labels == -100, axis=1, kind="stable")[:, :k]
    batch = {
        "input_ids": ids[None],
        "attention_mask": np.ones_like(ids)[None],
        "positions": positions[None],
        "labels": np.take_along_axis(labels, positions, 1)[None],
    }
    fn = jaxbert.cpu.onednn_jit(  # as the training loop compiles its step (oneDNN's float32 matmuls on AMX CPUs)
        lambda s, b, r: train_step(
            s, b, r, config=config, tx=tx, schedule=schedule(opt), dtype=jnp.dtype(dtype), remat=remat
        ),
        tokens=micro_batch_tokens,
        donate_argnums=0,
    )
    compiled = fn.pick(state, batch, None).lower(state, batch, jax.random.key(1)).compile()
    temp_mb = compiled.memory_analysis().temp_size_in_bytes / 2**20
    if measure_only:
        return {"compiled_temp_mb": temp_mb}
    state, m = fn(state, batch, jax.random.key(1))
    jax.block_until_ready(m)
    start = time.perf_counter()
    for i in range(TRAIN_STEPS):
        state, m = fn(state, batch, jax.random.key(i))
    jax.block_until_ready(m)
    seconds = (time.perf_counter() - start) / TRAIN_STEPS
    return {"seconds_per_step": seconds, "sequences_per_s": TRAIN_BATCH / seconds, "compiled_temp_mb": temp_mb}


def child_train_jax_f32() -> dict:
    return _jax_train("float32", False)


def child_train_jax_bf16() -> dict:
    return _jax_train("bfloat16", False)


def child_train_jax_remat_memory() -> dict:
    return _jax_train("float32", True, measure_only=True)


def child_train_torch(dtype: str = "float32") -> dict:
    """PyTorch eager; bfloat16 as its users run mixed precision on a CPU: torch.autocast (bfloat16 matmuls on
    the CPU's matrix units through oneDNN, float32 master weights)."""
    import contextlib

    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.BertForMaskedLM(transformers.BertConfig()).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    ids, labels = (torch.from_numpy(a).long() for a in _mlm_batch())

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", torch.bfloat16) if dtype == "bfloat16" else contextlib.nullcontext():
            loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    step()
    start = time.perf_counter()
    for _ in range(TRAIN_STEPS):
        step()
    seconds = (time.perf_counter() - start) / TRAIN_STEPS
    return {"seconds_per_step": seconds, "sequences_per_s": TRAIN_BATCH / seconds}


def make_checkpoint(directory: str, head: str = "BertModel", **config) -> int:
    """A random bert-base-size checkpoint with `head` (config overrides as keywords), saved as safetensors like
    any transformers checkpoint; returns the weights' size in bytes."""
    import jax
    from safetensors.numpy import save_file

    import jaxbert

    config = jaxbert.BertConfig(architectures=(head,), **config)
    params = jaxbert.init_params(config, jax.random.key(0), head)
    state = jaxbert.flax_to_torch(jax.device_get(params), config, head)
    os.makedirs(directory, exist_ok=True)
    save_file(state, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(directory, "config.json"), "w") as f:
        f.write(config.to_json_string())
    return os.path.getsize(os.path.join(directory, "model.safetensors"))
