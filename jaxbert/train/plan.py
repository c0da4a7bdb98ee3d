"""A masked-LM run's plan: the checked inputs (model config, texts, batch sizes), the tokenized data and the step
counts, and what the loop asks of every task's run (task_plan.TaskRun answers the same questions): the batch of a
step, the initial parameters, the evaluation, the final model's config.

`prepare` finds everything that can be wrong with the inputs before anything is compiled.
"""

from __future__ import annotations

import dataclasses
import math
import os

import jax
import numpy as np

from jaxbert import cpu, distributed, malloc, sharding
from jaxbert.config import BertConfig, padding_id
from jaxbert.texts import read_text_file
from jaxbert.train import data as D
from jaxbert.train.config import TrainConfig, held_out, total_steps
from jaxbert.train.masking import default_max_predictions, mask_tokens
from jaxbert.train.state import mlm_params
from jaxbert.train.step import eval_step

EVAL_SEED = 1234  # validation masking is fixed, so numbers compare across runs and checkpoints


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
    metric: str | None = None  # --metric-for-best-model (None: no OUT/best)
    packed: bool = False  # line-by-line rows hold several lines (segment_ids and position_ids from data.positions)
    tokens: int | None = None  # the tokenizer's vocabulary size: random replacements are drawn below it
    # The meta of the texts read: config.held_out's of --validation-split-percentage, EMPTY_LINES_KEY's
    split: dict = dataclasses.field(default_factory=dict)
    head = "BertForMaskedLM"

    def say(self, message: str) -> None:
        self.log.append(message)
        distributed.say(message)

    def masked(self, blocks: np.ndarray, seed) -> dict:
        """Mask [..., 2, L] blocks (ids and segments, data._tokenize); the Generator is seeded by `seed` (a list),
        never global."""
        ids, segment_ids = blocks[..., 0, :], blocks[..., 1, :]
        flat = ids.reshape(-1, ids.shape[-1])
        inputs, positions, labels = mask_tokens(
            flat,
            rng=np.random.default_rng(seed),
            special_ids=self.special,
            mask_id=self.mask_id,
            vocab_size=min(self.config.vocab_size, self.tokens or self.config.vocab_size),
            probability=self.cfg.mlm_probability,
            max_predictions=self.max_predictions,
            continuation=self.continuation,
        )
        lead = ids.shape[:-1]
        batch = {
            "input_ids": inputs.reshape(ids.shape),
            "attention_mask": (segment_ids != 0).astype(np.int32),
            "positions": positions.reshape(*lead, -1),
            "labels": labels.reshape(*lead, -1),
        }
        if self.packed:
            batch.update(segment_ids=segment_ids.astype(np.int32), position_ids=D.positions(segment_ids))
        return batch

    def batch(self, step: int, rows: slice | None = None) -> dict:
        """Step `step`'s batch [accum, batch, ...], or only `rows` of its batch axis (a process's share). Each row
        is masked by its own Generator seeded by (seed, step, row), so a row is the same whoever masks it."""
        ids = self.train(step, rows, self.fill)
        A, R = ids.shape[:2]
        first = rows.start if rows else 0
        seeds = [[self.cfg.seed, step, a * self.train.batch_size + first + i] for a in range(A) for i in range(R)]
        batch = self.masked_rows(ids.reshape(A * R, *ids.shape[2:]), seeds)
        return {k: v.reshape(A, R, *v.shape[1:]) for k, v in batch.items()}

    def masked_rows(self, blocks: np.ndarray, seeds: list) -> dict:
        """Blocks [N, 2, L] masked row by row, row i by a Generator seeded by seeds[i]: a row's masks depend on it
        alone, not on the rows batched with it."""
        one = [self.masked(blocks[i : i + 1], seed) for i, seed in enumerate(seeds)]
        return {k: np.concatenate([o[k] for o in one]) for k in one[0]}

    @property
    def fill(self) -> np.ndarray:
        """A padding row's block: the pad id, in no segment."""
        return np.asarray([[padding_id(self.config)], [0]], np.int32)

    def initial_params(self):
        params, fresh, partial = mlm_params(self.cfg.model, self.config, self.cfg.seed)
        if fresh:
            what = (
                "lacks part of its masked-LM head; initialized the missing parameters as transformers does"
                if partial
                else "has no masked-LM head; initialized a new one tied to the word embeddings"
            )
            self.say(f"model: the checkpoint {what} ({', '.join(fresh)})")
        return params

    def eval_fn(self, dtype):
        smoothing = self.cfg.label_smoothing
        return lambda params, batch: eval_step(
            params, batch, config=self.config, dtype=dtype, label_smoothing=smoothing
        )

    def evaluate(self, params, eval_fn) -> dict:
        nll = correct = count = 0.0
        B = self.train.batch_size
        for start in range(0, len(self.val), B):
            ids = self.val[start : start + B]
            if len(ids) < B:  # pad the last batch with padding rows: nothing in them is masked
                pad = np.broadcast_to(self.fill, (B - len(ids), *ids.shape[1:])).astype(ids.dtype)
                ids = np.concatenate([ids, pad])
            # Each row masked by its own Generator, seeded by (EVAL_SEED, row): the same masks whatever the batch
            # size (an accumulated run, or one of another --global-batch-size, scores the same validation tokens).
            s, c, n = eval_fn(params, self.masked_rows(ids, [[EVAL_SEED, start + i] for i in range(B)]))
            nll, correct, count = nll + float(s), correct + float(c), count + float(n)
        if count == 0:  # the masks are fixed (EVAL_SEED): no evaluation would score anything, each "loss 0"
            raise ValueError(
                f"the validation set ({len(self.val)} sequences) has no token masked at --mlm-probability "
                f"{self.cfg.mlm_probability}: give more validation text or a higher --mlm-probability"
            )
        loss = nll / count
        try:
            perplexity = math.exp(loss)
        except OverflowError:  # a diverged model's loss beyond ~709: infinite perplexity (run_mlm's rule), not a crash
            perplexity = math.inf
        return {"eval_loss": loss, "eval_accuracy": correct / max(count, 1), "eval_perplexity": perplexity}

    def describe(self, result: dict) -> str:
        return (
            f"validation loss {result['eval_loss']:.4f}, perplexity {result['eval_perplexity']:.2f}, "
            f"accuracy {result['eval_accuracy']:.3f}"
        )

    def final_config(self):
        return self.config.replace(architectures=("BertForMaskedLM",))

    def meta(self) -> dict:
        return {}


