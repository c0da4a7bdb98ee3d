"""tag's host-side parts around the model (tasks.tag runs it): pre-split words joined into texts as the
token-classification pipeline's is_split_into_words reads them, the stride of the windows over a long text, each
word's label from its first word piece, and the pipeline's entities per text (entities.py)."""

from __future__ import annotations

import unicodedata

import numpy as np

from jaxbert import entities, windows
from jaxbert.inputs import Arg, ArgumentError, only, ordered
from jaxbert.tokenizer import NO_LIMIT


def words(text: str, offsets, word_ids, probs: np.ndarray, names: list[str]) -> list[dict]:
    """One text's words {word, label, score, start, end}: each labelled by its first word piece's probabilities
    (`probs` [tokens, labels], `names` the labels), spanning its pieces' characters of `text`."""
    found: dict[int, dict] = {}
    for pos, word in enumerate(word_ids):
        if word < 0:
            continue
        start, end = offsets[pos]
        if word not in found:
            best = int(probs[pos].argmax())
            found[word] = {"label": names[best], "score": float(probs[pos, best]), "start": start, "end": end}
        found[word]["end"] = end
    # Accents the tokenizer stripped (NFD text) after a word's last letter are its own; one it kept is a token's,
    # maybe of the next word (after a CJK character or punctuation, where it starts a word): not taken twice.
    kept = {start for (start, _), word in zip(offsets, word_ids) if word >= 0}
    for w in found.values():
        while w["end"] < len(text) and w["end"] not in kept and unicodedata.category(text[w["end"]]) == "Mn":
            w["end"] += 1
    return [{"word": text[w["start"] : w["end"]], **w} for w in found.values()]


def joined(tok, texts, delimiter: str):
    """Pre-split words as the token-classification pipeline's is_split_into_words reads them: a list of word lists
    (a list of strings alone is one text's words), each text its words joined by `delimiter`, each token's
    characters those of its word moved to where the word starts in that text. Returns (texts, their Encoded)."""
    if not isinstance(delimiter, str):
        raise TypeError(f"delimiter must be a string, got {type(delimiter).__name__}")
    if isinstance(texts, str):
        raise TypeError("is_split_into_words: texts must be lists of words, got a single string")
    texts = ordered(texts)
    lists = [isinstance(t, (list, tuple)) for t in texts]
    if any(lists) and not all(lists):
        i = lists.index(False)
        raise TypeError(f"is_split_into_words: texts[{i}] is {type(texts[i]).__name__}, not a list of words")
    words = [list(w) for w in texts] if any(lists) or not texts else [texts]
    # The tokenizer's `words[i][j]` is texts[i][j] here, or texts[j] of one text's words.
    enc = tok.encode_words(words, max_length=NO_LIMIT, name="texts" if any(lists) else only("texts"))
    joined = []
    for t, w in enumerate(words):
        starts = [0]
        for word in w[:-1]:
            starts.append(starts[-1] + len(word) + len(delimiter))
        enc.offsets[t] = [
            (a + starts[i], b + starts[i]) if i >= 0 else (a, b) for (a, b), i in zip(enc.offsets[t], enc.word_ids[t])
        ]
        joined.append(delimiter.join(w))
    return joined, enc


def entity_lists(tok, names, texts, enc, pieces, home, logits, how: str, ignore) -> list[list[dict]]:
    """tag's entities per text, from each window's own probabilities as the pipeline's chunks (entities.py); for
    "none", which the pipeline reads in one window only, each token once, from its window of most context."""
    if how == "none":
        parts = [(t, enc, t, x) for t, x in enumerate(windows.join(enc, pieces, home, logits))]
    else:
        parts = [(t, pieces, w, logits[w]) for w, (t, _) in enumerate(home)]
    out: list[list[dict]] = [[] for _ in texts]
    for t, source, i, x in parts:
        ids, offsets, special = source.ids[i], source.offsets[i], source.special[i]
        pre = entities.tokens(tok, texts[t], ids, offsets, special, entities.softmax(x), how not in ("none", "simple"))
        out[t] += entities.aggregate(tok, names, pre, how, ignore)
    several = np.bincount(np.asarray([t for t, _ in home], int), minlength=len(texts)) > 1
    return [entities.merge_overlapping(e) if many and how != "none" else e for e, many in zip(out, several)]


def window_stride(stride, length: int, tok) -> int:
    """tag's window overlap: an integer in [0, the window's room for text), by default half of it, at most 128."""
    room = length - tok.num_special_tokens_to_add(False)
    if room < 1:
        raise ArgumentError(Arg.showing("max_length", length), ": too short for the special tokens around a text")
    if stride is None:
        return min(room // 2, 128)
    if isinstance(stride, bool) or not isinstance(stride, (int, np.integer)):
        raise TypeError(f"stride must be an integer, got {type(stride).__name__} {stride!r}")
    if not 0 <= stride < room:
        window = Arg.showing("max_length", length)
        raise ArgumentError(f"stride {stride}: must be in [0, {room}) (", window, " less its special tokens)")
    return int(stride)
