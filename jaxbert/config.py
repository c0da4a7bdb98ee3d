"""BertConfig: transformers' BERT configuration as a frozen, hashable dataclass (static under jit).

Field names are transformers' own, so `config.json` files round-trip: keys this class does not model are kept
in `extra` and written back unchanged by `to_dict`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any

from jaxbert.files import existing_file, read_json
from jaxbert.ops import ACTIVATIONS

POSITION_EMBEDDING_TYPES = ("absolute", "relative_key", "relative_key_query")
PROBLEM_TYPES = (None, "regression", "single_label_classification", "multi_label_classification")
_SIZES = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
    "type_vocab_size",
)
_MAX_SIZE = 2**31 - 1  # JAX indexes with int32
_FIELD_KINDS = {
    **{f: int for f in _SIZES},
    "pad_token_id": int,
    "hidden_act": str,
    "position_embedding_type": str,
    "problem_type": str,
    "model_type": str,
    "tie_word_embeddings": bool,
    "is_decoder": bool,
    "add_cross_attention": bool,
    "hidden_dropout_prob": float,
    "attention_probs_dropout_prob": float,
    "classifier_dropout": float,
    "initializer_range": float,
    "layer_norm_eps": float,
}
_OPTIONAL = ("problem_type", "classifier_dropout", "pad_token_id")
_KIND_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


def _is_kind(value, kind) -> bool:
    """JSON's types: booleans are not numbers; an integer is a valid float."""
    if kind is bool or isinstance(value, bool):
        return kind is bool and isinstance(value, bool)
    return isinstance(value, (int, float)) if kind is float else isinstance(value, kind)


def _is_index(key) -> bool:
    """An integer, or JSON's string spelling of one (object keys are always strings)."""
    return _is_kind(key, int) or (isinstance(key, str) and key.isdigit() and key.isascii())


def is_class_list(value) -> bool:
    """config.json's `architectures`: a list of class names (a string would be taken apart into characters)."""
    return isinstance(value, (list, tuple)) and all(isinstance(a, str) for a in value)


def padding_id(config) -> int:
    """The id jaxbert's own batches pad with (unattended, and no label): the config's pad_token_id, else (null:
    transformers' BertEmbeddings then has no padding_idx) 0, BERT's [PAD], which its tokenizers pad with."""
    return 0 if config.pad_token_id is None else config.pad_token_id


