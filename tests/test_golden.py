"""What transformers 5 removed, checked against fixtures written by transformers 4.57 (scripts/make_golden.py):
relative position embeddings, head_mask, and head pruning (including loading a pruned checkpoint)."""

import os

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close

import jaxbert

GOLDEN = os.path.join(os.path.dirname(__file__), "fixtures", "golden")


def _io(name):
    data = np.load(os.path.join(GOLDEN, name, "io.npz"))
    inputs = {k[3:]: data[k] for k in data.files if k.startswith("in.")}
    outputs = {k[4:]: data[k] for k in data.files if k.startswith("out.")}
    return inputs, outputs


def _check(got, outputs):
    assert outputs
    for key, expected in outputs.items():
        field, _, index = key.partition(".")
        value = got[field][int(index)] if index else got[field]
        assert_close(value, expected, key)


@pytest.mark.parametrize("name", ["relative_key", "relative_key_query", "head_mask", "pruned"])
def test_transformers_457_checkpoint_loads_and_matches(name):
    inputs, outputs = _io(name)
    bert = jaxbert.load(os.path.join(GOLDEN, name))
    got = bert(**inputs, output_hidden_states=True, output_attentions=True)
    _check(got, outputs)


def test_a_head_listed_twice_in_pruned_heads_is_pruned_once(tmp_path):
    """transformers 4.57 prunes the set of heads config.json lists; jaxbert counted a head listed twice twice,
    expected weights for one head fewer than the checkpoint holds and refused it ("...attention.output.dense.weight:
    shape (24, 12) in the checkpoint, expected (24, 6) from the config")."""
    import json
    import shutil

    shutil.copytree(os.path.join(GOLDEN, "pruned"), tmp_path / "pruned")
    path = tmp_path / "pruned" / "config.json"
    config = json.loads(path.read_text())
    config["pruned_heads"] = {layer: heads + heads[:1] for layer, heads in config["pruned_heads"].items()}
    path.write_text(json.dumps(config))
    inputs, outputs = _io("pruned")
    bert = jaxbert.load(tmp_path / "pruned")
    _check(bert(**inputs, output_hidden_states=True, output_attentions=True), outputs)
    assert (
        bert.config.to_dict()["pruned_heads"]
        == json.loads(open(os.path.join(GOLDEN, "pruned", "config.json")).read())["pruned_heads"]
    )


def test_relative_positions_change_the_output():
    """Guard against a fixture that would pass with the relative term dropped."""
    inputs, outputs = _io("relative_key_query")
    bert = jaxbert.load(os.path.join(GOLDEN, "relative_key_query"))
    as_absolute = bert.config.replace(position_embedding_type="absolute")
    got = jaxbert.forward(bert.params, as_absolute, bert.head, **{k: jnp.asarray(v) for k, v in inputs.items()})
    assert np.abs(np.asarray(got.prediction_logits) - outputs["prediction_logits"]).max() > 1e-2


def test_prune_heads_matches_transformers_pruning():
    inputs, outputs = _io("pruned")
    bert = jaxbert.load(os.path.join(GOLDEN, "unpruned"))
    params, config = jaxbert.prune_heads(bert.params, bert.config, {0: [1]})
    params, config = jaxbert.prune_heads(params, config, {0: [1, 3], 2: [0, 2, 3]})
    assert config.pruned_heads == {0: (1, 3), 2: (0, 2, 3)}
    assert config.to_dict()["pruned_heads"] == {"0": [1, 3], "2": [0, 2, 3]}
    assert params["bert"]["encoder"]["layer"]["2"]["attention"]["self"]["query"]["kernel"].shape == (24, 6)
    assert params["bert"]["encoder"]["layer"]["0"]["attention"]["output"]["dense"]["kernel"].shape == (12, 24)
    got = jaxbert.forward(
        params,
        config,
        bert.head,
        **{k: jnp.asarray(v) for k, v in inputs.items()},
        output_hidden_states=True,
        output_attentions=True,
    )
    _check(got, outputs)


def test_prune_heads_rejects_out_of_range():
    bert = jaxbert.load(os.path.join(GOLDEN, "unpruned"))
    with pytest.raises(ValueError, match="layer 7 out of range"):
        jaxbert.prune_heads(bert.params, bert.config, {7: [0]})
    with pytest.raises(ValueError, match=r"layer 1 heads \[4\] out of range"):
        jaxbert.prune_heads(bert.params, bert.config, {1: [4]})


def test_head_mask_of_original_heads_applies_to_pruned_model():
    """head_mask indexes the original heads: masking a pruned head changes nothing, a kept one does."""
    inputs, _ = _io("pruned")
    bert = jaxbert.load(os.path.join(GOLDEN, "pruned"))
    base = bert(**inputs).logits
    mask = np.ones((3, 4), np.float32)
    mask[0, 1] = 0.0  # pruned head of layer 0
    assert_close(bert(**inputs, head_mask=mask).logits, base, "mask on a pruned head")
    mask[0, 0] = 0.0  # kept head
    assert np.abs(np.asarray(bert(**inputs, head_mask=mask).logits) - np.asarray(base)).max() > 1e-4


def test_relative_positions_refuse_distances_beyond_their_table():
    """transformers 4.57 raises IndexError for a sequence longer than max_position_embeddings under relative
    positions, position_ids or not (they are not used); the distance table has no rows for longer distances."""
    bert = jaxbert.load(os.path.join(GOLDEN, "relative_key"))
    P = bert.config.max_position_embeddings
    ids = np.ones((1, P + 1), np.int64)
    match = f"sequence length {P + 1} exceeds max_position_embeddings {P}"
    with pytest.raises(ValueError, match=match):
        bert(ids, position_ids=np.zeros_like(ids))
    with pytest.raises(ValueError, match=match):
        jaxbert.forward(bert.params, bert.config, bert.head, jnp.asarray(ids))
    assert bert(ids[:, :P]).prediction_logits.shape == (1, P, bert.config.vocab_size)  # the table's edges: fine
