"""No silent wrong answers: concurrent calls on one `Bert`, weights that are not finite floats, config numbers
out of range, casts that overflow, arrays of the wrong type or shape, arguments of the wrong type."""

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from conftest import cli_fails, model_dir
from safetensors.numpy import load_file, save_file

import jaxbert

torch = pytest.importorskip("torch")


def _model_dir(directory, head="BertModel"):
    return model_dir(directory, head, max_position_embeddings=64)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return _model_dir(tmp_path_factory.mktemp("tiny"))


@pytest.fixture
def src(tmp_path):
    return Path(_model_dir(tmp_path / "src"))


def _rewrite(src, change):
    state = load_file(src / "model.safetensors")
    change(state)
    save_file(state, src / "model.safetensors", metadata={"format": "pt"})


def _edit_config(src, **changes):
    path = src / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_one_bert_from_many_threads_gives_the_sequential_answers(tiny):
    bert = jaxbert.load(tiny)
    words = "the quick brown fox jumps over the lazy dog while a cat sleeps on the warm mat".split()
    texts = [[" ".join(words[: 3 + (i * 7 + j) % 14] * (1 + j % 4)) for j in range(6)] for i in range(24)]
    calls = [(group, (8, 16, None)[i % 3]) for i, group in enumerate(texts)]

    def run(call):
        group, max_length = call
        return bert.embed(group, pooling="mean", max_length=max_length), bert.tokenizer(group, max_length=max_length)

    expected = [run(call) for call in calls]
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(run, calls * 3))
    for (emb, feed), (want_emb, want_feed) in zip(got, expected * 3):
        np.testing.assert_array_equal(feed["input_ids"], want_feed["input_ids"])
        np.testing.assert_allclose(emb, want_emb, atol=1e-6)


def test_integer_and_non_finite_weights_are_refused(src, tmp_path, capsys):
    key = "embeddings.word_embeddings.weight"
    good = load_file(src / "model.safetensors")[key]
    _rewrite(src, lambda s: s.update({key: s[key].astype(np.int32)}))
    cli_fails(capsys, tmp_path, "convert", src, match=f"{key}: dtype int32, but parameters must be floating point")
    bad = good.copy()
    bad[5, 3] = np.nan
    _rewrite(src, lambda s: s.update({key: bad}))
    cli_fails(capsys, tmp_path, "convert", src, match=f"{key}: non-finite value nan at index (5, 3)")


@pytest.mark.parametrize(
    "field,value",
    [
        ("layer_norm_eps", "NaN"),
        ("layer_norm_eps", "Infinity"),
        ("layer_norm_eps", "0"),
        ("initializer_range", "-Infinity"),
        ("hidden_dropout_prob", "NaN"),
        ("attention_probs_dropout_prob", "1.5"),
        ("hidden_size", "32.0"),
        ("num_hidden_layers", "true"),
        ("vocab_size", "1e400"),
        ("pad_token_id", '"0"'),  # null is transformers' "no padding_idx": test_parity
        ("hidden_act", "7"),
        ("tie_word_embeddings", "1"),
    ],
)
def test_config_numbers_and_types_are_checked(src, tmp_path, capsys, field, value):
    text = (src / "config.json").read_text()
    config = json.loads(text)
    (src / "config.json").write_text(text.replace(f'"{field}": {json.dumps(config[field])}', f'"{field}": {value}'))
    assert (src / "config.json").read_text() != text
    cli_fails(capsys, tmp_path, "convert", src, match=f"config.json: BertConfig.{field}=")


@pytest.mark.parametrize(
    "field,value,why",
    [
        ("id2label", ["a", "b"], "must be an object of label index -> label name"),
        ("id2label", {"0": "a", "2": "b"}, "label indices must be 0, 1, ..., num_labels - 1"),
        ("label2id", {"a": "zero"}, "must be an object of label name -> label index"),
        ("pruned_heads", [1, 2], "must be an object of layer index -> list of head indices"),
        ("pruned_heads", {"0": "1"}, "must be an object of layer index -> list of head indices"),
        ("architectures", "BertModel", "must be a list of class names"),
        ("num_labels", "3", "must be a positive integer"),
    ],
)
def test_config_fields_of_the_wrong_json_type_are_named(src, tmp_path, capsys, field, value, why):
    _edit_config(src, **{field: value}, **({"id2label": None} if field == "num_labels" else {}))
    line = cli_fails(capsys, tmp_path, "info", src, match=why)
    assert f"config.json: BertConfig.{field}=" in line


