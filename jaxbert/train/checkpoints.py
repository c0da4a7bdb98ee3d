"""Training checkpoints: orbax steps (train state + JSON meta), each sealed with a digest file.

orbax writes a step into a temporary directory and renames it when complete, but nothing notices a step
damaged afterwards (a truncated or overwritten file restores silently with wrong parameters). So after each
save, the sha256 and size of every file of the step go into STEP/jaxbert_digests.json (written atomically, last:
a step without it is incomplete), and a step is verified before anything is restored from it.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os

import orbax.checkpoint as ocp

from jaxbert import distributed
from jaxbert.files import atomic_file, checkpoint_file, read_json
from jaxbert.train import save_errors
from jaxbert.train.config import OPTIMIZER_KEYS

DIGESTS = "jaxbert_digests.json"
ASIDE = ".damaged"  # suffix of a damaged step moved out of orbax's sight (its step number is free again)
# BertConfig keys that do not shape the train state or its computation (head labels, bookkeeping).
MODEL_KEYS_IGNORED = ("architectures", "extra", "id2label", "label2id", "problem_type", "classifier_dropout")


class DamagedCheckpoint(ValueError):
    """A step whose files do not match its digests, or that has none; the message names the file."""


def manager(directory: str, create: bool = True) -> ocp.CheckpointManager:
    """A manager of `directory`; with create=False it is only read from (another run's checkpoints)."""
    # Synchronous saves: a step is only reported saved once it is complete on disk. No max_to_keep: orbax
    # deletes the old steps inside save(), before the new one is sealed (see `save`).
    options = ocp.CheckpointManagerOptions(create=create, enable_async_checkpointing=False)
    return ocp.CheckpointManager(os.path.abspath(directory), options=options)


def step_dir(mgr: ocp.CheckpointManager, step: int) -> str:
    return os.path.join(mgr.directory.as_posix(), str(step))


def save(mgr: ocp.CheckpointManager, step: int, state, meta: dict, keep: int) -> None:
    """Write and seal `step`, then keep only the newest `keep` steps; a failed write (a full disk) raises OSError
    and leaves no part of it (save_errors), nor deletes anything."""
    with save_errors.writing(step_dir(mgr, step)):
        mgr.save(
            step, args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=True
        )
        mgr.wait_until_finished()
        if distributed.is_primary():  # every process saved its shards (orbax syncs them); one seals the step
            write_digests(step_dir(mgr, step))
    distributed.barrier(f"jaxbert-digests-{step}")
    # Only now: orbax's max_to_keep deleted the older steps before this one was sealed, so a kill (or a failed
    # digest write) in between left no intact checkpoint at --save-total-limit 1.
    for old in sorted(mgr.all_steps())[:-keep]:
        mgr.delete(old)  # all processes (a barrier); process 0 deletes


def file_sha256(path: str) -> str:
    """sha256 of a file, computed once per (path, size, modification time): a checkpoint's meta names the training
    data by it, so a resumed run refuses an edited training file (the same number of rows, labels changed)."""
    st = os.stat(path)
    return _sha256(os.path.abspath(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _digest(path: str) -> dict:
    with open(path, "rb") as f:
        return {"size": os.fstat(f.fileno()).st_size, "sha256": hashlib.file_digest(f, "sha256").hexdigest()}


def write_digests(directory: str) -> None:
    files = {}
    for root, dirs, names in os.walk(directory):
        dirs.sort()
        for name in sorted(names):
            rel = os.path.relpath(os.path.join(root, name), directory)
            if rel != DIGESTS:
                files[rel] = _digest(os.path.join(root, name))
    with atomic_file(os.path.join(directory, DIGESTS)) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"format": 1, "files": files}, f, indent=1)
            f.flush()
            os.fsync(f.fileno())


def verify(directory: str) -> None:
    """Raise DamagedCheckpoint naming the first file of the step that is missing or differs from its digest."""
    path = os.path.join(directory, DIGESTS)
    if not os.path.isfile(path):
        raise DamagedCheckpoint(f"{path}: missing (the save did not complete)")
    try:
        files = read_json(path).get("files")
    except ValueError as e:
        raise DamagedCheckpoint(str(e)) from None
    if not isinstance(files, dict) or not files:
        raise DamagedCheckpoint(f"{path}: lists no files")
    for name, want in files.items():
        try:
            file = checkpoint_file(directory, name)
        except ValueError as e:
            raise DamagedCheckpoint(str(e)) from None
        if not (isinstance(want, dict) and isinstance(want.get("size"), int) and isinstance(want.get("sha256"), str)):
            raise DamagedCheckpoint(f"{path}: malformed entry for {name}")
        if not os.path.isfile(file):
            raise DamagedCheckpoint(f"{file}: missing")
        got = _digest(file)
        if got["size"] != want["size"]:
            raise DamagedCheckpoint(
                f"{file}: {got['size']} bytes, its digest says {want['size']} (truncated or damaged)"
            )
        if got["sha256"] != want["sha256"]:
            raise DamagedCheckpoint(f"{file}: contents differ from its sha256 digest (damaged)")


def resume_location(resume: str, output_dir: str) -> tuple[str, int | None]:
    """`auto` -> OUT/checkpoints (latest step); a checkpoints directory (latest); or one step directory."""
    if resume == "auto":
        return os.path.abspath(os.path.join(output_dir, "checkpoints")), None
    path = os.path.abspath(resume)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"--resume {resume}: no such directory")
    name = os.path.basename(path.rstrip("/"))
    if name.isdigit():
        return os.path.dirname(path), int(name)
    return path, None


