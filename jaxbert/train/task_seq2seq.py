"""Sequence-to-sequence fine-tuning of a bert2bert (`jaxbert train --task seq2seq`): (source, target) rows, the
model an EncoderDecoderModel directory or one warm-started from a BERT directory as
`EncoderDecoderModel.from_encoder_decoder_pretrained(DIR, DIR)` builds it (the encoder a BertModel, the decoder a
BertLMHeadModel with is_decoder, add_cross_attention and new cross-attention weights), and the loss of
EncoderDecoderModel: labels the target's ids (-100 on [PAD]), decoder inputs those shifted right after
decoder_start_token_id, the mean cross-entropy over the labels.

An example is two consecutive sequences (source, target) of task_encode's set, the multiple-choice layout, so its
batches, buckets and caching serve unchanged; the target's ids are its per-token labels (the source's are -100).
The encoder's pooler takes no part in the loss: it is left out of training (PyTorch gives it no gradient, so AdamW
never touches it, weight decay included) and written back unchanged, as task_embedding does with its pooler.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxbert import batching
from jaxbert.seq2seq import EncoderDecoderConfig, encoder_decoder, load_config
from jaxbert.train import task_encode as E
from jaxbert.train import task_plan
from jaxbert.train.config import GENERATED_METRICS, SEQ2SEQ_FIELDS
from jaxbert.train.task_causal_lm import describe_tokens, token_stats
from jaxbert.train.task_init import task_params
from jaxbert.train.task_table import COLUMNS_KEY, TASKS


def encode(tok, rows, columns, labels, max_len: int, lengths: tuple[int, int] | None = None):
    """Every row's source and target checked, then (cache key parts, build): sources cut to lengths[0] tokens and
    targets to lengths[1] (run_summarization.py's max_source_length and max_target_length; both `max_len` unless
    given)."""
    source, _, target = columns
    pairs = [(r.text(source), r.text(target)) for r in rows]
    pad = tok.token_to_id(tok.special_tokens["pad_token"])
    lengths = tuple(lengths or (max_len, max_len))

    def build() -> E.Encodedset:
        sides = [tok.encode([p[i] for p in pairs], None, max_length=n) for i, n in enumerate(lengths)]
        fields = dataclasses.fields(sides[0])
        enc = dataclasses.replace(sides[0], **{f.name: _interleave(sides, f.name) for f in fields})
        # The bert2bert recipe's labels: the target's ids, -100 on [PAD] (nothing to learn there).
        tags = [[E.IGNORE if i % 2 == 0 or t == pad else t for t in ids] for i, ids in enumerate(enc.ids)]
        return E._pack(enc, 2, np.zeros(len(pairs), np.int32), tags)

    return [pairs, *lengths], build


def _interleave(sides, key: str) -> list:
    """Source 0, target 0, source 1, ...: an example's two sequences, consecutive (task_encode's layout)."""
    return [x for pair in zip(*(getattr(side, key) for side in sides)) for x in pair]


def split(batch: dict, source: int, target: int) -> dict:
    """A batch of (source, target) sequences [..., 2, L] (task_encode's layout) as the loss reads it: the sources'
    input_ids and attention_mask [..., source] and the targets' labels [..., target], each side padded to its own
    length, so a short target is not decoded at the source's length. The targets' decoder_attention_mask is not
    read by the loss (EncoderDecoderModel's labels alone: the decoder is causal); the loop counts its tokens."""
    return {
        "input_ids": batch["input_ids"][..., 0, :source],
        "attention_mask": batch["attention_mask"][..., 0, :source],
        "decoder_attention_mask": batch["attention_mask"][..., 1, :target],
        "labels": batch["labels"][..., :target],
    }


def fit(batch: dict, buckets) -> dict:
    """split() of a whole batch at the length buckets ((source's), (target's)) of its longest source and target
    (a validation batch: every process builds it whole)."""
    longest = np.asarray(batch["attention_mask"]).sum(-1).reshape(-1, 2).max(0)  # [source, target]
    return split(batch, *(batching.bucket(int(n), b) for n, b in zip(longest, buckets)))


@dataclasses.dataclass
class Seq2SeqBatches(E.TaskBatches):
    """TaskBatches whose steps pad the sources and the targets each to its own length bucket (`sides`: the
    sources' buckets, the targets'), from the whole step's examples so every process pads alike. `buckets` (those
    of the longer side) pad the validation batches before fit() cuts them."""

    sides: tuple = ((128,), (128,))

    def __call__(self, step: int, rows: slice | None = None) -> dict:
        longest = np.diff(self.blocks.starts).reshape(-1, 2)[self.examples(step)].max(0)
        source, target = (batching.bucket(int(n), b) for n, b in zip(longest, self.sides))
        chosen = self.index(step)[:, slice(None) if rows is None else rows]  # -1: padding rows
        batch = self.blocks.batch(chosen.reshape(-1), chosen.size, max(source, target), self.pad_id)
        return split({k: v.reshape(*chosen.shape, *v.shape[1:]) for k, v in batch.items()}, source, target)


def _forward(params, batch, *, config, rng=None, dtype=jnp.float32, remat=False, smoothing=0.0):
    params = jax.tree_util.tree_map(lambda x: x.astype(dtype), params)
    ids, mask, labels = batch["input_ids"], batch["attention_mask"], batch["labels"]  # split()'s
    return encoder_decoder(params, config, ids, mask, labels=labels, rng=rng, remat=remat, label_smoothing=smoothing)


def train_loss(params, batch, rng, dtype, remat, *, config, smoothing):
    """The step's loss hook: (logits, loss, labels); accuracy counts the target tokens predicted."""
    out = _forward(params, batch, config=config, rng=rng, dtype=dtype, remat=remat, smoothing=smoothing)
    return out.logits, out.loss, batch["labels"]


def eval_step(params, batch, *, config, dtype=jnp.float32, label_smoothing=0.0):
    return token_stats(_forward(params, batch, config=config, dtype=dtype).logits, batch["labels"], label_smoothing)


def generate_all(s2s, data: E.Encodedset, batch_size: int, pad_id: int, **options) -> list[np.ndarray]:
    """The ids `s2s.generate` (options: its own) writes for each example's source as the set holds it (cut as
    the loss reads it, run_summarization.py's predict_with_generate inputs), decoder start token first; sources of
    similar lengths batched together, padded on the right."""
    sources = np.diff(data.starts)[0::2]
    order, out = np.argsort(-sources, kind="stable"), [None] * len(data)
    for first in range(0, len(order), batch_size):
        idx = order[first : first + batch_size]
        ids = np.full((len(idx), int(sources[idx].max())), pad_id, np.int32)
        mask = np.zeros_like(ids)
        for r, e in enumerate(idx):
            a, b = data.starts[2 * e], data.starts[2 * e + 1]
            ids[r, : b - a], mask[r, : b - a] = data.ids[a:b], 1
        for e, row in zip(idx, s2s.generate(ids, mask, num_return_sequences=1, **options), strict=True):
            out[e] = row
    return out


def generation_scores(generated: list, data: E.Encodedset, tok, pad_id: int) -> tuple[dict, list[str]]:
    """(run_summarization.py's compute_metrics, the generated texts): ROUGE of the generated texts against the
    targets as the set holds them (cut, decoded as the script decodes its labels: special tokens skipped), and
    gen_len, the mean count of generated ids that are not padding (the decoder start token and eos counted)."""
    from jaxbert.metrics_text import rouge_scores

    texts = [tok.decode(ids, skip_special_tokens=True) for ids in generated]
    targets = [tok.decode(data.ids[data.starts[2 * e + 1] : data.starts[2 * e + 2]]) for e in range(len(data))]
    gen_len = float(np.mean([np.count_nonzero(np.asarray(ids) != pad_id) for ids in generated]))
    return {**rouge_scores(texts, targets), "gen_len": gen_len}, texts


def warm_started(config, tok) -> EncoderDecoderConfig:
    """A BERT config as from_encoder_decoder_pretrained pairs it, with the token ids the bert2bert recipe sets
    (it sets none itself, and EncoderDecoderModel cannot make decoder inputs without them): start with [CLS],
    pad with [PAD], end with [SEP]."""
    ids = {k: tok.token_to_id(tok.special_tokens[f"{k}_token"]) for k in ("cls", "pad", "sep")}
    return EncoderDecoderConfig(
        encoder=config.replace(is_decoder=False, add_cross_attention=False, architectures=("BertModel",)),
        decoder=config.replace(is_decoder=True, add_cross_attention=True, architectures=("BertLMHeadModel",)),
        decoder_start_token_id=ids["cls"],
        pad_token_id=ids["pad"],
        eos_token_id=ids["sep"],
    )


@dataclasses.dataclass
class Seq2SeqRun(task_plan.TaskRun):
    """task_plan.TaskRun with the bert2bert loss, evaluation and output directory."""

    warm: bool = False  # built from a BERT directory (from_encoder_decoder_pretrained)
    pooler: dict | None = None  # the encoder's, kept out of training
    buckets: tuple = ()  # (the sources' length buckets, the targets')
    val_buckets: tuple = ()  # the validation's (its targets cut at --val-max-target-length)
    generator: object = None  # --predict-with-generate's (task_seq2seq_generated.Generator)

    def initial_params(self):
        if self.warm:
            sides = {}
            for side, head in (("encoder", "BertModel"), ("decoder", "BertLMHeadModel")):
                part = getattr(self.config, side)
                sides[side], notes = task_params(self.cfg.model, part, head, self.cfg.seed, unused=side == "decoder")
                for note in notes:
                    self.say(f"model: {side}: {note}")
        else:
            from jaxbert.checkpoint import load_params

            params, _ = load_params(self.cfg.model, self.config, "EncoderDecoderModel")
            sides = jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), params)
        self.pooler = sides["encoder"].pop("pooler", None)
        return sides

    @property
    def loss_fn(self):
        return functools.partial(train_loss, config=self.config, smoothing=self.cfg.label_smoothing)

    def eval_fn(self, dtype):
        return functools.partial(eval_step, config=self.config, dtype=dtype, label_smoothing=self.cfg.label_smoothing)

    def evaluate(self, params, eval_fn) -> dict:
        result = super().evaluate(params, lambda p, batch: eval_fn(p, fit(batch, self.val_buckets)))
        if self.generator is not None:  # --predict-with-generate: ROUGE and gen_len of the validation's generations
            from jaxbert.train.task_seq2seq_generated import scores

            result.update(scores(self, params))
        return result

    def describe(self, result: dict) -> str:
        found = [f"{k} {result[f'eval_{k}']:.4f}" for k in GENERATED_METRICS if f"eval_{k}" in result]
        return ", ".join([describe_tokens(result), *found])

    def lengths(self) -> dict:
        """The sources' and targets' cut: a resume compares them (the meta), `evaluate` cuts as trained (OUT/final)."""
        return dict(zip(SEQ2SEQ_FIELDS, (n for _, n in self.cfg.seq2seq_lengths())))

    def meta(self) -> dict:
        return {**super().meta(), **self.lengths()}

    def final_config(self):
        source, _, target = (self.cfg.text_column or "source", None, self.cfg.label_column or "target")
        trained = {"text": source, "label": target, **self.lengths()}
        if self.cfg.val_max_target_length is not None:  # the validation's cut: evaluate's default, as the log's
            trained["val_max_target_length"] = self.cfg.val_max_target_length
        return self.config.replace(extra={**self.config.extra, COLUMNS_KEY: trained})

    def write_model(self, params, directory: str) -> None:
        from jaxbert.transfer import write_jaxbert_dir

        if self.pooler is not None:
            params = {**params, "encoder": {**params["encoder"], "pooler": self.pooler}}
        config, head = self.final_config(), "EncoderDecoderModel"
        write_jaxbert_dir(
            params, config, head, directory, tokenizer_from=self.cfg.model, force=True, safetensors=True, sentence=False
        )  # no embedder: SentenceTransformer(OUT) would embed with it


