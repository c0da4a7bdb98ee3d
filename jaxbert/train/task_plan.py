"""A task fine-tuning run (sequence / token classification, multiple choice): the checked inputs, the label
names, the tokenized examples, batches and step counts, and what the loop asks of a run (as plan.Run answers
for masked LM): a step's batch, the initial parameters (a fresh head when the checkpoint has none), the
validation metrics, the final model's config with its labels.

`prepare` finds everything that can be wrong with the inputs (columns, labels, sizes) before compiling.
"""

from __future__ import annotations

import dataclasses
import math
import os

import jax
import numpy as np

from jaxbert import batching, cpu, distributed, malloc, metrics
from jaxbert.config import BertConfig, padding_id
from jaxbert.seq2seq import config_sides
from jaxbert.train import data as D
from jaxbert.train import task_encode as E
from jaxbert.train import task_pack as P
from jaxbert.train.config import PACKED_TASKS, TrainConfig, held_out, total_steps
from jaxbert.train.plan import model_and_batch
from jaxbert.train.step import task_eval_step
from jaxbert.train.task_data import read_rows
from jaxbert.train.task_init import task_params
from jaxbert.train.task_labels import LabelMismatch, Labels, check_scorable, model_labels, other_classifier
from jaxbert.train.task_table import COLUMNS_KEY, TASKS, Task, columns, metric_name, nonempty_rows, type_metrics


@dataclasses.dataclass
class TaskRun:
    cfg: TrainConfig
    config: BertConfig  # the model's, with this task's labels, problem type and architecture
    task: Task
    labels: Labels
    train: E.TaskBatches
    val: E.Encodedset
    total_steps: int
    warmup_steps: int
    metric: str
    renew: str | None = None  # why the checkpoint's classifier is not reused (its labels are not the data's)
    cols: tuple = ()  # the columns read (Task.resolve: scored pairs' texts may be found by position)
    log: list[str] = dataclasses.field(default_factory=list)
    split: dict = dataclasses.field(default_factory=dict)  # config.held_out's meta of --validation-split-percentage

    @property
    def head(self) -> str:
        return self.task.head

    def say(self, message: str) -> None:
        self.log.append(message)
        distributed.say(message)

    def batch(self, step: int, rows: slice | None = None) -> dict:
        return self.train(step, rows)

    def initial_params(self):
        params, notes = task_params(self.cfg.model, self.config, self.head, self.cfg.seed, self.renew)
        for note in notes:
            self.say(f"model: {note}")
        return params

    def eval_fn(self, dtype):
        smoothing = self.cfg.label_smoothing
        return lambda params, batch: task_eval_step(
            params, batch, config=self.config, head=self.head, dtype=dtype, label_smoothing=smoothing
        )

    def evaluate(self, params, eval_fn) -> dict:
        return evaluate_examples(
            eval_fn,
            params,
            self.val,
            self.task,
            self.labels,
            self.train.batch_size,
            self.train.buckets,
            jax.device_count(),
            padding_id(self.config),
        )

    def describe(self, result: dict) -> str:
        hidden = {f"eval_{k}" for k in type_metrics(self.task, self.labels)}  # in metrics.jsonl only
        return ", ".join(
            f"{'validation ' * (k == 'eval_loss')}{k.removeprefix('eval_')} {v:.4f}"
            for k, v in result.items()
            if k not in hidden
        )

    def final_config(self) -> BertConfig:
        # The columns trained on (task_table.trained_*): `evaluate` and `predict` default to them, so a pair model
        # is not fed its first texts alone (it scores them without a word) when --text-pair-column is left out, and
        # the labels are read where they were. `evaluate` also defaults to the trained length, so its numbers are
        # the training log's.
        text, pair, label = columns(self.task, self.cfg)
        trained = {"text": text, "pair": pair, "label": label, "max_seq_length": self.cfg.max_seq_length}
        if self.cfg.label_all_tokens:  # evaluate labels the sub-tokens as trained: its numbers stay the log's
            trained["label_all_tokens"] = True
        extra = {"num_labels": self.config.num_labels, COLUMNS_KEY: trained}
        return self.config.replace(extra={**self.config.extra, **extra})

    def meta(self) -> dict:
        return {"labels": list(self.labels.names), "resolved_problem_type": self.labels.problem_type}


def evaluate_examples(
    eval_fn,
    params,
    data: E.Encodedset,
    task: Task,
    labels: Labels,
    batch_size: int,
    buckets,
    multiple: int,
    pad_id: int,
) -> dict:
    """{"eval_loss", "eval_<metric>"...} of `data`: the mean loss over real labels, and the task's metrics."""
    outputs: list = [None] * len(data)
    loss = units = 0.0
    for idx, batch in E.eval_batches(data, batch_size, buckets, multiple, pad_id):
        logits, mean = eval_fn(params, batch)
        target = batch["labels"]
        n = float((target != E.IGNORE).sum() if target.dtype == np.int32 else batch["sample_weight"].sum())
        loss, units = loss + float(mean) * n, units + n
        logits = np.asarray(logits)
        for row, i in enumerate(idx):
            outputs[i] = logits[row]
    return {"eval_loss": loss / max(units, 1), **{f"eval_{k}": v for k, v in task.score(outputs, data, labels).items()}}