def latest_intact(mgr: ocp.CheckpointManager, say) -> int | None:
    """The newest verified step; damaged or incomplete newer ones are skipped with a notice naming the file."""
    for step in sorted(mgr.all_steps(), reverse=True):
        try:
            verify(step_dir(mgr, step))
            return step
        except DamagedCheckpoint as e:
            say(f"resume: skipping checkpoint {step}: {e}")
    return None


def clear_after(mgr: ocp.CheckpointManager, step: int, say) -> None:
    """Make room for the steps a resumed run will save after `step`: damaged later steps are moved aside
    (kept for inspection, renamed STEP.damaged); an intact later step is never overwritten: refuse."""
    for later in sorted(s for s in mgr.all_steps() if s > step):
        directory = step_dir(mgr, later)
        try:
            verify(directory)
        except DamagedCheckpoint:
            aside = directory + ASIDE
            n = 1
            while os.path.lexists(aside):
                aside, n = f"{directory}{ASIDE}.{n}", n + 1
            if distributed.is_primary():  # one process moves it; the others wait below
                os.rename(directory, aside)
                say(f"resume: moved the damaged checkpoint {later} aside to {aside}")
            continue
        raise ValueError(
            f"--resume: {directory} is an intact checkpoint after step {step} that this run would "
            f"overwrite; resume from it, or move it away first"
        )
    distributed.barrier(f"jaxbert-clear-after-{step}")
    mgr.reload()


def read_meta(mgr: ocp.CheckpointManager, step: int) -> dict:
    meta = mgr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    if not isinstance(meta, dict):
        raise DamagedCheckpoint(f"{step_dir(mgr, step)}/meta: not a JSON object")
    return meta


def model_fields(config) -> dict:
    """The model config as stored in a checkpoint's meta (JSON types), minus keys that do not matter."""
    out = {k: v for k, v in config.to_dict().items() if k not in MODEL_KEYS_IGNORED}
    return {f.name: out[f.name] for f in dataclasses.fields(config) if f.name in out}


