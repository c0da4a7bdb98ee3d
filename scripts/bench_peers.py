"""The measurements behind scripts/benchmark.py. Each runs in a fresh process (benchmark.run_child), measures one
peer on one configuration, and returns a dict; the runner adds the process's peak RSS. Imports stay inside the
functions so a process pays only for the framework it measures."""

from __future__ import annotations

import os
import time

TIMED_CALLS = 5
# perf_counter() at the child's first statement (benchmark.run_child sets it; this module's import otherwise):
# "first result" times count from there, so the framework's imports, loading the model, compiling and the first
# pass are all in them.
START = time.perf_counter()


def since_start() -> float:
    return time.perf_counter() - START


def _median_seconds(fn, calls: int = TIMED_CALLS) -> float:
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def _ids(model_dir: str | None, batch: int, length: int):
    """Random token ids within the model's vocabulary (bert-base's when model_dir is None)."""
    import json

    import numpy as np

    vocab = 30522 if model_dir is None else json.load(open(os.path.join(model_dir, "config.json")))["vocab_size"]
    return np.random.default_rng(0).integers(1000, min(vocab, 30000), (batch, length)).astype(np.int32)


def rss_mb(field: str = "VmRSS") -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith(field + ":"))


# -- inference at a fixed shape --------------------------------------------------------------------------------
def infer_jax(model_dir: str, dtype: str, batch: str, length: str) -> dict:
    import jaxbert

    bert = jaxbert.load(model_dir, dtype=None if dtype == "float32" else dtype)
    ids = _ids(model_dir, int(batch), int(length))
    start = time.perf_counter()
    bert(ids).last_hidden_state.block_until_ready()
    first = time.perf_counter() - start
    seconds = _median_seconds(lambda: bert(ids).last_hidden_state.block_until_ready())
    return {"tokens_per_s": ids.size / seconds, "seconds": seconds, "first_call_s": first, "rss_after_mb": rss_mb()}


def infer_torch(model_dir: str, batch: str, length: str) -> dict:
    import torch
    import transformers

    model = transformers.BertModel.from_pretrained(model_dir).eval()
    ids = torch.from_numpy(_ids(model_dir, int(batch), int(length))).long()
    with torch.inference_mode():
        start = time.perf_counter()
        model(input_ids=ids)
        first = time.perf_counter() - start
        seconds = _median_seconds(lambda: model(input_ids=ids))
    return {"tokens_per_s": ids.numel() / seconds, "seconds": seconds, "first_call_s": first, "rss_after_mb": rss_mb()}


def export_onnx(model_dir: str, onnx_path: str, batch: str, length: str, dynamic: str = "") -> dict:
    """transformers' BertModel through torch.onnx's dynamo exporter (the TorchScript one mis-traces transformers
    5's BERT), at a static shape so ONNX Runtime can specialize, or with `dynamic` batch and length axes."""
    import torch
    import transformers

    class LastHidden(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    model = LastHidden(transformers.BertModel.from_pretrained(model_dir).eval())
    ids = torch.from_numpy(_ids(model_dir, int(batch), int(length))).long()
    start = time.perf_counter()
    with torch.inference_mode():
        torch.onnx.export(
            model,
            (ids, torch.ones_like(ids)),
            onnx_path,
            dynamo=True,
            input_names=["input_ids", "attention_mask"],
            output_names=["last_hidden_state"],
            dynamic_shapes=_dynamic_axes() if dynamic else None,
        )
    return {"seconds": time.perf_counter() - start}


def _dynamic_axes():
    import torch

    batch, length = torch.export.Dim("batch", min=1, max=1024), torch.export.Dim("length", min=2, max=512)
    return ({0: batch, 1: length}, {0: batch, 1: length})


def _ort_session(onnx_path: str, threads: int = 0):
    """All graph optimizations; `threads` intra-op threads (0: its default, one per core)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    return ort.InferenceSession(onnx_path, options, providers=["CPUExecutionProvider"])


def mix_ort(onnx_path: str, model_dir: str, corpus: str, n: str, per_call: str = "0", clients: str = "1") -> dict:
    """ONNX Runtime (a dynamic-shape export; float32 or dynamic int8) over the sorted, per-batch padded mix; with
    several `clients`, one session run from all of them (its `run` is thread-safe), the cores shared out among the
    calls in flight (client_threads)."""
    session = _ort_session(onnx_path, client_threads(clients))
    run = lambda ids, mask, _: session.run(None, {"input_ids": ids, "attention_mask": mask})  # noqa: E731
    return mix_sorted(model_dir, corpus, n, run, per_call, clients)


def infer_ort(onnx_path: str, model_dir: str, batch: str, length: str) -> dict:
    import numpy as np

    session = _ort_session(onnx_path)
    ids = _ids(model_dir, int(batch), int(length)).astype(np.int64)
    feed = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    start = time.perf_counter()
    session.run(None, feed)
    first = time.perf_counter() - start
    seconds = _median_seconds(lambda: session.run(None, feed))
    return {"tokens_per_s": ids.size / seconds, "seconds": seconds, "first_call_s": first, "rss_after_mb": rss_mb()}


def matmul(dtype: str, m: str, d: str, f: str) -> dict:
    """XLA's dot rate at one BERT layer's matmul shapes for m tokens (QKV, attention output, FFN in and out),
    float32 accumulation (int32 for int8): the machine's limit for this configuration, in GFLOP/s."""
    import jax
    import jax.numpy as jnp

    m, d, f = int(m), int(d), int(f)
    sums = jnp.int32 if dtype == "int8" else jnp.float32
    dot = jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=sums))
    flops = seconds = 0.0
    for k, n in ((d, 3 * d), (d, d), (d, f), (f, d)):
        a, b = jnp.ones((m, k), dtype), jnp.ones((k, n), dtype)
        dot(a, b).block_until_ready()
        seconds += _median_seconds(lambda: dot(a, b).block_until_ready(), 7)  # noqa: B023 - called right here
        flops += 2 * m * k * n
    return {"gflops": flops / seconds / 1e9}


