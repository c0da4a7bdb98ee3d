"""The Transformer module's files in a sentence-transformers directory: where they are (transformer_dir: the root,
or the subfolder modules.json names, e.g. 0_Transformer/ of older versions), its settings file (SETTINGS_FILES, e.g.
sentence_bert_config.json: the tokens kept, and the settings jaxbert does not run), and the files a copy of the
directory takes along with the weights (companion_files, copied_name, root_modules). sentence_dir.py reads the
rest of the pipeline and re-exports these names.
"""

from __future__ import annotations

import os

from jaxbert.files import checkpoint_file, existing_file, read_json


def _module_type(path: str, module: dict) -> tuple[str, str]:
    """(class name, path) of a module; a class outside sentence_transformers keeps its whole reference, so a
    third-party `mypkg.Normalize` (code sentence-transformers would import) is never taken for its own."""
    if (
        not isinstance(module, dict)
        or not isinstance(module.get("type"), str)
        or not isinstance(module.get("path", ""), str)
    ):
        raise ValueError(f'{path}: each module must be an object with string "type" and "path"')
    ref = module["type"]
    return ref.rsplit(".", 1)[-1] if ref.startswith("sentence_transformers.") else ref, module.get("path", "")


def _capped(directory: str, length: int) -> int:
    """max_seq_length, at most the model's max_position_embeddings. sentence-transformers 6.2 gives a longer one
    to the tokenizer unchecked: texts that fit the positions embed as if it were capped, longer ones crash in the
    model. Capping gives the same vectors for the former and truncates the latter, as max_seq_length asks."""
    from jaxbert.config import BertConfig

    if existing_file(directory, "config.json") is None:
        return length
    return min(length, BertConfig.from_pretrained(directory).max_position_embeddings)


# sentence_bert_config.json's other keys, with the values that leave the Transformer module as jaxbert runs it (what
# sentence-transformers 6 saves for a BERT): anything else (another task, a tokenizer from elsewhere, ...) is not.
_PLAIN_SETTINGS = {
    "transformer_task": ("feature-extraction",),
    "module_output_name": ("token_embeddings",),
    "modality_config": ({"text": {"method": "forward", "method_output_name": "last_hidden_state"}},),
    "unpad_inputs": (None, True, False),  # flash attention's unpadding: the same vectors
    **{key: (None,) for key in ("query_length", "document_length", "query_expansion")},
    "processing_kwargs": (None, {}),
}
# Keyword dicts sentence-transformers passes to transformers, old name first. It renames the old key to the new one
# over it: when both are given, the old one's dict is the one passed and the new one's is never read.
_TOKENIZER_KWARGS = ("tokenizer_args", "processor_kwargs")
_MODEL_KWARGS = ("model_args", "model_kwargs", "config_args", "config_kwargs")
_RENAMED = {"processor_kwargs": "tokenizer_args", "model_kwargs": "model_args", "config_kwargs": "config_args"}
# Keyword arguments that leave the vectors as jaxbert computes them: how and where transformers loads (a dtype or
# attention kernel changes round-off only); trust_remote_code is dropped by sentence-transformers itself.
_HARMLESS = ("trust_remote_code", "torch_dtype", "dtype", "attn_implementation", "low_cpu_mem_usage", "revision",
             "cache_dir", "token", "local_files_only")  # fmt: skip


def _length(path: str | None, settings: dict) -> int | None:
    """The tokens kept: the tokenizer keyword arguments' model_max_length, which sentence-transformers gives the
    tokenizer in place of max_seq_length, else max_seq_length; None when neither is set."""
    key, length = "max_seq_length", settings.get("max_seq_length")
    name = "tokenizer_args" if "tokenizer_args" in settings else "processor_kwargs"  # see _RENAMED
    kwargs = settings.get(name)
    if isinstance(kwargs, dict) and "model_max_length" in kwargs:
        key, length = f"{name}.model_max_length", kwargs["model_max_length"]
    if length is not None and (isinstance(length, bool) or not isinstance(length, int) or length < 1):
        raise ValueError(f"{path}: {key} {length!r} is not a positive integer")
    return None if length is None else _capped(os.path.dirname(path), length)


def _transformer_unsupported(path: str | None, settings: dict) -> str | None:
    """Why sentence-transformers' Transformer module would not be the model and tokenizer jaxbert runs, if so."""
    for key, value in settings.items():
        if key in ("max_seq_length", "do_lower_case") or _RENAMED.get(key) in settings:
            continue
        if key in _TOKENIZER_KWARGS + _MODEL_KWARGS and isinstance(value, dict):
            read = {*_HARMLESS, *(("model_max_length",) if key in _TOKENIZER_KWARGS else ())}
            other = [name for name in value if name not in read]
            if other:
                return f"{path}: {key} {other[0]!r} is not run by jaxbert"
        elif key not in _PLAIN_SETTINGS or value not in _PLAIN_SETTINGS[key]:
            return f"{path}: {key}={value!r} is not run by jaxbert"
    return None


