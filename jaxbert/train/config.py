"""TrainConfig: every option of `jaxbert train` (and of `train-mlm`, which is `train --task mlm`), with
transformers' run_mlm / run_glue defaults where they have them.

Every field is type- and range-checked on construction, so a bad value (from the command line or the Python
API) fails with one line naming its flag before anything is read, written or compiled; the checks of one value and
the tables of tasks and their fields are config_fields.py's (re-exported here: TASKS, RANGES, F32_MAX, ...). The
values derived from a config (total_steps, held_out, the resume keys, seq2seq's lengths) are here.
"""

from __future__ import annotations

import dataclasses
import functools
import math

from jaxbert.train.config_fields import (  # noqa: F401  (re-exported: the names other modules import from config)
    EMBEDDING_FIELDS,
    EMBEDDING_LOSSES,
    F32,
    F32_MAX,
    F32_TINY,
    GENERATE_FIELDS,
    GENERATED_METRICS,
    MAX_STEPS,
    MLM_FIELDS,
    PACKED_TASKS,
    PROBLEM_TYPES,
    QA_FIELDS,
    RANGES,
    SEQ2SEQ_FIELDS,
    TAG_FIELDS,
    TASK_FIELDS,
    TASKS,
    _check_type,
    _flag,
    _prompts,
)

# The optimizer's and the loss's settings: a resumed step with others is not the step the run would have taken.
OPTIMIZER_KEYS = ("weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm", "label_smoothing")


_PER_DEVICE_DEFAULT = 8


