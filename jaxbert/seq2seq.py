"""bert2bert: transformers' EncoderDecoderModel with BERT on both sides, as pure functions.

The encoder is a BertModel, the decoder a BertLMHeadModel (causal, with cross-attention over the encoder's
states); when their hidden sizes differ, `enc_to_dec_proj` maps the encoder's states to the decoder's width.
Parameters: {"encoder": BertModel tree, "decoder": {"bert", "cls"}, ["enc_to_dec_proj"]}, the tree transformers
4.x's FlaxEncoderDecoderModel used; PyTorch names are the same paths joined by dots (`encoder.…`, `decoder.…`).
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int

from jaxbert.config import BertConfig, is_class_list
from jaxbert.files import existing_file, read_json
from jaxbert.ops import dense, dense_spec

ARCHITECTURE = "EncoderDecoderModel"
_TOP_KEYS = ("decoder_start_token_id", "pad_token_id", "eos_token_id", "bos_token_id")


@dataclasses.dataclass(frozen=True)
class EncoderDecoderConfig:
    encoder: BertConfig
    decoder: BertConfig
    decoder_start_token_id: int | None = None
    pad_token_id: int | None = None
    eos_token_id: int | None = None
    bos_token_id: int | None = None
    architectures: tuple[str, ...] | None = (ARCHITECTURE,)
    extra: dict[str, Any] | None = None
    is_encoder_decoder = True  # class attribute: what callers dispatch on
    model_type = "encoder-decoder"

    def __post_init__(self):
        object.__setattr__(self, "extra", dict(self.extra or {}))
        if self.architectures is not None:  # a string was written back as its letters: "E", "n", "c", ...
            if not is_class_list(self.architectures):
                why = "must be a list of class names"
                raise ValueError(f"EncoderDecoderConfig.architectures={self.architectures!r}: {why}")
            object.__setattr__(self, "architectures", tuple(self.architectures))
        if not (self.decoder.is_decoder and self.decoder.add_cross_attention):
            raise ValueError("EncoderDecoderConfig.decoder: needs is_decoder=true and add_cross_attention=true")
        cross = self.decoder.extra.get("cross_attention_hidden_size")
        if cross is not None and cross != self.decoder.hidden_size:
            raise ValueError(
                f"EncoderDecoderConfig.decoder.cross_attention_hidden_size={cross!r}: only the "
                "decoder's own hidden size is supported"
            )
        if self.extra.get("tie_encoder_decoder"):
            raise ValueError(
                "EncoderDecoderConfig.tie_encoder_decoder=True: shared encoder/decoder weights are not supported"
            )
        for key in _TOP_KEYS:
            value = getattr(self, key)
            if value is not None and not (
                isinstance(value, int) and not isinstance(value, bool) and 0 <= value < self.decoder.vocab_size
            ):
                raise ValueError(
                    f"EncoderDecoderConfig.{key}={value!r}: must be a token id in [0, {self.decoder.vocab_size})"
                )

    @property
    def num_attention_heads(self) -> int:
        """What a tensor-parallel mesh axis must divide: both sides' heads (sharding.mesh_shape)."""
        return math.gcd(self.encoder.num_attention_heads, self.decoder.num_attention_heads)

    @property
    def projects(self) -> bool:
        """Whether the encoder's states go through enc_to_dec_proj (transformers adds it when widths differ)."""
        return self.encoder.hidden_size != self.decoder.hidden_size

    def replace(self, **changes) -> EncoderDecoderConfig:
        return dataclasses.replace(self, **changes)

    def __hash__(self):
        return hash((self.encoder, self.decoder, *(getattr(self, k) for k in _TOP_KEYS)))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EncoderDecoderConfig:
        data = dict(data)
        parts = {}
        for name in ("encoder", "decoder"):
            part = data.pop(name, None)
            if not isinstance(part, dict):
                raise ValueError(f"EncoderDecoderConfig.{name}: expected an object (a BERT config)")
            try:
                parts[name] = BertConfig.from_dict(part)
            except ValueError as e:
                raise ValueError(f"{name}: {e}") from None
        data.pop("model_type", None)
        data.pop("is_encoder_decoder", None)
        kwargs = {k: data.pop(k) for k in _TOP_KEYS if k in data}
        architectures = data.pop("architectures", None) or (ARCHITECTURE,)
        return cls(**parts, **kwargs, architectures=architectures, extra=data)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model_type": self.model_type,
            "is_encoder_decoder": True,
            "encoder": self.encoder.to_dict(),
            "decoder": self.decoder.to_dict(),
            "architectures": list(self.architectures or (ARCHITECTURE,)),
            **{k: getattr(self, k) for k in _TOP_KEYS},
            **self.extra,
        }


