"""Read checkpoint directories: transformers (safetensors, `.bin`, sharded) and `flax_model.msgpack`.

safetensors are read through the numpy API (no torch). `.bin` files are pickles: they are read only with
`torch.load(..., weights_only=True)`, which refuses any pickle that would run code.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import warnings
import zipfile

import ml_dtypes
import msgpack
import numpy as np
from flax import serialization

from jaxbert.config import BertConfig
from jaxbert.convert import ConversionReport, MissingKeys, flax_to_torch_any, one_float_dtype, torch_to_flax
from jaxbert.files import checkpoint_file, existing_file, read_json

SAFETENSORS, SAFETENSORS_INDEX = "model.safetensors", "model.safetensors.index.json"
TORCH_BIN, TORCH_BIN_INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"
FLAX_MSGPACK = "flax_model.msgpack"
WEIGHT_FILES = (SAFETENSORS, SAFETENSORS_INDEX, TORCH_BIN, TORCH_BIN_INDEX, FLAX_MSGPACK)


def find_weights(directory: str) -> str:
    """The weights file of a directory: the one config.json names, else the first in transformers' order of
    preference."""
    from jaxbert.sentence_dir import transformer_dir

    if not os.path.isdir(directory):
        raise FileNotFoundError(f"{directory}: no such directory")
    directory = transformer_dir(directory)  # a sentence-transformers 0_Transformer/ subfolder's, if so
    named = _named_weights(directory)
    if named:
        return named
    for name in WEIGHT_FILES:
        path = existing_file(directory, name)
        if path:
            return path
    raise FileNotFoundError(f"{directory}: no weights file found (looked for {', '.join(WEIGHT_FILES)})")


def _named_weights(directory: str) -> str | None:
    """config.json's `transformers_weights`: the safetensors file (or index) transformers 5 loads in place of the
    usual names, which may then hold other weights. It must lie inside the directory and exist."""
    config = existing_file(directory, "config.json")
    name = read_json(config).get("transformers_weights") if config else None
    if name is None:
        return None
    if not isinstance(name, str) or not name.endswith((".safetensors", ".safetensors.index.json")):
        raise ValueError(f"{config}: transformers_weights {name!r} is not a .safetensors or .safetensors.index.json")
    # transformers 5 reads an index's shards from the directory's root, jaxbert beside the index: keep them one.
    if name.endswith(".json") and os.path.dirname(os.path.normpath(name)):
        raise ValueError(f"{config}: transformers_weights {name!r}: an index outside the root is not supported")
    path = checkpoint_file(directory, name)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: not found (config.json names it as the weights: transformers_weights)")
    return path


# What numpy (with ml_dtypes' bfloat16) holds, complex aside (never a parameter); float8/6/4 tensors and the like
# are refused by name, from a safetensors header before any data is read.
_SAFETENSORS_DTYPES = ("F16", "BF16", "F32", "F64", "I8", "I16", "I32", "I64", "U8", "U16", "U32", "U64", "BOOL")
_TORCH_DTYPES = ("float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16")
_TORCH_DTYPES += ("uint32", "uint64", "bool")


def _unsupported(path: str, key: str, dtype: str, floats: str) -> ValueError:
    return ValueError(f"{path}: {key!r} has unsupported dtype {dtype} (parameters must be {floats})")


class SafetensorsTensor:
    """One tensor of a safetensors file, read when `np.asarray` asks for it. Its shape comes from the header, so
    the converter checks names and shapes against the config before any data is read: a header may declare a
    64 GiB tensor that must be refused, not allocated."""

    def __init__(self, path: str, key: str, shape: list[int]):
        self.path, self.key, self.shape = path, key, tuple(shape)

    def __array__(self, dtype=None, copy=None):
        from safetensors import SafetensorError, safe_open

        try:  # Reopened per tensor: the mapped pages of tensors already copied would otherwise count twice in
            # the peak RSS (load_file would hold the whole file twice).
            with safe_open(self.path, framework="np") as f:
                value = f.get_tensor(self.key)
        except (SafetensorError, OSError, ValueError) as e:
            raise ValueError(f"{self.path}: {self.key!r} not readable ({e})") from None
        return value if dtype is None else value.astype(dtype)


def _read_safetensors(path: str) -> dict[str, SafetensorsTensor]:
    """The header alone: every tensor's dtype checked, each tensor read later, one at a time."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(path, framework="np") as f:
            views = {key: f.get_slice(key) for key in f.keys()}
            header = {key: (view.get_dtype(), view.get_shape()) for key, view in views.items()}
    except (SafetensorError, OSError, ValueError) as e:
        raise ValueError(f"{path}: not a readable safetensors file ({e})") from None
    for key, (dtype, _) in header.items():
        if dtype not in _SAFETENSORS_DTYPES:
            raise _unsupported(path, key, dtype, "F16, BF16, F32 or F64")
    return {key: SafetensorsTensor(path, key, shape) for key, (_, shape) in header.items()}


