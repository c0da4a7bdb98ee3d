"""The key/value cache of a decoding BERT: fixed-capacity arrays written in place, never grown.

A forward with a cache writes its L new keys and values at `index` and attends over all `capacity` slots, masked
to those filled and (causally) not after the query. The capacity is fixed when the cache is made, so a decoding
loop compiles one program whatever its length; cross-attention keys and values are computed from the encoder's
states once and kept. A forward that would write past the capacity returns NaN (XLA clamps out-of-range writes,
which would otherwise overwrite the last slots silently).

As transformers' `past_key_values`, keys and values are kept per layer, [B, H, C, K] each (C the capacity; H the
layer's heads left after pruning): heads
before slots, as attention's products read them, so a step uses each layer's cache as it is. Separate arrays,
not one stacked over layers: XLA:CPU copies a layer's slice of a stacked array before a matmul reads it (bert-base,
batch 8: 9 ms of a 60 ms step), and writes each array in place.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from jaxbert.config import BertConfig


@flax.struct.dataclass
class KVCache:
    key: tuple[Float[Array, "B H C K"], ...]  # one per layer
    value: tuple[Float[Array, "B H C K"], ...]
    mask: Bool[Array, "B C"]  # which slots hold a real (not padding) key
    index: Int[Array, " B"]  # slots filled so far: the same for every row (new keys are written at index[0])
    cross_key: tuple[Float[Array, "B H S K"], ...] | None = None
    cross_value: tuple[Float[Array, "B H S K"], ...] | None = None
    cross_mask: Bool[Array, "B S"] | None = None

    @property
    def capacity(self) -> int:
        return self.key[0].shape[2]

    @property
    def has_cross(self) -> bool:
        return self.cross_key is not None

    def reorder(self, rows: Int[Array, " R"]) -> KVCache:
        """The cache of rows `rows` (beam search keeps its best beams by gathering, not by recomputing)."""
        return jax.tree_util.tree_map(lambda a: jnp.take(a, rows, axis=0), self)


def init_cache(config: BertConfig, batch_size: int, capacity: int, dtype=jnp.float32) -> KVCache:
    """An empty cache for `capacity` positions (at most max_position_embeddings), as FlaxBert's `init_cache`."""
    if not 0 < capacity <= config.max_position_embeddings:
        raise ValueError(
            f"cache capacity {capacity}: must be in [1, max_position_embeddings={config.max_position_embeddings}]"
        )
    # Pruned layers keep fewer heads, each its own (transformers caches a pruned model's layers as they are).
    shapes = [
        (batch_size, len(config.kept_heads(i)), capacity, config.head_size) for i in range(config.num_hidden_layers)
    ]
    key, value = (tuple(jnp.zeros(shape, dtype) for shape in shapes) for _ in range(2))
    return KVCache(key, value, jnp.zeros((batch_size, capacity), bool), jnp.zeros((batch_size,), jnp.int32))
