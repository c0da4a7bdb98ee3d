"""A thin layer over the checkpoint's fast WordPiece tokenizer (the `tokenizers` library).

Built as transformers 5's AutoTokenizer builds it: from `tokenizer.json` as it is, except that its BertTokenizer
(tokenizer_class BertTokenizer or an alias, or none named beside a BERT config.json) takes only tokenizer.json's
vocabulary and added tokens and builds the rest from `tokenizer_config.json` (lower-casing, accent stripping,
Chinese characters split one per token, the special tokens named); without tokenizer.json, from `vocab.txt` +
`tokenizer_config.json` alike. A tokenizer_class transformers builds another way is refused.
Padding and truncation are jaxbert's own: settings stored in tokenizer.json (MiniLM's pads everything to 128) are
cleared, but its truncation direction is the side cut where tokenizer_config.json names none.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import re
import threading

import numpy as np
from tokenizers import Tokenizer
from tokenizers.implementations import BertWordPieceTokenizer

from jaxbert.files import existing_file, read_json
from jaxbert.inputs import check_unicode, lone_surrogate, positive_int

# "No limit": transformers writes model_max_length ~1e30 (or none at all) for it, and then the model's positions
# decide (Bert.max_length, sentence-transformers' max_seq_length); kept small enough for the tokenizers library.
NO_LIMIT = 10**6

# transformers' BERT special tokens and their default names; tokenizer_config.json / special_tokens_map.json rename
SPECIAL = dict(unk_token="[UNK]", sep_token="[SEP]", cls_token="[CLS]", pad_token="[PAD]", mask_token="[MASK]")


@dataclasses.dataclass
class Encoded:
    """A tokenized batch, unpadded: one list per text."""

    ids: list[list[int]]
    type_ids: list[list[int]]
    offsets: list[list[tuple[int, int]]]
    word_ids: list[list[int]]  # -1 for special tokens
    special: list[list[int]]  # 1 for [CLS]/[SEP]/...

    def __len__(self):
        return len(self.ids)

    def lengths(self) -> np.ndarray:
        return np.array([len(x) for x in self.ids], dtype=np.int64)


def ordered(texts, name="texts") -> list:
    """`texts` as a list, in its order; a set or a mapping is refused: it has no order of its own, so outputs
    "in input order" would be in whatever order it iterates (a dict: its keys). sentence-transformers' encode refuses
    both (a set is no input type there, a dict one multimodal input keyed by modality)."""
    if isinstance(texts, (collections.abc.Set, collections.abc.Mapping)):
        kind = type(texts).__name__
        raise TypeError(f"{name} is a {kind}, which has no order for the outputs to follow; give a list")
    return list(texts)


def check_texts(texts, name="texts") -> list[str]:
    """`texts` as a list of strings, or a TypeError naming the first that is not (a single string: wrap it)."""
    if isinstance(texts, str):
        raise TypeError(f"{name} must be a list of strings, got a single string (wrap it in a list)")
    texts = ordered(texts, name)
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"{name}[{i}] is {type(text).__name__}, not a string")
    return texts


def _setting(config: dict, path: str, key: str, kinds: tuple, default):
    value = config.get(key, default)
    if not isinstance(value, kinds) or (bool not in kinds and isinstance(value, bool)):
        raise ValueError(f"{path}: {key}={value!r} has the wrong type")
    return value


def _token_types(config: dict, path: str) -> bool:
    """Whether the tokenizer gives token types: tokenizer_config.json's model_input_names names them (as
    transformers reads it; BERT's default names them)."""
    names = config.get("model_input_names")
    if names is None:
        return True
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"{path}: model_input_names={names!r} is not a list of names")
    return "token_type_ids" in names


def _read_config(directory: str) -> tuple[dict, str]:
    path = existing_file(directory, "tokenizer_config.json")
    return (read_json(path), path) if path else ({}, "tokenizer_config.json")


def _max_length(config: dict, path: str) -> int:
    """tokenizer_config.json's model_max_length: a whole number of tokens, or NO_LIMIT where it is transformers'
    huge "no limit" or missing (read as 512 before: a model of more positions had its texts cut at 512)."""
    value = _setting(config, path, "model_max_length", (int, float), NO_LIMIT)
    if isinstance(value, float) and not value.is_integer():  # 0.5 would become 0 tokens; NaN, inf
        raise ValueError(f"{path}: model_max_length={value!r} must be a whole number of tokens")
    if value < 1:
        raise ValueError(f"{path}: model_max_length={value!r} must be positive")
    return NO_LIMIT if value > NO_LIMIT else int(value)