def _read_torch_bin(path: str) -> dict[str, np.ndarray]:
    try:
        import torch
    except ImportError:
        raise ImportError(f"{path}: reading .bin checkpoints needs torch: pip install 'jaxbert[torch]'") from None
    _check_records(path)
    try:
        with warnings.catch_warnings():  # torch warns about old pickle protocols; the error below is what counts
            warnings.simplefilter("ignore", UserWarning)
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch raises many types for bad or unsafe pickles
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"{path}: refused or unreadable PyTorch checkpoint ({first_line})") from None
    _check_tensor_dict(path, state, lambda v: isinstance(v, torch.Tensor))
    return {key: _torch_to_numpy(path, key, value) for key, value in state.items()}


def _check_records(path: str) -> None:
    """torch.save stores each tensor's bytes once, uncompressed, so a zip .bin unpacks to at most its own size.
    Records that unpack to more (deflated, or several entries over the same bytes) would make torch.load allocate
    many times the file (a 1 MB file, 4 GiB): refused before loading. A legacy (non-zip) .bin reads its tensors
    from the file as they are."""
    try:
        with open(path, "rb") as f:
            if f.read(4) != b"PK\x03\x04":  # what torch.load tells a zip by: the legacy format is not one
                return
        with zipfile.ZipFile(path) as archive:
            unpacked = sum(info.file_size for info in archive.infolist())
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        return  # a broken zip: torch.load names it
    size = os.path.getsize(path)
    if unpacked > size:
        raise ValueError(
            f"{path}: its records unpack to {unpacked:,} bytes, more than the file's {size:,} (compressed or "
            "overlapping records, which torch.save never writes): refused before loading"
        )


def _torch_to_numpy(path: str, key: str, tensor) -> np.ndarray:
    """A tensor of a `.bin` as numpy, sharing its memory. nn.Parameter values (saved with requires_grad) are
    detached; sparse, meta and float8 tensors have no numpy form and are named instead."""
    import torch

    if tensor.layout != torch.strided:
        raise ValueError(f"{path}: {key!r} is a {tensor.layout} tensor, not a dense one (save it .to_dense())")
    if tensor.is_meta:
        raise ValueError(f"{path}: {key!r} is a meta tensor: it holds no data")
    dtype = str(tensor.dtype).removeprefix("torch.")
    if dtype not in _TORCH_DTYPES:
        raise _unsupported(path, key, dtype, "float16, bfloat16, float32 or float64")
    tensor = tensor.detach()
    if tensor.dtype == torch.bfloat16:  # numpy has no bfloat16; ml_dtypes' has the same bits (as safetensors gives)
        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


def _check_tensor_dict(path: str, state, is_tensor) -> None:
    """A state dict is a flat mapping of string keys to tensors; say what else a file holds instead."""
    if not isinstance(state, dict):
        raise ValueError(f"{path}: holds a {type(state).__name__}, not a dict of tensors")
    for key, value in state.items():
        if not isinstance(key, str):
            raise ValueError(f"{path}: key {key!r} is of type {type(key).__name__}, not a string")
        if not is_tensor(value):
            nested = " (a nested dict: save model.state_dict() itself)" if isinstance(value, dict) else ""
            raise ValueError(f"{path}: {key!r} is of type {type(value).__name__}, not a tensor{nested}")


