"""The tokens transformers adds to a checkpoint's tokenizer: added_tokens.json's, tokenizer_config.json's
added_tokens_decoder (with their flags), the special tokens the files name and the additional special tokens. Each
must already be in the vocabulary read (jaxbert adds none past the model's embeddings)."""

from __future__ import annotations

from tokenizers import Tokenizer

from jaxbert.files import existing_file, read_json
from jaxbert.tokenizer_settings import SPECIAL, additional_special, tokens_of


def refuse_added_tokens(directory: str, config: dict, config_path: str, tok: Tokenizer, name: str) -> None:
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
        added += [(config_path, token) for entry in decoder.values() for token in tokens_of(entry)]
    path = existing_file(directory, "special_tokens_map.json")
    for where, settings in ((path, read_json(path) if path else {}), (config_path, config)):
        for key, value in settings.items():
            if key.endswith("_token") or key in ("additional_special_tokens", "extra_special_tokens"):
                added += [(where, token) for token in tokens_of(value)]
    for where, token in added:
        if isinstance(token, str) and tok.token_to_id(token) is None:
            raise ValueError(
                f"{where}: adds the token {token!r}, which {name} lacks (jaxbert adds no tokens to the vocabulary read)"
            )


# AddedToken's flags as tokenizer_config.json's added_tokens_decoder writes them
FLAGS = ("single_word", "lstrip", "rstrip", "normalized", "special")


def with_added(directory: str, config: dict, config_path: str, tok: Tokenizer, special: dict[str, str]) -> None:
    """Add to `tok` (each token in its vocabulary: refuse_added_tokens checked) the tokens transformers adds:
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
        named = {*special.values(), *additional_special(directory, config)}
        added = [AddedToken(t, normalized=t not in named, special=t in named) for t in read_json(path)]
    tok.add_tokens(added)


def named_with_flags(directory: str, config: dict) -> list:
    """The special tokens a vocab.txt tokenizer's files name as token objects, with their flags, as transformers
    adds them (special_tokens_map.json's where tokenizer_config.json has no added_tokens_decoder, else
    tokenizer_config.json's AddedToken): a mask_token {"content": "[MASK]", "lstrip": true} took the spaces before
    it there, and a single_word one is no mask inside a word. with_added's tokens, added after, replace them."""
    from tokenizers import AddedToken

    entries = {k: v for k, v in config.items() if k in SPECIAL and isinstance(v, dict) and v.get("__type")}
    path = existing_file(directory, "special_tokens_map.json")
    if path and "added_tokens_decoder" not in config:
        entries.update({k: v for k, v in read_json(path).items() if k in SPECIAL})
    flags = lambda entry: {k: entry[k] for k in FLAGS[:4] if isinstance(entry.get(k), bool)}  # noqa: E731
    return [AddedToken(v["content"], special=True, **flags(v)) for v in entries.values() if isinstance(v, dict)]


def with_additional(tok: Tokenizer, tokens: list[str]) -> tuple[str, ...]:
    """Make `tokens` (each in the vocabulary: refuse_added_tokens checked) special tokens of `tok`, matched whole in
    a text as transformers matches them ("[unused1]" was split into "[", "unused", "##1", "]")."""
    tok.add_special_tokens(tokens)
    return tuple(tokens)
