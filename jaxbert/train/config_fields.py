"""The tables and per-value checks behind TrainConfig: the tasks and the fields each kind of task owns (a field of
one given to another is refused), each field's type check (_check_type: the Python API has no argparse) and range
(RANGES: in float32 too, as the step holds the values), --prompts' forms (_prompts), and flag names (_flag).
"""

from __future__ import annotations

import math
import numbers
import re

import numpy as np

TASKS = (
    "mlm",
    "sequence-classification",
    "token-classification",
    "multiple-choice",
    "embedding",
    "question-answering",
    "causal-lm",
    "seq2seq",
)
# --no-pack's tasks (and mlm with --line-by-line): examples share rows (a causal LM's too: task_causal_lm.py)
PACKED_TASKS = ("sequence-classification", "token-classification", "causal-lm")
PROBLEM_TYPES = ("regression", "single_label_classification", "multi_label_classification")
MLM_FIELDS = ("line_by_line", "mlm_probability", "whole_word_mask", "max_predictions_per_seq")
# The embedding task's: its model's pipeline, its loss, and the prompts before its texts.
EMBEDDING_FIELDS = ("pooling", "normalize", "symmetric", "loss", "prompts")
EMBEDDING_LOSSES = ("mnrl", "cosent", "cosine-similarity", "angle")  # task_scored.SCORED: all but the first
# Question answering's windows (run_qa.py's flags) and post-processing (utils_qa.py's).
QA_FIELDS = ("doc_stride", "n_best_size", "max_answer_length", "version_2_with_negative", "null_score_diff_threshold")
TAG_FIELDS = ("label_all_tokens",)
SEQ2SEQ_FIELDS = ("max_source_length", "max_target_length")
GENERATE_FIELDS = ("predict_with_generate", "num_beams", "val_max_target_length")
# What --predict-with-generate adds to a seq2seq validation (run_summarization.py's compute_metrics)
GENERATED_METRICS = ("rouge1", "rouge2", "rougeL", "rougeLsum", "gen_len")
# Options of task fine-tuning (not flags of train-mlm, whose interface predates them).
TASK_FIELDS = (
    "text_column",
    "text_pair_column",
    "label_column",
    "problem_type",
    "task",
    "metric_for_best_model",
    "early_stopping_patience",
    *EMBEDDING_FIELDS,
    *QA_FIELDS,
    *TAG_FIELDS,
    *SEQ2SEQ_FIELDS,
    *GENERATE_FIELDS,
)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


_PAIR = re.compile(r"([^\s=]*)=(.*)", re.S)  # COLUMN=PROMPT; a prompt with a space before its "=" is one prompt


def _prompts(value):
    """--prompts as sentence-transformers' SentenceTransformerTrainingArguments(prompts=) reads it: a str is the
    prompt of every column; {column: prompt} (or the flag's COLUMN=PROMPT values) each named column's. -> the str,
    or ((column, prompt), ...) (hashable, as the frozen config). One flag value that is no pair is a str."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict):
        pairs = list(value.items())
    elif isinstance(value, (list, tuple)) and value and all(isinstance(v, (list, tuple)) for v in value):
        pairs = [tuple(v) for v in value]  # already read (dataclasses.replace runs this again)
    elif isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
        if len(value) == 1 and not _PAIR.fullmatch(value[0]):
            return value[0]
        pairs = []
        for v in value:
            found = _PAIR.fullmatch(v)
            if not found or not found[1]:
                raise ValueError(f"--prompts {v!r}: expected COLUMN=PROMPT (one PROMPT alone is every column's)")
            pairs.append(found.groups())
    else:
        raise TypeError(f"--prompts {value!r}: must be a prompt or {{column: prompt}}, not {type(value).__name__}")
    for pair in pairs:
        if len(pair) != 2 or not all(isinstance(v, str) for v in pair) or not pair[0]:
            raise ValueError(f"--prompts {pair!r}: expected a column name and its prompt, both strings")
    columns = [c for c, _ in pairs]
    if twice := next((c for c in columns if columns.count(c) > 1), None):
        raise ValueError(f"--prompts: column {twice!r} given twice")
    return tuple(pairs)


def _check_type(name: str, annotation: str, value):
    """`value` as the field's Python type, or an error naming its flag: the Python API has no argparse to
    convert strings, and a float batch size or a string learning rate would otherwise fail deep inside numpy or
    jit. numpy scalars are accepted and converted (they would not survive JSON in the checkpoint meta)."""
    kind, optional = annotation.split(" |")[0], annotation.endswith("| None")
    if value is None and optional:
        return value
    number = not isinstance(value, bool) and type(value).__name__ != "bool_"
    if kind == "bool":
        ok, what, cast = isinstance(value, bool), "true or false", bool
    elif kind == "int":
        ok, what, cast = number and isinstance(value, numbers.Integral), "an integer", int
    elif kind == "float":
        ok, what, cast = number and isinstance(value, numbers.Real), "a number", float
        if ok and not abs(_as_float(value)) <= F32_MAX:  # the step computes in float32, where 1e39 is inf
            raise ValueError(f"{_flag(name)} {value!r}: must be a finite number (within float32's ±{F32_MAX:.2e})")
    else:
        ok, what, cast = isinstance(value, str), "a string", str
        if ok and not value:
            raise ValueError(f"{_flag(name)} '': must not be empty")
    if not ok:
        raise TypeError(f"{_flag(name)} {value!r}: must be {what}, not {type(value).__name__}")
    return _as_float(value) if cast is float else cast(value)


def _as_float(value) -> float:
    try:
        return float(value)
    except OverflowError:  # an int beyond float range
        return math.inf


MAX_STEPS = 2**31 - 1  # TrainState.step, and the schedule's count, are int32
F32 = np.finfo(np.float32)
F32_MAX, F32_TINY = float(F32.max), float(F32.tiny)  # Python floats: comparing with a float32 would cast to it


def _below_one(v: float) -> bool:
    """In [0, 1) also once rounded to float32, as the step holds it: a beta of 0.9999999999 is 1.0 there, and
    Adam's bias correction 1 - beta**t divides by zero (NaN parameters after the first step)."""
    return 0 <= v and np.float32(v) < 1


