"""Metrics over text: entity spans of IOB2 tag sequences (seqeval's default mode) and SQuAD exact match / F1
(the official v2.0 script's rules, or v1.1's). Re-exported by metrics.py, which documents the conventions."""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Mapping, Sequence


def _tag_lists(tags, name: str) -> list[list[str]]:
    if isinstance(tags, str) or not isinstance(tags, Sequence) or not len(tags):
        raise ValueError(f"{name} must be a non-empty list of tag lists")
    if any(isinstance(s, str) or not isinstance(s, Sequence) for s in tags):
        raise ValueError(f"{name} must hold one list of tags per sentence")
    out = [list(s) for s in tags]
    if any(not isinstance(t, str) or not t for s in out for t in s):
        raise ValueError(f"{name} must hold non-empty tag strings")
    return out


_CHUNK_TAG = re.compile(r"[BIES]-.")


def chunk_tags(names: Sequence[str]) -> bool:
    """Whether tag names form a chunk scheme that entity metrics read (IOB1, IOB2, IOE, IOBES: B-PER, I-PER, O):
    some name has a B-, I-, E- or S- prefix. Otherwise (LABEL_0, LABEL_1 for tags given as ids; bare PER, LOC)
    seqeval reads every run of one tag, the outside tag's included, as an entity: its F1 means nothing."""
    return any(_CHUNK_TAG.match(name) for name in names)


def iob2_spans(tags: Sequence[str]) -> set[tuple[str, int, int]]:
    """Entity spans (type, start, end) with end INCLUSIVE, exactly as seqeval's get_entities (default mode).

    seqeval reads a tag as its first character plus the type after the first "-" ("_" when none), tolerating
    ill-formed input the conlleval way: an I- (or E-) without a B- opens an entity, a type change inside an
    entity splits it, E-/S- close it, B/I/E/S without a type form entities of type "_", and a "." tag neither
    starts nor ends one (so the next chunk's start is the last one seen: replicated, not corrected)."""
    if isinstance(tags, str):
        raise ValueError("tags must be a list of tag strings, not one string")
    (seq,) = _tag_lists([tags], "tags")
    return set(_entities(seq))


def _entities(seq: list[str]) -> list[tuple[str, int, int]]:
    prev_tag, prev_type, begin, chunks = "O", "", 0, []
    for i, chunk in enumerate(seq + ["O"]):  # the sentinel closes a trailing entity
        tag, type_ = _split(chunk)
        if _ends(prev_tag, tag, prev_type, type_):
            chunks.append((prev_type, begin, i - 1))
        if _starts(prev_tag, tag, prev_type, type_):
            begin = i
        prev_tag, prev_type = tag, type_
    return chunks


def _ends(prev_tag: str, tag: str, prev_type: str, type_: str) -> bool:  # seqeval's end_of_chunk
    return prev_tag in "ES" or (prev_tag in "BI" and tag in "BSO") or (prev_tag not in "O." and prev_type != type_)


def _starts(prev_tag: str, tag: str, prev_type: str, type_: str) -> bool:  # seqeval's start_of_chunk
    return (
        tag in "BS"
        or (prev_tag in "ES" and tag in "EI")
        or (prev_tag == "O" and tag in "EI")
        or (tag not in "O." and prev_type != type_)
    )


def span_prf(pred_tags: Sequence[Sequence[str]], gold_tags: Sequence[Sequence[str]]) -> dict[str, float]:
    """Micro-averaged entity precision / recall / F1 over all types, = seqeval.metrics.precision_score /
    recall_score / f1_score in default mode. An entity counts when type, start and end all match; 0/0 gives 0.0
    (so no entities on either side scores 0.0, as seqeval). Sentences are joined with an "O" between them, as
    seqeval does, which matters only for the "." quirk of iob2_spans."""
    pred, gold = _entity_sets(pred_tags, gold_tags)
    return _prf(len(pred & gold), len(pred), len(gold))