# -- compile time against depth --------------------------------------------------------------------------------
def compile_jax(layers: str, form: str) -> dict:
    """Time to first result of bert-base-width inference at 8 x 128 with `layers` layers: a loaded model, float32
    (its layers apart, one traced copy of each) or bfloat16 (layers stacked, one scanned body), or the stored
    per-layer tree through model.bert (a traced copy of every layer)."""
    import jax

    import jaxbert
    from jaxbert.inference import Bert
    from jaxbert.model import bert

    config = jaxbert.BertConfig(num_hidden_layers=int(layers))
    params = jaxbert.init_params(config, jax.random.key(0), "BertModel")
    ids = jax.numpy.asarray(_ids(None, 8, 128))
    if form in ("float32", "bfloat16"):
        run = Bert(config, params, "BertModel", dtype=form, consume=True)
        fn = lambda: run(ids).last_hidden_state.block_until_ready()  # noqa: E731
    else:
        jitted = jax.jit(lambda p, i: bert(p, config, i).last_hidden_state)
        fn = lambda: jitted(params, ids).block_until_ready()  # noqa: E731
    start = time.perf_counter()
    fn()
    first = time.perf_counter() - start
    steady = _median_seconds(fn, 3)
    return {"first_call_s": first, "compile_s": first - steady}


# -- a variable-length mix: useful tokens/s --------------------------------------------------------------------
def mix_texts(corpus: str, n: int, seed: int = 0) -> list[str]:
    """Runs of consecutive corpus sentences, the number per text drawn log-normally (median 3, tail to 60):
    from one-line queries to paragraphs of a few hundred tokens."""
    import numpy as np

    lines = [line.strip() for line in open(corpus, encoding="utf-8") if line.strip()]
    rng = np.random.default_rng(seed)
    counts = np.clip(rng.lognormal(1.1, 1.0, n), 1, 60).astype(int)
    starts = rng.integers(0, len(lines) - 60, n)
    return [" ".join(lines[s : s + c]) for s, c in zip(starts, counts, strict=True)]


