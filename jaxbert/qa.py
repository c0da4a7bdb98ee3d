"""Extractive question answering around the model: (question, context) pairs cut into overlapping windows with
token labels (transformers' run_qa.py prepare_train_features / prepare_validation_features), span logits turned
back into answers in the context (utils_qa.postprocess_qa_predictions for SQuAD metrics; the question-answering
pipeline's span probabilities for `Bert.answer`).

The windows and their labels are qa_windows.py's, re-exported here (qa.windows, qa.label, qa.NO_SPAN, ...).
"""

from __future__ import annotations

import math

import numpy as np

from jaxbert.inputs import Arg, ArgumentError
from jaxbert.qa_windows import FLAGS, NO_SPAN, Windows, label, windows  # noqa: F401  (re-exported: qa.windows, ...)


def best_answers(
    start_logits: list[np.ndarray],
    end_logits: list[np.ndarray],
    offsets: list[list[tuple[int, int]]],
    context: str,
    *,
    n_best_size: int = 20,
    max_answer_length: int = 30,
    version_2_with_negative: bool = False,
    null_score_diff_threshold: float = 0.0,
) -> tuple[str, list[dict], float | None]:
    """One example's prediction from its windows' logits, as utils_qa.postprocess_qa_predictions: the n best
    start and end tokens of each window, pairs inside the context, in order and at most `max_answer_length`
    tokens, scored by start + end logit; for SQuAD v2 the lowest [CLS] score over the windows is the null
    answer, chosen when it beats the best span by more than `null_score_diff_threshold`.

    Returns (answer text, n-best list of {text, start_logit, end_logit, start, end, probability}, null score
    difference (v2) or None); start and end are the text's characters in the context (0, 0 for none)."""
    null = None
    prelim = []
    for start, end, offs in zip(start_logits, end_logits, offsets):
        score = float(start[0] + end[0])
        if null is None or null["score"] > score:
            null = {"offsets": (0, 0), "score": score, "start_logit": float(start[0]), "end_logit": float(end[0])}
        starts = np.argsort(start)[-1 : -n_best_size - 1 : -1]
        ends = np.argsort(end)[-1 : -n_best_size - 1 : -1]
        for s in starts:
            for e in ends:
                if s >= len(offs) or e >= len(offs) or offs[s] == NO_SPAN or offs[e] == NO_SPAN:
                    continue
                if e < s or e - s + 1 > max_answer_length:
                    continue
                prelim.append(
                    {
                        "offsets": (offs[s][0], offs[e][1]),
                        "score": float(start[s] + end[e]),
                        "start_logit": float(start[s]),
                        "end_logit": float(end[e]),
                    }
                )
    if version_2_with_negative and null is not None:
        prelim.append(null)
    preds = sorted(prelim, key=lambda p: p["score"], reverse=True)[:n_best_size]
    if version_2_with_negative and null is not None and not any(p["offsets"] == (0, 0) for p in preds):
        preds.append(null)
    preds = [{"text": context[p["offsets"][0] : p["offsets"][1]], **p} for p in preds]
    if not preds or (len(preds) == 1 and preds[0]["text"] == ""):
        preds.insert(0, {"text": "empty", "start_logit": 0.0, "end_logit": 0.0, "score": 0.0})
    scores = np.array([p.pop("score") for p in preds])
    probs = np.exp(scores - scores.max())
    probs /= probs.sum()
    for p, prob in zip(preds, probs):
        p["start"], p["end"] = (int(x) for x in p.pop("offsets", (0, 0)))  # characters of the context
        p["probability"] = float(prob)
    if not version_2_with_negative:
        return preds[0]["text"], preds, None
    best = next((p for p in preds if p["text"] != ""), preds[-1])
    diff = null["score"] - best["start_logit"] - best["end_logit"]
    return ("" if diff > null_score_diff_threshold else best["text"]), preds, float(diff)


def pipeline_spans(
    start: np.ndarray, end: np.ndarray, offsets: list[tuple[int, int]], top_k: int, max_answer_len: int
) -> tuple[list[tuple[int, int, float]], float]:
    """One window's top_k (start token, end token, probability) as transformers' question-answering pipeline
    scores them: softmax over [CLS] and the context tokens (others at -10000), then [CLS] zeroed, and the
    probability of a span the product of its start's and end's; and the window's null answer probability, [CLS]'s
    start times end before zeroing (the pipeline's handle_impossible_answer)."""
    keep = np.array([o != NO_SPAN for o in offsets])
    keep[0] = True  # the pipeline leaves [CLS] in the softmax (the null answer), then zeroes it
    probs = []
    for x in (start, end):
        x = np.where(keep, np.asarray(x, np.float64), -10000.0)
        p = np.exp(x - x.max())
        probs.append(p / p.sum())
    ps, pe = probs
    null = float(ps[0] * pe[0])
    ps[0] = pe[0] = 0.0
    outer = np.tril(np.triu(np.outer(ps, pe)), max_answer_len - 1)
    flat = outer.ravel()
    order = np.argsort(-flat, kind="stable")[:top_k]
    out = []
    for i in order:
        s, e = divmod(int(i), len(ps))
        if keep[s] and keep[e]:
            out.append((s, e, float(outer[s, e])))
    return out, null