def config_sides(config: BertConfig | EncoderDecoderConfig) -> tuple[BertConfig, ...]:
    """A bert2bert's (encoder, decoder) configs, else (config,): the sides inputs must fit (tables, positions)."""
    return (config.encoder, config.decoder) if getattr(config, "is_encoder_decoder", False) else (config,)


def load_config(directory: str | os.PathLike) -> BertConfig | EncoderDecoderConfig:
    """The config of a checkpoint directory: a BertConfig, or an EncoderDecoderConfig for a bert2bert."""
    from jaxbert.sentence_dir import transformer_dir

    directory = transformer_dir(directory)  # a sentence-transformers 0_Transformer/ subfolder's, if so
    path = existing_file(directory, "config.json")
    if path is None:
        raise FileNotFoundError(f"{os.path.join(directory, 'config.json')}: config.json not found")
    data = read_json(path)
    if data.get("model_type") != EncoderDecoderConfig.model_type:
        return BertConfig.from_json_file(path)
    try:
        return EncoderDecoderConfig.from_dict(data)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: {e}") from None


# -- parameters -----------------------------------------------------------------------------------------------------
def param_spec(config: EncoderDecoderConfig) -> dict:
    from jaxbert.params import param_spec as bert_spec

    spec = {"encoder": bert_spec(config.encoder, "BertModel"), "decoder": bert_spec(config.decoder, "BertLMHeadModel")}
    if config.projects:
        spec["enc_to_dec_proj"] = dense_spec(config.encoder.hidden_size, config.decoder.hidden_size)
    return spec


def torch_to_flax(state_dict: dict, config: EncoderDecoderConfig):
    """A PyTorch EncoderDecoderModel state dict -> the tree above, each side checked like any BERT checkpoint
    (every key accounted for, every shape asserted); the report's keys carry their side's prefix."""
    from jaxbert.convert import ConversionReport, check_tensor
    from jaxbert.convert import torch_to_flax as bert_to_flax

    parts: dict[str, dict] = {"encoder": {}, "decoder": {}, "enc_to_dec_proj": {}}
    for key, value in state_dict.items():
        side, _, rest = key.partition(".")
        if side not in parts or not rest:
            raise ValueError(f"unknown key {key!r}: not a parameter of {ARCHITECTURE}")
        parts[side][rest] = value
    report, params = ConversionReport(), {}
    for side, head, cfg in (("encoder", "BertModel", config.encoder), ("decoder", "BertLMHeadModel", config.decoder)):
        try:
            params[side], part = bert_to_flax(parts[side], cfg, head)
        except ValueError as e:
            raise ValueError(f"{side}: {e}") from None
        report.ignored.update({f"{side}.{k}": why for k, why in part.ignored.items()})
        report.absent += [f"{side} {name}" for name in part.absent]
    proj = parts["enc_to_dec_proj"]
    want = {"weight": (config.decoder.hidden_size, config.encoder.hidden_size), "bias": (config.decoder.hidden_size,)}
    if not config.projects:
        want = {}
    if set(proj) != set(want):
        keys = sorted(set(proj) ^ set(want))
        raise ValueError(
            f"enc_to_dec_proj.{keys[0]}: {'unexpected' if keys[0] in proj else 'missing'} (encoder "
            f"hidden size {config.encoder.hidden_size}, decoder {config.decoder.hidden_size})"
        )
    for name, shape in want.items():
        if tuple(proj[name].shape) != shape:  # from a safetensors header: before any of its data is read
            raise ValueError(f"enc_to_dec_proj.{name}: shape {tuple(proj[name].shape)}, expected {shape}")
        proj[name] = np.asarray(proj[name])
        check_tensor(f"enc_to_dec_proj.{name}", proj[name])
    if want:
        params["enc_to_dec_proj"] = {"kernel": proj["weight"].T, "bias": proj["bias"]}
    return params, report


def flax_to_torch(params: dict, config: EncoderDecoderConfig, include_tied: bool = True) -> dict:
    from jaxbert.convert import flax_to_torch as bert_to_torch

    out = {f"encoder.{k}": v for k, v in bert_to_torch(params["encoder"], config.encoder, "BertModel").items()}
    out.update(
        {
            f"decoder.{k}": v
            for k, v in bert_to_torch(
                params["decoder"], config.decoder, "BertLMHeadModel", include_tied=include_tied
            ).items()
        }
    )
    if config.projects:
        proj = params["enc_to_dec_proj"]
        out["enc_to_dec_proj.weight"] = np.ascontiguousarray(np.asarray(proj["kernel"]).T)
        out["enc_to_dec_proj.bias"] = np.asarray(proj["bias"])
    return out


