"""The fine-tuning tasks, one entry each: the head it trains, its default columns, how labels are named and
examples encoded, how validation outputs become metrics, and the default metric for the best checkpoint.

The loop, the step and `jaxbert evaluate` read this table; a new task (question answering, embeddings) is a new
entry: its encoder yields the batch keys its head's loss takes (labels, start_positions, ...).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from jaxbert import metrics
from jaxbert.train import task_encode as E
from jaxbert.train.config import EMBEDDING_LOSSES
from jaxbert.train.task_labels import Labels, sequence_labels, tag_labels, tag_lists


@dataclasses.dataclass(frozen=True)
class Task:
    name: str
    head: str
    columns: tuple[str, str | None, str]  # defaults of --text-column, --text-pair-column, --label-column
    labels: Callable  # (training rows, columns, problem_type, model's names or None) -> Labels
    encode: Callable  # (tokenizer, rows, columns, Labels, max_len) -> (cache key parts, build -> Encodedset)
    score: Callable  # (per-example logits, Encodedset, Labels) -> {metric: value}
    metrics: Callable[[Labels], tuple[str, ...]]  # what score reports (first: the default best-model metric)
    options: Callable = lambda cfg: {}  # the task's own TrainConfig options, passed to encode as keywords
    val_options: Callable | None = None  # the validation set's, where they differ (None: `options`)
    lines: bool = False  # also reads a .txt file, one text a line (task_data.read_rows)
    reads: tuple[bool, bool, bool] = (True, True, True)  # which of the three column flags the task has a role for
    # Text columns whose empty (or blank) cells drop the row, as transformers' scripts drop them: run_clm's
    # line_by_line (and a .txt's blank lines), run_summarization's rows without a text or a summary. A causal LM's
    # empty text is [CLS] [SEP] with nothing of its own to predict; run_glue keeps its empty texts, so others do.
    skip_empty: tuple[int, ...] = ()
    # (the rows, the columns) -> the columns read: scored pairs take their texts by position where unnamed.
    resolve: Callable = lambda rows, cols: cols


def _score_sequences(logits, data: E.Encodedset, labels: Labels) -> dict:
    x = np.stack(logits).astype(np.float64)
    if labels.problem_type == "regression":
        return metrics.regression_metrics(x.reshape(len(x), -1)[:, 0], data.targets.reshape(len(x), -1)[:, 0])
    if labels.problem_type == "multi_label_classification":
        return metrics.multilabel_metrics(x > 0, data.targets > 0.5)
    # Macro F1 over the classes present in gold or predictions, as sklearn's f1_score(average="macro") and
    # `evaluate`'s f1: a class absent from both counted as 0 and pulled a perfect score down to 1/3 of 3 classes.
    out = metrics.classification_metrics(x.argmax(-1), data.targets)
    if len(labels.names) == 2:  # what GLUE's binary tasks (MRPC, QQP) call f1: the F1 of label id 1
        out["binary_f1"] = metrics.binary_f1(x.argmax(-1), data.targets)
    return out


def _tag_metrics(labels: Labels) -> tuple[str, ...]:
    """Entity F1 first where the tag names are a chunk scheme (B-PER, I-PER, O); token accuracy alone where not
    (tags given as ids, or bare types), since entity spans would be read from names that do not mark any."""
    return ("f1", "precision", "recall", "accuracy") if metrics.chunk_tags(labels.names) else ("accuracy",)


def _score_tags(logits, data: E.Encodedset, labels: Labels) -> dict:
    """Entity-level P/R/F1 (seqeval's default mode) and token accuracy over the labelled sub-tokens (each word's
    first; all of them with --label-all-tokens, as run_ner.py scores them; see _tag_metrics)."""
    pred, gold = [], []
    for e, x in enumerate(logits):
        a, b = data.starts[e], data.starts[e + 1]
        tags = data.tags[a:b]
        keep = tags != E.IGNORE
        gold.append([labels.names[i] for i in tags[keep]])
        pred.append([labels.names[i] for i in np.asarray(x)[: b - a].argmax(-1)[keep]])
    reported = _tag_metrics(labels)
    out = {k: v for k, v in metrics.token_metrics(pred, gold).items() if k in reported}
    if "f1" in reported:  # each type of the label set, on both sides or not, so every evaluation has its keys
        out |= metrics.entity_type_metrics(pred, gold, metrics.entity_types(labels.names))
    return out


def type_metrics(task: Task, labels: Labels) -> tuple[str, ...]:
    """Each entity type's TYPE_precision, TYPE_recall, TYPE_f1, TYPE_number that _score_tags reports beside the
    overall ones (run_ner.py's return_entity_level_metrics): in metrics.jsonl and evaluate's output, not in the
    log line, whose width would grow with the types."""
    if task.name != "token-classification" or "f1" not in _tag_metrics(labels):
        return ()
    kinds = ("precision", "recall", "f1", "number")
    return tuple(f"{t}_{k}" for t in metrics.entity_types(labels.names) for k in kinds)


def _score_choices(logits, data: E.Encodedset, labels: Labels) -> dict:
    return metrics.choice_metrics(np.stack(logits).argmax(-1), data.targets)


def _sequence_metrics(labels: Labels) -> tuple[str, ...]:
    return {
        "regression": ("pearson", "spearman", "mse"),
        "multi_label_classification": ("micro_f1", "exact_match"),
    }.get(labels.problem_type, ("accuracy", "f1", "mcc", *(("binary_f1",) if len(labels.names) == 2 else ())))


def _no_labels(rows, cols, problem, fixed) -> Labels:
    """Tasks whose targets are in the rows themselves (choices, pairs, spans): no label vocabulary."""
    return Labels(())


def _embedding(name: str) -> Callable:
    """task_embedding's function `name`, imported on call (that module builds on task_plan, which reads this)."""

    def call(*args, **kwargs):
        from jaxbert.train import task_embedding

        return getattr(task_embedding, name)(*args, **kwargs)

    return call


def _qa(name: str) -> Callable:
    """task_qa's function `name`, imported on call (that module builds on task_plan, which reads this)."""

    def call(*args, **kwargs):
        from jaxbert.train import task_qa

        return getattr(task_qa, name)(*args, **kwargs)

    return call


def _from(module: str, name: str) -> Callable:
    """Function `name` of the task module `module`, imported on call (it builds on task_plan, which reads this)."""

    def call(*args, **kwargs):
        import importlib

        return getattr(importlib.import_module(f"jaxbert.train.{module}"), name)(*args, **kwargs)

    return call


def _tag_label_names(rows, columns, problem_type, fixed) -> Labels:
    return tag_labels(tag_lists(rows, columns[0], columns[2]), columns[2], fixed)


TASKS: dict[str, Task] = {
    t.name: t
    for t in (
        Task(
            "sequence-classification",
            "BertForSequenceClassification",
            ("text", None, "label"),
            lambda rows, cols, problem, fixed: sequence_labels(rows, cols[2], problem, fixed),
            E.encode_sequences,
            _score_sequences,
            _sequence_metrics,
        ),
        Task(
            "token-classification",
            "BertForTokenClassification",
            ("tokens", None, "ner_tags"),
            _tag_label_names,
            E.encode_tags,
            _score_tags,
            _tag_metrics,
            lambda cfg: {"label_all_tokens": cfg.label_all_tokens},
            reads=(True, False, True),
        ),
        # The head scores each (context, option) sequence with one output: no label names.
        Task(
            "multiple-choice",
            "BertForMultipleChoice",
            ("context", "choices", "label"),
            _no_labels,
            E.encode_choices,
            _score_choices,
            lambda labels: ("accuracy",),
        ),
        # (anchor, positive[, negative_1, ...]) texts; the base model and a pooling are trained (task_embedding.py).
        Task(
            "embedding",
            "BertModel",
            (None, None, None),  # task_embedding.triplet_columns: anchor, positive, negative, else by position
            _no_labels,
            _embedding("encode_pairs"),
            _embedding("score"),
            lambda labels: ("mrr@10", "accuracy@1"),
            lambda cfg: {"column_prompts": cfg.prompts},
            resolve=_embedding("triplet_columns"),
        ),
        # SQuAD rows: (question, context, answers); each window of a long context is one sequence (task_qa.py).
        Task(
            "question-answering",
            "BertForQuestionAnswering",
            ("question", "context", "answers"),
            _no_labels,
            _qa("encode"),
            _qa("score"),
            lambda labels: ("f1", "exact_match"),
            _qa("options"),
        ),
        # Texts, each one sequence; next-token prediction by a BertLMHeadModel (task_causal_lm.py).
        Task(
            "causal-lm",
            "BertLMHeadModel",
            ("text", None, None),
            _no_labels,
            _from("task_causal_lm", "encode"),
            _from("task_causal_lm", "score"),
            lambda labels: ("loss", "perplexity", "accuracy"),
            lines=True,
            reads=(True, False, False),
            skip_empty=(0,),
        ),
        # (source, target) texts for a bert2bert EncoderDecoderModel (task_seq2seq.py).
        Task(
            "seq2seq",
            "EncoderDecoderModel",
            ("source", None, "target"),
            _no_labels,
            _from("task_seq2seq", "encode"),
            _from("task_causal_lm", "score"),
            lambda labels: ("loss", "perplexity", "accuracy"),
            lambda cfg: {"lengths": tuple(n for _, n in cfg.seq2seq_lengths())},
            # run_summarization.py cuts the evaluation targets at val_max_target_length
            val_options=lambda cfg: {"lengths": tuple(n for _, n in cfg.seq2seq_lengths(validation=True))},
            reads=(True, False, True),
            skip_empty=(0, 2),
        ),
    )
}


# The key of a fine-tuned model's config.json holding the columns it was trained on ({"text", "pair", "label"}).
COLUMNS_KEY = "jaxbert_text_columns"


COLUMN_FLAGS = ("--text-column", "--text-pair-column", "--label-column")


def columns(task: Task, cfg) -> tuple[str, str | None, str]:
    text, pair, label = task.columns
    given = (cfg.text_column, cfg.text_pair_column, cfg.label_column)
    # A column the task has no role for would go unread without a word (train and evaluate both come here).
    for flag, read, value in zip(COLUMN_FLAGS, task.reads, given):
        if not read and value is not None:
            reads = " and ".join(f for f, r in zip(COLUMN_FLAGS, task.reads) if r)
            raise ValueError(f"{flag} {value!r}: --task {task.name} reads no such column (it reads {reads})")
    chosen = (cfg.text_column or text, cfg.text_pair_column or pair, cfg.label_column or label)
    # One column in two roles trains on nothing real: the label read as the text is learned as itself (a perfect
    # score), a text read as its own pair is the same text twice.
    for i, j in ((0, 2), (1, 2), (0, 1)):
        if chosen[i] is not None and chosen[i] == chosen[j]:
            raise ValueError(
                f"{COLUMN_FLAGS[i]} {chosen[i]!r} is also the {COLUMN_FLAGS[j]} (for --task {task.name}: "
                f"{', '.join(f'{f} {c!r}' for f, c in zip(COLUMN_FLAGS, chosen) if c is not None)}); "
                "each role needs its own column"
            )
    return chosen


def nonempty_rows(task: Task, rows: list, cols) -> tuple[list, int]:
    """(the rows whose task.skip_empty columns all hold text, how many were dropped); bad cells still fail."""
    kept = [r for r in rows if all(r.text(cols[i], empty_cell=True).strip() for i in task.skip_empty)]
    return kept, len(rows) - len(kept)


def trained_length(config) -> int | None:
    """The --max-seq-length a task model was trained with (see COLUMNS_KEY), None unknown: `evaluate` defaults to
    it, so its numbers are the training log's."""
    saved = (config.extra or {}).get(COLUMNS_KEY)
    length = saved.get("max_seq_length") if isinstance(saved, dict) else None
    return length if type(length) is int and length > 0 else None


def trained_sides(config) -> tuple[int, int] | None:
    """The (source, target) lengths a bert2bert was validated with (see COLUMNS_KEY: the targets at
    --val-max-target-length where the run had it; one --max-seq-length for both before the sides were recorded
    apart), None unknown: `evaluate` cuts as the training's validation did, so its numbers are the log's."""
    saved = (config.extra or {}).get(COLUMNS_KEY)
    sides = [saved.get(k) for k in ("max_source_length", "max_target_length")] if isinstance(saved, dict) else []
    if all(type(n) is int and n > 0 for n in sides) and sides:
        val = saved.get("val_max_target_length")
        return sides[0], val if type(val) is int and val > 0 else sides[1]
    length = trained_length(config)
    return None if length is None else (length, length)


def trained_all_tokens(config) -> bool:
    """Whether a tagger was trained with --label-all-tokens (see COLUMNS_KEY): `evaluate` scores its sub-tokens."""
    saved = (config.extra or {}).get(COLUMNS_KEY)
    return isinstance(saved, dict) and saved.get("label_all_tokens") is True


def trained_label(config) -> str | None:
    """The label column a task model was trained with (see COLUMNS_KEY), None unknown."""
    saved = (config.extra or {}).get(COLUMNS_KEY)
    label = saved.get("label") if isinstance(saved, dict) else None
    return label if isinstance(label, str) else None


def trained_loss(config) -> str | None:
    """The --loss an embedding model was trained with (see COLUMNS_KEY), None unknown (a model from elsewhere)."""
    saved = (config.extra or {}).get(COLUMNS_KEY)
    loss = saved.get("loss") if isinstance(saved, dict) else None
    return loss if loss in EMBEDDING_LOSSES else None


def trained_columns(config) -> tuple[str | None, str | None]:
    """The (text, second-text) columns a sequence classifier or multiple-choice model was trained with (see
    COLUMNS_KEY), None unknown."""
    saved = (config.extra or {}).get(COLUMNS_KEY)
    saved = saved if isinstance(saved, dict) else {}
    return tuple(saved.get(k) if isinstance(saved.get(k), str) else None for k in ("text", "pair"))


def metric_name(name: str | None, known: tuple[str, ...], why: str | None = None, by_type: tuple[str, ...] = ()) -> str:
    """--metric-for-best-model NAME (with or without eval_; default the task's first metric), checked; `why` says
    why the known metrics are fewer than the task's usual ones. `by_type` (type_metrics) are known too, but for
    the counts of gold entities (TYPE_number), which measure the data, not the model."""
    known = (*known, "loss", *(m for m in by_type if not m.endswith("_number")))
    name = (name or known[0]).removeprefix("eval_")
    if name not in known:
        raise ValueError(
            f"--metric-for-best-model {name}: not a metric of this task; known: {', '.join(known)}"
            + (f" ({why})" if why else "")
        )
    return name
