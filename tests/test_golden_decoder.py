"""Decoders against fixtures written by transformers 4.57 (scripts/make_golden.py --only decoder): relative
positions in a causal LM with cross-attention (without and with the cache), FlaxBertForCausalLM and
FlaxEncoderDecoderModel msgpack files, and bert2bert PyTorch checkpoints with and without the projection."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close
from flax import serialization, traverse_util

import jaxbert
from jaxbert.cache import init_cache
from jaxbert.cli import main

GOLDEN = os.path.join(os.path.dirname(__file__), "fixtures", "golden")


def _io(name):
    data = np.load(os.path.join(GOLDEN, name, "io.npz"))
    return (
        {k[3:]: data[k] for k in data.files if k.startswith("in.")},
        {k[4:]: data[k] for k in data.files if k.startswith("out.")},
    )


@pytest.mark.parametrize("kind", ["relative_key", "relative_key_query"])
def test_relative_decoder_without_and_with_the_cache(kind):
    inputs, outputs = _io(f"decoder_{kind}")
    lm = jaxbert.load(os.path.join(GOLDEN, f"decoder_{kind}"))
    assert lm.head == "BertLMHeadModel" and lm.config.is_decoder and lm.config.position_embedding_type == kind
    enc = {k: inputs[k] for k in ("encoder_hidden_states", "encoder_attention_mask")}
    got = jaxbert.forward(
        lm.params,
        lm.config,
        lm.head,
        **{k: jnp.asarray(v) for k, v in inputs.items() if k != "step_input_ids"},
        output_hidden_states=True,
        output_attentions=True,
    )
    real = inputs["attention_mask"].astype(bool)
    assert_close(got.loss, outputs["loss"], "loss")
    assert_close(got.logits, outputs["logits"], "logits", mask=real)
    for key, expected in outputs.items():
        field, _, index = key.partition(".")
        if index:
            g, e = np.asarray(got[field][int(index)]), expected
            if g.ndim == 4:
                g, e = g.transpose(0, 2, 1, 3), e.transpose(0, 2, 1, 3)
            assert_close(g, e, key, mask=real)
    ids = inputs["step_input_ids"]
    # Compiled once per layout (op by op, the loop would compile each operation of each step's shapes)
    step = jax.jit(lambda p, i, c, e: jaxbert.forward(p, lm.config, lm.head, i, past_key_values=c, **e))
    for params in (lm.params, lm.compute_params):  # the stored tree's loop and the loaded, stacked layout
        cache, steps = init_cache(lm.config, 3, 12), []
        for t in range(ids.shape[1]):  # one token at a time: query positions offset by the cache length
            out = step(params, jnp.asarray(ids[:, t : t + 1]), cache, {k: jnp.asarray(v) for k, v in enc.items()})
            steps.append(out.logits)
            cache = out.past_key_values
        assert_close(jnp.concatenate(steps, axis=1), outputs["step_logits"], "cached steps")
    # A multi-token forward with a cache places each query at its own position (transformers 4.57 put them all
    # at the last one, which is only right for single tokens): it equals the uncached run.
    out = jaxbert.forward(
        lm.params,
        lm.config,
        lm.head,
        jnp.asarray(ids),
        past_key_values=init_cache(lm.config, 3, 9),
        **{k: jnp.asarray(v) for k, v in enc.items()},
    )
    assert_close(out.logits, outputs["full_step_logits"], "prefill with a cache")


def _tree_shapes(tree):
    return {"/".join(k): np.shape(v) for k, v in traverse_util.flatten_dict(tree).items()}


def test_flax_causal_lm_msgpack_loads_matches_and_our_tree_is_the_same(tmp_path):
    inputs, outputs = _io("flax_BertForCausalLM")
    directory = os.path.join(GOLDEN, "flax_BertForCausalLM")
    lm = jaxbert.load(directory)
    assert lm.head == "BertLMHeadModel"  # config.json says BertForCausalLM, FlaxBert's name
    got = lm(
        inputs["input_ids"],
        inputs["attention_mask"],
        encoder_hidden_states=inputs["encoder_hidden_states"],
        encoder_attention_mask=inputs["encoder_attention_mask"],
    )
    assert_close(got.logits, outputs["logits"], "logits", mask=inputs["attention_mask"].astype(bool))
    assert main(["export", directory, str(tmp_path / "pt")]) == 0
    assert main(["convert", str(tmp_path / "pt"), str(tmp_path / "jax")]) == 0
    ours = serialization.msgpack_restore(open(tmp_path / "jax" / "flax_model.msgpack", "rb").read())
    theirs = serialization.msgpack_restore(open(os.path.join(directory, "flax_model.msgpack"), "rb").read())
    assert _tree_shapes(ours) == _tree_shapes(theirs)


@pytest.mark.parametrize("name", ["flax_EncoderDecoder", "pt_EncoderDecoder", "pt_EncoderDecoder_proj"])
def test_bert2bert_checkpoints_of_transformers_457(name, tmp_path):
    inputs, outputs = _io(name)
    s2s = jaxbert.load(os.path.join(GOLDEN, name))
    assert s2s.config.projects == name.endswith("proj")
    got = s2s(
        inputs["input_ids"], inputs["attention_mask"], inputs["decoder_input_ids"], inputs["decoder_attention_mask"]
    )
    assert_close(got.logits, outputs["logits"], "logits")
    if "labels" in inputs:
        out = jaxbert.forward(
            s2s.params,
            s2s.config,
            s2s.head,
            jnp.asarray(inputs["input_ids"]),
            jnp.asarray(inputs["attention_mask"]),
            labels=jnp.asarray(inputs["labels"]),
        )
        assert_close(out.loss, outputs["loss"], "loss from labels")
        full = (inputs["labels"] != -100).all(1)  # the others get a padding key where -100 was shifted in
        assert_close(out.logits[full], outputs["logits"][full], "logits from labels shifted right")
    if name == "pt_EncoderDecoder":  # what jaxbert writes has FlaxEncoderDecoderModel's tree
        assert main(["convert", os.path.join(GOLDEN, name), str(tmp_path / "jax")]) == 0
        ours = serialization.msgpack_restore(open(tmp_path / "jax" / "flax_model.msgpack", "rb").read())
        theirs = serialization.msgpack_restore(
            open(os.path.join(GOLDEN, "flax_EncoderDecoder", "flax_model.msgpack"), "rb").read()
        )
        assert _tree_shapes(ours) == _tree_shapes(theirs)


def _pruned_decoder():
    inputs, outputs = _io("decoder_pruned")
    lm = jaxbert.load(os.path.join(GOLDEN, "decoder_pruned"))
    assert lm.config.pruned_heads == {0: (0, 2, 3), 1: (1,)}
    run = lambda **kw: jaxbert.forward(  # noqa: E731
        lm.params, lm.config, lm.head, **{k: jnp.asarray(v) for k, v in inputs.items()}, output_attentions=True, **kw
    )
    return inputs, outputs, run


def test_a_pruned_decoder_keeps_every_cross_attention_head():
    """transformers prunes self-attention heads only: a pruned decoder's cross-attention keeps all of them."""
    inputs, outputs, run = _pruned_decoder()
    got, real = run(), inputs["attention_mask"].astype(bool)
    assert_close(got.logits, outputs["logits"], "logits", mask=real)
    for key, expected in outputs.items():
        field, _, index = key.partition(".")
        if index:  # attentions [B, H, L, M]: the real queries' rows
            g = np.asarray(got[field][int(index)]).transpose(0, 2, 1, 3)
            assert_close(g, expected.transpose(0, 2, 1, 3), key, mask=real)


