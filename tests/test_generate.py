"""Generation against transformers 5's `generate`, token for token: greedy and beam search on a small random
BertLMHeadModel with left-padded batches and eos ids that stop some rows early; sampling from a seed; the number of
compiled programs; the errors."""

import json
import shutil
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import SIZES, hf_model

import jaxbert
from jaxbert.generate import Search, Warp, decode, warp_logits

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
P, NEW = 8, 14  # prompt columns, new tokens
# Two layers, not conftest's three: decoding runs the layers as a Python loop over the key/value cache (not the
# scan), so each search's program compiles every layer again, and compiling was most of this file's time. Two still
# tell a layer's cache slot from another's (every layer reading layer 0's fails 18 tests here).
LAYERS = 2


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The transformers model and the same weights loaded by jaxbert from its saved directory."""
    transformers.logging.set_verbosity_error()
    hf = hf_model("BertLMHeadModel", is_decoder=True, num_hidden_layers=LAYERS)
    hf.config.architectures = ["BertLMHeadModel"]
    directory = str(tmp_path_factory.mktemp("lm"))
    hf.save_pretrained(directory)
    return hf, jaxbert.load(directory), directory


def _prompts(seed=0, rows=4):
    """Left-padded rows of different lengths (pad id 0), one unpadded."""
    rng = np.random.default_rng(seed)
    ids, mask = rng.integers(1, SIZES["vocab_size"], (rows, P)), np.ones((rows, P), np.int64)
    for row, pad in ((1, 2), (2, 5), (3, 1))[: rows - 1]:
        mask[row, :pad] = 0
    ids[mask == 0] = 0
    return ids, mask


def _hf_generate(hf, ids, mask=None, **kwargs):
    with torch.no_grad():
        return hf.generate(
            torch.as_tensor(ids), attention_mask=None if mask is None else torch.as_tensor(mask), **kwargs
        ).numpy()


def _stops_some_rows(new: np.ndarray) -> int:
    """A token that ends row 0 early (not as its first token) and never appears in some other row."""
    for token in new[0, 1:-1]:
        if any(token not in row for row in new[1:]):
            return int(token)
    raise AssertionError(f"no eos candidate in {new}")


def test_greedy_equals_transformers_with_left_padding_and_eos(models):
    hf, lm, _ = models
    ids, mask = _prompts()
    plain = _hf_generate(hf, ids, mask, max_new_tokens=NEW)
    eos = _stops_some_rows(plain[:, P:])
    expected = _hf_generate(hf, ids, mask, max_new_tokens=NEW, eos_token_id=eos)
    got = lm.generate(ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=eos)
    np.testing.assert_array_equal(got, expected)
    stopped = [eos in row[P:-1] for row in got]
    assert any(stopped) and not all(stopped), got  # rows ended early and got padded, others ran on
    assert (got[0, P + list(got[0, P:]).index(eos) + 1 :] == 0).all()
    # Without a mask, transformers infers it from the pad tokens in the prompt: so does jaxbert.
    np.testing.assert_array_equal(lm.generate(ids, max_new_tokens=NEW, eos_token_id=eos), expected)
    # eos cannot end a row before min_new_tokens (traced: the same program)
    kwargs = dict(max_new_tokens=NEW, eos_token_id=eos, min_new_tokens=list(got[0, P:]).index(eos) + 2)
    later = _hf_generate(hf, ids, mask, **kwargs)
    np.testing.assert_array_equal(lm.generate(ids, attention_mask=mask, **kwargs), later)
    assert later.shape != expected.shape or (later != expected).any()


@pytest.mark.parametrize("options", [{}, dict(num_beams=3)])
def test_a_null_pad_token_id_generates_as_transformers(tmp_path, options):
    """config.json's "pad_token_id": null was refused at load. transformers' generate then pads ended rows with
    eos (and infers no attention mask from the prompt, pad being eos)."""
    transformers.logging.set_verbosity_error()
    hf = hf_model("BertLMHeadModel", is_decoder=True, num_hidden_layers=LAYERS, pad_token_id=None)
    hf.config.architectures = ["BertLMHeadModel"]
    hf.save_pretrained(tmp_path)
    lm = jaxbert.load(tmp_path)
    ids, mask = _prompts()
    plain = _hf_generate(hf, ids, mask, max_new_tokens=NEW, **options)
    np.testing.assert_array_equal(lm.generate(ids, attention_mask=mask, max_new_tokens=NEW, **options), plain)
    eos = _stops_some_rows(plain[:, P:])
    expected = _hf_generate(hf, ids, mask, max_new_tokens=NEW, eos_token_id=eos, **options)
    got = lm.generate(ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=eos, **options)
    np.testing.assert_array_equal(got, expected)
    ended = [row for row in got if eos in row[P:-1]]
    assert ended or options  # greedy: row 0 ends early; then each ended row is padded with eos
    assert all((row[P + list(row[P:]).index(eos) :] == eos).all() for row in ended)
    unmasked = _hf_generate(hf, ids, None, max_new_tokens=NEW, eos_token_id=eos, **options)
    np.testing.assert_array_equal(lm.generate(ids, max_new_tokens=NEW, eos_token_id=eos, **options), unmasked)


def test_greedy_with_an_eos_list_trims_to_the_steps_run(models):
    hf, lm, _ = models
    ids, mask = _prompts(seed=1)
    plain = _hf_generate(hf, ids, mask, max_new_tokens=NEW)
    eos = sorted({int(t) for t in plain[:, P + 2]})  # every row ends by its third token
    expected = _hf_generate(hf, ids, mask, max_new_tokens=NEW, eos_token_id=eos)
    assert expected.shape[1] <= P + 3
    np.testing.assert_array_equal(lm.generate(ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=eos), expected)


@pytest.mark.parametrize(
    "options",
    [
        dict(num_beams=3),
        dict(num_beams=4, early_stopping=True, num_return_sequences=2, length_penalty=2.0),
        dict(num_beams=3, early_stopping="never", length_penalty=0.5),
    ],
)
def test_beam_search_equals_transformers(models, options):
    hf, lm, _ = models
    ids, mask = _prompts(seed=2)
    plain = _hf_generate(hf, ids, mask, max_new_tokens=NEW, **options)
    eos = [int(plain[0, P + 3]), int(plain[-1, P + 5])]  # tokens the beams pick: some hypotheses end there
    expected = _hf_generate(hf, ids, mask, max_new_tokens=NEW, eos_token_id=eos, **options)
    assert expected.shape != plain.shape or (expected != plain).any()
    np.testing.assert_array_equal(
        lm.generate(ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=eos, **options), expected
    )
    # eos cannot end a hypothesis before min_length tokens, the prompt's included (traced: the same program)
    options = dict(max_new_tokens=NEW, eos_token_id=eos, min_length=P + 6, **options)
    later = _hf_generate(hf, ids, mask, **options)
    np.testing.assert_array_equal(lm.generate(ids, attention_mask=mask, **options), later)
    assert later.shape != expected.shape or (later != expected).any()


def test_no_repeat_ngram_size_equals_transformers(models):
    """transformers' NoRepeatNGramLogitsProcessor over the prompt (its padding ids included) and the tokens so far,
    here in beam search, whose hypotheses are reordered every step."""
    hf, lm, _ = models
    ids, mask = _prompts(seed=10)
    options = dict(max_new_tokens=NEW, num_beams=2, no_repeat_ngram_size=2)
    expected = _hf_generate(hf, ids, mask, **options)
    np.testing.assert_array_equal(lm.generate(ids, attention_mask=mask, **options), expected)
    assert not np.array_equal(expected, _hf_generate(hf, ids, mask, max_new_tokens=NEW, num_beams=2))


@pytest.mark.parametrize("n", [P + NEW + 1, 100, 10**12])
def test_an_ngram_longer_than_the_sequence_bans_nothing_as_in_transformers(models, n):
    """no_repeat_ngram_size beyond the prompt and its new tokens failed inside JAX ('slice slice_sizes must be less
    than or equal to operand shape', one line naming nothing the caller gave) or, past int32, with an OverflowError
    (a traceback from `jaxbert generate --no-repeat-ngram-size`); transformers' processor bans nothing there."""
    hf, lm, _ = models
    ids, mask = _prompts(seed=10)
    for beams in (1, 2):
        expected = _hf_generate(hf, ids, mask, max_new_tokens=NEW, num_beams=beams, no_repeat_ngram_size=n)
        np.testing.assert_array_equal(expected, _hf_generate(hf, ids, mask, max_new_tokens=NEW, num_beams=beams))
        got = lm.generate(ids, attention_mask=mask, max_new_tokens=NEW, num_beams=beams, no_repeat_ngram_size=n)
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize(
    "options",
    [
        dict(repetition_penalty=1.5),
        dict(repetition_penalty=0.6, no_repeat_ngram_size=3),  # < 1 encourages repeats; both processors, in order
        dict(repetition_penalty=2.0, num_beams=3, num_return_sequences=2),
        dict(repetition_penalty=1.3, num_beams=2, no_repeat_ngram_size=2, min_new_tokens=4),
    ],
)
def test_repetition_penalty_equals_transformers(models, options):
    """transformers' RepetitionPenaltyLogitsProcessor over the prompt (its padding ids included) and the tokens so
    far: on the logits for greedy search, on the log-probabilities of each hypothesis for beam search."""
    hf, lm, _ = models
    ids, mask = _prompts(seed=11)
    eos = _stops_some_rows(_hf_generate(hf, ids, mask, max_new_tokens=NEW)[:, P:])
    expected = _hf_generate(hf, ids, mask, max_new_tokens=NEW, eos_token_id=eos, **options)
    np.testing.assert_array_equal(
        lm.generate(ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=eos, **options), expected
    )
    unpenalized = {k: v for k, v in options.items() if k != "repetition_penalty"}
    assert not np.array_equal(
        expected, _hf_generate(hf, ids, mask, max_new_tokens=NEW, eos_token_id=eos, **unpenalized)
    )


def test_repetition_penalty_processor_equals_transformers():
    """The processor alone, as sampling applies it (before the warpers), on scores of both signs, a token repeated
    in a row and the prompt's columns past its length (the bucket's padding) left out."""
    from transformers.generation import logits_process as lp

    from jaxbert.generate import Search, _penalize

    rng = np.random.default_rng(12)
    V = 50
    scores = rng.normal(size=(3, V)).astype(np.float32)
    prompt = rng.integers(0, V, (3, 6))
    tokens = rng.integers(0, V, (3, 5))
    tokens[1, 1] = tokens[1, 0]
    length, t = 4, 3  # columns of the prompt given, tokens chosen so far
    seen = np.concatenate([prompt[:, :length], tokens[:, :t]], axis=1)
    for penalty in (1.7, 0.5):
        expected = lp.RepetitionPenaltyLogitsProcessor(penalty)(torch.as_tensor(seen), torch.as_tensor(scores.copy()))
        got = _penalize(jnp.asarray(scores), jnp.asarray(prompt), length, jnp.asarray(tokens), t,
                        Search(repetition_penalty=penalty))  # fmt: skip
        np.testing.assert_allclose(np.asarray(got), expected.numpy(), rtol=1e-6)
        assert not np.allclose(np.asarray(got), scores)


def test_sampling_is_reproducible_and_respects_top_k_and_top_p(models):
    _, lm, _ = models
    ids, mask = _prompts(seed=3)
    run = lambda **kw: lm.generate(ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=5, **kw)  # noqa: E731
    greedy = run()
    first = run(do_sample=True, seed=0)
    np.testing.assert_array_equal(run(do_sample=True, seed=0), first)
    assert not np.array_equal(run(do_sample=True, seed=1), first)
    assert not np.array_equal(first, greedy)
    np.testing.assert_array_equal(run(do_sample=True, top_k=1, seed=7), greedy)
    # Beyond the vocabulary every token stays, as top_k=0 (and TopKLogitsWarper's min(top_k, V)); beyond int32 it
    # was an OverflowError.
    np.testing.assert_array_equal(run(do_sample=True, top_k=10**12, seed=0), run(do_sample=True, top_k=0, seed=0))
    np.testing.assert_array_equal(run(do_sample=True, top_k=0, top_p=1e-6, seed=7), greedy)
    # 1e-5, not 1e-3: with random biases two of the model's best logits came close enough for 1e-3 to sample either.
    np.testing.assert_array_equal(run(do_sample=True, top_k=0, temperature=1e-5, seed=7), greedy)
    # Temperatures so small that logits / T overflows float32 (1e-45 is subnormal) tend to greedy too.
    for tiny in (1e-40, 1e-45):
        np.testing.assert_array_equal(run(do_sample=True, top_k=0, temperature=tiny, seed=7), greedy)
    # A row's draws do not depend on the rest of the batch (nor on its padding to a batch bucket).
    fewer = lm.generate(ids[:3], attention_mask=mask[:3], max_new_tokens=NEW, eos_token_id=5, do_sample=True)
    np.testing.assert_array_equal(fewer, first[:3, : fewer.shape[1]])
    several = lm.generate(
        ids[:2], attention_mask=mask[:2], max_new_tokens=NEW, eos_token_id=5, do_sample=True, num_return_sequences=2
    )
    assert several.shape[0] == 4 and (several[0] != several[1]).any()
    np.testing.assert_array_equal(several[:, :P], np.repeat(ids[:2], 2, axis=0))


def test_extreme_temperatures_sample_as_their_limits_without_warnings_or_nan(models):
    """A temperature of 1e300 was cast to float32 inf with numpy's overflow warning, and from about 8.5e37 on
    (float32's 1 / tiny) XLA's logits * (1 / T) flushed to 0: an eos at -inf before min_new_tokens became NaN, which
    the draw took as the likeliest token, so every row ended at once. transformers' TemperatureLogitsWarper keeps
    -inf there (uniform over the rest); as small as 1e-300, sampling is greedy."""
    from transformers.generation import logits_process as lp

    _, lm, _ = models
    ids, mask = _prompts(seed=3)
    eos = dict(eos_token_id=5, min_new_tokens=NEW)
    run = lambda t, **kw: lm.generate(ids, attention_mask=mask, max_new_tokens=NEW, temperature=t, **kw)  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hottest = run(1e300, do_sample=True, seed=7, **eos)
        assert hottest.shape == (len(ids), P + NEW) and not (hottest[:, P:] == 5).any(), hottest
        np.testing.assert_array_equal(run(1e38, do_sample=True, seed=7, **eos), hottest)
        greedy = lm.generate(ids, attention_mask=mask, max_new_tokens=NEW, **eos)
        np.testing.assert_array_equal(run(1e-300, do_sample=True, top_k=0, seed=7, **eos), greedy)
    logits = np.random.default_rng(5).normal(size=(2, SIZES["vocab_size"])).astype(np.float32)
    logits[:, 5] = -np.inf
    want = torch.softmax(lp.TemperatureLogitsWarper(1e38)(None, torch.as_tensor(logits)), -1).numpy()
    got = jax.nn.softmax(jax.jit(warp_logits)(jnp.asarray(logits), Warp(jnp.float32(1e38), jnp.int32(0), 1.0)))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)


