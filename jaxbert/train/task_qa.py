"""Extractive question answering (`jaxbert train --task question-answering`): SQuAD rows (JSON lines or SQuAD
JSON) checked and cut into windows with start/end labels (qa.py), the span loss of BertForQuestionAnswering, and
SQuAD exact match / F1 of the answers post-processed from every window of each validation question.

A window is one sequence of task_encode's Encodedset, its target the (start, end) token pair ([CLS] when the
window does not hold the answer); what post-processing needs (each window's example and context offsets, the
examples' ids, contexts and gold answers, the options) travels in the set's `extra`, so OUT/cache keeps it.
"""

from __future__ import annotations

import dataclasses
import functools
import json

import jax.numpy as jnp
import numpy as np

from jaxbert import metrics, qa
from jaxbert.inputs import Arg, renaming
from jaxbert.train import task_encode as E
from jaxbert.train import task_plan
from jaxbert.train.task_data import Row
from jaxbert.train.task_labels import Labels

DEFAULTS = {
    "doc_stride": 128,
    "n_best_size": 20,
    "max_answer_length": 30,
    "version_2_with_negative": False,
    "null_score_diff_threshold": 0.0,
}


def options(cfg) -> dict:
    """TrainConfig's question-answering options (task_table's Task.options)."""
    return {k: getattr(cfg, k) for k in DEFAULTS}


# -- data ------------------------------------------------------------------------------------------------------
def read_squad(path: str) -> list[Row]:
    """SQuAD JSON (`data[].paragraphs[].qas[]`) as one row per question; a row's place is its JSON path."""
    try:
        with open(path, encoding="utf-8-sig") as f:  # a byte order mark is no error (json.load refuses one)
            doc = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a SQuAD JSON file ({e})") from None
    except RecursionError:
        raise ValueError(f"{path}: not a SQuAD JSON file (JSON nested too deeply)") from None
    rows = []
    articles = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(articles, list):
        raise ValueError(f"{path}: expected SQuAD JSON, an object with a 'data' list of articles")
    for a, article in enumerate(articles):
        for p, para in enumerate(_list(path, f"data[{a}]", article, "paragraphs")):
            where = f"data[{a}].paragraphs[{p}]"
            if not isinstance(para, dict):
                raise ValueError(f"{path}:{where}: expected an object")
            context = para.get("context")
            for q, item in enumerate(_list(path, where, para, "qas")):
                if not isinstance(item, dict):
                    raise ValueError(f"{path}:{where}.qas[{q}]: expected an object")
                answers = item.get("answers")
                if isinstance(answers, list):  # SQuAD's list of {text, answer_start} -> the datasets form
                    if not all(isinstance(x, dict) for x in answers):
                        raise ValueError(f"{path}:{where}.qas[{q}]: 'answers' must hold objects")
                    answers = {k: [x.get(k) for x in answers] for k in ("text", "answer_start")}
                values = {**item, "context": context, "answers": answers}
                rows.append(Row(path, f"{where}.qas[{q}]", values, True))
    if not rows:
        raise ValueError(f"{path}: no questions")
    return rows


def _list(path, where, obj, key) -> list:
    value = obj.get(key) if isinstance(obj, dict) else None
    if not isinstance(value, list):
        raise ValueError(f"{path}:{where}: expected a {key!r} list")
    return value


def _answers(row: Row, column: str, context: str, version_2: bool) -> tuple[list[str], list[int]]:
    """Checked gold answers: texts and character starts, each text found at its start in the context."""
    value = row.get(column)
    if not row.typed and isinstance(value, str):  # a CSV/TSV cell holds the JSON object (README)
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            pass  # named below
    texts = value.get("text") if isinstance(value, dict) else None
    starts = value.get("answer_start") if isinstance(value, dict) else None
    if not isinstance(texts, list) or not isinstance(starts, list) or len(texts) != len(starts):
        raise ValueError(
            f"{row.where(column)}: expected {{'text': [...], 'answer_start': [...]}} with one start per answer"
        )
    for text, start in zip(texts, starts):
        if not isinstance(text, str) or not text:
            raise ValueError(f"{row.where(column)}: answer {text!r} is not a non-empty string")
        if isinstance(start, bool) or not isinstance(start, int):
            raise ValueError(f"{row.where(column)}: answer_start {start!r} is not an integer")
        if start < 0 or context[start : start + len(text)] != text:  # negative: Python would slice from the end
            found = context[max(start, 0) : max(start, 0) + len(text)]
            raise ValueError(
                f"{row.where(column)}: answer_start {start} does not point at the answer {text!r} "
                f"(the context there reads {found!r})"
            )
    if not texts and not version_2:
        raise ValueError(
            f"{row.where(column)}: no answer; unanswerable questions need --version-2-with-negative (SQuAD v2)"
        )
    return texts, starts


