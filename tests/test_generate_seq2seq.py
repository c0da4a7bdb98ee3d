"""bert2bert generation (`EncoderDecoder.generate`) against transformers 5's EncoderDecoderModel.generate, token for
token: greedy and beam search on small random models with and without enc_to_dec_proj, right-padded encoder inputs,
eos ids that end some rows early; sampling from a seed; option resolution from generation_config.json and
config.json; the number of compiled programs; the errors."""

import json
import os
import shutil

import numpy as np
import pytest
from conftest import SIZES
from test_seq2seq import _model

import jaxbert

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
S, NEW = 11, 12  # encoder columns, new tokens
_BUILT = {}


def _build(width: int, tmp_path_factory):
    """The transformers model and jaxbert's load of its saved directory (one per width for the whole module)."""
    if width not in _BUILT:
        transformers.logging.set_verbosity_error()
        model = _model(width)
        with torch.no_grad():  # random decoders barely read the encoder: louder cross-attention makes rows differ
            for layer in model.decoder.bert.encoder.layer:
                layer.crossattention.self.value.weight *= 3
                layer.crossattention.output.dense.weight *= 3
        directory = tmp_path_factory.mktemp(f"s2s{width}")
        model.save_pretrained(directory)
        _BUILT[width] = model, jaxbert.load(directory), str(directory)
    return _BUILT[width]