def test_penalties_beyond_float32_are_infinite_as_in_transformers_without_warnings(models):
    """repetition_penalty / length_penalty 1e300 printed numpy's 'overflow encountered in cast' when JAX cast them
    to float32; torch casts transformers' penalty to inf (a seen token's negative logit -inf, a positive one 0)."""
    hf, lm, _ = models
    ids, mask = _prompts(seed=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = lm.generate(ids, attention_mask=mask, max_new_tokens=NEW, repetition_penalty=1e300)
        beam = dict(attention_mask=mask, max_new_tokens=6, num_beams=2)
        beams = [lm.generate(ids, **beam, length_penalty=lp) for lp in (1e300, 1e38)]  # len ** lp: inf either way
    np.testing.assert_array_equal(got, _hf_generate(hf, ids, mask, max_new_tokens=NEW, repetition_penalty=1e300))
    np.testing.assert_array_equal(*beams)


def test_warpers_equal_transformers():
    """Temperature, top-k, top-p in transformers' order. Ties at the top-k cut all stay, as there; ties across the
    top-p cut are not tested: torch's unstable sort orders them arbitrarily."""
    from transformers.generation import logits_process as lp

    logits = np.random.default_rng(4).normal(size=(5, SIZES["vocab_size"])).astype(np.float32)
    tied = logits.copy()
    tied[:, :3] = -np.sort(-tied, axis=1)[:, 9:10]  # three more tokens equal to the 10th largest
    warp = jax.jit(warp_logits)
    for temperature, top_k, top_p, x in (
        (0.7, 10, 0.9, logits),
        (1.0, 0, 0.5, logits),
        (2.0, 10, 1.0, tied),
        (1.3, 1, 0.3, logits),
        (1.0, 50, 0.95, logits),
    ):
        scores = torch.as_tensor(x)
        for warper in (
            lp.TemperatureLogitsWarper(temperature),
            top_k and lp.TopKLogitsWarper(top_k),
            top_p < 1 and lp.TopPLogitsWarper(top_p),
        ):
            scores = warper(None, scores) if warper else scores
        got = warp(jnp.asarray(x), Warp(jnp.float32(temperature), jnp.int32(top_k), jnp.float32(top_p)))
        np.testing.assert_array_equal(np.isinf(np.asarray(got)), np.isinf(scores.numpy()))
        np.testing.assert_allclose(np.asarray(got), scores.numpy(), rtol=1e-6)


def test_one_program_per_bucket_whatever_the_prompt_length_batch_and_max_new_tokens(models):
    hf, lm, _ = models
    ids, mask = _prompts(seed=5)
    lm.generate(ids[:3, 2:], attention_mask=mask[:3, 2:], max_new_tokens=3, eos_token_id=[1, 2])
    before = lm.compile_count
    outputs = {}
    for rows, start, n in ((4, 0, 9), (3, 4, 5), (4, 3, 16), (3, 1, 1), (4, 0, 2)):
        outputs[rows, start, n] = lm.generate(
            ids[:rows, start:], attention_mask=mask[:rows, start:], max_new_tokens=n, eos_token_id=[1, 2]
        )
    assert lm.compile_count == before  # prompt bucket 16, batch bucket 4, new-token bucket 16 throughout
    np.testing.assert_array_equal(outputs[4, 0, 2], outputs[4, 0, 9][:, : P + 2])
    expected = _hf_generate(hf, ids[:3, 4:], mask[:3, 4:], max_new_tokens=5, eos_token_id=[1, 2])
    np.testing.assert_array_equal(outputs[3, 4, 5], expected)


def test_defaults_come_from_generation_config_json(models, tmp_path):
    hf, lm, directory = models
    copy = tmp_path / "lm"
    shutil.copytree(directory, copy)
    ids, mask = _prompts(seed=6)
    eos = _stops_some_rows(_hf_generate(hf, ids, max_new_tokens=6)[:, P:])
    settings = {"eos_token_id": [eos], "max_new_tokens": 6, "min_length": P + 1}
    (copy / "generation_config.json").write_text(json.dumps(settings))
    # transformers 5 reads the special tokens from generation_config.json alone: config.json's pad_token_id 0
    # stays unused, so eos pads the finished rows and no mask is inferred from the prompt's 0s (jaxbert took the
    # 0 from config.json: it padded with 0 and masked the 0s, other tokens in the rows it masked).
    expected = _hf_generate(transformers.BertLMHeadModel.from_pretrained(copy).eval(), ids)
    np.testing.assert_array_equal(jaxbert.load(copy).generate(ids), expected)
    assert expected[0, -1] == eos
    (copy / "generation_config.json").write_text(json.dumps({"encoder_repetition_penalty": 1.3}))
    with pytest.raises(ValueError, match="encoder_repetition_penalty=1.3 is not implemented"):
        jaxbert.load(copy).generate(ids)
    # repetition_penalty is implemented: read from the file as transformers reads it
    (copy / "generation_config.json").write_text(json.dumps({"repetition_penalty": 1.3, "max_new_tokens": 6}))
    expected = _hf_generate(transformers.BertLMHeadModel.from_pretrained(copy).eval(), ids, mask)
    np.testing.assert_array_equal(jaxbert.load(copy).generate(ids, attention_mask=mask), expected)
    # Settings that change transformers' output are refused by name (they were ignored: greedy tokens differed).
    for key, value in (("guidance_scale", 1.5), ("watermarking_config", {"bias": 2.0}), ("top_h", 0.01),
                       ("penalty_alpha", 0.6), ("max_time", 1.0), ("token_healing", True)):  # fmt: skip
        (copy / "generation_config.json").write_text(json.dumps({key: value}))
        with pytest.raises(ValueError, match=f"{key}={value!r} is not implemented"):
            jaxbert.load(copy).generate(ids)
    # Values that change nothing, and sampling settings under greedy search, are ignored as transformers does.
    greedy = lm.generate(ids, attention_mask=mask, max_new_tokens=6)
    same = {"min_new_tokens": 0, "suppress_tokens": [], "guidance_scale": 1.0, "max_length": None}
    same.update(temperature=0.0, top_p=0.0, top_k=-1, do_sample=False, max_new_tokens=6)
    (copy / "generation_config.json").write_text(json.dumps(same))
    np.testing.assert_array_equal(jaxbert.load(copy).generate(ids, attention_mask=mask), greedy)


def test_no_room_for_new_tokens_names_what_set_the_length(models, tmp_path):
    """Without max_new_tokens, a prompt that fills the positions, or a generation config's max_length not beyond
    the prompt (transformers refuses both), was reported as 'max_new_tokens 0' / '-1', a setting never given."""
    _, lm, directory = models
    ids = np.random.default_rng(7).integers(1, SIZES["vocab_size"], (1, 40))
    with pytest.raises(ValueError, match="^prompt length 40 fills max_position_embeddings 40: no room for new"):
        lm.generate(ids)
    copy = tmp_path / "lm"
    shutil.copytree(directory, copy)
    (copy / "generation_config.json").write_text(json.dumps({"max_length": 5}))
    with pytest.raises(ValueError, match="^max_length 5 .*generation_config.json.* prompt length 6"):
        jaxbert.load(copy).generate(ids[:, :6])
    np.testing.assert_array_equal(jaxbert.load(copy).generate(ids[:, :3]), lm.generate(ids[:, :3], max_new_tokens=2))


def test_a_row_with_every_token_masked_is_refused(models):
    """transformers attends a fully masked row uniformly over its columns; jaxbert's prompt bucket added its padding
    columns to that average, so such a row generated other tokens than transformers' (prompt length 5, bucket 16).
    One real token is enough."""
    hf, lm, _ = models
    ids, mask = _prompts(seed=8)
    ids, mask = ids[:, 3:], mask[:, 3:].copy()
    mask[1, :-1], ids[1, :-1] = 0, 0
    np.testing.assert_array_equal(
        lm.generate(ids, attention_mask=mask, max_new_tokens=4), _hf_generate(hf, ids, mask, max_new_tokens=4)
    )
    mask[1] = 0
    with pytest.raises(ValueError, match="^attention_mask row 1 masks every token: nothing to generate from$"):
        lm.generate(ids, attention_mask=mask, max_new_tokens=4)
    ids[1] = 0  # all pad tokens, no mask given: transformers infers the same all-zero row
    with pytest.raises(ValueError, match="^attention_mask row 1 .inferred from pad_token_id 0. masks every token"):
        lm.generate(ids, max_new_tokens=4)


def test_the_step_function_is_model_agnostic():
    """A bigram table as the model, a cache that only counts: greedy decoding follows the table's argmax chain."""
    import flax.struct

    @flax.struct.dataclass
    class Counter:
        index: jax.Array

        def reorder(self, rows):
            return Counter(self.index[rows])

    table = jax.random.normal(jax.random.key(0), (11, 11))
    step = lambda cache, ids, mask, pos: (table[ids], cache.replace(index=cache.index + ids.shape[1]))  # noqa: E731
    ids = jnp.array([[3, 0, 0]])  # one real token, then the bucket's padding
    tokens, steps = decode(
        step,
        Counter(jnp.zeros(1, jnp.int32)),
        ids,
        jnp.array([[1, 0, 0]]),
        jnp.zeros_like(ids),
        jnp.int32(1),
        jnp.int32(5),
        jnp.array([True]),
        search=Search(eos=(), pad=None),
        bound=8,
    )
    chain, expected = 3, []
    for _ in range(5):
        chain = int(jnp.argmax(table[chain]))
        expected.append(chain)
    assert int(steps) == 5 and np.asarray(tokens)[0, :5].tolist() == expected


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(max_new_tokens=0), ValueError, "max_new_tokens 0: must be ≥ 1"),
        (dict(max_new_tokens=2.5), TypeError, "max_new_tokens must be an integer"),
        (
            dict(max_new_tokens=40 - P + 1),
            ValueError,
            "prompt length 8 \\+ max_new_tokens 33 = 41 exceeds max_position",
        ),
        (dict(num_beams=0), ValueError, "num_beams 0: must be ≥ 1"),
        (dict(num_beams=2, do_sample=True), ValueError, "do_sample=True with num_beams=2: beam-search sampling"),
        (dict(num_beams=2, num_return_sequences=3), ValueError, "num_return_sequences 3: must be in \\[1, 2\\]"),
        (dict(num_return_sequences=2), ValueError, "num_return_sequences 2: greedy search returns one"),
        (dict(do_sample=True, temperature=0.0), ValueError, "temperature 0.0: must be in \\(0"),
        # inf is refused: the message named it allowed ("(0.0, inf]")
        (dict(do_sample=True, temperature=float("inf")), ValueError, "temperature inf: must be in \\(0.0, inf\\)$"),
        (dict(do_sample=True, top_p=0.0), ValueError, "top_p 0.0: must be in \\(0, 1\\]"),
        (dict(do_sample=True, top_p=1.5), ValueError, "top_p 1.5: must be in \\(0, 1\\]"),
        (dict(do_sample=True, top_k=-1), ValueError, "top_k -1: must be an integer ≥ 0"),
        (dict(num_beams=2, early_stopping="soon"), ValueError, "early_stopping 'soon'"),
        (dict(min_new_tokens=-1, eos_token_id=5), ValueError, "min_new_tokens -1: must be an integer ≥ 0"),
        (dict(no_repeat_ngram_size=-2), ValueError, "no_repeat_ngram_size -2: must be an integer ≥ 0"),
        (dict(repetition_penalty=0.0), ValueError, r"repetition_penalty 0.0: must be in \(0.0, inf\)"),
        (dict(repetition_penalty=-1), ValueError, r"repetition_penalty -1: must be in \(0.0, inf\)"),
        (dict(repetition_penalty="1.2"), TypeError, "repetition_penalty must be a number, got str '1.2'"),
        (dict(min_length=2.0, eos_token_id=5), ValueError, "min_length 2.0: must be an integer ≥ 0"),
        (dict(eos_token_id=[3, 97]), ValueError, "eos_token_id \\[3, 97\\]: token ids must be integers in \\[0, vocab"),
        (dict(length_penalty=float("nan"), num_beams=2), ValueError, "length_penalty nan"),
        # not a list: tuple(True) was a TypeError naming no setting ("'bool' object is not iterable")
        (dict(eos_token_id=True), ValueError, "eos_token_id True: token ids must be integers in \\[0, vocab"),
        (dict(eos_token_id=5.0), ValueError, "eos_token_id 5.0: token ids must be integers in \\[0, vocab"),
        # one id each: a list was cut to its first id (transformers fails on a pad list)
        (dict(pad_token_id=[1, 2], eos_token_id=5), ValueError, "pad_token_id \\[1, 2\\]: must be one token id"),
        # JAX's keys hold 32 bits: 2**32 + 7 sampled as 7 did; 2**63 was an OverflowError traceback
        (dict(do_sample=True, seed=2**32 + 7), ValueError, "seed 4294967303: must be in \\[0, 4294967295\\]"),
        (dict(do_sample=True, seed=2**63), ValueError, "seed 9223372036854775808: must be in"),
        (dict(do_sample=True, seed=-1), ValueError, "seed -1: must be in"),
    ],
)
def test_bad_arguments_are_one_line_errors_naming_the_value(models, kwargs, error, match):
    _, lm, _ = models
    ids, mask = _prompts()
    with pytest.raises(error, match=match) as info:
        lm.generate(ids, attention_mask=mask, **kwargs)
    assert "\n" not in str(info.value)