def word_span(enc, s: int, e: int, context: int = 1) -> tuple[int, int]:
    """Character span of the whole words holding tokens s..e (the pipeline's align_to_words), else the tokens'."""
    try:
        start, end = enc.token_to_word(s), enc.token_to_word(e)
        return enc.word_to_chars(start, context)[0], enc.word_to_chars(end, context)[1]
    except Exception:  # noqa: BLE001 - [CLS] has no word: keep to the offsets, as the pipeline does
        return enc.offsets[s][0], enc.offsets[e][1]


def answer(
    bert,
    question: str,
    context: str,
    top_k: int = 1,
    *,
    max_answer_len: int = 15,
    max_seq_len: int | None = None,
    doc_stride: int | None = None,
    batch_size: int = 32,
    handle_impossible_answer: bool = False,
    align_to_words: bool = True,
) -> list[dict]:
    """The top_k answers [{answer, score, start, end}] (character offsets into `context`), best first, over all
    windows of a long context: transformers' question-answering pipeline's results and defaults (windows of
    min(384, the model's limit) tokens, stride min(half of it, 128), answers aligned to whole words, equal
    answers merged: tests/fixtures/golden/qa_pipeline, written by transformers 4.57). `handle_impossible_answer`
    adds the pipeline's null answer, "" at 0-0, scored by the smallest null probability of any window;
    `align_to_words=False` keeps answers to their tokens' characters (and top_k spans a window, as the pipeline)."""
    from jaxbert.inputs import positive_int

    if bert.head != "BertForQuestionAnswering":
        raise ValueError(f"answer needs a BertForQuestionAnswering checkpoint; this one is {bert.head}")
    _check_texts([question], [context], numbered=False)
    top_k, batch_size = positive_int("top_k", top_k), positive_int("batch_size", batch_size)
    max_answer_len = positive_int("max_answer_len", max_answer_len)
    for name, flag in (("handle_impossible_answer", handle_impossible_answer), ("align_to_words", align_to_words)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be True or False, got {flag!r}")
    # The window's bound named here: Bert.max_length would name max_length, an argument answer does not have.
    positions = bert.config.max_position_embeddings
    length = bert.max_length(None if max_seq_len is None else positive_int("max_seq_len", max_seq_len, positions))
    length = length if max_seq_len is not None else min(length, 384)
    stride = default_stride(length) if doc_stride is None else _doc_stride(doc_stride, length)
    # answer takes one question and one context: windows names them so, not as items of lists (questions[0]).
    w = windows(bert.tokenizer, [question], [context], length, stride, ("max_seq_len", "doc_stride"), one=True)
    found: dict[str, dict] = {}  # by lower-cased answer text, in the order first found
    null = 1.0
    for f, (start, end) in enumerate(window_logits(bert, w, batch_size)):
        # As the pipeline (transformers 4.57): 2 top_k + 10 spans a window, since widening to whole words makes
        # several spans one answer; an answer found again (the same text, in any case, from another span or
        # window) adds its probability to the first one's, which keeps its place in the context.
        fetch = 2 * top_k + 10 if align_to_words else top_k
        spans, window_null = pipeline_spans(start, end, w.offsets[f], fetch, max_answer_len)
        null = min(null, window_null)
        enc = w.encodings[f]
        for s, e, score in spans:
            a, b = word_span(enc, s, e, w.context) if align_to_words else (enc.offsets[s][0], enc.offsets[e][1])
            seen = found.setdefault(context[a:b].lower(), {"answer": context[a:b], "score": 0.0, "start": a, "end": b})
            seen["score"] += score
    answers = list(found.values())
    if handle_impossible_answer:  # as the pipeline: never merged with an answer found, ranked after equal scores
        answers.append({"answer": "", "score": null, "start": 0, "end": 0})
    return sorted(answers, key=lambda x: x["score"], reverse=True)[:top_k]


def default_stride(length: int) -> int:
    """The QA pipeline's doc_stride when none is given: 128, at most half the window."""
    return min(length // 2, 128)


def _doc_stride(value, length: int) -> int:
    """An integer in [0, length): int() truncated 2.7 to 2 and a negative one was an OverflowError."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"doc_stride must be an integer, got {type(value).__name__} {value!r}")
    if not 0 <= value < length:
        raise ValueError(f"doc_stride {value}: must be in [0, {length}) (the window, max_seq_len)")
    return int(value)


def _check_texts(questions: list, contexts: list, numbered: bool = True) -> None:
    """Every text a non-empty string (a blank context would get run_qa's placeholder answer, not an error);
    `numbered` names the failing pair's index."""
    for name, texts in (("question", questions), ("context", contexts)):
        for i, text in enumerate(texts):
            if not isinstance(text, str) or not text.strip():
                raise ArgumentError(Arg(name), f"{f' {i}:' if numbered else ''} must be a non-empty string")


def window_logits(bert, w: Windows, batch_size: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each window's (start, end) logits over its own tokens, `batch_size` windows a call, in window order."""
    from jaxbert.tokenizer import Encoded

    enc = Encoded(w.ids, w.type_ids, w.offsets, [[]] * len(w.ids), [[]] * len(w.ids))
    logits: list = [None] * len(w.ids)
    for idx, batch in bert.batches(enc, batch_size):
        out = bert(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        starts, ends = np.asarray(out.start_logits), np.asarray(out.end_logits)
        for row, f in enumerate(idx):
            logits[f] = (starts[row, : len(w.ids[f])], ends[row, : len(w.ids[f])])
    return logits


INT_OPTIONS = ("max_seq_length", "doc_stride", "n_best_size", "max_answer_length")


def check_options(options: dict) -> dict:
    """A config's question_answering block with each option it has checked (whole numbers, a boolean, a finite
    threshold) and any other key left out: it is written by training (task_qa.QARun.final_config), but config.json
    is a text file anyone may edit, and a "false" read as true scored SQuAD v1 data as v2."""
    from jaxbert.inputs import positive_int

    name = lambda k: f"config.json question_answering.{k}"  # noqa: E731
    out = {k: positive_int(name(k), options[k]) for k in INT_OPTIONS if k in options}
    if "version_2_with_negative" in options:
        v2 = out["version_2_with_negative"] = options["version_2_with_negative"]
        if not isinstance(v2, bool):
            raise TypeError(f"{name('version_2_with_negative')} must be true or false, got {v2!r}")
    if "null_score_diff_threshold" in options:
        threshold = options["null_score_diff_threshold"]
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not math.isfinite(threshold):
            raise TypeError(f"{name('null_score_diff_threshold')} must be a finite number, got {threshold!r}")
        out["null_score_diff_threshold"] = float(threshold)
    return out


def _trained_options(options: dict, limit: int) -> tuple[int, int, dict]:
    """(window length, stride, best_answers' options) from a config's question_answering block, checked."""
    from jaxbert.train.task_qa import DEFAULTS

    # what evaluate and training assume when absent
    options = check_options({**DEFAULTS, "max_seq_length": 384, **options})
    length = min(limit, options.pop("max_seq_length"))
    stride = options.pop("doc_stride")
    if stride >= length:
        name = "config.json question_answering.doc_stride"
        raise ValueError(f"{name} {stride}: must be below the window length {length}")
    return length, stride, options


def trained_answers(
    bert, questions: list[str], contexts: list[str], options: dict, batch_size: int = 32, names=None
) -> list:
    """The best answer to each (question, context) as `jaxbert train --task question-answering` scored the model:
    its windows (`options`' max_seq_length and doc_stride, kept in its config) and best_answers with its n-best
    size, answer length and, for SQuAD v2, null answers. [{answer, score (n-best probability), start, end}];
    no answer is "" at 0-0, as the pipeline's handle_impossible_answer gives it: the null answer, and where no span
    fits at all (run_qa's post-processing then names the text "empty", which `evaluate` scores as it does)."""
    _check_texts(questions, contexts)
    length, stride, opts = _trained_options(options, bert.max_length(None))
    w = windows(bert.tokenizer, questions, contexts, length, stride, names or ("the trained length", "stride"))
    logits = window_logits(bert, w, batch_size)
    feats: dict[int, list[int]] = {}
    for f, e in enumerate(w.example):
        feats.setdefault(e, []).append(f)
    out = []
    for e, context in enumerate(contexts):
        fs = feats[e]
        text, preds, _ = best_answers(
            [logits[f][0] for f in fs], [logits[f][1] for f in fs], [w.offsets[f] for f in fs], context, **opts
        )
        best = next(p for p in preds if p["text"] == text)
        text = text if best["end"] > best["start"] else ""  # the null answer, or run_qa's "empty" placeholder
        out.append({"answer": text, "score": best["probability"], "start": best["start"], "end": best["end"]})
    return out