def _entity_sets(pred_tags, gold_tags) -> tuple[set, set]:
    p, g = _tag_lists(pred_tags, "pred_tags"), _tag_lists(gold_tags, "gold_tags")
    if [len(s) for s in p] != [len(s) for s in g]:
        raise ValueError("pred_tags and gold_tags differ in the number or lengths of their sentences")
    return tuple(set(_entities([t for s in x for t in s + ["O"]])) for x in (p, g))


def _prf(tp: int, n_pred: int, n_gold: int) -> dict[str, float]:
    precision = tp / n_pred if n_pred else 0.0
    recall = tp / n_gold if n_gold else 0.0
    f1 = 2.0 * precision * recall / (precision + recall) if precision + recall else 0.0  # seqeval's order
    return {"precision": precision, "recall": recall, "f1": f1}


def entity_types(names: Sequence[str]) -> tuple[str, ...]:
    """The entity types tag names can form, sorted, as iob2_spans reads them ("_" for a bare B, I, E or S); the
    outside tags ("O...", ".") form none."""
    return tuple(sorted({_split(name)[1] for name in names if name and name[0] not in "O."}))


def _split(chunk: str) -> tuple[str, str]:  # seqeval's (tag, type) of one tag string
    return chunk[0], chunk[1:].split("-", maxsplit=1)[-1] or "_"


def span_prf_by_type(
    pred_tags: Sequence[Sequence[str]], gold_tags: Sequence[Sequence[str]], types: Sequence[str] | None = None
) -> dict[str, dict[str, float]]:
    """Each entity type's precision / recall / f1 and number (its gold entities), = seqeval's
    classification_report(output_dict=True) per type in default mode ("f1-score" as f1, "support" as number), as
    `evaluate`'s seqeval metric and run_ner.py's return_entity_level_metrics report them: the types found on either
    side, sorted, or exactly `types` (a type on neither side all 0); 0/0 gives 0.0, seqeval's zero_division."""
    pred, gold = _entity_sets(pred_tags, gold_tags)
    tp, n_pred, n_gold = (Counter(t for t, _, _ in x) for x in (pred & gold, pred, gold))
    types = sorted(n_pred.keys() | n_gold.keys()) if types is None else types
    return {t: {**_prf(tp[t], n_pred[t], n_gold[t]), "number": n_gold[t]} for t in types}


# ---- extractive QA (= the official SQuAD v2.0 evaluation script, or v1.1's: version_2=False) ----

_PUNCT = frozenset(string.punctuation)


def squad_normalize(text: str) -> str:
    """Lowercase, drop ASCII punctuation (string.punctuation), drop the words a/an/the, collapse whitespace."""
    text = "".join(ch for ch in _text(text, "text").lower() if ch not in _PUNCT)
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def _golds(golds: Sequence[str], version_2: bool) -> list[str]:
    if isinstance(golds, str) or not all(isinstance(a, str) for a in golds):
        raise ValueError("golds must be a list of answer strings (empty for an unanswerable question)")
    if not version_2:
        if not golds:
            raise ValueError("golds is empty: SQuAD v1.1 has no unanswerable questions (version_2=True scores them)")
        return list(golds)
    # v2.0: answers that normalize to nothing are dropped; none left means unanswerable, whose answer is "".
    return [a for a in golds if squad_normalize(a)] or [""]


def squad_exact(prediction: str, golds: Sequence[str], version_2: bool = True) -> float:
    """1.0 if the normalized prediction equals some normalized gold answer, else 0.0. v1.1 (`version_2=False`)
    keeps gold answers that normalize to nothing ("the", "%"), which a prediction normalizing to nothing matches."""
    pred = squad_normalize(_text(prediction, "prediction"))
    return float(max(pred == squad_normalize(a) for a in _golds(golds, version_2)))