def test_bad_prompts_and_models_are_refused(models):
    _, lm, directory = models
    with pytest.raises(ValueError, match="token id 97 at position \\(0, 1\\) is outside"):
        lm.generate(np.array([[1, 97]]))
    with pytest.raises(ValueError, match="^prompt_ids must be 2-D"):
        lm.generate(np.array([1, 2]))
    with pytest.raises(ValueError, match="no bos_token_id"):
        lm.generate(None)
    with pytest.raises(ValueError, match="generate needs a causal LM .* this is BertForMaskedLM"):
        jaxbert.load(directory, head="BertForMaskedLM").generate(np.array([[1, 2]]))
    encoder = jaxbert.Bert(lm.config.replace(is_decoder=False), lm.params, "BertLMHeadModel")
    with pytest.raises(ValueError, match="BertLMHeadModel with is_decoder=false"):
        encoder.generate(np.array([[1, 2]]))


def test_a_search_that_cannot_fit_is_refused_before_compiling(models, monkeypatch):
    """transformers bounds neither num_beams nor num_return_sequences; jaxbert's num_beams 2**25 failed in JAX's
    top_k ('top_k returns int32 indices, which will overflow ...', naming no setting) and one whose decoding state
    outgrew memory was allocated until XLA refused it or the process was killed. Both are one line now, before any
    work: beams × vocab beyond top_k's int32 indices; rows × beams whose key/value cache and scores alone exceed the
    devices' memory (the host's: 4 prompts × 2**22 samples; or a memory made small here)."""
    from jaxbert import generate_inputs

    _, lm, _ = models
    ids, mask = _prompts()
    with pytest.raises(ValueError, match=r"^num_beams 33554432: beam search ranks num_beams × vocab_size = "):
        lm.generate(ids, attention_mask=mask, num_beams=2**25, max_new_tokens=NEW)
    huge = dict(do_sample=True, num_return_sequences=2**22, max_new_tokens=NEW)
    with pytest.raises(ValueError, match=r"^16777216 rows \(prompts × num_return_sequences, .* GiB \(key/value cache"):
        lm.generate(ids, attention_mask=mask, **huge)
    monkeypatch.setattr(generate_inputs, "device_memory", lambda: 2**20)
    with pytest.raises(ValueError, match=r"^4 rows .* × num_beams 64: decoding needs at least 0\.0 GiB .* 0\.0 GiB$"):
        lm.generate(ids, attention_mask=mask, num_beams=64, max_new_tokens=NEW)
    assert lm.generate(ids, attention_mask=mask, num_beams=2, max_new_tokens=NEW).shape == (4, P + NEW)