def test_a_cast_that_overflows_float16_is_refused(src, tmp_path, capsys):
    key = "encoder.layer.1.output.dense.weight"
    _rewrite(src, lambda s: s[key].__setitem__((2, 3), -7e4))
    cli_fails(
        capsys,
        tmp_path,
        "convert",
        src,
        "--dtype",
        "float16",
        match="encoder/layer/1/output/dense/kernel: largest magnitude 70000 overflows float16 (max 65504)",
    )
    with pytest.raises(ValueError, match="encoder/layer/1/output/dense/kernel: largest magnitude 70000"):
        jaxbert.load(src, dtype="float16")
    assert jaxbert.load(src, dtype="bfloat16").params_dtype == np.dtype("bfloat16")


def test_arrays_of_the_wrong_type_or_shape_are_refused(tiny):
    bert = jaxbert.load(tiny)
    feed = bert.tokenizer(["a short text", "a longer text than the first one"])
    ids, mask, types = feed["input_ids"], feed["attention_mask"], feed["token_type_ids"]
    with pytest.raises(TypeError, match="token_type_ids must be integers"):
        bert(ids, mask, types.astype(np.float32))
    with pytest.raises(TypeError, match="input_ids must be integers, got dtype float64"):
        bert(ids.astype(np.float64))
    with pytest.raises(ValueError, match=r"attention mask value 2 at position \(0, 1\) is outside \[0, 2\)"):
        bert(ids, np.where(np.arange(ids.shape[1]) == 1, 2, mask))
    np.testing.assert_array_equal(bert(ids, mask.astype(bool)).last_hidden_state, bert(ids, mask).last_hidden_state)
    with pytest.raises(ValueError, match=r"input_ids must be 2-D \[batch, length\], got shape \(7,\) \(wrap"):
        bert(ids[0, :7])
    with pytest.raises(ValueError, match=r"input_ids must be 2-D \[batch, length\], got shape \(1, 2, 7\)"):
        bert(ids[None, :, :7])
    with pytest.raises(ValueError, match=r"input_ids is empty: shape \(0, 7\)"):
        bert(ids[:0, :7])
    with pytest.raises(ValueError, match=r"input_ids is empty: shape \(2, 0\)"):
        bert(ids[:, :0])


def test_float_and_bool_attention_masks_are_read_as_transformers_reads_them(tiny):
    """A 0./1. float mask (a tokenizer's mask cast to float, as many training loops feed it) and a bool one give
    transformers' outputs for that mask; jaxbert refused any float mask ('attention_mask must be integers or
    booleans, got dtype float32'). A float that is not exactly 0 or 1 (which the int cast would truncate) is one
    line naming it and its position."""
    import transformers

    bert = jaxbert.load(tiny)
    hf = transformers.BertModel.from_pretrained(tiny, attn_implementation="eager").eval()
    feed = bert.tokenizer(["a short text", "a longer text than the first one"])
    ids, mask = feed["input_ids"], feed["attention_mask"]
    for given in (mask.astype(np.float32), mask.astype(np.float64), mask.astype(bool), torch.tensor(mask).float()):
        with torch.no_grad():
            want = hf(torch.tensor(ids), attention_mask=torch.as_tensor(np.asarray(given))).last_hidden_state
        got = np.asarray(bert(ids, given).last_hidden_state)
        np.testing.assert_allclose(got[mask == 1], want.numpy()[mask == 1], atol=1e-5)
    for bad, shown in ((0.5, "0.5"), (np.nan, "nan"), (-1.0, "-1.0")):
        wrong = np.where(np.arange(ids.shape[1]) == 2, bad, mask.astype(np.float32))
        with pytest.raises(ValueError, match=rf"^attention mask value {shown} at position \(0, 2\) is not 0 or 1$"):
            bert(ids, wrong)


