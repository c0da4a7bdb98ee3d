"""`jaxbert generate DIR "prompt"`: the text transformers would produce from the same checkpoint and prompt."""

import json
import shutil
import warnings

import jax
import numpy as np
import pytest
from conftest import cli_fails, cli_refuses, model_dir

import jaxbert
from jaxbert.cli import main

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
PROMPT = "the weather in paris is"


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory):
    # Two layers, not conftest's three: decoding runs the layers unrolled, and compiling each layer's prefill and
    # step was most of this file's time; two still give the cache a second layer's slots.
    return model_dir(tmp_path_factory.mktemp("lm"), "BertLMHeadModel", is_decoder=True, num_hidden_layers=2)


def _reference(directory, prompt, **kwargs) -> list[str]:
    """transformers: [CLS] + the prompt's tokens (its closing [SEP] dropped), generate, decode without specials."""
    tok = transformers.AutoTokenizer.from_pretrained(directory)
    model = transformers.BertLMHeadModel.from_pretrained(directory, attn_implementation="eager").eval()
    ids = torch.tensor([tok(prompt)["input_ids"][:-1]])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), pad_token_id=0, **kwargs)
    return [tok.decode(row, skip_special_tokens=True) for row in out]


def _lines(capsys, *args) -> list[str]:
    rc = main(["generate", *map(str, args)])
    out, err = capsys.readouterr()
    assert rc == 0, err
    return out.rstrip("\n").split("\n")


@pytest.mark.parametrize(
    "options, kwargs",
    [
        ((), dict(max_new_tokens=20, do_sample=False)),
        (
            ("--max-new-tokens", 7, "--num-beams", 3, "--num-return-sequences", 2),
            dict(max_new_tokens=7, num_beams=3, num_return_sequences=2, do_sample=False),
        ),
        (
            ("--repetition-penalty", 1.6, "--no-repeat-ngram-size", 2, "--min-new-tokens", 3),
            dict(repetition_penalty=1.6, no_repeat_ngram_size=2, min_new_tokens=3, do_sample=False),
        ),
        (
            ("--num-beams", 2, "--length-penalty", -1.0, "--max-new-tokens", 9, "--repetition-penalty", 1.3),
            dict(num_beams=2, length_penalty=-1.0, max_new_tokens=9, repetition_penalty=1.3, do_sample=False),
        ),
    ],
)
def test_generate_prints_what_transformers_generates(lm_dir, capsys, options, kwargs):
    lines = _lines(capsys, lm_dir, PROMPT, *options)
    assert lines == _reference(lm_dir, PROMPT, **kwargs)
    assert all(line.startswith(PROMPT) and len(line) > len(PROMPT) for line in lines)


def test_sampling_is_reproducible_from_the_seed(lm_dir, capsys):
    args = (lm_dir, PROMPT, "--do-sample", "--temperature", 2.0, "--top-k", 0, "--max-new-tokens", 12)
    first = _lines(capsys, *args, "--seed", 3)
    assert _lines(capsys, *args, "--seed", 3) == first
    assert _lines(capsys, *args, "--seed", 4) != first


def test_a_top_k_beyond_int32_keeps_every_token(lm_dir, capsys):
    # --top-k 1000000000000 printed a traceback ending in "OverflowError: Python integer 1000000000000 out of bounds
    # for int32"; transformers' TopKLogitsWarper keeps min(top_k, vocabulary) tokens, as --top-k 0 keeps all.
    args = (lm_dir, PROMPT, "--do-sample", "--max-new-tokens", 6, "--top-k")
    assert _lines(capsys, *args, 10**12) == _lines(capsys, *args, 0)


