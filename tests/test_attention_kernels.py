"""Inference attention as XLA:CPU runs it fastest: long rows in blocks of queries, the mask as an added bias,
16-bit products that reach the compiled program as 16-bit kernels (bfloat16 models, and int8 models on a CPU with
bfloat16 units). Each must give what the plain computation gives."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbert
from jaxbert import attention, cpu, quantize
from jaxbert.attention import _normalized_late, query_block

F32 = jnp.float32


def test_query_block_sizes():
    # Under 512 keys, and float32 whose whole batch of scores is small, take all queries at once.
    assert query_block(8, 12, 256, 256, jnp.bfloat16) is None
    assert query_block(1, 12, 512, 512, F32) is None
    # 512 keys: blocks whose batch of scores stays within BLOCK_BYTES, at most 128 queries, dividing L.
    assert query_block(1, 12, 512, 512, jnp.bfloat16) == 128
    assert query_block(8, 12, 512, 512, jnp.bfloat16) == 64
    assert query_block(8, 12, 512, 512, F32) == 64
    assert query_block(8, 12, 100, 512, jnp.bfloat16) is None  # 64 does not divide 100
    for rows in (1, 2, 4, 8, 16, 64):
        size = query_block(rows, 12, 512, 512, jnp.bfloat16)
        assert size is None or rows * 12 * size * 512 * 4 <= attention.BLOCK_BYTES or size == 16


@pytest.mark.parametrize("relative", [False, True])
def test_blocked_attention_equals_all_queries_at_once(relative):
    # Rows of 512 with two packed segments, padding (its queries see no key), and one fully masked query: such
    # queries average every value, as the reference's finfo.min mask makes them; blocks only change the order of work.
    rng = np.random.default_rng(0)
    H, L, K = 2, 512, 8
    q, k, v = (jnp.asarray(rng.normal(size=s), F32) for s in ((L, H, K), (H, L, K), (H, L, K)))
    seg = np.repeat([1, 2, 0], [200, 250, 62])
    allowed = (seg[:, None] == seg[None, :]) & (seg[None, :] > 0)
    allowed[300] = False
    rel = jnp.asarray(rng.normal(size=(H, L, L)), F32) if relative else None
    whole = np.asarray(_normalized_late(q, k, v, jnp.asarray(allowed), 0.35, rel, rows=1))
    assert query_block(10_000, H, L, L, F32) == 16
    blocked = np.asarray(_normalized_late(q, k, v, jnp.asarray(allowed), 0.35, rel, rows=10_000))
    np.testing.assert_allclose(blocked, whole, rtol=1e-6, atol=1e-6)
    # and both are softmax attention with a select mask, written out
    scores = np.einsum("lhk,hmk->hlm", np.asarray(q), np.asarray(k)) * 0.35
    if relative:
        scores = scores + np.asarray(rel) * 0.35
    scores = np.where(allowed[None], scores, -np.inf)
    scores[:, ~allowed.any(-1)] = 0.0  # query 300 and the padding's queries
    p = np.exp(scores - scores.max(-1, keepdims=True))
    want = np.einsum("hlm,hmk->lhk", p / p.sum(-1, keepdims=True), np.asarray(v))
    np.testing.assert_allclose(whole, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["absolute", "relative_key_query"])
def test_long_rows_in_blocks_give_each_sequence_its_own_outputs(kind):
    # A batch of 6 rows of 512 runs attention in blocks (float32, 4 heads: 25 MB of scores), each row alone does
    # not: the outputs must agree, padding and relative positions included.
    config = jaxbert.BertConfig(
        vocab_size=50,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=40,
        max_position_embeddings=512,
        position_embedding_type=kind,
    )
    assert query_block(6, 4, 512, 512, F32) == 128 and query_block(1, 4, 512, 512, F32) is None
    params = jaxbert.init_params(config, jax.random.key(0))
    rng = np.random.default_rng(1)
    ids = rng.integers(1, 50, (6, 512))
    mask = np.ones((6, 512), np.int32)
    mask[2, 300:] = 0
    mask[5, 11:] = 0
    run = jax.jit(lambda ids, mask: jaxbert.bert(params, config, ids, mask).last_hidden_state)
    batch = np.asarray(run(ids, mask))
    for r in range(6):
        alone = np.asarray(run(ids[r : r + 1], mask[r : r + 1]))[0]
        real = mask[r] == 1
        np.testing.assert_allclose(batch[r][real], alone[real], rtol=1e-5, atol=1e-5)


def _dot_operand_types(hlo: str) -> list[tuple[str, ...]]:
    """The element types of every dot's operands in a compiled HLO module."""
    out = []
    for body in re.findall(r"^(?:ENTRY )?%\S+ \([^)]*\) -> [^{]*\{\n(.*?)\n\}", hlo, re.M | re.S):
        types = dict(re.findall(r"%([\w.\-]+) = (\w+)\[", body))
        for operands in re.findall(r" dot\(%([\w.\-]+), %([\w.\-]+)\)", body):
            out.append(tuple(types[name] for name in operands))
    return out


def _compiled(bert, ids):
    return bert._forward.lower(bert.weights, *bert._put(ids, None, None, None), None, None, None).compile().as_text()


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU's kernel choice")
@pytest.mark.parametrize("dtype", ["bfloat16", "int8"])
def test_attention_products_compile_to_16_bit_kernels(dtype):
    # XLA's layout assignment turned the heads-first transpose into a strided view and XLA:CPU then ran
    # attention's bfloat16 products in float32: every product must reach the program with 16-bit (or int8)
    # operands, for rows of 128 and for long rows in blocks.
    if dtype == "int8" and not cpu.has_bf16_units():
        pytest.skip("int8 models keep float32 attention on a CPU without bfloat16 units")
    config = jaxbert.BertConfig(
        vocab_size=50, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=80
    )
    bert = jaxbert.Bert(config, jaxbert.init_params(config, jax.random.key(0)), dtype=dtype)
    for shape in ((3, 128), (8, 512)):
        ids = np.random.default_rng(0).integers(1, 50, shape)
        types = _dot_operand_types(_compiled(bert, ids))
        assert types.count(("bf16", "bf16")) >= 2, types  # attention's two (one scan body for all layers)
        assert len(types) >= 2 + 4, types  # and the layer's four matmuls
        allowed = {("bf16", "bf16")} | ({("s8", "s8")} if dtype == "int8" else set())
        # the pooler outside the layers stays float32 in an int8 model
        others = [t for t in types if t not in allowed]
        assert others == ([("f32", "f32")] if dtype == "int8" else []), (shape, types)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="a CPU's instructions")
def test_int8_attention_dtype_follows_the_cpu(monkeypatch):
    # Resolved when the model is loaded: bfloat16 products only where the CPU has bfloat16 units, else float32
    # (on an AVX2-only CPU bfloat16 runs below float32's rate), and a float32 model never changes.
    config = jaxbert.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=4)
    params = jaxbert.init_params(config, jax.random.key(0))
    ids = np.random.default_rng(0).integers(1, 50, (2, 16))
    for units, want in ((True, "bf16"), (False, "f32")):
        monkeypatch.setattr(cpu, "has_bf16_units", lambda units=units: units)
        assert quantize.attention_dtype() == ("bfloat16" if units else None)
        types = _dot_operand_types(_compiled(jaxbert.Bert(config, params, dtype="int8"), ids))
        assert sorted(set(types)) == sorted({("s8", "s8"), (want, want), ("f32", "f32")}), (units, types)
    f32 = jaxbert.Bert(config, params)
    assert f32._attention is None and set(_dot_operand_types(_compiled(f32, ids))) == {("f32", "f32")}