def _read_sharded(index_path: str, read_one) -> dict[str, np.ndarray]:
    """Every shard the index names, each inside the checkpoint directory; a key in two shards is an error."""
    weight_map = read_json(index_path).get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ValueError(f"{index_path}: weight_map must be an object of tensor name -> shard file name")
    directory = os.path.dirname(index_path)
    state, origin, files = {}, {}, {}
    for shard in sorted(set(weight_map.values())):
        path = checkpoint_file(directory, shard)
        # One file named two ways ("./a" and "a") is read once, as transformers reads it: its keys were refused
        # as "also in shard ./a", though no key had two values to choose between.
        files.setdefault(os.path.realpath(path), (shard, path))
    for shard, path in files.values():
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path}: shard named by {os.path.basename(index_path)} not found")
        for key, value in read_one(path).items():
            if key in origin:
                raise ValueError(f"{path}: key {key!r} is also in shard {origin[key]}")
            state[key], origin[key] = value, shard
    return state


def read_state_dict(path: str) -> dict[str, np.ndarray | SafetensorsTensor]:
    """A PyTorch-named state dict from a safetensors / .bin file or a shard index. safetensors values are read
    by `np.asarray` (`np.shape` reads nothing); `torch_to_flax` reads each once its name and shape fit."""
    name = os.path.basename(path)
    if name.endswith(".safetensors.index.json"):  # SAFETENSORS_INDEX, or another that config.json names
        return _read_sharded(path, _read_safetensors)
    if name == TORCH_BIN_INDEX:
        return _read_sharded(path, _read_torch_bin)
    return _read_safetensors(path) if path.endswith(".safetensors") else _read_torch_bin(path)


def read_msgpack(path: str) -> dict:
    try:
        with open(path, "rb") as f:
            tree = serialization.msgpack_restore(f.read())
    except Exception as e:  # noqa: BLE001 - msgpack raises several types on truncated data
        raise ValueError(f"{path}: not a readable flax msgpack file ({type(e).__name__}: {e})") from None
    if not isinstance(tree, dict):
        raise ValueError(f"{path}: the top level is a {type(tree).__name__}, not a map of parameters")
    return tree


def load_params(
    directory: str, config: BertConfig, head: str, *, allow_missing_head: bool = False
) -> tuple[dict, ConversionReport]:
    """Parameters for `head` from any supported checkpoint in `directory`, as a tree of numpy arrays."""
    path = find_weights(directory)
    if path.endswith(".msgpack"):
        # A Flax tree already; round-trip through the PyTorch naming so it gets the same checks.
        state = flax_to_torch_any(read_msgpack(path))
    else:
        state = read_state_dict(path)
    if getattr(config, "is_encoder_decoder", False):
        from jaxbert import seq2seq

        params, report = seq2seq.torch_to_flax(state, config)  # as lazily: shapes first (seq2seq.py)
    else:
        params, report = torch_to_flax(state, config, head, allow_missing_head=allow_missing_head)
    return one_float_dtype(params), report


def load_head_params(directory: str, config: BertConfig, head: str, given: str | None) -> tuple[list, object, str]:
    """([the parameters for `head`], their ConversionReport, the head); `given` is the caller's head (None:
    config.json's). A list, so that the caller can hand the tree on as its only reference (Bert's `consume` frees
    each layer once stacked). A sentence-transformers directory whose config.json names a head its weights lack
    loads as the base model: sentence-transformers builds it with AutoModel, whatever `architectures` says."""
    from jaxbert import sentence_dir

    try:
        params, report = load_params(directory, config, head)
        return [params], report, head
    except MissingKeys:
        if given is not None or head == "BertModel":
            raise
        if sentence_dir.read(directory) is None:
            raise
    params, report = load_params(directory, config, "BertModel")
    return [params], report, "BertModel"