RUN_OUTPUTS = ("final", "best", "best.json", "metrics.jsonl")  # what a run writes in OUT beside its checkpoints
# The label smoothing of the validation loss (OUT/best by loss compares it across the run). Equal to
# --label-smoothing, which the meta holds too: its absence is what tells an earlier checkpoint (rescore.py).
EVAL_SMOOTHING = "eval_label_smoothing"
# Meta keys that checkpoints of earlier jaxbert versions lack: checked only where stored.
LATER_KEYS = (
    "train_file_sha256",
    "label_all_tokens",
    "n_best_size",
    "max_answer_length",
    "null_score_diff_threshold",
    "metric_for_best_model",
    "validation_split_percentage",
    "max_predictions_per_seq",
    "validation_file_sha256",
    "tokenizer_sha256",
    "special_tokens_sha256",
    *OPTIMIZER_KEYS,
    "loss",  # the embedding task's (--loss): before it, always mnrl
    EVAL_SMOOTHING,  # before it, validation used the plain loss (train/rescore.py)
)


# Meta keys that checkpoints of earlier jaxbert versions lack, implied there by another: a seq2seq run cut its
# sources and its targets at --max-seq-length.
IMPLIED_KEYS = {"max_source_length": "max_seq_length", "max_target_length": "max_seq_length"}
# Meta keys of options that earlier versions did not have: there the run had the option's default (a seq2seq run
# validated without generating), so a resume that sets it is refused as one that changes it.
EARLIER_DEFAULTS = {"predict_with_generate": False, "num_beams": None, "val_max_target_length": None}


# Meta keys that follow from others (the data, --max-seq-length, the batch): compared last, so that a run on more
# devices is told its global_batch_size differs, not that its steps_per_epoch does.
DERIVED_KEYS = ("train_sequences", "steps_per_epoch")
_BATCH_HINT = (
    " (--per-device-batch-size times the devices the batch is split over, unless --global-batch-size sets it: "
    "pass the checkpoint's as --global-batch-size to resume on another mesh)"
)


# Why a key differs where the value alone does not say (the key of plan.EMPTY_LINES_KEY: an import would be circular).
_HINTS = {
    "global_batch_size": _BATCH_HINT,
    "empty_lines_kept": (
        " (jaxbert dropped the empty lines of grouped MLM text where it made that checkpoint; run_mlm.py, and jaxbert "
        "now, keep each as [CLS] [SEP], so this run's blocks are other ones: start a new run, or resume with the "
        "version that made it)"
    ),
}


def check_meta(meta: dict, expected: dict, where: str) -> None:
    """Refuse a checkpoint made for another model or another data/schedule, naming the first difference."""
    stored, model = meta.get("model_config"), json.loads(json.dumps(expected["model_config"]))
    if not isinstance(stored, dict):
        raise ValueError(f"--resume: {where} has no model config in its meta")
    for key in model:
        if stored.get(key) != model[key]:
            raise ValueError(
                f"--resume: {where} was made for a different model: {key}={stored.get(key)!r} there, "
                f"{model[key]!r} in --model"
            )
    if "steps_per_epoch" not in meta:  # an earlier version's, which left out the examples after each epoch's
        # last full step: its later epochs would now be other steps
        per_step = meta.get("global_batch_size", 1) * meta.get("grad_accum_steps", 1)
        meta = {**meta, "steps_per_epoch": meta.get("train_sequences", 0) // max(per_step, 1)}
    for key in sorted(expected, key=lambda k: k in DERIVED_KEYS):
        value = expected[key]
        if key in IMPLIED_KEYS and key not in meta:  # an earlier version's: the key it was implied by
            meta = {**meta, key: meta.get(IMPLIED_KEYS[key])}
        if key in EARLIER_DEFAULTS and key not in meta:
            meta = {**meta, key: EARLIER_DEFAULTS[key]}
        if key in LATER_KEYS and key not in meta:
            continue
        if key not in ("step", "epoch", "offset", "model_config") and meta.get(key) != value:
            hint = _HINTS.get(key, "")
            raise ValueError(f"--resume: {where} was made with {key}={meta.get(key)!r}, this run has {value!r}{hint}")


def restore_state(mgr: ocp.CheckpointManager, step: int, abstract_state):
    try:
        restored = mgr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state)))
    except (ValueError, KeyError, TypeError, OSError) as e:
        why = " ".join(str(e).split())[:300] or type(e).__name__
        raise ValueError(f"--resume: {step_dir(mgr, step)}: the train state does not fit this run: {why}") from None
    return restored["state"]


