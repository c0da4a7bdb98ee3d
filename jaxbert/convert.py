"""PyTorch state dict ⇄ Flax parameter tree, as pure functions over dicts of numpy arrays.

One rule per leaf kind (Linear weight ⇄ transposed `kernel`, Embedding weight ⇄ `embedding`, LayerNorm weight ⇄
`scale`); every shape is asserted; every source key is either mapped, ignored for a stated reason, or an error.
"""

from __future__ import annotations

import dataclasses
import re

import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import traverse_util

from jaxbert.config import BertConfig
from jaxbert.heads import HEADS, TABLE, resolve_head
from jaxbert.params import param_spec

# Components of BertForPreTraining that other heads do not use. bert-base-uncased and the other original
# checkpoints hold them under an MLM tag: read beside the head (`ConversionReport.unused`), so that a conversion
# can keep them and a classifier fine-tuned from its output starts from the pretrained pooler, as one fine-tuned
# by transformers from the original does.
_COMPONENTS = (("bert", "pooler"), ("cls", "seq_relationship"))
# Buffers transformers keeps in some checkpoints; they hold no learned weights.
_BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")
_BASE_PREFIXES = ("embeddings.", "encoder.", "pooler.")
_LEAF_TO_TORCH = {"kernel": "weight", "embedding": "weight", "scale": "weight", "bias": "bias"}
_TIED_DECODER = "cls.predictions.decoder.weight"
_TIED_REASON = "tied to the word embeddings"
_LAYER = re.compile(r"(?:^|\.)encoder\.layer\.(\d+)\.")


class MissingKeys(ValueError):
    """Parameters of `head` that no source key gives, by their PyTorch names (`keys`): a caller that can load the
    checkpoint another way (checkpoint.load_head_params) tells this error from the others by its type."""

    def __init__(self, head: str, keys: list[str]):
        more = f" and {len(keys) - 10} more" if len(keys) > 10 else ""
        super().__init__(f"missing keys for {head}: {', '.join(keys[:10])}{more}")
        self.head, self.keys = head, keys


@dataclasses.dataclass
class ConversionReport:
    """What happened to each source key that did not become a parameter, and which parameters were absent."""

    ignored: dict[str, str] = dataclasses.field(default_factory=dict)  # key -> reason
    missing: list[str] = dataclasses.field(default_factory=list)  # torch names left for the caller to initialize
    absent: list[str] = dataclasses.field(default_factory=list)  # optional components the checkpoint lacks
    # Flax path -> array: pre-training components the head does not use (`unused_components`), read and checked.
    unused: dict[tuple[str, ...], np.ndarray] = dataclasses.field(default_factory=dict)


def torch_name(path: tuple[str, ...]) -> str:
    """Flax path -> PyTorch key, e.g. ('bert','pooler','dense','kernel') -> 'bert.pooler.dense.weight'."""
    return ".".join(path[:-1] + (_LEAF_TO_TORCH[path[-1]],))


def expected_keys(config: BertConfig, head: str) -> dict[str, tuple[tuple[str, ...], tuple[int, ...]]]:
    """PyTorch key -> (Flax path, PyTorch shape) for every parameter of `head`."""
    flat = traverse_util.flatten_dict(param_spec(config, head), is_leaf=lambda _, v: isinstance(v, tuple))
    out = {}
    for path, (shape, _) in flat.items():
        out[torch_name(path)] = (path, shape[::-1] if path[-1] == "kernel" else shape)
    return out


def canonical_key(key: str, head: str) -> str:
    """Normalize legacy spellings and the `bert.` prefix to the key transformers uses for `head`."""
    if ".LayerNorm." in key or key.startswith("LayerNorm."):
        key = key.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
    if key == "cls.predictions.decoder.bias":  # transformers ties it to cls.predictions.bias
        key = "cls.predictions.bias"
    if head == "BertModel":
        return key[len("bert.") :] if key.startswith("bert.") else key
    return "bert." + key if key.startswith(_BASE_PREFIXES) else key


def _other_heads_keys(config: BertConfig, head: str) -> set[str]:
    """Keys that are BERT parameters of some head but not of `head` (e.g. the pooler in an MLM load)."""
    keys = set()
    for other in HEADS:
        keys |= {canonical_key(k, head) for k in expected_keys(config, other)}
    return keys - set(expected_keys(config, head))


