"""A thin layer over the checkpoint's fast WordPiece tokenizer (the `tokenizers` library): `WordPiece` encodes texts
(and pairs) with jaxbert's own padding and truncation, `pad` makes a batch of them.

Built as transformers 5's AutoTokenizer builds it (tokenizer_build.py), from the settings and tokens the files name
(tokenizer_settings.py, tokenizer_added.py). Padding and truncation are jaxbert's own: settings stored in
tokenizer.json (MiniLM's pads everything to 128) are cleared, but its truncation direction is the side cut where
tokenizer_config.json names none. Long texts are cut at spaces before encoding (tokenizer_clip.py).
"""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
from tokenizers import Tokenizer

from jaxbert.inputs import Arg, ArgumentError, check_texts, check_unicode, items, ordered, positive_int
from jaxbert.tokenizer_build import build
from jaxbert.tokenizer_clip import clip, clip_pairs, splits_at_spaces
from jaxbert.tokenizer_settings import CLEAN_UP, NO_LIMIT, SPECIAL

__all__ = ["NO_LIMIT", "SPECIAL", "Encoded", "WordPiece", "check_texts", "copy", "ordered", "pad"]


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


def copy(tok: Tokenizer) -> Tokenizer:
    """A copy of `tok` to set truncation on: its JSON, and encode_special_tokens, which that leaves out."""
    out = Tokenizer.from_str(tok.to_str())
    out.encode_special_tokens = tok.encode_special_tokens
    return out


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
        self._splits_at_spaces = splits_at_spaces(tokenizer)  # see tokenizer_clip.py

    @classmethod
    def from_dir(cls, directory: str) -> WordPiece:
        from jaxbert.sentence_dir import transformer_dir

        tok, settings = build(transformer_dir(directory))  # a sentence-transformers 0_Transformer/ subfolder's, if so
        return cls(tok, **settings)

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
        name="texts",
    ) -> Encoded:
        """Tokenize texts (and optional second segments), with [CLS]/[SEP] and token types 0/1.

        Longer than `max_length` (default: the tokenizer's model_max_length): truncated (longest first), or a
        ValueError naming the text when `truncation=False` (ending with `hint`, for callers that cut nothing).
        A text is named as the caller's item of its index (`name`: see inputs.items; a list's name or a function).
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
                    encs = tok.encode_batch([clip(self._tok, text, limit) for text in texts])
                else:
                    encs = tok.encode_batch(clip_pairs(self._tok, list(zip(texts, pairs)), limit))
            else:
                encs = tok.encode_batch(list(zip(texts, pairs)) if pairs is not None else texts)
        except TypeError:  # the library's only word on a lone surrogate: "TextEncodeInput must be Union[...]"
            check_unicode(texts, name)
            check_unicode(pairs or [], "pairs")
            raise
        for i, enc in enumerate(encs):
            if len(enc.ids) > limit and truncation:  # truncation never cuts [CLS] and [SEP]: no room for them
                special = self._tok.num_special_tokens_to_add(pairs is not None)
                raise _too_short(limit, special, items(name)(i))
            if len(enc.ids) > limit:
                more = f"{items(name)(i)} has {len(enc.ids)} tokens, more than "
                raise ArgumentError(more, Arg.showing("max_length", limit), f" ({hint})" if hint else "")
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

    def encode_words(self, words: list[list[str]], *, max_length: int, name="words") -> Encoded:
        """Tokenize texts given as words (token classification data): `word_ids` index each text's words, so
        labels align to them; longer sequences are truncated to `max_length` tokens. `name`: as encode's, of the
        lists of words."""
        name = items(name)
        for i, w in enumerate(words):
            check_texts(w, name(i))
        limit = positive_int("max_length", max_length)
        try:
            encs = self._truncated(limit).encode_batch(words, is_pretokenized=True)
        except TypeError:  # a lone surrogate in a word (see encode)
            for i, w in enumerate(words):
                check_unicode(w, name(i))
            raise
        for i, enc in enumerate(encs):
            if len(enc.ids) > limit:  # truncation never cuts [CLS] and [SEP] (see encode)
                raise _too_short(limit, self._tok.num_special_tokens_to_add(False), name(i))
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


def _too_short(limit: int, special: int, text: str) -> ArgumentError:
    """Truncation never cuts [CLS] and [SEP]: `limit` leaves the text no room."""
    return ArgumentError(
        Arg.showing("max_length", limit), f": too short for the {special} special tokens around {text}"
    )
