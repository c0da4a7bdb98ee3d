"""Texts longer than the model's window cut into overlapping windows, for token classification (`Bert.tag`),
and the windows' per-token outputs put back together, one per token of the whole text.

Each window is the text's leading special tokens ([CLS]), `length` minus those and the trailing ones of its
content tokens, and the trailing special tokens ([SEP]); a window repeats the last `stride` content tokens of the
one before it (transformers' token-classification pipeline's `stride`, from the fast tokenizer's overflow). A
token seen in several windows takes the window where it has the most context on its nearer side (BERT's
run_squad `_check_is_max_context`), so a word at a window's edge is read where it is in the middle.
"""

from __future__ import annotations

import numpy as np

from jaxbert.tokenizer import Encoded


def _ends(special: list[int]) -> tuple[int, int]:
    """How many special tokens lead and trail a single text's encoding."""
    head = next((i for i, s in enumerate(special) if not s), len(special))
    tail = next((i for i, s in enumerate(reversed(special)) if not s), 0)
    return head, tail


def split(enc: Encoded, length: int, stride: int) -> tuple[Encoded, list[tuple[int, int]]]:
    """Windows of at most `length` tokens over each text of `enc` (a text that fits is its own one window), and
    each window's (text index, position of its first content token in that text)."""
    out = Encoded([], [], [], [], [])
    home = []
    for t in range(len(enc)):
        ids, types, special = enc.ids[t], enc.type_ids[t], enc.special[t]
        head, tail = _ends(special)
        content = length - head - tail
        if len(ids) <= length or content <= stride:  # fits, or no window can make progress (the caller checks)
            spans = [(head, len(ids) - tail)]
        else:
            starts = range(head, len(ids) - tail - stride, content - stride)
            spans = [(a, min(a + content, len(ids) - tail)) for a in starts]
        for a, b in spans:
            keep = [*range(head), *range(a, b), *range(len(ids) - tail, len(ids))]
            out.ids.append([ids[i] for i in keep])
            out.type_ids.append([types[i] for i in keep])
            out.offsets.append([enc.offsets[t][i] for i in keep])
            out.word_ids.append([enc.word_ids[t][i] for i in keep])
            out.special.append([special[i] for i in keep])
            home.append((t, a))
    return out, home


def join(enc: Encoded, windows: Encoded, home: list[tuple[int, int]], outputs: list[np.ndarray]) -> list[np.ndarray]:
    """Per text of `enc`, its per-token outputs [tokens, ...]: each token's from the window where it has the most
    context (min(tokens before it, tokens after it) in the window's content, + 0.01 × the content's length to break
    ties, as run_squad), the first such window on a tie; special tokens from the text's first window."""
    out: list = [None] * len(enc)
    best: list = [None] * len(enc)
    for w, (t, a) in enumerate(home):
        head, tail = _ends(windows.special[w])
        n = len(windows.ids[w]) - head - tail
        x = outputs[w]
        if out[t] is None:
            out[t] = np.zeros((len(enc.ids[t]), *x.shape[1:]), x.dtype)
            best[t] = np.full(len(enc.ids[t]), -1.0)
            out[t][:head], out[t][len(enc.ids[t]) - tail :] = x[:head], x[len(x) - tail :]
        j = np.arange(n)
        score = np.minimum(j, n - 1 - j) + 0.01 * n
        better = score > best[t][a : a + n]
        out[t][a : a + n][better] = x[head : head + n][better]
        best[t][a : a + n][better] = score[better]
    return out