def test_a_head_mask_reaches_every_cross_attention_head_of_a_pruned_decoder():
    """head_mask indexes the original heads: in self-attention a pruned head's entry changes nothing; cross-attention
    keeps all heads (transformers prunes self-attention only), so each of its heads takes its own entry."""
    inputs, _ = _io("decoder_pruned")
    lm = jaxbert.load(os.path.join(GOLDEN, "decoder_pruned"))
    # One self-attention head left in each layer (0: head 1, 1: head 3), cross-attention keeps all four.
    params, config = jaxbert.prune_heads(lm.params, lm.config, {1: [0, 2]})

    def run(**kw):
        feed = {k: jnp.asarray(v) for k, v in inputs.items()}
        return jaxbert.forward(params, config, lm.head, **feed, output_attentions=True, **kw)

    base = run()
    mask = np.ones((2, 4), np.float32)
    mask[0, 0] = 0.0  # pruned from layer 0's self-attention, not from its cross-attention
    got = run(head_mask=jnp.asarray(mask))
    assert_close(got.attentions[0], base.attentions[0], "self-attention: a pruned head's entry")
    cross, whole = np.asarray(got.cross_attentions[0]), np.asarray(base.cross_attentions[0])
    assert np.abs(whole[:, 0]).max() > 0 and np.abs(cross[:, 0]).max() == 0, "cross-attention head 0 not masked"
    assert_close(cross[:, 1:], whole[:, 1:], "cross-attention heads 1-3 kept")


def test_a_pruned_decoder_decodes_over_the_cache_as_without_it():
    """transformers caches a pruned model's layers with the heads each keeps; one token at a time through the cache
    gives the uncached forward's logits (layers with 1 and 3 heads left)."""
    inputs, outputs = _io("decoder_pruned")
    lm = jaxbert.load(os.path.join(GOLDEN, "decoder_pruned"))
    enc = {k: jnp.asarray(inputs[k]) for k in ("encoder_hidden_states", "encoder_attention_mask")}
    ids, real = inputs["input_ids"], inputs["attention_mask"].astype(bool)
    step = jax.jit(lambda i, m, t, c: jaxbert.forward(lm.params, lm.config, lm.head, i, m, t, past_key_values=c, **enc))
    cache, steps = init_cache(lm.config, 3, ids.shape[1]), []
    for t in range(ids.shape[1]):
        new = (ids[:, t : t + 1], inputs["attention_mask"][:, : t + 1], inputs["token_type_ids"][:, t : t + 1])
        out = step(*map(jnp.asarray, new), cache)
        steps.append(out.logits)
        cache = out.past_key_values
    assert_close(jnp.concatenate(steps, axis=1), outputs["logits"], "cached steps", mask=real)
