"""`train(cfg)`: the training loop of every task (`train_mlm` is `train` with task mlm), the only impure code
of the package.

It takes OUT's lock, checks every input before compiling anything, tokenizes once (cached), then runs the
jitted pure step over a device mesh, logging to OUT/metrics.jsonl, evaluating (validation metrics), keeping the
best model (OUT/best) and stopping early when asked, checkpointing with orbax (atomic, sealed with digests that
resume verifies), and writing OUT/final and OUT/loss.png. What differs between tasks (data, batches, the head,
evaluation) is the run's (plan.Run for mlm, task_plan.TaskRun otherwise). Non-finite parameters are never
saved; the first Ctrl-C stops cleanly after the current step. Those writes and their checks (and the errors a run
stops with, TrainingError and Interrupted) are writes.py's; this module builds the run and steps it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import signal
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util
from tqdm.auto import tqdm

from jaxbert import cpu, distributed, failures, hub, sharding
from jaxbert.files import sweep_partials
from jaxbert.train import checkpoints, lock, outputs, plan, rescore, task_plan
from jaxbert.train import data as D
from jaxbert.train.best import Best
from jaxbert.train.config import TrainConfig
from jaxbert.train.interrupt import deferred_sigint
from jaxbert.train.state import OptimConfig, init_state, optimizer, schedule
from jaxbert.train.step import train_step
from jaxbert.train.writes import (
    Interrupted,
    TrainingError,
    _check_output_dir,
    _finish,
    _save,
    _undone_on_failure,
    _Unwritten,
    _where,
    evaluate,
)

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def micro_batch_tokens(state, batch, rng) -> int:
    """The token positions of one micro-batch of a step's batch ([accum, batch, ...] arrays)."""
    ids = batch["input_ids"]
    return ids.size // ids.shape[0]


def _compile(run, tx, sched, state_sh, mesh):
    cfg, dtype = run.cfg, DTYPES[run.cfg.dtype]
    batch_sh = sharding.batch_sharding(mesh, batch_axis=1)  # [accum, batch, ...]: split the batch axis
    rep = sharding.replicated(mesh)

    def step(state, batch, rng):
        return train_step(
            state,
            batch,
            rng,
            config=run.config,
            tx=tx,
            schedule=sched,
            head=run.head,
            dtype=dtype,
            remat=cfg.remat,
            label_smoothing=cfg.label_smoothing,
            loss_fn=getattr(run, "loss_fn", None),
        )

    step_fn = cpu.onednn_jit(  # float32 matmuls of large steps through oneDNN where that wins (cpu.py)
        step,
        tokens=micro_batch_tokens,
        in_shardings=(state_sh, batch_sh, rep),
        out_shardings=(state_sh, rep),
        donate_argnums=0,
    )
    step_fn = sharding.under(mesh, step_fn)
    eval_sh = sharding.batch_sharding(mesh)
    eval_jit = cpu.onednn_jit(
        run.eval_fn(dtype), tokens=cpu.batch_tokens, in_shardings=(state_sh.params, eval_sh), out_shardings=rep
    )
    # Validation batches are built whole on every process (they are small); each device takes its rows.
    return step_fn, lambda params, batch: eval_jit(params, sharding.from_host(batch, eval_sh))


def _feed(run, step: int, batch_sh):
    """Step `step`'s batch as global arrays [accum, batch, ...] split over the mesh, and its count of real tokens
    (with several processes, estimated from this process's). Each process reads (and masks) only its rows."""
    A, B = run.train.shape(step)
    rows = sharding.process_rows(batch_sh, (A, B), axis=1)
    local = run.batch(step, None if rows == slice(0, B) else rows)  # None: one process, the whole batch
    arrays = sharding.global_batch(local, batch_sh, lambda k: (A, B, *local[k].shape[2:]))
    real = sum(int(local[k].sum()) for k in ("attention_mask", "decoder_attention_mask") if k in local)  # seq2seq's
    return arrays, real * B // (rows.stop - rows.start)


def _meta_by_step(run):
    """The run's checkpoint meta of a step. All but the step's position is taken once, when the run has read its
    inputs: the digests of its data and tokenizer files are those it read. Taken at each save, a training file
    edited during the run was named by every later checkpoint, and a resume trained on the edit without a word."""
    fixed = _meta(run, 0)
    return lambda step: {**fixed, "step": step, **run.train.position(step)}


