"""A thin layer over the checkpoint's fast WordPiece tokenizer (the `tokenizers` library).

From `tokenizer.json` when the checkpoint has one, else built from `vocab.txt` + `tokenizer_config.json`
(lower-casing, accent stripping, Chinese characters split one per token, `never_split`). Padding and
truncation are jaxbert's own: settings stored in tokenizer.json (MiniLM's pads everything to 128) are cleared.
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
from tokenizers import AddedToken, Tokenizer
from tokenizers.implementations import BertWordPieceTokenizer


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


def _check_texts(texts, name="texts") -> list[str]:
    if isinstance(texts, str):
        raise TypeError(f"{name} must be a list of strings, got a single string (wrap it in a list)")
    texts = list(texts)
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"{name}[{i}] is {type(text).__name__}, not a string")
    return texts


class WordPiece:
    def __init__(self, tokenizer: Tokenizer, model_max_length: int = 512):
        tokenizer.no_padding()
        tokenizer.no_truncation()
        self._tok = tokenizer
        self.model_max_length = model_max_length
        self.vocab = tokenizer.get_vocab()

    @classmethod
    def from_dir(cls, directory: str) -> "WordPiece":
        config = {}
        path = os.path.join(directory, "tokenizer_config.json")
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                config = json.load(f)
        max_len = config.get("model_max_length", 512)
        max_len = 512 if not isinstance(max_len, int) or max_len > 10**6 else max_len
        if os.path.isfile(os.path.join(directory, "tokenizer.json")):
            return cls(Tokenizer.from_file(os.path.join(directory, "tokenizer.json")), max_len)
        vocab = os.path.join(directory, "vocab.txt")
        if not os.path.isfile(vocab):
            raise FileNotFoundError(f"{directory}: no tokenizer (looked for tokenizer.json, vocab.txt)")
        lowercase = config.get("do_lower_case", True)
        strip = config.get("strip_accents")  # None: follow lowercase, as BERT's BasicTokenizer does
        wp = BertWordPieceTokenizer(vocab, clean_text=True, lowercase=lowercase,
                                    handle_chinese_chars=config.get("tokenize_chinese_chars", True),
                                    strip_accents=strip)
        tok = wp._tokenizer
        never_split = [t for t in (config.get("never_split") or []) if t in tok.get_vocab()]
        if never_split:  # whole tokens, matched before normalization, never split into word pieces
            tok.add_tokens([AddedToken(t, single_word=True, normalized=False) for t in never_split])
        return cls(tok, max_len)

    # -- vocabulary ------------------------------------------------------------------------------------------
    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def id_to_token(self, i: int) -> str | None:
        return self._tok.id_to_token(int(i))

    @property
    def mask_token(self) -> str:
        return "[MASK]"

    @property
    def mask_token_id(self) -> int | None:
        return self.token_to_id(self.mask_token)

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    # -- encoding --------------------------------------------------------------------------------------------
    def encode(self, texts, pairs=None, *, max_length: int | None = None, truncation: bool = True) -> Encoded:
        """Tokenize texts (and optional second segments), with [CLS]/[SEP] and token types 0/1.

        Longer than `max_length` (default: the tokenizer's model_max_length): truncated (longest first), or a
        ValueError naming the text when `truncation=False`.
        """
        texts = _check_texts(texts)
        if pairs is not None:
            pairs = _check_texts(pairs, "pairs")
            if len(pairs) != len(texts):
                raise ValueError(f"{len(texts)} texts but {len(pairs)} pairs")
        limit = max_length or self.model_max_length
        if truncation:
            self._tok.enable_truncation(limit)
        try:
            encs = self._tok.encode_batch(list(zip(texts, pairs)) if pairs is not None else texts)
        finally:
            self._tok.no_truncation()
        for i, enc in enumerate(encs):
            if len(enc.ids) > limit:
                raise ValueError(f"texts[{i}] has {len(enc.ids)} tokens, more than max_length {limit} "
                                 "(pass truncation=True to cut it)")
        return Encoded([e.ids for e in encs], [e.type_ids for e in encs], [e.offsets for e in encs],
                       [[-1 if w is None else w for w in e.word_ids] for e in encs],
                       [e.special_tokens_mask for e in encs])

    def __call__(self, texts, pairs=None, *, max_length: int | None = None, truncation: bool = True,
                 return_tensors: str = "np") -> dict[str, np.ndarray]:
        """transformers-style: a padded batch of input_ids, token_type_ids, attention_mask (numpy)."""
        if return_tensors != "np":
            raise ValueError(f"return_tensors={return_tensors!r}: only 'np' is supported")
        enc = self.encode([texts] if isinstance(texts, str) else texts,
                          None if pairs is None else ([pairs] if isinstance(pairs, str) else pairs),
                          max_length=max_length, truncation=truncation)
        return pad(enc, int(enc.lengths().max(initial=0)), len(enc), self.token_to_id("[PAD]") or 0)


def pad(enc: Encoded, length: int, rows: int, pad_id: int, order=None) -> dict[str, np.ndarray]:
    """Rows `order` (default all) of `enc`, padded to [rows, length]; extra rows are all padding."""
    order = range(len(enc)) if order is None else order
    ids = np.full((rows, length), pad_id, np.int32)
    types = np.zeros((rows, length), np.int32)
    mask = np.zeros((rows, length), np.int32)
    for r, i in enumerate(order):
        n = len(enc.ids[i])
        ids[r, :n], types[r, :n], mask[r, :n] = enc.ids[i], enc.type_ids[i], 1
    return {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}
