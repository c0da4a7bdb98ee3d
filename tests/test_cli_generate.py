"""`jaxbert generate DIR "prompt"`: the text transformers would produce from the same checkpoint and prompt."""

import pytest

import jaxbert

from conftest import cli_fails, model_dir
from jaxbert.cli import main

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
PROMPT = "the weather in paris is"


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory):
    return model_dir(tmp_path_factory.mktemp("lm"), "BertLMHeadModel", is_decoder=True)


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


@pytest.mark.parametrize("options, kwargs", [
    ((), dict(max_new_tokens=20, do_sample=False)),
    (("--max-new-tokens", 7, "--num-beams", 3, "--num-return-sequences", 2),
     dict(max_new_tokens=7, num_beams=3, num_return_sequences=2, do_sample=False)),
])
def test_generate_prints_what_transformers_generates(lm_dir, capsys, options, kwargs):
    lines = _lines(capsys, lm_dir, PROMPT, *options)
    assert lines == _reference(lm_dir, PROMPT, **kwargs)
    assert all(line.startswith(PROMPT) and len(line) > len(PROMPT) for line in lines)


def test_sampling_is_reproducible_from_the_seed(lm_dir, capsys):
    args = (lm_dir, PROMPT, "--do-sample", "--temperature", 2.0, "--top-k", 0, "--max-new-tokens", 12)
    first = _lines(capsys, *args, "--seed", 3)
    assert _lines(capsys, *args, "--seed", 3) == first
    assert _lines(capsys, *args, "--seed", 4) != first


@pytest.mark.parametrize("args, match", [
    (("--max-new-tokens", 0), "max_new_tokens 0: must be ≥ 1"),
    (("--num-beams", 0), "num_beams"),
    (("--max-new-tokens", 500), "exceeds max_position_embeddings 40"),
    (("--top-p", 1.5, "--do-sample"), "top_p"),
])
def test_bad_options_are_one_line_errors(lm_dir, capsys, tmp_path, args, match):
    cli_fails(capsys, tmp_path, "generate", lm_dir, PROMPT, *args, match=match)


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