def test_a_repetition_penalty_beyond_float32_prints_no_warning(lm_dir, capsys):
    # numpy's "RuntimeWarning: overflow encountered in cast" and its source line came before the text.
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        got = _lines(capsys, lm_dir, PROMPT, "--repetition-penalty", "1e300", "--max-new-tokens", 8)
    assert not shown, [str(w.message) for w in shown]
    assert got == _reference(lm_dir, PROMPT, repetition_penalty=1e300, max_new_tokens=8, do_sample=False)


def test_extreme_temperatures_print_no_warning(lm_dir, capsys):
    """--temperature 1e300 printed numpy's 'RuntimeWarning: overflow encountered in cast' (and its source line) on
    stderr: it now samples as any temperature of 2**126 or more (uniform), and 1e-300 as greedy search."""
    for temperature, same in ((1e300, ("--temperature", 1e38)), (1e-300, ())):
        with warnings.catch_warnings(record=True) as shown:  # what would reach stderr outside pytest
            warnings.simplefilter("always")
            rc = main(["generate", lm_dir, PROMPT, "--do-sample", "--temperature", str(temperature), "--top-k", "0"])
        out, err = capsys.readouterr()
        assert rc == 0 and err == "" and not shown, [str(w.message) for w in shown]
        expected = _lines(capsys, lm_dir, PROMPT, *(("--do-sample", "--top-k", 0, *same) if same else ()))
        assert out.rstrip("\n").split("\n") == expected


@pytest.mark.parametrize(
    "args, match",
    [
        (("--max-new-tokens", 500), "prompt length 6 + --max-new-tokens 500 = 506 exceeds max_position_embeddings 40"),
        # Without sampling they changed nothing, and the greedy text was printed as if they had.
        (("--temperature", 0.5), "--temperature: applies to sampling only"),
        (("--top-k", 3, "--top-p", 0.9, "--num-beams", 2), "--top-k, --top-p: applies to sampling only"),
        (("--length-penalty", 2.0), "--length-penalty: applies to beam search only"),
    ],
)
def test_bad_options_are_one_line_errors(lm_dir, capsys, tmp_path, args, match):
    cli_fails(capsys, tmp_path, "generate", lm_dir, PROMPT, *args, match=match)


@pytest.mark.parametrize(
    "args, match",
    [
        (("--max-new-tokens", 0), "argument --max-new-tokens: must be at least 1, got 0"),
        (("--num-beams", 0), "argument --num-beams: must be at least 1, got 0"),
        (("--top-p", 1.5, "--do-sample"), "argument --top-p: must be a finite number in (0, 1], got 1.5"),
        (("--repetition-penalty", 0), "argument --repetition-penalty: must be a finite number > 0, got 0"),
    ],
)
def test_options_out_of_their_fixed_bounds_are_refused_by_argparse(lm_dir, capsys, args, match):
    cli_refuses(capsys, "generate", lm_dir, PROMPT, *args, match=match)


def test_an_encoder_checkpoint_cannot_generate(tmp_path, capsys):
    encoder = model_dir(tmp_path / "enc", "BertForMaskedLM")
    capsys.readouterr()  # transformers' save progress bar
    cli_fails(capsys, tmp_path, "generate", encoder, PROMPT, match="generate needs a causal LM")


def test_convert_verify_compares_greedy_generation(lm_dir, tmp_path, capsys, monkeypatch):
    assert main(["convert", lm_dir, str(tmp_path / "jax"), "--verify"]) == 0
    out = capsys.readouterr().out
    assert "verify logits" in out and "verify greedy tokens            0 differ ok" in out
    original = jaxbert.inference.Bert.generate

    def off_by_one(self, *args, **kwargs):  # a generation that goes wrong at its last token
        ids = original(self, *args, **kwargs)
        ids[:, -1] = (ids[:, -1] + 1) % self.config.vocab_size
        return ids

    monkeypatch.setattr(jaxbert.inference.Bert, "generate", off_by_one)
    assert main(["convert", lm_dir, str(tmp_path / "jax"), "--verify", "--force"]) == 1
    out, err = capsys.readouterr()
    assert "verify greedy tokens            1 differ FAILED" in out and "differ from PyTorch" in err
    assert main(["convert", lm_dir, str(tmp_path / "other"), "--verify"]) == 1
    assert not (tmp_path / "other").exists()


