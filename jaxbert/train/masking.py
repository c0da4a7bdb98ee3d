"""BERT's masking, on the host with a numpy Generator seeded per step (no global RNG): deterministic from
(seed, step), so a resumed run masks exactly as the uninterrupted one did.

Of the non-special tokens, `probability` are selected (whole words at a time with `continuation`); of those
80% become [MASK], 10% a random token, 10% stay. At most `max_predictions` per sequence (as BERT's
max_predictions_per_seq: a random subset where more were drawn): the loss gathers these positions before the
vocabulary projection.
"""

from __future__ import annotations

import numpy as np


def _select(ids, maskable, rng, probability, continuation):
    if continuation is None:
        return (rng.random(ids.shape) < probability) & maskable
    # A word starts at every maskable token that is not a '##' continuation of a maskable neighbour.
    prev_maskable = np.pad(maskable[:, :-1], ((0, 0), (1, 0)))
    starts = maskable & ~(continuation[ids] & prev_maskable)
    word = np.cumsum(starts, axis=1)  # word number of each token (continuations share their start's)
    chosen_start = starts & (rng.random(ids.shape) < probability)
    chosen_words = np.zeros((ids.shape[0], ids.shape[1] + 1), bool)
    rows = np.nonzero(chosen_start)[0]
    chosen_words[rows, word[chosen_start]] = True
    return np.take_along_axis(chosen_words, word, axis=1) & maskable


def _cap(selected, max_predictions, continuation, ids, rng):
    """At most max_predictions selected tokens per row: where more were selected, a uniformly random subset of them
    (whole words at a time with `continuation`, a word that does not fit skipped), as BERT's create_pretraining_data
    takes shuffled candidates. Keeping the first ones instead masked a row's later positions less often
    (--max-predictions-per-seq 20 at 128 tokens: the last quarter 0.117 against the first's 0.150)."""
    over = np.flatnonzero(selected.sum(1) > max_predictions)
    if over.size == 0:  # the usual case: no draw, so the Generator's stream is as without a cap
        return selected
    selected = selected.copy()
    for r in over:
        cols = np.flatnonzero(selected[r])
        # A piece continues the word before it when it is a '##' continuation of a selected neighbour.
        joined = (continuation[ids[r, cols]] & selected[r, cols - 1]) if continuation is not None else cols < 0
        words = np.split(cols, np.flatnonzero(~joined[1:]) + 1)
        selected[r] = False
        room = max_predictions
        for w in rng.permutation(len(words)):
            if len(words[w]) <= room:
                selected[r, words[w]] = True
                room -= len(words[w])
    return selected


def mask_tokens(
    ids: np.ndarray,
    *,
    rng: np.random.Generator,
    special_ids,
    mask_id: int,
    vocab_size: int,
    probability: float = 0.15,
    max_predictions: int,
    continuation: np.ndarray | None = None,
):
    """ids [N, L] -> (inputs [N, L], positions [N, K], labels [N, K] with -100 in unused slots)."""
    maskable = ~np.isin(ids, np.asarray(list(special_ids)))
    selected = _cap(_select(ids, maskable, rng, probability, continuation), max_predictions, continuation, ids, rng)
    roll = rng.random(ids.shape)
    inputs = ids.copy()
    inputs[selected & (roll < 0.8)] = mask_id
    random_slots = selected & (roll >= 0.8) & (roll < 0.9)
    inputs[random_slots] = rng.integers(0, vocab_size, int(random_slots.sum()))
    # Selected positions first, in order: a stable sort of "not selected".
    positions = np.argsort(~selected, axis=1, kind="stable")[:, :max_predictions].astype(np.int32)
    valid = np.arange(max_predictions)[None, :] < selected.sum(1, keepdims=True)
    labels = np.where(valid, np.take_along_axis(ids, positions, axis=1), -100).astype(np.int32)
    return inputs.astype(np.int32), np.where(valid, positions, 0), labels


def default_max_predictions(seq_len: int, probability: float) -> int:
    """Room for the selection count up to about 5 standard deviations above its mean."""
    mean = seq_len * probability
    return int(min(seq_len, np.ceil(mean + 5 * np.sqrt(mean * (1 - probability)) + 1)))