def prepare(cfg) -> Seq2SeqRun:
    from jaxbert.tokenizer import WordPiece

    config = load_config(cfg.model)
    if getattr(config, "is_encoder_decoder", False):
        for key in ("decoder_start_token_id", "pad_token_id"):
            if getattr(config, key) is None:  # EncoderDecoderModel refuses labels without them
                raise ValueError(f"{cfg.model}/config.json: {key} is not set; the decoder inputs are made from it")
    task = TASKS["seq2seq"]
    if cfg.predict_with_generate:  # a missing package named before any work; its scores can choose OUT/best
        from jaxbert.metrics_text import rouge_scorer

        rouge_scorer()
        task = dataclasses.replace(task, metrics=lambda labels: (*TASKS["seq2seq"].metrics(labels), *GENERATED_METRICS))
    base = task_plan.prepare(cfg, task)
    run = Seq2SeqRun(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)})
    run.buckets = tuple(batching.length_buckets(n) for _, n in cfg.seq2seq_lengths())
    run.val_buckets = tuple(batching.length_buckets(n) for _, n in cfg.seq2seq_lengths(validation=True))
    t = run.train
    run.train = Seq2SeqBatches(t.blocks, t.batch_size, t.accum, t.seed, t.buckets, t.pad_id, run.buckets)
    if not getattr(config, "is_encoder_decoder", False):
        run.config, run.warm = warm_started(config, WordPiece.from_dir(cfg.model)), True
        c = run.config
        run.say(
            "model: a bert2bert warm-started from the checkpoint as EncoderDecoderModel.from_encoder_decoder_"
            "pretrained builds it (the decoder with is_decoder and add_cross_attention); decoder_start_token_id "
            f"{c.decoder_start_token_id}, pad_token_id {c.pad_token_id}, eos_token_id {c.eos_token_id} from the "
            "tokenizer's [CLS], [PAD], [SEP]"
        )
    else:
        run.config = config
    if cfg.predict_with_generate:
        from jaxbert.train.task_seq2seq_generated import generator

        run.generator = generator(run, WordPiece.from_dir(cfg.model))
    return run
