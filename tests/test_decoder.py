"""BERT as a decoder against transformers 5: causal self-attention, cross-attention, the key/value cache, the
causal-LM loss; on the stored tree and the stacked layout."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import SIZES, assert_close, hf_model, jax_config, padded_batch, state_dict

import jaxbert
from jaxbert import layout
from jaxbert.cache import init_cache

torch = pytest.importorskip("torch")
S = 7  # encoder positions


@pytest.fixture(scope="module")
def lm():
    hf = hf_model("BertLMHeadModel", is_decoder=True, add_cross_attention=True)
    config = jax_config(hf)
    params, _ = jaxbert.torch_to_flax(state_dict(hf), config, "BertLMHeadModel")
    return hf, config, params


def _encoder(seed=1, batch=3):
    rng = np.random.default_rng(seed)
    states = rng.normal(size=(batch, S, SIZES["hidden_size"])).astype(np.float32)
    mask = np.ones((batch, S), np.int64)
    mask[-1, 5:] = 0
    return states, mask


def _torch(hf, **feed):
    with torch.no_grad():
        return hf(
            **{k: torch.as_tensor(v) if isinstance(v, np.ndarray) else v for k, v in feed.items()}, return_dict=True
        )


def _jax(params, config, **feed):
    return jaxbert.forward(
        params,
        config,
        "BertLMHeadModel",
        **{k: jnp.asarray(v) if isinstance(v, np.ndarray) else v for k, v in feed.items()},
    )


@pytest.mark.parametrize("stacked", [False, True])
def test_causal_lm_with_cross_attention_matches_transformers(lm, stacked):
    hf, config, params = lm
    params = layout.to_compute(params, config) if stacked else params
    feed = padded_batch(0)
    states, emask = _encoder()
    labels = np.where(feed["attention_mask"] == 1, feed["input_ids"], -100)
    extra = dict(
        encoder_hidden_states=states,
        encoder_attention_mask=emask,
        labels=labels,
        output_attentions=True,
        output_hidden_states=True,
    )
    expected = _torch(hf, **feed, **extra, use_cache=False)
    got = _jax(params, config, **feed, **extra)
    real = feed["attention_mask"].astype(bool)
    assert_close(got.logits, expected.logits.numpy(), "logits", mask=real)
    assert_close(got.loss, expected.loss.numpy(), "loss")
    for name in ("hidden_states", "attentions", "cross_attentions"):
        assert len(got[name]) == len(expected[name]) > 0, name
        for i, (g, e) in enumerate(zip(got[name], expected[name], strict=True)):
            g, e = np.asarray(g), e.numpy()
            if g.ndim == 4:  # [B, H, L, M]: compare real query positions
                g, e = g.transpose(0, 2, 1, 3), e.transpose(0, 2, 1, 3)
            assert_close(g, e, f"{name}[{i}]", mask=real)


def test_causal_attention_ignores_later_tokens(lm):
    _, config, params = lm
    ids = np.random.default_rng(2).integers(1, SIZES["vocab_size"], (2, 9))
    changed = ids.copy()
    changed[:, 6:] = (changed[:, 6:] + 1) % SIZES["vocab_size"]
    a, b = (_jax(params, config, input_ids=x).logits for x in (ids, changed))
    assert_close(a[:, :6], b[:, :6], "positions before the change")
    assert float(jnp.abs(a[:, 6:] - b[:, 6:]).max()) > 1e-3


@pytest.mark.parametrize("stacked", [False, True])
def test_cache_token_by_token_and_after_a_prefill_equals_the_full_forward(lm, stacked):
    hf, config, params = lm
    params = layout.to_compute(params, config) if stacked else params
    ids = np.random.default_rng(3).integers(1, SIZES["vocab_size"], (3, 9))
    states, emask = _encoder()
    enc = dict(encoder_hidden_states=states, encoder_attention_mask=emask)
    # Jitted, as generation runs it: one program per shape (the whole, each prefill, a token) where op by op each
    # operation compiled for every shape (most of the test's time).
    run = jax.jit(lambda p, feed: _jax(p, config, **feed))
    full = run(params, dict(input_ids=ids, **enc)).logits
    for prefill in (1, 4):
        out = run(params, dict(input_ids=ids[:, :prefill], past_key_values=init_cache(config, 3, 12), **enc))
        logits, cache = [out.logits], out.past_key_values
        assert cache.has_cross and int(cache.index[0]) == prefill
        for t in range(prefill, 9):  # cross keys come from the cache now: no encoder states passed
            out = run(params, dict(input_ids=ids[:, t : t + 1], past_key_values=cache))
            logits.append(out.logits)
            cache = out.past_key_values
        assert_close(jnp.concatenate(logits, axis=1), full, f"prefill {prefill}")
    reference = []  # and transformers' own cache, one token at a time
    past = None
    for t in range(9):
        out = _torch(hf, input_ids=ids[:, t : t + 1], past_key_values=past, use_cache=True, **enc)
        reference.append(out.logits.numpy())
        past = out.past_key_values
    assert_close(full, np.concatenate(reference, axis=1), "transformers with its cache")


def test_use_cache_without_a_cache_returns_a_full_one(lm):
    _, config, params = lm
    ids = np.arange(1, 6)[None].repeat(2, 0)
    out = _jax(params, config, input_ids=ids, use_cache=True)
    assert out.past_key_values.capacity == 5 and out.past_key_values.index.tolist() == [5, 5]
    assert not out.past_key_values.has_cross


def test_writing_past_the_cache_capacity_is_nan_not_a_silent_overwrite(lm):
    _, config, params = lm
    cache = init_cache(config, 1, 4)
    # Jitted, as generation runs it: a program per shape where op by op each operation compiled for both.
    run = jax.jit(lambda p, feed: _jax(p, config, **feed))
    out = run(params, dict(input_ids=np.array([[5, 6, 7]]), past_key_values=cache))
    assert np.isfinite(np.asarray(out.logits)).all()
    out = run(params, dict(input_ids=np.array([[8, 9]]), past_key_values=out.past_key_values))
    assert np.isnan(np.asarray(out.logits)).all()


def test_decoder_arguments_on_a_model_without_them_are_refused(lm):
    _, config, params = lm
    encoder_only = config.replace(add_cross_attention=False)
    states, _ = _encoder(batch=1)
    with pytest.raises(ValueError, match="encoder_hidden_states given, but this model has no cross-attention"):
        _jax(params, encoder_only, input_ids=np.array([[1, 2]]), encoder_hidden_states=states)
    plain = jaxbert.BertConfig.from_dict(SIZES)
    base = jaxbert.init_params(plain, jax.random.key(0))
    with pytest.raises(ValueError, match="need a decoder"):
        jaxbert.model.bert(base, plain, jnp.array([[1, 2]]), use_cache=True)
    with pytest.raises(ValueError, match="cache capacity 99"):
        init_cache(config, 1, 99)
