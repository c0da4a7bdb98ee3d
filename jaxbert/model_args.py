"""What `model.bert` takes and returns: its arguments checked and shaped per row (input_ids or inputs_embeds, the
per-token arrays broadcast to [B, width], the head mask as [N, H] and each layer's row of it), and `BertOutput`,
its outputs under transformers' field names. Each wrong argument is a ValueError naming it, before anything is
traced (JAX's own errors name neither argument nor shape).
"""

from __future__ import annotations

import flax.struct
import jax.numpy as jnp
from jaxtyping import Array, Float

from jaxbert.cache import KVCache
from jaxbert.config import BertConfig


@flax.struct.dataclass
class BertOutput:
    """Model outputs under transformers' field names; fields a head does not produce stay None."""

    last_hidden_state: Array | None = None
    pooler_output: Array | None = None
    hidden_states: tuple[Array, ...] | None = None
    attentions: tuple[Array, ...] | None = None
    logits: Array | None = None
    prediction_logits: Array | None = None
    seq_relationship_logits: Array | None = None
    start_logits: Array | None = None
    end_logits: Array | None = None
    loss: Array | None = None
    cross_attentions: tuple[Array, ...] | None = None
    past_key_values: KVCache | None = None

    def to_dict(self) -> dict:
        return {k: v for k, v in vars(self).items() if v is not None}

    def __getitem__(self, key: str):
        return getattr(self, key)


def layer_head_mask(config: BertConfig, head_mask: Float[Array, " H"] | None, i: int):
    """Layer i's self-attention head-mask entries for its remaining heads, of its row `head_mask` (which indexes
    the original heads). Cross-attention is never pruned (as in transformers) and takes the whole row."""
    if head_mask is None or not config.pruned_heads:  # unpruned: also when i is traced (the scan)
        return head_mask
    return head_mask[jnp.asarray(config.kept_heads(i), dtype=jnp.int32)]


def normalize_head_mask(config: BertConfig, head_mask) -> Float[Array, "N H"] | None:
    """transformers accepts [H] (same for every layer) or [N, H]."""
    if head_mask is None:
        return None
    head_mask = jnp.asarray(head_mask, dtype=jnp.float32)
    shape = (config.num_hidden_layers, config.num_attention_heads)
    if head_mask.shape == shape[1:]:
        head_mask = jnp.broadcast_to(head_mask, shape)
    if head_mask.shape != shape:
        raise ValueError(f"head_mask shape {head_mask.shape}: expected ({shape[1]},) or {shape}")
    return head_mask


def _check_decoder_inputs(config: BertConfig, encoder_hidden_states, past_key_values, use_cache: bool):
    if encoder_hidden_states is not None and not config.add_cross_attention:
        raise ValueError(
            "encoder_hidden_states given, but this model has no cross-attention (config.add_cross_attention is false)"
        )
    if (past_key_values is not None or use_cache) and not config.is_decoder:
        raise ValueError("past_key_values / use_cache need a decoder (config.is_decoder is false)")


def _batch_shape(input_ids, inputs_embeds, config: BertConfig) -> tuple[int, int]:
    """(B, L) of input_ids [B, L] or inputs_embeds [B, L, D], or a ValueError naming the one of another shape (JAX's
    own errors name neither)."""
    name, given, want = "input_ids", input_ids, 2
    if inputs_embeds is not None:
        name, given, want = "inputs_embeds", inputs_embeds, 3
    shape = jnp.shape(given)
    if len(shape) != want or (want == 3 and shape[2] != config.hidden_size):
        layout = "[batch, length]" if want == 2 else f"[batch, length, hidden_size={config.hidden_size}]"
        raise ValueError(f"{name} shape {shape}: expected {layout}")
    return shape[0], shape[1]