def labelled_config(config: BertConfig, task: Task, labels: Labels) -> BertConfig:
    if not labels.names:  # multiple choice: one score per option, no label names
        return config.replace(architectures=(task.head,))
    return config.replace(
        id2label=dict(enumerate(labels.names)),
        label2id=labels.ids,
        problem_type=labels.problem_type,
        architectures=(task.head,),
    )


def _per_example(data: E.Encodedset, task: Task) -> str:
    if task.name in ("causal-lm", "seq2seq"):
        lengths = data.lengths()  # a seq2seq example's: the longer of its source and target
        return f"texts of {int(lengths.min())} to {int(lengths.max())} tokens" if len(lengths) else "no texts"
    counts = data.options()
    lo, hi = int(counts.min(initial=data.choices)), int(counts.max(initial=data.choices))
    return f"{lo if lo == hi else f'{lo} to {hi}'} {'texts' if task.name == 'embedding' else 'options'} each"


def _names(names) -> str:
    return f"{', '.join(names[:8])}{', ...' * (len(names) > 8)}"


def _plain_tags(task: Task, labels: Labels) -> str | None:
    """Why a token-classification run reports token accuracy alone (task_table._tag_metrics), or None."""
    if task.name != "token-classification" or metrics.chunk_tags(labels.names):
        return None
    return (
        f"the tags ({_names(labels.names)}) have no B-, I-, E- or S- prefixes, so entity precision, recall and F1 "
        "would mean nothing: token accuracy only (name the tags, e.g. B-PER, I-PER, O, for entity scores)"
    )


def task_labels(task: Task, rows, cols, problem_type, fixed) -> tuple[Labels, str | None]:
    """The run's labels: the checkpoint's when the data fit them, else the data's, with why the checkpoint's
    classifier cannot be reused (its outputs would mean other labels)."""
    try:
        return task.labels(rows, cols, problem_type, fixed), None
    except LabelMismatch:
        labels = task.labels(rows, cols, problem_type, None)
    have, want = len(fixed), len(labels.names)
    if have != want:
        return labels, f"classifier.weight: the checkpoint has {have} labels ({_names(fixed)}), the data {want}"
    return labels, f"the checkpoint's labels ({_names(fixed)}) are not the data's ({_names(labels.names)})"


def embedding_lower_case(directory: str) -> bool:
    """Whether a sentence-transformers directory lower-cases texts (sentence_bert_config.json's do_lower_case)."""
    from jaxbert.sentence_dir import read

    found = read(directory)
    return bool(found and found.lower_case)