def model_and_batch(cfg: TrainConfig) -> tuple[BertConfig, int]:
    """The model's config and the global batch size, checked against each other and the devices."""
    from jaxbert.seq2seq import load_config

    config = load_config(cfg.model)  # a BertConfig, or a bert2bert's EncoderDecoderConfig
    pair = getattr(config, "is_encoder_decoder", False)
    if pair and cfg.task != "seq2seq":
        raise ValueError(f"{cfg.model}: an EncoderDecoderModel (bert2bert); --task seq2seq trains it, not {cfg.task}")
    # A bert2bert's sources are read by its encoder and its targets by its decoder (each side's flag named).
    sides = (("encoder", config.encoder), ("decoder", config.decoder)) if pair else (("model", config),) * 2
    lengths = cfg.seq2seq_lengths() if cfg.task == "seq2seq" else [("--max-seq-length", cfg.max_seq_length)] * 2
    for (side, part), (flag, length) in zip(sides, lengths):
        if length > part.max_position_embeddings:
            limit = part.max_position_embeddings
            # The targets' cut defaults to --max-seq-length's (128 unless given): name the flag that sets this side.
            own = {"encoder": "--max-source-length", "decoder": "--max-target-length"}.get(side)
            hint = f" (--max-seq-length cuts both sides unless {own} cuts the {side}'s)" if own and flag != own else ""
            raise ValueError(f"{flag} {length} exceeds the {side}'s max_position_embeddings {limit}{hint}")
    val = cfg.val_max_target_length  # the validation targets' cut, and the generation's bound
    if pair and val is not None and val > config.decoder.max_position_embeddings:
        limit = config.decoder.max_position_embeddings
        raise ValueError(f"--val-max-target-length {val} exceeds the decoder's max_position_embeddings {limit}")
    shape = sharding.mesh_shape(cfg.mesh, jax.device_count(), config.num_attention_heads, cfg.fsdp)
    n = shape["data"] * shape["fsdp"]  # the batch is split over these (tensor-parallel devices share rows)
    batch = cfg.global_batch_size or cfg.per_device_batch_size * n
    if batch % n:
        raise ValueError(f"batch size {batch} does not divide across {n} devices")
    return config, batch


