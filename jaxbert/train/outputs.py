"""What a run leaves on disk besides the checkpoints and the final model: metrics.jsonl and loss.png."""

from __future__ import annotations

import json
import os

from jaxbert.files import atomic_file


def read_metrics(path: str) -> list[dict]:
    """The records of OUT/metrics.jsonl. A last line cut short (the run was killed mid-write) is dropped; any
    other line that is not a JSON object with an integer "step" is an error naming file:line."""
    if not os.path.isfile(path):
        return []
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    records = []
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            if number == len(lines):  # no newline after it: a half-written last record
                break
            raise ValueError(f"{path}:{number}: not a JSON record ({str(e).splitlines()[0]})") from None
        step = record.get("step") if isinstance(record, dict) else None
        if not isinstance(step, int) or isinstance(step, bool):
            raise ValueError(f'{path}:{number}: a record without an integer "step"')
        records.append(record)
    return records


class Metrics:
    """OUT/metrics.jsonl, one JSON object per line; on resume, records after the restored step are dropped so
    the file reads as one uninterrupted run. A new run's file appears with its first record: an empty one would
    be "another run's metrics.jsonl" to the next run, whose evaluation before training failed or was stopped."""

    def __init__(self, path: str, records: list[dict]):
        self.path = path
        self.records = list(records)
        if not records and not os.path.lexists(path):
            return
        with atomic_file(path) as tmp:
            with open(tmp, "w", encoding="utf-8") as f:
                f.writelines(json.dumps(r) + "\n" for r in self.records)

    def add(self, record: dict) -> None:
        self.records.append(record)
        try:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
        except OSError as e:  # a full disk says "[Errno 28] No space left on device", naming no file
            raise OSError(e.errno, f"{self.path}: writing failed ({e.strerror or e})") from None


# The loss each task trains on, as loss.png's axis names it (a sequence classifier's by its problem type).
LOSS_NAMES = {
    "mlm": "masked-LM loss",
    "single_label_classification": "cross-entropy loss",
    "multi_label_classification": "binary cross-entropy loss",
    "regression": "mean squared error loss",
    "token-classification": "token cross-entropy loss",
    "multiple-choice": "cross-entropy loss over the options",
    "embedding": "multiple-negatives ranking loss",
    "cosent": "CoSENT loss",  # the embedding task's on scored pairs (--loss)
    "cosine-similarity": "cosine similarity loss (mean squared error)",
    "angle": "AnglE loss",
    "question-answering": "span loss (start and end cross-entropy)",
    "causal-lm": "next-token loss",
    "seq2seq": "target-token loss",
}


def loss_name(task: str, problem_type: str | None = None) -> str:
    return LOSS_NAMES.get(problem_type or task, "loss")


def plot(records: list[dict], path: str, metric: str | None = None, loss: str = "loss") -> bool:
    """The loss curves (`loss` naming the axis; and the validation `metric`, when given, in a second panel) as a
    PNG; False (nothing written) without matplotlib, an optional extra."""
    try:
        import matplotlib
    except ImportError:
        return False

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [(r["step"], r["loss"]) for r in records if "loss" in r]
    val = [(r["step"], r["eval_loss"]) for r in records if "eval_loss" in r]
    scores = [(r["step"], r[f"eval_{metric}"]) for r in records if metric and f"eval_{metric}" in r]
    panels = 2 if scores and metric != "loss" else 1
    fig, axes = plt.subplots(1, panels, figsize=(7 * panels, 4), squeeze=False)
    ax = axes[0, 0]
    if train:
        ax.plot(*zip(*train), label="training loss")
    if val:
        ax.plot(*zip(*val), "o-", label="validation loss")
    ax.set_xlabel("step")
    ax.set_ylabel(loss)
    ax.grid(alpha=0.3)
    ax.legend()
    if panels == 2:
        axes[0, 1].plot(*zip(*scores), "o-", color="tab:green")
        axes[0, 1].set_xlabel("step")
        axes[0, 1].set_ylabel(f"validation {metric}")
        axes[0, 1].grid(alpha=0.3)
    fig.tight_layout()
    with atomic_file(path, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=100)
    plt.close(fig)
    return True
