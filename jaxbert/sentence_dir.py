"""sentence-transformers model directories: what `embed` should do by default, read from the files that
SentenceTransformer(dir) reads (modules.json, the Pooling module's config.json, sentence_bert_config.json or an
older name of it).

A directory is a pipeline of modules: the Transformer (BERT at the directory's root, or in the subfolder that
modules.json names for it: transformer_dir), then Pooling (cls / mean / max / mean of the square root of the
length / weighted mean / last token, concatenated in the configured order when several), then any number of
Dense projections and Dropouts (sentence_dense.py: LaBSE's kind), then optionally Normalize. `max_seq_length`
truncates the tokens (special tokens included), capped at the model's positions, and `do_lower_case` lower-cases
the texts first (tokenizer.WordPiece.lowercased, as sentence-transformers 6 does). Its prompts
(config_sentence_transformers.json) go before the texts as encode puts them (resolve_prompt), and a Pooling with
include_prompt false leaves their tokens out (prompt_length). A module jaxbert does not run (a
Dense of another feature or after Normalize, a class from outside sentence_transformers, ...) or a pipeline not
starting with the Transformer is kept as `unsupported`, so `embed` refuses to pretend to be the pipeline instead of
silently returning something else.

Where the Transformer module's files are, its settings file and the files a copy takes along are
sentence_files.py's (re-exported here: transformer_dir, SETTINGS_FILES, companion_files, ...).
"""

from __future__ import annotations

import dataclasses
import os
import warnings

from jaxbert import sentence_dense
from jaxbert.files import checkpoint_file, existing_file, read_json
from jaxbert.inputs import Arg, ArgumentError
from jaxbert.sentence_files import (  # noqa: F401  (re-exported: the names other modules import from sentence_dir)
    FILES,
    SETTINGS_FILES,
    _length,
    _module_type,
    _settings,
    _transformer_unsupported,
    companion_files,
    copied_name,
    root_modules,
    transformer_dir,
)

# sentence-transformers' legacy boolean keys, in the order its Pooling concatenates the modes.
_LEGACY_MODES = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
# SentenceTransformer's own prompts, "" unless a directory gives them (null is "" too).
_NO_PROMPTS = (("query", ""), ("document", ""))
POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")  # jaxbert computes them
# sentence-transformers' SimilarityFunction names (a model's similarity_fn_name); its distances are negated.
SIMILARITIES = ("cosine", "dot", "euclidean", "manhattan")
_STEPS = {"Dense": sentence_dense.read_dense, "Dropout": sentence_dense.read_dropout}  # modules after the Pooling


@dataclasses.dataclass(frozen=True)
class SentenceDefaults:
    pooling: tuple[str, ...]
    normalize: bool
    max_seq_length: int | None
    lower_case: bool
    unsupported: str | None = None  # why the pipeline cannot be reproduced, naming the file and module
    similarity: str = "cosine"  # similarity_fn_name of config_sentence_transformers.json
    steps: tuple = ()  # the Dense and Dropout modules after the Pooling, in order (sentence_dense.py)
    prompts: tuple = _NO_PROMPTS  # (name, text) of config_sentence_transformers.json's prompts (_prompts)
    default_prompt_name: str | None = None  # the prompt encode puts before every text when none is asked for
    include_prompt: bool = True  # false: the Pooling leaves a prompt's tokens out (pooling.keep)
    prompts_path: str | None = None  # the file the prompts come from, for messages


def _modes(path: str, config: dict) -> tuple[str, ...]:
    """The pooling modes of a Pooling config, new style ("pooling_mode": str | list) or legacy booleans."""
    if "pooling_mode" in config:
        mode = config["pooling_mode"]
        modes = (mode,) if isinstance(mode, str) else tuple(mode) if isinstance(mode, list) else None
        if not modes or not all(isinstance(m, str) for m in modes):
            raise ValueError(f"{path}: pooling_mode {mode!r} is not a mode name or a list of them")
        return modes
    # Tested for truth, as sentence-transformers does: 1 is true, 0 and null are not.
    return tuple(m for key, m in _LEGACY_MODES.items() if config.get(key)) or ("mean",)


_POOLING_KEYS = {"word_embedding_dimension", "embedding_dimension", "pooling_mode", "include_prompt", *_LEGACY_MODES}


