"""Long texts cut before the tokenizers library encodes them, to a little more than truncation keeps: it encodes a
whole text (and of a pair, every overflowing window of one text with every one of the other's) before cutting it.
Cut at spaces, which BERT's tokens never cross (splits_at_spaces), so the tokens kept are exactly the whole text's
truncation."""

from __future__ import annotations

import re

from tokenizers import Tokenizer

from jaxbert.inputs import lone_surrogate

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


def splits_at_spaces(tok: Tokenizer) -> bool:
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


def clip(tok: Tokenizer, text: str, limit: int, floor: int = 0, step: int | None = None) -> str:
    """`text` cut at a space once the part before holds more than `limit` tokens, which truncation keeps the
    first of: the tokenizers library encodes a whole text before cutting it, and a 100 MB line took some 15 GB of
    token records (1.7 GB for 11 MB) to keep 128 tokens. Counted a chunk at a time between spaces, each chunk's
    tokens are the whole text's there (splits_at_spaces): what is kept is exactly the whole text's truncation.
    `step`: characters a chunk (by default more than `limit` tokens in most texts, and few chunks)."""
    step = step or max(8 * limit, 1 << 14)
    if len(text) <= step:
        return text
    for end, tokens in _counted_chunks(tok, text, step):
        if tokens > max(limit, floor):  # `floor`: tokens the cut text must still have more of (clip_pair)
            # A lone surrogate in the part cut off: the whole text, so that it is refused as before (see encode).
            return text if lone_surrogate(text[end:]) is not None else text[:end]
    return text


def clip_pair(tok: Tokenizer, a: str, b: str, limit: int) -> tuple[str, str]:
    """(a, b) clipped (clip) so that longest-first truncation cuts them as it cuts the whole pair, which it does
    by their lengths alone: a long one to more tokens than the other keeps, the shorter in full staying the
    shorter (on which side an odd token goes). Two long texts were encoded whole, and tokenizers keeps every
    overflowing window of each, paired with every one of the other's: two 100,000-token texts, GBs."""
    clipped_a, clipped_b = clip(tok, a, limit), clip(tok, b, limit)
    cut_a, cut_b = len(clipped_a) < len(a), len(clipped_b) < len(b)
    if cut_a and cut_b:  # both long: the first is the longer (and gets the odd token) only if strictly longer
        first_longer = count(tok, a) > count(tok, b)
    else:
        first_longer = cut_a  # a long text is longer than the short one, clipped or not
    # The order by tokens, where known (_trim_pair's): both counted whole, or the longer cut to more tokens than the
    # other has (clip's `floor`); a longer kept whole beside a short one may yet have fewer tokens.
    order = first_longer if cut_a and cut_b else None
    if first_longer:
        longer, b = clip(tok, a, limit, count(tok, clipped_b)), clipped_b
        order, a = True if len(longer) < len(a) else order, longer
    elif cut_a or cut_b:
        longer, a = clip(tok, b, limit, count(tok, clipped_a)), clipped_a
        order, b = False if len(longer) < len(b) else order, longer
    return _trim_pair(tok, a, b, limit, order)


def _trim_pair(tok: Tokenizer, a: str, b: str, limit: int, first_longer: bool | None = None) -> tuple[str, str]:
    """(a, b) cut again, in chunks of a few times `limit` characters, to little more than longest-first keeps,
    their order by tokens kept (the longer in full the longer, the second on a tie): tokenizers records every
    overflowing window of one text paired with every one of the other's, so two texts of 4,000 tokens (the
    16,384-character chunks clip cuts at) made 10,000 windows at max_length 40, seconds for one pair.
    `first_longer`: that order where clip_pair knows it (None: counted here)."""
    if len(a) + len(b) <= 8 * limit:
        return a, b
    step = 8 * limit
    if count(tok, a) > count(tok, b) if first_longer is None else first_longer:
        b = clip(tok, b, limit, step=step)
        return clip(tok, a, limit, count(tok, b), step), b
    a = clip(tok, a, limit, step=step)
    return a, clip(tok, b, limit, count(tok, a), step)


def count(tok: Tokenizer, text: str) -> int:
    """`text`'s tokens, counted a chunk at a time between spaces (the memory of one chunk; splits_at_spaces)."""
    end, tokens = [(0, 0), *_counted_chunks(tok, text, 1 << 14)][-1]  # a pair a chunk of 16,384 characters
    return tokens + len(tok.encode(text[end:], add_special_tokens=False).ids)


def _counted_chunks(tok: Tokenizer, text: str, step: int):
    """(end, tokens of text[:end]) at the first space after each `step` characters, chunk by chunk (each chunk's
    tokens are the whole text's there: splits_at_spaces); the part after the last such space is left out."""
    start = tokens = 0
    while (space := _SPACE.search(text, start + step)) is not None:
        tokens += len(tok.encode(text[start : space.start()], add_special_tokens=False).ids)
        start = space.start()
        yield start, tokens