def _texts(path: str, flag: str, keep_empty: bool = False):
    """The texts of a .txt (one per line) or .jsonl file. Data formats that hold records (.json, .csv, .tsv: what
    run_mlm.py reads) are refused: read line by line, their syntax and header would be trained on as text.
    `keep_empty`: empty (or blank) lines and "text" fields are texts too (grouped MLM: run_mlm.py tokenizes every
    line `datasets` reads, an empty one as [CLS] [SEP]); a file of none but those is refused either way."""
    ext = os.path.splitext(path)[1].lower()
    if ext in (".json", ".csv", ".tsv"):
        raise ValueError(
            f'{flag} {path}: expected a .txt file (one text per line) or .jsonl (a "text" field per line), not {ext}'
        )
    read = read_text_file(path, keep_empty=keep_empty)
    if not any(t.strip() for t in read.texts):
        raise ValueError(f"{path}: no text (0 non-empty lines)")
    return read


# The checkpoint meta key of grouped MLM on text with empty lines: how many it holds (train and validation texts).
# jaxbert before it dropped them, so its blocks (and its validation split's cut) were other ones: a checkpoint
# without the key is refused on resume exactly when this run keeps some (checkpoints.check_meta).
EMPTY_LINES_KEY = "empty_lines_kept"


def _blank(texts) -> int:
    return sum(not t.strip() for t in texts)


