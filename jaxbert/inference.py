"""`jaxbert.load(path)` -> `Bert`: the only stateful object, wrapping the pure forward in a cached `jax.jit`.

Inputs are checked on the host before they reach the device: JAX gathers clamp out-of-range indices silently,
so a bad token id would otherwise give a wrong answer instead of an error.
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np

from jaxbert.checkpoint import load_params
from jaxbert.config import BertConfig
from jaxbert.heads import forward, resolve_head
from jaxbert.model import BertOutput

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


@functools.partial(jax.jit, static_argnames=("config", "head", "output_hidden_states", "output_attentions"))
def _forward_jit(params, input_ids, attention_mask, token_type_ids, position_ids, head_mask, *, config, head,
                 output_hidden_states, output_attentions):
    return forward(params, config, head, input_ids, attention_mask, token_type_ids, position_ids, head_mask,
                   output_hidden_states=output_hidden_states, output_attentions=output_attentions)


def _check_range(name: str, values: np.ndarray, upper: int, what: str):
    bad = np.argwhere((values < 0) | (values >= upper))
    if bad.size:
        pos = tuple(int(i) for i in bad[0])
        raise ValueError(f"{name} {int(values[pos])} at position {pos} is outside [0, {upper}) ({what})")


class Bert:
    """A loaded checkpoint: `config`, `params` (on the default device), `head`, and the tokenizer."""

    def __init__(self, config: BertConfig, params, head: str | None = None, directory: str | None = None):
        self.config = config
        self.head = resolve_head(head, config)
        self.params = params
        self.directory = directory
        self._tokenizer = None

    @property
    def params_dtype(self):
        return jax.tree_util.tree_leaves(self.params)[0].dtype

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            if self.directory is None:
                raise ValueError("this Bert was not loaded from a directory, so it has no tokenizer")
            self._tokenizer = AutoTokenizer.from_pretrained(self.directory)
        return self._tokenizer

    def _check(self, input_ids, attention_mask, token_type_ids, position_ids):
        c = self.config
        ids = np.asarray(input_ids)
        if not np.issubdtype(ids.dtype, np.integer):
            raise TypeError(f"input_ids must be integers, got dtype {ids.dtype}")
        _check_range("token id", ids, c.vocab_size, "vocab_size")
        for name, arr in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids),
                          ("position_ids", position_ids)):
            if arr is not None and np.shape(arr) != ids.shape:
                raise ValueError(f"{name} shape {np.shape(arr)} does not match input_ids shape {ids.shape}")
        if token_type_ids is not None:
            _check_range("token type id", np.asarray(token_type_ids), c.type_vocab_size, "type_vocab_size")
        if position_ids is not None:
            _check_range("position id", np.asarray(position_ids), c.max_position_embeddings,
                          "max_position_embeddings")
        elif ids.shape[-1] > c.max_position_embeddings:
            raise ValueError(f"sequence length {ids.shape[-1]} exceeds max_position_embeddings "
                             f"{c.max_position_embeddings}")

    def __call__(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None, head_mask=None,
                 output_hidden_states: bool = False, output_attentions: bool = False) -> BertOutput:
        self._check(input_ids, attention_mask, token_type_ids, position_ids)
        as_int = lambda a: None if a is None else jnp.asarray(a, jnp.int32)  # noqa: E731
        return _forward_jit(self.params, as_int(input_ids), as_int(attention_mask), as_int(token_type_ids),
                            as_int(position_ids), None if head_mask is None else jnp.asarray(head_mask),
                            config=self.config, head=self.head, output_hidden_states=output_hidden_states,
                            output_attentions=output_attentions)


def load(path: str | os.PathLike, head: str | None = None, dtype: str | None = None) -> Bert:
    """Load a transformers BERT directory (safetensors / .bin / sharded) or a jaxbert directory."""
    path = os.fspath(path)
    config = BertConfig.from_pretrained(path)
    head = resolve_head(head, config)
    params, _ = load_params(path, config, head)
    if dtype is not None and dtype not in _DTYPES:
        raise ValueError(f"dtype {dtype!r}: expected one of {', '.join(_DTYPES)}")
    target = _DTYPES[dtype] if dtype else None

    def place(x):
        x = np.asarray(x)
        if target is not None and np.issubdtype(x.dtype, np.floating):
            return jnp.asarray(x, target)
        return jnp.asarray(x)

    return Bert(config, jax.tree_util.tree_map(place, params), head, path)