def _split_special(config: dict, path: str) -> bool:
    """tokenizer_config.json's split_special_tokens: transformers then reads "[MASK]" or "[SEP]" written in a text as
    the text it is (word pieces), not as the special token."""
    return _setting(config, path, "split_special_tokens", (bool,), False)


def _side(config: dict, path: str, key: str, default: str = "right") -> str:
    """Which end of a long text is cut (key truncation_side) or of a short one padded (padding_side): transformers'
    tokenizers read tokenizer_config.json's, and where it has none the direction of tokenizer.json's truncation or
    padding (`default`)."""
    side = _setting(config, path, key, (str,), default)
    if side not in ("left", "right"):
        raise ValueError(f"{path}: {key}={side!r} must be 'left' or 'right'")
    return side


def _with_unknown(path: str, tok: Tokenizer) -> Tokenizer:
    """`tok`, once its model's unknown token is known to be in its vocabulary: otherwise WordPiece (and
    WordLevel) fail on the first text with a character outside the vocabulary, long after loading."""
    unk = getattr(tok.model, "unk_token", None)  # None: a model with no unknown token (BPE may have none)
    if unk is not None and tok.model.token_to_id(unk) is None:  # the model's own vocabulary, not added tokens
        raise ValueError(f"{path}: the unknown token {unk!r} is not in the vocabulary")
    return tok


def _no_byte_order_mark(path: str) -> None:
    """vocab.txt has no UTF-8 byte order mark: BertWordPieceTokenizer (and transformers' BertTokenizer) would keep
    it as part of the first token, so "[PAD]" there became "\ufeff[PAD]", unknown to the tokenizer, and the error
    named a special token, not the mark."""
    with open(path, "rb") as f:
        if f.read(3) == b"\xef\xbb\xbf":
            first = f.readline().decode("utf-8", "replace").rstrip("\r\n")
            raise ValueError(f"{path}: starts with a UTF-8 byte order mark, which would be part of its first token "
                             f"({first!r}); save the file without one")  # fmt: skip


def _tokens(value) -> list:
    """The token strings of a special-tokens entry: a string, an AddedToken dict, or a list of them."""
    if isinstance(value, list):
        return [t for v in value for t in _tokens(v)]
    return [value.get("content")] if isinstance(value, dict) else [value]


def _special_tokens(directory: str, config: dict, config_path: str) -> dict[str, str]:
    """The special tokens' names as transformers reads them: tokenizer_config.json's, special_tokens_map.json's
    over them unless tokenizer_config.json has added_tokens_decoder; a vocab.txt tokenizer built with the
    default names put [CLS]/[SEP] (101/102) where transformers puts a renamed cls_token's and sep_token's ids."""
    names = {key: (config_path, config.get(key, default)) for key, default in SPECIAL.items()}
    path = existing_file(directory, "special_tokens_map.json")
    if path and "added_tokens_decoder" not in config:
        names.update({key: (path, value) for key, value in read_json(path).items() if key in SPECIAL})
    for key, (where, value) in names.items():
        token = (_tokens(value) or [None])[0]
        if not isinstance(token, str) or not token:
            raise ValueError(f"{where}: {key}={value!r} is not a token")
        names[key] = token
    return names


def _additional_special(directory: str, config: dict) -> list[str]:
    """The tokens tokenizer_config.json and special_tokens_map.json list as additional_special_tokens (or
    extra_special_tokens): transformers matches each in a text as one token and counts it among all_special_ids
    (never masked by its language-modelling collators)."""
    path = existing_file(directory, "special_tokens_map.json")
    found = []
    for settings in (config, read_json(path) if path else {}):
        for key in ("additional_special_tokens", "extra_special_tokens"):
            value = settings.get(key)
            value = list(value.values()) if isinstance(value, dict) and "content" not in value else value
            found += [t for t in _tokens(value or []) if isinstance(t, str) and t not in found]
    return found


def _refuse_added_tokens(directory: str, config: dict, config_path: str, tok: Tokenizer, name: str) -> None:
    """transformers adds to the tokenizer the tokens of added_tokens.json, tokenizer_config.json's
    added_tokens_decoder and the special tokens it names, when `name` (vocab.txt, or tokenizer.json with its own
    added tokens) lacks them; jaxbert split a text's "[NEW]" into word pieces where transformers gives it its own
    id, past the vocabulary. Such a token is refused, naming it."""
    added = []
    path = existing_file(directory, "added_tokens.json")
    if path:
        added += [(path, token) for token in read_json(path)]
    decoder = config.get("added_tokens_decoder")
    if isinstance(decoder, dict):
        added += [(config_path, token) for entry in decoder.values() for token in _tokens(entry)]
    path = existing_file(directory, "special_tokens_map.json")
    for where, settings in ((path, read_json(path) if path else {}), (config_path, config)):
        for key, value in settings.items():
            if key.endswith("_token") or key in ("additional_special_tokens", "extra_special_tokens"):
                added += [(where, token) for token in _tokens(value)]
    for where, token in added:
        if isinstance(token, str) and tok.token_to_id(token) is None:
            raise ValueError(
                f"{where}: adds the token {token!r}, which {name} lacks (jaxbert adds no tokens to the vocabulary read)"
            )


