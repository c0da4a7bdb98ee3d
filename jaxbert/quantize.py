"""int8 inference (`jaxbert.load(dir, dtype="int8")`): the encoder layers' matmul weights quantized per output
channel, activations quantized per row as they arrive (ops.quantize_rows), products summed in int32.

XLA:CPU multiplies int8 at 2-3x its bfloat16 rate on this project's Intel Xeon (bert-base layer shapes, 1,024
rows: 2,000-3,300 vs 1,000-1,500 GOPS), so the layers' four matmuls, most of BERT's work, get cheaper; the rest stays
float32: embeddings, LayerNorm, softmax, GELU, the pooler and every head. Attention's two products stay out of int8
(quantizing them added as many passes over the scores as it saved) and run in bfloat16 where the CPU has bfloat16
units (attention_dtype). Symmetric scales, per output channel
for a weight (max |column| / 127) and per token for an activation (ops.quantize_rows), keep it accurate without
calibration data: see tests/test_int8.py for the bounds on real checkpoints.

A quantized dense is {"weight": int8 [..., out, in], "weight_scale": float32 [..., out], "bias"}; [out, in] is
the layout XLA:CPU's int8 matmul reads fastest (ops.dense).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxbert import cpu
from jaxbert.layout import map_encoder


def attention_dtype() -> str | None:
    """The dtype of an int8 model's attention products: bfloat16 (float32 sums, float32 softmax) on a CPU with
    bfloat16 units, as OpenVINO runs attention there (bert-base 8 x 128: 24 -> 12 ms of the call); None (the
    layers' float32) elsewhere. Resolved once, when the model is loaded, and passed to `model.bert`."""
    return "bfloat16" if jax.default_backend() == "cpu" and cpu.has_bf16_units() else None


@jax.jit
def _quantize(kernel):
    w = jnp.swapaxes(kernel.astype(jnp.float32), -1, -2)  # [..., out, in]
    amax = jnp.max(jnp.abs(w), axis=-1)
    scale = jnp.where(amax > 0, amax / 127.0, 1.0)
    return jnp.round(w / scale[..., None]).astype(jnp.int8), scale


@jax.jit
def _dequantize(weight, scale):
    return jnp.swapaxes(weight.astype(jnp.float32) * scale[..., None], -1, -2)


def _map_dense(tree, fn):
    """`tree` with fn applied to every dense ({"kernel" | "weight", ...} dict); other leaves kept."""
    if not isinstance(tree, dict):
        return tree
    if "kernel" in tree or "weight_scale" in tree:
        return fn(tree)
    return {k: _map_dense(v, fn) for k, v in tree.items()}


def quantize(params):
    """The compute tree with its encoder layers' dense kernels as int8 weights and scales (see the module
    docstring); everything outside the layers (embeddings, pooler, heads) as it was."""

    def one(p):
        weight, scale = _quantize(p["kernel"])
        return {**{k: v for k, v in p.items() if k != "kernel"}, "weight": weight, "weight_scale": scale}

    return map_encoder(params, lambda enc: _map_dense(enc, one))


def dequantize(params):
    """The float32 tree a quantized one stands for (each weight times its scale, back to a kernel [in, out])."""

    def one(p):
        if "weight_scale" not in p:
            return p
        rest = {k: v for k, v in p.items() if k not in ("weight", "weight_scale")}
        return {**rest, "kernel": _dequantize(p["weight"], p["weight_scale"])}

    return map_encoder(params, lambda enc: _map_dense(enc, one))
