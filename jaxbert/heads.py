"""Task heads over the base model (transformers' BertFor* classes) and their losses.

`forward(params, config, head, ...)` is the single entry point: it runs `model.bert` on `params["bert"]` (or on
`params` itself for BertModel), applies the head, and computes the loss when labels are given.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from jaxtyping import Array, Float, Int

from jaxbert.config import BertConfig
from jaxbert.model import BertOutput, bert
from jaxbert.ops import activation, dense, dropout, layer_norm

HEADS = ("BertModel", "BertForPreTraining", "BertForMaskedLM", "BertForNextSentencePrediction",
         "BertForSequenceClassification", "BertForTokenClassification", "BertForQuestionAnswering",
         "BertForMultipleChoice")
ALIASES = {"base": "BertModel", "pretraining": "BertForPreTraining", "mlm": "BertForMaskedLM",
           "nsp": "BertForNextSentencePrediction", "sequence_classification": "BertForSequenceClassification",
           "token_classification": "BertForTokenClassification", "qa": "BertForQuestionAnswering",
           "question_answering": "BertForQuestionAnswering", "multiple_choice": "BertForMultipleChoice"}
# As in transformers: heads that only read token states are built without the pooler.
WITHOUT_POOLER = frozenset({"BertForMaskedLM", "BertForTokenClassification", "BertForQuestionAnswering"})
HEAD_KEYS = ("cls", "classifier", "qa_outputs")


def resolve_head(head: str | None, config: BertConfig) -> str:
    """The canonical head name: `head` (a class name or alias), else config.architectures[0], else BertModel."""
    if head is None:
        head = config.architectures[0] if config.architectures else "BertModel"
    name = ALIASES.get(head, head)
    if name not in HEADS:
        raise ValueError(f"unknown head {head!r}; known: {', '.join(HEADS)} (or {', '.join(ALIASES)})")
    return name


def base_params(params, head: str):
    return params if head == "BertModel" else params["bert"]


# -- losses ---------------------------------------------------------------------------------------------------
def cross_entropy(logits: Float[Array, "... C"], labels: Int[Array, "..."], ignore_index: int = -100,
                  label_smoothing: float = 0.0) -> Float[Array, ""]:
    """Mean integer-label cross-entropy over labels != ignore_index (PyTorch's CrossEntropyLoss semantics)."""
    valid = labels != ignore_index
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    nll = -jnp.take_along_axis(logp, jnp.where(valid, labels, 0)[..., None], axis=-1)[..., 0]
    if label_smoothing:
        nll = (1.0 - label_smoothing) * nll - label_smoothing * logp.mean(-1)
    return jnp.sum(jnp.where(valid, nll, 0.0)) / jnp.maximum(valid.sum(), 1)


def sequence_classification_loss(config: BertConfig, logits: Float[Array, "B C"], labels: Array,
                                 label_smoothing: float = 0.0) -> Float[Array, ""]:
    problem = config.problem_type
    if problem is None:  # transformers infers it from num_labels and the label dtype
        integer = jnp.issubdtype(labels.dtype, jnp.integer)
        problem = ("regression" if config.num_labels == 1 else
                   "single_label_classification" if integer else "multi_label_classification")
    if problem == "regression":
        preds = logits[:, 0] if config.num_labels == 1 else logits
        return jnp.mean(jnp.square(preds.astype(jnp.float32) - labels.reshape(preds.shape)))
    if problem == "single_label_classification":
        return cross_entropy(logits, labels.reshape(-1), label_smoothing=label_smoothing)
    return optax.sigmoid_binary_cross_entropy(logits.astype(jnp.float32), labels.astype(jnp.float32)).mean()


def span_loss(start_logits: Float[Array, "B L"], end_logits: Float[Array, "B L"], start: Int[Array, "B"],
              end: Int[Array, "B"], label_smoothing: float = 0.0) -> Float[Array, ""]:
    """QA loss: positions outside the sequence are clamped to L and ignored, as in transformers."""
    L = start_logits.shape[-1]
    start, end = jnp.clip(start, 0, L), jnp.clip(end, 0, L)
    return (cross_entropy(start_logits, start, L, label_smoothing)
            + cross_entropy(end_logits, end, L, label_smoothing)) / 2


# -- heads ----------------------------------------------------------------------------------------------------
def mlm_logits(p_cls, config: BertConfig, word_embeddings: Float[Array, "V D"],
               x: Float[Array, "... D"]) -> Float[Array, "... V"]:
    """Transform (dense, activation, LayerNorm) then the decoder tied to the word embeddings plus a bias."""
    p = p_cls["predictions"]
    h = activation(config.hidden_act)(dense(p["transform"]["dense"], x))
    h = layer_norm(p["transform"]["LayerNorm"], h, config.layer_norm_eps)
    decoder = p["decoder"]["kernel"] if "decoder" in p else word_embeddings.T
    logits = jnp.dot(h.astype(decoder.dtype), decoder, preferred_element_type=jnp.float32)
    return logits + p["bias"].astype(jnp.float32)


def _classifier_dropout(config: BertConfig) -> float:
    return config.hidden_dropout_prob if config.classifier_dropout is None else config.classifier_dropout


def forward(params, config: BertConfig, head: str, input_ids=None, attention_mask=None, token_type_ids=None,
            position_ids=None, head_mask=None, inputs_embeds=None, output_hidden_states: bool = False,
            output_attentions: bool = False, *, labels=None, next_sentence_label=None, start_positions=None,
            end_positions=None, rng=None, remat: bool = False, label_smoothing: float = 0.0) -> BertOutput:
    """Any head on a batch, with transformers' output fields; the loss is computed when labels are given."""
    head = resolve_head(head, config)
    params = jax.tree_util.tree_map(jnp.asarray, params)
    r_bert, r_head = (None, None) if rng is None else jax.random.split(rng)
    choices = None
    if head == "BertForMultipleChoice":  # [B, C, L] -> [B*C, L]; logits come back as [B, C]
        ref = input_ids if input_ids is not None else inputs_embeds
        choices = ref.shape[1]
        flat = lambda a: None if a is None else a.reshape(-1, *a.shape[2:])  # noqa: E731
        input_ids, attention_mask, token_type_ids, position_ids = map(
            flat, (input_ids, attention_mask, token_type_ids, position_ids))
        inputs_embeds = flat(inputs_embeds)
    out = bert(base_params(params, head), config, input_ids, attention_mask, token_type_ids, position_ids,
               head_mask, inputs_embeds, output_hidden_states, output_attentions, rng=r_bert, remat=remat)
    if head == "BertModel":
        return out
    x, pooled = out.last_hidden_state, out.pooler_output
    word_embeddings = params["bert"]["embeddings"]["word_embeddings"]["embedding"]
    fields, loss = {}, None
    if head in ("BertForMaskedLM", "BertForPreTraining"):
        prediction = mlm_logits(params["cls"], config, word_embeddings, x)
        if labels is not None:
            loss = cross_entropy(prediction, labels, label_smoothing=label_smoothing)
        fields["logits" if head == "BertForMaskedLM" else "prediction_logits"] = prediction
    if head in ("BertForNextSentencePrediction", "BertForPreTraining"):
        relationship = dense(params["cls"]["seq_relationship"], pooled)
        if next_sentence_label is not None:
            nsp = cross_entropy(relationship, next_sentence_label.reshape(-1), label_smoothing=label_smoothing)
            loss = nsp if loss is None else loss + nsp
        fields["logits" if head == "BertForNextSentencePrediction" else "seq_relationship_logits"] = relationship
    if head in ("BertForSequenceClassification", "BertForMultipleChoice"):
        logits = dense(params["classifier"], dropout(pooled, _classifier_dropout(config), r_head))
        if choices is not None:
            logits = logits.reshape(-1, choices)
        if labels is not None:
            loss = (cross_entropy(logits, labels, label_smoothing=label_smoothing) if choices is not None
                    else sequence_classification_loss(config, logits, labels, label_smoothing))
        fields["logits"] = logits
    if head == "BertForTokenClassification":
        fields["logits"] = dense(params["classifier"], dropout(x, _classifier_dropout(config), r_head))
        if labels is not None:
            loss = cross_entropy(fields["logits"], labels, label_smoothing=label_smoothing)
    if head == "BertForQuestionAnswering":
        span = dense(params["qa_outputs"], x)
        if span.shape[-1] != 2:
            raise ValueError(f"BertForQuestionAnswering needs num_labels=2 (start, end), got {span.shape[-1]}")
        fields["start_logits"], fields["end_logits"] = span[..., 0], span[..., 1]
        if start_positions is not None and end_positions is not None:
            loss = span_loss(fields["start_logits"], fields["end_logits"], start_positions, end_positions,
                             label_smoothing)
    return out.replace(pooler_output=None if head in WITHOUT_POOLER else pooled, loss=loss, **fields)
