"""Autoregressive decoding over a preallocated key/value cache: greedy search, multinomial sampling and beam
search, each one `lax.while_loop`, as pure functions of a model-agnostic step

    step(cache, ids [R, L], mask [R, L], positions [R, L]) -> (logits [R, L, V] float32, cache)

which runs the model on L new tokens per row and writes their keys at `cache.index`. The cache is KVCache-like
(cache.py): a pytree with `index` [R], `replace` and `reorder(rows)`; beam search gathers the rows of the beams it
keeps instead of recomputing their prefixes. A decoder-only LM passes an empty cache and its prompt; an
encoder-decoder passes a cache already holding the cross-attention keys and the decoder start token as prompt.

Shapes are fixed per program: R rows, the prompt padded on the right to Pb columns (its real length `length`
traced), at most `bound` new tokens (static; the number asked for, `max_new`, traced). So one program serves every
prompt length and max_new_tokens within its buckets, and the loop never re-enters Python per token. Rows beyond the
caller's batch (`live` false) ride along and never keep the loop running.

Semantics are transformers 5's `generate` token for token (generation/utils.py `_sample`, `_beam_search` and its
helpers, logits_process.py's warpers in their order), including what it pads finished rows and hypotheses with and
when beam search stops. Sampling draws from `jax.random` (reproducible from the key, not torch's stream).
Shapes: R rows, B batch, K beams, N = bound, V vocabulary.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

Step = Callable[..., tuple[Array, Any]]
_NEG = -1.0e9  # transformers' "impossible" score: added, not a -inf, so ranks among the excluded stay defined


@dataclasses.dataclass(frozen=True)
class Search:
    """The static choices: part of a compiled program's identity. `pad` is transformers' resolved pad id (eos[0]
    when the model has none); None only without eos ids, when nothing is ever padded."""

    num_beams: int = 1
    do_sample: bool = False
    eos: tuple[int, ...] = ()
    pad: int | None = 0
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    num_return_sequences: int = 1
    no_repeat_ngram_size: int = 0  # 0: off
    repetition_penalty: float = 1.0  # 1: off

    @property
    def needs_prompt(self) -> bool:
        """The processors that read the prompt and the tokens so far are on."""
        return bool(self.no_repeat_ngram_size) or self.repetition_penalty != 1.0

    @property
    def fill(self) -> int:
        """What beam search writes after a hypothesis ends: transformers' `pad_token_id or eos_token_id[0]`, so a
        pad id of 0 gives way to eos."""
        return (self.pad or self.eos[0]) if self.eos else -1


# The temperatures warp_logits divides by; any other acts as the nearer bound, which draws alike (the shifted logits
# over the smallest are -inf but the top ones: greedy; over the largest all alike: uniform). Float32's smallest
# normal, as a subnormal one flushed to zero made 0 / 0; its reciprocal 2**126, as XLA divides by multiplying by
# 1 / T, flushed to zero beyond it: a -inf logit (eos before min_new_tokens) times 0 was NaN, drawn as the likeliest.
TEMPERATURES = (float(jnp.finfo(jnp.float32).tiny), 2.0**126)


def as_float32(x: float) -> float:
    """A knob (a penalty, the temperature) as float32 sees it: beyond float32's range, +-inf (as torch casts
    transformers' penalties), without the 'overflow encountered in cast' warning numpy printed when JAX cast 1e300
    itself. The temperature's bounds are warp_logits' (TEMPERATURES)."""
    with np.errstate(over="ignore"):
        return float(np.float32(x))


class Warp(NamedTuple):
    """The traced knobs (changing them does not compile): sampling's temperature, top_k (0: off), top_p (1: off);
    and for every search `min_new`, the new tokens before which eos is impossible (transformers' min_new_tokens /
    min_length processors, applied before the warpers)."""

    temperature: Float[Array, ""]
    top_k: Int[Array, ""]
    top_p: Float[Array, ""]
    min_new: Int[Array, ""] | int = 0


def _no_repeat(
    scores: Float[Array, "R V"], prompt, length, tokens: Int[Array, "R N"], t, search: Search
) -> Float[Array, "R V"]:
    """transformers' NoRepeatNGramLogitsProcessor: a token that would complete an n-gram already in the sequence
    (the prompt's `length` columns as given, padding ids included, then the `t` tokens chosen) is at -inf."""
    n = search.no_repeat_ngram_size
    seq = jnp.pad(prompt, ((0, 0), (0, tokens.shape[1])))
    if not n or n > seq.shape[1]:  # an n-gram longer than the whole sequence is never completed: nothing banned
        return scores
    seq = jax.lax.dynamic_update_slice(seq, tokens.astype(seq.dtype), (0, length))
    cur = length + t  # tokens so far; the next completes the n-gram of the last n - 1
    W = seq.shape[1] - n + 1  # window starts
    last = jax.lax.dynamic_slice_in_dim(seq, cur - (n - 1), n - 1, axis=1)
    match = jnp.arange(W)[None, :] + n - 1 < cur
    for i in range(n - 1):
        match = match & (seq[:, i : i + W] == last[:, i : i + 1])
    rows = jnp.arange(seq.shape[0])[:, None]
    banned = jnp.zeros(scores.shape, jnp.int32).at[rows, seq[:, n - 1 : n - 1 + W]].max(match.astype(jnp.int32))
    return jnp.where((banned > 0) & (cur >= n - 1), -jnp.inf, scores)


def _penalize(
    scores: Float[Array, "R V"], prompt: Int[Array, "R P"], length, tokens: Int[Array, "R N"], t, search: Search
) -> Float[Array, "R V"]:
    """transformers' RepetitionPenaltyLogitsProcessor: each token already in the sequence (the prompt's `length`
    columns as given, padding ids included, then the `t` tokens chosen) has its score multiplied by the penalty
    where negative, divided by it where not (so a penalty > 1 makes it less likely either way)."""
    p = as_float32(search.repetition_penalty)
    if p == 1.0:
        return scores
    rows = jnp.arange(scores.shape[0])[:, None]
    seen = jnp.zeros(scores.shape, jnp.int32)
    seen = seen.at[rows, prompt].max((jnp.arange(prompt.shape[1]) < length).astype(jnp.int32)[None, :])
    seen = seen.at[rows, tokens].max((jnp.arange(tokens.shape[1]) < t).astype(jnp.int32)[None, :])
    return jnp.where(seen > 0, jnp.where(scores < 0, scores * p, scores / p), scores)


def _no_eos_yet(scores: Float[Array, "R V"], t, warp: Warp | None, search: Search) -> Float[Array, "R V"]:
    """eos at -inf while fewer than `warp.min_new` tokens are generated (`t` so far)."""
    if warp is None or not search.eos:
        return scores
    eos = jnp.isin(jnp.arange(scores.shape[-1]), jnp.asarray(search.eos))
    return jnp.where(eos & (t < warp.min_new), -jnp.inf, scores)


def warp_logits(logits: Float[Array, "R V"], warp: Warp) -> Float[Array, "R V"]:
    """Temperature, then top-k, then top-p, as transformers' warpers (filtered tokens become -inf)."""
    scores = logits / jnp.clip(warp.temperature, *TEMPERATURES)
    ranked = jnp.sort(scores, axis=-1)  # ascending
    k = jnp.clip(warp.top_k, 1, scores.shape[-1])
    kth = jax.lax.dynamic_index_in_dim(ranked, scores.shape[-1] - k, axis=-1)
    scores = jnp.where((warp.top_k > 0) & (scores < kth), -jnp.inf, scores)
    order = jnp.argsort(scores, axis=-1)
    cumulative = jnp.cumsum(jax.nn.softmax(jnp.take_along_axis(scores, order, -1), axis=-1), axis=-1)
    drop = (cumulative <= 1 - warp.top_p).at[:, -1].set(False)  # the most probable token always stays
    drop = jnp.zeros_like(drop).at[jnp.arange(drop.shape[0])[:, None], order].set(drop)
    return jnp.where((warp.top_p < 1) & drop, -jnp.inf, scores)


def prefill(
    step: Step,
    cache,
    ids: Int[Array, "R P"],
    mask: Int[Array, "R P"],
    positions: Int[Array, "R P"],
    length: Int[Array, ""],
):
    """Run the prompt; returns (logits after its last real column [R, V], cache, position of the next token [R]).
    The bucket's padding columns sit after the prompt: rewinding `index` to `length` lets the new tokens overwrite
    their slots, so a cache as long as the positions fits any prompt + new tokens that fits the positions."""
    logits, cache = step(cache, ids, mask, positions)
    last = jax.lax.dynamic_index_in_dim(logits, length - 1, axis=1, keepdims=False)
    start = jax.lax.dynamic_index_in_dim(positions, length - 1, axis=1, keepdims=False) + 1
    return last, cache.replace(index=jnp.full_like(cache.index, length)), start


def _feed(step: Step, cache, last: Int[Array, " R"], start: Int[Array, " R"], t):
    """One decoding forward: the token chosen at step t-1, at its row's next position; its logits [R, V]."""
    ids = last[:, None].astype(jnp.int32)
    logits, cache = step(cache, ids, jnp.ones_like(ids), (start + t - 1)[:, None])
    return logits[:, -1], cache


# -- greedy search and sampling (transformers' `_sample`) ------------------------------------------------------------
class _Rows(NamedTuple):
    t: Int[Array, ""]  # tokens chosen so far
    tokens: Int[Array, "R N"]
    unfinished: Bool[Array, " R"]
    cache: Any


def _pick(search: Search, warp: Warp | None, rng, s: _Rows, logits: Float[Array, "R V"], prompt=None) -> _Rows:
    # transformers' processor order: repetition penalty, no-repeat n-grams, min length; then the warpers
    if prompt is not None:
        logits = _no_repeat(_penalize(logits, *prompt, s.tokens, s.t, search), *prompt, s.tokens, s.t, search)
    logits = _no_eos_yet(logits, s.t, warp, search)
    if search.do_sample:
        # One key per (step, row): a row's draws do not depend on how many rows share the batch.
        keys = jax.vmap(lambda r: jax.random.fold_in(jax.random.fold_in(rng, s.t), r))(jnp.arange(logits.shape[0]))
        # The largest logit moved to 0 first (the draw does not change): a temperature near 0 then sends the others
        # to -inf and the draw to greedy's token, where logits / 1e-45 made every positive logit +inf, drawn alike.
        shifted = logits - logits.max(axis=-1, keepdims=True)
        token = jax.vmap(jax.random.categorical)(keys, warp_logits(shifted, warp))
    else:
        token = jnp.argmax(logits, axis=-1)
    unfinished = s.unfinished
    if search.eos:
        token = jnp.where(unfinished, token, search.pad)
        unfinished = unfinished & ~jnp.isin(token, jnp.asarray(search.eos))
    tokens = jax.lax.dynamic_update_slice(s.tokens, token[:, None].astype(s.tokens.dtype), (0, s.t))
    return _Rows(s.t + 1, tokens, unfinished, s.cache)


def sample(
    step: Step,
    cache,
    logits: Float[Array, "R V"],
    start: Int[Array, " R"],
    max_new: Int[Array, ""],
    live: Bool[Array, " R"],
    search: Search,
    bound: int,
    warp: Warp | None = None,
    rng=None,
    prompt=None,
):
    """Greedy (argmax) or sampled tokens after a prefill: (tokens [R, N], steps run). Finished rows get pad.
    `prompt`: (ids [R, P], length), for no_repeat_ngram_size and repetition_penalty."""
    s = _Rows(jnp.int32(0), jnp.full((logits.shape[0], bound), search.pad or 0, jnp.int32), live, cache)
    s = _pick(search, warp, rng, s, logits, prompt)

    def body(s: _Rows) -> _Rows:
        logits, cache = _feed(step, s.cache, s.tokens[jnp.arange(s.tokens.shape[0]), s.t - 1], start, s.t)
        return _pick(search, warp, rng, s._replace(cache=cache), logits, prompt)

    s = jax.lax.while_loop(lambda s: (s.t < max_new) & jnp.any(s.unfinished), body, s)
    return s.tokens, s.t


# -- beam search (transformers' `_beam_search`) ----------------------------------------------------------------------
class _Beams(NamedTuple):
    t: Int[Array, ""]
    running: Int[Array, "B K N"]  # the K live hypotheses
    running_scores: Float[Array, "B K"]  # their summed log-probabilities
    source: Int[Array, " BK"]  # the cache row each live hypothesis continues
    sequences: Int[Array, "B K N"]  # the K best finished hypotheses
    scores: Float[Array, "B K"]  # theirs, length-penalized
    lengths: Int[Array, "B K"]  # their generated lengths (0: none yet)
    finished: Bool[Array, "B K"]
    open: Bool[Array, " B"]  # the early-stopping heuristic says a live hypothesis may still beat a finished one
    going: Bool[Array, ""]
    cache: Any


def _gather(a: Array, index: Int[Array, "B J"]) -> Array:
    return jnp.take_along_axis(a, index.reshape(index.shape + (1,) * (a.ndim - 2)), axis=1)


def _candidates(s: _Beams, logits: Float[Array, "BK V"], search: Search, warp: Warp | None, prompt=None):
    """transformers' `_get_top_k_continuations`: the best max(2, 1 + #eos) * K of all K * V continuations (the
    processors, here repetition_penalty, no_repeat_ngram_size and min_new, act on the log-probabilities)."""
    B, K, N = s.running.shape
    V = logits.shape[-1]
    logp = jax.nn.log_softmax(logits, axis=-1)
    if prompt is not None:
        ids, length = prompt
        seq = (jnp.repeat(ids, K, axis=0), length, s.running.reshape(B * K, N), s.t, search)
        logp = _no_repeat(_penalize(logp, *seq), *seq)
    logp = _no_eos_yet(logp, s.t, warp, search)
    logp = logp.reshape(B, K, V) + s.running_scores[..., None]
    top, index = jax.lax.top_k(logp.reshape(B, K * V), max(2, 1 + len(search.eos)) * K)
    beam, token = index // V, index % V
    tokens = jax.lax.dynamic_update_slice(_gather(s.running, beam), token[..., None].astype(jnp.int32), (0, 0, s.t))
    return top, beam, token, tokens


def _finish(s: _Beams, top, tokens, hits, search: Search):
    """transformers' `_update_finished_beams`: merge the top-K candidates that just ended into the finished set."""
    K = s.running.shape[1]
    just = hits & (jnp.arange(top.shape[1]) < K)
    scores = top / (s.t + 1).astype(jnp.float32) ** as_float32(search.length_penalty)
    if search.early_stopping is True:
        scores = scores + jnp.where(jnp.all(s.finished, -1, keepdims=True), _NEG, 0.0)
    scores = scores + jnp.where(s.open[:, None], 0.0, _NEG)
    scores = scores + jnp.where(just, 0.0, _NEG)
    merged = jnp.concatenate([s.scores, scores], axis=1)
    best = jax.lax.top_k(merged, K)[1]
    lengths = jnp.concatenate([s.lengths, jnp.broadcast_to(s.t + 1, just.shape)], axis=1)
    return (
        _gather(jnp.concatenate([s.sequences, tokens], 1), best),
        _gather(merged, best),
        _gather(lengths, best),
        _gather(jnp.concatenate([s.finished, just], 1), best),
    )


def _beam_step(s: _Beams, logits: Float[Array, "BK V"], max_new, live, search: Search, warp=None, prompt=None):
    """One iteration of transformers' beam search after the forward pass."""
    B, K, _ = s.running.shape
    top, beam, token, tokens = _candidates(s, logits, search, warp, prompt)
    hits = jnp.isin(token, jnp.asarray(search.eos)) | (s.t + 1 >= max_new) | ~live[:, None]
    running = top + jnp.where(hits, _NEG, 0.0)
    keep = jax.lax.top_k(running, K)[1]
    source = (_gather(beam, keep) + jnp.arange(B)[:, None] * K).reshape(-1)
    sequences, scores, lengths, finished = _finish(s, top, tokens, hits, search)
    lp = as_float32(search.length_penalty)
    horizon = max_new if search.early_stopping == "never" and lp > 0 else s.t + 1
    best_running = _gather(running, keep)[:, :1] / horizon.astype(jnp.float32) ** lp
    worst = jnp.where(finished, jnp.min(scores, -1, keepdims=True), _NEG)
    is_open = s.open & jnp.any(best_running > worst, axis=-1)
    going = jnp.any(is_open) & ~jnp.all(hits)
    if search.early_stopping is True:
        going = going & ~jnp.all(finished)
    return _Beams(
        s.t + 1,
        _gather(tokens, keep),
        _gather(running, keep),
        source,
        sequences,
        scores,
        lengths,
        finished,
        is_open,
        going,
        s.cache,
    )


def beam_search(
    step: Step,
    cache,
    logits: Float[Array, "B V"],
    start: Int[Array, " B"],
    max_new: Int[Array, ""],
    live: Bool[Array, " B"],
    search: Search,
    bound: int,
    warp: Warp | None = None,
    prompt=None,
):
    """Beam search after a prefill of B rows: (hypotheses [B, num_return_sequences, N], their longest length).
    The prefilled rows are copied to K beams each (by `reorder`, as every later step keeps its beams)."""
    B, K = logits.shape[0], search.num_beams
    rows = jnp.repeat(jnp.arange(B), K)
    start = start[rows]
    fill = jnp.full((B, K, bound), search.fill, jnp.int32)
    first = jnp.where(jnp.arange(K) == 0, 0.0, _NEG)  # all beams start equal: only the first may expand
    s = _Beams(
        jnp.int32(0),
        fill,
        jnp.broadcast_to(first, (B, K)),
        rows,
        fill,
        jnp.full((B, K), _NEG),
        jnp.zeros((B, K), jnp.int32),
        jnp.broadcast_to(~live[:, None], (B, K)),
        live,
        jnp.bool_(True),
        cache.reorder(rows),
    )
    s = _beam_step(s, logits[rows], max_new, live, search, warp, prompt)

    def body(s: _Beams) -> _Beams:
        last = s.running[:, :, s.t - 1].reshape(-1)
        logits, cache = _feed(step, s.cache.reorder(s.source), last, start, s.t)
        return _beam_step(s._replace(cache=cache), logits, max_new, live, search, warp, prompt)

    s = jax.lax.while_loop(lambda s: s.going & (s.t < bound), body, s)
    n = search.num_return_sequences
    return s.sequences[:, :n], jnp.max(jnp.where(live[:, None], s.lengths[:, :n], 0))


def decode(
    step: Step,
    cache,
    ids: Int[Array, "R P"],
    mask: Int[Array, "R P"],
    positions: Int[Array, "R P"],
    length: Int[Array, ""],
    max_new: Int[Array, ""],
    live: Bool[Array, " R"],
    *,
    search: Search,
    bound: int,
    warp: Warp | None = None,
    rng=None,
):
    """Prefill then decode. Returns (tokens [R, N], steps run) for greedy search and sampling, (hypotheses
    [R, num_return_sequences, N], longest length) for beam search; columns past those lengths are filler."""
    logits, cache, start = prefill(step, cache, ids, mask, positions, length)
    prompt = (ids, length) if search.needs_prompt else None
    if search.num_beams == 1:
        return sample(step, cache, logits, start, max_new, live, search, bound, warp, rng, prompt)
    return beam_search(step, cache, logits, start, max_new, live, search, bound, warp, prompt)
