"""TrainConfig: every option of `jaxbert train-mlm`, with transformers' run_mlm defaults where it has them."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    model: str
    train_file: str
    output_dir: str
    validation_file: str | None = None
    validation_split_percentage: int = 5
    max_seq_length: int = 128
    line_by_line: bool = False
    mlm_probability: float = 0.15
    whole_word_mask: bool = False
    max_predictions_per_seq: int | None = None
    per_device_batch_size: int = 8
    global_batch_size: int | None = None
    grad_accum_steps: int = 1
    learning_rate: float = 5e-5
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8
    warmup_steps: int = 0
    warmup_ratio: float = 0.0
    num_train_epochs: float = 3.0
    max_steps: int | None = None
    max_grad_norm: float = 1.0
    label_smoothing: float = 0.0
    dtype: str = "float32"
    remat: bool = False
    fsdp: bool = False
    seed: int = 42
    logging_steps: int = 10
    eval_steps: int | None = None
    save_steps: int = 500
    save_total_limit: int = 2
    resume: str | None = None
    progress: bool = True

    def __post_init__(self):
        checks = {
            "mlm_probability": 0 < self.mlm_probability < 1,
            "validation_split_percentage": 0 < self.validation_split_percentage < 100,
            "grad_accum_steps": self.grad_accum_steps >= 1,
            "per_device_batch_size": self.per_device_batch_size >= 1,
            "global_batch_size": self.global_batch_size is None or self.global_batch_size >= 1,
            "max_seq_length": self.max_seq_length >= 8,
            "label_smoothing": 0 <= self.label_smoothing < 1,
            "warmup_ratio": 0 <= self.warmup_ratio < 1,
            "dtype": self.dtype in ("float32", "bfloat16"),
            "max_steps": self.max_steps is None or self.max_steps >= 1,
            "num_train_epochs": self.num_train_epochs > 0,
            "logging_steps": self.logging_steps >= 1,
            "save_steps": self.save_steps >= 1,
            "save_total_limit": self.save_total_limit >= 1,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"--{name.replace('_', '-')} {getattr(self, name)!r} is out of range")

    # Fields that decide which data and masking each step sees: a resumed run must agree on them.
    RESUME_KEYS = ("seed", "max_seq_length", "line_by_line", "mlm_probability", "whole_word_mask",
                   "grad_accum_steps", "max_steps", "num_train_epochs", "learning_rate", "warmup_steps",
                   "warmup_ratio", "dtype")