def check_both_sides(max_length: int | None, source: int | None, target: int | None, target_flag: str) -> None:
    """Refuses a seq2seq --max-seq-length beside both sides' own lengths (--max-source-length and `target_flag`,
    train's --max-target-length or evaluate's --val-max-target-length): it would cut nothing, taken without a
    word."""
    if None not in (max_length, source, target):
        raise ValueError(
            f"--max-seq-length {max_length}: --max-source-length and {target_flag} set both sides; pass "
            "--max-seq-length (both sides) or the two"
        )


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    model: str
    train_file: str
    output_dir: str
    validation_file: str | None = None
    validation_split_percentage: int | None = None  # 5 (run_mlm's) without a --validation-file; refused beside one
    max_seq_length: int | None = None  # 128; 384 for question answering (run_qa.py's)
    line_by_line: bool = False
    mlm_probability: float = 0.15
    whole_word_mask: bool = False
    max_predictions_per_seq: int | None = None
    per_device_batch_size: int = _PER_DEVICE_DEFAULT
    global_batch_size: int | None = None
    grad_accum_steps: int = 1
    learning_rate: float = 5e-5
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8
    warmup_steps: int = 0
    warmup_ratio: float = 0.0
    num_train_epochs: float | None = None  # 3.0; with --max-steps, which decides alone, None unless given
    max_steps: int | None = None
    max_grad_norm: float = 1.0
    label_smoothing: float = 0.0
    dtype: str = "float32"
    remat: bool = False
    fsdp: bool = False
    mesh: str | None = None  # data=N,fsdp=N,tensor=N (see jaxbert.sharding); default all devices on data
    coordinator_address: str | None = None  # multi-process (jax.distributed): HOST:PORT of process 0
    num_processes: int | None = None
    process_id: int | None = None
    seed: int = 42
    logging_steps: int = 10
    eval_steps: int | None = None
    save_steps: int = 500
    save_total_limit: int = 2
    resume: str | None = None
    progress: bool = True
    break_lock: bool = False
    task: str = "mlm"
    text_column: str | None = None
    text_pair_column: str | None = None
    label_column: str | None = None
    problem_type: str | None = None
    metric_for_best_model: str | None = None
    early_stopping_patience: int | None = None
    pack: bool = True  # line-by-line MLM, sequence / token classification: examples share rows (--no-pack)
    label_all_tokens: bool = False  # token classification: run_ner.py's, a word's later sub-tokens labelled too
    # --task embedding's pipeline; None: the model's sentence-transformers one, else mean, not normalized
    # (task_embedding.with_pipeline, which also takes max_seq_length from there)
    pooling: str | None = None
    normalize: bool | None = None
    symmetric: bool = False
    # mnrl: (anchor, positive[, negative_1, ...]) rows, in-batch negatives; cosent, cosine-similarity, angle:
    # scored pairs (sentence-transformers' CoSENTLoss, CosineSimilarityLoss, AnglELoss; task_scored.py)
    loss: str = "mnrl"
    # sentence-transformers' `prompts`: one prompt (a str) before every column's texts, or (column, prompt) pairs
    # (given as {column: prompt}, or as the flag's COLUMN=PROMPT values); _prompts
    prompts: str | tuple | None = None
    doc_stride: int | None = None  # 128, or half of a shorter --max-seq-length (the QA pipeline's rule)
    n_best_size: int = 20
    max_answer_length: int = 30
    version_2_with_negative: bool = False
    null_score_diff_threshold: float = 0.0
    # --task seq2seq: run_summarization.py's max_source_length / max_target_length, each side's cut (default
    # --max-seq-length, which cut both before they existed)
    max_source_length: int | None = None
    max_target_length: int | None = None
    # run_summarization.py's --predict_with_generate, --num_beams and --val_max_target_length: each validation also
    # generates (task_seq2seq_generated.py) and scores ROUGE; the validation targets are cut at the last, which
    # bounds the generation too (default: where training cuts them)
    predict_with_generate: bool = False
    num_beams: int | None = None
    val_max_target_length: int | None = None

    def __post_init__(self):
        for field in dataclasses.fields(self):
            check = _prompts if field.name == "prompts" else functools.partial(_check_type, field.name, str(field.type))
            object.__setattr__(self, field.name, check(getattr(self, field.name)))
        # Two sources of the validation set: which one was meant is not for the run to guess.
        if self.validation_file is not None and self.validation_split_percentage is not None:
            raise ValueError("pass --validation-file or --validation-split-percentage, not both")
        if self.validation_split_percentage is None and self.validation_file is None:
            object.__setattr__(self, "validation_split_percentage", 5)
        if self.num_train_epochs is None and self.max_steps is None:
            object.__setattr__(self, "num_train_epochs", 3.0)
        both = None not in (self.max_source_length, self.max_target_length)
        if self.task == "seq2seq":
            check_both_sides(self.max_seq_length, self.max_source_length, self.max_target_length, "--max-target-length")
        # A seq2seq run with both sides set has no --max-seq-length (None, so replace() runs this again unchanged).
        if self.max_seq_length is None and self.task != "embedding" and not (self.task == "seq2seq" and both):
            object.__setattr__(self, "max_seq_length", 384 if self.task == "question-answering" else 128)
        if self.doc_stride is None and self.task == "question-answering":
            object.__setattr__(self, "doc_stride", min(128, self.max_seq_length // 2))
        for name, (ok, why) in RANGES.items():
            value = getattr(self, name)
            if value is not None and not ok(value):
                raise ValueError(f"{_flag(name)} {value!r}: {why}")
        if (
            self.max_predictions_per_seq is not None
            and self.max_seq_length is not None
            and self.max_predictions_per_seq > self.max_seq_length
        ):
            raise ValueError(
                f"--max-predictions-per-seq {self.max_predictions_per_seq}: exceeds --max-seq-length "
                f"{self.max_seq_length}"
            )
        if self.warmup_steps and self.warmup_ratio:
            raise ValueError("pass --warmup-steps or --warmup-ratio, not both")
        # The global batch decides alone (plan.py); a per-device size beside it would be dropped without a word.
        if self.global_batch_size is not None and self.per_device_batch_size != _PER_DEVICE_DEFAULT:
            raise ValueError("pass --per-device-batch-size or --global-batch-size, not both")
        self._check_task_fields()
        self._check_scale_fields()

    def _check_scale_fields(self):
        """Mesh syntax and the multi-process trio, before any device is touched (sizes are checked later)."""
        from jaxbert.sharding import parse_mesh

        if self.mesh is not None:
            parse_mesh(self.mesh)
            if self.fsdp:
                raise ValueError("pass --mesh or --fsdp, not both (--fsdp is --mesh data=1,fsdp=-1)")
        trio = (self.coordinator_address, self.num_processes, self.process_id)
        if any(v is not None for v in trio) and any(v is None for v in trio):
            raise ValueError("--coordinator-address, --num-processes and --process-id go together: pass all three")
        if self.process_id is not None and self.process_id >= self.num_processes:
            raise ValueError(f"--process-id {self.process_id}: must be below --num-processes {self.num_processes}")

    def _check_task_fields(self):
        """Options of one kind of task given to another are mistakes, not silently ignored settings."""
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        wrong = MLM_FIELDS if self.task != "mlm" else TASK_FIELDS[:4]
        for name in wrong:
            if getattr(self, name) != defaults[name]:
                where = "--task mlm" if self.task != "mlm" else "task fine-tuning (--task other than mlm)"
                raise ValueError(f"{_flag(name)} applies to {where} only, not --task {self.task}")
        if self.problem_type is not None and self.task != "sequence-classification":
            raise ValueError(f"--problem-type applies to --task sequence-classification only, not {self.task}")
        for name in EMBEDDING_FIELDS:
            if self.task != "embedding" and getattr(self, name) != defaults[name]:
                raise ValueError(f"{_flag(name)} applies to --task embedding only, not {self.task}")
        for name in QA_FIELDS:
            if self.task != "question-answering" and getattr(self, name) != defaults[name]:
                raise ValueError(f"{_flag(name)} applies to --task question-answering only, not {self.task}")
        # run_qa's post-processing reads the threshold with null answers alone: without them it would go unread.
        if not self.version_2_with_negative and self.null_score_diff_threshold != defaults["null_score_diff_threshold"]:
            raise ValueError(
                f"--null-score-diff-threshold {self.null_score_diff_threshold}: decides SQuAD 2.0's null answers; "
                "give --version-2-with-negative too"
            )
        for name in (*SEQ2SEQ_FIELDS, *GENERATE_FIELDS):
            if self.task != "seq2seq" and getattr(self, name) != defaults[name]:
                raise ValueError(f"{_flag(name)} applies to --task seq2seq only, not {self.task}")
        if self.num_beams is not None and not self.predict_with_generate:  # a search that would not run (evaluate's)
            raise ValueError("--num-beams: the beams of --predict-with-generate's search; pass that too")
        metric = (self.metric_for_best_model or "").removeprefix("eval_")
        if metric in GENERATED_METRICS and not self.predict_with_generate:  # never scored: no best model
            raise ValueError(
                f"--metric-for-best-model {metric}: scored on the generations of --predict-with-generate; pass that too"
            )
        for name in TAG_FIELDS:
            if self.task != "token-classification" and getattr(self, name) != defaults[name]:
                raise ValueError(f"{_flag(name)} applies to --task token-classification only, not {self.task}")
        # --no-pack where examples are never packed (a bert2bert's pairs, options, windows, MLM blocks) changes nothing.
        if not self.pack and not (self.task in PACKED_TASKS or (self.task == "mlm" and self.line_by_line)):
            unpacked = " without --line-by-line" if self.task == "mlm" else ""
            raise ValueError(
                f"--no-pack applies to --task {', '.join(PACKED_TASKS)} and mlm with --line-by-line only, not "
                f"--task {self.task}{unpacked} (its examples are never packed)"
            )
        if self.symmetric and self.loss != "mnrl":  # the symmetric form is of the in-batch ranking loss alone
            raise ValueError(f"--symmetric applies to --loss mnrl only, not --loss {self.loss}")
        if self.task == "question-answering" and self.doc_stride >= self.max_seq_length:
            raise ValueError(f"--doc-stride {self.doc_stride}: must be below --max-seq-length {self.max_seq_length}")

    def seq2seq_lengths(self, validation: bool = False) -> tuple[tuple[str, int], tuple[str, int]]:
        """--task seq2seq's (flag, tokens) where sources and where targets are cut: --max-source-length and
        --max-target-length, each side defaulting to --max-seq-length (which cut both before they existed). The
        `validation` targets at --val-max-target-length where given (run_summarization.py's eval preprocessing)."""
        sides = tuple(
            (_flag(n), getattr(self, n)) if getattr(self, n) is not None else ("--max-seq-length", self.max_seq_length)
            for n in SEQ2SEQ_FIELDS
        )
        if validation and self.val_max_target_length is not None:
            return sides[0], ("--val-max-target-length", self.val_max_target_length)
        return sides

    def resume_keys(self) -> tuple[str, ...]:
        return (
            # --max-steps decides the schedule alone (Trainer's rule): epochs given beside it change nothing.
            # A seq2seq run's cut is its two sides' (task_seq2seq.Seq2SeqRun.meta), whichever flags set them.
            tuple(
                k
                for k in self.RESUME_KEYS
                if not (k == "num_train_epochs" and self.max_steps)
                and not (k == "max_seq_length" and self.task == "seq2seq")
            )
            + (TASK_FIELDS[:5] if self.task != "mlm" else ())
            + (EMBEDDING_FIELDS if self.task == "embedding" else ())
            # The windows, and the evaluation's post-processing: OUT/best compares evaluations across the run,
            # and OUT/final records the options `evaluate` and `predict` then use.
            + (QA_FIELDS if self.task == "question-answering" else ())
            + (TAG_FIELDS if self.task == "token-classification" else ())  # which tokens the loss reads
            + (GENERATE_FIELDS if self.task == "seq2seq" else ())  # the validation's cut and scores (OUT/best's)
        )

    # Fields that decide which data and masking each step sees: a resumed run must agree on them.
    RESUME_KEYS = (
        "seed",
        "max_seq_length",
        "line_by_line",
        "mlm_probability",
        "whole_word_mask",
        "max_predictions_per_seq",
        "grad_accum_steps",
        "max_steps",
        "num_train_epochs",
        "learning_rate",
        "warmup_steps",
        "warmup_ratio",
        "dtype",
        "pack",
        *OPTIMIZER_KEYS,
    )


def held_out(rows: int, percentage: int) -> tuple[int, dict]:
    """(how many of the first `rows` --validation-split-percentage holds out, the checkpoint meta that records it).
    run_mlm.py and run_clm.py take `train[:P%]` and `train[P%:]`, which datasets cuts at round(P% of rows) (Python's
    round: halves to even); jaxbert took the floor, holding out one line fewer in about half the files (30 lines
    at 5%: 1, not 2). The meta names the cut only where the floor's differs, so a checkpoint of an earlier version,
    cut there by the floor, is refused on resume exactly when this run would hold out other rows."""
    cut = int(round(rows * percentage / 100))
    return cut, ({"validation_rows": cut} if cut != rows * percentage // 100 else {})


def total_steps(cfg: TrainConfig, steps_per_epoch: int) -> int:
    """--max-steps, else --num-train-epochs of `steps_per_epoch`: at most MAX_STEPS, or the schedule's first
    call overflows int32 (a traceback after the first evaluation)."""
    total = cfg.max_steps or math.ceil(cfg.num_train_epochs * steps_per_epoch)
    if total > MAX_STEPS:
        raise ValueError(
            f"--num-train-epochs {cfg.num_train_epochs}: {total} steps ({steps_per_epoch} an epoch), more than the "
            f"{MAX_STEPS} the step counter holds; pass fewer epochs or --max-steps"
        )
    return total
