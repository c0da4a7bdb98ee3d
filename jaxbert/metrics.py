"""Validation metrics for fine-tuning tasks, in numpy (correlations from scipy.stats), plain Python floats out.

Each metric reproduces the reference the field reports against: scikit-learn (accuracy, macro F1, MCC, multi-label
micro F1 / subset accuracy), seqeval's default mode (entity-span precision/recall/F1), the official SQuAD v1.1 and
v2.0 scripts (EM/F1). tests/test_metrics.py checks them against those libraries, which stay test-only dependencies.
The `*_metrics` functions return dicts with stable key names for metrics.jsonl; `GREATER_IS_BETTER` says which
way each one improves, so `--metric-for-best-model NAME` can pick a checkpoint.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
from jaxtyping import ArrayLike, Bool, Num, Shaped

from jaxbert.metrics_text import (  # noqa: F401  (re-exported: one namespace for every metric)
    _tag_lists,
    chunk_tags,
    entity_types,
    iob2_spans,
    span_prf,
    span_prf_by_type,
    squad_exact,
    squad_f1,
    squad_normalize,
    squad_scores,
)
from jaxbert.sentence_dir import SIMILARITIES

GREATER_IS_BETTER = {
    "accuracy": True,
    "f1": True,
    "binary_f1": True,
    "mcc": True,
    "pearson": True,
    "spearman": True,
    "mse": False,
    "micro_f1": True,
    "exact_match": True,
    "precision": True,
    "recall": True,
    "accuracy@1": True,
    "mrr@10": True,
    "loss": False,
    "perplexity": False,
    # run_summarization.py's generation scores; gen_len up, as Trainer takes any name not ending in "loss"
    **dict.fromkeys(("rouge1", "rouge2", "rougeL", "rougeLsum", "gen_len"), True),
}


def greater_is_better(name: str) -> bool:
    """Whether metric `name` improves upward: the table above; any `*loss` lower-better; mrr@K, accuracy@K,
    an entity type's TYPE_precision / TYPE_recall / TYPE_f1 and EmbeddingSimilarityEvaluator's pearson_cosine,
    spearman_dot, ... (pearson or spearman of a similarity) up."""
    if re.fullmatch(r"(pearson|spearman)_(cosine|dot|euclidean|manhattan|max)", name):
        return True
    at_k = re.fullmatch(r"(mrr|accuracy)@\d+", name)
    key = {"mrr": "mrr@10", "accuracy": "accuracy@1"}[at_k[1]] if at_k else name
    if name.endswith("loss") or key in GREATER_IS_BETTER:
        return GREATER_IS_BETTER.get(key, False)
    if re.fullmatch(r".+_(precision|recall|f1)", name, re.DOTALL):  # one entity type's (entity_type_metrics)
        return True
    raise ValueError(f"unknown metric {name!r}; known: {', '.join(GREATER_IS_BETTER)}")


# ---- input checks: one-line ValueErrors naming the argument ----


def _array(x, name: str, ndim: int) -> np.ndarray:
    try:
        a = np.asarray(x)
    except ValueError as e:  # ragged nesting
        raise ValueError(f"{name} is not a rectangular array: {e}") from None
    if a.ndim != ndim or a.size == 0:
        raise ValueError(f"{name} must be a non-empty {ndim}-D array, got shape {a.shape}")
    return a


def _pair(pred, gold, ndim: int = 1) -> tuple[np.ndarray, np.ndarray]:
    p, g = _array(pred, "pred", ndim), _array(gold, "gold", ndim)
    if p.shape != g.shape:
        raise ValueError(f"pred has shape {p.shape} but gold has shape {g.shape}")
    if _is_text(p) != _is_text(g):  # numpy would compare "1" == 1 as False without a word
        raise ValueError(f"pred ({p.dtype}) and gold ({g.dtype}) mix text and numeric labels")
    return p, g


def _is_text(a: np.ndarray) -> bool:
    return a.dtype.kind in "USO"


def _numeric(pred, gold) -> tuple[np.ndarray, np.ndarray]:
    p, g = _pair(pred, gold)
    for name, a in (("pred", p), ("gold", g)):
        if a.dtype.kind not in "biuf":
            raise ValueError(f"{name} must be real numbers, got dtype {a.dtype}")
    return p.astype(np.float64), g.astype(np.float64)


def _indicator(x, name: str) -> np.ndarray:
    a = _array(x, name, 2)
    if a.dtype != bool and not np.isin(a, (0, 1)).all():
        raise ValueError(f"{name} must be a 0/1 or boolean indicator matrix [N, C]")
    return a.astype(bool)


# ---- single-label classification (= sklearn accuracy_score, f1_score(average="macro"), matthews_corrcoef) ----


def accuracy(pred: Shaped[ArrayLike, " N"], gold: Shaped[ArrayLike, " N"]) -> float:
    """Fraction of pred[i] == gold[i]."""
    p, g = _pair(pred, gold)
    return float(np.mean(p == g))


def macro_f1(
    pred: Shaped[ArrayLike, " N"], gold: Shaped[ArrayLike, " N"], labels: Shaped[ArrayLike, " L"] | None = None
) -> float:
    """Unweighted mean over labels of 2·tp / (2·tp + fp + fn), as sklearn: the labels are those present in pred or
    gold unless `labels` is given (then exactly those, absent ones included); a 0/0 label scores 0.0 (sklearn's
    zero_division="warn", without the warning)."""
    p, g = _pair(pred, gold)
    if labels is None:
        labels = np.union1d(p, g)
    else:
        labels = _array(labels, "labels", 1)
        if len(np.unique(labels)) != len(labels) or _is_text(labels) != _is_text(p):
            raise ValueError("labels must be distinct and of the same kind (text/numeric) as pred and gold")
    is_p, is_g = p[None, :] == labels[:, None], g[None, :] == labels[:, None]  # [L, N]
    tp, both = (is_p & is_g).sum(1), is_p.sum(1) + is_g.sum(1)
    return float(np.mean(np.where(both > 0, 2.0 * tp / np.maximum(both, 1), 0.0)))


def binary_f1(pred: Shaped[ArrayLike, " N"], gold: Shaped[ArrayLike, " N"], positive=1) -> float:
    """F1 of the class `positive` alone: sklearn's f1_score(average="binary", pos_label=positive), the "f1" that
    run_glue.py reports for MRPC and QQP; 0.0 when it is neither predicted nor gold."""
    return macro_f1(pred, gold, labels=[positive])


def matthews(pred: Shaped[ArrayLike, " N"], gold: Shaped[ArrayLike, " N"]) -> float:
    """Multiclass Matthews correlation (Gorodkin's R_K) from the confusion matrix, as sklearn's matthews_corrcoef,
    including its 0.0 when pred or gold holds a single class."""
    p, g = _pair(pred, gold)
    classes, idx = np.unique(np.concatenate([g, p]), return_inverse=True)
    k, n = len(classes), len(g)
    conf = np.bincount(idx[:n] * k + idx[n:], minlength=k * k).reshape(k, k)  # rows gold, columns pred
    t_sum, p_sum = conf.sum(1, dtype=np.float64), conf.sum(0, dtype=np.float64)
    n_correct, total = np.trace(conf, dtype=np.float64), p_sum.sum()
    cov_tp = n_correct * total - np.dot(t_sum, p_sum)
    cov_pp_tt = (total**2 - np.dot(p_sum, p_sum)) * (total**2 - np.dot(t_sum, t_sum))
    return 0.0 if cov_pp_tt == 0 else float(cov_tp / np.sqrt(cov_pp_tt))


# ---- regression (scipy.stats) ----


def _correlation(fn, pred, gold) -> float:
    p, g = _numeric(pred, gold)
    if len(p) < 2:
        raise ValueError(f"a correlation needs at least 2 pairs, got {len(p)}")
    if not (np.isfinite(p).all() and np.isfinite(g).all()):
        return float("nan")  # as scipy: a diverged model must not look merely uncorrelated
    if (p == p[0]).all() or (g == g[0]).all():
        # Undefined; scipy warns and returns nan. 0.0 (as sklearn's r_regression(force_finite=True) and
        # matthews_corrcoef) keeps metrics.jsonl strict JSON and best-model comparisons meaningful: a regressor
        # stuck on one value early in training has no association with the gold scores.
        return 0.0
    return float(fn(p, g).statistic)


def pearson(pred: Num[ArrayLike, " N"], gold: Num[ArrayLike, " N"]) -> float:
    """Pearson's r (scipy.stats.pearsonr); 0.0 when either side is constant, nan when any value is non-finite."""
    import scipy.stats  # here, not at the top: a second of start-up for every `jaxbert train` that never needs it

    return _correlation(scipy.stats.pearsonr, pred, gold)


def spearman(pred: Num[ArrayLike, " N"], gold: Num[ArrayLike, " N"]) -> float:
    """Spearman's rho (scipy.stats.spearmanr); 0.0 when either side is constant, nan when any value is
    non-finite."""
    import scipy.stats

    return _correlation(scipy.stats.spearmanr, pred, gold)


# ---- multi-label (= sklearn f1_score(average="micro") / accuracy_score on indicator matrices) ----


def micro_f1(pred: Bool[ArrayLike, "N C"], gold: Bool[ArrayLike, "N C"]) -> float:
    """2·TP / (2·TP + FP + FN) over all (row, class) cells; 0.0 when nothing is predicted or gold."""
    p, g = _pair(_indicator(pred, "pred"), _indicator(gold, "gold"), ndim=2)
    both = int(p.sum() + g.sum())
    return 2.0 * int((p & g).sum()) / both if both else 0.0


def exact_match(pred: Bool[ArrayLike, "N C"], gold: Bool[ArrayLike, "N C"]) -> float:
    """Subset accuracy: fraction of rows whose whole label set is right."""
    p, g = _pair(_indicator(pred, "pred"), _indicator(gold, "gold"), ndim=2)
    return float(np.mean((p == g).all(1)))


# ---- token classification (= seqeval's default, non-strict mode) ----

_SIMILARITIES_PER_BLOCK = 1 << 24  # queries are scored in blocks of [B, M] float64 similarities, ~128 MB


def _similarities(q: Num[np.ndarray, "B D"], c: Num[np.ndarray, "M D"], similarity: str) -> Num[np.ndarray, "B M"]:
    """Larger is closer; cosine's rows come unit-length. The distances exactly (scipy), not by the expanded
    |q|² + |c|² - 2 q·c, which cancels to rounding noise for near neighbours and could reorder them."""
    if similarity in ("cosine", "dot"):
        return q @ c.T
    from scipy.spatial.distance import cdist

    return -cdist(q, c, "euclidean" if similarity == "euclidean" else "cityblock")


def retrieval_metrics(
    queries: Num[ArrayLike, "N D"],
    corpus: Num[ArrayLike, "M D"],
    k: int = 10,
    relevant: Num[ArrayLike, " N"] | None = None,
    similarity: str = "cosine",
) -> dict[str, float]:
    """accuracy@1 and MRR@k of retrieval where query i's one relevant document is corpus row relevant[i]
    (default: row i, rows N..M-1 distractors), ranked by `similarity`: one of sentence-transformers' similarity
    functions (SIMILARITIES; its InformationRetrievalEvaluator ranks by the model's own, so a model trained for dot
    products is scored by them). Ties count against the relevant document: its rank is the number of documents
    scoring >= it, so collapsed (identical or zero) embeddings score 0, not by index luck. The corpus should hold
    each document once: a copy of the relevant one ties with it. Scores in float64; any non-finite input gives
    nan metrics."""
    q, c = _array(queries, "queries", 2), _array(corpus, "corpus", 2)
    if relevant is None:
        if len(c) < len(q):
            raise ValueError(f"corpus {c.shape} needs at least as many rows as queries {q.shape}: row i is query i's")
        relevant = np.arange(len(q))
    rel = _array(relevant, "relevant", 1)
    if rel.dtype.kind not in "iu" or rel.shape != (len(q),) or not ((rel >= 0) & (rel < len(c))).all():
        raise ValueError(f"relevant must hold one corpus row in [0, {len(c)}) per query, got {rel.tolist()[:10]}")
    if c.shape[1] != q.shape[1]:
        raise ValueError(f"corpus {c.shape} must have the queries' width {q.shape}")
    if q.dtype.kind not in "biuf" or c.dtype.kind not in "biuf":
        raise ValueError(f"queries ({q.dtype}) and corpus ({c.dtype}) must be real numbers")
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    if similarity not in SIMILARITIES:
        raise ValueError(f"similarity {similarity!r}: expected one of {', '.join(SIMILARITIES)}")
    names = ("accuracy@1", f"mrr@{k}")
    if not (np.isfinite(q).all() and np.isfinite(c).all()):
        return dict.fromkeys(names, float("nan"))
    q, c = q.astype(np.float64), c.astype(np.float64)
    if similarity == "cosine":
        q, c = (x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-300) for x in (q, c))
    ranks, step = [], max(1, _SIMILARITIES_PER_BLOCK // len(c))
    for s in range(0, len(q), step):
        sims = _similarities(q[s : s + step], c, similarity)
        right = sims[np.arange(len(sims)), rel[s : s + step]]
        ranks.append((sims >= right[:, None]).sum(1))
    rank = np.concatenate(ranks)
    return dict(zip(names, (float(np.mean(rank == 1)), float(np.mean(np.where(rank <= k, 1.0 / rank, 0.0))))))


# ---- per-task bundles: stable key names for metrics.jsonl ----


def classification_metrics(
    pred: Shaped[ArrayLike, " N"], gold: Shaped[ArrayLike, " N"], labels: Shaped[ArrayLike, " L"] | None = None
) -> dict[str, float]:
    """accuracy, f1 (macro), mcc of predicted class ids (argmax of the logits) against gold."""
    return {"accuracy": accuracy(pred, gold), "f1": macro_f1(pred, gold, labels), "mcc": matthews(pred, gold)}


def regression_metrics(pred: Num[ArrayLike, " N"], gold: Num[ArrayLike, " N"]) -> dict[str, float]:
    """pearson, spearman and mse (lower is better) of predicted scores."""
    p, g = _numeric(pred, gold)
    return {"pearson": pearson(p, g), "spearman": spearman(p, g), "mse": float(np.mean((p - g) ** 2))}


def multilabel_metrics(pred: Bool[ArrayLike, "N C"], gold: Bool[ArrayLike, "N C"]) -> dict[str, float]:
    """micro_f1 and exact_match (subset accuracy, a fraction) of thresholded label sets."""
    return {"micro_f1": micro_f1(pred, gold), "exact_match": exact_match(pred, gold)}


def token_metrics(pred_tags: Sequence[Sequence[str]], gold_tags: Sequence[Sequence[str]]) -> dict[str, float]:
    """Entity precision / recall / f1 (span_prf) and per-token accuracy (= seqeval.metrics.accuracy_score)
    of tag strings, positions the loss ignores (-100) already removed."""
    out = span_prf(pred_tags, gold_tags)
    p = [t for s in _tag_lists(pred_tags, "pred_tags") for t in s]
    g = [t for s in _tag_lists(gold_tags, "gold_tags") for t in s]
    if not g:
        raise ValueError("gold_tags holds no tokens")
    return {**out, "accuracy": sum(a == b for a, b in zip(p, g)) / len(g)}


def entity_type_metrics(
    pred_tags: Sequence[Sequence[str]], gold_tags: Sequence[Sequence[str]], types: Sequence[str]
) -> dict[str, float]:
    """TYPE_precision, TYPE_recall, TYPE_f1 and TYPE_number (gold entities, an int) of each of `types`
    (span_prf_by_type), flat as run_ner.py's return_entity_level_metrics names them."""
    by_type = span_prf_by_type(pred_tags, gold_tags, types)
    return {f"{t}_{k}": v for t, scores in by_type.items() for k, v in scores.items()}


def choice_metrics(pred: Shaped[ArrayLike, " N"], gold: Shaped[ArrayLike, " N"]) -> dict[str, float]:
    """accuracy of the chosen option index (argmax over choices)."""
    return {"accuracy": accuracy(pred, gold)}