def _pooling(directory: str, modules_path: str, sub: str) -> tuple[tuple[str, ...], str | None, bool]:
    """(modes, why jaxbert cannot run them or None, include_prompt) of the Pooling module at `sub`."""
    name = os.path.join(sub, "config.json")
    config_path = existing_file(directory, name)
    if config_path is None:
        raise ValueError(f"{modules_path}: its Pooling module has no {name}")
    config = read_json(config_path)
    modes = _modes(config_path, config)
    unknown = [key for key in config if key not in _POOLING_KEYS]  # sentence-transformers: a TypeError
    bad = [m for m in modes if m not in POOLING_MODES]
    include = config.get("include_prompt", True)  # false: a prompt's tokens are left out of the pooling
    if unknown:
        return modes, f"{config_path}: {unknown[0]!r} is not a setting of sentence-transformers' Pooling", True
    if bad:
        return modes, f"{config_path}: pooling mode {bad[0]!r} is not implemented by jaxbert", True
    if not isinstance(include, bool):
        return modes, f"{config_path}: include_prompt must be true or false", True
    return modes, None, include


def _normalizes_elsewhere(directory: str, sub: str) -> str | None:
    """Why a Normalize module does not normalize the sentence embedding, if it does not: sentence-transformers 6
    normalizes the feature its config.json names (e.g. the token embeddings) and writes it where that names."""
    path = existing_file(directory, f"{sub}/config.json") if sub not in ("", ".") else None
    config = read_json(path) if path else {}
    given = {"module_input_name": config.get("module_input_name", "sentence_embedding")}
    output = config.get("module_output_name")
    given["module_output_name"] = given["module_input_name"] if output is None else output  # null: the input's
    for key, name in given.items():
        if name != "sentence_embedding":
            return f"{path}: {key} {name!r} (a Normalize of another feature) is not run by jaxbert"
    return None


def _prompts(path: str | None, model: dict) -> tuple[tuple, str | None, str | None]:
    """(prompts, default_prompt_name, why SentenceTransformer(dir) refuses them or None) of
    config_sentence_transformers.json: its prompts over encode's own "query" and "document" ("" unless given; null
    is "" too), and the default name, any string ("" too), which must be among them."""
    given, name = model.get("prompts", {}), model.get("default_prompt_name")
    if not isinstance(given, dict):  # sentence-transformers fails on it (AttributeError)
        return _NO_PROMPTS, None, f"{path}: prompts must be an object of name: text"
    prompts = {**dict(_NO_PROMPTS), **{str(k): "" if v is None else v for k, v in given.items()}}
    if name is not None and name not in prompts:
        return tuple(prompts.items()), None, f"{path}: default_prompt_name {name!r} is not among its prompts"
    return tuple(prompts.items()), name, None


def resolve_prompt(defaults: SentenceDefaults | None, prompt: str | None, prompt_name: str | None) -> str:
    """The text put before every text, as SentenceTransformer.encode resolves it: `prompt` if given (`prompt_name`
    then ignored, as encode ignores it, with a warning), else the directory's prompt named `prompt_name`, else its
    default prompt; "" for none. A name the directory lacks is an error naming the names it has."""
    if prompt is not None:
        if not isinstance(prompt, str):
            raise TypeError(f"prompt must be a string, got {type(prompt).__name__}")
        if prompt_name is not None:
            note = f"prompt and prompt_name {prompt_name!r} given: prompt_name ignored, as encode ignores it"
            warnings.warn(note, stacklevel=2)
        return prompt
    prompts = dict(defaults.prompts if defaults else _NO_PROMPTS)
    key, name = "prompt_name", prompt_name
    if name is None:
        key, name = "default_prompt_name", defaults.default_prompt_name if defaults else None
    where = (defaults and defaults.prompts_path) or "the model"
    if name is None:
        return ""
    if name not in prompts:  # a name asked for is an argument (a CLI's flag); the default one is the file's
        named = Arg.showing(key, name, repr) if key == "prompt_name" else f"{key} {name!r}"
        raise ArgumentError(named, f": {where} has no such prompt (its prompts: {', '.join(map(repr, prompts))})")
    if not isinstance(prompts[name], str):
        raise ValueError(f"{where}: prompts[{name!r}] is {prompts[name]!r}, not a string")
    return prompts[name]


def prompt_length(tok, prompt: str, max_length: int) -> int:
    """The tokens of `prompt` that sentence-transformers' Pooling leaves out with include_prompt false: the prompt
    tokenized alone (truncated as the texts are), [CLS] included, less a special token at its end ([SEP]); 0 for
    no prompt. They are the first that many of each prompted text, whether or not its own tokens are the prompt's
    (a prompt without a space before the text may join its first word)."""
    if not prompt:
        return 0
    ids = tok.encode([prompt], max_length=max_length).ids[0]
    special = {tok.token_to_id(t) for t in (*tok.special_tokens.values(), *tok.additional_special)}
    return len(ids) - (bool(ids) and ids[-1] in special)