# AddedToken's flags as tokenizer_config.json's added_tokens_decoder writes them
FLAGS = ("single_word", "lstrip", "rstrip", "normalized", "special")


def _with_added(directory: str, config: dict, config_path: str, tok: Tokenizer, special: dict[str, str]) -> None:
    """Add to `tok` (each token in its vocabulary: _refuse_added_tokens checked) the tokens transformers adds:
    tokenizer_config.json's added_tokens_decoder, with its flags (they replace tokenizer.json's), else those of
    added_tokens.json (normalized unless special). "[unused1]" listed there was split into "[", "unused", "##1",
    "]" where transformers matches it whole (and lower-cased, when normalized); an lstrip token's offsets took
    none of the spaces before it."""
    from tokenizers import AddedToken

    decoder, added = config.get("added_tokens_decoder"), []
    if isinstance(decoder, dict):
        for key, entry in sorted(decoder.items(), key=lambda item: int(item[0]) if item[0].isdigit() else -1):
            flags = {k: entry[k] for k in FLAGS if k in entry} if isinstance(entry, dict) else None
            content = entry.get("content") if isinstance(entry, dict) else None
            if not isinstance(content, str) or not all(isinstance(v, bool) for v in flags.values()):
                raise ValueError(f"{config_path}: added_tokens_decoder[{key!r}]={entry!r} is not a token")
            added.append(AddedToken(content, **flags))
    elif path := existing_file(directory, "added_tokens.json"):
        named = {*special.values(), *_additional_special(directory, config)}
        added = [AddedToken(t, normalized=t not in named, special=t in named) for t in read_json(path)]
    tok.add_tokens(added)


def _named_with_flags(directory: str, config: dict) -> list:
    """The special tokens a vocab.txt tokenizer's files name as token objects, with their flags, as transformers
    adds them (special_tokens_map.json's where tokenizer_config.json has no added_tokens_decoder, else
    tokenizer_config.json's AddedToken): a mask_token {"content": "[MASK]", "lstrip": true} took the spaces before
    it there, and a single_word one is no mask inside a word. _with_added's tokens, added after, replace them."""
    from tokenizers import AddedToken

    entries = {k: v for k, v in config.items() if k in SPECIAL and isinstance(v, dict) and v.get("__type")}
    path = existing_file(directory, "special_tokens_map.json")
    if path and "added_tokens_decoder" not in config:
        entries.update({k: v for k, v in read_json(path).items() if k in SPECIAL})
    flags = lambda entry: {k: entry[k] for k in FLAGS[:4] if isinstance(entry.get(k), bool)}  # noqa: E731
    return [AddedToken(v["content"], special=True, **flags(v)) for v in entries.values() if isinstance(v, dict)]


def _with_additional(tok: Tokenizer, tokens: list[str]) -> tuple[str, ...]:
    """Make `tokens` (each in the vocabulary: _refuse_added_tokens checked) special tokens of `tok`, matched whole in
    a text as transformers matches them ("[unused1]" was split into "[", "unused", "##1", "]")."""
    tok.add_special_tokens(tokens)
    return tuple(tokens)


