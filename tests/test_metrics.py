"""jaxbert.metrics against the references it reproduces: scikit-learn, scipy, seqeval (default mode), the official
SQuAD v1.1/v2.0 scripts (copied verbatim below), and brute-force retrieval ranking. The reference libraries are
test-only dependencies: tests needing one skip without it."""

import collections
import re
import string
import sys
import warnings
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest

from jaxbert import metrics as M


@pytest.fixture(scope="module")
def skm():
    return pytest.importorskip("sklearn.metrics")


@pytest.fixture(scope="module")
def seqeval():
    pytest.importorskip("seqeval")
    import seqeval.metrics
    import seqeval.metrics.sequence_labeling

    return seqeval


def _quiet(fn, *args, **kwargs):
    """A reference call without its UndefinedMetric / ConstantInput / not-an-NE-tag warnings."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


# ---- single-label classification vs scikit-learn ----


def _label_cases():
    rng = np.random.default_rng(0)
    cases = []
    for _ in range(150):
        n, k = int(rng.integers(1, 40)), int(rng.integers(1, 6))
        gold = rng.integers(0, k, n)
        pred = np.where(rng.random(n) < rng.random(), gold, rng.integers(0, k + 1, n))
        cases.append((pred, gold))
    g = np.array([0, 1, 2, 2, 1, 0])
    cases += [
        (g, g),
        ((g + 1) % 3, g),  # all correct, all wrong
        (np.zeros(6, int), g),
        (g, np.zeros(6, int)),  # single class on one side
        (np.zeros(6, int), np.zeros(6, int)),
        (np.array([4]), np.array([4])),  # single class on both
        (np.array([0, 0, 1, 1, 0, 1]), g),  # gold label 2 never predicted
        (np.array(["pos", "neg", "neg"]), np.array(["pos", "pos", "neu"])),
    ]  # string labels
    return cases


def test_classification_matches_sklearn(skm):
    for pred, gold in _label_cases():
        assert M.accuracy(pred, gold) == skm.accuracy_score(gold, pred)
        assert M.macro_f1(pred, gold) == pytest.approx(_quiet(skm.f1_score, gold, pred, average="macro"), abs=1e-12)
        assert M.matthews(pred, gold) == pytest.approx(_quiet(skm.matthews_corrcoef, gold, pred), abs=1e-12)
        assert all(type(v) is float for v in M.classification_metrics(pred, gold).values())


def test_macro_f1_given_labels_matches_sklearn(skm):
    rng = np.random.default_rng(1)
    for labels in ([0, 1, 2, 3, 7], [2, 0], [5], [1]):  # absent labels count as 0; unlisted ones are left out
        for _ in range(20):
            gold, pred = rng.integers(0, 4, 25), rng.integers(0, 4, 25)
            want = _quiet(skm.f1_score, gold, pred, labels=labels, average="macro")
            assert M.macro_f1(pred, gold, labels=labels) == pytest.approx(want, abs=1e-12)


def test_degenerate_classification_values():
    assert M.matthews([1, 1, 1], [0, 1, 2]) == 0.0 and M.matthews([2, 2], [2, 2]) == 0.0
    assert M.macro_f1([0, 0], [1, 1]) == 0.0 and M.macro_f1([3], [3]) == 1.0
    assert M.matthews([0, 1, 2], [0, 1, 2]) == 1.0 and M.matthews([1, 0], [0, 1]) == -1.0


# ---- regression vs scipy ----


def test_correlations_match_scipy():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(2)
    for _ in range(60):
        n = int(rng.integers(2, 50))
        gold = rng.normal(size=n)
        pred = gold * rng.normal() + rng.normal(size=n) * rng.random()
        if rng.random() < 0.3:  # ties, which spearman ranks by their average
            pred, gold = np.round(pred), np.round(gold * 2)
        if (pred == pred[0]).all() or (gold == gold[0]).all():
            continue
        assert M.pearson(pred, gold) == pytest.approx(stats.pearsonr(pred, gold).statistic, abs=1e-12)
        assert M.spearman(pred, gold) == pytest.approx(stats.spearmanr(pred, gold).statistic, abs=1e-12)
    assert M.pearson(np.float32([1, 2, 4]), [1, 2, 3]) == pytest.approx(stats.pearsonr([1, 2, 4], [1, 2, 3])[0])


def test_constant_input_is_zero_not_nan_and_nonfinite_is_nan():
    stats = pytest.importorskip("scipy.stats")
    assert np.isnan(_quiet(stats.pearsonr, [1.0, 1.0, 1.0], [1.0, 2.0, 3.0]).statistic)  # the deliberate difference
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for fn in (M.pearson, M.spearman):
            assert fn([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]) == 0.0
            assert fn([1.0, 2.0, 3.0], [5, 5, 5]) == 0.0
            assert np.isnan(fn([1.0, np.nan, 3.0], [1.0, 2.0, 3.0]))
            assert np.isnan(fn([1.0, 2.0, 3.0], [1.0, np.inf, 3.0]))
    assert M.regression_metrics([1.0, 2.0], [1.0, 4.0]) == pytest.approx({"pearson": 1.0, "spearman": 1.0, "mse": 2.0})


# ---- multi-label vs scikit-learn ----


def test_multilabel_matches_sklearn(skm):
    rng = np.random.default_rng(3)
    cases = [
        (rng.random((n, c)) < rng.random(), rng.random((n, c)) < rng.random())
        for n, c in rng.integers(1, 12, (80, 2)) + [0, 1]
    ]
    z = np.zeros((4, 3), bool)
    cases += [(z, z), (~z, ~z), (z, ~z), (~z, z), (np.eye(3, dtype=bool), np.eye(3, dtype=bool)[::-1])]
    for pred, gold in cases:
        assert M.micro_f1(pred, gold) == pytest.approx(_quiet(skm.f1_score, gold, pred, average="micro"), abs=1e-12)
        assert M.exact_match(pred, gold) == skm.accuracy_score(gold, pred)
    assert M.multilabel_metrics([[1, 0], [0, 1]], [[1, 0], [1, 1]]) == {"micro_f1": 0.8, "exact_match": 0.5}


# ---- token classification vs seqeval ----

TAGS = [
    "O",
    "O",
    "O",
    "B-PER",
    "I-PER",
    "B-LOC",
    "I-LOC",
    "I-MISC",
    "B-MISC",  # well-formed material
    "E-PER",
    "S-LOC",
    "E-LOC",
    "S-MISC",  # IOBES tags in an IOB2 stream
    "B",
    "I",
    "E",
    "S",
    ".",
    ".-PER",
    "X-LOC",
    "O-PER",
    "B-PER-X",
    "BPER",
    "IPER",
    "I_LOC",
]  # odd corners


def _tag_cases():
    rng = np.random.default_rng(4)
    cases = []
    for i in range(300):
        alphabet = TAGS[:9] if i % 3 == 0 else TAGS
        gold = [[str(t) for t in rng.choice(alphabet, int(rng.integers(0, 9)))] for _ in range(int(rng.integers(1, 5)))]
        pred = [[t if rng.random() < 0.6 else str(rng.choice(alphabet)) for t in s] for s in gold]
        cases.append((pred, gold))
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["O", "B-MISC"]]
    cases += [
        (gold, gold),  # all correct
        ([["O"] * 4, ["O", "O"]], gold),
        (gold, [["O"] * 4, ["O", "O"]]),  # no entities on one side
        ([["O"] * 3], [["O"] * 3]),
        ([[]], [[]]),  # no entities at all
        ([["I-PER", "I-PER", "O", "I-LOC"], ["O", "I-MISC"]], gold),  # I- without B- opens an entity
        ([["B-PER", "I-LOC", "O", "B-LOC"], ["O", "B-MISC"]], gold),  # type change splits
        ([["B-PER"], [".-PER", "E-PER"]], [["B-PER"], ["B-PER", "E-PER"]]),
    ]  # "." keeps an old start
    return cases


def test_spans_match_seqeval_get_entities(seqeval):
    get_entities = seqeval.metrics.sequence_labeling.get_entities
    for pred, gold in _tag_cases():
        for seq in pred + gold:
            assert M.iob2_spans(seq) == set(_quiet(get_entities, seq))
    assert M.iob2_spans(["B-PER", "I-PER", "O", "I-LOC", "B-LOC"]) == {("PER", 0, 1), ("LOC", 3, 3), ("LOC", 4, 4)}


def test_span_prf_matches_seqeval(seqeval):
    sm = seqeval.metrics
    for pred, gold in _tag_cases():
        got = M.token_metrics(pred, gold) if any(gold) else {**M.span_prf(pred, gold), "accuracy": None}
        assert got["precision"] == pytest.approx(_quiet(sm.precision_score, gold, pred), abs=1e-12)
        assert got["recall"] == pytest.approx(_quiet(sm.recall_score, gold, pred), abs=1e-12)
        assert got["f1"] == pytest.approx(_quiet(sm.f1_score, gold, pred), abs=1e-12)
        if got["accuracy"] is not None:
            assert got["accuracy"] == pytest.approx(sm.accuracy_score(gold, pred), abs=1e-12)


def test_per_type_scores_match_seqeval_classification_report(seqeval):
    """run_ner.py's return_entity_level_metrics: each type's precision / recall / f1 / number as `evaluate`'s seqeval
    metric takes them from classification_report(output_dict=True), types with no gold entity (recall 0/0) or no
    prediction (precision 0/0) included; a type on neither side only when asked, all 0."""
    report = seqeval.metrics.classification_report
    for pred, gold in _tag_cases():
        got = M.span_prf_by_type(pred, gold)
        want = {
            t: {"precision": r["precision"], "recall": r["recall"], "f1": r["f1-score"], "number": r["support"]}
            for t, r in _quiet(report, gold, pred, output_dict=True).items()
            if not t.endswith(" avg")
        }
        assert list(got) == list(want)  # the same types, in the same (sorted) order
        for t in want:
            assert got[t] == pytest.approx(want[t], abs=1e-12), t
        if want:  # the overall scores are the micro average of the types'
            micro = _quiet(report, gold, pred, output_dict=True)["micro avg"]
            assert M.span_prf(pred, gold)["f1"] == pytest.approx(micro["f1-score"], abs=1e-12)
    gold, pred = [["B-PER", "I-PER", "O", "B-LOC"]], [["B-PER", "I-PER", "O", "B-ORG"]]
    assert M.span_prf_by_type(pred, gold) == {
        "LOC": {"precision": 0.0, "recall": 0.0, "f1": 0.0, "number": 1},  # no prediction
        "ORG": {"precision": 0.0, "recall": 0.0, "f1": 0.0, "number": 0},  # no gold entity
        "PER": {"precision": 1.0, "recall": 1.0, "f1": 1.0, "number": 1},
    }
    types = M.entity_types(["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-MISC", "I-MISC", "B-ORG", "I-ORG"])
    assert types == ("LOC", "MISC", "ORG", "PER")
    flat = M.entity_type_metrics(pred, gold, types)
    assert list(flat)[:4] == ["LOC_precision", "LOC_recall", "LOC_f1", "LOC_number"]
    assert flat["MISC_f1"] == flat["MISC_number"] == 0 and flat["PER_f1"] == 1.0 and flat["ORG_number"] == 0
    # the types a label set can form are those its tags form as entities
    for pred, gold in _tag_cases():
        names = {t for s in pred + gold for t in s}
        found = {t for s in (pred, gold) for t, _, _ in M.iob2_spans([x for sent in s for x in sent + ["O"]])}
        assert found <= set(M.entity_types(sorted(names))), names
    assert M.greater_is_better("PER_f1") and M.greater_is_better("LOC_recall")


def test_chunk_tags_are_told_from_tags_that_mark_no_entities():
    """Entity metrics need a chunk scheme. Tags given as ids (LABEL_i) read as entities of their own, the outside
    tag's included: a tagger that never finds an entity would score entity F1 1.0 on an all-outside set."""
    for names in (["O", "B-PER", "I-PER"], ["O", "S-LOC", "E-LOC"], ["B-MISC", "I-MISC", "O", "X"]):
        assert M.chunk_tags(names), names
    for names in (["LABEL_0", "LABEL_1"], ["O", "PER", "LOC"], ["O"], ["BERT", "IBM"]):
        assert not M.chunk_tags(names), names
    assert M.span_prf([["LABEL_0"] * 3], [["LABEL_0"] * 3])["f1"] == 1.0  # why: nothing found, "perfect" F1


