"""The parameter tree: its shapes per head, transformers' initialization, counts per component, head pruning."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from jaxbert.config import BertConfig
from jaxbert.heads import TABLE, resolve_head
from jaxbert.ops import dense_spec as _dense
from jaxbert.ops import norm_spec as _norm


def _layer_spec(config: BertConfig, i: int):
    D, F, K = config.hidden_size, config.intermediate_size, config.head_size
    HK = (config.num_attention_heads - len(config.pruned_heads.get(i, ()))) * K  # pruned layers keep fewer heads
    self_attn = {name: _dense(D, HK) for name in ("query", "key", "value")}
    if config.position_embedding_type != "absolute":
        self_attn["distance_embedding"] = {"embedding": ((2 * config.max_position_embeddings - 1, K), "normal")}
    spec = {
        "attention": {"self": self_attn, "output": {"dense": _dense(HK, D), "LayerNorm": _norm(D)}},
        "intermediate": {"dense": _dense(D, F)},
        "output": {"dense": _dense(F, D), "LayerNorm": _norm(D)},
    }
    if config.add_cross_attention:  # always absolute positions and every head (never pruned), as in transformers
        HK = config.num_attention_heads * K
        spec["crossattention"] = {
            "self": {name: _dense(D, HK) for name in ("query", "key", "value")},
            "output": {"dense": _dense(HK, D), "LayerNorm": _norm(D)},
        }
    return spec


def base_spec(config: BertConfig, with_pooler: bool = True):
    D = config.hidden_size
    spec = {
        "embeddings": {
            "word_embeddings": {"embedding": ((config.vocab_size, D), "normal")},
            "position_embeddings": {"embedding": ((config.max_position_embeddings, D), "normal")},
            "token_type_embeddings": {"embedding": ((config.type_vocab_size, D), "normal")},
            "LayerNorm": _norm(D),
        },
        "encoder": {"layer": {str(i): _layer_spec(config, i) for i in range(config.num_hidden_layers)}},
    }
    if with_pooler:
        spec["pooler"] = {"dense": _dense(D, D)}
    return spec


def param_spec(config: BertConfig, head: str | None = None) -> dict:
    """Nested dict of (shape, init) leaves: exactly the tree transformers' FlaxBert used for this head."""
    spec = TABLE[resolve_head(head, config)]
    base = base_spec(config, with_pooler=spec.pooler)
    return base if spec.name == "BertModel" else {"bert": base, **spec.spec(config)}


def init_params(config: BertConfig, rng: jax.Array, head: str | None = None, dtype=jnp.float32, *, only=None) -> dict:
    """transformers' initialization: normal(initializer_range) weights, zero biases, unit LayerNorm scales,
    and the padding token's embedding row zeroed. `only` (Flax paths) builds just those leaves, with the values
    the whole tree gives them: a fine-tune's fresh head without a second model's worth of memory."""
    flat = traverse_util.flatten_dict(param_spec(config, head), is_leaf=lambda _, v: isinstance(v, tuple))
    split = jax.random.split(rng, len(flat))
    # One key per leaf, taken apart on the host: iterating the device array compiles a slicing program with an
    # output per key (100 at a time), seconds of XLA for every fresh head; wrapping a host row compiles nothing.
    if isinstance(split, jax.core.Tracer):  # under jit / eval_shape: no host values; slicing is traced, not run
        keys = list(split)
    elif jnp.issubdtype(split.dtype, jax.dtypes.prng_key):
        impl = jax.random.key_impl(split)
        keys = [jax.random.wrap_key_data(row, impl=impl) for row in np.asarray(jax.random.key_data(split))]
    else:  # legacy uint32 keys (jax.random.PRNGKey) are their own data
        keys = list(np.asarray(split))
    out = {}
    for key, (path, (shape, init)) in zip(keys, sorted(flat.items())):
        if only is not None and path not in only:
            continue
        if init == "normal":
            leaf = config.initializer_range * jax.random.normal(key, shape, dtype)
        else:
            leaf = (jnp.ones if init == "ones" else jnp.zeros)(shape, dtype)
        if path[-2:] == ("word_embeddings", "embedding") and config.pad_token_id is not None:
            leaf = leaf.at[config.pad_token_id].set(0)
        out[path] = leaf
    return traverse_util.unflatten_dict(out)


def count_params(params) -> dict[str, int]:
    """Parameter counts per component (embeddings, encoder, pooler, each head present) and the total; for a
    bert2bert, per side ("encoder embeddings", …, "decoder cls", "enc_to_dec_proj")."""
    if "decoder" in params and "bert" in params["decoder"]:
        counts = {
            f"{side} {name}": n
            for side in ("encoder", "decoder")
            for name, n in count_params(params[side]).items()
            if name != "total"
        }
        if "enc_to_dec_proj" in params:
            counts["enc_to_dec_proj"] = _size(params["enc_to_dec_proj"])
        return {**counts, "total": sum(counts.values())}
    base = params.get("bert", params)
    counts = {name: _size(base[name]) for name in ("embeddings", "encoder", "pooler") if name in base}
    counts.update({name: _size(params[name]) for name in ("cls", "classifier", "qa_outputs") if name in params})
    counts["total"] = sum(counts.values())
    return counts


def _size(tree) -> int:
    return sum(int(np.prod(np.shape(x))) for x in jax.tree_util.tree_leaves(tree))


def prune_heads(params, config: BertConfig, heads_to_prune: dict[int, list[int]]):
    """Remove attention heads (original indices, per layer) from Q/K/V and the attention output projection.

    Returns (params, config) with `config.pruned_heads` recording every head pruned so far, as transformers 4.x
    wrote it to config.json. Heads already pruned are skipped, as transformers does.
    """
    base_key = "bert" if "bert" in params else None
    base = params[base_key] if base_key else params
    merged = {k: set(v) for k, v in config.pruned_heads.items()}
    layers = dict(base["encoder"]["layer"])
    for layer, heads in heads_to_prune.items():
        layer = int(layer)
        if not 0 <= layer < config.num_hidden_layers:
            raise ValueError(f"prune_heads: layer {layer} out of range [0, {config.num_hidden_layers})")
        bad = [h for h in heads if not 0 <= h < config.num_attention_heads]
        if bad:
            raise ValueError(f"prune_heads: layer {layer} heads {bad} out of range [0, {config.num_attention_heads})")
        kept = config.kept_heads(layer)
        new_pruned = merged.get(layer, set()) | set(heads)
        keep = [pos for pos, h in enumerate(kept) if h not in new_pruned]
        layers[str(layer)] = _prune_layer(layers[str(layer)], keep, config.head_size)
        merged[layer] = new_pruned
    new_base = {**base, "encoder": {**base["encoder"], "layer": layers}}
    new_params = {**params, base_key: new_base} if base_key else new_base
    return new_params, config.replace(pruned_heads={k: tuple(sorted(v)) for k, v in merged.items()})


def _prune_layer(p, keep: list[int], head_size: int):
    """Keep the given head positions: columns of Q/K/V (and their biases), rows of the output kernel."""
    index = np.asarray([pos * head_size + j for pos in keep for j in range(head_size)], dtype=np.int32)
    attn_self = dict(p["attention"]["self"])
    for name in ("query", "key", "value"):
        attn_self[name] = {"kernel": attn_self[name]["kernel"][:, index], "bias": attn_self[name]["bias"][index]}
    out = p["attention"]["output"]
    out = {**out, "dense": {**out["dense"], "kernel": out["dense"]["kernel"][index, :]}}
    return {**p, "attention": {"self": attn_self, "output": out}}
