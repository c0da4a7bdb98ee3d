"""The host side of `generate`: the inputs checked and padded to shape buckets, the device arguments built, and
the output assembled from the device's, for the causal LM (`request`, behind `Bert.generate`) and bert2bert
(`seq2seq_request`, behind `EncoderDecoder.generate`). Options and their defaults: generate_options.py.

Derived inputs follow transformers 5's `generate`. A causal LM's absent attention mask is inferred from pad tokens
in the prompt (unless pad is an eos id); its position ids are the mask's cumulative sum minus one (0 on padding);
new tokens continue from each row's last position. An encoder-decoder's encoder input is taken as given (no mask
inferred: transformers infers none for encoder-decoders) and its decoder starts from one start token per row.
A row whose mask is all zeros is refused (`_check_rows`).
"""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np

from jaxbert import batching
from jaxbert.config import BertConfig
from jaxbert.generate import Search, Warp, as_float32
from jaxbert.generate_options import Options, file_settings, max_new_tokens, resolve
from jaxbert.inputs import Arg, ArgumentError, check_arrays

__all__ = ["Options", "Request", "file_settings", "request", "resolve", "seq2seq_request"]


def _mask_and_positions(ids: np.ndarray, mask, search: Search):
    """transformers' `_prepare_attention_mask_for_generation` and `_prepare_position_ids_for_generation`."""
    if mask is None and search.pad is not None and search.pad not in search.eos and (ids == search.pad).any():
        mask = ids != search.pad
    if mask is None:
        return np.ones(ids.shape, np.int32), np.broadcast_to(np.arange(ids.shape[1], dtype=np.int32), ids.shape)
    mask = np.asarray(mask).astype(np.int32)
    return mask, np.where(mask == 1, np.cumsum(mask, axis=1) - 1, 0).astype(np.int32)


def _check_rows(mask: np.ndarray, inferred_from: int | None = None) -> None:
    """Every row must attend to a token: transformers attends a fully masked row uniformly over its columns, and
    the padding columns of a length bucket would join that average (other tokens than transformers')."""
    empty = np.flatnonzero(~mask.any(axis=1))
    if empty.size:
        how = "" if inferred_from is None else f" (inferred from pad_token_id {inferred_from})"
        raise ValueError(f"attention_mask row {empty[0]}{how} masks every token: nothing to generate from")


@dataclasses.dataclass
class Request:
    """One call's device arguments (`arrays`, after the static `search` and `bound`) and how to read the result."""

    search: Search
    bound: int
    arrays: tuple
    prompt: np.ndarray  # [rows, P], as given (expanded for sampling's num_return_sequences)

    def assemble(self, tokens, steps) -> np.ndarray:
        """The prompt followed by the steps actually run (transformers trims to them as well)."""
        steps, rows, n = int(steps), self.prompt.shape[0], self.search.num_return_sequences
        tokens = np.asarray(tokens)[:rows, ..., :steps].reshape(rows * n, steps)
        return np.concatenate([np.repeat(self.prompt, n, axis=0).astype(np.int32), tokens.astype(np.int32)], 1)


def _padded(rows: int) -> int:
    return 1 << (rows - 1).bit_length()


def _rows(arrays, rows: int):
    """Rows padded to a power of two (few programs whatever the batch); extra rows repeat row 0 and are dead."""
    R = _padded(rows)
    pick = np.where(np.arange(R) < rows, np.arange(R), 0)
    return [a[pick] for a in arrays], jnp.asarray(np.arange(R) < rows)


def _columns(arrays, length_buckets):
    """Columns padded on the right to the length bucket, with zeros (masked)."""
    length = arrays[0].shape[1]
    P = batching.bucket(length, tuple(length_buckets))
    return [jnp.asarray(np.pad(a, ((0, 0), (0, P - length))).astype(np.int32)) for a in arrays]


def device_memory() -> int | None:
    """Bytes the local devices hold together: the host's physical memory on CPU, else the devices' own limits
    (None where a device does not say)."""
    devices = jax.local_devices()
    if devices[0].platform == "cpu":
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limits = [(d.memory_stats() or {}).get("bytes_limit") for d in devices]
    return sum(limits) if all(limits) else None