def encode(tok, rows, columns, labels: Labels, max_len: int, names=qa.FLAGS, **opts):
    """Every row checked, then (cache key parts, build): windows of `max_len` tokens, `doc_stride` overlap.
    `names` name the two where a question leaves no room (training's flags; `evaluate` has no --doc-stride)."""
    opts = {**DEFAULTS, **opts}
    question, context, answers = columns
    contexts = [r.text(context) for r in rows]
    questions = [r.text(question) for r in rows]
    golds = [_answers(r, answers, c, opts["version_2_with_negative"]) for r, c in zip(rows, contexts)]
    ids = [str(r.values.get("id", f"{r.path}:{r.line}")) for r in rows]
    if opts["doc_stride"] >= max_len:
        raise ValueError(f"--doc-stride {opts['doc_stride']}: must be below --max-seq-length {max_len}")

    def build() -> E.Encodedset:
        with renaming(by_row(rows, question)):
            w = qa.windows(tok, questions, contexts, max_len, opts["doc_stride"], names)
        cls = tok.token_to_id(tok.special_tokens["cls_token"])  # as the tokenizer's files name it
        targets = []
        for f, offs in enumerate(w.offsets):
            texts, starts = golds[w.example[f]]
            cls_index = w.ids[f].index(cls) if cls in w.ids[f] else 0
            first = starts[0] if texts else None
            targets.append(qa.label(offs, cls_index, first, (first or 0) + len(texts[0]) if texts else 0))
        data = E._pack(_AsEncoded(w.ids, w.type_ids), 1, np.asarray(targets, np.int32))
        meta = {"ids": ids, "contexts": contexts, "answers": [t for t, _ in golds], "options": opts}
        data.extra = {
            "offsets": np.asarray([o for offs in w.offsets for o in offs], np.int32).reshape(-1, 2),
            "example": np.asarray(w.example, np.int32),
            "meta": np.frombuffer(json.dumps(meta).encode(), np.uint8),
        }
        return data

    return [questions, contexts, [g[0] for g in golds], [g[1] for g in golds], ids, opts], build


def by_row(rows: list[Row], column: str):
    """inputs.renaming's change naming qa.windows' `example i` by rows[i]'s file, line and `column` (the
    question's: the example's question is what leaves the context no room)."""
    named = lambda p: rows[p.value].where(column) if isinstance(p, Arg) and p.name == "example" else p  # noqa: E731
    return lambda parts: tuple(map(named, parts))


def pipeline_row(row: Row, column: str, length_given: bool):
    """inputs.renaming's change for Bert.answer run on one row (predict, a model not fine-tuned here): its
    `question` named by the row's file, line and `column`, its max_seq_len by predict's --max-seq-length where that
    set it, else as the pipeline's, and its doc_stride as the pipeline's (predict has no flag for it)."""
    names = {"question": f"{row.where(column)}: its question", "doc_stride": "the pipeline's stride"}
    names["max_seq_len"] = "--max-seq-length" if length_given else "the pipeline's length"
    named = lambda p: p if not isinstance(p, Arg) or p.name not in names else p._replace(name=names[p.name])  # noqa: E731
    return lambda parts: tuple(map(named, parts))


@dataclasses.dataclass
class _AsEncoded:  # what task_encode._pack reads of a tokenizer.Encoded
    ids: list
    type_ids: list

    def __len__(self):
        return len(self.ids)


# -- validation ------------------------------------------------------------------------------------------------
def predictions(outputs, data: E.Encodedset) -> tuple[dict, dict]:
    """({example: answer text}, {example: gold texts}), examples by index (ids need not be unique), from each
    window's [L, 2] start/end logits."""
    meta = json.loads(data.extra["meta"].tobytes())
    opts = {k: v for k, v in meta["options"].items() if k != "doc_stride"}
    windows: dict[int, list[int]] = {}
    for f, e in enumerate(data.extra["example"]):
        windows.setdefault(int(e), []).append(f)
    preds = {}
    for e, feats in windows.items():
        logits = [np.asarray(outputs[f], np.float64)[: data.starts[f + 1] - data.starts[f]] for f in feats]
        offs = [[tuple(o) for o in data.extra["offsets"][data.starts[f] : data.starts[f + 1]]] for f in feats]
        text, _, _ = qa.best_answers(
            [x[:, 0] for x in logits], [x[:, 1] for x in logits], offs, meta["contexts"][e], **opts
        )
        preds[e] = text
    return preds, dict(enumerate(meta["answers"]))