# The Transformer module's settings files, in the order sentence-transformers tries them (its older releases named
# the file after the model type).
SETTINGS_FILES = tuple(
    f"sentence_{kind}_config.json"
    for kind in ("bert", "roberta", "distilbert", "camembert", "albert", "xlm-roberta", "xlnet")
)


def _settings(directory: str) -> tuple[str | None, dict]:
    """(path, contents) of the Transformer's settings: the first of SETTINGS_FILES that is there and not empty, as
    sentence-transformers reads them (an empty one is passed over)."""
    for name in SETTINGS_FILES:
        path = existing_file(directory, name)
        settings = read_json(path) if path else {}
        if settings:
            return path, settings
    return existing_file(directory, SETTINGS_FILES[0]), {}


def _transformer_sub(directory: str) -> str | None:
    """The subfolder modules.json names for the Transformer module listed first, when it is not the root: older
    sentence-transformers versions (and many hub models) saved it as 0_Transformer/, with the model's config,
    weights, tokenizer and sentence_bert_config.json inside; sentence-transformers loads them from there."""
    modules_path = existing_file(directory, "modules.json")
    try:
        kind, sub = _module_type(modules_path, read_json(modules_path, list)[0]) if modules_path else ("", "")
    except (ValueError, IndexError):  # an unreadable modules.json: the model at the root, as transformers reads it
        return None  # (embed names what is wrong with it: read)
    return sub if kind == "Transformer" and os.path.normpath(sub or ".") != "." else None


def transformer_dir(directory: str) -> str:
    """Where the model's own files (config.json, weights, tokenizer, sentence_bert_config.json) are: `directory`,
    or the Transformer module's subfolder (see _transformer_sub), a path checked to stay inside `directory`."""
    directory = os.fspath(directory)
    sub = _transformer_sub(directory)
    if sub is None:
        return directory
    path = checkpoint_file(directory, sub)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path}: no such directory (modules.json names it for the Transformer module)")
    return path


FILES = ("modules.json", *SETTINGS_FILES, "config_sentence_transformers.json")


def companion_files(directory: str) -> list[str]:
    """The sentence-transformers files of `directory` that travel with its weights (relative names): the
    top-level ones and every file of each module's directory (its config.json, and a Dense's weights). Of a
    Transformer subfolder (transformer_dir) only its settings file: the model's files travel as the model's."""
    model = _transformer_sub(directory)
    top = FILES if model is None else (*FILES[:1], *(os.path.join(model, name) for name in SETTINGS_FILES), FILES[-1])
    names = [name for name in top if existing_file(directory, name)]
    if "modules.json" in names:
        path = existing_file(directory, "modules.json")
        for i, module in enumerate(read_json(path, list)[model is not None :], model is not None):
            kind, sub = _module_type(path, module)
            if model is not None and os.path.normpath(sub) == os.path.normpath(model):
                # Its files are the model's, which the copy holds at its root in its own format: copied as the
                # module's, the source's config.json and weights would land over the written ones.
                raise ValueError(
                    f"{path}: module {i} ({kind}) has the Transformer's path {sub!r}; a copy of this directory "
                    "cannot keep both at one place"
                )
            if os.path.normpath(sub) != ".":  # "./" too (sentence-transformers reads the root there): not the model
                names += _module_files(directory, sub)
    return list(dict.fromkeys(names))


def copied_name(directory: str, name: str) -> str:
    """Where a file of companion_files goes in a copy holding the model at its root (convert, export, training's
    output): a Transformer subfolder's settings file to the root, beside the model, every other file as it is."""
    model = _transformer_sub(directory)
    inside = model is not None and os.path.dirname(os.path.normpath(name)) == os.path.normpath(model)
    return os.path.basename(name) if inside else name


def root_modules(directory: str) -> list | None:
    """modules.json's entries for such a copy, the Transformer at the root ("" as sentence-transformers 6 writes
    it); None when `directory`'s is there already (its modules.json is copied as it is)."""
    if _transformer_sub(directory) is None:
        return None
    listed = read_json(existing_file(directory, "modules.json"), list)
    return [{**listed[0], "path": ""}, *listed[1:]]


def _module_files(directory: str, sub: str) -> list[str]:
    """The files under a module's directory, relative to `directory`, each within the symlink policy."""
    names = []
    for top, dirs, files in os.walk(checkpoint_file(directory, sub)):
        dirs.sort()
        for name in sorted(files):
            rel = os.path.relpath(os.path.join(top, name), directory)
            if existing_file(directory, rel):
                names.append(rel)
    return names