def prepare(cfg: TrainConfig, task: Task | None = None) -> TaskRun:
    """Everything that can be wrong with the inputs is found here, before any compilation. `task`: the task
    table's entry for cfg.task unless given (the embedding task's on scored pairs: task_scored.task)."""
    from jaxbert.sentence_dir import companion_files
    from jaxbert.tokenizer import WordPiece

    task = task or TASKS[cfg.task]
    cols = columns(task, cfg)  # a column flag the task has no role for is refused before the model is read
    config, batch = model_and_batch(cfg)
    n = jax.device_count()
    lines = cols[0] if task.lines else None
    train_rows, held = read_rows(cfg.train_file, "--train-file", lines), {}
    if cfg.validation_file:
        val_rows = read_rows(cfg.validation_file, "--validation-file", lines)
    else:
        cut, held = held_out(len(train_rows), cfg.validation_split_percentage)
        if cut == 0:
            raise ValueError(
                f"{cfg.train_file}: {len(train_rows)} examples leave no validation set at "
                f"{cfg.validation_split_percentage}%: pass --validation-file"
            )
        val_rows, train_rows = train_rows[:cut], train_rows[cut:]
    cols = task.resolve([*train_rows, *val_rows], cols)  # the validation rows in the training rows' columns
    (train_rows, empty), (val_rows, val_empty) = (nonempty_rows(task, rows, cols) for rows in (train_rows, val_rows))
    for rows, path, dropped in ((train_rows, cfg.train_file, empty), (val_rows, cfg.validation_file, val_empty)):
        if not rows:  # every text empty: nothing to train on or to score
            raise ValueError(f"{path or cfg.train_file}: no examples ({dropped} with an empty text, skipped)")
    labels, renew = task_labels(task, train_rows, cols, cfg.problem_type, model_labels(config, task.head))
    if renew is None and (other := other_classifier(config, task.head)):  # its names and shapes, not its outputs
        renew = f"the checkpoint's classifier is a {other}'s, not a {task.head}'s"
    if cfg.label_smoothing and labels.problem_type in ("regression", "multi_label_classification"):
        # transformers' label smoother would apply a softmax over scores / independent labels: meaningless here.
        raise ValueError(
            f"--label-smoothing {cfg.label_smoothing}: applies to classes, not to {labels.problem_type} labels"
        )
    split = f"the {cfg.validation_split_percentage}% held out for validation; pass --validation-file or more data"
    check_scorable(val_rows, labels, "" if cfg.validation_file else f" ({split})")
    plain = _plain_tags(task, labels)
    metric = metric_name(cfg.metric_for_best_model, task.metrics(labels), plain, type_metrics(task, labels))
    tok = WordPiece.from_dir(cfg.model)
    companion_files(cfg.model)  # what the written model copies: a path leaving the source fails now, not at the end
    key = [D.tokenizer_key(cfg.model), task.name, cfg.max_seq_length, labels.names, labels.problem_type]
    if task.name == "embedding" and embedding_lower_case(cfg.model):  # as sentence-transformers trains it
        tok, key = tok.lowercased(), [*key, "lower-cased"]

    encodings = ((train_rows, task.options(cfg)), (val_rows, (task.val_options or task.options)(cfg)))
    pending = [task.encode(tok, rows, cols, labels, cfg.max_seq_length, **opts) for rows, opts in encodings]
    if labels.problem_type == "single_label_classification" and len(labels.names) < 2:  # after the rows' checks
        # A softmax over one class: the loss is 0 from the start and every prediction scores 1.0.
        raise ValueError(
            f"{cfg.train_file}: one label ({labels.names[0]!r}); single-label classification needs at least 2 "
            "(--problem-type regression for scores)"
        )
    sets = [
        E.cached(os.path.join(cfg.output_dir, "cache"), name, [*key, *parts], build)
        for name, (parts, build) in zip(("train", "validation"), pending)
    ]
    (train, _), (val, _) = sets
    # Token ids and types inside the model's tables (JAX would clamp them: a wrong model, no error), before OUT/cache.
    for side in config_sides(config):
        E.check_tables(train, side, train_rows)
        E.check_tables(val, side, val_rows)
    for _, write in sets:
        write()
    # A seq2seq example is padded to its longer side before each side is cut to its own (task_seq2seq.split).
    sides = (*cfg.seq2seq_lengths(), *cfg.seq2seq_lengths(validation=True)) if task.name == "seq2seq" else ()
    longest = max(n for _, n in sides) if sides else cfg.max_seq_length
    buckets = batching.length_buckets(longest)
    packed = cfg.pack and task.name in PACKED_TASKS
    common = (train, batch, cfg.grad_accum_steps, cfg.seed, buckets, padding_id(config))
    if packed:
        segments = P.segments_per_row(train, cfg.max_seq_length)
        make = lambda: P.PackedTaskBatches(*common, cfg.max_seq_length, segments, n)  # noqa: E731
    else:
        make = lambda: E.TaskBatches(*common)  # noqa: E731
    batches = D.of_file(cfg.train_file, False, make)  # packed per step: the count is of examples
    total = total_steps(cfg, batches.steps_per_epoch)
    warmup = cfg.warmup_steps or math.ceil(cfg.warmup_ratio * total)
    run = TaskRun(cfg, labelled_config(config, task, labels), task, labels, batches, val, total, warmup, metric, renew)
    run.cols, run.split = cols, held
    named = f"{len(labels.names)} labels ({_names(labels.names)})"
    run.say(
        f"data: {len(train)} training and {len(val)} validation examples ({task.name}"
        f"{', ' + labels.problem_type if labels.problem_type else ''}; "
        f"{named if labels.names else _per_example(train, task)})"
    )
    if empty or val_empty:
        run.say(f"data: {empty} training and {val_empty} validation examples with an empty text skipped")
    if plain:
        run.say(f"metrics: {plain}")
    elif task.name == "token-classification":
        types = metrics.entity_types(labels.names)
        run.say(
            f"metrics: each entity type's precision, recall, f1 and number ({_names(types)}) in metrics.jsonl, "
            f"as eval_{types[0]}_f1 and so on"
        )
    if train.truncated or val.truncated:
        run.say(
            f"data: {train.truncated} training and {val.truncated} validation words beyond --max-seq-length "
            f"{cfg.max_seq_length} are truncated (no label, not scored)"
        )
    if packed:
        bucketed, packed_share = P.padded_positions(train, batches)
        run.say(
            f"data: packed into rows of {cfg.max_seq_length} tokens: {packed_share:.0%} of the positions computed "
            f"are padding ({bucketed:.0%} padding each step to a length bucket; --no-pack for that)"
        )
    run.say(
        f"plan: {total} steps of {batch} examples x {cfg.grad_accum_steps} accumulation on {n} device(s)"
        f"{' (FSDP)' if cfg.fsdp else ''}{f' (mesh {cfg.mesh})' if cfg.mesh else ''}"
        f", warm-up {warmup}, {cpu.label(cfg.dtype)}{malloc.label()}{', remat' if cfg.remat else ''}; "
        f"best model by eval_{metric}"
    )
    return run
