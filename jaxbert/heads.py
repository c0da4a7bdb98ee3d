"""Task heads over the base model (transformers' BertFor* classes), declared once in the `TABLE`.

Each `Head` says whether its base model has the pooler, the parameters it adds beside `bert` (as (shape, init)
specs), how it turns the base model's output into its output fields and loss, and which fields those are.
Initialization, conversion, `forward` and `convert --verify` all read the table.

`forward(params, config, head, ...)` is the single entry point: it runs `model.bert` on `params["bert"]` (or on
`params` itself for BertModel), applies the head, and computes the loss when labels are given.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from jaxbert.config import BertConfig
from jaxbert.losses import causal_lm_loss, cross_entropy, sequence_classification_loss, span_loss
from jaxbert.model import BertOutput, bert
from jaxbert.ops import activation, dense, dense_spec, dropout, layer_norm, matmul, norm_spec


@dataclasses.dataclass(frozen=True)
class Head:
    name: str
    pooler: bool  # transformers builds heads that only read token states without the pooler
    spec: Callable[[BertConfig], dict]  # parameters beside "bert": {"cls" | "classifier" | "qa_outputs": ...}
    apply: Callable | None  # (params, config, out, targets, rng, label_smoothing) -> (fields, loss)
    fields: tuple[str, ...]  # the outputs it adds to the base model's
    choices: bool = False  # inputs [B, C, L], flattened to [B*C, L] for the base model


# -- the heads' computations --------------------------------------------------------------------------------------
def mlm_logits(
    p_cls, config: BertConfig, word_embeddings: Float[Array, "V D"], x: Float[Array, "... D"]
) -> Float[Array, "... V"]:
    """Transform (dense, activation, LayerNorm) then the decoder tied to the word embeddings plus a bias."""
    p = p_cls["predictions"]
    h = activation(config.hidden_act)(dense(p["transform"]["dense"], x))
    h = layer_norm(p["transform"]["LayerNorm"], h, config.layer_norm_eps)
    # The tied decoder contracts the embeddings' D axis in place: written as `jnp.dot(h, embeddings.T)`, XLA:CPU
    # fuses the bias add into a slow one-row product (bert-base, one position: 88 ms instead of 5).
    decoder, axis = (p["decoder"]["kernel"], 0) if "decoder" in p else (word_embeddings, 1)
    return matmul(h, decoder, axis) + p["bias"].astype(jnp.float32)


def _classifier_dropout(config: BertConfig) -> float:
    return config.hidden_dropout_prob if config.classifier_dropout is None else config.classifier_dropout


def _predictions(params, config, out):
    return mlm_logits(
        params["cls"], config, params["bert"]["embeddings"]["word_embeddings"]["embedding"], out.last_hidden_state
    )


def _masked_lm(params, config, out, targets, rng, smoothing):
    logits = _predictions(params, config, out)
    labels = targets.get("labels")
    return {"logits": logits}, None if labels is None else cross_entropy(logits, labels, label_smoothing=smoothing)


def _causal_lm(params, config, out, targets, rng, smoothing):
    logits = _predictions(params, config, out)
    labels = targets.get("labels")
    return {"logits": logits}, None if labels is None else causal_lm_loss(logits, labels, smoothing)


def _next_sentence(params, config, out, targets, rng, smoothing):
    logits = dense(params["cls"]["seq_relationship"], out.pooler_output)
    label = targets.get("next_sentence_label")
    loss = None if label is None else cross_entropy(logits, label.reshape(-1), label_smoothing=smoothing)
    return {"logits": logits}, loss


def _pretraining(params, config, out, targets, rng, smoothing):
    (mlm, mlm_loss), (nsp, nsp_loss) = (
        _masked_lm(params, config, out, targets, rng, smoothing),
        _next_sentence(params, config, out, targets, rng, smoothing),
    )
    losses = [x for x in (mlm_loss, nsp_loss) if x is not None]
    return (
        {"prediction_logits": mlm["logits"], "seq_relationship_logits": nsp["logits"]},
        sum(losses) if losses else None,
    )


def _sequence_classification(params, config, out, targets, rng, smoothing):
    logits = dense(params["classifier"], dropout(out.pooler_output, _classifier_dropout(config), rng))
    labels = targets.get("labels")
    loss = (
        None
        if labels is None
        else sequence_classification_loss(config, logits, labels, smoothing, targets.get("sample_weight"))
    )
    return {"logits": logits}, loss


def _multiple_choice(params, config, out, targets, rng, smoothing):
    logits = dense(params["classifier"], dropout(out.pooler_output, _classifier_dropout(config), rng))
    logits = logits.reshape(-1, targets["choices"])
    present = targets.get("choice_mask")
    if present is not None:  # an example's absent options are never chosen
        logits = jnp.where(present, logits, jnp.finfo(logits.dtype).min)
    labels = targets.get("labels")
    loss = None if labels is None else cross_entropy(logits, labels, label_smoothing=smoothing, classes=present)
    return {"logits": logits}, loss


def _token_classification(params, config, out, targets, rng, smoothing):
    logits = dense(params["classifier"], dropout(out.last_hidden_state, _classifier_dropout(config), rng))
    labels = targets.get("labels")
    return {"logits": logits}, None if labels is None else cross_entropy(logits, labels, label_smoothing=smoothing)


def _question_answering(params, config, out, targets, rng, smoothing):
    span = dense(params["qa_outputs"], out.last_hidden_state)
    if span.shape[-1] != 2:
        raise ValueError(f"BertForQuestionAnswering needs num_labels=2 (start, end), got {span.shape[-1]}")
    start, end = span[..., 0], span[..., 1]
    loss = None
    if targets.get("start_positions") is not None and targets.get("end_positions") is not None:
        loss = span_loss(start, end, targets["start_positions"], targets["end_positions"], smoothing)
    return {"start_logits": start, "end_logits": end}, loss


# -- the table ------------------------------------------------------------------------------------------------------
def _mlm_spec(config: BertConfig) -> dict:
    D, V = config.hidden_size, config.vocab_size
    spec = {"transform": {"dense": dense_spec(D, D), "LayerNorm": norm_spec(D)}, "bias": ((V,), "zeros")}
    if not config.tie_word_embeddings:
        spec["decoder"] = {"kernel": ((D, V), "normal")}
    return spec


_TABLE = (
    Head("BertModel", True, lambda c: {}, None, ()),
    Head(
        "BertForPreTraining",
        True,
        lambda c: {"cls": {"predictions": _mlm_spec(c), "seq_relationship": dense_spec(c.hidden_size, 2)}},
        _pretraining,
        ("prediction_logits", "seq_relationship_logits"),
    ),
    Head("BertForMaskedLM", False, lambda c: {"cls": {"predictions": _mlm_spec(c)}}, _masked_lm, ("logits",)),
    Head(
        "BertForNextSentencePrediction",
        True,
        lambda c: {"cls": {"seq_relationship": dense_spec(c.hidden_size, 2)}},
        _next_sentence,
        ("logits",),
    ),
    Head(
        "BertForSequenceClassification",
        True,
        lambda c: {"classifier": dense_spec(c.hidden_size, c.num_labels)},
        _sequence_classification,
        ("logits",),
    ),
    Head(
        "BertForTokenClassification",
        False,
        lambda c: {"classifier": dense_spec(c.hidden_size, c.num_labels)},
        _token_classification,
        ("logits",),
    ),
    # transformers sizes qa_outputs by num_labels (2 in practice)
    Head(
        "BertForQuestionAnswering",
        False,
        lambda c: {"qa_outputs": dense_spec(c.hidden_size, c.num_labels)},
        _question_answering,
        ("start_logits", "end_logits"),
    ),
    Head(
        "BertForMultipleChoice",
        True,
        lambda c: {"classifier": dense_spec(c.hidden_size, 1)},
        _multiple_choice,
        ("logits",),
        choices=True,
    ),
    Head("BertLMHeadModel", False, lambda c: {"cls": {"predictions": _mlm_spec(c)}}, _causal_lm, ("logits",)),
)
TABLE: dict[str, Head] = {h.name: h for h in _TABLE}
HEADS = tuple(TABLE)
ALIASES = {
    "base": "BertModel",
    "pretraining": "BertForPreTraining",
    "mlm": "BertForMaskedLM",
    "nsp": "BertForNextSentencePrediction",
    "sequence_classification": "BertForSequenceClassification",
    "token_classification": "BertForTokenClassification",
    "qa": "BertForQuestionAnswering",
    "question_answering": "BertForQuestionAnswering",
    "multiple_choice": "BertForMultipleChoice",
    "causal_lm": "BertLMHeadModel",
    "BertForCausalLM": "BertLMHeadModel",
}
BASE_FIELDS = ("last_hidden_state", "pooler_output")


def resolve_head(head: str | None, config: BertConfig) -> str:
    """The canonical head name: `head` (a class name or alias), else config.architectures[0], else BertModel.
    A bert2bert config (seq2seq.EncoderDecoderConfig) has the one architecture EncoderDecoderModel."""
    if getattr(config, "is_encoder_decoder", False):
        if head not in (None, "EncoderDecoderModel"):
            raise ValueError(f"head {head!r}: an encoder-decoder checkpoint is EncoderDecoderModel")
        return "EncoderDecoderModel"
    if head is None:
        head = config.architectures[0] if config.architectures else "BertModel"
    name = ALIASES.get(head, head)
    if name not in HEADS:
        raise ValueError(f"unknown head {head!r}; known: {', '.join(HEADS)} (or {', '.join(ALIASES)})")
    return name


def check_tree(params, config: BertConfig, spec: Head) -> None:
    """A ValueError naming the top-level key of the head's tree that `params` lacks (a tree of another head),
    where indexing it would raise a bare KeyError. BertModel's tree is model.bert's to check."""
    wanted = () if spec.name == "BertModel" else ("bert", *spec.spec(config))
    missing = [k for k in wanted if k not in params]
    if missing:
        raise ValueError(f"params have no {missing[0]!r} for {spec.name}: top-level keys {sorted(params)}")


def base_params(params, head: str):
    return params if head == "BertModel" else params["bert"]


def forward(
    params,
    config: BertConfig,
    head: str,
    input_ids=None,
    attention_mask=None,
    token_type_ids=None,
    position_ids=None,
    head_mask=None,
    inputs_embeds=None,
    output_hidden_states: bool = False,
    output_attentions: bool = False,
    *,
    labels=None,
    next_sentence_label=None,
    start_positions=None,
    end_positions=None,
    encoder_hidden_states=None,
    encoder_attention_mask=None,
    past_key_values=None,
    use_cache: bool = False,
    decoder_input_ids=None,
    decoder_attention_mask=None,
    rng=None,
    remat: bool = False,
    label_smoothing: float = 0.0,
    sample_weight=None,
    segment_ids=None,
    segment_starts=None,
    attention_dtype: str | None = None,
    choice_mask=None,
) -> BertOutput:
    """Any head on a batch, with transformers' output fields; the loss is computed when labels are given.
    Decoders take `encoder_hidden_states`, `encoder_attention_mask`, `past_key_values` and `use_cache` as
    `model.bert` does (BertLMHeadModel's loss predicts token t+1 from tokens ≤ t, as transformers').
    `sample_weight` [B] (0 for padding rows) keeps padding rows out of a regression / multi-label loss (integer
    labels use -100 for that). A bert2bert
    (head EncoderDecoderModel) runs `seq2seq.encoder_decoder`: `decoder_input_ids`, or `labels` shifted right.

    Packed rows (packing.py): `segment_ids` [B, L] keep each sequence's attention within itself, and with
    `segment_starts` [B, S] (each sequence's first column) the pooler runs per sequence, so pooled heads give
    [B, S, ...] (sequence classification logits [B, S, C]); per-token heads are unchanged. `attention_dtype`: see
    model.bert. Multiple choice over examples with different numbers of options: pad each to the batch's most
    options and pass `choice_mask` [B, C] (False for a padding option): those options get logit finfo.min, so the
    softmax, the loss (label smoothing included) and the argmax are each example's own."""
    head = resolve_head(head, config)
    if head == "EncoderDecoderModel":
        from jaxbert.seq2seq import encoder_decoder

        return encoder_decoder(
            params,
            config,
            input_ids,
            attention_mask,
            decoder_input_ids,
            decoder_attention_mask,
            labels=labels,
            token_type_ids=token_type_ids,
            output_hidden_states=output_hidden_states,
            output_attentions=output_attentions,
            past_key_values=past_key_values,
            use_cache=use_cache,
            rng=rng,
            remat=remat,
            label_smoothing=label_smoothing,
        )
    if decoder_input_ids is not None:
        raise ValueError(f"decoder_input_ids: {head} is not an encoder-decoder model")
    spec = TABLE[head]
    check_tree(params, config, spec)
    params = jax.tree_util.tree_map(jnp.asarray, params)
    r_bert, r_head = (None, None) if rng is None else jax.random.split(rng)
    targets = {
        "labels": labels,
        "next_sentence_label": next_sentence_label,
        "start_positions": start_positions,
        "end_positions": end_positions,
        "sample_weight": sample_weight,
        "choice_mask": choice_mask,
    }
    if choice_mask is not None and not spec.choices:
        raise ValueError(f"choice_mask: {head} is not a multiple-choice head")
    if spec.choices:  # [B, C, L] -> [B*C, L]; the head gives logits [B, C] back
        targets["choices"] = (input_ids if input_ids is not None else inputs_embeds).shape[1]
        flat = lambda a: None if a is None else a.reshape(-1, *a.shape[2:])  # noqa: E731
        input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds = map(
            flat, (input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds)
        )
    out = bert(
        base_params(params, spec.name),
        config,
        input_ids,
        attention_mask,
        token_type_ids,
        position_ids,
        head_mask,
        inputs_embeds,
        output_hidden_states,
        output_attentions,
        rng=r_bert,
        remat=remat,
        encoder_hidden_states=encoder_hidden_states,
        encoder_attention_mask=encoder_attention_mask,
        past_key_values=past_key_values,
        use_cache=use_cache,
        segment_ids=segment_ids,
        attention_dtype=attention_dtype,
    )
    if segment_starts is not None:
        first = jnp.take_along_axis(out.last_hidden_state, segment_starts[..., None], axis=1)
        pooler = base_params(params, spec.name).get("pooler")
        out = out.replace(pooler_output=None if pooler is None else jnp.tanh(dense(pooler["dense"], first)))
    if spec.apply is None:
        return out
    fields, loss = spec.apply(params, config, out, targets, r_head, label_smoothing)
    return out.replace(pooler_output=out.pooler_output if spec.pooler else None, loss=loss, **fields)