def _per_token(name: str, a, B: int, L: int, past: bool = False) -> Array:
    """`a` as [B, width] for B rows of L tokens: width L, or (a mask with a cache, covering past tokens too) more.
    [width] and [1, width] are broadcast over the batch, as transformers broadcasts them. Any other shape is a
    ValueError naming it: a wider mask's last L columns would otherwise be used silently."""
    a = jnp.asarray(a)
    rows_fit = a.ndim == 1 or (a.ndim == 2 and a.shape[0] in (1, B))
    if not (rows_fit and (a.shape[-1] == L or (past and a.shape[-1] > L))):
        width = "at least L" if past else "L"
        raise ValueError(f"{name} shape {a.shape}: expected [batch, {width}] = ({B}, {L}) as input_ids")
    return jnp.broadcast_to(a, (B, a.shape[-1]))


def _check_call(params, config: BertConfig, input_ids, inputs_embeds, segment_ids, past_key_values, use_cache, states):
    """The arguments of `bert` that no shape is needed to refuse (`states`: encoder_hidden_states)."""
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError("pass exactly one of input_ids and inputs_embeds")
    if segment_ids is not None and (past_key_values is not None or use_cache):
        raise ValueError("segment_ids (packed sequences) cannot be combined with a cache")
    _check_decoder_inputs(config, states, past_key_values, use_cache)
    if "embeddings" not in params:  # else a bare KeyError
        hint = " (a head model's base model is its params['bert'])" if "bert" in params else ""
        raise ValueError(f"params have no 'embeddings' for the base model: top-level keys {sorted(params)}{hint}")


def _check_length(config: BertConfig, L: int, default_positions: bool) -> None:
    """Refuses L tokens that the position embeddings cannot take: always with relative positions, and with
    `default_positions` (0 … L-1: no cache and no position_ids given) otherwise."""
    if config.position_embedding_type != "absolute" and L > config.max_position_embeddings:
        # Distances beyond the table would be gathered from its clamped or wrapped-around rows (transformers:
        # IndexError), whatever position_ids say: relative attention never reads them.
        raise ValueError(
            f"sequence length {L} exceeds max_position_embeddings {config.max_position_embeddings} "
            f"({config.position_embedding_type} embeds distances up to {config.max_position_embeddings - 1})"
        )
    if default_positions and L > config.max_position_embeddings:
        # JAX's gather would give positions past the table its last row (transformers: IndexError). Explicit
        # position_ids (packed rows restart them) are the caller's to keep in range.
        raise ValueError(
            f"sequence length {L} exceeds max_position_embeddings {config.max_position_embeddings} "
            "(the default position ids run 0 … L-1)"
        )


def _per_row(
    B: int,
    L: int,
    cache: KVCache | None,
    attention_mask,
    token_type_ids,
    position_ids,
    encoder_hidden_states,
    encoder_attention_mask,
) -> tuple[Array, Array, Array, Array | None]:
    """`bert`'s (mask [B, L], token types [B, L], positions [B, L], encoder mask [B, S] or None) for B rows of L
    tokens: the defaults for those not given (every token, type 0, positions from the cache's length on)."""
    mask = jnp.ones((B, L), bool)
    if attention_mask is not None:
        mask = _per_token("attention_mask", attention_mask, B, L, cache is not None).astype(bool)[:, -L:]
    types = (
        jnp.zeros((B, L), jnp.int32) if token_type_ids is None else _per_token("token_type_ids", token_type_ids, B, L)
    )
    start = jnp.zeros((B,), jnp.int32) if cache is None else cache.index
    positions = (
        start[:, None] + jnp.arange(L) if position_ids is None else _per_token("position_ids", position_ids, B, L)
    )
    encoder_mask = None
    if encoder_hidden_states is not None:
        S = encoder_hidden_states.shape[1]
        encoder_mask = (
            jnp.ones((B, S), bool)
            if encoder_attention_mask is None
            else jnp.asarray(encoder_attention_mask).astype(bool)
        )
    return mask, types, positions, encoder_mask
