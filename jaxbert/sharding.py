"""Device mesh and partition rules: batches split on a `data` axis; parameters and optimizer state either
replicated (data parallel) or, with FSDP, each split along its largest dimension that divides evenly."""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P


def make_mesh() -> Mesh:
    return Mesh(np.array(jax.devices()), ("data",))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def batch_sharding(mesh: Mesh, batch_axis: int = 0) -> NamedSharding:
    return NamedSharding(mesh, P(*([None] * batch_axis), "data"))


def fsdp_spec(shape: tuple[int, ...], n: int) -> P:
    """Shard the largest dimension divisible by the device count; small or indivisible leaves stay whole."""
    if n == 1 or not shape or int(np.prod(shape)) < 1024:
        return P()
    for dim in sorted(range(len(shape)), key=lambda d: -shape[d]):
        if shape[dim] % n == 0:
            return P(*([None] * dim), "data")
    return P()


def state_shardings(tree, mesh: Mesh, fsdp: bool):
    n = len(mesh.devices.flat)
    return jax.tree_util.tree_map(lambda x: NamedSharding(mesh, fsdp_spec(np.shape(x), n) if fsdp else P()), tree)
