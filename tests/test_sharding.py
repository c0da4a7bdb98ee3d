"""Logical-axis sharding on 4 virtual CPU devices (a subprocess): DP, FSDP, TP and FSDP×TP meshes give the
single-device loss and gradients; each parameter's (and Adam moment's) sharding is what the rules say; per-device
parameter memory shrinks by the FSDP/TP factor. Bad --mesh values fail with one line naming the flag."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import devices_env, model_dir

from jaxbert.cli import main
from jaxbert.sharding import mesh_shape

CHILD = r"""
import json, sys
import jax, jax.numpy as jnp, numpy as np
jax.config.update("jax_default_matmul_precision", "highest")
from flax import traverse_util
from jaxbert import sharding
from jaxbert.config import BertConfig
from jaxbert.params import init_params
from jaxbert.train.state import OptimConfig, init_state, optimizer
from jaxbert.train.step import _loss

config = BertConfig(vocab_size=256, hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                    intermediate_size=128, max_position_embeddings=32, type_vocab_size=2)
params = init_params(config, jax.random.key(0), "BertForMaskedLM")
rng = np.random.default_rng(0)
mask = np.ones((8, 16), np.int32); mask[3:, 12:] = 0
ints = lambda lo, hi, shape: rng.integers(lo, hi, shape).astype(np.int32)
batch = {"input_ids": ints(5, 256, (8, 16)), "attention_mask": mask, "positions": ints(0, 12, (8, 3)),
         "labels": ints(5, 256, (8, 3))}
tx = optimizer(OptimConfig(learning_rate=1e-3))

def loss_and_grads(p, b):
    grad_fn = jax.value_and_grad(_loss, has_aux=True)
    (loss, _), g = grad_fn(p, config, "BertForMaskedLM", b, None, jnp.float32, False, 0.0)
    return loss, g

ref_loss, ref_grads = jax.jit(loss_and_grads)(params, batch)
flat_ref = traverse_util.flatten_dict(jax.device_get(ref_grads), sep="/")
out = {}
for text in sys.argv[1:]:
    mesh = sharding.make_mesh(sharding.mesh_shape(text, 4, config.num_attention_heads))
    state = init_state(params, tx)
    sh = sharding.state_shardings(state, mesh)
    # From the host: a device array is resharded by slicing programs compiled per leaf and layout (~30 compiles)
    state = jax.device_put(jax.device_get(state), sh)
    bsh = sharding.batch_sharding(mesh)
    run = jax.jit(loss_and_grads, in_shardings=(sh.params, bsh), out_shardings=(sharding.replicated(mesh), sh.params))
    run = sharding.under(mesh, run)  # as the training loop runs its step
    loss, grads = run(state.params, batch)
    flat_grads = traverse_util.flatten_dict(jax.device_get(grads), sep="/")
    flat = traverse_util.flatten_dict(state.params, sep="/")
    mu = traverse_util.flatten_dict(state.opt_state[1][0].mu, sep="/")  # clip_by_global_norm, then adamw's mu
    dev = jax.devices()[0]
    out[text] = {
        "loss": float(loss) - float(ref_loss),
        "grad": max(float(np.abs(g - flat_ref[k]).max()) for k, g in flat_grads.items()),
        "spec": {k: [list(a) if isinstance(a, tuple) else a for a in x.sharding.spec] for k, x in flat.items()},
        "mu_same": all(mu[k].sharding.spec == x.sharding.spec for k, x in flat.items()),
        "bytes": {k: [x.nbytes, sum(s.data.nbytes for s in x.addressable_shards if s.device == dev)]
                  for k, x in flat.items()},
    }
from jaxbert.inference import Bert
base = jax.device_get(init_params(config, jax.random.key(1), "BertModel"))
ids = rng.integers(5, 256, (4, 16))
plain = Bert(config, base, "BertModel")
tp = Bert(config, base, "BertModel", mesh=sharding.make_mesh({"data": 2, "tensor": 2}))
qkv = lambda b, leaf="kernel": list(b.weights["encoder"]["stacked"]["attention"]["self"]["qkv"][leaf].sharding.spec)
hidden = lambda b: np.asarray(b(ids).last_hidden_state)
plain_qkv = list(plain.weights["encoder"]["layer"]["0"]["attention"]["self"]["qkv"]["weight"].sharding.spec)  # apart
out["inference"] = {"diff": float(np.abs(hidden(tp) - hidden(plain)).max()), "qkv": qkv(tp), "plain_qkv": plain_qkv}
plain8 = Bert(config, base, "BertModel", dtype="int8")
tp8 = Bert(config, base, "BertModel", dtype="int8", mesh=sharding.make_mesh({"data": 2, "tensor": 2}))
out["inference"].update(int8_diff=float(np.abs(hidden(tp8) - hidden(plain8)).max()),
                        int8_qkv=qkv(tp8, "weight"), int8_scale=qkv(tp8, "weight_scale"))
