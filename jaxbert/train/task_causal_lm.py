"""Causal language modelling (`jaxbert train --task causal-lm`): each text (a line of a .txt file, or the text
column of .jsonl / .csv / .tsv rows) is one sequence, [CLS] text [SEP] as the tokenizer encodes it, cut to
--max-seq-length; the model is a BertLMHeadModel, or a BERT checkpoint made one as
`BertLMHeadModel.from_pretrained(DIR, is_decoder=True)` makes it (its MLM head kept, else a new one; what it lacks
or has no place for named on a "model:" line, where transformers warns); the loss is transformers' shifted
next-token cross-entropy; validation reports loss, perplexity and next-token accuracy.

A sequence's labels are its token ids with -100 on its first token (transformers' shift drops it: nothing predicts
it) and on [PAD] (DataCollatorForLanguageModeling(mlm=False)'s rule). So step._items counts exactly the predicted
tokens (accumulated micro-batches weigh right), and packing is exact: texts packed into one row attend causally
within themselves (segment_ids), their positions restart, and a text's last token predicts nothing of the next
(whose first label is -100), so the loss is the padded batch's. The written model also holds model.safetensors:
transformers' AutoModelForCausalLM reads it as it is.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from jaxbert.losses import token_losses
from jaxbert.train import task_encode as E
from jaxbert.train import task_plan
from jaxbert.train.task_init import task_params

HEAD = "BertLMHeadModel"


def encode(tok, rows, columns, labels, max_len: int):
    """Every row's text checked, then (cache key parts, build): ids, and the labels described above as the set's
    per-token `tags`."""
    texts = [r.text(columns[0]) for r in rows]
    pad = tok.token_to_id(tok.special_tokens["pad_token"])

    def build() -> E.Encodedset:
        enc = tok.encode(texts, None, max_length=max_len)
        tags = [[E.IGNORE, *(E.IGNORE if t == pad else t for t in ids[1:])] for ids in enc.ids]
        return E._pack(enc, 1, np.zeros(0, np.int32), tags)

    return [texts], build


def _forward(params, batch, *, config, rng=None, dtype=jnp.float32, remat=False, smoothing=0.0):
    from jaxbert.train.step import task_forward

    return task_forward(params, config, HEAD, batch, rng=rng, dtype=dtype, remat=remat, label_smoothing=smoothing)


def train_loss(params, batch, rng, dtype, remat, *, config, smoothing):
    """The step's loss hook: (logits, loss, labels) shifted so that accuracy compares each prediction with the
    token after it."""
    out = _forward(params, batch, config=config, rng=rng, dtype=dtype, remat=remat, smoothing=smoothing)
    return out.logits[:, :-1], out.loss, batch["labels"][:, 1:]


def eval_step(params, batch, *, config, dtype=jnp.float32, label_smoothing=0.0):
    """token_stats of the next-token predictions."""
    logits = _forward(params, {k: v for k, v in batch.items() if k != "labels"}, config=config, dtype=dtype).logits
    return token_stats(logits[:, :-1], batch["labels"][:, 1:], label_smoothing)


def describe_tokens(result: dict) -> str:
    """A validation's log line for the next-token tasks (causal-lm, seq2seq: score's metrics)."""
    return (
        f"validation loss {result['eval_loss']:.4f}, perplexity {result['eval_perplexity']:.2f}, "
        f"accuracy {result['eval_accuracy']:.3f}"
    )


def token_stats(logits, labels, label_smoothing=0.0):
    """([B, 3] per row: summed negative log-likelihood, correct predictions, predicted tokens), the batch's mean
    loss. Per row, not the [B, L, V] logits, which evaluate_examples would keep for the whole validation set.
    The loss is smoothed as training's under --label-smoothing: Trainer's evaluation (run_clm's eval_loss and
    perplexity) goes through the same LabelSmoother; `jaxbert evaluate` gives the plain loss."""
    logits = logits.astype(jnp.float32)
    valid = labels != E.IGNORE
    nll = token_losses(logits, labels, E.IGNORE, label_smoothing).sum(-1)
    correct, count = ((logits.argmax(-1) == labels) & valid).sum(-1), valid.sum(-1)
    stats = jnp.stack([nll, correct.astype(jnp.float32), count.astype(jnp.float32)], -1)
    return stats, nll.sum() / jnp.maximum(count.sum(), 1)


def score(outputs, data: E.Encodedset, labels) -> dict:
    """The mean loss over every predicted token of the set (replacing evaluate_examples' per-batch means), its
    perplexity (inf beyond float range, run_clm's rule) and next-token accuracy."""
    nll, correct, count = np.stack(outputs).astype(np.float64).sum(0)
    loss = nll / max(count, 1)
    perplexity = math.exp(loss) if loss < 709 else math.inf
    return {"loss": loss, "perplexity": perplexity, "accuracy": correct / max(count, 1)}


@dataclasses.dataclass
class CausalLMRun(task_plan.TaskRun):
    """task_plan.TaskRun with the next-token loss and evaluation; OUT/final also a transformers checkpoint."""

    # A decoder with cross-attention (add_cross_attention) runs none without encoder states: PyTorch gives those
    # weights no gradient, so AdamW never touches them (weight decay included). Kept out of training, written back.
    idle: dict = dataclasses.field(default_factory=dict)

    def initial_params(self):
        params, notes = task_params(self.cfg.model, self.config, HEAD, self.cfg.seed, unused=True)
        for note in notes:
            self.say(f"model: {note}")
        flat = traverse_util.flatten_dict(params)
        self.idle = {path: x for path, x in flat.items() if "crossattention" in path}
        return traverse_util.unflatten_dict({path: x for path, x in flat.items() if path not in self.idle})

    @property
    def loss_fn(self):
        return functools.partial(train_loss, config=self.config, smoothing=self.cfg.label_smoothing)

    def eval_fn(self, dtype):
        return functools.partial(eval_step, config=self.config, dtype=dtype, label_smoothing=self.cfg.label_smoothing)

    describe = staticmethod(describe_tokens)

    def write_model(self, params, directory: str) -> None:
        from jaxbert.transfer import write_jaxbert_dir

        config = self.final_config()
        params = traverse_util.unflatten_dict({**traverse_util.flatten_dict(params), **self.idle})
        write_jaxbert_dir(
            params, config, HEAD, directory, tokenizer_from=self.cfg.model, force=True, safetensors=True, sentence=False
        )  # no embedder: SentenceTransformer(OUT) would embed with it


def prepare(cfg) -> CausalLMRun:
    base = task_plan.prepare(cfg)
    run = CausalLMRun(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)})
    if not run.config.is_decoder:
        run.say(
            f"model: the checkpoint is no decoder (is_decoder false): trained as a {HEAD} with is_decoder true, "
            "each token attending to the tokens before it, as BertLMHeadModel.from_pretrained(DIR, is_decoder=True)"
        )
    run.config = run.config.replace(is_decoder=True)
    return run
