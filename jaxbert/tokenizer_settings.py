"""What a checkpoint's tokenizer files set, read as transformers reads them: tokenizer_config.json's settings
(model_max_length, the truncation and padding sides, model_input_names, split_special_tokens, the clean-up of spaces)
and the special tokens it and special_tokens_map.json name; a wrong value is named with its file and key."""

from __future__ import annotations

from tokenizers import Tokenizer

from jaxbert.files import existing_file, read_json

# "No limit": transformers writes model_max_length ~1e30 (or none at all) for it, and then the model's positions
# decide (Bert.max_length, sentence-transformers' max_seq_length); kept small enough for the tokenizers library.
NO_LIMIT = 10**6

# transformers' BERT special tokens and their default names; tokenizer_config.json / special_tokens_map.json rename
SPECIAL = dict(unk_token="[UNK]", sep_token="[SEP]", cls_token="[CLS]", pad_token="[PAD]", mask_token="[MASK]")


def setting(config: dict, path: str, key: str, kinds: tuple, default):
    value = config.get(key, default)
    if not isinstance(value, kinds) or (bool not in kinds and isinstance(value, bool)):
        raise ValueError(f"{path}: {key}={value!r} has the wrong type")
    return value


def token_types(config: dict, path: str) -> bool:
    """Whether the tokenizer gives token types: tokenizer_config.json's model_input_names names them (as
    transformers reads it; BERT's default names them)."""
    names = config.get("model_input_names")
    if names is None:
        return True
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"{path}: model_input_names={names!r} is not a list of names")
    return "token_type_ids" in names


def read_config(directory: str) -> tuple[dict, str]:
    path = existing_file(directory, "tokenizer_config.json")
    return (read_json(path), path) if path else ({}, "tokenizer_config.json")


def model_max_length(config: dict, path: str) -> int:
    """tokenizer_config.json's model_max_length: a whole number of tokens, or NO_LIMIT where it is transformers'
    huge "no limit" or missing (read as 512 before: a model of more positions had its texts cut at 512)."""
    value = setting(config, path, "model_max_length", (int, float), NO_LIMIT)
    if isinstance(value, float) and not value.is_integer():  # 0.5 would become 0 tokens; NaN, inf
        raise ValueError(f"{path}: model_max_length={value!r} must be a whole number of tokens")
    if value < 1:
        raise ValueError(f"{path}: model_max_length={value!r} must be positive")
    return NO_LIMIT if value > NO_LIMIT else int(value)


def split_special(config: dict, path: str) -> bool:
    """tokenizer_config.json's split_special_tokens: transformers then reads "[MASK]" or "[SEP]" written in a text as
    the text it is (word pieces), not as the special token."""
    return setting(config, path, "split_special_tokens", (bool,), False)


def side(config: dict, path: str, key: str, default: str = "right") -> str:
    """Which end of a long text is cut (key truncation_side) or of a short one padded (padding_side): transformers'
    tokenizers read tokenizer_config.json's, and where it has none the direction of tokenizer.json's truncation or
    padding (`default`)."""
    value = setting(config, path, key, (str,), default)
    if value not in ("left", "right"):
        raise ValueError(f"{path}: {key}={value!r} must be 'left' or 'right'")
    return value


def tokens_of(value) -> list:
    """The token strings of a special-tokens entry: a string, an AddedToken dict, or a list of them."""
    if isinstance(value, list):
        return [t for v in value for t in tokens_of(v)]
    return [value.get("content")] if isinstance(value, dict) else [value]


def special_tokens(directory: str, config: dict, config_path: str) -> dict[str, str]:
    """The special tokens' names as transformers reads them: tokenizer_config.json's, special_tokens_map.json's
    over them unless tokenizer_config.json has added_tokens_decoder; a vocab.txt tokenizer built with the
    default names put [CLS]/[SEP] (101/102) where transformers puts a renamed cls_token's and sep_token's ids."""
    names = {key: (config_path, config.get(key, default)) for key, default in SPECIAL.items()}
    path = existing_file(directory, "special_tokens_map.json")
    if path and "added_tokens_decoder" not in config:
        names.update({key: (path, value) for key, value in read_json(path).items() if key in SPECIAL})
    for key, (where, value) in names.items():
        token = (tokens_of(value) or [None])[0]
        if not isinstance(token, str) or not token:
            raise ValueError(f"{where}: {key}={value!r} is not a token")
        names[key] = token
    return names


def additional_special(directory: str, config: dict) -> list[str]:
    """The tokens tokenizer_config.json and special_tokens_map.json list as additional_special_tokens (or
    extra_special_tokens): transformers matches each in a text as one token and counts it among all_special_ids
    (never masked by its language-modelling collators)."""
    path = existing_file(directory, "special_tokens_map.json")
    found = []
    for settings in (config, read_json(path) if path else {}):
        for key in ("additional_special_tokens", "extra_special_tokens"):
            value = settings.get(key)
            value = list(value.values()) if isinstance(value, dict) and "content" not in value else value
            found += [t for t in tokens_of(value or []) if isinstance(t, str) and t not in found]
    return found


# transformers' clean_up_tokenization, in its order
CLEAN_UP = [(" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m")]
CLEAN_UP += [(" 's", "'s"), (" 've", "'ve"), (" 're", "'re")]


def clean_up(config: dict, path: str, tok: Tokenizer) -> bool:
    """Whether decoding cleans up spaces as transformers 5 does: tokenizer_config.json's
    clean_up_tokenization_spaces (false when missing), never for a BPE model unless it insists."""
    if not setting(config, path, "clean_up_tokenization_spaces", (bool, type(None)), False):
        return False
    insists = "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output"
    return type(tok.model).__name__ != "BPE" or bool(config.get(insists))