def check_layer_count(state_dict, config: BertConfig) -> None:
    """Compare the declared depth with the weights before building anything from the config: a config.json
    declaring a million layers must fail at once, not after building a million layers of expected keys."""
    indices = {int(m.group(1)) for key in state_dict if (m := _LAYER.search(key))}
    found = max(indices) + 1 if indices else 0
    if found < config.num_hidden_layers:  # (extra layers are named as unknown keys below)
        raise ValueError(
            f"num_hidden_layers={config.num_hidden_layers} in the config, but the weights hold {found} layer(s)"
        )


def check_tensor(key: str, value: np.ndarray) -> None:
    """A parameter is a finite floating-point array; integer or non-finite weights would give wrong answers
    silently (all-zero embeddings, NaN outputs)."""
    if not (np.issubdtype(value.dtype, np.floating) or value.dtype == ml_dtypes.bfloat16):
        raise ValueError(f"{key}: dtype {value.dtype}, but parameters must be floating point")
    finite = np.isfinite(value.astype(np.float32) if value.dtype == ml_dtypes.bfloat16 else value)
    if not finite.all():
        where = tuple(int(i) for i in np.argwhere(~finite)[0])
        raise ValueError(f"{key}: non-finite value {value[where]} at index {where}")


def check_fits(name: str, x: np.ndarray, dtype) -> None:
    """Refuse a cast of `x` to the floating `dtype` that would overflow to infinity (float16 tops out at
    65504, float32, a float64 checkpoint's narrowing, at 3.4e38): an inf weight gives NaN outputs silently."""
    limit = float(ml_dtypes.finfo(dtype).max)
    if x.size and limit < float(ml_dtypes.finfo(x.dtype).max):
        largest = float(np.max(np.abs(np.asarray(x, np.float64 if x.dtype == np.float64 else np.float32))))
        if largest > limit:
            raise ValueError(
                f"{name}: largest magnitude {largest:.6g} overflows {np.dtype(dtype).name} (max {limit:.6g})"
            )


def cast_checked(name: str, x: np.ndarray, dtype) -> np.ndarray:
    check_fits(name, x, dtype)
    return x.astype(dtype)


def check_cast(params, dtype) -> None:
    """check_fits for every floating leaf of `params`, named by its path."""
    for path, x in traverse_util.flatten_dict(params, sep="/").items():
        if jnp.issubdtype(x.dtype, jnp.floating):
            check_fits(path, x, dtype)


def one_float_dtype(params: dict) -> dict:
    """A model holds one float dtype, as transformers builds it. A checkpoint mixing them (one float16 tensor
    among float32) is widened, exactly, to the widest it holds (float32 for float16 with bfloat16), so a
    converted directory's config names one dtype."""
    dtypes = {x.dtype for x in traverse_util.flatten_dict(params).values()}
    if len(dtypes) < 2:
        return params
    widest = np.float64 if np.dtype(np.float64) in dtypes else np.float32

    def widen(tree: dict) -> dict:  # in place, so each narrower leaf is freed as its copy is made
        for key, value in tree.items():
            tree[key] = widen(value) if isinstance(value, dict) else value.astype(widest, copy=False)
        return tree

    return widen(params)


def _route(state_dict, config: BertConfig, head: str, report: ConversionReport) -> dict[str, tuple[str, tuple]]:
    """Source key -> (parameter name, Flax path) for every key that becomes a parameter, from names and shapes
    alone (`np.shape` of a lazily read tensor reads nothing): a checkpoint declaring an unknown or misshapen
    tensor fails before its data is read. Ignored keys go to `report`."""
    expected = expected_keys(config, head)
    routes, sources, others = {}, {}, None
    for key in sorted(state_dict):
        name = canonical_key(key, head)
        if name.endswith(_BUFFERS):
            report.ignored[key] = "buffer, not a parameter"
            continue
        if name == _TIED_DECODER and config.tie_word_embeddings:
            report.ignored[key] = _TIED_REASON
            continue
        if name not in expected:
            others = _other_heads_keys(config, head) if others is None else others
            if name in others:
                report.ignored[key] = f"not used by {head}"
                continue
            raise ValueError(f"unknown key {key!r}: not a parameter of {head} with this config")
        path, shape = expected[name]
        have = tuple(np.shape(state_dict[key]))
        if have != tuple(shape):
            raise ValueError(f"{key}: shape {have} in the checkpoint, expected {tuple(shape)} from the config")
        if name in sources and name != "cls.predictions.bias":  # that one may be stored twice; compared on reading
            raise ValueError(f"duplicate key {key!r}: maps to {name!r} like {sources[name]!r}")
        sources.setdefault(name, key)
        routes[key] = (name, path)
    return routes


