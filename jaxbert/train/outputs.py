"""What a run leaves on disk besides the final model: orbax checkpoints, metrics.jsonl, loss.png."""

from __future__ import annotations

import json
import os

import orbax.checkpoint as ocp


def checkpoint_manager(directory: str, keep: int) -> ocp.CheckpointManager:
    # Synchronous saves: a step is only reported saved once it is complete on disk. orbax writes each step
    # into a temporary directory and renames it when finished, so a crash mid-save never harms older steps.
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True, enable_async_checkpointing=False)
    return ocp.CheckpointManager(os.path.abspath(directory), options=options)


def save(manager: ocp.CheckpointManager, step: int, state, meta: dict) -> None:
    manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
                 force=True)
    manager.wait_until_finished()


def restore(manager: ocp.CheckpointManager, step: int, abstract_state):
    restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state),
                                                             meta=ocp.args.JsonRestore()))
    return restored["state"], restored["meta"]


def resume_location(resume: str, output_dir: str) -> tuple[str, int | None]:
    """`auto` -> OUT/checkpoints (latest step); a checkpoints directory (latest); or one step directory."""
    if resume == "auto":
        return os.path.join(output_dir, "checkpoints"), None
    path = os.path.abspath(resume)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"--resume {resume}: no such directory")
    name = os.path.basename(path.rstrip("/"))
    if name.isdigit():
        return os.path.dirname(path), int(name)
    return path, None


class Metrics:
    """OUT/metrics.jsonl, one JSON object per line; on resume, records after the restored step are dropped so
    the file reads as one uninterrupted run."""

    def __init__(self, path: str, keep_through_step: int | None):
        self.path = path
        self.records: list[dict] = []
        if keep_through_step is not None and os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                self.records = [r for r in map(json.loads, f) if r["step"] <= keep_through_step]
        self._rewrite()

    def _rewrite(self):
        tmp = self.path + ".partial"
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in self.records)
        os.replace(tmp, self.path)

    def add(self, record: dict) -> None:
        self.records.append(record)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")


def plot(records: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [(r["step"], r["loss"]) for r in records if "loss" in r]
    val = [(r["step"], r["eval_loss"]) for r in records if "eval_loss" in r]
    fig, ax = plt.subplots(figsize=(7, 4))
    if train:
        ax.plot(*zip(*train), label="training loss")
    if val:
        ax.plot(*zip(*val), "o-", label="validation loss")
    ax.set_xlabel("step")
    ax.set_ylabel("masked-LM loss")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