# tokenizer_class values (with or without "Fast") transformers 5 builds as its BertTokenizer (aliases of it, and
# DistilBertTokenizer), and those under which it reads tokenizer.json as it is (ConvBertTokenizer beside vocab.txt
# alone is a BertTokenizer too)
BERT_CLASSES = {"Bert", "Electra", "LayoutLM", "Lxmert", "MobileBert", "SqueezeBert", "DistilBert"}
AS_IS_CLASSES = {"PreTrainedTokenizerFast", "PreTrainedTokenizer", "TokenizersBackend", "PythonBackend"}
AS_IS_CLASSES.add("ConvBertTokenizer")
# The other tokenizer_class values (without "Fast") transformers 5.24 builds with a class of its own: refused. A
# name it does not know (a custom class; its auto_map code runs only with trust_remote_code, which jaxbert never
# does) makes AutoTokenizer read tokenizer.json as it is, as TokenizersBackend: so does jaxbert. Checked against the
# installed transformers by test_tokenizer_inputs.py.
TRANSFORMERS_CLASSES = frozenset(
    """AlbertTokenizer AutoTokenizer BartTokenizer BarthezTokenizer BartphoTokenizer BasicTokenizer
    BertGenerationTokenizer BertJapaneseTokenizer BertweetTokenizer BigBirdTokenizer BioGptTokenizer
    BlenderbotSmallTokenizer BlenderbotTokenizer ByT5Tokenizer CLIPTokenizer CTRLTokenizer CamembertTokenizer
    CanineTokenizer CharacterTokenizer ClvpTokenizer CodeGenTokenizer CodeLlamaTokenizer CohereTokenizer
    ConvBertTokenizer CpmAntTokenizer CpmTokenizer DPRContextEncoderTokenizer DPRQuestionEncoderTokenizer
    DPRReaderTokenizer DebertaTokenizer DebertaV2Tokenizer DiaTokenizer DistilBertTokenizer EsmTokenizer
    EsmcTokenizer FNetTokenizer FSMTTokenizer FastSpeech2ConformerTokenizer FlaubertTokenizer FunnelTokenizer
    GPT2Tokenizer GPTNeoXJapaneseTokenizer GPTNeoXTokenizer GPTSw3Tokenizer GemmaTokenizer HerbertTokenizer
    LEDTokenizer LasrTokenizer LayoutLMv2Tokenizer LayoutLMv3Tokenizer LayoutXLMTokenizer LlamaTokenizer
    LongformerTokenizer LukeTokenizer M2M100Tokenizer MBart50Tokenizer MBartTokenizer MLukeTokenizer MPNetTokenizer
    MarianTokenizer MarkupLMTokenizer MecabTokenizer MgpstrTokenizer MvpTokenizer MyT5Tokenizer NllbTokenizer
    NougatTokenizer OpenAIGPTTokenizer PLBartTokenizer ParakeetTokenizer PegasusTokenizer PerceiverTokenizer
    Phi3Tokenizer PhobertTokenizer Pop2PianoTokenizer ProphetNetTokenizer Qwen2Tokenizer Qwen3_5Tokenizer
    RagTokenizer ReformerTokenizer RemBertTokenizer RoCBertTokenizer RoFormerTokenizer RobertaTokenizer
    SeamlessM4TTokenizer Siglip2Tokenizer SiglipTokenizer Speech2TextTokenizer SpeechT5Tokenizer SplinterTokenizer
    T5Tokenizer TapasTokenizer Tipsv2Tokenizer UdopTokenizer VideoPrismTokenizer VitsTokenizer Wav2Vec2CTCTokenizer
    Wav2Vec2PhonemeCTCTokenizer WhisperTokenizer WordpieceTokenizer XGLMTokenizer XLMRobertaTokenizer XLMTokenizer
    XLNetTokenizer""".split()
)


def _builds_bert_tokenizer(directory: str, config: dict, config_path: str, vocab_only: bool) -> bool:
    """Whether transformers' AutoTokenizer builds its BertTokenizer here (else it reads tokenizer.json as it is):
    by tokenizer_config.json's tokenizer_class, else config.json's, else the one registered for model_type "bert"
    (an encoder-decoder's encoder's). Another class builds another tokenizer (BertJapaneseTokenizer splits words
    with MeCab, MPNetTokenizer puts <s> </s> around texts), which jaxbert gave BERT's ids instead: refused."""
    name, where = config.get("tokenizer_class"), config_path
    if name is None:
        where = existing_file(directory, "config.json")
        model = read_json(where) if where else {}
        name = model.get("tokenizer_class")
        if name is None:
            encoder = model.get("encoder") if model.get("model_type") == "encoder-decoder" else model
            return isinstance(encoder, dict) and encoder.get("model_type") == "bert"
    base = name.removesuffix("Fast") if isinstance(name, str) else None
    if base is not None and base.removesuffix("Tokenizer") in BERT_CLASSES:
        return True
    as_is = base in AS_IS_CLASSES or name in AS_IS_CLASSES or base not in TRANSFORMERS_CLASSES
    if base is not None and as_is and (not vocab_only or base == "ConvBertTokenizer"):
        return False
    raise ValueError(
        f"{where}: tokenizer_class {name!r} is not one jaxbert builds as transformers does (BertTokenizer or an "
        "alias; PreTrainedTokenizerFast or a class transformers does not know reads tokenizer.json as it is)"
    )