# Meta keys that are digests of input files: compared (files_unchanged) before the data is read and tokenized.
FILE_KEYS = ("train_file_sha256", "validation_file_sha256", "tokenizer_sha256", "special_tokens_sha256")


def files_unchanged(found, file_digests) -> None:
    """Refuse at once a resume whose checkpoint (`found`, resume_candidate's) was made from other input files:
    the FILE_KEYS of `file_digests()` (this run's, as its meta will hold them; asked only where there is a
    checkpoint) against its meta, in check_meta's words.
    check_meta compares them again with the rest, once the data is read."""
    if found is None or found[1] is None:
        return
    source, step = found
    try:
        digests = file_digests()
    except OSError:  # a missing or unreadable file: named as such where the data is read
        return
    meta = read_meta(source, step)
    for key in FILE_KEYS:
        if key in digests and not (key in LATER_KEYS and key not in meta) and meta.get(key) != digests[key]:
            where = f"checkpoint {step_dir(source, step)}"
            raise ValueError(f"--resume: {where} was made with {key}={meta.get(key)!r}, this run has {digests[key]!r}")


def resume_point(cfg, own: ocp.CheckpointManager, expected_meta, say, found=()):
    """(manager, step) to restore from, or None to start afresh; every check (digests, model config, data and
    schedule options) is done here, before anything compiles. `expected_meta(step)` is this run's meta. `found`:
    resume_candidate's answer when asked already (before the data was read), else it is asked here."""
    found = resume_candidate(cfg, own, say) if found == () else found
    if found is None:
        return None
    source, step = found
    if step is None:
        clear_after(own, 0, say)
        say("resume: no intact checkpoint yet, starting from the beginning")
        return None
    check_meta(read_meta(source, step), expected_meta(step), f"checkpoint {step_dir(source, step)}")
    clear_after(own, step, say)
    return source, step


def resume_candidate(cfg, own: ocp.CheckpointManager, say):
    """(manager, step) that --resume names (its latest intact step unless it names one; None where there is no
    intact step yet), or None without --resume; nothing is compared, moved or waited for yet (resume_point)."""
    if not cfg.resume:
        if own.latest_step() is not None:
            raise ValueError(
                f"{cfg.output_dir} has checkpoints up to step {own.latest_step()}: pass --resume auto "
                "to continue, or choose a new --output-dir"
            )
        # A run's outputs without its checkpoints (deleted to save space, or a run stopped before its first):
        # a new run would replace them without a word.
        left = [name for name in RUN_OUTPUTS if os.path.lexists(os.path.join(cfg.output_dir, name))]
        if left:
            raise FileExistsError(
                f"{cfg.output_dir} holds another run's {', '.join(left)}: choose a new --output-dir, remove them, "
                "or pass --resume auto to continue that run"
            )
        return None
    root, step = resume_location(cfg.resume, cfg.output_dir)
    mine = os.path.realpath(root) == os.path.realpath(own.directory.as_posix())
    source = own if mine else manager(root, create=False)
    if step is None:
        step = latest_intact(source, say)
        if step is None and source is not own:
            # A run's output directory is what users pass most often: it holds its checkpoints one level down.
            inner = os.path.join(root, "checkpoints")
            hint = f" (a run's checkpoints are in {inner}; --resume auto continues --output-dir's run)"
            hint = hint if os.path.isdir(inner) else ""
            raise FileNotFoundError(f"--resume {cfg.resume}: no intact checkpoint in it{hint}")
    else:
        try:
            verify(step_dir(source, step))
        except DamagedCheckpoint as e:
            raise DamagedCheckpoint(f"--resume: checkpoint {step} cannot be used: {e}") from None
    return source, step
