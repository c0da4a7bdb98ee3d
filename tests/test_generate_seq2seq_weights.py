"""`EncoderDecoder.load_weights` / `drop_weights`: a loaded bert2bert given other weights generates what a fresh
load of those weights generates (and transformers' generate of them), with the programs it has already compiled;
a tree that is not the model's is refused in one line and leaves it as it was. Training's validation by
generation (train --predict-with-generate) relies on it to compile its search once for a run."""

import copy

import numpy as np
import pytest
from test_generate_seq2seq import NEW, _build, _hf_generate, _inputs

import jaxbert
from jaxbert.checkpoint import load_params

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def _other(hf, directory) -> str:
    """The same architecture with other weights, saved as transformers saves it."""
    other = copy.deepcopy(hf)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    other.save_pretrained(directory)
    return str(directory)


def test_new_weights_generate_as_a_fresh_load_of_them_and_compile_nothing(tmp_path_factory, tmp_path):
    hf, _, source = _build(24, tmp_path_factory)  # with enc_to_dec_proj
    s2s = jaxbert.load(source)  # its own: the module's shared model keeps its weights
    ids, mask = _inputs(seed=5)
    searches = [dict(max_new_tokens=NEW), dict(max_new_tokens=NEW, num_beams=3)]
    before = [s2s.generate(ids, attention_mask=mask, **o) for o in searches]
    compiled = s2s.compile_count

    other = _other(hf, tmp_path / "other")
    fresh = jaxbert.load(other)
    s2s.drop_weights()
    with pytest.raises(ValueError, match=r"weights were dropped \(drop_weights\): give it new ones with load_weights"):
        s2s.generate(ids, attention_mask=mask, max_new_tokens=NEW)
    s2s.load_weights(load_params(other, s2s.config, "EncoderDecoderModel")[0], consume=True)
    hf_other = transformers.EncoderDecoderModel.from_pretrained(other).eval()
    for options, old in zip(searches, before):
        got = s2s.generate(ids, attention_mask=mask, **options)
        np.testing.assert_array_equal(got, fresh.generate(ids, attention_mask=mask, **options))
        np.testing.assert_array_equal(got, _hf_generate(hf_other, ids, mask, **options))
        assert not np.array_equal(got, old)  # other weights, other tokens: the new ones are read
    assert s2s.compile_count == compiled
    np.testing.assert_array_equal(s2s.params["enc_to_dec_proj"]["kernel"], fresh.params["enc_to_dec_proj"]["kernel"])


@pytest.mark.parametrize(
    "change, match",
    [
        (
            lambda p: p.pop("enc_to_dec_proj"),
            r"load_weights: enc_to_dec_proj missing: the model's is bias \(24,\) float32, kernel \(32, 24\) float32",
        ),
        (lambda p: p.pop("decoder"), "load_weights: no 'decoder' tree"),
        (
            lambda p: p["encoder"]["encoder"]["layer"]["0"]["output"]["dense"].update(bias=np.zeros(5, np.float32)),
            r"load_weights: encoder: encoder/layer/0/output/dense/bias is \(5,\) float32, the model's \(32,\) float32",
        ),
        (lambda p: p["decoder"]["cls"]["predictions"].pop("bias"), "load_weights: decoder: no cls/predictions/bias"),
    ],
)
def test_weights_not_the_models_are_refused_and_change_nothing(change, match, tmp_path_factory):
    _, shared, source = _build(24, tmp_path_factory)
    s2s = jaxbert.load(source)
    ids, mask = _inputs(seed=5)
    params = load_params(source, s2s.config, "EncoderDecoderModel")[0]
    change(params)
    with pytest.raises(ValueError, match=match):
        s2s.load_weights(params)
    np.testing.assert_array_equal(
        s2s.generate(ids, attention_mask=mask, max_new_tokens=4),
        shared.generate(ids, attention_mask=mask, max_new_tokens=4),
    )