def _meta(run, step: int) -> dict:
    return {
        "step": step,
        **run.train.position(step),
        "train_sequences": len(run.train.blocks),
        "steps_per_epoch": run.train.steps_per_epoch,  # earlier versions left out each epoch's last examples
        # The share of it held out for validation (None: a validation file; it all trains): the same training rows.
        "validation_split_percentage": None if run.cfg.validation_file else run.cfg.validation_split_percentage,
        **run.split,  # the rows it holds out, where an earlier version's floor held out others
        **_file_digests(run.cfg),
        "global_batch_size": run.train.batch_size,
        "model_config": checkpoints.model_fields(run.config),
        "clip_gradients": run.cfg.max_grad_norm > 0,  # shapes the optimizer state (--max-grad-norm 0: none)
        # As read back from the meta's JSON (--prompts' pairs are lists there), so an unchanged option compares equal.
        **{k: json.loads(json.dumps(getattr(run.cfg, k))) for k in run.cfg.resume_keys()},
        # OUT/best holds the best by this metric so far: by another, it would be a step that cannot be rebuilt.
        "metric_for_best_model": run.metric,
        checkpoints.EVAL_SMOOTHING: run.cfg.label_smoothing,  # the validation loss's (every task's now)
        **run.meta(),
    }


def _file_digests(cfg) -> dict:
    """The meta's digests of the run's input files (checkpoints.FILE_KEYS), which need no data read: a resume
    compares them first (checkpoints.files_unchanged), before the data is tokenized."""
    return {
        "train_file_sha256": checkpoints.file_sha256(cfg.train_file),  # the same data, not only as many
        # best/ and early stopping compare evaluations across the run: on another validation set they would mix two.
        "validation_file_sha256": cfg.validation_file and checkpoints.file_sha256(cfg.validation_file),
        "tokenizer_sha256": D.tokenizer_key(cfg.model, D.TOKENIZER_FILES),  # another vocabulary: other ids
        # special_tokens_map.json renames [CLS] & co. (other ids for the same text), added_tokens.json adds tokens
        "special_tokens_sha256": D.tokenizer_key(cfg.model, D.SPECIAL_TOKEN_FILES),
    }


# Options a process may give otherwise than the others: where it finds the files (the model's and the data's contents
# are compared through the meta's digests and config), its place in the run, what only process 0 acts on, and the
# batch and mesh flags (compared by the global batch and the axis sizes they make).
_OWN_OPTIONS = (
    "model", "train_file", "validation_file", "output_dir", "coordinator_address", "process_id", "resume", "progress",
    "break_lock", "per_device_batch_size", "global_batch_size", "mesh", "fsdp",
)  # fmt: skip


def _shared(run, meta, params) -> dict:
    """What every process of a run must agree on: the meta (data, model config, schedule), the initial weights
    (each process's copy of --model; digested only with several processes), and every other option, since the
    loop's collectives follow them (evaluations, checkpoints, the best model's gathers, early stopping) as does the
    compiled step (the mesh, by its axis sizes; remat): processes that differ there wait for each other in
    collectives that never complete."""
    cfg = run.cfg
    options = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name not in _OWN_OPTIONS}
    options["mesh"] = sharding.mesh_shape(cfg.mesh, jax.device_count(), run.config.num_attention_heads, cfg.fsdp)
    if jax.process_count() > 1:
        options["weights_sha256"] = _params_sha256(params)
    return {**options, **{k: v for k, v in meta(0).items() if k not in ("step", "epoch", "offset")}}


def _params_sha256(params) -> str:
    h = hashlib.sha256()
    for path, leaf in sorted(traverse_util.flatten_dict(params, sep="/").items()):
        leaf = np.ascontiguousarray(leaf)
        h.update(f"{path}:{leaf.dtype}:{leaf.shape}".encode())
        h.update(leaf.reshape(-1).view(np.uint8))
    return h.hexdigest()[:16]


