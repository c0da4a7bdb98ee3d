"""Behaviour of the pure functions: jit, vmap, padding, dropout, gradients, remat, inputs_embeds."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import SIZES, assert_close, padded_batch

import jaxbert
from jaxbert import model as M

CONFIG = jaxbert.BertConfig(**{k: v for k, v in SIZES.items() if k != "num_labels"})


@pytest.fixture(scope="module")
def mlm_params():
    return jaxbert.init_params(CONFIG, jax.random.key(0), "BertForMaskedLM")


def _feed(seed=0):
    return {k: jnp.asarray(v) for k, v in padded_batch(seed).items()}


def test_jit_equals_eager(mlm_params):
    feed = _feed()
    eager = jaxbert.forward(mlm_params, CONFIG, "mlm", **feed, output_hidden_states=True)
    jitted = jax.jit(jaxbert.forward, static_argnums=(1, 2), static_argnames="output_hidden_states")(
        mlm_params, CONFIG, "mlm", **feed, output_hidden_states=True
    )
    assert_close(jitted.logits, eager.logits, "logits")
    for a, b in zip(jitted.hidden_states, eager.hidden_states, strict=True):
        assert_close(a, b, "hidden")


def test_vmap_of_the_per_sequence_function_equals_the_batched_call(mlm_params):
    feed = _feed(1)
    base = mlm_params["bert"]
    batched = M.bert(base, CONFIG, **feed)
    L = feed["input_ids"].shape[1]
    one = functools.partial(M._bert_one, base, CONFIG, inputs_embeds=None, head_mask=None, rng=None, remat=False)
    x, pooled, *_ = jax.vmap(lambda i, m, t: one(i, m.astype(bool), t, jnp.arange(L)))(
        feed["input_ids"], feed["attention_mask"], feed["token_type_ids"]
    )
    assert_close(x, batched.last_hidden_state, "last_hidden_state")
    for b in range(3):  # and each sequence on its own
        xb, *_ = one(
            feed["input_ids"][b], feed["attention_mask"][b].astype(bool), feed["token_type_ids"][b], jnp.arange(L)
        )
        assert_close(xb, batched.last_hidden_state[b], f"sequence {b}")


def test_padding_does_not_change_real_tokens(mlm_params):
    feed = _feed(2)
    out = jaxbert.forward(mlm_params, CONFIG, "mlm", **feed).logits
    n = int(feed["attention_mask"][2].sum())
    alone = jaxbert.forward(
        mlm_params, CONFIG, "mlm", feed["input_ids"][2:, :n], token_type_ids=feed["token_type_ids"][2:, :n]
    ).logits
    assert_close(out[2, :n], alone[0], "padded vs alone")
    noisy = feed["input_ids"].at[2, n:].set(7)  # whatever sits in padded positions is ignored
    assert_close(
        jaxbert.forward(mlm_params, CONFIG, "mlm", noisy, feed["attention_mask"], feed["token_type_ids"]).logits[2, :n],
        out[2, :n],
        "padding content",
    )


def test_dropout_is_identity_without_rng_and_active_with_one(mlm_params):
    feed = _feed(3)
    a = jaxbert.forward(mlm_params, CONFIG, "mlm", **feed).logits
    b = jaxbert.forward(mlm_params, CONFIG, "mlm", **feed).logits
    assert np.array_equal(np.asarray(a), np.asarray(b))
    r1 = jaxbert.forward(mlm_params, CONFIG, "mlm", **feed, rng=jax.random.key(1)).logits
    r1_again = jaxbert.forward(mlm_params, CONFIG, "mlm", **feed, rng=jax.random.key(1)).logits
    r2 = jaxbert.forward(mlm_params, CONFIG, "mlm", **feed, rng=jax.random.key(2)).logits
    assert np.abs(np.asarray(r1) - np.asarray(a)).max() > 1e-3
    assert np.abs(np.asarray(r1) - np.asarray(r2)).max() > 1e-3
    assert np.array_equal(np.asarray(r1), np.asarray(r1_again))


def _loss(params, feed, labels, remat=False, rng=None):
    return jaxbert.forward(params, CONFIG, "mlm", **feed, labels=labels, rng=rng, remat=remat).loss


def test_gradients_flow_through_every_parameter(mlm_params):
    feed = _feed(4)
    labels = jnp.where(feed["attention_mask"] == 1, feed["input_ids"], -100)
    grads = jax.grad(_loss)(mlm_params, feed, labels, rng=jax.random.key(0))
    flat = jax.tree_util.tree_flatten_with_path(grads)[0]
    assert len(flat) == len(jax.tree_util.tree_leaves(mlm_params))
    for path, g in flat:
        name = jax.tree_util.keystr(path)
        assert np.isfinite(np.asarray(g)).all(), name
        assert np.abs(np.asarray(g)).max() > 0, f"zero gradient for {name}"


def test_remat_gives_the_same_loss_and_gradients(mlm_params):
    feed = _feed(5)
    labels = jnp.where(feed["attention_mask"] == 1, feed["input_ids"], -100)
    plain = jax.value_and_grad(_loss)(mlm_params, feed, labels, False, jax.random.key(3))
    remat = jax.value_and_grad(_loss)(mlm_params, feed, labels, True, jax.random.key(3))
    assert_close(remat[0], plain[0], "loss")
    for a, b in zip(jax.tree_util.tree_leaves(remat[1]), jax.tree_util.tree_leaves(plain[1]), strict=True):
        assert_close(a, b, "grad", atol=1e-6)
    jaxpr = str(jax.make_jaxpr(jax.grad(_loss), static_argnums=3)(mlm_params, feed, labels, True))
    assert "remat" in jaxpr or "checkpoint" in jaxpr


def test_inputs_embeds_and_explicit_position_ids(mlm_params):
    feed = _feed(6)
    base = mlm_params["bert"]
    embeds = base["embeddings"]["word_embeddings"]["embedding"][feed["input_ids"]]
    by_ids = M.bert(base, CONFIG, **feed).last_hidden_state
    by_embeds = M.bert(
        base, CONFIG, None, feed["attention_mask"], feed["token_type_ids"], inputs_embeds=embeds
    ).last_hidden_state
    assert_close(by_embeds, by_ids, "inputs_embeds")
    L = feed["input_ids"].shape[1]
    default = jnp.broadcast_to(jnp.arange(L), (3, L))
    assert_close(M.bert(base, CONFIG, **feed, position_ids=default).last_hidden_state, by_ids, "positions")
    shifted = M.bert(base, CONFIG, **feed, position_ids=default + 3).last_hidden_state
    assert np.abs(np.asarray(shifted) - np.asarray(by_ids)).max() > 1e-3
    with pytest.raises(ValueError, match="exactly one of input_ids and inputs_embeds"):
        M.bert(base, CONFIG, feed["input_ids"], inputs_embeds=embeds)


def test_head_mask_shapes():
    params = jaxbert.init_params(CONFIG, jax.random.key(1))
    feed = _feed(7)
    ones = M.bert(params, CONFIG, **feed, head_mask=jnp.ones(4)).last_hidden_state
    assert_close(ones, M.bert(params, CONFIG, **feed).last_hidden_state, "all-ones head mask")
    with pytest.raises(ValueError, match=r"head_mask shape \(2, 4\)"):
        M.bert(params, CONFIG, **feed, head_mask=jnp.ones((2, 4)))
    with pytest.raises(ValueError, match=r"head_mask shape \(3,\): expected \(4,\) or"):  # not JAX's broadcast error
        M.bert(params, CONFIG, **feed, head_mask=jnp.ones(3))


def test_output_attentions_are_probabilities_over_real_keys():
    params = jaxbert.init_params(CONFIG, jax.random.key(2))
    feed = _feed(8)
    attn = M.bert(params, CONFIG, **feed, output_attentions=True).attentions
    assert len(attn) == CONFIG.num_hidden_layers and attn[0].shape == (3, 4, 11, 11)
    assert_close(attn[0].sum(-1), np.ones((3, 4, 11)), "rows sum to one")
    pad = ~np.asarray(feed["attention_mask"], bool)
    assert pad.any() and float(np.abs(np.asarray(attn[1]) * pad[:, None, None, :]).max()) == 0


def test_remat_lowers_compiled_memory():
    """XLA's own accounting of the backward pass's temporaries (not a timing): remat must cut them."""
    config = CONFIG.replace(num_hidden_layers=6)
    params = jaxbert.init_params(config, jax.random.key(0), "mlm")
    ids = jnp.ones((8, 40), jnp.int32)

    def temp(remat):
        def loss(p):
            return jaxbert.forward(p, config, "mlm", ids, labels=ids, rng=jax.random.key(0), remat=remat).loss

        return jax.jit(jax.grad(loss)).lower(params).compile().memory_analysis().temp_size_in_bytes

    assert temp(True) < 0.6 * temp(False)


def test_a_sequence_longer_than_the_position_table_is_refused(mlm_params):
    """transformers' position embedding raises IndexError for positions past its table; JAX's gather would give
    them the table's last row. Positions given explicitly (packed rows restart them) may be longer."""
    base, n = mlm_params["bert"], CONFIG.max_position_embeddings
    ids = jnp.ones((2, n + 1), jnp.int32)
    with pytest.raises(ValueError, match=f"sequence length {n + 1} exceeds max_position_embeddings {n}"):
        M.bert(base, CONFIG, ids)
    with pytest.raises(ValueError, match="exceeds max_position_embeddings"):
        jaxbert.forward(mlm_params, CONFIG, "mlm", ids)
    restarted = jnp.broadcast_to(jnp.arange(n + 1) % 8, ids.shape)
    assert M.bert(base, CONFIG, ids, position_ids=restarted).last_hidden_state.shape == (2, n + 1, 32)
    assert M.bert(base, CONFIG, ids[:, :n]).last_hidden_state.shape == (2, n, 32)