def _positive(v: float) -> bool:
    """> 0 also in float32: an epsilon of 1e-50 is 0 there (Adam divides 0 by 0 where a gradient is 0), a
    learning rate of 1e-50 trains nothing."""
    return v >= F32_TINY


_IN_01 = "must be in [0, 1) (in float32 too, which rounds 0.99999999 to 1)"
_POSITIVE = f"must be > 0 (at least {F32_TINY:.2e}, float32's smallest normal number)"
# name -> (check, why); None values of optional fields are not checked. Types are checked before these run.
RANGES = {
    "validation_split_percentage": (lambda v: 0 < v < 100, "must be between 0 and 100 (exclusive)"),
    "max_seq_length": (lambda v: v >= 8, "must be at least 8"),
    "max_source_length": (lambda v: v >= 8, "must be at least 8"),
    "max_target_length": (lambda v: v >= 8, "must be at least 8"),
    # [CLS] and [SEP] around a generated token, as evaluate's --val-max-target-length
    "val_max_target_length": (lambda v: v >= 3, "must be at least 3"),
    "num_beams": (lambda v: v >= 1, "must be at least 1"),
    "mlm_probability": (lambda v: 0 < v < 1, "must be between 0 and 1 (exclusive)"),
    "max_predictions_per_seq": (lambda v: v >= 1, "must be at least 1"),
    "per_device_batch_size": (lambda v: v >= 1, "must be at least 1"),
    "global_batch_size": (lambda v: v >= 1, "must be at least 1"),
    "grad_accum_steps": (lambda v: v >= 1, "must be at least 1"),
    "learning_rate": (_positive, _POSITIVE),
    "weight_decay": (lambda v: v >= 0, "must be >= 0"),
    "adam_beta1": (_below_one, _IN_01),
    "adam_beta2": (_below_one, _IN_01),
    "adam_epsilon": (_positive, _POSITIVE),
    "warmup_steps": (lambda v: 0 <= v <= MAX_STEPS, f"must be >= 0 (and at most {MAX_STEPS}: int32 steps)"),
    "warmup_ratio": (lambda v: 0 <= v < 1, "must be in [0, 1)"),
    "num_train_epochs": (lambda v: v > 0, "must be > 0"),
    "max_steps": (lambda v: 1 <= v <= MAX_STEPS, f"must be in [1, {MAX_STEPS}] (the step counter is int32)"),
    "max_grad_norm": (lambda v: v >= 0, "must be >= 0 (0 turns clipping off)"),
    "label_smoothing": (_below_one, _IN_01),
    "dtype": (lambda v: v in ("float32", "bfloat16"), "must be float32 or bfloat16"),
    "seed": (lambda v: 0 <= v < 2**32, "must be in [0, 2**32)"),
    "logging_steps": (lambda v: v >= 1, "must be at least 1"),
    "eval_steps": (lambda v: v >= 1, "must be at least 1"),
    "save_steps": (lambda v: v >= 1, "must be at least 1"),
    "save_total_limit": (lambda v: v >= 1, "must be at least 1"),
    "task": (lambda v: v in TASKS, f"must be one of {', '.join(TASKS)}"),
    "problem_type": (lambda v: v in PROBLEM_TYPES, f"must be one of {', '.join(PROBLEM_TYPES)}"),
    "early_stopping_patience": (lambda v: v >= 1, "must be at least 1"),
    "num_processes": (lambda v: v >= 1, "must be at least 1"),
    "process_id": (lambda v: v >= 0, "must be >= 0"),
    "coordinator_address": (lambda v: v.rpartition(":")[2].isdigit(), "must be HOST:PORT"),
    "pooling": (lambda v: v in ("cls", "mean", "max"), "must be cls, mean or max"),
    "loss": (lambda v: v in EMBEDDING_LOSSES, f"must be one of {', '.join(EMBEDDING_LOSSES)}"),
    "doc_stride": (lambda v: v >= 0, "must be >= 0"),
    "n_best_size": (lambda v: v >= 1, "must be at least 1"),
    "max_answer_length": (lambda v: v >= 1, "must be at least 1"),
}
