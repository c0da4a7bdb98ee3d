"""`jaxbert.load(path)` -> `Bert`: the only stateful object, wrapping the pure functions in cached `jax.jit`s.

Inputs are checked on the host before they reach the device: JAX gathers clamp out-of-range indices silently,
so a bad token id would otherwise give a wrong answer instead of an error. Text batches are padded to shape
buckets (see batching.py) and, with several devices, split across them on a `data` mesh axis.
"""

from __future__ import annotations

import functools
import os
import threading
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from jaxbert import batching, cpu, decoders, hub, quantize, sharding
from jaxbert import weights as W
from jaxbert.checkpoint import load_head_params, load_params
from jaxbert.config import BertConfig
from jaxbert.heads import base_params, forward, mlm_logits, resolve_head
from jaxbert.inference_tasks import TaskMethods
from jaxbert.inputs import as_array, check_arrays, check_encoder_states
from jaxbert.layout import decoding_layout, to_stored
from jaxbert.model import BertOutput, bert
from jaxbert.ops import from_bits
from jaxbert.pooling import pool, pool_segments, projected
from jaxbert.seq2seq import load_config
from jaxbert.tokenizer import WordPiece

DTYPES = (*W.FLOAT_DTYPES, "int8")  # int8: quantize.py (the layers' matmuls in int8, all else float32)


def _check_dtype(dtype: str | None):
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    note = cpu.slow_dtype(dtype)
    if note and jax.default_backend() == "cpu":  # asked for speed, or memory: said once (one warning location)
        warnings.warn(note, cpu.SlowDtypeWarning, stacklevel=1)


def _tokens(weights, input_ids, *_) -> int:
    """The tokens of a call to one of Bert's jitted entry points (weights first, then the [B, L] token ids)."""
    return int(np.size(input_ids))