print(json.dumps(out))
"""
MESHES = {"dp": "data=4", "fsdp": "fsdp=4", "tp": "tensor=4", "fsdp_tp": "fsdp=2,tensor=2", "dp_fsdp": "data=2,fsdp=2"}
F, T = "fsdp", "tensor"
ENC = "bert/encoder/layer/0/"
# What the rules say, written out by hand: embed -> fsdp; vocab, heads, mlp, hidden -> tensor; norms replicated.
EXPECTED = {
    "dp": {},
    "fsdp": {
        "bert/embeddings/word_embeddings/embedding": [None, F],
        "bert/embeddings/position_embeddings/embedding": [None, F],
        ENC + "attention/self/query/kernel": [F],
        ENC + "attention/output/dense/kernel": [None, F],
        ENC + "attention/output/dense/bias": [F],
        ENC + "intermediate/dense/kernel": [F],
        ENC + "output/dense/kernel": [None, F],
        "cls/predictions/transform/dense/kernel": [F],
    },
    "tp": {
        "bert/embeddings/word_embeddings/embedding": [T],
        ENC + "attention/self/query/kernel": [None, T],
        ENC + "attention/self/value/bias": [T],
        ENC + "attention/output/dense/kernel": [T],
        ENC + "intermediate/dense/kernel": [None, T],
        ENC + "intermediate/dense/bias": [T],
        ENC + "output/dense/kernel": [T],
        "cls/predictions/transform/dense/kernel": [None, T],
        "cls/predictions/bias": [T],
    },
    "fsdp_tp": {
        "bert/embeddings/word_embeddings/embedding": [T, F],
        "bert/embeddings/token_type_embeddings/embedding": [None, F],
        ENC + "attention/self/key/kernel": [F, T],
        ENC + "attention/output/dense/kernel": [T, F],
        ENC + "output/dense/kernel": [T, F],
        ENC + "output/dense/bias": [F],
        ENC + "output/LayerNorm/scale": [],
        "cls/predictions/bias": [T],
    },
}
EXPECTED["dp_fsdp"] = EXPECTED["fsdp"]  # the data axis splits only the batch
FACTOR = {"dp": 1, "fsdp": 4, "tp": 4, "fsdp_tp": 4, "dp_fsdp": 2}


@pytest.fixture(scope="module")
def runs():
    env = devices_env(4)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, *MESHES.values()], capture_output=True, text=True, env=env, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return {name: out[text] for name, text in {**MESHES, "inference": "inference"}.items()}


def test_inference_places_parameters_by_the_same_rules(runs):
    # Replicated by default (a float32 model without a mesh holds its layers apart); with a data=2,tensor=2 mesh
    # the layers are stacked, the fused [layers, D, 3D] QKV kernel is split on its qkv axis, and the outputs equal
    # the replicated model's.
    run = runs["inference"]
    assert run["plain_qkv"] == [] and run["qkv"] == [None, None, "tensor"]
    assert run["diff"] <= 1e-5
    # int8 weights ([layers, 3D, D] and a scale per output) are split on the same qkv axis; the rows'
    # quantization reduces over the split heads and agrees with the single-device int8 model.
    assert run["int8_qkv"] == [None, "tensor"] and run["int8_scale"] == [None, "tensor"]
    assert run["int8_diff"] <= 1e-4


@pytest.mark.parametrize("name", list(MESHES))
def test_loss_gradients_and_placement_follow_the_rules(runs, name):
    run = runs[name]
    assert abs(run["loss"]) <= 1e-5 and run["grad"] <= 1e-5, (run["loss"], run["grad"])
    for leaf, spec in run["spec"].items():
        want = EXPECTED[name].get(leaf)
        if want is not None or name == "dp" or "LayerNorm" in leaf:
            assert spec == (want or []), (leaf, spec, want)
    assert run["mu_same"]  # Adam's moments are laid out like their parameters
    # Every encoder matrix has an embed and a heads/mlp axis, so it shrinks by exactly the mesh's factor; the
    # whole tree (norms and some biases replicated) by nearly as much.
    enc = [b for k, b in run["bytes"].items() if "/encoder/" in k and k.endswith("kernel")]
    assert sum(d for _, d in enc) * FACTOR[name] == sum(t for t, _ in enc)
    total, device = (sum(b[i] for b in run["bytes"].values()) for i in (0, 1))
    assert total / FACTOR[name] <= device <= 1.3 * total / FACTOR[name], (total, device)


@pytest.mark.parametrize(
    "text, devices, match",
    [
        ("data=3", 4, "--mesh 'data=3': data=3,fsdp=1,tensor=1 is 3 devices, not the 4 there are"),
        ("fsdp=3", 4, "--mesh 'fsdp=3': 3 does not divide the 4 devices"),
        ("tensor=8", 8, "--mesh 'tensor=8': tensor=8 does not divide the model's 12 attention heads"),
        ("pipeline=2", 4, "'pipeline=2' is not AXIS=SIZE with AXIS one of data, fsdp, tensor"),
        ("data=-1,fsdp=-1", 4, "at most one axis can be -1"),
        ("data=x", 4, "size of data must be an integer, not 'x'"),
    ],
)
def test_bad_mesh_shapes_are_named(text, devices, match):
    with pytest.raises(ValueError) as e:
        mesh_shape(text, devices, heads=12)
    assert str(e.value).startswith(f"--mesh {text!r}: ") and match in str(e.value) and "\n" not in str(e.value)


def test_mesh_defaults_and_the_rest():
    assert mesh_shape(None, 8) == {"data": 8, "fsdp": 1, "tensor": 1}
    assert mesh_shape("fsdp=2", 8) == {"data": 4, "fsdp": 2, "tensor": 1}
    assert mesh_shape("data=2,fsdp=-1,tensor=2", 8) == {"data": 2, "fsdp": 2, "tensor": 2}
    assert mesh_shape(None, 8, fsdp=True) == {"data": 1, "fsdp": 8, "tensor": 1}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return model_dir(tmp_path_factory.mktemp("tiny"), max_position_embeddings=64, num_hidden_layers=1)


@pytest.mark.parametrize(
    "flags, match",
    [
        (["--mesh", "data=2"], "--mesh 'data=2': data=2,fsdp=1,tensor=1 is 2 devices, not the 1 there are"),
        (["--mesh", "pipe=1"], "--mesh 'pipe=1': 'pipe=1' is not AXIS=SIZE"),
        (["--mesh", "data=1", "--fsdp"], "pass --mesh or --fsdp, not both"),
        (["--num-processes", "2"], "--coordinator-address, --num-processes and --process-id go together"),
    ],
)
def test_bad_mesh_flags_fail_before_compiling(tiny, tmp_path, capsys, flags, match):
    corpus = os.path.join(os.path.dirname(__file__), "..", "examples", "data", "geography.txt")
    args = ["train-mlm", "--model", tiny, "--train-file", corpus, "--output-dir", str(tmp_path / "o")]
    rc = main([*args, "--max-seq-length", "32", "--no-progress", *flags])
    err = capsys.readouterr().err
    assert rc == 1 and match in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o").exists()  # nothing written: the lock's fresh directory is removed again


def test_every_head_leaf_has_axes():
    import jaxbert
    from jaxbert.axes import logical_axes
    from jaxbert.heads import TABLE
    from jaxbert.layout import to_compute
    from jaxbert.params import param_spec

    config = jaxbert.BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=24,
        max_position_embeddings=20, position_embedding_type="relative_key", is_decoder=True,
        add_cross_attention=True,
    )  # fmt: skip
    for head in TABLE:
        spec = param_spec(config, head)
        axes = logical_axes(spec)  # raises naming a leaf without axes or of the wrong rank
        assert len(jax_leaves(axes)) == len(jax_leaves(spec))
    zeros = jax_leaves_map(param_spec(config, "BertModel"), lambda leaf: np.zeros(leaf[0], np.float32))
    compute = to_compute(zeros, config)
    stacked = logical_axes(compute)["encoder"]["stacked"]["attention"]["self"]["qkv"]
    assert stacked == {"kernel": ("layers", "embed", "qkv"), "bias": ("layers", "qkv")}
    assert np.ndim(compute["encoder"]["stacked"]["attention"]["self"]["qkv"]["kernel"]) == 3


def jax_leaves(tree):
    from flax import traverse_util

    return list(traverse_util.flatten_dict(tree, is_leaf=lambda _, v: isinstance(v, tuple)).values())


def jax_leaves_map(tree, fn):
    from flax import traverse_util

    flat = traverse_util.flatten_dict(tree, is_leaf=lambda _, v: isinstance(v, tuple))
    return traverse_util.unflatten_dict({k: fn(v) for k, v in flat.items()})