def torch_to_flax(
    state_dict: dict[str, np.ndarray], config: BertConfig, head: str | None = None, *, allow_missing_head: bool = False
) -> tuple[dict, ConversionReport]:
    """Map a transformers BERT state dict onto the Flax tree for `head`.

    Raises ValueError naming the key for unknown keys, duplicates, shape mismatches and missing parameters.
    With `allow_missing_head`, parameters of the task head (not of the base model) may be absent; they are
    listed in `report.missing` for the caller to initialize. Values may be anything `np.asarray` reads (the
    lazily read tensors of checkpoint.py): each is read once, after every name and shape has been checked.
    """
    head = resolve_head(head, config)
    check_layer_count(state_dict, config)
    expected = expected_keys(config, head)
    report = ConversionReport()
    routes = _route(state_dict, config, head, report)
    routed = {name for name, _ in routes.values()}
    missing = sorted(name for name in expected if name not in routed)
    if head == "BertModel" and {n for n in expected if n.startswith("pooler.")} <= set(missing):
        # A base model read from a pooler-less (e.g. MLM) checkpoint: no pooler, pooler_output is None.
        report.absent.append("pooler")
        missing = [n for n in missing if not n.startswith("pooler.")]
    base_missing = [n for n in missing if head == "BertModel" or n.startswith("bert.")]
    if missing and (not allow_missing_head or base_missing):
        raise MissingKeys(head, missing)
    if not TABLE[head].pooler and not any(canonical_key(k, head).startswith("bert.pooler.") for k in state_dict):
        report.absent.append("pooler")  # as in transformers, this head is built without one
    report.missing = missing
    found, sources = {}, {}
    for key, (name, path) in routes.items():  # one tensor read at a time
        value = np.asarray(state_dict[key])
        check_tensor(key, value)
        if name in sources:  # cls.predictions.bias, stored again as the tied decoder's bias
            if not np.array_equal(found[path], value):
                key = _untied_decoder_bias(config, key, sources[name], found, path, value, report)
                sources[name] = key
                continue
            report.ignored[key] = f"duplicate of {sources[name]}"
            continue
        sources[name] = key
        found[path] = value.T if path[-1] == "kernel" else value
    _check_tied_decoder(state_dict, found, sources, report)
    report.unused = _unused_components(state_dict, config, head, report)
    return traverse_util.unflatten_dict(found), report


def _unused_components(state_dict, config: BertConfig, head: str, report: ConversionReport) -> dict:
    """Flax path -> array for each pre-training component (`_COMPONENTS`) that `head` does not use and the
    checkpoint holds whole, with the config's shapes and finite values; anything less stays merely ignored."""
    if head == "BertModel":  # its tree has no `bert` level for them to sit in
        return {}
    unused = f"not used by {head}"
    sources = {canonical_key(k, head): k for k, why in sorted(report.ignored.items(), reverse=True) if why == unused}
    own, pre, found = expected_keys(config, head), expected_keys(config, "BertForPreTraining"), {}
    for prefix in _COMPONENTS:
        part = {n: v for n, v in pre.items() if v[0][:2] == prefix}
        if not part or set(part) & set(own) or not set(part) <= set(sources):
            continue
        if any(tuple(np.shape(state_dict[sources[n]])) != tuple(shape) for n, (_, shape) in part.items()):
            continue
        values = {path: np.asarray(state_dict[sources[n]]) for n, (path, _) in part.items()}
        try:
            for n, (path, _) in part.items():
                check_tensor(sources[n], values[path])
        except ValueError:
            continue
        found.update({path: v.T if path[-1] == "kernel" else v for path, v in values.items()})
    return found


def _untied_decoder_bias(config: BertConfig, key: str, first: str, found: dict, path, value, report) -> str:
    """Two different MLM biases (cls.predictions.bias and the decoder's): only transformers 5 writes them, from an
    untied head (tie_word_embeddings false), where it applies the decoder's and leaves the other at its zeros.
    Read that way (returns the key used); tied, 4.x and 5 would read different ones: refused."""
    decoder = next((k for k in (key, first) if k.endswith("predictions.decoder.bias")), None)
    if config.tie_word_embeddings or decoder is None:
        raise ValueError(
            f"{key} and {first} differ, and with tie_word_embeddings=true transformers 4.x and 5 would apply "
            "different ones: keep one of them"
        )
    other = first if decoder == key else key
    if decoder == key:
        found[path] = value
    report.ignored[other] = f"the untied decoder's {decoder} applies (as transformers 5)"
    return decoder