def _check_size(config: BertConfig, rows: int, beams: int, positions: int) -> None:
    """Refuse, before compiling, a search that can never run: num_beams × vocab_size continuations beyond XLA's
    int32 top_k indices (JAX's own error named neither), or decoding state beyond the devices' memory. transformers
    bounds neither; XLA would allocate until refused, or until the process is killed. The state counted is a lower
    bound (each of `rows` × `beams` rows: its key/value cache of `positions` at 2 bytes a value, one row of float32
    scores), so only what is clearly impossible is refused."""
    V = config.vocab_size
    if beams * V > 2**31 - 1:
        raise ArgumentError(
            Arg.showing("num_beams", beams),
            f": beam search ranks num_beams × vocab_size = {beams * V:,} continuations a prompt, "
            "more than XLA's top_k indexes (2**31 - 1)",
        )
    width = sum(len(config.kept_heads(i)) for i in range(config.num_hidden_layers)) * config.head_size
    need, have = rows * beams * (2 * 2 * width * positions + 4 * V), device_memory()
    if have is not None and need > have:
        raise ArgumentError(
            f"{rows} rows (prompts × num_return_sequences, to a power of two) × ",
            Arg.showing("num_beams", beams),
            f": decoding needs at least {need / 2**30:.1f} GiB (key/value cache of {positions} positions and scores "
            f"over {V} tokens a row), more than the devices' {have / 2**30:.1f} GiB",
        )


def _loop_arguments(options: Options, n: int, live, limit: int, prompt_length: int) -> tuple:
    """What every decode loop takes after its inputs: max_new, live, the warp, the key; and the new-token bound."""
    temperature, top_k, top_p = options.warp
    min_new = jnp.int32(min(options.min_new(prompt_length), n))  # past n it changes nothing
    top_k = min(top_k, 2**31 - 1)  # beyond the vocabulary all are kept anyway; beyond int32 it was an OverflowError
    warp = Warp(jnp.float32(as_float32(temperature)), jnp.int32(top_k), jnp.float32(top_p), min_new)
    return (jnp.int32(n), live, warp, jax.random.key(options.seed)), batching.bucket(n, batching.length_buckets(limit))


def request(
    config: BertConfig, head: str, length_buckets, settings: dict, prompt_ids, attention_mask, given: dict
) -> Request:
    """Check everything and pad the prompt to (batch, length) buckets, rows copied, columns appended masked."""
    if head != "BertLMHeadModel" or not config.is_decoder:
        raise ValueError(
            f"generate needs a causal LM (BertLMHeadModel with is_decoder=true); this is {head} "
            f"with is_decoder={str(config.is_decoder).lower()}"
        )
    options = resolve(config, settings, given)
    if prompt_ids is None:
        if options.bos is None:
            raise ValueError("prompt_ids is None and the model has no bos_token_id to start from")
        prompt_ids = np.array([[options.bos]])
    check_arrays(config, prompt_ids, attention_mask, names=("prompt_ids", "attention_mask"))
    ids = np.asarray(prompt_ids)
    mask, positions = _mask_and_positions(ids, attention_mask, options.search)
    _check_rows(mask, options.search.pad if attention_mask is None else None)
    n = max_new_tokens(options, settings, config, ids.shape[1])
    _check_size(config, _padded(ids.shape[0] * options.expand), options.search.num_beams, ids.shape[1] + n)
    ids, mask, positions = (np.repeat(a, options.expand, axis=0) for a in (ids, mask, positions))
    padded, live = _rows((ids, mask, positions), ids.shape[0])
    loop, bound = _loop_arguments(options, n, live, config.max_position_embeddings, ids.shape[1])
    return Request(options.search, bound, (*_columns(padded, length_buckets), jnp.int32(ids.shape[1]), *loop), ids)


def seq2seq_request(config, length_buckets, settings: dict, input_ids, attention_mask, given: dict) -> Request:
    """A bert2bert's call (config an EncoderDecoderConfig): the encoder input padded to (batch, encoder length)
    buckets; the decoder prompt is the start token (one, or one per row), and the output starts with it, as
    transformers'."""
    options = resolve(config, settings, given)
    if options.start is None:
        raise ValueError(
            "decoder_start_token_id: not given nor in the generation config (generation_config.json, else "
            "config.json), and no bos_token_id to fall back on"
        )
    check_arrays(config.encoder, input_ids, attention_mask)
    ids = np.asarray(input_ids)
    mask = np.ones(ids.shape, np.int32) if attention_mask is None else np.asarray(attention_mask).astype(np.int32)
    _check_rows(mask)
    n = max_new_tokens(options, settings, config.decoder, 1, prompt="decoder start token", capped=False)
    start = np.asarray(options.start, np.int32)
    if start.ndim == 1 and len(start) != ids.shape[0]:
        raise ValueError(
            f"decoder_start_token_id {list(options.start)}: one start token per input row, "
            f"got {len(start)} for {ids.shape[0]} rows"
        )
    start = np.broadcast_to(start.reshape(-1, 1), (ids.shape[0], 1))
    _check_size(config.decoder, _padded(ids.shape[0] * options.expand), options.search.num_beams, 1 + n)
    ids, mask, start = (np.repeat(a, options.expand, axis=0) for a in (ids, mask, start))
    (ids, mask, first), live = _rows((ids, mask, start), ids.shape[0])
    loop, bound = _loop_arguments(options, n, live, config.decoder.max_position_embeddings, 1)
    return Request(options.search, bound, (*_columns((ids, mask), length_buckets), jnp.asarray(first), *loop), start)