def test_sentence_boundaries_and_the_dot_quirk():
    # The "." tag keeps the previous start, which seqeval takes from the joined stream, across the sentence break.
    assert M.span_prf([["B-PER"], [".-PER", "E-PER"]], [["B-PER"], [".-PER", "E-PER"]])["f1"] == 1.0
    assert M.iob2_spans([".-PER", "E-PER"]) == {("PER", 0, 1)}
    gold, pred = [["O", "B-PER"], [".-PER", "E-PER"]], [["B-PER", "O"], [".-PER", "E-PER"]]
    # spans (PER, 1, 4) vs (PER, 0, 4)
    assert M.span_prf(pred, gold) == {"precision": 0.0, "recall": 0.0, "f1": 0.0}
    # An entity never runs over a sentence end.
    assert M.span_prf([["B-PER"], ["I-PER"]], [["B-PER"], ["B-PER"]]) == {"precision": 1.0, "recall": 1.0, "f1": 1.0}


# ---- extractive QA vs the official SQuAD scripts ----
# v1.1 (evaluate-v1.1.py), verbatim:


def normalize_answer(s):
    """Lower text and remove punctuation, articles and extra whitespace."""

    def remove_articles(text):
        return re.sub(r"\b(a|an|the)\b", " ", text)

    def white_space_fix(text):
        return " ".join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    def lower(text):
        return text.lower()

    return white_space_fix(remove_articles(remove_punc(lower(s))))


