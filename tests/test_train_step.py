"""The pure train step's gradient accumulation: A micro-batches give the update of the whole batch in one piece,
however the labelled tokens (or real rows) are spread over the micro-batches; label smoothing is refused for
labels it cannot apply to; the one-pass AdamW equals optax's chain."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import model_dir

import jaxbert
from jaxbert.cli import main
from jaxbert.train.state import OptimConfig, init_state, optimizer, reference_optimizer, schedule
from jaxbert.train.step import train_step

CONFIG = jaxbert.BertConfig(
    vocab_size=50,
    hidden_size=16,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=24,
    max_position_embeddings=32,
    id2label={0: "a", 1: "b", 2: "c"},
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
)
B, L = 4, 10


def _batch(head: str) -> dict:
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 50, (B, L)).astype(np.int32)
    lengths = np.array([10, 3, 9, 2])  # the first micro-batch (rows 0-1) holds most of the tokens
    mask = (np.arange(L) < lengths[:, None]).astype(np.int32)
    batch = {"input_ids": ids, "attention_mask": mask}
    if head == "BertForTokenClassification":
        batch["labels"] = np.where(mask == 1, rng.integers(0, 3, (B, L)), -100).astype(np.int32)
    else:  # regression, the third row padding (weight 0), as the task batcher fills a bucket
        batch["labels"] = rng.normal(size=(B,)).astype(np.float32)
        batch["sample_weight"] = np.array([1, 1, 0, 1], np.float32)
    return batch


def _max_diff(a, b) -> float:
    """The largest |a - b| over two trees of arrays, in float32 on the host: op by op on the device it compiled a
    subtract, abs and max for every leaf shape."""
    a, b = jax.device_get((a, b))
    diff = jax.tree_util.tree_map(lambda x, y: float(np.abs(x - y).max()), a, b)
    return max(jax.tree_util.tree_leaves(diff))


@pytest.mark.parametrize("head", ["BertForTokenClassification", "BertForSequenceClassification"])
def test_accumulated_step_equals_the_whole_batch(head):
    config = CONFIG if head == "BertForTokenClassification" else CONFIG.replace(id2label={0: "score"}, label2id=None)
    opt = OptimConfig(learning_rate=1e-2, total_steps=10)
    tx = optimizer(opt)
    state = init_state(jaxbert.init_params(config, jax.random.key(0), head), tx)
    batch = _batch(head)
    step = jax.jit(
        lambda s, b: train_step(s, b, jax.random.key(1), config=config, tx=tx, schedule=schedule(opt), head=head)
    )
    # A half's own loss (each half alone, below) is that of a step over two copies of it: the split program again.
    twice = [jax.tree_util.tree_map(lambda a, h=h: np.stack([a[2 * h : 2 * h + 2]] * 2), batch) for h in (0, 1)]
    with jax.default_matmul_precision("highest"):
        whole, m_whole = step(state, jax.tree_util.tree_map(lambda a: a[None], batch))
        split, m_split = step(state, jax.tree_util.tree_map(lambda a: a.reshape(2, B // 2, *a.shape[1:]), batch))
        halves = [float(step(state, b)[1]["loss"]) for b in twice]
    np.testing.assert_allclose(float(m_split["loss"]), float(m_whole["loss"]), rtol=1e-6)
    np.testing.assert_allclose(float(m_split["grad_norm"]), float(m_whole["grad_norm"]), rtol=1e-5)
    assert _max_diff(whole.params, split.params) <= 1e-6
    # The micro-batches' means averaged unweighted differ from the whole batch's loss: the checks above can fail.
    assert abs(np.mean(halves) - float(m_whole["loss"])) > 1e-3


def test_label_smoothing_is_refused_for_regression(tmp_path, capsys):
    model = model_dir(tmp_path / "m", "BertForSequenceClassification", max_position_embeddings=64)
    data = tmp_path / "scores.jsonl"
    data.write_text("".join(json.dumps({"text": f"text {i}", "label": i / 10}) + "\n" for i in range(20)))
    args = ["train", "--task", "sequence-classification", "--model", str(model), "--train-file", str(data)]
    args += ["--output-dir", str(tmp_path / "out"), "--max-steps", "1", "--max-seq-length", "64"]
    capsys.readouterr()
    code = main([*args, "--label-smoothing", "0.1"])
    err = capsys.readouterr().err
    assert code == 1 and "--label-smoothing 0.1: applies to classes, not to regression labels" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "out" / "checkpoints").exists()
    # Without it: 5% of 20 rows is one validation example, too few for correlations (found before training).
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "scores.jsonl: 1 example to score (the 5% held out for validation; pass --validation-file" in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
@pytest.mark.parametrize("max_grad_norm", [0.0, 1.0])
def test_one_pass_adamw_equals_optax_chain(weight_decay, max_grad_norm):
    """optimizer() computes optax's clip + AdamW chain (reference_optimizer) per parameter in one expression: the
    same state tree leaf for leaf (checkpoints resume under either), and the same parameters and moments over
    steps that clip and steps that do not, with warm-up and decay masked off biases and LayerNorm."""
    cfg = OptimConfig(
        learning_rate=1e-2, weight_decay=weight_decay, max_grad_norm=max_grad_norm, warmup_steps=2, total_steps=6
    )
    params = jaxbert.init_params(CONFIG, jax.random.key(0), "BertForSequenceClassification")
    runs, norms = [], []
    for tx in (optimizer(cfg), reference_optimizer(cfg)):
        p, state = params, tx.init(params)
        assert jax.tree_util.tree_structure(state) == jax.tree_util.tree_structure(
            reference_optimizer(cfg).init(params)
        )
        rng = np.random.default_rng(1)
        update = jax.jit(tx.update)
        for i in range(5):
            scale = 10.0 if i % 2 else 1e-3  # the global norm above and below the limit in turn
            g = jax.tree_util.tree_map(lambda x, r=rng, s=scale: jnp.asarray(r.normal(size=x.shape) * s, x.dtype), p)
            norms.append(float(jnp.sqrt(sum(jnp.sum(x**2) for x in jax.tree_util.tree_leaves(g)))))
            u, state = update(g, state, p)
            p = jax.tree_util.tree_map(jnp.add, p, u)
        runs.append((p, state))
    assert min(norms) < 1.0 < max(norms)
    assert not np.allclose(np.asarray(runs[0][0]["classifier"]["kernel"]), np.asarray(params["classifier"]["kernel"]))
    for (path, got), want in zip(
        jax.tree_util.tree_flatten_with_path(runs[0])[0], jax.tree_util.tree_leaves(runs[1]), strict=True
    ):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-6, atol=1e-8, err_msg=str(path))


def test_accumulated_token_step_from_the_task_batcher_equals_the_whole_batch():
    """Token classification batches as the run builds them (--no-pack): the micro-batches are weighted by their
    labelled tokens. The batcher gave them row weights (sample_weight), which the step took for what the loss is a
    mean over, so --grad-accum-steps 2 took another step than the whole batch (2e-3 apart after two steps)."""
    from jaxbert.train.task_encode import IGNORE, Encodedset, TaskBatches

    head, rng = "BertForTokenClassification", np.random.default_rng(0)
    lengths = np.array([10, 3, 9, 2, 8, 4, 7, 2])
    starts = np.concatenate([[0], np.cumsum(lengths)])
    tags = rng.integers(0, 3, starts[-1]).astype(np.int32)
    tags[starts[:-1]] = IGNORE  # [CLS]
    data = Encodedset(
        rng.integers(5, 50, starts[-1]).astype(np.int32), np.zeros(starts[-1], np.int8), starts, tags, np.zeros(0)
    )
    _same_step(head, *(TaskBatches(data, B // accum, accum, 0, (L,))(0) for accum in (1, 2)))


def _same_step(head: str, batch: dict, other: dict) -> None:
    """One AdamW step from the same state on `batch` and on `other` ends with the same loss, gradient norm and
    parameters (Adam's first step moves each element by about ±lr: 1e-3 of it is round-off)."""
    opt = OptimConfig(learning_rate=1e-2, total_steps=10)
    tx = optimizer(opt)
    state = init_state(jaxbert.init_params(CONFIG, jax.random.key(0), head), tx)
    step = jax.jit(
        lambda s, b: train_step(s, b, jax.random.key(1), config=CONFIG, tx=tx, schedule=schedule(opt), head=head)
    )
    with jax.default_matmul_precision("highest"):
        (one, m_one), (two, m_two) = step(state, batch), step(state, other)
    np.testing.assert_allclose(float(m_two["loss"]), float(m_one["loss"]), rtol=1e-6)
    np.testing.assert_allclose(float(m_two["grad_norm"]), float(m_one["grad_norm"]), rtol=1e-5)
    assert _max_diff(one.params, two.params) <= 1e-3 * opt.learning_rate


@pytest.mark.parametrize("head", ["BertForSequenceClassification", "BertForTokenClassification"])
def test_an_epochs_padded_last_step_equals_the_step_on_its_examples(head):
    """6 examples, 4 a step (2 × 2 accumulated): the epoch's last step holds the 2 examples left and 2 padding rows
    (a whole micro-batch of them); its update is that of the 2 examples alone."""
    from jaxbert.train.task_encode import IGNORE, Encodedset, TaskBatches

    rng = np.random.default_rng(0)
    lengths = np.array([10, 3, 9, 2, 8, 4])
    starts = np.concatenate([[0], np.cumsum(lengths)])
    tags, targets = np.zeros(0, np.int32), rng.integers(0, 3, 6).astype(np.int32)
    if head == "BertForTokenClassification":
        tags, targets = rng.integers(0, 3, starts[-1]).astype(np.int32), np.zeros(0, np.int32)
        tags[starts[:-1]] = IGNORE  # [CLS]
    data = Encodedset(
        rng.integers(5, 50, starts[-1]).astype(np.int32), np.zeros(starts[-1], np.int8), starts, tags, targets
    )
    batches = TaskBatches(data, 2, 2, 0, (L,))
    assert batches.steps_per_epoch == 2
    last = batches(1)
    left = batches.examples(1)
    alone = {k: v[None] for k, v in data.batch(left, len(left), L, 0).items()}  # [1 micro-batch, 2, ...]
    _same_step(head, last, alone)


def test_absent_options_leave_each_examples_own_loss_and_gradient():
    """Multiple choice over examples of 2, 3 and 4 options padded to 4 (choice_mask): each example's logits, its
    smoothed loss (label smoothing over its own options) and the gradient are those it has alone, unpadded."""
    config = CONFIG.replace(id2label=None, label2id=None)
    head = "BertForMultipleChoice"
    params = jaxbert.init_params(config, jax.random.key(0), head)
    rng = np.random.default_rng(1)
    counts, labels, C = [2, 3, 4], np.array([1, 2, 0], np.int32), 4
    ids = rng.integers(5, 50, (3, C, L)).astype(np.int32)  # an absent option's ids are noise under a zero mask
    present = np.arange(C) < np.array(counts)[:, None]
    mask = np.broadcast_to(present[..., None], ids.shape).astype(np.int32)

    def padded(p):
        out = jaxbert.heads.forward(p, config, head, ids, mask, labels=labels, choice_mask=present, label_smoothing=0.1)
        return out.loss, out.logits

    def alone(p, e):
        one = jaxbert.heads.forward(
            p, config, head, ids[e : e + 1, : counts[e]], labels=labels[e : e + 1], label_smoothing=0.1
        )
        return one.loss, one.logits

    with jax.default_matmul_precision("highest"):
        (loss, logits), grads = jax.jit(jax.value_and_grad(padded, has_aux=True))(params)
        own = [jax.jit(jax.value_and_grad(alone, has_aux=True), static_argnums=1)(params, e) for e in range(3)]
    np.testing.assert_allclose(float(loss), np.mean([float(o[0][0]) for o in own]), rtol=1e-6)
    for e, ((_, one_logits), _) in enumerate(own):
        np.testing.assert_allclose(np.asarray(logits)[e, : counts[e]], np.asarray(one_logits)[0], atol=1e-5)
        assert (np.asarray(logits)[e, counts[e] :] == np.finfo(np.float32).min).all()  # never chosen
    mean = jax.tree_util.tree_map(lambda *g: sum(g) / 3, *jax.device_get([o[1] for o in own]))
    assert _max_diff(grads, mean) <= 1e-6
    with pytest.raises(ValueError, match="choice_mask: BertForSequenceClassification is not a multiple-choice head"):
        jaxbert.heads.forward(params, config, "BertForSequenceClassification", ids[:, 0], choice_mask=present)