def _check_tied_decoder(state_dict, found: dict, sources: dict, report: ConversionReport) -> None:
    """A tied decoder weight stored beside the word embeddings must equal them: with another value, transformers 5
    keeps it untied and applies it, 4.x ties it to the embeddings, so either reading gives logits of one only."""
    embeddings = found.get(("bert", "embeddings", "word_embeddings", "embedding"))
    if embeddings is None or ("cls", "predictions", "bias") not in found:  # a head without the decoder
        return
    for key in [k for k, why in report.ignored.items() if why == _TIED_REASON]:
        if np.shape(state_dict[key]) != embeddings.shape or not np.array_equal(np.asarray(state_dict[key]), embeddings):
            raise ValueError(
                f"{key}: differs from {sources['bert.embeddings.word_embeddings.weight']} although the config ties "
                "them (tie_word_embeddings=true; transformers 5 would apply it untied, 4.x the word embeddings): "
                "set tie_word_embeddings to false to use it, or leave it out"
            )


def flax_to_torch(
    params: dict, config: BertConfig, head: str | None = None, *, include_tied: bool = True
) -> dict[str, np.ndarray]:
    """The inverse: the Flax tree -> transformers' state dict keys (kernels transposed back, contiguous).

    Pre-training components kept beside the head (the pooler of an MLM tree) are written too.
    With `include_tied`, the tied decoder weight and bias are written as well, as `model.state_dict()` has them.
    An untied decoder's bias is always written: transformers 5 ties it to cls.predictions.bias only along with
    the weight, and would otherwise initialize it afresh (zeros).
    """
    head = resolve_head(head, config)
    expected = expected_keys(config, head)
    flat = traverse_util.flatten_dict(params)
    if head == "BertModel" and "pooler" not in params:  # read from a pooler-less checkpoint
        expected = {k: v for k, v in expected.items() if not k.startswith("pooler.")}
    if head != "BertModel":  # pre-training components kept beside the head (`_unused_components`)
        pre = expected_keys(config, "BertForPreTraining").items()
        expected |= {n: v for n, v in pre if v[0][:2] in _COMPONENTS and n not in expected and v[0] in flat}
    unknown = sorted(set(flat) - {path for path, _ in expected.values()})
    if unknown:
        raise ValueError(f"unknown parameter {'/'.join(unknown[0])!r} for {head}")
    out = {}
    for name, (path, shape) in expected.items():
        if path not in flat:
            raise ValueError(f"missing parameter {'/'.join(path)!r} for {head}")
        value = np.asarray(flat[path])
        value = np.ascontiguousarray(value.T) if path[-1] == "kernel" else value
        if value.shape != tuple(shape):
            raise ValueError(f"{'/'.join(path)}: shape {value.shape}, expected {tuple(shape)} from the config")
        out[name] = value
    if "cls.predictions.bias" in out and (include_tied or not config.tie_word_embeddings):
        out["cls.predictions.decoder.bias"] = out["cls.predictions.bias"]
    if include_tied and "cls.predictions.bias" in out and config.tie_word_embeddings:
        out[_TIED_DECODER] = out["bert.embeddings.word_embeddings.weight"]
    return out


def flax_to_torch_any(params: dict) -> dict[str, np.ndarray]:
    """Rename any Flax BERT tree (e.g. a transformers 4.x `flax_model.msgpack`) to PyTorch keys, unchecked;
    `torch_to_flax` then checks it against the config like any other checkpoint."""
    out, origin = {}, {}
    for path, value in traverse_util.flatten_dict(params).items():
        if not all(isinstance(p, str) for p in path) or path[-1] not in _LEAF_TO_TORCH:
            raise ValueError(f"unknown parameter {'/'.join(map(str, path))!r} in Flax tree")
        if not isinstance(value, np.ndarray):
            raise ValueError(f"{'/'.join(path)}: a {type(value).__name__}, not an array")
        name = torch_name(path)  # kernel, embedding and scale all become `weight`: two leaves must not meet there
        if name in origin:
            raise ValueError(f"duplicate parameter {'/'.join(path)!r}: maps to {name!r} like {origin[name]!r}")
        out[name], origin[name] = (value.T if path[-1] == "kernel" else value), "/".join(path)
    return out
