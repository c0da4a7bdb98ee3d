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


def clip(tok: Tokenizer, text: str, limit: int) -> str:
    """`text` cut at a space once the part before holds more than `limit` tokens, which truncation keeps the
    first of: the tokenizers library encodes a whole text before cutting it, and a 100 MB line took some 15 GB of
    token records (1.7 GB for 11 MB) to keep 128 tokens. Counted a chunk at a time between spaces, each chunk's
    tokens are the whole text's there (splits_at_spaces): what is kept is exactly the whole text's truncation.
    A chunk: more than `limit` tokens in most texts, and few chunks."""
    step = max(8 * limit, 1 << 14)
    if len(text) <= step:
        return text
    for end, tokens in _counted_chunks(tok, text, step):
        if tokens > limit:
            # A lone surrogate in the part cut off: the whole text, so that it is refused as before (see encode).
            return text if lone_surrogate(text[end:]) is not None else text[:end]
    return text


def clip_pairs(tok: Tokenizer, pairs: list[tuple[str, str]], limit: int) -> list[tuple[str, str]]:
    """Each pair (a, b) cut at spaces so that longest-first truncation cuts it as it cuts the whole pair, which it
    does by the two lengths alone: the longer (the second on a tie) takes the odd token, the shorter keeps what the
    other leaves. So the shorter is cut once it holds more than `limit` tokens, the longer once it holds more than
    that and than the shorter kept: their order stays. tokenizers records every overflowing window of one text paired
    with every one of the other's (two texts of 4,000 tokens: 10,000 windows at max_length 40, seconds a pair).
    Both texts are counted a chunk at a time until their order is known and the cuts are found: every pair's next
    chunks in one encode_batch a round (both cores; one text at a time took twice tokenizers' own time)."""
    step = 8 * limit  # characters a first chunk: more than `limit` tokens in most texts
    texts = {i: (_Chunks(a, step), _Chunks(b, step)) for i, (a, b) in enumerate(pairs) if len(a) + len(b) > step}
    while wanted := [t for a, b in texts.values() for t in _wanted(a, b, limit)]:
        _count_next(tok, wanted)
    out = list(pairs)
    for i, (a, b) in texts.items():
        first_longer = _order(a, b)
        short, long = (b, a) if first_longer else (a, b)
        kept, tokens = short.cut(limit)
        cut = long.cut(max(limit, tokens))[0]
        out[i] = (cut, kept) if first_longer else (kept, cut)
    return out


class _Chunks:
    """A text counted a chunk at a time between spaces (each chunk's tokens are the whole text's there:
    splits_at_spaces): `ends` the spaces counted up to and the tokens before each; `done` once the rest is counted
    too (`tokens` is then the whole text's). Four chunks of `step` characters (the cuts are near: few windows), then
    each twice the last, up to 65,536 (few rounds for a long text)."""

    def __init__(self, text: str, step: int):
        self.text, self.step, self.start, self.tokens, self.ends, self.done = text, step, 0, 0, [], False

    def next_chunk(self) -> tuple[int, int]:
        size = min(self.step << max(0, min(len(self.ends) - 3, 20)), max(self.step, 1 << 16))
        space = _SPACE.search(self.text, self.start + size)
        return self.start, len(self.text) if space is None else space.start()

    def counted(self, end: int, tokens: int) -> None:
        self.tokens += tokens
        self.done = end == len(self.text)
        if not self.done:
            self.ends.append((end, self.tokens))
        self.start = end

    def cut(self, floor: int) -> tuple[str, int]:
        """The text up to the first space counted past more than `floor` tokens, and its tokens; else all of it (a
        lone surrogate in the part cut off: all of it too, so that it is refused as before, see encode)."""
        end, tokens = next(((end, tokens) for end, tokens in self.ends if tokens > floor), (None, 0))
        if end is None or lone_surrogate(self.text[end:]) is not None:
            return self.text, self.tokens
        return self.text[:end], tokens


def _order(a: _Chunks, b: _Chunks) -> bool | None:
    """Whether a has more tokens than b (a tie: b is the longer), once the counts so far tell; else None."""
    if a.done and (b.done or b.tokens >= a.tokens):
        return a.tokens > b.tokens
    return True if b.done and a.tokens > b.tokens else None


def _wanted(a: _Chunks, b: _Chunks, limit: int) -> list[_Chunks]:
    """Which of a pair's texts need another chunk counted: both (those not done) until their order is known, then
    the longer until it holds more than `limit` tokens and than the shorter keeps (the shorter is done by then)."""
    first_longer = _order(a, b)
    if first_longer is None:
        return [t for t in (a, b) if not t.done]
    short, long = (b, a) if first_longer else (a, b)
    return [] if long.done or long.tokens > max(limit, short.cut(limit)[1]) else [long]


def _count_next(tok: Tokenizer, texts: list[_Chunks], budget: int = 1 << 20) -> None:
    """Count each text's next chunk, in as few encode_batch calls as keep under `budget` characters each."""
    chunks = [(t, *t.next_chunk()) for t in texts]
    while chunks:
        size, n = 0, 0
        while n < len(chunks) and (n == 0 or size + chunks[n][2] - chunks[n][1] <= budget):
            size, n = size + chunks[n][2] - chunks[n][1], n + 1
        batch, chunks = chunks[:n], chunks[n:]
        encs = tok.encode_batch([t.text[start:end] for t, start, end in batch], add_special_tokens=False)
        for (t, _, end), enc in zip(batch, encs):
            t.counted(end, len(enc.ids))


def _counted_chunks(tok: Tokenizer, text: str, step: int):
    """(end, tokens of text[:end]) at the first space after each `step` characters, chunk by chunk (each chunk's
    tokens are the whole text's there: splits_at_spaces); the part after the last such space is left out."""
    start = tokens = 0
    while (space := _SPACE.search(text, start + step)) is not None:
        tokens += len(tok.encode(text[start : space.start()], add_special_tokens=False).ids)
        start = space.start()
        yield start, tokens
