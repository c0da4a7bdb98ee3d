"""The training numerics of ops.py: dropout's hashed masks (rate, independence, determinism) and 16-bit matmuls
whose gradient products stay 16-bit, under every composition of grad and vmap the model uses."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxbert import ops

RATE = 0.1


def _mask(key, shape=(256, 1024), rate=RATE):
    return np.asarray(ops.dropout(jnp.ones(shape), rate, key)) != 0


def test_dropout_keeps_one_minus_rate_and_is_unbiased():
    x = jnp.asarray(np.random.default_rng(0).normal(size=(512, 1024)), jnp.float32)
    y = np.asarray(ops.dropout(x, RATE, jax.random.key(0)))
    kept = y != 0
    n = kept.size
    assert abs(kept.mean() - (1 - RATE)) < 5 * np.sqrt(RATE * (1 - RATE) / n)
    np.testing.assert_allclose(y[kept], np.asarray(x)[kept] / (1 - RATE), rtol=1e-6)
    # E[dropout(x)] = x: the kept values' scale makes the sum unbiased (within the sampling noise).
    ones = np.asarray(ops.dropout(jnp.ones((512, 1024)), RATE, jax.random.key(1)))
    assert abs(ones.mean() - 1.0) < 5 * np.sqrt(RATE / (1 - RATE) / n)


def test_dropout_masks_are_independent_across_keys_positions_and_shapes():
    a, b = _mask(jax.random.key(0)), _mask(jax.random.key(1))
    assert not np.array_equal(a, b)
    np.testing.assert_array_equal(a, _mask(jax.random.key(0)))  # deterministic in the key
    n = a.size
    expected = (1 - RATE) ** 2 + RATE**2  # two independent masks agree this often
    for x, y in [(a, b), (a[:, 1:], a[:, :-1]), (a[1:], a[:-1])]:  # other key, neighbours in a row / column
        agree = (x == y).mean()
        assert abs(agree - expected) < 6 * np.sqrt(expected * (1 - expected) / n), agree
    # Keys split the usual way (per layer, per sequence) give unrelated masks too.
    keys = jax.random.split(jax.random.key(3), 8)
    masks = np.stack([_mask(k, (64, 128)) for k in keys]).reshape(8, -1)
    agree = (masks[:, None] == masks[None]).mean(-1)[~np.eye(8, dtype=bool)]
    assert np.all(np.abs(agree - expected) < 6 * np.sqrt(expected * (1 - expected) / masks.shape[1]))


def test_dropout_bits_are_uniform():
    bits = np.asarray(ops.hashed_bits(jax.random.key(5), (1 << 20,)))
    counts = np.bincount(bits >> 24, minlength=256)  # top byte
    chi2 = ((counts - counts.mean()) ** 2 / counts.mean()).sum()
    assert chi2 < 255 + 6 * np.sqrt(2 * 255), chi2  # chi-square with 255 degrees of freedom
    low = np.bincount(bits & 0xFF, minlength=256)  # bottom byte (a weak hash shows here first)
    assert ((low - low.mean()) ** 2 / low.mean()).sum() < 255 + 6 * np.sqrt(2 * 255)


def test_dropout_edge_rates_and_vmap():
    x = jnp.ones((4, 16))
    assert np.array_equal(np.asarray(ops.dropout(x, 0.0, jax.random.key(0))), np.ones((4, 16)))
    assert not np.asarray(ops.dropout(x, 1.0, jax.random.key(0))).any()
    assert np.array_equal(np.asarray(ops.dropout(x, RATE, None)), np.ones((4, 16)))
    keys = jax.random.split(jax.random.key(0), 4)
    rows = jax.vmap(lambda k, r: ops.dropout(r, 0.5, k))(keys, jnp.ones((4, 4096)))
    np.testing.assert_array_equal(rows[2], ops.dropout(jnp.ones(4096), 0.5, keys[2]))
    assert len({np.asarray(r != 0).tobytes() for r in rows}) == 4


# -- 16-bit matmuls -----------------------------------------------------------------------------------------------
def _inputs(axis, seed=0, batch=(3, 5)):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.normal(size=(*batch, 24)), jnp.float32)
    w = rng.normal(size=(24, 16) if axis == 0 else (16, 24))
    return x, jnp.asarray(w, jnp.bfloat16), jnp.asarray(rng.normal(size=(*batch, 16)), jnp.float32)


def _reference_grads(x, w, g, axis):
    """float32 products of the bfloat16-rounded operands, rounded as the 16-bit path rounds its outputs."""
    xb = np.asarray(x.astype(jnp.bfloat16), np.float32).reshape(-1, x.shape[-1])
    gb = np.asarray(g.astype(jnp.bfloat16), np.float32).reshape(-1, g.shape[-1])
    w32 = np.asarray(w, np.float32)
    w_io = w32 if axis == 0 else w32.T
    return (gb @ w_io.T).reshape(x.shape), (xb.T @ gb if axis == 0 else gb.T @ xb)


def _dots(jaxpr) -> list:
    """The dot_general equations of a jaxpr and of the jaxprs its equations carry (custom VJP / vmap calls)."""
    out = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            out.append(eqn)
        for p in eqn.params.values():
            inner = getattr(p, "jaxpr", None)
            if inner is not None:
                out += _dots(getattr(inner, "jaxpr", inner))
    return out


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("under_vmap", [False, True])
def test_bf16_matmul_gradients_are_bf16_products(axis, under_vmap):
    x, w, g = _inputs(axis)

    def loss(x, w):
        y = jax.vmap(lambda r: ops.matmul(r, w, axis))(x) if under_vmap else ops.matmul(x, w, axis)
        return jnp.sum(y * g)

    dx, dw = jax.grad(loss, argnums=(0, 1))(x, w)
    assert dx.dtype == jnp.float32 and dw.dtype == jnp.bfloat16
    ref_dx, ref_dw = _reference_grads(x, w, g, axis)
    np.testing.assert_allclose(np.asarray(dx), ref_dx, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(dw, np.float32), ref_dw, rtol=1e-2, atol=1e-2)  # dw rounded to bf16
    # Every product of the gradient multiplies 16-bit operands (JAX's own transpose would promote w to float32),
    # and none is a per-sequence weight gradient [B, ...] summed afterwards.
    jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(x, w).jaxpr
    dots = _dots(jaxpr)
    assert len(dots) == 3
    assert all(v.aval.dtype == jnp.bfloat16 for eqn in dots for v in eqn.invars)
    shapes = [eqn.outvars[0].aval.shape for eqn in dots]
    assert w.shape in shapes and (x.shape[0], *w.shape) not in shapes, shapes


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU's kernel choice")
def test_bf16_gradient_products_compile_to_16_bit_kernels():
    """XLA:CPU converts a 16-bit product to float32 unless its left operand contracts its last axis row-major:
    both products of the backward pass must reach the compiled program with bfloat16 operands."""
    x, w = jnp.ones((4, 32, 48)), jnp.ones((48, 40), jnp.bfloat16)
    g = jnp.ones((4, 32, 40))
    grad = jax.grad(lambda x, w: jnp.sum(jax.vmap(lambda r: ops.matmul(r, w))(x) * g), argnums=(0, 1))
    text = jax.jit(grad).lower(x, w).compile().as_text()
    with_dots = [
        m.group(1)
        for m in re.finditer(r"^(?:ENTRY )?%\S+ \(([^)]*)\) -> [^{]*\{\n(.*?)\n\}", text, re.M | re.S)
        if " dot(" in m.group(2)
    ]
    assert len(with_dots) == 2, text
    assert all(re.findall(r": (\w+)\[", params) == ["bf16", "bf16"] for params in with_dots), with_dots


def test_bf16_matmul_per_example_gradients_under_an_outer_vmap():
    """vmap(grad(...)) must give each example its own weight gradient, however the inner vmap batched them."""
    x, w, g = _inputs(0, batch=(4, 3, 5))

    def loss(w, x, g):
        return jnp.sum(jax.vmap(lambda r: ops.matmul(r, w))(x) * g)

    per_example = jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))(w, x, g)
    for i in range(4):
        np.testing.assert_array_equal(np.asarray(per_example[i]), np.asarray(jax.grad(loss)(w, x[i], g[i])))
    assert not np.array_equal(np.asarray(per_example[0]), np.asarray(per_example[1]))


def test_float32_matmul_is_the_plain_product():
    x, w, g = _inputs(0)
    w = w.astype(jnp.float32)
    jaxpr = jax.make_jaxpr(jax.grad(lambda w: jnp.sum(ops.matmul(x, w) * g)))(w)
    assert "custom" not in str(jaxpr)
    np.testing.assert_allclose(np.asarray(ops.matmul(x, w)), np.asarray(x) @ np.asarray(w), rtol=1e-5, atol=1e-5)


@functools.cache
def _mlm_grads(dropout: float, dtype, remat: bool) -> list:
    """The MLM loss's gradients (path, leaf) for a tiny random model of `dropout` with its weights cast to `dtype`
    (cached: the float32 reference serves both remat cases). Two layers, not conftest's three: without remat the
    layers are unrolled, and compiling the backward pass of each (about 4 s on a shared 2-core machine) was most
    of the test's time; two still give the scan under remat a stacked axis to index."""
    from conftest import SIZES

    import jaxbert

    sizes = {k: v for k, v in SIZES.items() if k != "num_labels"}
    sizes["num_hidden_layers"] = 2  # still distinct from every other size
    config = jaxbert.BertConfig(**sizes, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    params = jaxbert.init_params(config, jax.random.key(0), "BertForMaskedLM")
    ids = jnp.asarray(np.random.default_rng(0).integers(1, SIZES["vocab_size"], (3, 16)), jnp.int32)

    def loss(p):
        p = jax.tree_util.tree_map(lambda a: a.astype(dtype), p)
        mask = jnp.ones_like(ids)
        return jaxbert.forward(p, config, "mlm", ids, mask, labels=ids, remat=remat, rng=jax.random.key(1)).loss

    return jax.tree_util.tree_flatten_with_path(jax.jit(jax.grad(loss))(params))[0]


@pytest.mark.parametrize("remat", [False, True])
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_bf16_gradients_reach_every_parameter(remat, dropout):
    """16-bit weights are indexed as their bits (embedding rows, the scanned layers under remat); the gradient
    must still reach them: bfloat16 gradients agree with float32's for every parameter, embeddings included.
    With dropout (the same hashed masks in both dtypes) attention runs through ops' 16-bit products."""
    reference, ours = _mlm_grads(dropout, jnp.float32, False), _mlm_grads(dropout, jnp.bfloat16, remat)
    assert len(reference) == len(ours)
    for (path, ref), (_, got) in zip(reference, ours):
        if "key" in jax.tree_util.keystr(path) and "bias" in jax.tree_util.keystr(path):
            continue  # exactly zero: softmax ignores a shift shared by all keys (bfloat16 leaves rounding noise)
        ref, got = np.asarray(ref, np.float32), np.asarray(got, np.float32)
        err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
        assert err < 0.05, (jax.tree_util.keystr(path), err)


# -- 16-bit attention products ------------------------------------------------------------------------------------
def _attention(q, k, v, g, in_axes):
    """sum(g * context) of softmax attention per sequence under vmap, through ops' two products."""

    def one(q, k, v):
        probs = jax.nn.softmax(ops.scores_product(q, k), axis=-1)
        return ops.context_product(probs.astype(jnp.bfloat16).astype(v.dtype), v)  # rounded in both runs

    return jnp.sum(jax.vmap(one, in_axes=in_axes)(q, k, v) * g)


def _attention_inputs(kv_batched: bool, B=3, L=5, M=7, H=2, K=4):
    rng = np.random.default_rng(1)
    kv = (B, H, M, K) if kv_batched else (H, M, K)
    q, k, v = (jnp.asarray(rng.normal(size=s), jnp.bfloat16) for s in ((B, L, H, K), kv, kv))
    return q, k, v, jnp.asarray(rng.normal(size=(B, L, H, K)), jnp.float32)


@pytest.mark.parametrize("kv_batched", [True, False])
def test_bf16_attention_gradients_are_bf16_products(kv_batched):
    """The gradients of attention's products equal float32 autodiff of the same bfloat16 values to bfloat16's
    rounding (L != M != K, so a swapped axis fails), and every product of the backward pass is 16-bit."""
    q, k, v, g = _attention_inputs(kv_batched)
    in_axes = (0, 0, 0) if kv_batched else (0, None, None)
    grad = jax.grad(lambda q, k, v: _attention(q, k, v, g, in_axes), argnums=(0, 1, 2))
    got = grad(q, k, v)
    up = [a.astype(jnp.float32) for a in (q, k, v)]
    ref = jax.grad(lambda q, k, v: _attention(q, k, v, g, in_axes), argnums=(0, 1, 2))(*up)
    for a, r, x in zip(got, ref, (q, k, v)):
        assert a.dtype == jnp.bfloat16 and a.shape == x.shape
        a, r = np.asarray(a, np.float32), np.asarray(r)
        assert np.linalg.norm(a - r) / np.linalg.norm(r) < 0.02
    np.testing.assert_allclose(
        float(_attention(q, k, v, g, in_axes)), float(_attention(*up, g, in_axes)), rtol=1e-5, atol=1e-5
    )
    dots = _dots(jax.make_jaxpr(grad)(q, k, v).jaxpr)
    assert len(dots) >= 6
    assert all(var.aval.dtype == jnp.bfloat16 for eqn in dots for var in eqn.invars), dots


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU's kernel choice")
def test_bf16_attention_products_compile_to_16_bit_kernels():
    """Every product of attention's forward and backward pass reaches the compiled program with bfloat16
    operands (JAX's own transpose multiplies a float32 cotangent, which XLA:CPU runs in float32)."""
    q, k, v, g = _attention_inputs(True, B=2, L=32, M=32, H=2, K=16)
    grad = jax.value_and_grad(lambda q, k, v: _attention(q, k, v, g, (0, 0, 0)), argnums=(0, 1, 2))
    text = jax.jit(grad).lower(q, k, v).compile().as_text()
    with_dots = [
        m.group(1)
        for m in re.finditer(r"^(?:ENTRY )?%\S+ \(([^)]*)\) -> [^{]*\{\n(.*?)\n\}", text, re.M | re.S)
        if " dot(" in m.group(2)
    ]
    assert len(with_dots) == 6, text  # two forward products, four backward
    assert all(re.findall(r": (\w+)\[", params) == ["bf16", "bf16"] for params in with_dots), with_dots