# -- writing ---------------------------------------------------------------------------------------------------
# Files that travel with the weights: the tokenizer's, and generate's defaults.
COMPANION_FILES = (
    "vocab.txt",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "generation_config.json",
)
_MSGPACK_NDARRAY = 1  # flax.serialization's ExtType code for numpy arrays


def model_files(directory: str) -> list[str]:
    """The files a model is read from (config, weights, tokenizer, sentence-transformers): no output replaces
    them (files.check_not_read)."""
    from jaxbert.sentence_dir import companion_files, transformer_dir

    model = transformer_dir(directory)  # a sentence-transformers 0_Transformer/ subfolder, if so
    names = ("config.json", *WEIGHT_FILES, *COMPANION_FILES)
    own = [os.path.join(directory, name) for name in companion_files(directory)]
    return [os.path.join(model, name) for name in names] + own


def _bin_header(n: int) -> bytes:
    if n < 2**8:
        return struct.pack(">BB", 0xC4, n)
    return struct.pack(">BH", 0xC5, n) if n < 2**16 else struct.pack(">BI", 0xC6, n)


def _ext_header(n: int, code: int) -> bytes:
    fixed = {1: 0xD4, 2: 0xD5, 4: 0xD6, 8: 0xD7, 16: 0xD8}  # msgpack's fixext forms, as packb chooses them
    if n in fixed:
        return struct.pack(">Bb", fixed[n], code)
    if n < 2**8:
        return struct.pack(">BBb", 0xC7, n, code)
    return struct.pack(">BHb", 0xC8, n, code) if n < 2**16 else struct.pack(">BIb", 0xC9, n, code)


def write_msgpack(tree: dict, f) -> None:
    """Stream a tree of arrays to `f` in flax.serialization's msgpack format, one leaf at a time.

    flax's `msgpack_serialize` builds the whole file in memory (a second copy of every parameter); writing
    leaf by leaf keeps peak memory at the parameters plus one array. `msgpack_restore` reads the result.
    """
    packer = msgpack.Packer(use_bin_type=True)
    if isinstance(tree, dict):
        f.write(packer.pack_map_header(len(tree)))
        for key, value in tree.items():
            f.write(packer.pack(key))
            write_msgpack(value, f)
        return
    arr = np.asarray(tree, order="C")  # (ascontiguousarray would turn 0-d arrays into 1-d)
    if arr.nbytes >= 2**30:
        raise ValueError(f"array of {arr.nbytes} bytes: flax chunks arrays of 1 GiB and more; not supported")
    head = packer.pack_array_header(3) + packer.pack(list(arr.shape)) + packer.pack(arr.dtype.name)
    head += _bin_header(arr.nbytes)
    f.write(_ext_header(len(head) + arr.nbytes, _MSGPACK_NDARRAY) + head)
    f.write(memoryview(arr.reshape(-1).view(np.uint8)))


def copy_companion_files(src: str, dst: str, sentence: bool = True) -> list[str]:
    """Copy the tokenizer, generation-config and (`sentence`) sentence-transformers files `src` has (their
    contents: symlinks are followed, within the policy of files.py) into `dst`."""
    from jaxbert.sentence_dir import companion_files, copied_name, root_modules, transformer_dir

    model, copied = transformer_dir(src), []  # the tokenizer of a 0_Transformer/ subfolder goes to dst's root
    files = [(model, name, name) for name in COMPANION_FILES]
    if not sentence:
        return [to for where, name, to in files if _copy(where, name, dst, to)]
    files += [(src, name, copied_name(src, name)) for name in companion_files(src)]
    copied = [to for where, name, to in files if _copy(where, name, dst, to)]
    modules = root_modules(src)
    if modules is not None:  # dst holds the model at its root: its modules.json says so
        with open(os.path.join(dst, "modules.json"), "w", encoding="utf-8") as f:
            json.dump(modules, f, indent=2)
    return copied


def _copy(where: str, name: str, dst: str, to: str) -> bool:
    path = existing_file(where, name)
    if path:
        os.makedirs(os.path.dirname(os.path.join(dst, to)), exist_ok=True)
        shutil.copyfile(path, os.path.join(dst, to))
    return bool(path)