def score(outputs, data: E.Encodedset, labels) -> dict:
    """exact_match and f1 (percent, the official script's: v1.1's, or v2.0's with version_2_with_negative); v2.0
    also the script's other fields: total, the HasAns_ (answerable questions) and NoAns_ (unanswerable) splits,
    each where there are any, and best_exact / best_f1 with their thresholds."""
    preds, golds = predictions(outputs, data)
    # run_qa.py scores SQuAD v1 data with v1.1's script ("squad"), which differs where a gold answer normalizes to
    # nothing ("the", "%"), and v2 data with v2.0's ("squad_v2").
    v2 = bool(json.loads(data.extra["meta"].tobytes())["options"]["version_2_with_negative"])
    out = metrics.squad_scores(preds, golds, version_2=v2)
    if not v2:
        return out
    out["total"] = len(golds)
    for name, keep in (("HasAns", lambda g: bool(g)), ("NoAns", lambda g: not g)):
        part = {k: g for k, g in golds.items() if keep(g)}
        if part:  # as v2.0's script: each split its set has, the whole set included
            sub = metrics.squad_scores(preds, part, version_2=v2)
            out[f"{name}_exact"], out[f"{name}_f1"], out[f"{name}_total"] = sub["exact_match"], sub["f1"], len(part)
    for name, per_question in (("exact", metrics.squad_exact), ("f1", metrics.squad_f1)):
        scores = {k: per_question(preds[k], g) for k, g in golds.items() if k in preds}
        out[f"best_{name}"], out[f"best_{name}_thresh"] = _best_threshold(preds, scores, golds)
    return out


def _best_threshold(preds: dict, scores: dict, golds: dict) -> tuple[float, float]:
    """v2.0's find_best_thresh with run_qa.py's no-answer probabilities (0.0 for every question): the best score
    over the questions in prediction order when each prefix keeps its answers and the rest answer nothing."""
    best = current = sum(1 for g in golds.values() if not g)
    for k in preds:
        if k in scores:
            current += scores[k] if golds[k] else -1 if preds[k] else 0
            best = max(best, current)
    return 100.0 * best / len(scores), 0.0


# -- the loss --------------------------------------------------------------------------------------------------
def _forward(params, batch, *, config, head, rng=None, dtype=jnp.float32, remat=False, smoothing=0.0):
    from jaxbert.train.step import task_forward

    labels = batch["labels"]  # [B, 2]; padding rows -100, moved past the end where span_loss ignores them
    pos = jnp.where(labels == E.IGNORE, batch["input_ids"].shape[-1], labels)
    feed = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    feed.update(start_positions=pos[:, 0], end_positions=pos[:, 1])
    out = task_forward(params, config, head, feed, rng=rng, dtype=dtype, remat=remat, label_smoothing=smoothing)
    return out, labels


def train_loss(params, batch, rng, dtype, remat, *, config, head, smoothing):
    """The step's loss hook: (logits [B, 2, L], loss, labels [B, 2]): accuracy counts exact start/end tokens."""
    out, labels = _forward(
        params, batch, config=config, head=head, rng=rng, dtype=dtype, remat=remat, smoothing=smoothing
    )
    return jnp.stack([out.start_logits, out.end_logits], 1), out.loss, labels


def eval_step(params, batch, *, config, head, dtype=jnp.float32):
    """([B, L, 2] float32 start/end logits, mean loss over the real rows)."""
    out, _ = _forward(params, batch, config=config, head=head, dtype=dtype)
    return jnp.stack([out.start_logits, out.end_logits], -1).astype(jnp.float32), out.loss


@dataclasses.dataclass
class QARun(task_plan.TaskRun):
    """task_plan.TaskRun with the span loss, SQuAD evaluation, and the QA options kept in the model's config."""

    @property
    def loss_fn(self):
        return functools.partial(train_loss, config=self.config, head=self.head, smoothing=self.cfg.label_smoothing)

    def eval_fn(self, dtype):
        return functools.partial(eval_step, config=self.config, head=self.head, dtype=dtype)

    def final_config(self):
        kept = {"max_seq_length": self.cfg.max_seq_length, **options(self.cfg)}
        return self.config.replace(extra={**self.config.extra, "question_answering": kept})


def prepare(cfg) -> QARun:
    if cfg.label_smoothing:  # transformers' Trainer smooths `labels` only: a QA batch has none, its span loss is plain.
        # Here it spread the target over every position of the window, question, [SEP] and bucket padding included.
        what = "applies to classes, not to --task question-answering"
        raise ValueError(f"--label-smoothing {cfg.label_smoothing}: {what}")
    base = task_plan.prepare(cfg)
    run = QARun(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)})
    # The span softmax runs over padding positions too (transformers'), so the loss depends on how far a window is
    # padded: to --max-seq-length, as run_qa.py (pad_to_max_length, its default), never to whichever length bucket
    # its step's longest window fell in (a window's loss then changed with the windows beside it).
    run.train.buckets = (cfg.max_seq_length,)
    if run.config.num_labels != 2:  # the span head has two outputs (start, end), whatever the base was a head for:
        # a base model's num_labels of 3 (an NLI model's) built a 3-output head that failed at the first evaluation
        run.config = run.config.replace(id2label=None, label2id=None)
    questions = [int(d.extra["example"].max(initial=-1)) + 1 for d in (run.train.blocks, run.val)]
    run.say(
        f"data: the examples above are windows of {cfg.max_seq_length} tokens (stride {cfg.doc_stride}) of "
        f"{questions[0]} training and {questions[1]} validation questions"
    )
    return run
