"""The best model by --metric-for-best-model (OUT/best: a model directory like OUT/final, and OUT/best.json
naming its step and value) and early stopping after N evaluations without improvement (transformers'
EarlyStoppingCallback). Both are rebuilt from metrics.jsonl on resume, so a resumed run keeps the same best model
and stops at the same step as the uninterrupted one. The evaluation before training (step 0) is a baseline,
not a candidate."""

from __future__ import annotations

import json
import math
import os

import jax

from jaxbert.files import atomic_file
from jaxbert.metrics import greater_is_better
from jaxbert.transfer import write_jaxbert_dir

RESCORED = "best_rescored"  # a metrics.jsonl record's key: the best evaluation measured again (rescore.py)


def write_model(run, params, directory: str) -> None:
    """OUT/final or OUT/best: the run's own writer when it has one (embeddings: a sentence-transformers
    directory), else a jaxbert directory of its head."""
    if hasattr(run, "write_model"):
        run.write_model(params, directory)
    else:
        write_jaxbert_dir(params, run.final_config(), run.head, directory, tokenizer_from=run.cfg.model, force=True)


class Best:
    def __init__(self, metric: str | None, patience: int | None, records: list[dict]):
        self.metric, self.patience = metric, patience
        self.key = f"eval_{metric}" if metric else None
        self.up = greater_is_better(metric) if metric else True
        self.value, self.step, self.bad = None, None, 0
        for record in records:
            if RESCORED in record:  # the best's value as later evaluations measure it (rescore.py)
                again = record[RESCORED]
                if (again.get("step"), again.get("metric")) == (self.step, self.key):
                    self.value = again["value"]
            else:
                self.update(record["step"], record)

    def update(self, step: int, result: dict) -> bool:
        """Whether `result` (an evaluation at `step`) is the best so far; a non-finite value never is."""
        if not self.metric or step == 0 or self.key not in result:
            return False
        value = result[self.key]
        better = math.isfinite(value) and (
            self.value is None or (value > self.value if self.up else value < self.value)
        )
        if better:
            self.value, self.step, self.bad = value, step, 0
        else:
            self.bad += 1
        return better

    @property
    def stop(self) -> bool:
        return bool(self.patience) and self.bad >= self.patience

    def save(self, run, params) -> None:
        write_model(run, jax.device_get(params), os.path.join(run.cfg.output_dir, "best"))
        self.write_record(run)

    def write_record(self, run) -> None:
        """OUT/best.json: OUT/best's step, and its value by the metric."""
        with atomic_file(os.path.join(run.cfg.output_dir, "best.json")) as tmp:
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump({"step": self.step, "metric": self.key, "value": self.value}, f)