def _as_bert_tokenizer(path: str, tok: Tokenizer, options: dict, special: dict[str, str]) -> Tokenizer:
    """transformers 5's BertTokenizer takes tokenizer.json's vocabulary and added tokens only, and builds the rest
    as a vocab.txt tokenizer: a BertNormalizer lower-casing, stripping accents and splitting Chinese characters as
    tokenizer_config.json says (its defaults for a key it lacks; 4.x's BertTokenizerFast overrode those three too),
    BERT's pre-tokenizer, WordPiece's "##" and 100 characters a word, [CLS] A [SEP] (B [SEP]) with the cls_token
    and sep_token named; whatever tokenizer.json says of them."""
    from tokenizers import decoders, models, normalizers, pre_tokenizers, processors

    tok.model = models.WordPiece(tok.get_vocab(with_added_tokens=False), unk_token=special["unk_token"])
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, **options)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    cls, sep = special["cls_token"], special["sep_token"]
    for key, token in (("cls_token", cls), ("sep_token", sep)):
        if tok.token_to_id(token) is None:  # transformers would add it, past the model's embeddings
            raise ValueError(f"{path}: has no token {token!r}, the {key} the tokenizer files name")
    tok.post_processor = processors.TemplateProcessing(
        single=f"{cls}:0 $A:0 {sep}:0",
        pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
        special_tokens=[(cls, tok.token_to_id(cls)), (sep, tok.token_to_id(sep))],
    )
    return tok


# transformers' clean_up_tokenization, in its order
CLEAN_UP = [(" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m")]
CLEAN_UP += [(" 's", "'s"), (" 've", "'ve"), (" 're", "'re")]


def _clean_up(config: dict, path: str, tok: Tokenizer) -> bool:
    """Whether decoding cleans up spaces as transformers 5 does: tokenizer_config.json's
    clean_up_tokenization_spaces (false when missing), never for a BPE model unless it insists."""
    if not _setting(config, path, "clean_up_tokenization_spaces", (bool, type(None)), False):
        return False
    insists = "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output"
    return type(tok.model).__name__ != "BPE" or bool(config.get(insists))


def copy(tok: Tokenizer) -> Tokenizer:
    """A copy of `tok` to set truncation on: its JSON, and encode_special_tokens, which that leaves out."""
    out = Tokenizer.from_str(tok.to_str())
    out.encode_special_tokens = tok.encode_special_tokens
    return out


def _load(path: str, build):
    """Build a tokenizer from `path`; the tokenizers library raises many types for a corrupt file."""
    try:
        return build()
    except Exception as e:  # noqa: BLE001 - Rust errors surface as plain Exception
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ValueError(f"{path}: not a readable tokenizer file ({first})") from None


# Normalizers that map each character by itself (NFC composes only with following combining marks, never a space),
# so that a text cut before a space normalizes to the start of the whole text's normalization.
_CHARWISE = ("BertNormalizer", "Lowercase", "StripAccents", "NFD", "NFKD", "NFC", "NFKC")
_SPACE = re.compile(r"[ \t\n\r]")  # whitespace to BertNormalizer, BertPreTokenizer and Python alike


def _charwise(normalizer) -> bool:
    if normalizer is None:
        return True
    if type(normalizer).__name__ == "Sequence":
        return all(_charwise(n) for n in normalizer)
    return type(normalizer).__name__ in _CHARWISE


def _splits_at_spaces(tok: Tokenizer) -> bool:
    """Whether every ASCII space of a text is a boundary the tokens never cross, so that the tokens of the parts
    between spaces are the whole text's: BERT's pipeline (a character-wise normalizer, BertPreTokenizer, WordPiece)
    with added tokens that hold no whitespace and need no word boundary (single_word would look past a cut)."""
    added = tok.get_added_tokens_decoder().values()
    return (
        _charwise(tok.normalizer)
        and type(tok.pre_tokenizer).__name__ == "BertPreTokenizer"
        and type(tok.model).__name__ == "WordPiece"
        and not any(a.single_word or _SPACE.search(a.content) or a.content != a.content.strip() for a in added)
    )