def _split(cfg: TrainConfig, texts: list[str], grouped: bool) -> tuple[list[str], list[str], dict]:
    """(validation texts, training texts, checkpoint meta) of --validation-split-percentage: run_mlm.py's
    train[:P%] and train[P%:] of every line (config.held_out's cut), whose empty ones line by line drops afterwards
    (its tokenize_function). Earlier versions cut the non-empty lines alone, at the floor of P% of them and then at
    its rounding (config.held_out's meta): the meta counts the non-empty lines held out as they did, so that their
    checkpoints are refused on resume exactly where this cut holds out other lines."""
    P = cfg.validation_split_percentage
    cut, meta = held_out(len(texts), P)
    val, train = texts[:cut], texts[cut:]
    if not grouped:
        val, train = [t for t in val if t.strip()], [t for t in train if t.strip()]
        n = len(val) + len(train)
        earlier, meta = held_out(n, P)  # the previous version's cut of the non-empty lines, and its meta
        if len(val) != earlier:  # None: the floor's count, which the version before it recorded by no key
            meta = {"validation_rows": len(val) if len(val) != n * P // 100 else None}
    if not val:
        empty = f" ({cut} held out, all empty)" if cut else ""
        raise ValueError(
            f"{cfg.train_file}: {len(texts)} lines{empty} leave no validation set at {P}%: pass --validation-file"
        )
    return val, train, meta


def _check_vocabulary(ids: np.ndarray, vocab_size: int, tok, name: str) -> None:
    """Every token id inside the model's embedding table: a tokenizer larger than the model gave ids JAX's gather
    reads as NaN ("non-finite loss at step 1"), where PyTorch raises an IndexError."""
    largest = int(ids.max(initial=0))
    if largest >= vocab_size:
        raise ValueError(
            f"the {name} text holds token {tok.id_to_token(largest)!r} (id {largest}), outside the model's "
            f"vocab_size {vocab_size}: the tokenizer does not match the model"
        )


def prepare(cfg: TrainConfig) -> Run:
    """Everything that can be wrong with the inputs is found here, before any compilation."""
    from jaxbert.sentence_dir import companion_files
    from jaxbert.tokenizer import WordPiece

    config, batch = model_and_batch(cfg)
    n = jax.device_count()
    grouped = not cfg.line_by_line  # run_mlm.py drops empty lines line by line only
    # Every line read before a split: run_mlm.py splits the rows datasets reads, and drops the empty ones after.
    train_text, split = _texts(cfg.train_file, "--train-file", grouped or not cfg.validation_file), {}
    if cfg.validation_file:
        val_texts = _texts(cfg.validation_file, "--validation-file", grouped).texts
        train_texts = train_text.texts
    else:
        val_texts, train_texts, split = _split(cfg, train_text.texts, grouped)
    kept = _blank(train_texts) + _blank(val_texts) if grouped else 0
    split = {**({EMPTY_LINES_KEY: kept} if kept else {}), **split}  # compared first: it explains the cut too
    tok = WordPiece.from_dir(cfg.model)
    companion_files(cfg.model)  # what the written model copies: refused now, not after training
    key = D.tokenizer_key(cfg.model)
    cache = os.path.join(cfg.output_dir, "cache")
    args = (cfg.max_seq_length, cfg.line_by_line, padding_id(config), cache)
    packed = cfg.line_by_line and cfg.pack
    train_blocks = D.tokenized(tok, train_texts, *args, "train", key, packed)
    val_blocks = D.tokenized(tok, val_texts, *args, "validation", key, packed)
    # Grouped texts are cut into whole blocks: a set shorter than one has none. Named by its file, not as "fewer
    # sequences than one step needs" (the training set) or "the validation set" (which file's?).
    held = cfg.validation_file or f"{cfg.train_file}'s {cfg.validation_split_percentage}% validation split"
    for where, blocks in ((cfg.train_file, train_blocks), (held, val_blocks)):
        if len(blocks) == 0:
            raise ValueError(
                f"{where}: shorter than one --max-seq-length block ({cfg.max_seq_length} tokens, texts concatenated); "
                "give more text, a smaller --max-seq-length, or --line-by-line"
            )
    for name, blocks in (("training", train_blocks), ("validation", val_blocks)):
        _check_vocabulary(blocks.ids, config.vocab_size, tok, name)
    batches = D.of_file(cfg.train_file, packed, lambda: D.Batches(train_blocks, batch, cfg.grad_accum_steps, cfg.seed))
    total = total_steps(cfg, batches.steps_per_epoch)
    warmup = cfg.warmup_steps or math.ceil(cfg.warmup_ratio * total)
    continuation = None
    if cfg.whole_word_mask:
        continuation = np.zeros(max(config.vocab_size, max(tok.vocab.values()) + 1), bool)
        for token, i in tok.vocab.items():
            continuation[i] = token.startswith("##")
    # By the names the tokenizer's files give them (tokenizer_config.json may rename [CLS] to <s>): never masked.
    names = ("pad_token", "cls_token", "sep_token", "mask_token", "unk_token")
    special = [tok.token_to_id(tok.special_tokens[k]) for k in names]
    special += [tok.token_to_id(t) for t in tok.additional_special]  # as the collator's all_special_ids
    special.append(padding_id(config))  # what rows are padded with (and unattended), whatever the tokenizer's is
    run = Run(
        cfg,
        config,
        batches,
        np.asarray(val_blocks),
        [i for i in special if i is not None],
        tok.mask_token_id,
        continuation,
        cfg.max_predictions_per_seq or default_max_predictions(cfg.max_seq_length, cfg.mlm_probability),
        total,
        warmup,
        packed=packed,
        tokens=len(tok.vocab),  # as the collator's len(tokenizer): a padded vocab_size's last rows have no token
        split=split,
    )
    if cfg.metric_for_best_model or cfg.early_stopping_patience:
        from jaxbert.train.task_table import metric_name

        run.metric = metric_name(cfg.metric_for_best_model, ("loss", "accuracy"))
    run.say(
        f"data: {len(train_texts)} training texts -> {len(train_blocks)} sequences of {cfg.max_seq_length} "
        f"tokens, {len(val_blocks)} validation sequences; "
        + (
            f"{kept} empty lines kept as [CLS] [SEP], as run_mlm.py reads them"
            if grouped
            else f"{train_text.empty_lines} empty lines skipped"
        )
    )
    if cfg.line_by_line:
        real = int(np.count_nonzero(train_blocks.segments))
        share = 1 - real / max(len(train_blocks) * cfg.max_seq_length, 1)
        alone = 1 - real / max(len(train_texts) * cfg.max_seq_length, 1)
        run.say(
            f"data: {share:.0%} of the training positions are padding"
            + (f" (lines packed into rows; {alone:.0%} one line a row: --no-pack)" if packed else "")
        )
    run.say(
        f"plan: {total} steps of {batch} sequences x {cfg.grad_accum_steps} accumulation on {n} device(s)"
        f"{' (FSDP)' if cfg.fsdp else ''}{f' (mesh {cfg.mesh})' if cfg.mesh else ''}"
        f", warm-up {warmup}, {cpu.label(cfg.dtype)}{malloc.label()}{', remat' if cfg.remat else ''}"
    )
    return run