class Bert(TaskMethods):
    """A loaded checkpoint: `config`, `params`, `head`, `tokenizer`, jitted entry points.

    The parameters live on the devices in the compute layout (query/key/value fused; a float32 model's layers held
    apart, others' stacked for one scan; see layout.py), built once here, 16-bit floats held as their bits
    (`weights`; see ops.as_bits) and turned back inside the jitted functions, where XLA folds the round trip away.
    `compute_params` and `params` (the stored layout, transformers' FlaxBert tree) are rebuilt from them on each
    access.

    `compile_count` counts the programs traced so far (each one a compilation): with shape buckets it stays
    within len(length_buckets) × len(batch buckets) per entry point whatever the stream of inputs.
    `length_buckets` may be replaced (ascending, the last at most max_position_embeddings).

    generate, embed, fill_mask, classify, tag and answer are inference_tasks.py's (TaskMethods).
    """

    def __init__(
        self,
        config: BertConfig,
        params,
        head: str | None = None,
        directory: str | None = None,
        *,
        dtype: str | None = None,
        consume: bool = False,
        mesh: Mesh | None = None,
    ):
        """`dtype` casts floating parameters as they are placed; `consume=True` hands over `params`: its layers
        are emptied while stacking, to save memory. Without a `mesh` the parameters are replicated on every
        device and batches split over them; a (data, fsdp, tensor) mesh from `sharding.make_mesh` splits the
        parameters by the rules of sharding.py (e.g. tensor parallel: a model too large for one device)."""
        self.config, self.head, self.directory = config, resolve_head(head, config), directory
        self.compile_count = 0
        self._lock = threading.Lock()  # the lazily built tokenizer and the compile counter are shared state
        self._packed_programs: set[str] = set()  # entry points that have run packed batches (packed_batches)
        self.length_buckets = batching.length_buckets(config.max_position_embeddings)
        # A Bert is its process's (host arrays in, host arrays out): by default on this process's devices, which
        # are all of them but in a multi-process program, where the others' could not take this one's inputs.
        default = sharding.make_mesh(devices=jax.local_devices())
        self.mesh = sharding.check_mesh(mesh, config.num_attention_heads) if mesh is not None else default
        self._data = sharding.batch_sharding(self.mesh)
        self._shards = sharding.batch_shards(self.mesh)  # the batch is split this many ways
        _check_dtype(dtype)
        cast = W.float_dtype(dtype)
        f32 = W.is_float32(params, dtype)
        rounded = cpu.rounded_float32()
        if rounded and any((cast or d) == jnp.float32 for d in W.float_dtypes(params)):  # int8's float32 parts too
            warnings.warn(rounded, cpu.RoundedFloat32Warning, stacklevel=2)
        self._layout = (dtype, mesh, sharding.replicated(self.mesh))  # how lay_out placed them: load_weights too
        self._weights, self._dtypes = W.lay_out(params, config, *self._layout, consume=consume)
        del params
        self._signature = W.signature(self._weights, self._dtypes)
        self._attention = quantize.attention_dtype() if dtype == "int8" else None  # of attention's products
        self._tokenizer = None
        # Float32 models' large calls compile with oneDNN's matmuls where they win (cpu.onednn_jit).
        jit = functools.partial(cpu.onednn_jit, tokens=_tokens, enabled=f32)
        self._forward = jit(
            self._counted(self._forward_impl), static_argnames=("output_hidden_states", "output_attentions")
        )
        self._embed = jit(self._counted(self._embed_impl), static_argnames=("pooling", "normalize"))
        self._embed_packed = jit(self._counted(self._embed_packed_impl), static_argnames=("pooling", "normalize"))
        # A directory's Dense modules run as a program of their own, never oneDNN's: XLA:CPU's oneDNN dot fusion
        # fails on a dot fed by the mean pooling's division ("partition compile failed", then SIGILL, jax 0.7).
        self._project = jax.jit(self._counted(projected), static_argnames=("steps", "normalize"))
        self._mask_top_k = jit(self._counted(self._mask_top_k_impl), static_argnames=("k",))
        self._apart = None  # (weights, the decoding copy of them): see layers_apart
        generate = jax.jit(self._counted(self._generate_impl), static_argnames=("search", "bound"))
        self._generate = lambda weights, *arrays, **static: generate(self.layers_apart(weights), *arrays, **static)

    def _counted(self, fn):
        @functools.wraps(fn)  # keeps fn's signature for jit's static_argnames
        def traced(*args, **kwargs):
            with self._lock:
                self.compile_count += 1  # runs only while tracing, i.e. once per compiled program
            return fn(*args, **kwargs)

        return traced

    def _unbits(self, weights):
        return jax.tree_util.tree_map(from_bits, weights, self._dtypes)

    @property
    def weights(self):
        """The device weights every jitted entry point takes (see the class docstring)."""
        if self._weights is None:
            raise ValueError("this model's weights were dropped (drop_weights): give it new ones with load_weights")
        return self._weights

    def load_weights(self, params, *, consume: bool = False) -> None:
        """Replace the weights by `params` (the stored layout, as the constructor takes them), laid out, cast and
        placed as the constructor placed its own. The compiled programs take the weights as an argument, so they
        run on the new ones as compiled: nothing compiles again. Their leaves, shapes and dtypes must be the
        model's (ValueError naming the first that differs; the weights are then unchanged). Both copies are on the
        devices until the new one is placed: `drop_weights` first to hold one."""
        self._take(self._laid_out(params, consume))

    def drop_weights(self) -> None:
        """Free the device copy of the weights (and decoding's); the model runs again after `load_weights`."""
        with self._lock:
            self._weights, self._apart = None, None

    def _laid_out(self, params, consume: bool, what: str = "load_weights"):
        weights, dtypes = W.lay_out(params, self.config, *self._layout, consume=consume)
        W.check_same(self._signature, W.signature(weights, dtypes), what)
        return weights

    def _take(self, weights) -> None:
        with self._lock:  # decoding's copy is of the weights it was made from: made again at the next generate
            self._weights, self._apart = weights, None

    def _forward_impl(
        self,
        weights,
        input_ids,
        attention_mask,
        token_type_ids,
        position_ids,
        head_mask,
        encoder_hidden_states=None,
        encoder_attention_mask=None,
        segment_ids=None,
        segment_starts=None,
        *,
        output_hidden_states=False,
        output_attentions=False,
    ):
        return forward(
            self._unbits(weights),
            self.config,
            self.head,
            input_ids,
            attention_mask,
            token_type_ids,
            position_ids,
            head_mask,
            output_hidden_states=output_hidden_states,
            output_attentions=output_attentions,
            encoder_hidden_states=encoder_hidden_states,
            encoder_attention_mask=encoder_attention_mask,
            segment_ids=segment_ids,
            segment_starts=segment_starts,
            attention_dtype=self._attention,
        )

    def _embed_impl(self, weights, input_ids, attention_mask, token_type_ids, skip, *, pooling, normalize):
        params = base_params(self._unbits(weights), self.head)
        out = bert(params, self.config, input_ids, attention_mask, token_type_ids, attention_dtype=self._attention)
        return pool(out, attention_mask, pooling, normalize, skip)

    def _embed_packed_impl(self, weights, ids, mask, types, positions, segments, starts, skip, *, pooling, normalize):
        params = base_params(self._unbits(weights), self.head)
        out = bert(
            params, self.config, ids, mask, types, positions, segment_ids=segments, attention_dtype=self._attention
        )
        hidden = out.last_hidden_state
        return pool_segments(hidden, segments, starts, pooling, normalize, params.get("pooler"), skip)

    def _mask_top_k_impl(self, weights, ids, mask, types, positions, segments, asked, targets, *, k):
        """The k most likely tokens [R, P, k] and their probabilities (float32) at the positions `asked`
        [R, P] of packed rows: the vocabulary projection, the largest matmul of short texts, runs for the
        positions asked for only, and only the top k leave the device (not [R, P, V] logits). With `targets`
        [T] (token ids), the k most likely of them, each with its probability over the whole vocabulary."""
        params = self._unbits(weights)
        out = bert(
            params["bert"],
            self.config,
            ids,
            mask,
            types,
            positions,
            segment_ids=segments,
            attention_dtype=self._attention,
        )
        hidden = jnp.take_along_axis(out.last_hidden_state, asked[..., None], axis=1)
        logits = mlm_logits(
            params["cls"], self.config, params["bert"]["embeddings"]["word_embeddings"]["embedding"], hidden
        ).astype(jnp.float32)
        # top_k on the logits (ties: the lower token id first, as a stable sort), softmax only for those k.
        best, token_ids = jax.lax.top_k(logits if targets is None else logits[..., targets], k)
        token_ids = token_ids if targets is None else targets[token_ids]
        return token_ids, jnp.exp(best - jax.nn.logsumexp(logits, axis=-1, keepdims=True))

    def layers_apart(self, weights):
        """The parameters decoding runs on, made from `weights` (self.weights) by the first call and kept: the
        encoder's layers as separate arrays, floats as such (not bits), laid out for matmuls of a few rows (see
        layout.decoding_layout). A float32 model loaded without a mesh holds its layers so already
        (layout.apart_layers) and shares them; a 16-bit or sharded one holds its weights twice while it generates
        (bert-base: +265 MB bfloat16); other users pay nothing.

        A decoding step reads every weight once, and XLA:CPU copies what a matmul reads if it is a layer's slice
        of a stacked array (a scan's dynamic slice and an unrolled loop's static one alike: bert-base batch 1,
        57 instead of 30 ms a token) or bits turned back into bfloat16 (all 50 matrices in every call, ~140 ms);
        unstacking in every call instead cost ~200 ms a call."""
        with self._lock:
            if self._apart is None or self._apart[0] is not weights:
                self._apart = (weights, decoding_layout(weights, self._dtypes, self.config))
            return self._apart[1]

    def _generate_impl(self, params, *arrays, search, bound):
        return decoders.causal_lm(
            params, self.config, *arrays, search=search, bound=bound, attention_dtype=self._attention
        )

    # -- properties ------------------------------------------------------------------------------------------
    @property
    def compute_params(self):
        """The compute layout (a new tree on each access)."""
        return jax.jit(self._unbits)(self.weights)

    @property
    def params(self):
        """The stored layout (transformers' FlaxBert tree; a new tree on each access). An int8 model's are the
        float32 values its int8 weights stand for (quantize.dequantize)."""
        return to_stored(quantize.dequantize(self.compute_params), self.config)

    @property
    def params_dtype(self):
        return jax.tree_util.tree_leaves(self._dtypes)[0]

    @property
    def has_pooler(self) -> bool:
        return "pooler" in base_params(self.weights, self.head)

    @property
    def tokenizer(self) -> WordPiece:
        with self._lock:
            if self._tokenizer is None:
                if self.directory is None:
                    raise ValueError("this Bert was not loaded from a directory, so it has no tokenizer")
                self._tokenizer = WordPiece.from_dir(self.directory)
            return self._tokenizer

    # -- arrays in, outputs out ------------------------------------------------------------------------------
    def check_inputs(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None):
        ndim = 3 if self.head == "BertForMultipleChoice" else 2
        check_arrays(self.config, input_ids, attention_mask, token_type_ids, position_ids, ndim)

    def _put(self, *arrays):
        """To the devices: split on the batch axis when it divides across them, else replicated. A host array for
        one device stays a numpy int32 array, which the jitted call moves itself (jnp.asarray took 0.1 ms an array,
        0.5 of a 3 ms MiniLM call of one short text)."""
        n = self._shards
        out = []
        for a in arrays:
            if a is None:
                out.append(None)
            elif n > 1 and np.shape(a)[0] % n == 0:
                out.append(jax.device_put(jnp.asarray(a, jnp.int32), self._data))
            else:
                out.append(jnp.asarray(a, jnp.int32) if isinstance(a, jax.Array) else np.asarray(a, np.int32))
        return out

    def __call__(
        self,
        input_ids,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        head_mask=None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        *,
        encoder_hidden_states=None,
        encoder_attention_mask=None,
        decoder_input_ids=None,
    ) -> BertOutput:
        """transformers' forward; decoders with cross-attention also take the encoder's states and mask."""
        if decoder_input_ids is not None:
            raise ValueError(f"decoder_input_ids: this is a {self.head} checkpoint, not an encoder-decoder one")
        self.check_inputs(input_ids, attention_mask, token_type_ids, position_ids)
        states, states_mask = check_encoder_states(
            self.config, np.shape(input_ids)[0], encoder_hidden_states, encoder_attention_mask
        )
        states, states_mask = (None if a is None else jnp.asarray(a) for a in (states, states_mask))
        head_mask = None if head_mask is None else jnp.asarray(as_array("head_mask", head_mask, np.float32))
        return self._forward(
            self.weights,
            *self._put(input_ids, attention_mask, token_type_ids, position_ids),
            head_mask,
            states,
            states_mask,
            output_hidden_states=output_hidden_states,
            output_attentions=output_attentions,
        )


def load(path: str | os.PathLike, head: str | None = None, dtype: str | None = None, mesh: Mesh | None = None) -> Bert:
    """Load a transformers BERT directory (safetensors / .bin / sharded), a jaxbert directory, or a hub id
    (`org/name[@revision]`, from the local Hugging Face cache or downloaded; see hub.py).

        `dtype="bfloat16"` (or float16) stores and runs the parameters in that dtype; LayerNorm and softmax
        statistics stay in float32. `dtype="int8"` quantizes the encoder layers' matmul weights (per output
        channel) and their inputs (per token, as they arrive) and keeps the rest float32 (see quantize.py).
        `mesh` (see Bert) splits the parameters over a device mesh.
    """
    path = hub.resolve(path)
    config = load_config(path)
    head_given, head = head, resolve_head(head, config)
    _check_dtype(dtype)
    if head == "EncoderDecoderModel":
        from jaxbert.inference_seq2seq import EncoderDecoder

        return EncoderDecoder(config, load_params(path, config, head)[0], path, dtype=dtype, consume=True)
    params, _, head = load_head_params(path, config, head, given=head_given)
    return Bert(config, params.pop(), head, path, dtype=dtype, consume=True, mesh=mesh)