@pytest.mark.parametrize(
    "value,error", [(0, ValueError), (-1, ValueError), (2.0, TypeError), ("8", TypeError), (True, TypeError)]
)
def test_batch_size_top_k_and_max_length_must_be_positive_integers(tiny, tmp_path, value, error):
    bert = jaxbert.load(tiny)
    with pytest.raises(error, match=f"batch_size {value}: must be|batch_size must be an integer"):
        bert.embed(["text"], batch_size=value)
    with pytest.raises(error, match="max_length"):
        bert.embed(["text"], max_length=value)
    with pytest.raises(error, match="max_length"):
        bert.tokenizer.encode(["text"], max_length=value)
    _model_dir(tmp_path / "cls", "BertForSequenceClassification")
    _model_dir(tmp_path / "tag", "BertForTokenClassification")
    _model_dir(tmp_path / "mlm", "BertForMaskedLM")
    with pytest.raises(error, match="batch_size"):
        jaxbert.load(tmp_path / "cls").classify(["text"], batch_size=value)
    with pytest.raises(error, match="batch_size"):
        jaxbert.load(tmp_path / "tag").tag(["text"], batch_size=value)
    with pytest.raises(error, match="top_k"):
        jaxbert.load(tmp_path / "mlm").fill_mask("a [MASK] text", top_k=value)
    qa = jaxbert.load(model_dir(tmp_path / "qa", "BertForQuestionAnswering", max_position_embeddings=64, num_labels=2))
    with pytest.raises(error, match="batch_size"):  # was batching's check: a float or string unnamed, True taken
        qa.answer("Who lives here?", "Anna lives here.", batch_size=value)


@pytest.mark.parametrize("task", ["sequence-classification", "token-classification", "embedding"])
def test_evaluate_refuses_token_ids_beyond_the_vocabulary(tmp_path, capsys, task):
    """A tokenizer of 30522 ids on a model of 97 embeddings: evaluate scored it without a word (JAX clamps a
    gather out of range, every such token read as the last row), where inference names the id."""
    head = {"embedding": "BertModel", "token-classification": "BertForTokenClassification"}
    directory = model_dir(tmp_path / "model", head.get(task, "BertForSequenceClassification"), vocab_size=97)
    rows = {
        "sequence-classification": {"text": "a cat", "label": "LABEL_1"},
        "token-classification": {"tokens": ["a", "cat"], "ner_tags": ["LABEL_1", "LABEL_0"]},
        "embedding": {"anchor": "a cat", "positive": "the dog"},
    }[task]
    (tmp_path / "rows.jsonl").write_text(json.dumps(rows) + "\n")
    capsys.readouterr()
    args = ["evaluate", directory, "--task", task, "--file", tmp_path / "rows.jsonl", "--output", tmp_path / "m.json"]
    cli_fails(capsys, tmp_path, *args, match=f"{tmp_path / 'rows.jsonl'}:1: token id 101 is outside")
    assert not (tmp_path / "m.json").exists()


class _Spy:
    """A tokenizers.Tokenizer that refuses texts (or pairs) of 100,000 characters or more: fails at once where
    tokenizing them would take GBs."""

    def __init__(self, tok):
        self.tok = tok

    def __getattr__(self, name):
        return getattr(self.tok, name)

    @staticmethod
    def _check(item):
        size = sum(map(len, item)) if isinstance(item, tuple) else len(item)
        assert size < 100_000, f"a text of {size:,} characters was tokenized"

    def encode(self, text, *args, **kwargs):
        self._check(text)
        return self.tok.encode(text, *args, **kwargs)

    def encode_batch(self, texts, *args, **kwargs):
        for item in texts:
            self._check(item)
        return self.tok.encode_batch(texts, *args, **kwargs)


def _long_text(rng, n_words, sparse=False):
    pieces = ["word", "Café", "naïve", "[MASK]", "中文", "x" * 120, "unaffable", ",", "!", "ﬁne", "a\tb", "c\r\nd"]
    words = [pieces[i] for i in rng.integers(0, len(pieces), n_words)]
    gaps = [" " * (1 + int(g)) + ("\x00" * 50 if sparse and g == 0 else "") for g in rng.integers(0, 3, n_words)]
    return "".join(w + g for w, g in zip(words, gaps))