def train(cfg: TrainConfig) -> dict:
    """Fine-tune cfg.model (a directory or a hub id) on cfg.task; returns the final validation metrics."""
    distributed.initialize(cfg.coordinator_address, cfg.num_processes, cfg.process_id)
    # An error on one process stops the others too; a Ctrl-C between steps already stops all after the same one.
    with failures.fail_together(coordinated=(Interrupted,)):
        cfg = dataclasses.replace(cfg, model=hub.resolve(cfg.model))
        _check_output_dir(cfg)
        # One run, one lock: process 0 takes it for all the run's processes.
        with lock.hold(cfg.output_dir, cfg.break_lock) if distributed.is_primary() else contextlib.nullcontext():
            with _undone_on_failure(cfg.output_dir) if distributed.is_primary() else contextlib.nullcontext():
                return _train(cfg)


def train_mlm(cfg: TrainConfig) -> dict:
    """Fine-tune cfg.model with masked-language modelling (`train` with task mlm)."""
    if cfg.task != "mlm":
        raise ValueError(f"train_mlm: cfg.task is {cfg.task!r}; use train(cfg)")
    return train(cfg)


def _train(cfg: TrainConfig) -> dict:
    distributed.barrier("jaxbert-lock")  # the others start once process 0 owns OUT (if it cannot, none go on)
    if distributed.is_primary():  # a run killed while writing OUT/best or OUT/final: its leftovers, now
        for name in ("best", "final"):  # (a run that never writes them again would keep them for good)
            sweep_partials(os.path.join(cfg.output_dir, name))
    # The checkpoint a resume restores, and a refusal if its input files changed: before the data is tokenized.
    own = checkpoints.manager(os.path.join(cfg.output_dir, "checkpoints"))
    found = checkpoints.resume_candidate(cfg, own, distributed.say)
    checkpoints.files_unchanged(found, lambda: _file_digests(cfg))
    if cfg.task == "embedding":
        from jaxbert.train import task_embedding

        steps = task_embedding.pipeline_steps(cfg)  # the model's Dense modules, unless --pooling replaces them
        cfg = task_embedding.with_pipeline(cfg)  # before anything reads the pipeline or the length
        run = task_embedding.prepare(cfg, steps)
    elif cfg.task == "question-answering":
        from jaxbert.train.task_qa import prepare as qa_prepare

        run = qa_prepare(cfg)
    elif cfg.task == "causal-lm":
        from jaxbert.train.task_causal_lm import prepare as causal_prepare

        run = causal_prepare(cfg)
    elif cfg.task == "seq2seq":
        from jaxbert.train.task_seq2seq import prepare as seq2seq_prepare

        run = seq2seq_prepare(cfg)
    else:
        run = (plan.prepare if cfg.task == "mlm" else task_plan.prepare)(cfg)
    if cfg.max_steps and cfg.num_train_epochs is not None:  # Trainer's documented rule, said rather than silent
        run.say(f"plan: --max-steps {cfg.max_steps} overrides --num-train-epochs {cfg.num_train_epochs:g}")
    params = run.initial_params()
    # Processes given other options, data or weights would each compute their share of another run, silently, or
    # wait for each other forever.
    meta = _meta_by_step(run)
    distributed.same_everywhere(_shared(run, meta, params))
    point = checkpoints.resume_point(cfg, own, meta, run.say, found)
    metrics_path = os.path.join(cfg.output_dir, "metrics.jsonl")
    records = [r for r in outputs.read_metrics(metrics_path) if r["step"] <= point[1]] if point else []
    best = Best(run.metric, cfg.early_stopping_patience, records)
    again = rescore.plan(run, best, *point) if point else None  # a refusal comes before anything compiles
    state, step_fn, eval_fn = _build(run, params)
    start, last_good, rescored = 0, None, None
    if point:
        source, start = point
        abstract = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
        if again is not None:  # before the resumed state is restored: one train state besides the initial one
            rescored = rescore.rescore(run, best, source, abstract, eval_fn, start)
        state = checkpoints.restore_state(source, start, abstract)
        last_good = (start, source.directory.as_posix())
        pos = run.train.position(start)
        run.say(f"resume: restored step {start} (epoch {pos['epoch']}, sequence {pos['offset']} of the epoch)")
    metrics = outputs.Metrics(metrics_path, records) if distributed.is_primary() else _Unwritten(records)
    if rescored:
        rescore.record(run, best, metrics, rescored)
    if start == 0:
        before = run.evaluate(state.params, eval_fn)
        metrics.add({"step": 0, **before})
        run.say(f"step 0: {run.describe(before)}")
    with deferred_sigint() as stop:
        state, result, last_good = _loop(run, meta, state, start, step_fn, eval_fn, own, metrics, last_good, stop, best)
        # OUT/final is written whole under the same deferral (a second signal stops at once, leaving none).
        return _finish(run, state, metrics, own, last_good, result)