@pytest.fixture(scope="module")
def bert2bert_dir(tmp_path_factory):
    """A random bert2bert (decoder narrower than the encoder: with enc_to_dec_proj) and MiniLM's tokenizer."""
    directory = tmp_path_factory.mktemp("s2s")
    model_dir(directory, "BertModel")  # for the tokenizer files; the weights are replaced below
    torch.manual_seed(0)
    sizes = dict(
        vocab_size=30522,
        num_hidden_layers=1,  # a layer a side, as conftest's bert2bert_dir: the CLI is the point, not the depth
        intermediate_size=37,
        max_position_embeddings=40,
        attn_implementation="eager",
    )
    enc = transformers.BertConfig(hidden_size=32, num_attention_heads=4, **sizes)
    dec = transformers.BertConfig(
        hidden_size=24, num_attention_heads=3, is_decoder=True, add_cross_attention=True, **sizes
    )
    config = transformers.EncoderDecoderConfig.from_encoder_decoder_configs(
        enc, dec, decoder_start_token_id=101, pad_token_id=0
    )
    transformers.EncoderDecoderModel(config=config).eval().save_pretrained(directory)
    return str(directory)


def test_bert2bert_prints_what_transformers_generates(bert2bert_dir, capsys):
    tok = transformers.AutoTokenizer.from_pretrained(bert2bert_dir)
    model = transformers.EncoderDecoderModel.from_pretrained(bert2bert_dir).eval()
    feed = tok(PROMPT, return_tensors="pt")
    for options, kwargs in [((), {}), (("--num-beams", 3, "--max-new-tokens", 6), dict(num_beams=3, max_new_tokens=6))]:
        with torch.no_grad():
            out = model.generate(feed["input_ids"], attention_mask=feed["attention_mask"], do_sample=False, **kwargs)
        lines = _lines(capsys, bert2bert_dir, PROMPT, *options)
        assert lines == [tok.decode(out[0], skip_special_tokens=True)] and lines[0].strip()


def test_generation_config_travels_through_convert_and_export(lm_dir, tmp_path, capsys):
    src = tmp_path / "src"
    shutil.copytree(lm_dir, src)
    (src / "generation_config.json").write_text(json.dumps({"max_new_tokens": 3, "num_beams": 2}))
    assert main(["convert", str(src), str(tmp_path / "jax")]) == 0
    assert main(["export", str(tmp_path / "jax"), str(tmp_path / "pt")]) == 0
    assert "generation_config.json" in capsys.readouterr().out
    prompt = np.array([[101, 2054, 2003]])
    for d in (tmp_path / "jax", tmp_path / "pt"):
        model = jaxbert.load(d)
        assert model.generate(prompt).shape == (1, 6)  # 3 new tokens by default, from the file
        np.testing.assert_array_equal(model.generate(prompt), model.generate(prompt, num_beams=2, max_new_tokens=3))


def test_bert2bert_in_bfloat16_casts_the_projection_too(bert2bert_dir):
    full, half = jaxbert.load(bert2bert_dir), jaxbert.load(bert2bert_dir, dtype="bfloat16")
    assert {str(a.dtype) for a in jax.tree_util.tree_leaves(half.proj)} == {"bfloat16"}
    ids = np.array([[101, 2054, 2003, 102]])
    dec = np.array([[101, 7592]])
    expected, got = full(ids, decoder_input_ids=dec).logits, half(ids, decoder_input_ids=dec).logits
    assert np.abs(np.asarray(got, np.float32) - expected).max() <= 2e-2 * max(1.0, np.abs(expected).max())
    assert half.generate(ids, max_new_tokens=4).shape == (1, 5)
