"""The host side of `Bert.generate`: options with their defaults (arguments, then the checkpoint's
generation_config.json, then config.json, then transformers' own), checks that name what is wrong, the prompt padded
to shape buckets with transformers' attention mask and position ids, and the output assembled from the device's.

Defaults and derived inputs follow transformers 5's `generate`: an absent attention mask is inferred from pad
tokens in the prompt (unless pad is an eos id); position ids are the mask's cumulative sum minus one (0 on
padding); new tokens continue from each row's last position; max_new_tokens defaults to 20 within the positions.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxbert import batching
from jaxbert.config import BertConfig
from jaxbert.files import existing_file, read_json
from jaxbert.generate import Search, Warp
from jaxbert.inputs import check_arrays, positive_int

KNOBS = {"max_new_tokens": None, "num_beams": 1, "do_sample": False, "temperature": 1.0, "top_k": 50,
         "top_p": 1.0, "length_penalty": 1.0, "early_stopping": False, "num_return_sequences": 1}
# generation_config.json settings that change what transformers generates and that jaxbert does not implement
_UNSUPPORTED = {"repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "min_length": 0, "min_new_tokens": None,
                "bad_words_ids": None, "forced_bos_token_id": None, "forced_eos_token_id": None,
                "suppress_tokens": None, "begin_suppress_tokens": None, "typical_p": 1.0, "min_p": None,
                "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "num_beam_groups": 1, "sequence_bias": None,
                "exponential_decay_length_penalty": None, "renormalize_logits": False, "stop_strings": None}


def file_settings(directory: str | None) -> dict:
    """generation_config.json of `directory` ({} when there is none); settings jaxbert cannot honour are refused."""
    path = existing_file(directory, "generation_config.json") if directory else None
    settings = read_json(path) if path else {}
    for key, default in _UNSUPPORTED.items():
        if settings.get(key, default) not in (default, None):
            raise ValueError(f"{path}: {key}={settings[key]!r} is not implemented by jaxbert's generate")
    return settings


def _number(name: str, value, low: float, high: float, low_open: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    if not (math.isfinite(value) and (low < value if low_open else low <= value) and value <= high):
        raise ValueError(f"{name} {value}: must be in {'(' if low_open else '['}{low}, {high}]")
    return float(value)


def _token_ids(name: str, value, vocab: int) -> tuple[int, ...]:
    if value is None:
        return ()
    ids = (value,) if isinstance(value, (int, np.integer)) and not isinstance(value, bool) else tuple(value)
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i < vocab:
            raise ValueError(f"{name} {value!r}: token ids must be integers in [0, vocab_size={vocab})")
    return tuple(int(i) for i in ids)


@dataclasses.dataclass(frozen=True)
class Options:
    """Resolved and checked; `search` is static under jit, the rest is traced or host-side."""

    search: Search
    max_new_tokens: int | None
    warp: tuple[float, int, float]
    seed: int
    bos: int | None
    expand: int  # rows per prompt row before decoding (sampling's num_return_sequences)


def resolve(config: BertConfig, settings: dict, given: dict) -> Options:
    """`given` (the caller's arguments, None for unset) over `settings` (generation_config.json) over the model
    config's special tokens over transformers' defaults (KNOBS)."""
    def pick(name, fallback=None):
        return next((v for v in (given.get(name), settings.get(name)) if v is not None), fallback)

    o = {name: pick(name, default) for name, default in KNOBS.items()}
    beams = positive_int("num_beams", o["num_beams"])
    returned = positive_int("num_return_sequences", o["num_return_sequences"], beams if beams > 1 else None)
    if not isinstance(o["do_sample"], bool):
        raise TypeError(f"do_sample must be true or false, got {o['do_sample']!r}")
    if o["do_sample"] and beams > 1:
        raise ValueError(f"do_sample=True with num_beams={beams}: beam-search sampling is not implemented")
    if returned > 1 and not o["do_sample"] and beams == 1:
        raise ValueError(f"num_return_sequences {returned}: greedy search returns one sequence per prompt")
    if o["early_stopping"] not in (True, False, "never"):
        raise ValueError(f"early_stopping {o['early_stopping']!r}: must be true, false or 'never'")
    top_k = o["top_k"]
    if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 0:
        raise ValueError(f"top_k {top_k!r}: must be an integer ≥ 0 (0 turns it off)")
    warp = (_number("temperature", o["temperature"], 0.0, math.inf), int(top_k), _number("top_p", o["top_p"], 0, 1))
    penalty = _number("length_penalty", o["length_penalty"], -math.inf, math.inf)
    V = config.vocab_size
    eos = _token_ids("eos_token_id", pick("eos_token_id", config.extra.get("eos_token_id")), V)
    pad = pick("pad_token_id", config.pad_token_id)
    pad = eos[0] if pad is None and eos else pad  # transformers pads with eos when the model has no pad token
    pad = None if pad is None else _token_ids("pad_token_id", pad, V)[0]
    bos = pick("bos_token_id", config.extra.get("bos_token_id"))
    bos = None if bos is None else _token_ids("bos_token_id", bos, V)[0]
    seed = given.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an integer, got {type(seed).__name__} {seed!r}")
    if beams == 1:  # beam-only settings must not split greedy/sampling programs
        search = Search(1, o["do_sample"], eos, pad)
    else:
        search = Search(beams, False, eos, pad, penalty, o["early_stopping"], returned)
    return Options(search, o["max_new_tokens"], warp, int(seed), bos, returned if beams == 1 else 1)


def _max_new_tokens(options: Options, settings: dict, config: BertConfig, prompt_length: int) -> int:
    limit = config.max_position_embeddings
    n = options.max_new_tokens
    if n is None:  # transformers: max_length (default 20 new tokens, capped by the positions) minus the prompt
        n = (positive_int("max_length", settings["max_length"]) - prompt_length if "max_length" in settings
             else min(20, limit - prompt_length))
    n = positive_int("max_new_tokens", n)
    if prompt_length + n > limit:
        raise ValueError(f"prompt length {prompt_length} + max_new_tokens {n} = {prompt_length + n} exceeds "
                         f"max_position_embeddings {limit}")
    return n


def _mask_and_positions(ids: np.ndarray, mask, search: Search):
    """transformers' `_prepare_attention_mask_for_generation` and `_prepare_position_ids_for_generation`."""
    if mask is None and search.pad is not None and search.pad not in search.eos and (ids == search.pad).any():
        mask = ids != search.pad
    if mask is None:
        return np.ones(ids.shape, np.int32), np.broadcast_to(np.arange(ids.shape[1], dtype=np.int32), ids.shape)
    mask = np.asarray(mask).astype(np.int32)
    return mask, np.where(mask == 1, np.cumsum(mask, axis=1) - 1, 0).astype(np.int32)


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


def request(config: BertConfig, head: str, length_buckets, settings: dict, prompt_ids, attention_mask,
            given: dict) -> Request:
    """Check everything and pad the prompt to (batch, length) buckets, rows copied, columns appended masked."""
    if head != "BertLMHeadModel" or not config.is_decoder:
        raise ValueError(f"generate needs a causal LM (BertLMHeadModel with is_decoder=true); this is {head} "
                         f"with is_decoder={str(config.is_decoder).lower()}")
    options = resolve(config, settings, given)
    if prompt_ids is None:
        if options.bos is None:
            raise ValueError("prompt_ids is None and the model has no bos_token_id to start from")
        prompt_ids = np.array([[options.bos]])
    check_arrays(config, prompt_ids, attention_mask)
    ids = np.asarray(prompt_ids)
    mask, positions = _mask_and_positions(ids, attention_mask, options.search)
    n = _max_new_tokens(options, settings, config, ids.shape[1])
    ids, mask, positions = (np.repeat(a, options.expand, axis=0) for a in (ids, mask, positions))
    rows, length = ids.shape
    R = 1 << (rows - 1).bit_length()  # powers of two: few programs whatever the batch
    P = batching.bucket(length, tuple(length_buckets))
    pick = np.where(np.arange(R) < rows, np.arange(R), 0)  # extra rows repeat row 0
    padded = [np.pad(a[pick], ((0, 0), (0, P - length))).astype(np.int32) for a in (ids, mask, positions)]
    temperature, top_k, top_p = options.warp
    arrays = (*map(jnp.asarray, padded), jnp.int32(length), jnp.int32(n), jnp.asarray(np.arange(R) < rows),
              Warp(jnp.float32(temperature), jnp.int32(top_k), jnp.float32(top_p)), jax.random.key(options.seed))
    bound = batching.bucket(n, batching.length_buckets(config.max_position_embeddings))
    return Request(options.search, bound, arrays, ids)
