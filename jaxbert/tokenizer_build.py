"""Building a checkpoint's tokenizer as transformers 5's AutoTokenizer builds it: from `tokenizer.json` as it is,
except that its BertTokenizer (tokenizer_class BertTokenizer or an alias, or none named beside a BERT config.json)
takes only tokenizer.json's vocabulary and added tokens and builds the rest from `tokenizer_config.json`; without
tokenizer.json, from `vocab.txt` + `tokenizer_config.json` alike. A tokenizer_class transformers builds another way is
refused."""

from __future__ import annotations

from tokenizers import Tokenizer
from tokenizers.implementations import BertWordPieceTokenizer

from jaxbert import tokenizer_settings as settings
from jaxbert.files import existing_file, read_json
from jaxbert.tokenizer_added import named_with_flags, refuse_added_tokens, with_added, with_additional


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


def builds_bert_tokenizer(directory: str, config: dict, config_path: str, vocab_only: bool) -> bool:
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


def _load(path: str, build):
    """Build a tokenizer from `path`; the tokenizers library raises many types for a corrupt file."""
    try:
        return build()
    except Exception as e:  # noqa: BLE001 - Rust errors surface as plain Exception
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ValueError(f"{path}: not a readable tokenizer file ({first})") from None


def build(directory: str) -> tuple[Tokenizer, dict]:
    """The tokenizer of `directory` (a transformers checkpoint's) and WordPiece's settings read from its files."""
    config, config_path = settings.read_config(directory)
    found = dict(
        model_max_length=settings.model_max_length(config, config_path),
        token_types=settings.token_types(config, config_path),
        special_tokens=settings.special_tokens(directory, config, config_path),
    )
    options = dict(
        lowercase=settings.setting(config, config_path, "do_lower_case", (bool,), True),
        strip_accents=settings.setting(config, config_path, "strip_accents", (bool, type(None)), None),
        handle_chinese_chars=settings.setting(config, config_path, "tokenize_chinese_chars", (bool,), True),
    )
    path = existing_file(directory, "tokenizer.json")
    build = _from_tokenizer_json if path else _from_vocab
    return build(directory, config, config_path, path, options, found)


def _from_tokenizer_json(directory, config, config_path, path, options, found) -> tuple[Tokenizer, dict]:
    special = found["special_tokens"]
    tok = _load(path, lambda: Tokenizer.from_file(path))
    side = (tok.truncation or {}).get("direction", "right")
    found["truncation_side"] = settings.side(config, config_path, "truncation_side", side)
    side = (tok.padding or {}).get("direction", "right")
    found["padding_side"] = settings.side(config, config_path, "padding_side", side)
    if builds_bert_tokenizer(directory, config, config_path, vocab_only=False):
        tok = _as_bert_tokenizer(path, tok, options, special)
    refuse_added_tokens(directory, config, config_path, tok, "tokenizer.json")
    with_added(directory, config, config_path, tok, special)
    found["additional_special"] = with_additional(tok, settings.additional_special(directory, config))
    found["clean_up_spaces"] = settings.clean_up(config, config_path, tok)
    tok.encode_special_tokens = settings.split_special(config, config_path)
    return _with_unknown(path, tok), found


def _from_vocab(directory, config, config_path, _, options, found) -> tuple[Tokenizer, dict]:
    special = found["special_tokens"]
    vocab = existing_file(directory, "vocab.txt")
    if not vocab:
        raise FileNotFoundError(f"{directory}: no tokenizer (looked for tokenizer.json, vocab.txt)")
    _no_byte_order_mark(vocab)
    builds_bert_tokenizer(directory, config, config_path, vocab_only=True)
    found["truncation_side"] = settings.side(config, config_path, "truncation_side")
    options.update(special)
    tok = _load(vocab, lambda: BertWordPieceTokenizer(vocab, clean_text=True, **options)._tokenizer)
    tok = _with_unknown(vocab, tok)
    refuse_added_tokens(directory, config, config_path, tok, "vocab.txt")
    tok.add_tokens(named_with_flags(directory, config))
    with_added(directory, config, config_path, tok, special)
    found["additional_special"] = with_additional(tok, settings.additional_special(directory, config))
    found["padding_side"] = settings.side(config, config_path, "padding_side")
    tok.encode_special_tokens = settings.split_special(config, config_path)
    found["clean_up_spaces"] = settings.clean_up(config, config_path, tok)
    return tok, found
