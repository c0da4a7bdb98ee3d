"""`train_mlm(cfg)`: the training loop, the only impure code of the package.

It checks every input before compiling anything, tokenizes once (cached), then runs the jitted pure step over
a device mesh, logging to OUT/metrics.jsonl, evaluating on a fixed masking, checkpointing with orbax (written
atomically: a crash mid-save leaves the previous checkpoint intact), and writing OUT/final and OUT/loss.png.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from jaxbert import sharding
from jaxbert.config import BertConfig
from jaxbert.train import data as D
from jaxbert.train import outputs
from jaxbert.texts import read_text_file
from jaxbert.train.config import TrainConfig
from jaxbert.train.masking import default_max_predictions, mask_tokens
from jaxbert.train.state import OptimConfig, init_state, mlm_params, optimizer, schedule
from jaxbert.train.step import eval_step, train_step
from jaxbert.transfer import write_jaxbert_dir

EVAL_SEED = 1234  # validation masking is fixed, so numbers compare across runs and checkpoints
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


class TrainingError(RuntimeError):
    """A run that cannot go on (e.g. a non-finite loss); the message names the step."""


@dataclasses.dataclass
class Run:
    cfg: TrainConfig
    config: BertConfig
    train: D.Batches
    val: np.ndarray
    special: list[int]
    mask_id: int
    continuation: np.ndarray | None
    max_predictions: int
    total_steps: int
    warmup_steps: int
    log: list[str] = dataclasses.field(default_factory=list)

    def say(self, message: str) -> None:
        self.log.append(message)
        tqdm.write(message)

    def masked(self, ids: np.ndarray, seed) -> dict:
        """Mask a [..., L] block of ids; the Generator is seeded by `seed` (a list), never global."""
        flat = ids.reshape(-1, ids.shape[-1])
        inputs, positions, labels = mask_tokens(
            flat, rng=np.random.default_rng(seed), special_ids=self.special, mask_id=self.mask_id,
            vocab_size=self.config.vocab_size, probability=self.cfg.mlm_probability,
            max_predictions=self.max_predictions, continuation=self.continuation)
        lead = ids.shape[:-1]
        return {"input_ids": inputs.reshape(ids.shape),
                "attention_mask": (flat != self.config.pad_token_id).astype(np.int32).reshape(ids.shape),
                "positions": positions.reshape(*lead, -1), "labels": labels.reshape(*lead, -1)}


def prepare(cfg: TrainConfig) -> Run:
    """Everything that can be wrong with the inputs is found here, before any compilation."""
    from jaxbert.tokenizer import WordPiece

    config = BertConfig.from_pretrained(cfg.model)
    if cfg.max_seq_length > config.max_position_embeddings:
        raise ValueError(f"--max-seq-length {cfg.max_seq_length} exceeds the model's max_position_embeddings "
                         f"{config.max_position_embeddings}")
    n = jax.device_count()
    batch = cfg.global_batch_size or cfg.per_device_batch_size * n
    if batch % n:
        raise ValueError(f"batch size {batch} does not divide across {n} devices")
    train_text = read_text_file(cfg.train_file)
    if cfg.validation_file:
        val_texts = read_text_file(cfg.validation_file).texts
        train_texts = train_text.texts
    else:
        cut = len(train_text.texts) * cfg.validation_split_percentage // 100
        if cut == 0:
            raise ValueError(f"{cfg.train_file}: {len(train_text.texts)} lines leave no validation set at "
                             f"{cfg.validation_split_percentage}%: pass --validation-file")
        val_texts, train_texts = train_text.texts[:cut], train_text.texts[cut:]
    tok = WordPiece.from_dir(cfg.model)
    key = D.tokenizer_key(cfg.model)
    cache = os.path.join(cfg.output_dir, "cache")
    args = (cfg.max_seq_length, cfg.line_by_line, config.pad_token_id, cache)
    train_blocks = D.tokenized(tok, train_texts, *args, "train", key)
    val_blocks = D.tokenized(tok, val_texts, *args, "validation", key)
    if len(val_blocks) == 0:
        raise ValueError("the validation set is shorter than one --max-seq-length block")
    batches = D.Batches(train_blocks, batch, cfg.grad_accum_steps, cfg.seed)
    total = cfg.max_steps or math.ceil(cfg.num_train_epochs * batches.steps_per_epoch)
    warmup = cfg.warmup_steps or math.ceil(cfg.warmup_ratio * total)
    continuation = None
    if cfg.whole_word_mask:
        continuation = np.zeros(max(config.vocab_size, max(tok.vocab.values()) + 1), bool)
        for token, i in tok.vocab.items():
            continuation[i] = token.startswith("##")
    special = [tok.token_to_id(t) for t in ("[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]")]
    run = Run(cfg, config, batches, np.asarray(val_blocks), [i for i in special if i is not None],
              tok.mask_token_id, continuation,
              cfg.max_predictions_per_seq or default_max_predictions(cfg.max_seq_length, cfg.mlm_probability),
              total, warmup)
    run.say(f"data: {len(train_texts)} training texts -> {len(train_blocks)} sequences of {cfg.max_seq_length} "
            f"tokens, {len(val_blocks)} validation sequences; {train_text.empty_lines} empty lines skipped")
    run.say(f"plan: {total} steps of {batch} sequences x {cfg.grad_accum_steps} accumulation on {n} device(s)"
            f"{' (FSDP)' if cfg.fsdp else ''}, warm-up {warmup}, {cfg.dtype}{', remat' if cfg.remat else ''}")
    return run


def evaluate(run: Run, params, eval_fn) -> dict:
    nll = correct = count = 0.0
    B = run.train.batch_size
    for start in range(0, len(run.val), B):
        ids = run.val[start:start + B]
        if len(ids) < B:  # pad the last batch with padding rows: nothing in them is masked
            ids = np.concatenate([ids, np.full((B - len(ids), ids.shape[1]), run.config.pad_token_id, ids.dtype)])
        s, c, n = eval_fn(params, run.masked(ids, [EVAL_SEED, start]))
        nll, correct, count = nll + float(s), correct + float(c), count + float(n)
    loss = nll / max(count, 1)
    return {"eval_loss": loss, "eval_accuracy": correct / max(count, 1), "eval_perplexity": math.exp(loss)}


def _compile(run: Run, tx, sched, state_sh, mesh):
    cfg, dtype = run.cfg, DTYPES[run.cfg.dtype]
    batch_sh = sharding.batch_sharding(mesh, batch_axis=1)  # [accum, batch, ...]: split the batch axis
    rep = sharding.replicated(mesh)

    def step(state, batch, rng):
        return train_step(state, batch, rng, config=run.config, tx=tx, schedule=sched, dtype=dtype,
                          remat=cfg.remat, label_smoothing=cfg.label_smoothing)

    step_fn = jax.jit(step, in_shardings=(state_sh, batch_sh, rep), out_shardings=(state_sh, rep),
                      donate_argnums=0)
    eval_jit = jax.jit(lambda p, b: eval_step(p, b, config=run.config, dtype=dtype),
                       in_shardings=(state_sh.params, sharding.batch_sharding(mesh)), out_shardings=rep)
    return step_fn, eval_jit


def _meta(run: Run, step: int) -> dict:
    return {"step": step, **run.train.position(step), "train_sequences": len(run.train.blocks),
            "global_batch_size": run.train.batch_size,
            **{k: getattr(run.cfg, k) for k in run.cfg.RESUME_KEYS}}


def _restore(run: Run, manager, step: int | None, state):
    step = manager.latest_step() if step is None else step
    if step is None:
        run.say("resume: no checkpoint yet, starting from the beginning")
        return state, 0
    abstract = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
    restored, meta = outputs.restore(manager, step, abstract)
    for key, value in _meta(run, step).items():
        if key not in ("step", "epoch", "offset") and meta.get(key) != value:
            raise ValueError(f"--resume: checkpoint {step} was made with {key}={meta.get(key)!r}, this run has "
                             f"{value!r}")
    state = restored
    run.say(f"resume: restored step {step} (epoch {meta['epoch']}, sequence {meta['offset']} of the epoch)")
    return state, step


def train_mlm(cfg: TrainConfig) -> dict:
    """Fine-tune cfg.model with masked-language modelling; returns the final validation metrics."""
    run = prepare(cfg)
    os.makedirs(cfg.output_dir, exist_ok=True)
    params, fresh = mlm_params(cfg.model, run.config, cfg.seed)
    if fresh:
        run.say(f"model: the checkpoint has no masked-LM head; initialized a new one tied to the word embeddings "
                f"({', '.join(fresh)})")
    opt = OptimConfig.from_train(cfg, run.warmup_steps, run.total_steps)
    tx, sched = optimizer(opt), schedule(opt)
    mesh = sharding.make_mesh()
    state = init_state(params, tx)
    state_sh = sharding.state_shardings(state, mesh, cfg.fsdp)
    state = jax.device_put(state, state_sh)
    step_fn, eval_fn = _compile(run, tx, sched, state_sh, mesh)
    manager = outputs.checkpoint_manager(os.path.join(cfg.output_dir, "checkpoints"), cfg.save_total_limit)
    start = 0
    if not cfg.resume and manager.latest_step() is not None:
        raise ValueError(f"{cfg.output_dir} has checkpoints up to step {manager.latest_step()}: pass --resume auto "
                         "to continue, or choose a new --output-dir")
    if cfg.resume:
        root, step = outputs.resume_location(cfg.resume, cfg.output_dir)
        if root != manager.directory.as_posix():
            manager = outputs.checkpoint_manager(root, cfg.save_total_limit)
        state, start = _restore(run, manager, step, state)
    metrics = outputs.Metrics(os.path.join(cfg.output_dir, "metrics.jsonl"), start if cfg.resume else None)
    if start == 0:
        before = evaluate(run, state.params, eval_fn)
        metrics.add({"step": 0, **before})
        run.say(f"step 0: validation loss {before['eval_loss']:.4f}, perplexity {before['eval_perplexity']:.2f}")
    return _loop(run, state, start, step_fn, eval_fn, manager, metrics)


def _loop(run: Run, state, start: int, step_fn, eval_fn, manager, metrics) -> dict:
    cfg, total = run.cfg, run.total_steps
    key = jax.random.key(cfg.seed)
    bar = tqdm(total=total, initial=start, unit="step", disable=not cfg.progress, dynamic_ncols=True)
    last_saved, tick, tokens = (start if start else None), time.perf_counter(), 0
    result = {}
    for step in range(start, total):
        ids = run.train(step)
        batch = run.masked(ids, [cfg.seed, step])
        tokens += int(batch["attention_mask"].sum())
        state, m = step_fn(state, batch, jax.random.fold_in(key, step))
        loss = float(m["loss"])
        done = step + 1
        if not math.isfinite(loss):
            where = f"checkpoint {last_saved}" if last_saved else "no checkpoint yet"
            raise TrainingError(f"non-finite loss ({loss}) at step {done}; stopped, last good: {where} "
                                f"in {manager.directory}")
        if done % cfg.logging_steps == 0 or done == total:
            now = time.perf_counter()
            record = {"step": done, "epoch": round(done / run.train.steps_per_epoch, 4),
                      **{k: float(v) for k, v in jax.device_get(m).items() if k != "masked_tokens"},
                      "tokens_per_s": tokens / (now - tick)}
            metrics.add(record)
            bar.set_postfix(loss=f"{loss:.4f}", lr=f"{record['learning_rate']:.2e}",
                            tok_s=f"{record['tokens_per_s']:.0f}")
            tick, tokens = now, 0
        if (cfg.eval_steps and done % cfg.eval_steps == 0) or done == total:
            result = evaluate(run, state.params, eval_fn)
            metrics.add({"step": done, **result})
            run.say(f"step {done}: validation loss {result['eval_loss']:.4f}, "
                    f"perplexity {result['eval_perplexity']:.2f}, accuracy {result['eval_accuracy']:.3f}")
        if done % cfg.save_steps == 0 or done == total:
            outputs.save(manager, done, state, _meta(run, done))
            last_saved = done
        bar.update(1)
    bar.close()
    params = jax.device_get(state.params)
    final_dir = os.path.join(cfg.output_dir, "final")
    config = run.config.replace(architectures=("BertForMaskedLM",))
    write_jaxbert_dir(params, config, "BertForMaskedLM", final_dir, tokenizer_from=cfg.model, force=True)
    outputs.plot(metrics.records, os.path.join(cfg.output_dir, "loss.png"))
    run.say(f"wrote {final_dir} (jaxbert BertForMaskedLM), metrics.jsonl, loss.png")
    return result