class WordPiece:
    """Thread-safe: the wrapped tokenizer is never mutated after construction; truncation to each max_length
    is a separate copy, built once (tokenizers' settings are shared mutable state, so toggling them per call
    would let concurrent calls see each other's settings)."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        model_max_length: int = 512,
        truncation_side: str = "right",
        special_tokens: dict[str, str] | None = None,
        padding_side: str = "right",
        clean_up_spaces: bool = False,
        additional_special: tuple[str, ...] = (),
        token_types: bool = True,
    ):
        tokenizer.no_padding()
        tokenizer.no_truncation()
        self._tok = tokenizer
        self._truncating: dict[int, Tokenizer] = {}
        self._lock = threading.Lock()
        self.model_max_length = model_max_length
        self.truncation_side = truncation_side
        self.padding_side = padding_side  # __call__'s, as transformers'; jaxbert's own batches pad on the right
        self.clean_up_spaces = clean_up_spaces  # decode's
        self.special_tokens = dict(SPECIAL if special_tokens is None else special_tokens)
        self.additional_special = tuple(additional_special)  # additional_special_tokens: special, never masked
        self.token_types = token_types  # "token_type_ids" in model_input_names: else all type ids are 0
        self.vocab = tokenizer.get_vocab()
        self._lower: WordPiece | None = None  # see lowercased
        self._splits_at_spaces = _splits_at_spaces(tokenizer)  # see _clip

    @classmethod
    def from_dir(cls, directory: str) -> WordPiece:
        from jaxbert.sentence_dir import transformer_dir

        directory = transformer_dir(directory)  # a sentence-transformers 0_Transformer/ subfolder's, if so
        config, config_path = _read_config(directory)
        max_len = _max_length(config, config_path)
        types = _token_types(config, config_path)
        special = _special_tokens(directory, config, config_path)
        options = dict(
            lowercase=_setting(config, config_path, "do_lower_case", (bool,), True),
            strip_accents=_setting(config, config_path, "strip_accents", (bool, type(None)), None),
            handle_chinese_chars=_setting(config, config_path, "tokenize_chinese_chars", (bool,), True),
        )
        path = existing_file(directory, "tokenizer.json")
        if path:
            tok = _load(path, lambda: Tokenizer.from_file(path))
            side = _side(config, config_path, "truncation_side", (tok.truncation or {}).get("direction", "right"))
            padding = _side(config, config_path, "padding_side", (tok.padding or {}).get("direction", "right"))
            if _builds_bert_tokenizer(directory, config, config_path, vocab_only=False):
                tok = _as_bert_tokenizer(path, tok, options, special)
            _refuse_added_tokens(directory, config, config_path, tok, "tokenizer.json")
            _with_added(directory, config, config_path, tok, special)
            extra = _with_additional(tok, _additional_special(directory, config))
            clean = _clean_up(config, config_path, tok)
            tok.encode_special_tokens = _split_special(config, config_path)
            return cls(_with_unknown(path, tok), max_len, side, special, padding, clean, extra, types)
        vocab = existing_file(directory, "vocab.txt")
        if not vocab:
            raise FileNotFoundError(f"{directory}: no tokenizer (looked for tokenizer.json, vocab.txt)")
        _no_byte_order_mark(vocab)
        _builds_bert_tokenizer(directory, config, config_path, vocab_only=True)
        side = _side(config, config_path, "truncation_side")
        options.update(special)
        tok = _load(vocab, lambda: BertWordPieceTokenizer(vocab, clean_text=True, **options)._tokenizer)
        tok = _with_unknown(vocab, tok)
        _refuse_added_tokens(directory, config, config_path, tok, "vocab.txt")
        tok.add_tokens(_named_with_flags(directory, config))
        _with_added(directory, config, config_path, tok, special)
        extra = _with_additional(tok, _additional_special(directory, config))
        padding = _side(config, config_path, "padding_side")
        tok.encode_special_tokens = _split_special(config, config_path)
        return cls(tok, max_len, side, special, padding, _clean_up(config, config_path, tok), extra, types)

    def lowercased(self) -> WordPiece:
        """This tokenizer lower-casing texts first, as sentence-transformers' do_lower_case does: a Lowercase
        normalizer in front of the model's own (none added if it has one), so special tokens written in a text
        ("[SEP]", "[MASK]") are still matched as they are, where lower-casing the text itself broke them. Built
        once."""
        from tokenizers.normalizers import Lowercase, Sequence

        with self._lock:
            if self._lower is None:
                old = self._tok.normalizer
                parts = list(old) if isinstance(old, Sequence) else [] if old is None else [old]
                if any(isinstance(n, Lowercase) for n in parts):
                    self._lower = self
                else:
                    tok = copy(self._tok)
                    tok.normalizer = Sequence([Lowercase(), *parts])
                    settings = (self.truncation_side, self.special_tokens, self.padding_side, self.clean_up_spaces)
                    settings += (self.additional_special, self.token_types)
                    self._lower = WordPiece(tok, self.model_max_length, *settings)
            return self._lower

    def _truncated(self, limit: int) -> Tokenizer:
        with self._lock:
            tok = self._truncating.get(limit)
            if tok is None:
                tok = copy(self._tok)
                tok.enable_truncation(limit, direction=self.truncation_side)
                self._truncating[limit] = tok
            return tok

    # -- the tokenizers library's tokenizer, for modules that need more than encode (qa.py's windows, entities.py) -
    @property
    def backend(self) -> Tokenizer:
        """The underlying `tokenizers.Tokenizer`, without padding or truncation. Shared by every caller (and thread):
        read it, or `copy` it before setting truncation (qa.py does)."""
        return self._tok

    def num_special_tokens_to_add(self, pair: bool = False) -> int:
        """Special tokens around one text ([CLS] [SEP]: 2) or a pair (3)."""
        return self._tok.num_special_tokens_to_add(pair)

    # -- vocabulary ------------------------------------------------------------------------------------------
    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def id_to_token(self, i: int) -> str | None:
        return self._tok.id_to_token(int(i))

    @property
    def mask_token(self) -> str:
        return self.special_tokens["mask_token"]

    @property
    def mask_token_id(self) -> int | None:
        return self.token_to_id(self.mask_token)

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        text = self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)
        if self.clean_up_spaces:  # transformers' clean_up_tokenization
            for old, new in CLEAN_UP:
                text = text.replace(old, new)
        return text

    # -- encoding --------------------------------------------------------------------------------------------
    def encode(
        self,
        texts,
        pairs=None,
        *,
        max_length: int | None = None,
        truncation: bool = True,
        hint: str | None = "pass truncation=True to cut it",
    ) -> Encoded:
        """Tokenize texts (and optional second segments), with [CLS]/[SEP] and token types 0/1.

        Longer than `max_length` (default: the tokenizer's model_max_length): truncated (longest first), or a
        ValueError naming the text when `truncation=False` (ending with `hint`, for callers that cut nothing).
        """
        texts = check_texts(texts)
        if pairs is not None:
            pairs = check_texts(pairs, "pairs")
            if len(pairs) != len(texts):
                raise ValueError(f"{len(texts)} texts but {len(pairs)} pairs")
        limit = self.model_max_length if max_length is None else positive_int("max_length", max_length)
        tok = self._truncated(limit) if truncation else self._tok
        try:
            if truncation and self.truncation_side == "right" and self._splits_at_spaces:
                if pairs is None:
                    encs = tok.encode_batch([self._clip(text, limit) for text in texts])
                else:
                    encs = tok.encode_batch([self._clip_pair(a, b, limit) for a, b in zip(texts, pairs)])
            else:
                encs = tok.encode_batch(list(zip(texts, pairs)) if pairs is not None else texts)
        except TypeError:  # the library's only word on a lone surrogate: "TextEncodeInput must be Union[...]"
            check_unicode(texts)
            check_unicode(pairs or [], "pairs")
            raise
        for i, enc in enumerate(encs):
            if len(enc.ids) > limit and truncation:  # truncation never cuts [CLS] and [SEP]: no room for them
                special = self._tok.num_special_tokens_to_add(pairs is not None)
                raise ValueError(f"max_length {limit}: too short for the {special} special tokens around texts[{i}]")
            if len(enc.ids) > limit:
                raise ValueError(
                    f"texts[{i}] has {len(enc.ids)} tokens, more than max_length {limit}"
                    + (f" ({hint})" if hint else "")
                )
        return self._encoded(encs)

    def _encoded(self, encs) -> Encoded:
        return Encoded(
            [e.ids for e in encs],
            # Without token types among its model_input_names, transformers' tokenizer returns none and BERT
            # reads zeros: a pair's second text is type 0 too.
            [e.type_ids if self.token_types else [0] * len(e.ids) for e in encs],
            [e.offsets for e in encs],
            [[-1 if w is None else w for w in e.word_ids] for e in encs],
            [e.special_tokens_mask for e in encs],
        )

    def _clip(self, text: str, limit: int, floor: int = 0, step: int | None = None) -> str:
        """`text` cut at a space once the part before holds more than `limit` tokens, which truncation keeps the
        first of: the tokenizers library encodes a whole text before cutting it, and a 100 MB line took some 15 GB of
        token records (1.7 GB for 11 MB) to keep 128 tokens. Counted a chunk at a time between spaces, each chunk's
        tokens are the whole text's there (_splits_at_spaces): what is kept is exactly the whole text's truncation.
        `step`: characters a chunk (by default more than `limit` tokens in most texts, and few chunks)."""
        step = step or max(8 * limit, 1 << 14)
        if len(text) <= step:
            return text
        for end, count in self._counted_chunks(text, step):
            if count > max(limit, floor):  # `floor`: tokens the cut text must still have more of (_clip_pair)
                # A lone surrogate in the part cut off: the whole text, so that it is refused as before (see encode).
                return text if lone_surrogate(text[end:]) is not None else text[:end]
        return text

    def _clip_pair(self, a: str, b: str, limit: int) -> tuple[str, str]:
        """(a, b) clipped (_clip) so that longest-first truncation cuts them as it cuts the whole pair, which it does
        by their lengths alone: a long one to more tokens than the other keeps, the shorter in full staying the
        shorter (on which side an odd token goes). Two long texts were encoded whole, and tokenizers keeps every
        overflowing window of each, paired with every one of the other's: two 100,000-token texts, GBs."""
        clipped_a, clipped_b = self._clip(a, limit), self._clip(b, limit)
        cut_a, cut_b = len(clipped_a) < len(a), len(clipped_b) < len(b)
        if cut_a and cut_b:  # both long: the first is the longer (and gets the odd token) only if strictly longer
            first_longer = self._count(a) > self._count(b)
        else:
            first_longer = cut_a  # a long text is longer than the short one, clipped or not
        if first_longer:
            a, b = self._clip(a, limit, self._count(clipped_b)), clipped_b
        elif cut_a or cut_b:
            a, b = clipped_a, self._clip(b, limit, self._count(clipped_a))
        return self._trim_pair(a, b, limit)

    def _trim_pair(self, a: str, b: str, limit: int) -> tuple[str, str]:
        """(a, b) cut again, in chunks of a few times `limit` characters, to little more than longest-first keeps,
        their order by tokens kept (the longer in full the longer, the second on a tie): tokenizers records every
        overflowing window of one text paired with every one of the other's, so two texts of 4,000 tokens (the
        16,384-character chunks _clip cuts at) made 10,000 windows at max_length 40, seconds for one pair."""
        if len(a) + len(b) <= 8 * limit:
            return a, b
        step = 8 * limit
        if self._count(a) > self._count(b):
            b = self._clip(b, limit, step=step)
            return self._clip(a, limit, self._count(b), step), b
        a = self._clip(a, limit, step=step)
        return a, self._clip(b, limit, self._count(a), step)

    def _count(self, text: str) -> int:
        """`text`'s tokens, counted a chunk at a time between spaces (the memory of one chunk; _splits_at_spaces)."""
        end, count = [(0, 0), *self._counted_chunks(text, 1 << 14)][-1]  # a pair a chunk of 16,384 characters
        return count + len(self._tok.encode(text[end:], add_special_tokens=False).ids)

    def _counted_chunks(self, text: str, step: int):
        """(end, tokens of text[:end]) at the first space after each `step` characters, chunk by chunk (each chunk's
        tokens are the whole text's there: _splits_at_spaces); the part after the last such space is left out."""
        start = count = 0
        while (space := _SPACE.search(text, start + step)) is not None:
            count += len(self._tok.encode(text[start : space.start()], add_special_tokens=False).ids)
            start = space.start()
            yield start, count

    def encode_words(self, words: list[list[str]], *, max_length: int) -> Encoded:
        """Tokenize texts given as words (token classification data): `word_ids` index each text's words, so
        labels align to them; longer sequences are truncated to `max_length` tokens."""
        for i, w in enumerate(words):
            check_texts(w, f"words[{i}]")
        limit = positive_int("max_length", max_length)
        try:
            encs = self._truncated(limit).encode_batch(words, is_pretokenized=True)
        except TypeError:  # a lone surrogate in a word (see encode)
            for i, w in enumerate(words):
                check_unicode(w, f"words[{i}]")
            raise
        for i, enc in enumerate(encs):
            if len(enc.ids) > limit:  # truncation never cuts [CLS] and [SEP] (see encode)
                special = self._tok.num_special_tokens_to_add(False)
                raise ValueError(f"max_length {limit}: too short for the {special} special tokens around words[{i}]")
        return self._encoded(encs)

    def __call__(
        self, texts, pairs=None, *, max_length: int | None = None, truncation: bool = True, return_tensors: str = "np"
    ) -> dict[str, np.ndarray]:
        """transformers-style: a padded batch of input_ids, token_type_ids, attention_mask (numpy)."""
        if return_tensors != "np":
            raise ValueError(f"return_tensors={return_tensors!r}: only 'np' is supported")
        enc = self.encode(
            [texts] if isinstance(texts, str) else texts,
            None if pairs is None else ([pairs] if isinstance(pairs, str) else pairs),
            max_length=max_length,
            truncation=truncation,
        )
        pad_id = self.token_to_id(self.special_tokens["pad_token"]) or 0
        return pad(enc, int(enc.lengths().max(initial=0)), len(enc), pad_id, side=self.padding_side)


def pad(enc: Encoded, length: int, rows: int, pad_id: int, order=None, side: str = "right") -> dict[str, np.ndarray]:
    """Rows `order` (default all) of `enc`, padded to [rows, length] on `side`; extra rows are all padding."""
    order = range(len(enc)) if order is None else order
    ids = np.full((rows, length), pad_id, np.int32)
    types = np.zeros((rows, length), np.int32)
    mask = np.zeros((rows, length), np.int32)
    for r, i in enumerate(order):
        n = len(enc.ids[i])
        at = slice(length - n, length) if side == "left" else slice(0, n)
        ids[r, at], types[r, at], mask[r, at] = enc.ids[i], enc.type_ids[i], 1
    return {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}