def f1_score(prediction, ground_truth):
    prediction_tokens = normalize_answer(prediction).split()
    ground_truth_tokens = normalize_answer(ground_truth).split()
    common = Counter(prediction_tokens) & Counter(ground_truth_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(prediction_tokens)
    recall = 1.0 * num_same / len(ground_truth_tokens)
    f1 = (2 * precision * recall) / (precision + recall)
    return f1


def exact_match_score(prediction, ground_truth):
    return normalize_answer(prediction) == normalize_answer(ground_truth)


def metric_max_over_ground_truths(metric_fn, prediction, ground_truths):
    scores_for_ground_truths = []
    for ground_truth in ground_truths:
        score = metric_fn(prediction, ground_truth)
        scores_for_ground_truths.append(score)
    return max(scores_for_ground_truths)


def evaluate(dataset, predictions):
    f1 = exact_match = total = 0
    for article in dataset:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                total += 1
                if qa["id"] not in predictions:
                    message = "Unanswered question " + qa["id"] + " will receive score 0."
                    print(message, file=sys.stderr)
                    continue
                ground_truths = list(map(lambda x: x["text"], qa["answers"]))
                prediction = predictions[qa["id"]]
                exact_match += metric_max_over_ground_truths(exact_match_score, prediction, ground_truths)
                f1 += metric_max_over_ground_truths(f1_score, prediction, ground_truths)

    exact_match = 100.0 * exact_match / total
    f1 = 100.0 * f1 / total

    return {"exact_match": exact_match, "f1": f1}


# v2.0 (evaluate-v2.0.py), verbatim:


def normalize_answer_v2(s):
    """Lower text and remove punctuation, articles and extra whitespace."""

    def remove_articles(text):
        regex = re.compile(r"\b(a|an|the)\b", re.UNICODE)
        return re.sub(regex, " ", text)

    def white_space_fix(text):
        return " ".join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    def lower(text):
        return text.lower()

    return white_space_fix(remove_articles(remove_punc(lower(s))))


def get_tokens(s):
    if not s:
        return []  # noqa: E701
    return normalize_answer_v2(s).split()


def compute_exact(a_gold, a_pred):
    return int(normalize_answer_v2(a_gold) == normalize_answer_v2(a_pred))


def compute_f1(a_gold, a_pred):
    gold_toks = get_tokens(a_gold)
    pred_toks = get_tokens(a_pred)
    common = collections.Counter(gold_toks) & collections.Counter(pred_toks)
    num_same = sum(common.values())
    if len(gold_toks) == 0 or len(pred_toks) == 0:
        # If either is no-answer, then F1 is 1 if they agree, 0 otherwise
        return int(gold_toks == pred_toks)
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(pred_toks)
    recall = 1.0 * num_same / len(gold_toks)
    f1 = (2 * precision * recall) / (precision + recall)
    return f1


# (v2.0's get_raw_scores, per question:)
def v2_scores(answers, a_pred):
    gold_answers = [a for a in answers if normalize_answer_v2(a)]
    if not gold_answers:
        # For unanswerable questions, only correct answer is empty string
        gold_answers = [""]
    return (max(compute_exact(a, a_pred) for a in gold_answers), max(compute_f1(a, a_pred) for a in gold_answers))


# (v2.0's find_best_thresh:)
def find_best_thresh(preds, scores, na_probs, qid_to_has_ans):
    num_no_ans = sum(1 for k in qid_to_has_ans if not qid_to_has_ans[k])
    cur_score = num_no_ans
    best_score = cur_score
    best_thresh = 0.0
    qid_list = sorted(na_probs, key=lambda k: na_probs[k])
    for i, qid in enumerate(qid_list):  # noqa: B007
        if qid not in scores:
            continue
        if qid_to_has_ans[qid]:
            diff = scores[qid]
        else:
            if preds[qid]:
                diff = -1
            else:
                diff = 0
        cur_score += diff
        if cur_score > best_score:
            best_score = cur_score
            best_thresh = na_probs[qid]
    return 100.0 * best_score / len(scores), best_thresh


TEXTS = [
    "The Eiffel Tower",
    "eiffel tower",
    "the  eiffel\ttower.",
    "An apple a day",
    "a",
    "the",
    "an",
    "The the",
    "",
    " ",
    "...",
    "?!",
    "Théâtre de la Ville",
    "THÉÂTRE",
    "the théâtre",
    "athe",
    "theater",
    "a-b",
    "a_b",
    "U.S.A.",
    "usa",
    "1,000",
    "1000",
    "“quoted”",
    '"quoted"',
    "naïve café",
    "Straße",
    "STRASSE",
    "İstanbul",
    "50%",
    "50 %",
    "$5",
    "5",
    "foo\u00a0bar",
    "foo\u3000bar",
    "foo bar",
    "bar foo",
    "foo foo bar",
    "red red red",
    "red",
    "don't",
    "dont",
    "Über-cool",
    "über cool",
    "x—y",
    "x y",
    "rock 'n' roll",
    "1 2 3 4",
]


def test_squad_normalize_matches_both_scripts():
    for text in TEXTS:
        assert M.squad_normalize(text) == normalize_answer(text) == normalize_answer_v2(text)


def test_squad_exact_and_f1_match_official_scripts():
    rng = np.random.default_rng(5)
    cases = [(p, [g]) for p in TEXTS for g in TEXTS]
    cases += [
        (str(rng.choice(TEXTS)), [str(t) for t in rng.choice(TEXTS, int(rng.integers(0, 4)))]) for _ in range(400)
    ]
    for pred, golds in cases:
        em, f1 = v2_scores(golds, pred)
        assert M.squad_exact(pred, golds) == em and M.squad_f1(pred, golds) == f1
        if normalize_answer(pred) and golds and all(normalize_answer(g) for g in golds):  # v1.1 agrees here
            assert M.squad_exact(pred, golds) == metric_max_over_ground_truths(exact_match_score, pred, golds)
            assert M.squad_f1(pred, golds) == metric_max_over_ground_truths(f1_score, pred, golds)
        if golds:  # v1.1's rules, as run_qa.py reports SQuAD v1 data
            assert M.squad_exact(pred, golds, version_2=False) == metric_max_over_ground_truths(
                exact_match_score, pred, golds
            )
            assert M.squad_f1(pred, golds, version_2=False) == metric_max_over_ground_truths(f1_score, pred, golds)
    assert M.squad_f1("", []) == 1.0 and M.squad_f1("Paris", []) == 0.0 and M.squad_exact("the", []) == 1.0
    assert M.squad_f1("the", ["the"]) == 1.0 and f1_score("the", "the") == 0  # v1.1's one disagreement


def test_squad_scores_match_v1_evaluate(capsys):
    refs = {
        "q1": ["Denver Broncos", "The Denver Broncos"],
        "q2": ["Santa Clara, California"],
        "q3": ["1,000 men"],
        "q4": ["gold"],
        "q5": ["Levi's Stadium", "Levi's"],
    }
    preds = {"q1": "denver broncos!", "q2": "Santa Clara", "q3": "a thousand men", "q5": "Stadium", "zz": "x"}
    dataset = [{"paragraphs": [{"qas": [{"id": q, "answers": [{"text": a} for a in g]} for q, g in refs.items()]}]}]
    want = evaluate(dataset, preds)
    got = M.squad_scores(preds, refs)
    assert got == pytest.approx(want, abs=1e-12) and got["exact_match"] == 20.0
    assert M.squad_scores(preds, refs, version_2=False) == pytest.approx(want, abs=1e-12)


def test_squad_v1_data_is_scored_by_the_v1_script(monkeypatch, capsys):
    """Without --version-2-with-negative, run_qa.py reports v1.1's script ("squad"), which keeps a gold answer that
    normalizes to nothing: "a" matches the gold "the" exactly (F1 0), where v2.0 drops that gold answer."""
    import json

    from jaxbert.train import task_qa

    refs = {"q1": ["the", "Denver"], "q2": ["%"], "q3": ["Denver Broncos"]}
    preds = {"q1": "a", "q2": "%", "q3": "Broncos"}
    monkeypatch.setattr(task_qa, "predictions", lambda outputs, data: (preds, refs))
    meta = lambda v2: np.frombuffer(json.dumps({"options": {"version_2_with_negative": v2}}).encode(), np.uint8)  # noqa: E731
    dataset = [{"paragraphs": [{"qas": [{"id": q, "answers": [{"text": a} for a in g]} for q, g in refs.items()]}]}]
    v1 = task_qa.score(None, SimpleNamespace(extra={"meta": meta(False)}), None)
    assert v1 == pytest.approx(evaluate(dataset, preds), abs=1e-12) and v1["exact_match"] == pytest.approx(200 / 3)
    v2 = task_qa.score(None, SimpleNamespace(extra={"meta": meta(True)}), None)
    want = [v2_scores(refs[q], preds[q]) for q in refs]
    em, f1 = (100 * sum(x) / 3 for x in zip(*want))
    fields = {"exact_match": em, "f1": f1, "HasAns_exact": em, "HasAns_f1": f1}
    assert {k: v2[k] for k in fields} == pytest.approx(fields) and v2["total"] == v2["HasAns_total"] == 3


def test_squad_v2_splits_answerable_questions_whenever_there_are_any(monkeypatch):
    """v2.0's script reports HasAns_exact / HasAns_f1 for a set of answerable questions only (they equal the
    whole set's), and NoAns_ for one of unanswerable questions only; v1.1's has no split."""
    import json

    from jaxbert.train import task_qa

    meta = lambda v2: np.frombuffer(json.dumps({"options": {"version_2_with_negative": v2}}).encode(), np.uint8)  # noqa: E731
    for refs, split in (({0: ["Paris"], 1: ["Rome"]}, "HasAns"), ({0: [], 1: []}, "NoAns")):
        preds = {0: "Paris", 1: ""}
        monkeypatch.setattr(task_qa, "predictions", lambda outputs, data, p=preds, r=refs: (p, r))
        got = task_qa.score(None, SimpleNamespace(extra={"meta": meta(True)}), None)
        fields = {"exact_match": 50.0, "f1": 50.0, f"{split}_exact": 50.0, f"{split}_f1": 50.0, f"{split}_total": 2}
        assert {k: v for k, v in got.items() if not k.startswith(("best_", "total"))} == fields, refs
        if split == "HasAns":
            assert task_qa.score(None, SimpleNamespace(extra={"meta": meta(False)}), None) == {
                "exact_match": 50.0,
                "f1": 50.0,
            }


def test_squad_v2_reports_the_scripts_totals_and_best_thresholds(monkeypatch):
    """run_qa.py's v2 metrics (evaluate's squad_v2, the official v2.0 script) also hold total, HasAns_total,
    NoAns_total, best_exact / best_f1 and their thresholds (every no-answer probability 0.0, as run_qa passes)."""
    import json

    from jaxbert.train import task_qa

    rng = np.random.default_rng(5)
    words = ["Denver", "Broncos", "the", "Paris", "a", "Rome", "city", ""]
    meta = np.frombuffer(json.dumps({"options": {"version_2_with_negative": True}}).encode(), np.uint8)
    for _ in range(200):
        n = int(rng.integers(1, 12))
        refs = {f"q{i}": [str(rng.choice(words)) for _ in range(int(rng.integers(0, 3)))] for i in range(n)}
        preds = {q: " ".join(str(w) for w in rng.choice(words, int(rng.integers(0, 3)))) for q in refs}
        monkeypatch.setattr(task_qa, "predictions", lambda outputs, data, p=preds, r=refs: (p, r))
        got = task_qa.score(None, SimpleNamespace(extra={"meta": meta}), None)
        raw = {q: v2_scores(refs[q], preds[q]) for q in refs}
        has = {q: bool(refs[q]) for q in refs}
        na = {q: 0.0 for q in preds}
        for i, name in enumerate(("exact", "f1")):
            best, thresh = find_best_thresh(preds, {q: r[i] for q, r in raw.items()}, na, has)
            assert got[f"best_{name}"] == pytest.approx(best) and got[f"best_{name}_thresh"] == thresh
        assert got["total"] == n
        assert got.get("HasAns_total", 0) == sum(has.values()) and got.get("NoAns_total", 0) == n - sum(has.values())


# ---- retrieval vs brute force ----


def _brute_force(queries, corpus, k):
    """Rank by sorting documents on (-cosine, relevant last), so ties go against the relevant document."""
    acc, rr = [], []
    for i, q in enumerate(np.asarray(queries, np.float64)):
        scores = []
        for j, c in enumerate(np.asarray(corpus, np.float64)):
            den = np.linalg.norm(q) * np.linalg.norm(c)
            scores.append((-(q @ c) / den if den else -0.0, j == i, j))
        rank = [s[2] for s in sorted(scores)].index(i) + 1
        acc.append(rank == 1)
        rr.append(1.0 / rank if rank <= k else 0.0)
    return {"accuracy@1": float(np.mean(acc)), f"mrr@{k}": float(np.mean(rr))}


def test_retrieval_matches_brute_force():
    rng = np.random.default_rng(6)
    for _ in range(25):
        n, extra, d = int(rng.integers(1, 30)), int(rng.integers(0, 10)), int(rng.integers(1, 8))
        corpus = rng.normal(size=(n + extra, d))
        queries = corpus[:n] + rng.normal(size=(n, d)) * rng.random() * 2
        k = int(rng.choice([1, 3, 10]))
        got = M.retrieval_metrics(queries.astype(np.float32), corpus.astype(np.float32), k=k)
        assert got == pytest.approx(_brute_force(queries.astype(np.float32), corpus.astype(np.float32), k), abs=1e-12)
    # exact ties: +-1 vectors (norm 2) whose cosines are exact in any summation order, duplicates and zero rows
    signs = rng.choice([-1.0, 1.0], (40, 4))
    corpus = np.concatenate([signs[:20], signs[:5], np.zeros((2, 4))])
    queries = np.concatenate([signs[20:38], np.zeros((2, 4))])
    assert M.retrieval_metrics(queries, corpus) == pytest.approx(_brute_force(queries, corpus, 10), abs=1e-12)


def test_retrieval_by_each_similarity_matches_brute_force(monkeypatch):
    # sentence-transformers' similarity functions, written out pair by pair (its euclidean and manhattan
    # similarities are the negated distances); blocks of a few queries change nothing.
    pairs = {
        "dot": lambda q, c: q @ c,
        "euclidean": lambda q, c: -np.sqrt(((q - c) ** 2).sum()),
        "manhattan": lambda q, c: -np.abs(q - c).sum(),
    }
    rng = np.random.default_rng(9)
    for name, pair in pairs.items():
        for blocks in (False, True):
            if blocks:
                monkeypatch.setattr(M, "_SIMILARITIES_PER_BLOCK", 3 * 30)
            n, m, d = 20, 30, 5
            corpus = rng.normal(size=(m, d)) * rng.uniform(0.1, 5, (m, 1))  # norms apart: cosine would rank otherwise
            relevant = rng.integers(0, m, n)
            queries = corpus[relevant] + rng.normal(size=(n, d))
            acc, rr = [], []
            for q, r in zip(queries, relevant):
                order = sorted(range(m), key=lambda j: (-pair(q, corpus[j]), j == r))  # ties against the relevant
                rank = order.index(r) + 1
                acc.append(rank == 1)
                rr.append(1 / rank if rank <= 10 else 0.0)
            got = M.retrieval_metrics(queries, corpus, relevant=relevant, similarity=name)
            assert got == pytest.approx({"accuracy@1": np.mean(acc), "mrr@10": np.mean(rr)}, abs=1e-12), name
            assert got != M.retrieval_metrics(queries, corpus, relevant=relevant), name  # cosine's differ
    same = np.ones((3, 2))
    assert M.retrieval_metrics(same, same, similarity="manhattan") == {"accuracy@1": 0.0, "mrr@10": 1 / 3}
    with pytest.raises(ValueError, match="similarity 'cos': expected one of cosine, dot, euclidean, manhattan"):
        M.retrieval_metrics(same, same, similarity="cos")


def test_retrieval_blocks_change_nothing(monkeypatch):
    rng = np.random.default_rng(7)
    corpus = rng.choice([-1.0, 1.0], (60, 4))  # exact cosines in any summation order, and many ties
    queries = np.where(rng.random((50, 4)) < 0.8, corpus[:50], -corpus[:50])
    whole = M.retrieval_metrics(queries, corpus)
    monkeypatch.setattr(M, "_SIMILARITIES_PER_BLOCK", 7 * 60)
    assert M.retrieval_metrics(queries, corpus) == whole == pytest.approx(_brute_force(queries, corpus, 10))


def test_retrieval_ties_go_against_the_relevant_document():
    same = np.ones((5, 3))
    assert M.retrieval_metrics(same, same) == {"accuracy@1": 0.0, "mrr@10": 0.2}  # collapsed: rank 5 for all
    assert M.retrieval_metrics(same, same, k=4) == {"accuracy@1": 0.0, "mrr@4": 0.0}
    assert M.retrieval_metrics(np.eye(3), np.eye(3) * 7) == {"accuracy@1": 1.0, "mrr@10": 1.0}
    assert np.isnan(M.retrieval_metrics([[np.nan, 1.0]], [[1.0, 1.0]])["mrr@10"])


# ---- names, directions, validation ----


def test_bundle_keys_and_directions():
    bundles = [
        M.classification_metrics([0, 1], [0, 1]),
        M.regression_metrics([0.0, 1.0], [0.0, 1.0]),
        M.multilabel_metrics([[1, 0]], [[1, 0]]),
        M.token_metrics([["B-PER"]], [["B-PER"]]),
        M.choice_metrics([2], [2]),
        M.squad_scores({"a": "x"}, {"a": ["x"]}),
        M.retrieval_metrics(np.eye(2), np.eye(2)),
    ]
    keys = [sorted(b) for b in bundles]
    assert keys == [
        ["accuracy", "f1", "mcc"],
        ["mse", "pearson", "spearman"],
        ["exact_match", "micro_f1"],
        ["accuracy", "f1", "precision", "recall"],
        ["accuracy"],
        ["exact_match", "f1"],
        ["accuracy@1", "mrr@10"],
    ]
    assert all(name in M.GREATER_IS_BETTER for b in bundles for name in b)
    assert not M.greater_is_better("mse") and not M.greater_is_better("loss") and not M.greater_is_better("mlm_loss")
    assert M.greater_is_better("mrr@5") and M.greater_is_better("accuracy@3") and M.greater_is_better("f1")
    with pytest.raises(ValueError, match="unknown metric 'bleu'"):
        M.greater_is_better("bleu")


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: M.accuracy([1, 2], [1]), "pred"),
        (lambda: M.accuracy([], []), "pred"),
        (lambda: M.accuracy([[1]], [[1]]), "pred"),
        (lambda: M.macro_f1([1], ["1"]), "mix text"),
        (lambda: M.macro_f1([1], [1], labels=[1, 1]), "labels"),
        (lambda: M.macro_f1([1], [1], labels=[]), "labels"),
        (lambda: M.matthews([1, 2], [[1], [2]]), "gold"),
        (lambda: M.pearson([1.0], [1.0]), "at least 2"),
        (lambda: M.spearman(["a", "b"], ["a", "b"]), "pred"),
        (lambda: M.micro_f1([[2, 0]], [[1, 0]]), "pred"),
        (lambda: M.exact_match([[1, 0]], [[1, 0, 0]]), "pred"),
        (lambda: M.micro_f1([1, 0], [1, 0]), "pred"),
        (lambda: M.iob2_spans("B-PER"), "tags"),
        (lambda: M.iob2_spans(["B-PER", ""]), "tags"),
        (lambda: M.span_prf([["O"]], [["O", "O"]]), "pred_tags and gold_tags"),
        (lambda: M.span_prf([], []), "pred_tags"),
        (lambda: M.span_prf(["B-PER"], ["B-PER"]), "pred_tags"),
        (lambda: M.token_metrics([[]], [[]]), "gold_tags"),
        (lambda: M.squad_exact(None, ["x"]), "prediction"),
        (lambda: M.squad_f1("x", "x"), "golds"),
        (lambda: M.squad_normalize(3), "text"),
        (lambda: M.squad_scores({}, {}), "references"),
        (lambda: M.retrieval_metrics(np.ones((3, 2)), np.ones((2, 2))), "corpus"),
        (lambda: M.retrieval_metrics(np.ones((2, 2)), np.ones((2, 3))), "corpus"),
        (lambda: M.retrieval_metrics(np.ones(2), np.ones((2, 2))), "queries"),
        (lambda: M.retrieval_metrics(np.ones((2, 2)), np.ones((2, 2)), k=0), "k"),
    ],
)
def test_invalid_inputs_name_the_argument(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def test_a_task_s_macro_f1_is_over_the_classes_present_as_sklearn(skm):
    """The sequence-classification score of a 3-class model on a set of one class: macro F1 over the classes
    present, as sklearn's f1_score(average="macro") (the two classes absent from gold and predictions counted as
    zeros: a perfect score read 1/3)."""
    from types import SimpleNamespace

    from jaxbert.train.task_labels import Labels
    from jaxbert.train.task_table import _score_sequences

    logits = [np.array([2.0, 0.0, -1.0])] * 4 + [np.array([0.0, 3.0, 1.0])]
    gold = np.array([0, 0, 0, 0, 0])
    scores = _score_sequences(logits, SimpleNamespace(targets=gold), Labels(("a", "b", "c")))
    expected = skm.f1_score(gold, np.stack(logits).argmax(-1), average="macro")
    assert scores["f1"] == pytest.approx(expected) and expected == pytest.approx(4 / 9)


def _brute_force_relevant(queries, corpus, relevant, k):
    """_brute_force with query i's relevant document at corpus row relevant[i]."""
    out = [
        _brute_force([q], np.concatenate([corpus[[r]], np.delete(corpus, r, 0)]), k) for q, r in zip(queries, relevant)
    ]
    return {name: float(np.mean([o[name] for o in out])) for name in out[0]}


def test_retrieval_with_relevant_rows_matches_brute_force():
    rng = np.random.default_rng(8)
    for _ in range(10):
        m, n, d = int(rng.integers(1, 12)), int(rng.integers(1, 20)), int(rng.integers(1, 6))
        corpus = rng.choice([-1.0, 0.0, 1.0], (m, d)) if rng.random() < 0.5 else rng.normal(size=(m, d))
        relevant = rng.integers(0, m, n)
        queries = corpus[relevant] + rng.normal(size=(n, d)) * rng.random()
        got = M.retrieval_metrics(queries, corpus, k=3, relevant=relevant)
        assert got == pytest.approx(_brute_force_relevant(queries, corpus, relevant, 3), abs=1e-12)
    with pytest.raises(ValueError, match="relevant"):
        M.retrieval_metrics(np.eye(2), np.eye(2), relevant=[0, 2])


def test_embedding_validation_counts_a_repeated_positive_once():
    """Validation pairs sharing a positive (several questions of one passage) retrieve one document: a model
    embedding each anchor as its positive is perfect. The copies tied with the relevant row and counted against it:
    accuracy@1 0.0, mrr@10 0.5 here (sentence-transformers' InformationRetrievalEvaluator over the distinct
    passages: 1.0, 1.0)."""
    from types import SimpleNamespace

    from jaxbert.train.task_embedding import score

    passages = [[5, 6, 7], [8, 9], [5, 6, 7], [8, 9]]  # two passages, each the positive of two questions
    questions = [[1], [2], [3], [4]]
    seqs = [s for q, p in zip(questions, passages) for s in (q, p)]
    data = SimpleNamespace(
        ids=np.array([t for s in seqs for t in s], np.int32), starts=np.cumsum([0] + [len(s) for s in seqs]), choices=2
    )
    docs = {(5, 6, 7): [1.0, 0.0], (8, 9): [0.0, 1.0]}
    outputs = [np.array([docs[tuple(p)], docs[tuple(p)]]) for p in passages]
    got = score(outputs, data, None)
    assert (got["accuracy@1"], got["mrr@10"]) == (1.0, 1.0)


def test_two_class_tasks_also_report_glue_s_binary_f1(skm):
    """run_glue.py's f1 for MRPC and QQP is sklearn's binary F1 of label 1, not the macro F1 that "f1" is here: a
    two-class task reports it as binary_f1 beside f1."""
    from jaxbert.train.task_labels import Labels
    from jaxbert.train.task_table import _score_sequences, _sequence_metrics

    rng = np.random.default_rng(9)
    for _ in range(40):
        n = int(rng.integers(1, 30))
        gold, pred = rng.integers(0, 2, n), (rng.integers(0, 2, n) if rng.random() < 0.8 else np.zeros(n, int))
        want = _quiet(skm.f1_score, gold, pred)  # average="binary", pos_label=1
        assert M.binary_f1(pred, gold) == pytest.approx(want, abs=1e-12)
        logits = list(np.eye(2)[pred])
        scores = _score_sequences(logits, SimpleNamespace(targets=gold), Labels(("not_equivalent", "equivalent")))
        assert scores["binary_f1"] == pytest.approx(want, abs=1e-12)
    assert "binary_f1" in _sequence_metrics(Labels(("a", "b"))) and "binary_f1" not in _sequence_metrics(Labels("abc"))
