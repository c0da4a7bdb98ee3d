"""Read checkpoint directories: transformers (safetensors, `.bin`, sharded) and `flax_model.msgpack`.

safetensors are read through the numpy API (no torch). `.bin` files are pickles: they are read only with
`torch.load(..., weights_only=True)`, which refuses any pickle that would run code.
"""

from __future__ import annotations

import json
import os

import numpy as np
from flax import serialization

from jaxbert.config import BertConfig
from jaxbert.convert import ConversionReport, torch_to_flax

SAFETENSORS, SAFETENSORS_INDEX = "model.safetensors", "model.safetensors.index.json"
TORCH_BIN, TORCH_BIN_INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"
FLAX_MSGPACK = "flax_model.msgpack"
WEIGHT_FILES = (SAFETENSORS, SAFETENSORS_INDEX, TORCH_BIN, TORCH_BIN_INDEX, FLAX_MSGPACK)


def find_weights(directory: str) -> str:
    """The weights file of a directory, in transformers' order of preference."""
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"{directory}: no such directory")
    for name in WEIGHT_FILES:
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(f"{directory}: no weights file found (looked for {', '.join(WEIGHT_FILES)})")


def _read_safetensors(path: str) -> dict[str, np.ndarray]:
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        return load_file(path)
    except (SafetensorError, OSError, ValueError) as e:
        raise ValueError(f"{path}: not a readable safetensors file ({e})") from None


def _read_torch_bin(path: str) -> dict[str, np.ndarray]:
    try:
        import torch
    except ImportError:
        raise ImportError(f"{path}: reading .bin checkpoints needs torch: pip install 'jaxbert[torch]'") from None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch raises many types for bad or unsafe pickles
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"{path}: refused or unreadable PyTorch checkpoint ({first_line})") from None
    # numpy has no bfloat16: widen it (exact); other dtypes are kept.
    return {k: (v.float() if v.dtype == torch.bfloat16 else v).numpy() for k, v in state.items()}


def _read_sharded(index_path: str, read_one) -> dict[str, np.ndarray]:
    try:
        with open(index_path, encoding="utf-8") as f:
            weight_map = json.load(f)["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ValueError(f"{index_path}: invalid shard index ({e})") from None
    state = {}
    for shard in sorted(set(weight_map.values())):
        state.update(read_one(os.path.join(os.path.dirname(index_path), shard)))
    return state


def read_state_dict(path: str) -> dict[str, np.ndarray]:
    """A PyTorch-named state dict from a safetensors / .bin file or a shard index."""
    name = os.path.basename(path)
    if name == SAFETENSORS_INDEX:
        return _read_sharded(path, _read_safetensors)
    if name == TORCH_BIN_INDEX:
        return _read_sharded(path, _read_torch_bin)
    return _read_safetensors(path) if path.endswith(".safetensors") else _read_torch_bin(path)


def read_msgpack(path: str) -> dict:
    try:
        with open(path, "rb") as f:
            return serialization.msgpack_restore(f.read())
    except Exception as e:  # noqa: BLE001 - msgpack raises several types on truncated data
        raise ValueError(f"{path}: not a readable flax msgpack file ({type(e).__name__}: {e})") from None


def load_params(directory: str, config: BertConfig, head: str, *,
                allow_missing_head: bool = False) -> tuple[dict, ConversionReport]:
    """Parameters for `head` from any supported checkpoint in `directory`, as a tree of numpy arrays."""
    path = find_weights(directory)
    if path.endswith(".msgpack"):
        # A Flax tree already; round-trip through the PyTorch naming so it gets the same checks.
        from jaxbert.convert import flax_to_torch_any

        state = flax_to_torch_any(read_msgpack(path))
    else:
        state = read_state_dict(path)
    return torch_to_flax(state, config, head, allow_missing_head=allow_missing_head)