def _build(run, params):
    """The initial train state, placed on the mesh, and the compiled step and evaluation."""
    cfg = run.cfg
    opt = OptimConfig.from_train(cfg, run.warmup_steps, run.total_steps)
    tx, sched = optimizer(opt), schedule(opt)
    shape = sharding.mesh_shape(cfg.mesh, jax.device_count(), run.config.num_attention_heads, cfg.fsdp)
    mesh = sharding.make_mesh(shape)
    state = init_state(params, tx)
    state_sh = sharding.state_shardings(state, mesh)
    return (jax.device_put(state, state_sh), *_compile(run, tx, sched, state_sh, mesh))


def _loop(run, meta, state, start: int, step_fn, eval_fn, own, metrics, last_good, stop, best):
    """Steps start..total; -> (state, last validation result, last good checkpoint). Stops between steps on
    Ctrl-C (`stop`) of any process, raising Interrupted, and after an evaluation when early stopping says so."""
    cfg, total = run.cfg, run.total_steps
    key = jax.random.key(cfg.seed)
    visible = cfg.progress and distributed.is_primary()
    bar = tqdm(total=total, initial=start, unit="step", disable=not visible, dynamic_ncols=True)
    batch_sh = sharding.batch_sharding(_mesh(state), batch_axis=1)  # as _compile's
    # Resumed with no step left (stopped early, or the last step's checkpoint was saved before the signal
    # stopped it): the result is the last evaluation that run logged, as the uninterrupted run returns it.
    last = next((r for r in reversed(metrics.records) if "eval_loss" in r), {})
    result = {k: v for k, v in last.items() if k != "step"}
    tick, tokens, done, shown = time.perf_counter(), 0, start, {}
    stopping = False
    if best.stop:  # restored from a run that had stopped early (best.py): it ends where that run ended
        run.say(f"early stopping at step {start} (as the run resumed had): no step run")
        return state, result, last_good
    for step in range(start, total):
        # All processes ask at every step boundary (one tiny collective; with one process, the flag): a Ctrl-C
        # reaching any one of them stops all after the same step, none left waiting in the next step's collectives.
        if stopping := distributed.any_process(stop.requested):
            break
        batch, count = _feed(run, step, batch_sh)
        tokens += count
        state, m = step_fn(state, batch, jax.random.fold_in(key, step))
        loss = float(m["loss"])
        done = step + 1
        if not math.isfinite(loss):
            raise TrainingError(
                f"non-finite loss ({loss}) at step {done}; stopped, last good checkpoint: {_where(last_good, own)}"
            )
        if done % cfg.logging_steps == 0 or done == total:
            now = time.perf_counter()
            record = {
                "step": done,
                "epoch": round(done / run.train.steps_per_epoch, 4),
                **{k: float(v) for k, v in jax.device_get(m).items() if k != "masked_tokens"},
                "tokens_per_s": tokens / (now - tick),
            }
            metrics.add(record)
            bar.set_postfix(
                loss=f"{loss:.4f}", lr=f"{record['learning_rate']:.2e}", tok_s=f"{record['tokens_per_s']:.0f}", **shown
            )
            tick, tokens = now, 0
        if (cfg.eval_steps and done % cfg.eval_steps == 0) or done == total:
            result = evaluate(run, state, done, eval_fn, metrics, best)
            shown = {best.key: f"{result[best.key]:.4f}"} if best.metric else {}  # eval_loss beside the loss
        if done % cfg.save_steps == 0 or done == total or best.stop:
            last_good = _save(run, meta, state, done, own, last_good)
        bar.update(1)
        if best.stop:
            run.say(
                f"early stopping at step {done}: no better {best.key} in {best.patience} evaluations (best "
                f"{best.value:.4f} at step {best.step})"
            )
            break
    bar.close()
    if stopping or distributed.any_process(stop.requested):  # or a Ctrl-C during the last step
        how = "terminated" if stop.signum == signal.SIGTERM else "interrupted"
        raise Interrupted(f"{how} at step {done}; last checkpoint: {_where(last_good, own)}", stop.signum)
    return state, result, last_good


def _mesh(state):
    return jax.tree_util.tree_leaves(state.params)[0].sharding.mesh
