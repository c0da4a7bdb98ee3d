"""Writing sentence-transformers model directories: what `jaxbert train --task embedding` leaves as OUT/final
and OUT/best, so that `SentenceTransformer(dir)` and `jaxbert.load(dir).embed` run the same pipeline.

The directory holds the base model twice over, once per reader: `flax_model.msgpack` (jaxbert's) and
`model.safetensors` with transformers' names (sentence-transformers loads the Transformer module through
transformers, which has no Flax any more), plus the tokenizer, and the pipeline files sentence-transformers
writes: `modules.json` (Transformer → Pooling → the source's Dense and Dropout modules → Normalize when
normalized), `1_Pooling/config.json`, each Dense's config.json and model.safetensors, the empty `N_Normalize/` and
`sentence_bert_config.json` with `max_seq_length`. The Pooling config uses the legacy boolean keys, which every
sentence-transformers version reads (and `sentence_dir.py` too).
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np

from jaxbert.config import BertConfig

MODES = ("cls", "mean", "max")
_KEYS = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens", "max": "pooling_mode_max_tokens"}


def _json(path: str, value) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=2)
        f.write("\n")


def write_sentence_files(
    directory: str,
    hidden: int,
    pooling: str,
    normalize: bool,
    max_seq_length: int,
    lower_case: bool = False,
    steps: tuple = (),
    dense: tuple = (),
    include_prompt: bool = True,
) -> None:
    """The pipeline files of a sentence-transformers directory (the model and tokenizer are written apart);
    `steps` the Dense / Dropout modules after the Pooling (sentence_dense.py), `dense` each Dense's parameters,
    `include_prompt` the Pooling's (false: a prompt's tokens are not pooled)."""
    if pooling not in MODES:
        raise ValueError(f"pooling {pooling!r}: expected one of {', '.join(MODES)}")
    kinds = ["Transformer", "Pooling", *(type(s).__name__.removesuffix("Spec") for s in steps)]
    kinds += ["Normalize"] * normalize
    modules = [
        {"idx": i, "name": str(i), "path": f"{i}_{kind}" if i else "", "type": f"sentence_transformers.models.{kind}"}
        for i, kind in enumerate(kinds)
    ]
    from jaxbert.sentence_dense import DenseSpec

    layers = iter(dense)
    for step, module in zip(steps, modules[2:]):
        params = next(layers) if isinstance(step, DenseSpec) else None
        _write_step(os.path.join(directory, module["path"]), step, params)
    if normalize:
        os.makedirs(os.path.join(directory, modules[-1]["path"]), exist_ok=True)
    _json(os.path.join(directory, "modules.json"), modules)
    pool = {"word_embedding_dimension": hidden, **{key: mode == pooling for mode, key in _KEYS.items()}}
    pool.update(pooling_mode_mean_sqrt_len_tokens=False, pooling_mode_weightedmean_tokens=False)
    pool.update(pooling_mode_lasttoken=False, include_prompt=include_prompt)
    _json(os.path.join(directory, "1_Pooling", "config.json"), pool)
    _json(
        os.path.join(directory, "sentence_bert_config.json"),
        {"max_seq_length": max_seq_length, "do_lower_case": lower_case},
    )


def _write_step(path: str, step, params: dict | None) -> None:
    """A Dense module's config.json and model.safetensors as sentence-transformers' Dense.save writes them (its
    weights [out, in], the transposes of jaxbert's kernels), or a Dropout's config.json."""
    from safetensors.numpy import save_file

    from jaxbert.sentence_dense import ACTIVATIONS, FEATURE

    if params is None:
        _json(os.path.join(path, "config.json"), {"dropout": step.rate})
        return
    activation = f"torch.nn.modules.{ACTIVATIONS[step.activation][0]}.{step.activation}"
    config = {"in_features": step.in_features, "out_features": step.out_features, "bias": step.bias}
    config.update(activation_function=activation, module_input_name=FEATURE, module_output_name=FEATURE)
    _json(os.path.join(path, "config.json"), {**config, **({"use_residual": True} if step.residual else {})})
    state = {"linear.weight": params["kernel"].T}
    state.update({"linear.bias": params["bias"]} if step.bias else {})
    state.update({"residual.weight": params["residual"]["kernel"].T} if "residual" in params else {})
    state = {k: np.ascontiguousarray(v, np.float32) for k, v in state.items()}
    save_file(state, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})


def _kept_settings(directory: str, trained: dict | None = None) -> dict:
    """What of a source's config_sentence_transformers.json holds for a model trained from it: the similarity
    function (`SentenceTransformer.similarity`; "dot" for a model trained for dot products), the named prompts,
    with the `trained` ones ({name: prompt}) over them, and the default prompt name, which sentence-transformers'
    trainer saves as it found it (it trains without that prompt too). truncate_dim would change every vector, and
    jaxbert trains without it (sentence_dir refuses it unless --pooling is given)."""
    from jaxbert.files import existing_file, read_json

    path = existing_file(directory, "config_sentence_transformers.json")
    found = read_json(path) if path else {}
    kept = {k: found[k] for k in ("similarity_fn_name", "prompts") if found.get(k) is not None}
    if trained:
        kept["prompts"] = {**(kept.get("prompts") or {}), **trained}
    named = ("query", "document", *(kept.get("prompts") or {}))  # encode's own two and the file's
    if isinstance(found.get("default_prompt_name"), str) and found["default_prompt_name"] in named:
        kept["default_prompt_name"] = found["default_prompt_name"]
    return kept


def _drop_sentence_files(directory: str) -> None:
    """The source model's own pipeline files (copied with its tokenizer) would describe another pipeline."""
    from jaxbert.sentence_dir import companion_files

    for name in companion_files(directory):
        os.remove(os.path.join(directory, name))
        sub = os.path.dirname(name)
        while sub and not os.listdir(os.path.join(directory, sub)):  # a module's files may lie in subdirectories
            os.rmdir(os.path.join(directory, sub))
            sub = os.path.dirname(sub)
    for name in os.listdir(directory):  # empty module directories (a Normalize's) are no file of companion_files
        if name.endswith("_Normalize") and os.path.isdir(os.path.join(directory, name)):
            shutil.rmtree(os.path.join(directory, name))


def write_sentence_model(
    params,
    config: BertConfig,
    dst: str,
    *,
    pooling: str,
    normalize: bool,
    max_seq_length: int,
    tokenizer_from: str,
    lower_case: bool = False,
    steps: tuple = (),
    dense: tuple = (),
    prompts: dict | None = None,
) -> None:
    """A complete sentence-transformers directory of the base-model `params` (and of the Dense modules `steps`
    with their parameters `dense`; `prompts` {name: prompt} the trained ones, recorded beside the source's),
    written atomically (a failure leaves no `dst`; an existing one is replaced)."""
    from safetensors.numpy import save_file

    from jaxbert.checkpoint import FLAX_MSGPACK, SAFETENSORS, copy_companion_files, write_msgpack
    from jaxbert.convert import flax_to_torch
    from jaxbert.files import atomic_directory
    from jaxbert.sentence_dir import read
    from jaxbert.transfer import _stored_dtype, _write_config

    config = config.replace(architectures=("BertModel",))
    state = flax_to_torch(params, config, "BertModel", include_tied=False)
    with atomic_directory(dst, True, sources=(tokenizer_from,)) as tmp:
        _write_config(config, "BertModel", _stored_dtype(params), tmp)
        with open(os.path.join(tmp, FLAX_MSGPACK), "wb") as f:
            write_msgpack(params, f)
        save_file(
            {k: np.ascontiguousarray(v, np.float32) for k, v in state.items()},
            os.path.join(tmp, SAFETENSORS),
            metadata={"format": "pt"},
        )
        copy_companion_files(tokenizer_from, tmp)
        kept, source = _kept_settings(tmp, prompts), read(tokenizer_from)  # read by training before
        # The named prompts are kept, and so is how their tokens pool (include_prompt true would pool them).
        include = source is None or source.include_prompt
        _drop_sentence_files(tmp)
        files = (config.hidden_size, pooling, normalize, max_seq_length, lower_case, steps, dense, include)
        write_sentence_files(tmp, *files)
        if kept:
            _json(os.path.join(tmp, "config_sentence_transformers.json"), kept)