def test_a_huge_line_is_not_tokenized_whole_and_truncates_as_before(tiny):
    """The tokenizers library encodes a whole text before truncating it: one 100 MB line took some 15 GB of token
    records to keep 128 tokens (the process was killed). Only the start of a long text is tokenized now, and what
    it keeps is exactly the whole text's truncation (ids, offsets, words, special tokens)."""
    tok = jaxbert.load(tiny).tokenizer
    huge = "the quick brown fox, jumps over the lazy dog! " * 50_000  # 2 MB
    real = tok._tok, tok._truncated(40)
    tok._tok, tok._truncating[40] = _Spy(real[0]), _Spy(real[1])
    enc = tok.encode([huge, "short"], max_length=40)
    pair = tok.encode(["a question", huge], ["short", "a context " * 9], max_length=40)  # a long text in a pair too
    # Two long texts: tokenizers keeps each one's overflowing windows paired with each of the other's (30 kB and
    # 25 kB at max_length 40 peaked at 4 GB whole; 100 kB and 83 kB at 512, 2.6 GB): these would not fit in memory.
    assert len(tok.encode([huge[:300_000]], [huge[:250_000]], max_length=40).ids[0]) == 40
    tok._tok, tok._truncating[40] = real
    whole = tok._truncating[40].encode_batch([("a question", "short"), (huge[:3000], "a context " * 9)])
    assert pair.ids == [e.ids for e in whole] and pair.offsets == [e.offsets for e in whole]
    with pytest.raises(ValueError, match=r"a lone surrogate \\ud800 at character 2300000"):
        tok.encode([huge + "\ud800"], max_length=40)  # beyond what is kept, and still named
    whole = tok._truncating[40].encode_batch([huge, "short"])
    assert enc.ids == [e.ids for e in whole] and enc.offsets == [e.offsets for e in whole]
    rng = np.random.default_rng(0)
    texts = [_long_text(rng, 9000), _long_text(rng, 9000, sparse=True), "nospace" * 5000, _long_text(rng, 50)]
    texts.append("\x07 " * 40_000 + _long_text(rng, 9000))  # no token in the first chunks: counted on past them
    # Pairs: one long (clipped to more tokens than the other has), both long (clipped so that the one longer in full
    # stays the longer: it gets the odd token), both short. The whole pairs' encodings are the reference: kept small
    # enough that tokenizers' windows of one times the other's (the old blow-up) stay few.
    one_long = [(texts[0], "a b c"), ("a b c", texts[0]), (texts[1], texts[2]), ("tiny", texts[4]), ("x y", "z")]
    twice = _long_text(rng, 3000)
    two_long = [(twice, twice), (twice, _long_text(rng, 2900)), (_long_text(rng, 2900), twice)]
    for wp in (tok, tok.lowercased()):
        for limit, pairs in [(16, one_long), (17, one_long), (40, one_long), (300, two_long), (301, two_long)]:
            got = wp.encode([a for a, _ in pairs], [b for _, b in pairs], max_length=limit)
            want = wp._truncated(limit).encode_batch(pairs)
            assert [e.ids for e in want] == got.ids and [e.offsets for e in want] == got.offsets
            assert [e.type_ids for e in want] == got.type_ids
        for limit in (16, 40):
            got = wp.encode(texts, max_length=limit)
            want = wp._truncated(limit).encode_batch(texts)
            want = [(e.ids, e.type_ids, e.offsets, e.word_ids, e.special_tokens_mask) for e in want]
            fields = zip(got.ids, got.type_ids, got.offsets, got.word_ids, got.special)
            got = [(i, t, o, [None if w < 0 else w for w in words], s) for i, t, o, words, s in fields]
            assert got == want


class _Windows:
    """A tokenizers.Tokenizer recording how many overflowing windows its encodings of pairs hold."""

    def __init__(self, tok):
        self.tok, self.windows = tok, []

    def __getattr__(self, name):
        return getattr(self.tok, name)

    def encode_batch(self, items, *args, **kwargs):
        encs = self.tok.encode_batch(items, *args, **kwargs)
        self.windows += [len(e.overflowing) for e in encs]
        return encs


