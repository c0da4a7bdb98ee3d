"""Sentence-embedding training (`jaxbert train --task embedding`): (anchor, positive[, negative_1, ...]) rows
(task_embedding_rows.py), the in-batch-negatives loss of sentence-transformers (MultipleNegativesRankingLoss,
optionally its symmetric form), retrieval metrics on the validation set, and a sentence-transformers directory as
the trained model. Scored (sentence1, sentence2, score) pairs (--loss cosent, cosine-similarity, angle) are
task_scored.py's, in this pipeline.

An example is encoded as consecutive sequences (anchor, positive, its negatives), the multiple-choice layout, so the
batches, buckets, caching and padding rows of task_encode.py serve it unchanged: a batch is [B, C, L].

The loss runs over the whole (global) micro-batch: the step is jitted over arrays sharded along the batch axis,
so the similarity matrix [B, B·(C-1)] is one logical array and GSPMD supplies every device's rows as negatives
(the result is the one-device result; tests/test_train_embedding.py checks it on 4 devices). Padding rows are
neither anchors nor candidates. With --grad-accum-steps A, each micro-batch is its own MNRL batch (its negatives
are its own rows, as sentence-transformers' loss over one batch); the step's gradient is the mean over all anchors.

The pooler takes no part in an embedding: it is left out of training (sentence-transformers gives it no gradient,
so AdamW never touches it, weight decay included) and written back unchanged.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float

from jaxbert import cpu, metrics, sentence_dense
from jaxbert.inputs import Arg, renaming
from jaxbert.model import bert
from jaxbert.pooling import pool
from jaxbert.train import task_encode as E
from jaxbert.train import task_plan, task_scored

# The rows (task_embedding_rows.py): the task table's entry reads encode_pairs and triplet_columns here.
from jaxbert.train.task_embedding_rows import TRIPLET, encode_pairs, given_prompts, triplet_columns  # noqa: F401

SCALE = 20.0  # sentence-transformers' default: cosine similarities × 20 (temperature 0.05)
DENSE = "sentence_dense"  # the Dense modules' parameters beside the base model's: {"0": {kernel, bias}, ...}
DENSE_RNG = 0x5E47  # folded into a step's rng for the Dropout modules, apart from the model's dropout


# -- the loss --------------------------------------------------------------------------------------------------
def _unit(x: Float[Array, "N E"]) -> Float[Array, "N E"]:
    return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)  # torch's F.normalize


def ranking_loss(
    anchors: Float[Array, "B E"],
    docs: Float[Array, "N E"],
    valid: Bool[Array, " B"],
    *,
    scale: float = SCALE,
    symmetric: bool = False,
) -> tuple[Float[Array, "B N"], Float[Array, ""]]:
    """(scores, loss): MultipleNegativesRankingLoss of anchors against `docs` = the positives [B] then each
    negative column [B] (sentence-transformers' order); anchor i's answer is doc i. Rows and candidates of
    padding (valid False) are masked out. `symmetric`: MultipleNegativesSymmetricRankingLoss, the mean of the
    anchor → docs and positive → anchors cross-entropies (one softmax per direction)."""
    B = anchors.shape[0]
    low = jnp.finfo(jnp.float32).min
    scores = scale * (_unit(anchors.astype(jnp.float32)) @ _unit(docs.astype(jnp.float32)).T)
    scores = jnp.where(jnp.tile(valid, docs.shape[0] // B)[None, :], scores, low)
    right = jnp.diagonal(scores[:, :B])
    each = jax.nn.logsumexp(scores, axis=1) - right
    if symmetric:
        back = jnp.where(valid[None, :], scores[:, :B].T, low)
        each = (each + jax.nn.logsumexp(back, axis=1) - right) / 2
    return scores, jnp.sum(jnp.where(valid, each, 0.0)) / jnp.maximum(valid.sum(), 1)


def embed_batch(
    params,
    config,
    batch: dict,
    *,
    pooling: str | tuple[str, ...],
    normalize: bool,
    steps=(),
    rng=None,
    dtype=jnp.float32,
    remat=False,
    skip: tuple[int, ...] = (0,),
):
    """[B, C, E] float32 sentence embeddings of a [B, C, L] batch; rows without tokens (padding) are zeros.
    `steps`: the directory's Dense / Dropout modules after the pooling, the Dense parameters under DENSE in
    `params` (in float32 whatever `dtype`, as sentence-transformers' own Dense in a float32 model). `skip`: the
    first tokens of each column left out of the pooling (their prompts: pooling.keep); the last serves the columns
    beyond it ((anchors, others) in evaluate)."""
    params, layers = split_dense(params)
    params = jax.tree_util.tree_map(lambda x: x.astype(dtype), params)
    ids = batch["input_ids"]
    B, C, L = ids.shape
    flat = lambda a: a.reshape(B * C, L)  # noqa: E731
    mask = flat(batch["attention_mask"])
    out = bert(params, config, flat(ids), mask, flat(batch["token_type_ids"]), rng=rng, remat=remat)
    # Zeroed before normalizing: max pooling of an empty row is -inf, whose gradient would be NaN even unselected.
    skips = jnp.tile(jnp.array([skip[min(c, len(skip) - 1)] for c in range(C)], jnp.int32), B)  # [B * C]
    emb = jnp.where(mask.any(-1)[:, None], pool(out, mask, pooling, False, skips), 0.0)
    if steps:
        emb = sentence_dense.apply(layers, steps, emb, rng=None if rng is None else jax.random.fold_in(rng, DENSE_RNG))
        emb = jnp.where(mask.any(-1)[:, None], emb, 0.0)
    return (_unit(emb) if normalize else emb).reshape(B, C, -1)


def train_loss(
    params, batch, rng, dtype, remat, *, config, pooling, normalize, symmetric, steps=(), skip=(0,), loss="mnrl"
):
    """The step's loss hook (step.train_step's loss_fn): (scores, loss, labels); labels give the in-batch
    accuracy (the anchor's own positive ranked first), none for scored pairs (task_scored.pair_loss)."""
    emb = embed_batch(
        params, config, batch, pooling=pooling, normalize=normalize, steps=steps, rng=rng, dtype=dtype, remat=remat,
        skip=skip,
    )  # fmt: skip
    B, C, D = emb.shape
    valid = batch["sample_weight"] > 0
    if loss != "mnrl":
        sims, value = task_scored.pair_loss(emb[:, 0], emb[:, 1], batch["labels"], valid, loss)
        return sims[:, None], value, jnp.full(B, -100)
    scores, loss = ranking_loss(emb[:, 0], emb[:, 1:].transpose(1, 0, 2).reshape(-1, D), valid, symmetric=symmetric)
    return scores, loss, jnp.where(valid, jnp.arange(B), -100)


# -- validation ------------------------------------------------------------------------------------------------
def score(outputs, data: E.Encodedset, labels, similarity: str = "cosine") -> dict:
    """accuracy@1 and MRR@10 of each anchor against every distinct positive of the set, ranked by the model's
    `similarity` (as sentence-transformers' evaluator ranks), and the loss of the whole set as one batch (each
    anchor against every positive and negative, cosine as the training loss; the forward direction whatever
    --symmetric): independent of the evaluation batch size. The "loss" key replaces evaluate_examples' per-batch
    mean."""
    emb = np.stack(outputs).astype(np.float64)  # [N, C, E]
    anchors, docs = emb[:, 0], emb[:, 1:].transpose(1, 0, 2).reshape(-1, emb.shape[-1])
    unit = lambda x: x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)  # noqa: E731
    s = SCALE * unit(anchors) @ unit(docs).T
    top = s.max(1, keepdims=True)
    loss = float(np.mean(np.log(np.exp(s - top).sum(1)) + top[:, 0] - np.diagonal(s[:, : len(s)])))
    # Positives of the same tokens are one document (SQuAD-style pairs: several questions per passage): each copy
    # tied with the relevant one and counted against it, so a perfect model scored 1/copies.
    C, first, relevant = data.choices, {}, []
    for e in range(len(emb)):
        tokens = data.ids[data.starts[e * C + 1] : data.starts[e * C + 2]].tobytes()
        relevant.append(first.setdefault(tokens, len(first)))
    rows = np.unique(relevant, return_index=True)[1]
    found = metrics.retrieval_metrics(anchors, emb[rows, 1], k=10, relevant=np.array(relevant), similarity=similarity)
    return {"loss": loss, **found}


def eval_step(params, batch, *, config, pooling, normalize, steps=(), dtype=jnp.float32, skip=(0,)):
    """Embeddings per example ([B, C, E]) and a placeholder mean loss (score computes the set's loss)."""
    emb = embed_batch(params, config, batch, pooling=pooling, normalize=normalize, steps=steps, dtype=dtype, skip=skip)
    return emb, jnp.zeros((), jnp.float32)


# The prompt names an unasked side takes: encode_query's, and encode_document's first of document, passage, corpus
# (the first always among a model's prompts).
ROLES = ("query", "document")


def role_name(prompt: str | None, prompt_name: str | None, role: str) -> str | None:
    """The prompt name a side of the retrieval evaluation is read with: none beside a prompt text, else the one
    asked, else its role's (never the default prompt's, as InformationRetrievalEvaluator's encode_query /
    encode_document)."""
    return None if prompt is not None else prompt_name if prompt_name is not None else role


def _side_s(part, side: str):
    """resolve_prompt's prompt_name as the evaluation side's (query_prompt_name: the CLI's --query-prompt-name)."""
    return part._replace(name=f"{side}_prompt_name") if isinstance(part, Arg) and part.name == "prompt_name" else part


def directory_eval(
    directory: str, config, tok, limit: int | None, asked=((None, None), (None, None)), loss: str = "mnrl"
):
    """`jaxbert evaluate --task embedding`: the directory's own pipeline (sentence_dir.py) -> (jitted eval step,
    max length, tokenizer (lower-casing if it does), its score function, the (query, corpus) prompts). `asked`:
    the (prompt, prompt_name) of the queries and of the corpus, each resolved as encode resolves it, as
    sentence-transformers' InformationRetrievalEvaluator passes them to encode_query / encode_document: neither
    given, those name the "query" and "document" prompts (always among a model's prompts, "" unless set), so the
    default prompt applies to neither side. Scored pairs (`loss` other than mnrl) are read as
    EmbeddingSimilarityEvaluator reads both sides, with encode's defaults: the default prompt unless asked."""
    from jaxbert.sentence_dir import embedding_options, prompt_length, read, resolve_prompt

    found = read(directory)
    modes, normalize, length, lower = embedding_options(found, None, None, None)  # every mode embed pools
    # The directory's max_seq_length replaces the tokenizer's own length, as sentence-transformers does.
    limit = min(limit or length or tok.model_max_length, config.max_position_embeddings)
    tok = tok.lowercased() if lower else tok
    roles = ROLES if loss == "mnrl" else (None, None)
    prompts = []
    for side, (p, n), role in zip(("query", "corpus"), asked, roles):  # a name asked for: that side's own
        with renaming(lambda parts, side=side: tuple(_side_s(x, side) for x in parts)):
            prompts.append(resolve_prompt(found, p, role_name(p, n, role)))
    prompts = tuple(prompts)
    include = found is None or found.include_prompt
    skip = (0, 0) if include else tuple(prompt_length(tok, p, limit) for p in prompts)
    steps = found.steps if found else ()
    dense = dense_tree(sentence_dense.load_steps(directory, steps))
    step = functools.partial(eval_step, config=config, pooling=modes, normalize=normalize, steps=steps, skip=skip)
    scorer = with_similarity(found.similarity if found else "cosine", loss)
    with_dense = lambda params, batch: step({**params, **dense}, batch)  # noqa: E731 - the Dense: constants
    return cpu.onednn_jit(with_dense, tokens=cpu.batch_tokens), limit, tok, scorer, prompts


def dense_tree(layers: tuple[dict, ...]) -> dict:
    """The Dense modules' parameters as a subtree of the trained parameters ({} without any)."""
    return {DENSE: {str(i): layer for i, layer in enumerate(layers)}} if layers else {}


def split_dense(params: dict) -> tuple[dict, tuple[dict, ...]]:
    """(the base model's parameters, the Dense modules' in order): dense_tree undone."""
    dense = params.get(DENSE, {})
    return {k: v for k, v in params.items() if k != DENSE}, tuple(dense[str(i)] for i in range(len(dense)))


def with_similarity(similarity: str, loss: str = "mnrl"):
    """The embedding task (task_table) scoring by `similarity`; on scored pairs with a `loss` other than mnrl."""
    from jaxbert.train.task_table import TASKS

    if loss != "mnrl":
        return task_scored.task(loss, similarity)
    return dataclasses.replace(TASKS["embedding"], score=functools.partial(score, similarity=similarity))


# -- the run ---------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class EmbeddingRun(task_plan.TaskRun):
    """task_plan.TaskRun with the embedding loss, evaluation and output directory."""

    pooler: dict | None = None
    steps: tuple = ()  # the model's Dense / Dropout modules, trained with it (pipeline_steps)
    skip: tuple = (0,)  # each column's prompt tokens left out of the pooling (include_prompt false)
    prompts: dict = dataclasses.field(default_factory=dict)  # the trained prompts OUT/final records, by name

    def initial_params(self):
        params = dict(super().initial_params())
        self.pooler = params.pop("pooler", None)
        return {**params, **dense_tree(sentence_dense.load_steps(self.cfg.model, self.steps))}

    @property
    def loss_fn(self):
        c = self.cfg
        return functools.partial(
            train_loss, config=self.config, pooling=c.pooling, normalize=c.normalize, symmetric=c.symmetric,
            steps=self.steps, skip=self.skip, loss=c.loss,
        )  # fmt: skip

    def eval_fn(self, dtype):
        c = self.cfg
        return functools.partial(
            eval_step, config=self.config, pooling=c.pooling, normalize=c.normalize, steps=self.steps, dtype=dtype,
            skip=self.skip,
        )  # fmt: skip

    def final_config(self):
        # The loss and columns trained on (task_table.COLUMNS_KEY, an extra key of config.json, which
        # SentenceTransformer leaves alone): evaluate reads the pairs as trained without --loss.
        from jaxbert.train.task_table import COLUMNS_KEY

        text, pair, label = self.cols[:3]  # evaluate reads the further negatives as triplet_columns reads them
        trained = {"text": text, "pair": pair, "label": label, "loss": self.cfg.loss}
        return self.config.replace(extra={**self.config.extra, COLUMNS_KEY: trained})

    def write_model(self, params, directory: str) -> None:
        from jaxbert.sentence_out import write_sentence_model

        params, layers = split_dense(params)
        params = {**params, **({"pooler": self.pooler} if self.pooler is not None else {})}
        write_sentence_model(
            params,
            self.final_config(),
            directory,
            pooling=self.cfg.pooling,
            normalize=self.cfg.normalize,
            max_seq_length=self.cfg.max_seq_length,
            tokenizer_from=self.cfg.model,
            lower_case=task_plan.embedding_lower_case(self.cfg.model),
            steps=self.steps,
            dense=jax.tree_util.tree_map(np.asarray, layers),
            prompts=self.prompts,
        )


def with_pipeline(cfg):
    """`cfg` with each part of the embedding pipeline it leaves open (None) taken from the model's
    sentence-transformers directory, as sentence-transformers fine-tunes a model in its own pipeline: its pooling,
    normalization and max_seq_length (capped at the positions; where none is set, its tokenizer's length, as
    SentenceTransformer reads a directory it saved itself); from a plain model: mean pooling, not normalized,
    128 tokens. The default was that whatever the model: a CLS-pooled model (bge's kind) was trained and written
    mean-pooled without a word. A pipeline jaxbert cannot train (another pooling, a Dense module, ...) is refused
    unless --pooling says what to train instead. A default prompt is not put before the texts (prepare says so),
    as sentence-transformers' trainer puts only its `prompts` (--prompts)."""
    from jaxbert.sentence_dir import read

    found = read(cfg.model)
    pooling = cfg.pooling
    if pooling is None and found is not None:
        if found.unsupported:
            raise ValueError(f"{found.unsupported}; pass --pooling to train jaxbert's own pipeline instead")
        if len(found.pooling) != 1 or found.pooling[0] not in ("cls", "mean", "max"):
            raise ValueError(
                f"{cfg.model}: pooling {'+'.join(found.pooling)}; --task embedding trains cls, mean or max: pass "
                "--pooling"
            )
        pooling = found.pooling[0]
    length = cfg.max_seq_length or (found and found.max_seq_length)
    if not length and found is not None:  # sentence-transformers 6 saves it as the tokenizer's model_max_length
        length = _tokenizer_length(cfg.model)
    return dataclasses.replace(
        cfg,
        pooling=pooling or "mean",
        normalize=bool(found and found.normalize) if cfg.normalize is None else cfg.normalize,
        max_seq_length=length or 128,
    )


def _tokenizer_length(directory: str) -> int:
    """A sentence-transformers directory's length where sentence_bert_config.json names none (sentence-transformers
    6 writes none there): its tokenizer's model_max_length, at most the model's positions, as SentenceTransformer
    reads it and embed truncates."""
    from jaxbert.config import BertConfig
    from jaxbert.tokenizer import WordPiece

    positions = BertConfig.from_pretrained(directory).max_position_embeddings
    return min(positions, WordPiece.from_dir(directory).model_max_length)


def pipeline_steps(cfg) -> tuple:
    """The Dense and Dropout modules of the model's pipeline, trained with it (sentence-transformers trains every
    module) when the pipeline is the model's own (no --pooling given: that trains jaxbert's own, without them)."""
    from jaxbert.sentence_dir import read

    found = read(cfg.model) if cfg.pooling is None else None
    steps = found.steps if found is not None and not found.unsupported else ()
    late = next((s for s in steps if isinstance(s, sentence_dense.DropoutSpec) and s.after_normalize and s.rate), None)
    if late is not None:
        raise ValueError(f"{cfg.model}: the Dropout at {late.path!r} after Normalize is not trained by jaxbert")
    return steps


def prepare(cfg, steps: tuple = ()) -> EmbeddingRun:
    """The run; `steps` (pipeline_steps of the configuration before with_pipeline) are trained with the model."""
    from jaxbert.sentence_dir import read

    if cfg.label_smoothing:
        raise ValueError(f"--label-smoothing {cfg.label_smoothing}: applies to classes, not to --task embedding")
    found = read(cfg.model)  # its similarity function is kept in the written model (sentence_out), and ranks here
    task = with_similarity(found.similarity if found else "cosine", cfg.loss)
    run = task_plan.prepare(cfg, task)
    fields = {f.name: getattr(run, f.name) for f in dataclasses.fields(run)}
    named = any(c is not None for c in (cfg.text_column, cfg.text_pair_column, cfg.label_column))
    default = task_scored.DEFAULT_PAIR if cfg.loss != "mnrl" else TRIPLET[:2]
    if not named and run.cols[:2] != default:  # read by position (triplet_columns, task_scored.pair_columns)
        read = ", ".join(repr(c) for c in run.cols[: 2 if cfg.loss != "mnrl" else None] if c)
        run.say(f"data: the texts are columns {read}, by position (no {default[0]}, {default[1]})")
    elif cfg.loss == "mnrl" and len(run.cols) > 3:  # further negatives beside named columns (triplet_columns)
        read = ", ".join(map(repr, run.cols[2:]))
        run.say(f"data: the negatives are columns {read}, every column after the anchor and the positive")
    skip, recorded = _prompt_tokens(cfg, found, run.say, run.cols)
    return EmbeddingRun(**fields | {"task": task, "steps": steps, "skip": skip, "prompts": recorded})


def _prompt_tokens(cfg, found, say, cols) -> tuple[tuple[int, ...], dict]:
    """(each column's prompt tokens the pooling leaves out: sentence-transformers' prompt_length when the Pooling
    has include_prompt false, else none; the prompts OUT/final records: the anchors' as "query" and the positives'
    as "document", the names encode_query / encode_document and its retrieval evaluator read)."""
    from jaxbert.sentence_dir import prompt_length
    from jaxbert.tokenizer import WordPiece

    default = dict(found.prompts).get(found.default_prompt_name) if found and found.default_prompt_name else None
    if default and not found.unsupported:
        say(
            f"model: {found.prompts_path}: the default prompt {found.default_prompt_name!r} is not put before the "
            "training texts, as sentence-transformers' trainer puts only --prompts; OUT/final keeps it"
        )
    if cfg.prompts is None:
        return (0,), {}
    per = given_prompts(cfg.prompts, cols[:2] if cfg.loss != "mnrl" else cols)  # a score column has no prompt
    recorded = {name: p for name, p in zip(("query", "document"), per) if p}
    if found is None or found.include_prompt:
        return (0,), recorded
    tok = WordPiece.from_dir(cfg.model)
    tok = tok.lowercased() if task_plan.embedding_lower_case(cfg.model) else tok
    return tuple(prompt_length(tok, p, cfg.max_seq_length) for p in per), recorded
