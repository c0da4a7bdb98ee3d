"""`jaxbert.load` of a bert2bert directory -> `EncoderDecoder`: two loaded `Bert`s (the encoder, and the decoder
with its causal-LM head) and the optional projection between them, with a jitted forward and generation whose
encoder runs once per input."""

from __future__ import annotations

import functools
import threading

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from jaxbert import decoders, generate_inputs
from jaxbert import weights as W
from jaxbert.inference import Bert
from jaxbert.inputs import check_arrays
from jaxbert.layout import per_layer
from jaxbert.seq2seq import EncoderDecoderConfig, Seq2SeqOutput, encoder_decoder


class EncoderDecoder:
    """A loaded EncoderDecoderModel: `config`, `params`, `encoder` and `decoder` (each a `Bert`), `tokenizer`."""

    def __init__(
        self,
        config: EncoderDecoderConfig,
        params,
        directory: str | None = None,
        *,
        dtype: str | None = None,
        consume: bool = False,
        settings: dict | None = None,
    ):
        """As `Bert`'s, for each side. `settings`: the generation config `generate` defaults to (as
        generate_options.file_settings reads one); None: the directory's."""
        self.config, self.directory, self.head = config, directory, "EncoderDecoderModel"
        self.settings, self._dtype = settings, dtype
        proj = self._projection(params, consume)
        self.encoder = Bert(config.encoder, params["encoder"], "BertModel", directory, dtype=dtype, consume=consume)
        self.decoder = Bert(
            config.decoder, params["decoder"], "BertLMHeadModel", directory, dtype=dtype, consume=consume
        )
        self.proj, self._proj_signature = proj, _signature(proj)
        self._lock = threading.Lock()
        self._own_compiles = 0
        self._forward = jax.jit(
            self._count(self._forward_impl), static_argnames=("output_hidden_states", "output_attentions")
        )
        self._generate = jax.jit(self._count(self._generate_impl), static_argnames=("search", "bound"))

    def _count(self, fn):
        @functools.wraps(fn)  # keeps fn's signature for jit's static_argnames
        def traced(*args, **kwargs):
            with self._lock:
                self._own_compiles += 1
            return fn(*args, **kwargs)

        return traced

    def _projection(self, params, consume: bool):
        """The projection of stored `params`, narrowed as the sides are (Bert checks theirs): float64 runs as
        float32 without x64."""
        proj = params.pop("enc_to_dec_proj", None) if consume else params.get("enc_to_dec_proj")
        if proj is None:
            return None
        W.check_castable({"enc_to_dec_proj": proj}, self._dtype)
        return jax.tree_util.tree_map(functools.partial(jnp.asarray, dtype=W.float_dtype(self._dtype)), proj)

    def load_weights(self, params, *, consume: bool = False) -> None:
        """Replace the weights by `params` (the stored layout, as the constructor takes them), laid out as the
        constructor laid out its own (each side as `Bert.load_weights` lays it, the projection cast as there):
        the compiled forward and search take the weights as arguments and run on the new ones, nothing compiles
        again. A tree that is not the model's (a side or the projection missing, a leaf of another shape or
        dtype) is refused in one line naming it, the weights unchanged. `drop_weights` first holds one copy."""
        for side in ("encoder", "decoder"):
            if not isinstance(params.get(side), dict):
                raise ValueError(f"load_weights: no {side!r} tree (a bert2bert's weights have 'encoder', 'decoder')")
        proj = self._projection(params, consume)
        new, had = _signature(proj), self._proj_signature
        if new != had:
            why = "the model has none" if had is None else "the model's is " + ", ".join(f"{k} {had[k]}" for k in had)
            raise ValueError(f"load_weights: enc_to_dec_proj {'missing' if new is None else new}: {why}")
        # Both sides laid out and checked before either is taken: a refused tree leaves the model as it was.
        pairs = (("encoder", self.encoder), ("decoder", self.decoder))
        laid = [(bert, bert._laid_out(params[side], consume, f"load_weights: {side}")) for side, bert in pairs]
        for bert, weights in laid:
            bert._take(weights)
        self.proj = proj

    def drop_weights(self) -> None:
        """Free the device copy of the weights; the model runs again after `load_weights`."""
        self.encoder.drop_weights()
        self.decoder.drop_weights()
        self.proj = None

    @property
    def compile_count(self) -> int:
        return self._own_compiles + self.encoder.compile_count + self.decoder.compile_count

    def _params(self, enc_weights, dec_weights, proj):
        tree = {"encoder": self.encoder._unbits(enc_weights), "decoder": self.decoder._unbits(dec_weights)}
        return tree if proj is None else {**tree, "enc_to_dec_proj": proj}

    def _forward_impl(
        self,
        enc_weights,
        dec_weights,
        proj,
        input_ids,
        attention_mask,
        decoder_input_ids,
        decoder_attention_mask,
        *,
        output_hidden_states=False,
        output_attentions=False,
    ):
        return encoder_decoder(
            self._params(enc_weights, dec_weights, proj),
            self.config,
            input_ids,
            attention_mask,
            decoder_input_ids,
            decoder_attention_mask,
            output_hidden_states=output_hidden_states,
            output_attentions=output_attentions,
        )

    def _generate_impl(self, enc_weights, dec_weights, proj, *arrays, search, bound):
        params = self._params(enc_weights, dec_weights, proj)
        params["decoder"] = per_layer(params["decoder"], self.config.decoder)  # see decoders.py: faster steps
        return decoders.seq2seq(params, self.config, *arrays, search=search, bound=bound)

    @property
    def params(self):
        """The stored layout (transformers 4.x FlaxEncoderDecoderModel's tree; a new tree on each access)."""
        tree = {"encoder": self.encoder.params, "decoder": self.decoder.params}
        return tree if self.proj is None else {**tree, "enc_to_dec_proj": self.proj}

    @property
    def tokenizer(self):
        return self.decoder.tokenizer

    def __call__(
        self,
        input_ids,
        attention_mask=None,
        decoder_input_ids=None,
        decoder_attention_mask=None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> Seq2SeqOutput:
        if decoder_input_ids is None:
            raise ValueError("decoder_input_ids: required (generate() makes them from decoder_start_token_id)")
        check_arrays(self.config.encoder, input_ids, attention_mask)
        names = ("decoder_input_ids", "decoder_attention_mask")
        check_arrays(self.config.decoder, decoder_input_ids, decoder_attention_mask, names=names)
        if np.shape(decoder_input_ids)[0] != np.shape(input_ids)[0]:
            raise ValueError(
                f"decoder_input_ids has {np.shape(decoder_input_ids)[0]} rows, input_ids {np.shape(input_ids)[0]}"
            )
        as_int = lambda a: None if a is None else jnp.asarray(a, jnp.int32)  # noqa: E731
        return self._forward(
            self.encoder.weights,
            self.decoder.weights,
            self.proj,
            as_int(input_ids),
            as_int(attention_mask),
            as_int(decoder_input_ids),
            as_int(decoder_attention_mask),
            output_hidden_states=output_hidden_states,
            output_attentions=output_attentions,
        )

    def generate(
        self,
        input_ids,
        attention_mask=None,
        max_new_tokens: int | None = None,
        *,
        num_beams: int | None = None,
        do_sample: bool | None = None,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int = 0,
        num_return_sequences: int | None = None,
        length_penalty: float | None = None,
        early_stopping: bool | str | None = None,
        eos_token_id=None,
        pad_token_id=None,
        min_new_tokens: int | None = None,
        min_length: int | None = None,
        no_repeat_ngram_size: int | None = None,
        repetition_penalty: float | None = None,
        decoder_start_token_id: int | list[int] | None = None,
    ) -> np.ndarray:
        """transformers' `generate` for an EncoderDecoderModel: input_ids [B, S] for the encoder (rows padded on
        the right, with attention_mask) -> the decoder's ids [B * num_return_sequences, 1 + steps run] as np.int32,
        starting with decoder_start_token_id (else bos_token_id; a list: one per row). Options as `Bert.generate`'s,
        defaults from the checkpoint's generation_config.json (else config.json: its top level, then its decoder's).
        One program per (batch, encoder length, new-token) bucket and search mode runs the encoder once and then the
        decoder."""
        given = dict(
            max_new_tokens=max_new_tokens,
            num_beams=num_beams,
            do_sample=do_sample,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            seed=seed,
            num_return_sequences=num_return_sequences,
            length_penalty=length_penalty,
            early_stopping=early_stopping,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            min_new_tokens=min_new_tokens,
            min_length=min_length,
            no_repeat_ngram_size=no_repeat_ngram_size,
            repetition_penalty=repetition_penalty,
            decoder_start_token_id=decoder_start_token_id,
        )
        settings = self.settings if self.settings is not None else generate_inputs.file_settings(self.directory)
        req = generate_inputs.seq2seq_request(
            self.config, self.encoder.length_buckets, settings, input_ids, attention_mask, given
        )
        out = self._generate(
            self.encoder.weights, self.decoder.weights, self.proj, *req.arrays, search=req.search, bound=req.bound
        )
        return req.assemble(*out)


def _signature(proj) -> dict | None:
    """{leaf: (shape, dtype)} of a projection, None without one."""
    if proj is None:
        return None
    return {"/".join(k): f"{tuple(v.shape)} {v.dtype}" for k, v in sorted(traverse_util.flatten_dict(proj).items())}