@dataclasses.dataclass(frozen=True)
class BertConfig:
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int | None = 0  # null: no padding_idx (transformers 5 accepts it); see padding_id
    position_embedding_type: str = "absolute"
    classifier_dropout: float | None = None
    id2label: dict[int, str] | None = None
    label2id: dict[str, int] | None = None
    problem_type: str | None = None
    architectures: tuple[str, ...] | None = None
    pruned_heads: dict[int, tuple[int, ...]] | None = None
    tie_word_embeddings: bool = True
    is_decoder: bool = False  # causal self-attention (BertLMHeadModel, the decoder of a bert2bert)
    add_cross_attention: bool = False  # a cross-attention sublayer over encoder_hidden_states
    model_type: str = "bert"
    extra: dict[str, Any] | None = None

    def __post_init__(self):
        self._check_types()
        if self.id2label is None:
            object.__setattr__(self, "id2label", {0: "LABEL_0", 1: "LABEL_1"})
        id2label = {int(k): v for k, v in self.id2label.items()}
        object.__setattr__(self, "id2label", id2label)
        if self.label2id is None:
            object.__setattr__(self, "label2id", {v: k for k, v in id2label.items()})
        else:
            object.__setattr__(self, "label2id", dict(self.label2id))
        if self.architectures is not None:
            object.__setattr__(self, "architectures", tuple(self.architectures))
        # A head listed twice is pruned once, as transformers' prune_heads takes a set (a count would be off).
        pruned = {int(k): tuple(sorted(set(v))) for k, v in (self.pruned_heads or {}).items()}
        object.__setattr__(self, "pruned_heads", {k: v for k, v in sorted(pruned.items()) if v})
        object.__setattr__(self, "extra", dict(self.extra or {}))
        self._validate()

    def _bad(self, field, why):
        raise ValueError(f"BertConfig.{field}={getattr(self, field, None)!r}: {why}")

    def _check_types(self):
        """JSON types first, so the conversions above cannot fail with a confusing error."""
        for field, kind in _FIELD_KINDS.items():
            value = getattr(self, field)
            if not (value is None and field in _OPTIONAL) and not _is_kind(value, kind):
                self._bad(field, f"must be {_KIND_NAMES[kind]}")
        if self.id2label is not None and not (
            isinstance(self.id2label, dict)
            and all(_is_index(k) for k in self.id2label)
            and all(isinstance(v, str) for v in self.id2label.values())
        ):
            self._bad("id2label", "must be an object of label index -> label name")
        if self.label2id is not None and not (
            isinstance(self.label2id, dict) and all(_is_kind(v, int) for v in self.label2id.values())
        ):
            self._bad("label2id", "must be an object of label name -> label index")
        if self.architectures is not None and not is_class_list(self.architectures):
            self._bad("architectures", "must be a list of class names")
        if self.pruned_heads is not None and not (
            isinstance(self.pruned_heads, dict)
            and all(_is_index(k) for k in self.pruned_heads)
            and all(
                isinstance(v, (list, tuple)) and all(_is_kind(h, int) for h in v) for v in self.pruned_heads.values()
            )
        ):
            self._bad("pruned_heads", "must be an object of layer index -> list of head indices")
        if self.extra is not None and not isinstance(self.extra, dict):
            self._bad("extra", "must be a dict")

    def _validate(self):
        bad = self._bad
        if self.model_type != "bert":
            bad("model_type", "only 'bert' is supported yet")
        for field in _SIZES:
            if not 0 < getattr(self, field) <= _MAX_SIZE:
                bad(field, f"must be a positive integer at most {_MAX_SIZE}")
        if self.hidden_size % self.num_attention_heads:
            bad("hidden_size", f"not divisible by num_attention_heads={self.num_attention_heads}")
        if self.hidden_act not in ACTIVATIONS:
            bad("hidden_act", f"unknown activation; known: {', '.join(sorted(ACTIVATIONS))}")
        if self.position_embedding_type not in POSITION_EMBEDDING_TYPES:
            bad("position_embedding_type", f"must be one of {POSITION_EMBEDDING_TYPES}")
        if self.problem_type not in PROBLEM_TYPES:
            bad("problem_type", f"must be one of {PROBLEM_TYPES}")
        for field in ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"):
            value = getattr(self, field)
            if value is not None and not 0.0 <= value < 1.0:  # NaN fails every comparison
                bad(field, "must be a probability in [0, 1)")
        if not 0 < self.layer_norm_eps < math.inf:
            bad("layer_norm_eps", "must be positive and finite")
        if not 0 <= self.initializer_range < math.inf:
            bad("initializer_range", "must be non-negative and finite")
        if self.pad_token_id is not None and not 0 <= self.pad_token_id < self.vocab_size:
            bad("pad_token_id", f"must be in [0, vocab_size={self.vocab_size})")
        if sorted(self.id2label) != list(range(len(self.id2label))):
            bad("id2label", "label indices must be 0, 1, ..., num_labels - 1")
        for layer, heads in self.pruned_heads.items():
            if not 0 <= layer < self.num_hidden_layers or any(not 0 <= h < self.num_attention_heads for h in heads):
                bad("pruned_heads", f"layer {layer} heads {list(heads)} out of range")
        if self.add_cross_attention and not self.is_decoder:
            bad("add_cross_attention", "cross-attention needs a decoder (is_decoder=true), as in transformers")

    # -- derived quantities -------------------------------------------------------------------------------
    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def num_labels(self) -> int:
        return len(self.id2label)

    def label_names(self, why: str) -> list[str]:
        """id2label's names in id order, each naming one id: `why` says what reads labels by name (transformers
        accepts one name for several ids; a dict by name would then keep one of their scores)."""
        names = [self.id2label[i] for i in range(self.num_labels)]
        for i, name in enumerate(names):
            if names.index(name) != i:
                raise ValueError(f"config.json id2label names {name!r} for ids {names.index(name)} and {i}: {why}")
        return names

    def kept_heads(self, layer: int) -> tuple[int, ...]:
        """Original indices of the heads that remain in `layer` after pruning."""
        pruned = set(self.pruned_heads.get(layer, ()))
        return tuple(h for h in range(self.num_attention_heads) if h not in pruned)

    def replace(self, **changes) -> BertConfig:
        return dataclasses.replace(self, **changes)

    def __hash__(self):
        # jit hashes its static config on every call: compute once (fields never change after construction).
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = hash(json.dumps(self.to_dict(), sort_keys=True))
            object.__setattr__(self, "_hash", cached)
        return cached

    # -- (de)serialization ---------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BertConfig:
        data = dict(data)
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        kwargs = {k: data.pop(k) for k in list(data) if k in names}
        num_labels = data.pop("num_labels", None)
        if num_labels is not None and kwargs.get("id2label") is None:
            if not _is_kind(num_labels, int) or not 0 < num_labels <= 2**20:
                raise ValueError(f"BertConfig.num_labels={num_labels!r}: must be a positive integer")
            kwargs["id2label"] = {i: f"LABEL_{i}" for i in range(num_labels)}
        return cls(**kwargs, extra=data)

    @classmethod
    def from_json_file(cls, path: str | os.PathLike) -> BertConfig:
        try:
            return cls.from_dict(read_json(os.fspath(path)))
        except (TypeError, ValueError) as e:
            message = str(e)
            raise ValueError(message if message.startswith(os.fspath(path)) else f"{path}: {message}") from None

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike) -> BertConfig:
        from jaxbert.sentence_dir import transformer_dir

        directory = transformer_dir(directory)  # a sentence-transformers 0_Transformer/ subfolder's, if so
        path = existing_file(directory, "config.json")
        if path is None:
            raise FileNotFoundError(f"{os.path.join(directory, 'config.json')}: config.json not found")
        return cls.from_json_file(path)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        out["id2label"] = {str(k): v for k, v in self.id2label.items()}
        out["label2id"] = dict(self.label2id)
        out["architectures"] = list(self.architectures) if self.architectures is not None else None
        # transformers 4.x writes pruned_heads with string keys; an empty dict is its default.
        out["pruned_heads"] = {str(k): list(v) for k, v in self.pruned_heads.items()}
        out.update(self.extra)
        return out

    def to_json_string(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"