def client_threads(clients: str) -> int:
    """An engine's intra-op threads when `clients` calls are in flight at once: the cores shared out among them
    (the setup the engines' guides give for throughput under concurrent requests), 0 (the engine's default, every
    core) for one client."""
    clients, cores = int(clients), len(os.sched_getaffinity(0))
    return 0 if clients <= 1 else max(1, cores // min(clients, cores))


def serve(calls: list, clients: int, do_call) -> None:
    """do_call(call, client) for every call: in order from client 0, or from `clients` threads at once, each
    taking the next call when its last one returns (a server's workers under a steady queue of requests). What a
    client needs of its own is made before (making it in the threads deadlocked OpenVINO now and then)."""
    if clients <= 1:
        for call in calls:
            do_call(call, 0)
        return
    import threading
    from concurrent.futures import ThreadPoolExecutor

    pending, lock = iter(calls), threading.Lock()

    def client(k):
        while True:
            with lock:
                call = next(pending, None)
            if call is None:
                return
            do_call(call, k)

    with ThreadPoolExecutor(clients) as pool:
        for done in [pool.submit(client, k) for k in range(clients)]:
            done.result()


def calls_of(items: list, per_call: int) -> list[list]:
    """`items` in consecutive calls of `per_call` (0: one batch of 32 after another, as the mix feeds them)."""
    size = per_call or 32
    return [items[s : s + size] for s in range(0, len(items), size)]


def _passes(run, calls: int, tokens: int, texts: int, per_call: int, warm_up: int = 0, clients: int = 1) -> dict:
    """run() once (compiling), `warm_up` more times, then its median of 3 over a pass of `calls` calls holding
    `texts` texts of `tokens` useful tokens: the mix's row (ms_per_call only with `per_call` from one client:
    with several in flight a pass over the calls is not a call's latency), first_result_s from the process's
    start to the first pass's end."""
    run()
    first = since_start()
    for _ in range(warm_up):
        run()
    seconds = _median_seconds(run, 3)
    return {
        "useful_tokens_per_s": tokens / seconds,
        "texts_per_s": texts / seconds,
        "first_result_s": first,
        **({"ms_per_call": 1e3 * seconds / calls} if per_call and clients <= 1 else {}),
        **({"clients": clients} if clients > 1 else {}),
    }


def _jax_embed(model_dir: str, dtype: str, mode: str = "packed"):
    """(bert, embed) for the mix: the model loaded at `dtype`, and its embed of one call as the mix runs it (32 rows
    a call, up to 512 tokens; `mode` as mix_jax's)."""
    import jaxbert

    bert = jaxbert.load(model_dir, dtype=None if dtype == "float32" else dtype)
    if mode == "pad512":
        bert.length_buckets = (512,)
    kw = dict(batch_size=32, max_length=512, packing=mode == "packed", progress=False)
    return bert, lambda call: bert.embed(call, **kw)


def _useful_tokens(bert, texts: list[str]) -> int:
    return int(bert.tokenizer.encode(texts, max_length=512).lengths().sum())


def mix_jax(
    model_dir: str,
    corpus: str,
    n: str,
    mode: str,
    dtype: str = "float32",
    cache: str = "",
    per_call: str = "0",
    clients: str = "1",
) -> dict:
    """`Bert.embed` over the mix: packed rows ("packed", the default), each text padded to its batch's shape
    bucket ("buckets") or every batch padded to 512 ("pad512"); 32 rows a call. With `cache` (a directory), JAX's
    persistent compilation cache there, as the command line keeps it (compile_cache.enable). With `per_call`,
    the texts in calls of that many, in the mix's order (a server's requests: nothing packed across calls); with
    several `clients`, from that many threads at once into the one `Bert` (it may be called so: README)."""
    if cache:
        import jaxbert

        jaxbert.compile_cache.enable(cache)
    texts = mix_texts(corpus, int(n))
    bert, embed = _jax_embed(model_dir, dtype, mode)
    per_call, clients = int(per_call), int(clients)
    calls = calls_of(texts, per_call) if per_call else [texts]

    def run():
        serve(calls, clients, lambda call, _: embed(call))

    tokens = _useful_tokens(bert, texts)
    # The first pass compiles the padded plan's programs (packing._chunks), a warm-up the exact plan's.
    row = _passes(run, len(calls), tokens, len(texts), per_call, warm_up=1, clients=clients)
    return {**row, "compiled": bert.compile_count}


def _core_worker(core: int, k: int, args: tuple, ready, results) -> None:
    """One of mix_jax_cores' processes: pinned to `core` before JAX starts (its CPU client sizes its thread pool
    by the cores it may use), the k-th share of the calls, passes started together at `ready`."""
    os.sched_setaffinity(0, {core})
    model_dir, corpus, n, dtype, per_call, processes = args
    calls = calls_of(mix_texts(corpus, int(n)), per_call)[k::processes]
    bert, embed = _jax_embed(model_dir, dtype)

    def run():
        serve(calls, 1, lambda call, _: embed(call))

    run()  # the padded plan's programs, then the exact plan's (packing._chunks)
    run()
    seconds = []
    for _ in range(3):
        ready.wait()
        start = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - start)
    texts = [text for call in calls for text in call]
    results.put((seconds, _useful_tokens(bert, texts), len(texts), rss_mb("VmHWM")))