def test_a_pair_of_long_texts_is_cut_to_few_windows_and_truncates_as_before(tiny):
    """tokenizers records every overflowing window of a pair's one text paired with every one of the other's, and
    jaxbert cut each text only at a 16,384-character chunk before it: two texts of 16,000 characters at max_length 40
    still made some 10,000 windows (3.7 s for one pair; 300 kB and 250 kB, 8.5 s). They are cut to little more than
    longest-first keeps, in order by tokens (the longer in full stays the longer, the second on a tie): few windows,
    and what is kept is exactly the whole pairs' truncation."""
    tok = jaxbert.load(tiny).tokenizer
    rng = np.random.default_rng(1)
    one, other = _long_text(rng, 300), _long_text(rng, 280)
    pairs = [(one, other), (other, one), (one, one), (one, "a b c"), ("a b c", other)]
    for wp in (tok, tok.lowercased()):
        for limit in (16, 17, 64):
            real = wp._truncated(limit)
            wp._truncating[limit] = spy = _Windows(real)
            try:
                got = wp.encode([a for a, _ in pairs], [b for _, b in pairs], max_length=limit)
            finally:
                wp._truncating[limit] = real
            assert max(spy.windows) <= 64, spy.windows  # the whole pairs': hundreds to thousands
            want = real.encode_batch(pairs)
            assert [e.ids for e in want] == got.ids and [e.offsets for e in want] == got.offsets
            assert [e.type_ids for e in want] == got.type_ids


class _Counting:
    """A tokenizers.Tokenizer recording what it encodes: the texts of each encode_batch call, and of each encode."""

    def __init__(self, tok):
        self.tok, self.batches, self.singles = tok, [], []

    def __getattr__(self, name):
        return getattr(self.tok, name)

    def encode(self, text, *args, **kwargs):
        self.singles.append(text)
        return self.tok.encode(text, *args, **kwargs)

    def encode_batch(self, texts, *args, **kwargs):
        self.batches.append(list(texts))
        return self.tok.encode_batch(texts, *args, **kwargs)


def test_a_batch_of_pairs_is_counted_in_one_call_a_round_each_character_once(tiny):
    """The pairs clipped before truncation were counted one text at a time (encode, one core: twice tokenizers' own
    encode_batch of the whole pairs), and a clipped pair counted again for its order. A batch's chunks are counted
    together, one encode_batch a round, each character once; what is kept is the whole pairs' truncation (random
    pairs, a tie, one long text beside a short one)."""
    tok = jaxbert.load(tiny).tokenizer
    rng = np.random.default_rng(3)
    pairs = [(_long_text(rng, int(n)), _long_text(rng, int(m))) for n, m in rng.integers(0, 200, (20, 2))]
    # More than 16,384 characters each, and few tokens (a word of 100+ characters is one [UNK]), so that the whole
    # pairs (every window of one with every one of the other's) stay quick to encode for reference
    one, other = ("x" * 120 + " ") * 140 + "word " * 30, ("y" * 130 + " ") * 130 + "a b " * 21
    pairs += [(one, other), (other, one), (one, one), (one, "a b " * 20), ("a b " * 20, other), ("x y", "z")]
    for wp in (tok, tok.lowercased()):
        for limit in (16, 17, 64):
            real = wp._tok
            wp._tok = spy = _Counting(real)
            try:
                got = wp.encode([a for a, _ in pairs], [b for _, b in pairs], max_length=limit)
            finally:
                wp._tok = real
            assert spy.singles == [] and 0 < len(spy.batches) <= 12, (len(spy.singles), len(spy.batches))
            assert sum(len(c) for batch in spy.batches for c in batch) <= sum(len(a) + len(b) for a, b in pairs)
            want = wp._truncated(limit).encode_batch(pairs)
            assert [e.ids for e in want] == got.ids and [e.offsets for e in want] == got.offsets
            assert [e.type_ids for e in want] == got.type_ids


@pytest.mark.parametrize("kind", ["directory", "pipe"])
def test_an_input_that_exists_but_is_no_file_is_named_for_what_it_is(tiny, tmp_path, capsys, kind):
    """embed --input <(...) or a directory said '/dev/fd/63: no such file' of a path that exists."""
    import os

    path = tmp_path / "input.txt"
    path.mkdir() if kind == "directory" else os.mkfifo(path)
    why = "input.txt: is a directory, not a file" if kind == "directory" else "input.txt: not a regular file (a pipe"
    cli_fails(capsys, tmp_path, "embed", tiny, "--input", path, "--output", tmp_path / "e.npy", match=why)
    jsonl = tmp_path / "rows.jsonl"
    jsonl.mkdir() if kind == "directory" else os.mkfifo(jsonl)
    why = why.replace("input.txt", "rows.jsonl")
    classifier = _model_dir(tmp_path / "cls", "BertForSequenceClassification")
    capsys.readouterr()  # transformers' progress bars
    cli_fails(capsys, tmp_path, "predict", classifier, "--input", jsonl, "--output", tmp_path / "p.jsonl", match=why)
