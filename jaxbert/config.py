"""BertConfig: transformers' BERT configuration as a frozen, hashable dataclass (static under jit).

Field names are transformers' own, so `config.json` files round-trip: keys this class does not model are kept
in `extra` and written back unchanged by `to_dict`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from jaxbert.ops import ACTIVATIONS

POSITION_EMBEDDING_TYPES = ("absolute", "relative_key", "relative_key_query")
PROBLEM_TYPES = (None, "regression", "single_label_classification", "multi_label_classification")
# Keys transformers writes that carry no meaning for an encoder-only JAX model; kept verbatim in `extra`.
_UNSUPPORTED_TRUE = ("is_decoder", "add_cross_attention")


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
    pad_token_id: int = 0
    position_embedding_type: str = "absolute"
    classifier_dropout: float | None = None
    id2label: dict[int, str] | None = None
    label2id: dict[str, int] | None = None
    problem_type: str | None = None
    architectures: tuple[str, ...] | None = None
    pruned_heads: dict[int, tuple[int, ...]] | None = None
    tie_word_embeddings: bool = True
    model_type: str = "bert"
    extra: dict[str, Any] | None = None

    def __post_init__(self):
        if self.id2label is None:
            object.__setattr__(self, "id2label", {0: "LABEL_0", 1: "LABEL_1"})
        id2label = {int(k): str(v) for k, v in self.id2label.items()}
        object.__setattr__(self, "id2label", id2label)
        if self.label2id is None:
            object.__setattr__(self, "label2id", {v: k for k, v in id2label.items()})
        else:
            object.__setattr__(self, "label2id", {str(k): int(v) for k, v in self.label2id.items()})
        if self.architectures is not None:
            object.__setattr__(self, "architectures", tuple(self.architectures))
        pruned = {int(k): tuple(sorted(int(h) for h in v)) for k, v in (self.pruned_heads or {}).items()}
        object.__setattr__(self, "pruned_heads", {k: v for k, v in sorted(pruned.items()) if v})
        object.__setattr__(self, "extra", dict(self.extra or {}))
        self._validate()

    def _validate(self):
        def bad(field, why):
            raise ValueError(f"BertConfig.{field}={getattr(self, field, None)!r}: {why}")

        if self.model_type != "bert":
            bad("model_type", "only 'bert' is supported yet")
        for field in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                      "intermediate_size", "max_position_embeddings", "type_vocab_size"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                bad(field, "must be a positive integer")
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
            if value is not None and not 0.0 <= value < 1.0:
                bad(field, "must be a probability in [0, 1)")
        if not 0 <= self.pad_token_id < self.vocab_size:
            bad("pad_token_id", f"must be in [0, vocab_size={self.vocab_size})")
        if self.layer_norm_eps <= 0:
            bad("layer_norm_eps", "must be positive")
        for layer, heads in self.pruned_heads.items():
            if not 0 <= layer < self.num_hidden_layers or any(not 0 <= h < self.num_attention_heads for h in heads):
                bad("pruned_heads", f"layer {layer} heads {list(heads)} out of range")
        for key in _UNSUPPORTED_TRUE:
            if self.extra.get(key):
                raise ValueError(f"BertConfig.{key}=True: decoder / cross-attention BERT is not implemented yet")

    # -- derived quantities -------------------------------------------------------------------------------
    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def num_labels(self) -> int:
        return len(self.id2label)

    def kept_heads(self, layer: int) -> tuple[int, ...]:
        """Original indices of the heads that remain in `layer` after pruning."""
        pruned = set(self.pruned_heads.get(layer, ()))
        return tuple(h for h in range(self.num_attention_heads) if h not in pruned)

    def replace(self, **changes) -> "BertConfig":
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
    def from_dict(cls, data: dict[str, Any]) -> "BertConfig":
        data = dict(data)
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        kwargs = {k: data.pop(k) for k in list(data) if k in names}
        num_labels = data.pop("num_labels", None)
        if num_labels is not None and kwargs.get("id2label") is None:
            kwargs["id2label"] = {i: f"LABEL_{i}" for i in range(int(num_labels))}
        return cls(**kwargs, extra=data)

    @classmethod
    def from_json_file(cls, path: str | os.PathLike) -> "BertConfig":
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: invalid JSON ({e})") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a JSON object")
        return cls.from_dict(data)

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike) -> "BertConfig":
        path = os.path.join(directory, "config.json")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path}: config.json not found")
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
