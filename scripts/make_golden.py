"""Generate the golden fixtures for what transformers 5 removed: relative position embeddings, head_mask, and
head pruning. Needs transformers 4.57.x and torch; run it in a throwaway virtual environment:

    python3 -m venv /tmp/tf457 && /tmp/tf457/bin/pip install torch==2.13.0 'transformers==4.57.*' \
        jax==0.4.38 jaxlib==0.4.38 flax==0.10.2
    /tmp/tf457/bin/python scripts/make_golden.py tests/fixtures/golden

Each case is a small transformers 4.57 checkpoint directory (config.json + model.safetensors, or
flax_model.msgpack for the FlaxBert cases, exactly as `save_pretrained` wrote it) plus `io.npz` holding the
inputs and the PyTorch outputs.
"""

import os
import shutil
import sys

import numpy as np
import torch
import transformers

assert transformers.__version__.startswith("4.57"), transformers.__version__

# Pairwise-distinct sizes, so a wrong transpose or a swapped axis cannot pass by symmetry.
SIZES = dict(vocab_size=67, hidden_size=24, num_hidden_layers=3, num_attention_heads=4, intermediate_size=37,
             max_position_embeddings=29, type_vocab_size=5, initializer_range=0.2, attn_implementation="eager")


def inputs(seed: int):
    rng = np.random.default_rng(seed)
    B, L = 3, 9
    ids = rng.integers(1, SIZES["vocab_size"], (B, L))
    mask = np.ones((B, L), np.int64)
    mask[1, 6:] = 0  # padded rows: their outputs at real positions must not depend on the padding
    mask[2, 3:] = 0
    ids[mask == 0] = 0
    types = rng.integers(0, SIZES["type_vocab_size"], (B, L))
    return dict(input_ids=ids, attention_mask=mask, token_type_ids=types)


def run(model, feed, **extra):
    with torch.no_grad():
        out = model(**{k: torch.tensor(v) for k, v in feed.items()}, output_hidden_states=True,
                    output_attentions=True, return_dict=True, **extra)
    result = {}
    for key, value in out.items():
        if isinstance(value, tuple):  # hidden_states / attentions: one entry per layer
            for i, v in enumerate(value):
                result[f"{key}.{i}"] = v.numpy()
        elif value is not None:
            result[key] = value.numpy()
    return result


def save(root, name, model, feed, outputs):
    directory = os.path.join(root, name)
    shutil.rmtree(directory, ignore_errors=True)
    model.save_pretrained(directory, safe_serialization=True)
    np.savez(os.path.join(directory, "io.npz"), **{f"in.{k}": v for k, v in feed.items()},
             **{f"out.{k}": v for k, v in outputs.items()})
    print(name, sorted(outputs))


def main(root):
    for i, kind in enumerate(("relative_key", "relative_key_query")):
        torch.manual_seed(i)
        config = transformers.BertConfig(position_embedding_type=kind, **SIZES)
        model = transformers.BertForPreTraining(config).eval()
        feed = inputs(i)
        save(root, kind, model, feed, run(model, feed))

    torch.manual_seed(2)
    model = transformers.BertModel(transformers.BertConfig(position_embedding_type="relative_key_query",
                                                           **SIZES)).eval()
    feed = inputs(2)
    head_mask = np.array([[1.0, 0.0, 0.5, 1.0], [1.7, 1.0, 0.0, -0.3], [0.0, 0.0, 0.0, 0.0]], np.float32)
    outputs = run(model, feed, head_mask=torch.tensor(head_mask))
    save(root, "head_mask", model, {**feed, "head_mask": head_mask}, outputs)

    torch.manual_seed(3)
    config = transformers.BertConfig(num_labels=3, **SIZES)
    model = transformers.BertForSequenceClassification(config).eval()
    feed = inputs(3)
    save(root, "unpruned", model, feed, run(model, feed))
    # Two rounds, the second naming an already-pruned head, as transformers allows.
    model.prune_heads({0: [1]})
    model.prune_heads({0: [1, 3], 2: [0, 2, 3]})
    save(root, "pruned", model, feed, run(model, feed))


def flax_cases(root):
    """transformers 4.x FlaxBert checkpoints (flax_model.msgpack), converted by transformers from PyTorch."""
    import tempfile

    for i, head in enumerate(("BertForMaskedLM", "BertForPreTraining")):
        torch.manual_seed(10 + i)
        config = transformers.BertConfig(**SIZES)
        model = getattr(transformers, head)(config).eval()
        feed = inputs(10 + i)
        with tempfile.TemporaryDirectory() as pt_dir:
            model.save_pretrained(pt_dir)
            flax_model = getattr(transformers, "Flax" + head).from_pretrained(pt_dir, from_pt=True)
        directory = os.path.join(root, f"flax_{head}")
        shutil.rmtree(directory, ignore_errors=True)
        flax_model.save_pretrained(directory)
        outputs = {k: v.detach().numpy() for k, v in model(**{k: torch.tensor(v) for k, v in feed.items()}).items()
                   if v is not None and not isinstance(v, tuple)}
        np.savez(os.path.join(directory, "io.npz"), **{f"in.{k}": v for k, v in feed.items()},
                 **{f"out.{k}": v for k, v in outputs.items()})
        print(directory, sorted(os.listdir(directory)), sorted(outputs))


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/golden"
    main(out)
    try:  # needs jax + flax in the same environment (e.g. jax==0.4.38 flax==0.10.2)
        import flax  # noqa: F401
    except ImportError:
        print("flax not installed: skipping the flax_model.msgpack fixtures")
    else:
        flax_cases(out)
