"""Question-answering windows: (question, context) pairs cut into overlapping windows of token ids with the
context's character offsets (`windows`; transformers' run_qa.py prepare_*_features), and an answer's token labels
in a window (`label`). qa.py re-exports every name here.

Windows come from the `tokenizers` library's own truncation with stride (what transformers' fast tokenizer calls
with `truncation="only_second", return_overflowing_tokens=True, stride=doc_stride`): the question is never cut,
each window repeats the last `doc_stride` context tokens of the previous one. A tokenizer padding on the left puts
the context first and the question after it (`truncation="only_first"`), as run_qa.py (pad_on_right) and the
pipeline (question_first) do.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref

from jaxbert.inputs import Arg, ArgumentError, check_unicode, only

NO_SPAN = (-1, -1)  # offsets of tokens that are not in the context (question, [CLS], [SEP], padding)

_lock = threading.Lock()
_tokenizers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _context_first(tok) -> bool:
    """Whether windows read [CLS] context [SEP] question [SEP]: run_qa.py and the pipeline put the question after
    the context when the tokenizer pads on the left (tokenizer_config.json's padding_side)."""
    return tok.padding_side == "left"


def _window_tokenizer(tok, max_length: int, stride: int):
    """A copy of the WordPiece's tokenizer that truncates the context with overflow, from the side its
    truncation_side names as transformers' tokenizer does (tokenizer_config.json's "left": the first window ends
    the context), built once per setting: tokenizers' truncation is shared mutable state, see tokenizer.WordPiece."""
    from jaxbert.tokenizer import copy as copy_of

    with _lock:
        cache = _tokenizers.setdefault(tok, {})
        if (max_length, stride) not in cache:
            copy = copy_of(tok.backend)
            strategy = "only_first" if _context_first(tok) else "only_second"
            copy.enable_truncation(max_length, stride=stride, strategy=strategy, direction=tok.truncation_side)
            cache[max_length, stride] = copy
        return cache[max_length, stride]


@dataclasses.dataclass
class Windows:
    """Feature f is window number k of example example[f] (k counting that example's windows)."""

    ids: list[list[int]]
    type_ids: list[list[int]]
    offsets: list[list[tuple[int, int]]]  # character span in the context, NO_SPAN outside it
    example: list[int]
    encodings: list  # tokenizers.Encoding of each window (words, for the pipeline's word-aligned answers)
    context: int = 1  # the context's sequence index in each window (0 when it comes first: _context_first)


FLAGS = ("--max-seq-length", "--doc-stride")  # training's names of windows' length and stride


def windows(
    tok, questions: list[str], contexts: list[str], max_length: int, stride: int, names=FLAGS, one: bool = False
) -> Windows:
    """Every example's windows, in example order. Questions lose their leading whitespace (run_qa.py: some
    SQuAD questions start with many spaces, which would eat the context's room). `names` name the length and
    stride where a question leaves no room (the caller's flags or arguments); `one`: the example is the caller's
    one question and context (Bert.answer's arguments), named so rather than as items of lists."""
    wtok = _window_tokenizer(tok, max_length, stride)
    pairs = [(q.lstrip(), c) for q, c in zip(questions, contexts)]
    _check_room(tok, pairs, max_length, stride, names, one)
    context = 0 if _context_first(tok) else 1
    pairs = [(c, q) for q, c in pairs] if context == 0 else pairs
    try:
        encs = wtok.encode_batch(pairs)
    except Exception:  # noqa: BLE001 - the tokenizers library raises plain Exception; find the culprit
        # a lone surrogate: the library names neither text nor place
        check_unicode(questions, only("question") if one else "questions")
        check_unicode(contexts, only("context") if one else "contexts")
        for i, pair in enumerate(pairs):
            try:
                wtok.encode(*pair)
            except Exception as e:  # noqa: BLE001
                n = len(tok.backend.encode(pair[1 - context]).ids)
                raise _no_room(i, n, max_length, stride, names, str(e).strip().splitlines()[0], one) from None
        raise
    out = Windows([], [], [], [], [], context)
    for i, enc in enumerate(encs):
        for w in [enc, *enc.overflowing]:
            seq = w.sequence_ids
            out.ids.append(w.ids)
            out.type_ids.append(w.type_ids if tok.token_types else [0] * len(w.ids))  # see WordPiece._encoded
            out.offsets.append([tuple(o) if s == context else NO_SPAN for o, s in zip(w.offsets, seq)])
            out.example.append(i)
            out.encodings.append(w)
    return out


def _no_room(i: int, n: int, max_length: int, stride: int, names, why: str, one: bool) -> ArgumentError:
    """The error's example (Bert.answer's question, or `example i` of the lists: a caller names its row) and the
    window (`names`, the caller's) are Args: callers rename them from these fields."""
    return ArgumentError(
        *((Arg("question"),) if one else (Arg.showing("example", i), ": its question")),
        f" ({n} tokens with [CLS] and [SEP]) leaves too little room for the context in ",
        Arg.showing(names[0], max_length),
        " with ",
        Arg.showing(names[1], stride),
        f" ({why})",
    )


def _check_room(tok, pairs: list[tuple[str, str]], max_length: int, stride: int, names, one: bool) -> None:
    """Refuse a question that leaves the context `stride` tokens or fewer of a window it has to be cut into: the
    tokenizers library panics there (a Rust backtrace on stderr, and a PanicException, which is no Exception)."""
    try:
        questions = tok.backend.encode_batch([q for q, _ in pairs])
        for i, (q, (question, context)) in enumerate(zip(questions, pairs)):
            room = max_length - len(q.ids) - 1  # [CLS] question [SEP] context [SEP]
            if room <= stride and len(tok.backend.encode(question, context).ids) > max_length:
                why = f"room for {max(room, 0)} context tokens, not more than the stride"
                raise _no_room(i, len(q.ids), max_length, stride, names, why, one)
    except TypeError:  # a lone surrogate: windows' own encoding names the text (before it encodes any)
        return


def label(offsets: list[tuple[int, int]], cls_index: int, start_char: int | None, end_char: int) -> tuple[int, int]:
    """(start, end) token positions of the answer's characters [start_char, end_char) in one window, or
    (cls_index, cls_index) when the window does not hold the whole answer (or there is none: start_char None).

    run_qa.py's rule, with one correction: run_qa.py lets the start search run past the context into [SEP] and
    padding when the answer starts in the window's last context token (its own comment calls it an edge case);
    here the start stays within the context."""
    inside = [t for t, o in enumerate(offsets) if o != NO_SPAN]
    if start_char is None or not inside:
        return cls_index, cls_index
    first, last = inside[0], inside[-1]
    if not (offsets[first][0] <= start_char and offsets[last][1] >= end_char):
        return cls_index, cls_index
    start = first
    while start < last and offsets[start + 1][0] <= start_char:
        start += 1
    end = last
    while offsets[end][1] >= end_char:
        end -= 1
    return start, end + 1