def squad_f1(prediction: str, golds: Sequence[str], version_2: bool = True) -> float:
    """Max over gold answers of the F1 between normalized token bags; when either side has no tokens, 1.0 if
    both have none, else 0.0 (v2.0); v1.1 (`version_2=False`) scores no common token 0.0, two empty sides too."""
    pred = squad_normalize(_text(prediction, "prediction")).split()
    gold = (squad_normalize(a).split() for a in _golds(golds, version_2))
    return float(max(_token_f1(pred, g) if version_2 or (pred and g) else 0.0 for g in gold))


def _token_f1(pred: list[str], gold: list[str]) -> float:
    if not pred or not gold:
        return float(pred == gold)
    same = sum((Counter(gold) & Counter(pred)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(gold)
    return (2 * precision * recall) / (precision + recall)


def _text(x, name: str) -> str:
    if not isinstance(x, str):
        raise ValueError(f"{name} must be a string, got {type(x).__name__}")
    return x


def squad_scores(
    predictions: Mapping[str, str], references: Mapping[str, Sequence[str]], version_2: bool = True
) -> dict[str, float]:
    """Mean EM and F1 over `references` in percent, as the official script prints: v2.0's rules, or v1.1's
    (`version_2=False`, what run_qa.py reports without --version-2-with-negative; see squad_exact, squad_f1). A
    question without a prediction scores 0 (v1.1's rule; v2.0's script leaves it out of the total instead);
    predictions for ids not in `references` are ignored, as both scripts do."""
    if not isinstance(references, Mapping) or not references or not isinstance(predictions, Mapping):
        raise ValueError("references must be a non-empty dict id -> answers, predictions a dict id -> answer")
    em = f1 = 0.0
    for qid, golds in references.items():
        if qid in predictions:
            em += squad_exact(predictions[qid], golds, version_2)
            f1 += squad_f1(predictions[qid], golds, version_2)
    return {"exact_match": 100.0 * em / len(references), "f1": 100.0 * f1 / len(references)}


# ---- retrieval ----


ROUGE_TYPES = ("rouge1", "rouge2", "rougeL", "rougeLsum")


def rouge_scorer():
    """(rouge_score's scorer of ROUGE_TYPES with the Porter stemmer, the sentence splitter), or one line naming the
    package to install: it is optional (jaxbert[rouge]), imported here only."""
    try:
        from nltk.tokenize.punkt import PunktSentenceTokenizer
        from rouge_score import rouge_scorer
    except ImportError:
        raise ImportError("ROUGE needs the rouge-score package: pip install 'jaxbert[rouge]'") from None
    return rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=True), PunktSentenceTokenizer()


def rouge_scores(predictions: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """run_summarization.py's compute_metrics: ROUGE-1, -2, -L and -Lsum F-measures of the `rouge_score` library
    (Porter stemmer on), x100 and rounded to 4 places, each text stripped and its sentences put on lines for
    rougeLsum. Two differences, both to stay deterministic and offline: the mean of the examples' F-measures where
    the script's `evaluate` rouge takes the median of 1000 unseeded bootstrap means (an estimate of that mean), and
    sentences split by nltk's Punkt algorithm untrained (`PunktSentenceTokenizer()`) where the script's
    `nltk.sent_tokenize` loads the trained English model (a download), which also knows abbreviations ("dr.",
    "u.s."): where it keeps such a sentence whole, rougeLsum differs."""
    if len(predictions) != len(references) or not len(predictions):
        raise ValueError(f"{len(predictions)} predictions for {len(references)} references: need as many, at least 1")
    scorer, punkt = rouge_scorer()
    lines = lambda text: "\n".join(punkt.tokenize(text.strip()))  # noqa: E731
    scores = [scorer.score(lines(ref), lines(pred)) for pred, ref in zip(predictions, references)]
    return {k: round(100 * sum(s[k].fmeasure for s in scores) / len(scores), 4) for k in ROUGE_TYPES}