def test_per_token_arguments_of_another_shape_are_named_and_a_batch_of_one_is_broadcast(mlm_params):
    """A mask wider than input_ids (no cache) had its last L columns used silently; transformers refuses it. [L] and
    [1, L] position / type ids (and masks) apply to every row, as transformers broadcasts them."""
    base, feed = mlm_params["bert"], _feed(9)
    ids, mask, types = feed["input_ids"], feed["attention_mask"], feed["token_type_ids"]
    wider = jnp.concatenate([jnp.zeros((3, 1), mask.dtype), mask], 1)
    for name, bad in (("attention_mask", wider), ("attention_mask", mask[:, 1:]), ("token_type_ids", types[:2])):
        with pytest.raises(ValueError, match=rf"{name} shape \({bad.shape[0]}, {bad.shape[1]}\): expected"):
            M.bert(base, CONFIG, ids, **{"attention_mask": mask, "token_type_ids": types, name: bad})
    with pytest.raises(ValueError, match=r"input_ids shape \(11,\): expected \[batch, length\]"):
        M.bert(base, CONFIG, ids[0])
    L = ids.shape[1]
    full = M.bert(base, CONFIG, ids, mask, types, position_ids=jnp.broadcast_to(jnp.arange(L) + 2, (3, L)))
    for positions in (jnp.arange(L) + 2, (jnp.arange(L) + 2)[None]):
        got = M.bert(base, CONFIG, ids, mask, types, position_ids=positions)
        assert_close(got.last_hidden_state, full.last_hidden_state, "broadcast positions")
    one_type = M.bert(base, CONFIG, ids, mask, types[:1]).last_hidden_state
    assert_close(one_type, M.bert(base, CONFIG, ids, mask, jnp.broadcast_to(types[:1], ids.shape)).last_hidden_state)


def test_a_tree_of_another_head_is_named(mlm_params):
    """A head model's tree given where the base model's is read (or another head's) failed with a bare KeyError."""
    ids = _feed(10)["input_ids"]
    with pytest.raises(ValueError, match=r"no 'embeddings' .* \['bert', 'cls'\] \(a head model's base model is its"):
        M.bert(mlm_params, CONFIG, ids)
    with pytest.raises(ValueError, match=r"no 'embeddings'"):
        jaxbert.forward(mlm_params, CONFIG, "BertModel", ids)
    with pytest.raises(ValueError, match=r"no 'classifier' for BertForSequenceClassification: top-level keys"):
        jaxbert.forward(mlm_params, CONFIG, "BertForSequenceClassification", ids)
