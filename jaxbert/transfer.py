"""Whole-directory conversion both ways: transformers dir -> jaxbert dir (`convert`) and back (`export`).

Both read with the checked state-dict mapping of `convert.py` and write atomically: a temporary directory
beside the destination, renamed only when everything is written, so a failure leaves no destination behind.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
from collections.abc import Callable

import jax
import ml_dtypes
import numpy as np
from flax import traverse_util

from jaxbert import hub, sentence_dir, seq2seq
from jaxbert.checkpoint import (
    FLAX_MSGPACK,
    SAFETENSORS,
    copy_companion_files,
    find_weights,
    load_head_params,
    write_msgpack,
)
from jaxbert.config import BertConfig
from jaxbert.convert import canonical_key, cast_checked, flax_to_torch, one_float_dtype
from jaxbert.files import atomic_directory, check_disjoint, existing_file, read_json
from jaxbert.heads import resolve_head
from jaxbert.params import count_params
from jaxbert.seq2seq import load_config
from jaxbert.tokenizer import WordPiece

DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


@dataclasses.dataclass
class TransferSummary:
    """What a conversion read and wrote: the report printed by the command line."""

    src: str
    dst: str
    head: str
    source_file: str
    dtype: str
    counts: dict[str, int]
    ignored: dict[str, str]
    absent: list[str]
    files: dict[str, int]  # name -> bytes
    seconds: float = 0.0


def cast_floating(params, dtype: str):
    """Cast floating leaves to `dtype` (integer leaves, if any, are kept), checked for overflow."""
    target = DTYPES[dtype]

    def cast(path, x):
        floating = np.issubdtype(x.dtype, np.floating) or x.dtype == ml_dtypes.bfloat16
        return cast_checked(jax.tree_util.keystr(path, simple=True, separator="/"), x, target) if floating else x

    return jax.tree_util.tree_map_with_path(cast, params)


def _stored_dtype(params) -> str:
    names = {str(x.dtype) for x in jax.tree_util.tree_leaves(params)}
    return names.pop() if len(names) == 1 else "mixed"


def _read(src: str, dtype: str | None):
    if not os.path.isdir(src):
        raise FileNotFoundError(f"{src}: no such directory")
    config = load_config(src)
    head = resolve_head(None, config)
    model = sentence_dir.transformer_dir(src)  # where the tokenizer is: 0_Transformer/ in an older layout
    if existing_file(model, "tokenizer.json") or existing_file(model, "vocab.txt"):
        WordPiece.from_dir(src)  # copied verbatim later: a corrupt tokenizer fails here, not at the user's first call
    settings = existing_file(model, "generation_config.json")
    if settings:  # copied verbatim too: broken JSON was copied, and refused by the converted directory's generate
        read_json(settings)
    # And the sentence-transformers files: an unreadable one fails here (a pipeline jaxbert cannot run is read as
    # `unsupported`, and still copied for embed to refuse).
    sentence_dir.read(src)
    source_file = find_weights(src)
    params, report, head = load_head_params(src, config, head, given=None)
    params = params.pop()
    if report.unused:  # kept: a conversion loses no weights (convert._COMPONENTS)
        flat = {**traverse_util.flatten_dict(params), **report.unused}
        params = one_float_dtype(traverse_util.unflatten_dict(flat))
        for key in [k for k, why in report.ignored.items() if why == f"not used by {head}"]:
            if canonical_key(key, head).startswith(tuple(".".join(p[:2]) + "." for p in report.unused)):
                report.ignored[key] += "; kept in the output"
    if head != resolve_head(None, config):  # a sentence-transformers base model under another head's name
        config = config.replace(architectures=(head,))
    if dtype is not None:
        if dtype not in DTYPES:
            raise ValueError(f"dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
        params = cast_floating(params, dtype)
    return config, head, source_file, params, report


def _write_config(config: BertConfig, head: str, dtype: str, directory: str) -> None:
    data = config.to_dict()
    data["architectures"] = list(config.architectures or (head,))
    data.pop("transformers_weights", None)  # the source's weights file: this directory holds its own
    # transformers 4.x reads torch_dtype, 5.x writes dtype (and reads both): keep whichever the source had.
    keys = [k for k in ("torch_dtype", "dtype") if k in data] or ["torch_dtype"]
    for key in keys:
        data[key] = dtype
    with open(os.path.join(directory, "config.json"), "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")


def _listing(directory: str) -> dict[str, int]:
    return {name: os.path.getsize(os.path.join(directory, name)) for name in sorted(os.listdir(directory))}


def write_jaxbert_dir(
    params,
    config: BertConfig,
    head: str,
    dst: str,
    *,
    tokenizer_from: str | None = None,
    force: bool = False,
    check: Callable[[str], None] | None = None,
    safetensors: bool = False,
    sentence: bool = True,
) -> dict[str, int]:
    """A jaxbert directory: config.json, flax_model.msgpack, tokenizer files; written atomically.

    `check(directory)` runs on the complete directory before it becomes `dst`: whatever it raises leaves `dst` as
    it was (convert --verify: a conversion that fails its comparison is not left behind looking like a good one).
    `safetensors`: also the weights as transformers 5 reads them (model.safetensors, PyTorch names; it reads no
    Flax file), so the directory is a transformers checkpoint as well. `sentence`: also the source's
    sentence-transformers files (not for a decoder or a bert2bert, which no SentenceTransformer embeds with).
    """
    with atomic_directory(dst, force, sources=(tokenizer_from,) if tokenizer_from else ()) as tmp:
        _write_config(config, head, _stored_dtype(params), tmp)
        with open(os.path.join(tmp, FLAX_MSGPACK), "wb") as f:
            write_msgpack(params, f)
        if safetensors:
            from safetensors.numpy import save_file

            if head == "EncoderDecoderModel":
                state = seq2seq.flax_to_torch(params, config, include_tied=False)
            else:
                state = flax_to_torch(params, config, head, include_tied=False)
            arrays = {k: np.ascontiguousarray(v) for k, v in state.items()}
            save_file(arrays, os.path.join(tmp, SAFETENSORS), metadata={"format": "pt"})
        if tokenizer_from:
            copy_companion_files(tokenizer_from, tmp, sentence)
        files = _listing(tmp)
        if check is not None:
            check(tmp)
    return files


def _check_destination(src: str, dst: str, force: bool) -> None:
    """Before reading anything large: DST must not be, contain or lie in SRC, nor exist unless forced."""
    check_disjoint(src, dst)
    if os.path.lexists(dst) and not force:
        raise FileExistsError(f"{os.path.abspath(dst)}: already exists (use --force to replace it)")


def convert_checkpoint(
    src: str,
    dst: str,
    *,
    dtype: str | None = None,
    force: bool = False,
    check: Callable[[str, str], None] | None = None,
) -> TransferSummary:
    """transformers BERT directory (or a transformers 4.x Flax one) -> jaxbert directory.

    `check(src, directory)` (src a hub id's snapshot directory) runs on the written directory before it becomes
    `dst`; if it raises, `dst` is left as it was.
    """
    src = hub.resolve(src)
    start = time.perf_counter()
    _check_destination(src, dst, force)
    config, head, source_file, params, report = _read(src, dtype)
    files = write_jaxbert_dir(
        params, config, head, dst, tokenizer_from=src, force=force, check=check and functools.partial(check, src)
    )
    return TransferSummary(
        src,
        dst,
        head,
        os.path.basename(source_file),
        _stored_dtype(params),
        count_params(params),
        report.ignored,
        report.absent,
        files,
        time.perf_counter() - start,
    )


def export_checkpoint(src: str, dst: str, *, dtype: str = "float32", force: bool = False) -> TransferSummary:
    """jaxbert (or any readable) directory -> transformers directory with model.safetensors.

    Half-precision parameters are widened to float32 unless `dtype` asks otherwise. The tied decoder weight is
    left out, as transformers' own `save_pretrained` does; transformers ties it again on load.
    """
    src = hub.resolve(src)
    start = time.perf_counter()
    _check_destination(src, dst, force)
    config, head, source_file, params, report = _read(src, dtype)
    from safetensors import SafetensorError
    from safetensors.numpy import save_file

    if head == "EncoderDecoderModel":
        state = seq2seq.flax_to_torch(params, config, include_tied=False)
    else:
        state = flax_to_torch(params, config, head, include_tied=False)
    with atomic_directory(dst, force, sources=(src,)) as tmp:
        _write_config(config, head, dtype, tmp)
        path = os.path.join(tmp, SAFETENSORS)
        try:
            save_file({k: np.ascontiguousarray(v) for k, v in state.items()}, path, metadata={"format": "pt"})
        except SafetensorError as e:  # e.g. a full disk: an I/O error in safetensors' own exception type
            raise OSError(f"{dst}: writing {SAFETENSORS} failed ({e})") from None
        copy_companion_files(src, tmp)
        files = _listing(tmp)
    return TransferSummary(
        src,
        dst,
        head,
        os.path.basename(source_file),
        dtype,
        count_params(params),
        report.ignored,
        report.absent,
        files,
        time.perf_counter() - start,
    )