@pytest.fixture(scope="module", params=[24, 32], ids=["projected", "same-width"])
def models(request, tmp_path_factory):
    return _build(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def projected(tmp_path_factory):
    return _build(24, tmp_path_factory)


def _inputs(seed=0, rows=4):
    """Right-padded encoder rows of different lengths (pad id 0), one unpadded."""
    rng = np.random.default_rng(seed)
    ids, mask = rng.integers(3, SIZES["vocab_size"], (rows, S)), np.ones((rows, S), np.int64)
    for row, pad in ((1, 3), (2, 7), (3, 1))[: rows - 1]:
        mask[row, S - pad :] = 0
    ids[mask == 0] = 0
    return ids, mask


def _hf_generate(model, ids, mask=None, **kwargs):
    with torch.no_grad():
        return model.generate(
            torch.as_tensor(ids), attention_mask=None if mask is None else torch.as_tensor(mask), **kwargs
        ).numpy()


def _ended_early(out: np.ndarray, eos) -> list[bool]:
    """Per row: an eos before the last column (the row finished and was padded while others ran on)."""
    return [bool(np.isin(row[1:-1], eos).any()) for row in out]


def test_greedy_equals_transformers_with_padded_inputs_and_eos(models):
    hf, s2s, _ = models
    ids, mask = _inputs()
    plain = _hf_generate(hf, ids, mask, max_new_tokens=NEW)
    # A token that ends row 0 early and is absent from some other row: that row runs on.
    eos = next(int(t) for t in plain[0, 2:-1] if any(t not in row for row in plain[1:]))
    expected = _hf_generate(hf, ids, mask, max_new_tokens=NEW, eos_token_id=eos)
    got = s2s.generate(ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=eos)
    np.testing.assert_array_equal(got, expected)
    assert got.shape == (4, 1 + NEW) and (got[:, 0] == 2).all()  # the start token, then every step ran
    stopped = _ended_early(got, eos)
    assert stopped[0] and not all(stopped), got
    assert (got[0, list(got[0]).index(eos) + 1 :] == 0).all()  # finished rows get pad
    # eos cannot end a row before min_new_tokens (traced: the same program)
    kwargs = dict(max_new_tokens=NEW, eos_token_id=eos, min_new_tokens=list(got[0]).index(eos) + 1)
    later = _hf_generate(hf, ids, mask, **kwargs)
    np.testing.assert_array_equal(s2s.generate(ids, attention_mask=mask, **kwargs), later)
    assert (later != expected).any()
    # transformers infers no encoder mask for encoder-decoders: the pad tokens are attended to, here as there.
    np.testing.assert_array_equal(
        s2s.generate(ids, max_new_tokens=NEW, eos_token_id=eos),
        _hf_generate(hf, ids, max_new_tokens=NEW, eos_token_id=eos),
    )


def _beam_search_equals_transformers(hf, s2s, options):
    ids, mask = _inputs(seed=1)
    plain = _hf_generate(hf, ids, mask, max_new_tokens=NEW, **options)
    eos = [int(plain[0, 3]), int(plain[-1, 5])]  # tokens the beams pick: some hypotheses end there
    expected = _hf_generate(hf, ids, mask, max_new_tokens=NEW, eos_token_id=eos, **options)
    got = s2s.generate(ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=eos, **options)
    np.testing.assert_array_equal(got, expected)
    assert got.shape[0] == 4 * options.get("num_return_sequences", 1)
    assert any(_ended_early(got, eos)), got  # finished hypotheses, padded to the longest


def test_beam_search_equals_transformers(models):
    _beam_search_equals_transformers(*models[:2], dict(num_beams=3))


def test_beam_search_returning_several_with_early_stopping_equals_transformers(projected):
    _beam_search_equals_transformers(
        *projected[:2], dict(num_beams=3, num_return_sequences=2, early_stopping=True, length_penalty=1.5)
    )


def test_repetition_penalty_equals_transformers(models):
    """Over the decoder's tokens (its start token, then those chosen), not the encoder's input: transformers'
    RepetitionPenaltyLogitsProcessor reads the decoder's input_ids. Greedy (logits) and beams (log-probabilities)."""
    hf, s2s, _ = models
    ids, mask = _inputs(seed=2)
    for options in (dict(repetition_penalty=1.8), dict(repetition_penalty=1.5, num_beams=3)):
        expected = _hf_generate(hf, ids, mask, max_new_tokens=NEW, **options)
        np.testing.assert_array_equal(s2s.generate(ids, attention_mask=mask, max_new_tokens=NEW, **options), expected)
        plain = {k: v for k, v in options.items() if k != "repetition_penalty"}
        assert not np.array_equal(expected, _hf_generate(hf, ids, mask, max_new_tokens=NEW, **plain))


def test_sampling_is_reproducible_from_the_seed(projected):
    _, s2s, _ = projected
    ids, mask = _inputs(seed=2)

    def run(seed):
        return s2s.generate(
            ids, attention_mask=mask, max_new_tokens=NEW, do_sample=True, num_return_sequences=2, seed=seed
        )

    first = run(0)
    assert first.shape == (8, 1 + NEW) and (first[0] != first[1]).any()  # two draws per input
    np.testing.assert_array_equal(run(0), first)
    assert not np.array_equal(run(1), first)


def test_programs_are_bounded_across_lengths_batches_and_new_tokens(projected):
    hf, s2s, _ = projected
    ids, mask = _inputs(seed=3)
    s2s.generate(ids[:3, :9], attention_mask=mask[:3, :9], max_new_tokens=4)
    before = s2s.compile_count
    outputs = {}
    for rows, length, n, start in ((4, 11, 9, 2), (3, 6, 5, 2), (4, 14, 16, 5), (3, 3, 1, 2), (4, 11, 2, 2)):
        wide = np.pad(ids, ((0, 0), (0, 3)), constant_values=7) if length > S else ids[:, :length]
        outputs[rows, length, n] = s2s.generate(wide[:rows], max_new_tokens=n, decoder_start_token_id=start)
    assert s2s.compile_count == before  # encoder bucket 16, batch bucket 4, new-token bucket 16 throughout
    np.testing.assert_array_equal(outputs[4, 11, 2], outputs[4, 11, 9][:, :3])
    np.testing.assert_array_equal(outputs[3, 6, 5], _hf_generate(hf, ids[:3, :6], max_new_tokens=5))
    np.testing.assert_array_equal(outputs[4, 14, 16][:, 0], 5)


def test_a_start_token_per_row_equals_transformers(projected):
    """transformers takes decoder_start_token_id as a list of one start token per input row; jaxbert used the
    first for every row, silently."""
    hf, s2s, _ = projected
    ids, mask = _inputs(seed=5, rows=3)
    for options in (dict(), dict(num_beams=2, num_return_sequences=2)):
        kwargs = dict(max_new_tokens=4, decoder_start_token_id=[5, 7, 9], **options)
        expected = _hf_generate(hf, ids, mask, **kwargs)
        np.testing.assert_array_equal(s2s.generate(ids, attention_mask=mask, **kwargs), expected)
    assert expected[:, 0].tolist() == [5, 5, 7, 7, 9, 9]
    sampled = s2s.generate(ids, mask, max_new_tokens=4, decoder_start_token_id=[5, 7, 9], do_sample=True,
                           num_return_sequences=2)  # fmt: skip
    assert sampled[:, 0].tolist() == [5, 5, 7, 7, 9, 9]
    with pytest.raises(ValueError, match="expected to have length 3"):
        _hf_generate(hf, ids, mask, max_new_tokens=2, decoder_start_token_id=[5, 7])
    with pytest.raises(ValueError, match="^decoder_start_token_id \\[5, 7\\]: one start token per input row, "):
        s2s.generate(ids, attention_mask=mask, max_new_tokens=2, decoder_start_token_id=[5, 7])


def test_an_encoder_row_with_every_token_masked_is_refused(projected):
    """transformers attends a fully masked encoder row uniformly over its columns; jaxbert's length bucket added
    its padding columns to that average (encoder and cross-attention), so the row generated other tokens than
    transformers' (and than jaxbert's own forward) when its length was not a bucket's. One real token is enough."""
    hf, s2s, _ = projected
    ids, mask = _inputs(seed=6, rows=3)
    mask[1, 1:] = 0
    np.testing.assert_array_equal(
        s2s.generate(ids, attention_mask=mask, max_new_tokens=4), _hf_generate(hf, ids, mask, max_new_tokens=4)
    )
    mask[1] = 0
    with pytest.raises(ValueError, match="^attention_mask row 1 masks every token: nothing to generate from$"):
        s2s.generate(ids, attention_mask=mask, max_new_tokens=4)


def _copy(directory, tmp_path, generation=None, **config_changes):
    """The checkpoint with config.json changed (`decoder__key` reaches into the decoder's) and
    generation_config.json replaced (None: removed)."""
    copy = tmp_path / "copy"
    shutil.copytree(directory, copy)
    config = json.loads((copy / "config.json").read_text())
    for key, value in config_changes.items():
        *parts, last = key.split("__")
        target = config
        for part in parts:
            target = target[part]
        target[last] = value
    (copy / "config.json").write_text(json.dumps(config))
    os.remove(copy / "generation_config.json")
    if generation is not None:
        (copy / "generation_config.json").write_text(json.dumps(generation))
    return copy


@pytest.mark.parametrize(
    "generation, config",
    [
        # generation_config.json alone names the special tokens (transformers 5 reads none from config.json beside
        # it; jaxbert took config.json's decoder_start_token_id 2 and pad_token_id 0): its bos starts, its eos
        # pads; 20 new tokens by default (transformers: max_length 20 + 1)
        (dict(bos_token_id=5, eos_token_id=[1, 40]), {}),
        # none: transformers reads config.json, its top level first, then the decoder's; no start token -> bos;
        # max_length counts the start token
        (None, dict(decoder_start_token_id=None, decoder__bos_token_id=4, decoder__eos_token_id=40, max_length=7)),
    ],
)
@pytest.mark.filterwarnings("ignore:Using the model-agnostic default")
def test_defaults_resolve_as_transformers(projected, tmp_path, generation, config):
    _, _, directory = projected
    copy = _copy(directory, tmp_path, generation, **config)
    ids, mask = _inputs(seed=4)
    expected = _hf_generate(transformers.EncoderDecoderModel.from_pretrained(copy).eval(), ids, mask)
    got = jaxbert.load(copy).generate(ids, attention_mask=mask)
    np.testing.assert_array_equal(got, expected)
    assert expected[0, 0] in (4, 5) and expected.shape[1] <= config.get("max_length", 21)


def test_no_start_token_is_refused_as_by_transformers(projected, tmp_path):
    _, _, directory = projected
    # config.json's decoder_start_token_id (2) is not read beside a generation_config.json, as in transformers 5
    copy = _copy(directory, tmp_path, dict(pad_token_id=0))
    ids, mask = _inputs()
    with pytest.raises(ValueError, match="decoder_start_token_id"):
        _hf_generate(transformers.EncoderDecoderModel.from_pretrained(copy), ids, mask, max_new_tokens=2)
    with pytest.raises(
        ValueError,
        match="^decoder_start_token_id: not given nor in the generation config .generation_config.json, else "
        "config.json., and no bos_token_id to fall back on$",
    ):
        jaxbert.load(copy).generate(ids, attention_mask=mask)


@pytest.mark.filterwarnings("ignore:Using the model-agnostic default")
def test_the_default_of_20_new_tokens_past_the_decoder_positions_is_refused(tmp_path):
    """transformers caps its default of 20 new tokens by config.max_position_embeddings, which an
    EncoderDecoderConfig lacks: past a decoder's 12 positions its generate fails. jaxbert capped the default at 11
    new tokens, silently."""
    model = _model(24, decoder=dict(max_position_embeddings=12))
    model.save_pretrained(tmp_path)
    ids, mask = _inputs()
    with pytest.raises(RuntimeError):
        _hf_generate(model, ids, mask)
    with pytest.raises(ValueError, match="^max_new_tokens: unset, so transformers' default 20, but the decoder st"):
        jaxbert.load(tmp_path).generate(ids, attention_mask=mask)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(max_new_tokens=0), ValueError, "max_new_tokens 0: must be ≥ 1"),
        (dict(num_beams=0), ValueError, "num_beams 0: must be ≥ 1"),
        (
            dict(max_new_tokens=40),
            ValueError,
            "decoder start token 1 \\+ max_new_tokens 40 = 41 exceeds max_position_embeddings 40",
        ),
        (
            dict(decoder_start_token_id=97),
            ValueError,
            "decoder_start_token_id 97: token ids must be integers in \\[0, vocab_size=97\\)",
        ),
        (dict(num_beams=2, num_return_sequences=3), ValueError, "num_return_sequences 3: must be in \\[1, 2\\]"),
        (dict(do_sample=True, num_beams=2), ValueError, "do_sample=True with num_beams=2"),
        (
            dict(input_ids=np.ones((2, 41), np.int64), attention_mask=None),
            ValueError,
            "sequence length 41 exceeds max_position_embeddings",
        ),
        (dict(input_ids=np.array([1, 2]), attention_mask=None), ValueError, "input_ids must be 2-D"),
        (dict(attention_mask=np.ones((4, 3), np.int64)), ValueError, "attention_mask shape \\(4, 3\\) does not match"),
    ],
)
def test_bad_arguments_are_one_line_errors_naming_the_value(projected, kwargs, error, match):
    _, s2s, _ = projected
    ids, mask = _inputs()
    kwargs = {"input_ids": ids, "attention_mask": mask, **kwargs}
    with pytest.raises(error, match=match) as info:
        s2s.generate(**kwargs)
    assert "\n" not in str(info.value)


def test_int8_bert2bert_stays_near_float32_and_generates_what_its_forward_picks(projected):
    # Both sides quantized (the decoder's cross-attention too); the projection and embeddings stay float32.
    _, f32, directory = projected
    int8 = jaxbert.load(directory, dtype="int8")
    ids, mask = _inputs()
    start = np.full((ids.shape[0], 1), f32.config.decoder_start_token_id)
    a, b = (np.asarray(m(ids, mask, decoder_input_ids=start).logits) for m in (f32, int8))
    assert 0 < np.abs(a - b).max() <= 0.05 * a.std()
    new = np.asarray(int8.generate(ids, mask, max_new_tokens=4))
    assert new.shape[0] == ids.shape[0]
    np.testing.assert_array_equal(new[:, 1], b[:, -1].argmax(-1))  # the first generated token