def read(directory: str) -> SentenceDefaults | None:
    """The embedding defaults of a sentence-transformers directory; None when `directory` is not one."""
    modules_path = existing_file(directory, "modules.json")
    if modules_path is None:
        return None
    pooling, normalize, unsupported, steps, include = None, False, None, [], True
    listed = read_json(modules_path, list)
    modules = [_module_type(modules_path, module) for module in listed]
    names = [str(module.get("name")) for module in listed]
    twice = next((name for i, name in enumerate(names) if name in names[:i]), None)
    for _, sub in modules:  # sentence-transformers refuses the directory if any module's path leaves it
        if sub not in ("", "."):
            checkpoint_file(directory, sub)
    if not modules or modules[0][0] != "Transformer":
        unsupported = f"{modules_path}: the first module is not the Transformer"
    if twice is not None:  # sentence-transformers keys the modules by name: the last one listed replaces the first
        unsupported = f"{modules_path}: two modules are named {twice!r}"
    for kind, sub in modules[1:]:
        if kind == "Pooling" and pooling is None:
            pooling, why, include = _pooling(directory, modules_path, sub)
            unsupported = unsupported or why
        elif kind == "Normalize" and pooling is not None:
            elsewhere = _normalizes_elsewhere(directory, sub)
            normalize = normalize or not elsewhere  # one of another feature leaves the sentence embedding as pooled
            if elsewhere and unsupported is None:
                unsupported = elsewhere
        elif kind in _STEPS and pooling is not None and not (normalize and kind == "Dense"):
            step, why = _STEPS[kind](directory, sub)
            step = dataclasses.replace(step, after_normalize=True) if normalize and step else step
            steps, unsupported = steps + [step], unsupported or why
        elif unsupported is None:  # a Dense after Normalize too: jaxbert normalizes last
            unsupported = f"{modules_path}: module {kind} at {sub!r} is not run by jaxbert"
    if pooling is None and unsupported is None:
        unsupported = f"{modules_path}: no Pooling module"
    unsupported = unsupported or _chain(directory, modules_path, pooling, steps)
    settings_path, settings = _settings(transformer_dir(directory))
    length = _length(settings_path, settings)
    unsupported = unsupported or _transformer_unsupported(settings_path, settings)
    model_path = existing_file(directory, "config_sentence_transformers.json")
    model = read_json(model_path) if model_path else {}
    prompts, default_name, refused = _prompts(model_path, model)
    unsupported = unsupported or refused
    if model.get("truncate_dim") is not None and unsupported is None:  # encode keeps that many dimensions
        unsupported = f"{model_path}: truncate_dim {model['truncate_dim']!r} is not implemented by jaxbert"
    similarity = model.get("similarity_fn_name")  # sentence-transformers 6 takes a name it knows, else cosine
    similarity = similarity if similarity in SIMILARITIES else "cosine"
    lower = bool(settings.get("do_lower_case"))
    return SentenceDefaults(
        pooling or ("mean",), normalize, length, lower, unsupported, similarity, tuple(steps), prompts, default_name,
        include, model_path,
    )  # fmt: skip


def _chain(directory: str, modules_path: str, pooling, steps: list) -> str | None:
    """Why the Dense modules' sizes do not follow on from the pooled embedding's, if so."""
    from jaxbert.config import BertConfig

    model = transformer_dir(directory)
    if not steps or existing_file(model, "config.json") is None:
        return None
    pooled = BertConfig.from_pretrained(model).hidden_size * len(pooling)
    return sentence_dense.check_chain(tuple(steps), pooled, modules_path)


def embedding_options(defaults: SentenceDefaults | None, pooling, normalize, max_length):
    """`embed`'s (pooling modes, normalize, max_length, lower_case): each argument given wins, each one left None
    comes from the sentence-transformers directory, else jaxbert's own default ([CLS], not normalized, the
    model's length). A pipeline jaxbert cannot reproduce is refused unless the pooling is given."""
    from jaxbert.pooling import POOLINGS

    if pooling is None:
        if defaults is not None and defaults.unsupported:
            # Named alone, not `pooling=`: the command line names it by its flag, --pooling.
            why = " to embed with jaxbert's own pooling instead"
            raise ArgumentError(f"{defaults.unsupported}; pass ", Arg("pooling"), why)
        pooling = defaults.pooling if defaults else "cls"
    modes = (pooling,) if isinstance(pooling, str) else tuple(pooling)
    for mode in modes or ("",):
        if mode not in POOLINGS:
            expected = f": expected one of {', '.join(POOLINGS)} (or a sequence of them)"
            raise ArgumentError(Arg.showing("pooling", mode, repr), expected)
    if normalize is None:
        normalize = defaults.normalize if defaults else False
    if max_length is None and defaults is not None:
        max_length = defaults.max_seq_length
    return modes, bool(normalize), max_length, bool(defaults and defaults.lower_case)