# -- the computation ----------------------------------------------------------------------------------------------
@flax.struct.dataclass
class Seq2SeqOutput:
    """transformers' Seq2SeqLMOutput field names."""

    logits: Array | None = None
    loss: Array | None = None
    past_key_values: Any = None
    decoder_hidden_states: tuple[Array, ...] | None = None
    decoder_attentions: tuple[Array, ...] | None = None
    cross_attentions: tuple[Array, ...] | None = None
    encoder_last_hidden_state: Array | None = None
    encoder_hidden_states: tuple[Array, ...] | None = None
    encoder_attentions: tuple[Array, ...] | None = None

    def __getitem__(self, key: str):
        return getattr(self, key)


def shift_tokens_right(labels: Int[Array, "B T"], pad_token_id: int, decoder_start_token_id: int):
    """Decoder inputs from labels: start token first, labels shifted right, -100 replaced by padding."""
    shifted = jnp.concatenate([jnp.full_like(labels[:, :1], decoder_start_token_id), labels[:, :-1]], axis=1)
    return jnp.where(shifted == -100, pad_token_id, shifted)


def encode(
    params,
    config: EncoderDecoderConfig,
    input_ids,
    attention_mask=None,
    token_type_ids=None,
    *,
    output_hidden_states: bool = False,
    output_attentions: bool = False,
    rng=None,
    remat: bool = False,
):
    """The encoder's output, and its states as the decoder sees them (projected when the widths differ)."""
    from jaxbert.model import bert

    out = bert(
        params["encoder"],
        config.encoder,
        input_ids,
        attention_mask,
        token_type_ids,
        output_hidden_states=output_hidden_states,
        output_attentions=output_attentions,
        rng=rng,
        remat=remat,
    )
    states = out.last_hidden_state
    if config.projects:
        states = dense(params["enc_to_dec_proj"], states)
    return out, states


def encoder_decoder(
    params,
    config: EncoderDecoderConfig,
    input_ids=None,
    attention_mask=None,
    decoder_input_ids=None,
    decoder_attention_mask=None,
    *,
    labels=None,
    token_type_ids=None,
    decoder_position_ids=None,
    output_hidden_states: bool = False,
    output_attentions: bool = False,
    past_key_values=None,
    use_cache: bool = False,
    rng=None,
    remat: bool = False,
    label_smoothing: float = 0.0,
) -> Seq2SeqOutput:
    """transformers' EncoderDecoderModel.forward: encode, then decode with cross-attention over the encoder's
    states. With `labels` and no `decoder_input_ids`, the decoder inputs are the labels shifted right (starting
    with decoder_start_token_id) and the loss is the mean cross-entropy over labels != -100."""
    from jaxbert.heads import forward
    from jaxbert.losses import cross_entropy

    params = jax.tree_util.tree_map(jnp.asarray, params)
    r_enc, r_dec = (None, None) if rng is None else jax.random.split(rng)
    if labels is not None and decoder_input_ids is None:
        if config.decoder_start_token_id is None or config.pad_token_id is None:
            raise ValueError(
                "labels without decoder_input_ids need decoder_start_token_id and pad_token_id in the config"
            )
        decoder_input_ids = shift_tokens_right(labels, config.pad_token_id, config.decoder_start_token_id)
        if decoder_attention_mask is None:
            decoder_attention_mask = (decoder_input_ids != config.pad_token_id).astype(jnp.int32)
    if decoder_input_ids is None:
        raise ValueError("pass decoder_input_ids (or labels)")
    enc, states = encode(
        params,
        config,
        input_ids,
        attention_mask,
        token_type_ids,
        output_hidden_states=output_hidden_states,
        output_attentions=output_attentions,
        rng=r_enc,
        remat=remat,
    )
    dec = forward(
        params["decoder"],
        config.decoder,
        "BertLMHeadModel",
        decoder_input_ids,
        decoder_attention_mask,
        position_ids=decoder_position_ids,
        output_hidden_states=output_hidden_states,
        output_attentions=output_attentions,
        encoder_hidden_states=states,
        encoder_attention_mask=attention_mask,
        past_key_values=past_key_values,
        use_cache=use_cache,
        rng=r_dec,
        remat=remat,
    )
    loss = None if labels is None else cross_entropy(dec.logits, labels, label_smoothing=label_smoothing)
    return Seq2SeqOutput(
        logits=dec.logits,
        loss=loss,
        past_key_values=dec.past_key_values,
        decoder_hidden_states=dec.hidden_states,
        decoder_attentions=dec.attentions,
        cross_attentions=dec.cross_attentions,
        encoder_last_hidden_state=enc.last_hidden_state,
        encoder_hidden_states=enc.hidden_states,
        encoder_attentions=enc.attentions,
    )