def mix_jax_cores(model_dir: str, corpus: str, n: str, dtype: str, per_call: str) -> dict:
    """jaxbert as a server of small calls is best run: a process per core, each pinned to its core (one thread a
    call: two threads on a one-text call cost more than they gain, see benchmarks/README.md), the calls shared out
    among them. A pass lasts until the last process ends it; peak_rss_mb_per_process is the largest."""
    import multiprocessing
    import queue

    cores = sorted(os.sched_getaffinity(0))
    context = multiprocessing.get_context("spawn")  # JAX's runtime threads do not survive a fork
    ready, results = context.Barrier(len(cores)), context.Queue()
    args = (model_dir, corpus, n, dtype, int(per_call), len(cores))
    workers = [context.Process(target=_core_worker, args=(c, k, args, ready, results)) for k, c in enumerate(cores)]
    for worker in workers:
        worker.start()
    rows = []
    while len(rows) < len(workers):  # a worker that died would leave the others waiting at the barrier
        try:
            rows.append(results.get(timeout=5))
        except queue.Empty:
            if any(worker.exitcode not in (None, 0) for worker in workers):
                for worker in workers:
                    worker.terminate()
                raise RuntimeError("a mix_jax_cores worker failed (its traceback is above)") from None
    for worker in workers:
        worker.join()
    passes = sorted(max(row[0][i] for row in rows) for i in range(3))
    tokens, texts = sum(row[1] for row in rows), sum(row[2] for row in rows)
    return {
        "useful_tokens_per_s": tokens / passes[1],
        "texts_per_s": texts / passes[1],
        "processes": len(cores),
        "peak_rss_mb_per_process": max(row[3] for row in rows),
    }


def mix_sorted(model_dir: str, corpus: str, n: str, forward, per_call: str = "0", clients: str = "1") -> dict:
    """Times `forward(input_ids, attention_mask, client)` (int64 numpy arrays; the calling client's index, see
    serve) over the mix fed as sentence-transformers feeds a model: texts sorted longest first, batches of 32
    tokenized (inside the timing, as jaxbert's) and padded to their own longest text. With `per_call`, calls of
    that many texts in the mix's order instead (requests cannot be sorted together), each padded to its longest;
    with several `clients`, from that many threads (serve), each with a tokenizer of its own (a fast tokenizer's
    padding settings are per object)."""
    import numpy as np
    import transformers

    texts = mix_texts(corpus, int(n))
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    lengths = [len(ids) for ids in tok(texts, truncation=True, max_length=512)["input_ids"]]
    per_call, clients = int(per_call), int(clients)
    order = list(range(len(texts))) if per_call else sorted(range(len(texts)), key=lambda i: -lengths[i])
    calls = calls_of(order, per_call)
    toks = [tok] + [transformers.AutoTokenizer.from_pretrained(model_dir) for _ in range(clients - 1)]

    def do_call(call, client):
        batch = toks[client]([texts[i] for i in call], padding=True, truncation=True, max_length=512)
        forward(np.asarray(batch["input_ids"], np.int64), np.asarray(batch["attention_mask"], np.int64), client)

    return _passes(
        lambda: serve(calls, clients, do_call), len(calls), sum(lengths), len(texts), per_call, clients=clients
    )


def mix_torch(model_dir: str, corpus: str, n: str, per_call: str = "0", clients: str = "1") -> dict:
    """PyTorch eager (transformers' BertModel, inference_mode) over the sorted, per-batch padded mix; with several
    `clients`, its intra-op threads shared out among them (client_threads)."""
    import torch
    import transformers

    if client_threads(clients):
        torch.set_num_threads(client_threads(clients))
    model = transformers.BertModel.from_pretrained(model_dir).eval()

    def forward(ids, mask, _):
        with torch.inference_mode():
            model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))

    return mix_sorted(model_dir, corpus, n, forward, per_call, clients)


# -- sentence embeddings with the model's own pipeline ---------------------------------------------------------
def st_jax(model_dir: str, corpus: str, n: str) -> dict:
    """`jaxbert.load(dir).embed(texts)` with the sentence-transformers directory's own defaults (MiniLM: mean
    pooling, normalized, 256 tokens), 32 a batch."""
    import jaxbert

    texts = mix_texts(corpus, int(n), seed=1)
    bert = jaxbert.load(model_dir)
    for _ in range(2):  # warm-up: the first call compiles the padded plan, the second the exact one (packing._chunks)
        bert.embed(texts, batch_size=32)
    seconds = _median_seconds(lambda: bert.embed(texts, batch_size=32), 3)
    return {"texts_per_s": len(texts) / seconds, "compiled": bert.compile_count}


def st_torch(model_dir: str, corpus: str, n: str) -> dict:
    """`SentenceTransformer(dir).encode(texts)`, batch 32 (it sorts by length and pads per batch)."""
    from sentence_transformers import SentenceTransformer

    texts = mix_texts(corpus, int(n), seed=1)
    model = SentenceTransformer(str(model_dir), device="cpu")
    model.encode(texts, batch_size=32)
    seconds = _median_seconds(lambda: model.encode(texts, batch_size=32), 3)
    return {"texts_per_s": len(texts) / seconds}
