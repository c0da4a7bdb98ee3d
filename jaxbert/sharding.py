"""The one place meshes and partition specs come from, for training and inference alike.

The mesh always has the axes (data, fsdp, tensor); `--mesh data=2,fsdp=2,tensor=1` sizes them. Parameters are
split by their logical axes (jaxbert.axes) through RULES, as MaxText / levanter do: the rules never change, the
mesh shape decides the layout, since a mesh axis of size 1 splits nothing:

- data parallel (data=N): every parameter and optimizer moment replicated, the batch split N ways;
- FSDP (fsdp=N): `embed` split N ways, the batch too (each device holds 1/N of the weights, gathered per use);
- tensor parallel (tensor=N): `heads` / `qkv`, `mlp`, `hidden` and `vocab` split N ways, the batch not.

A dimension its mesh axes do not divide stays whole (e.g. BERT's 30522 word pieces on tensor=4), and a mesh axis
is used once per leaf. Optimizer state follows its parameter.
"""

from __future__ import annotations

import jax
import numpy as np
from flax import traverse_util
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxbert.axes import leaf_axes

AXES = ("data", "fsdp", "tensor")
BATCH = ("data", "fsdp")  # mesh axes the batch is split over (tensor-parallel devices see the same rows)
RULES = {
    "batch": BATCH,
    "embed": ("fsdp",),
    "vocab": ("tensor",),
    "heads": ("tensor",),
    "qkv": ("tensor",),
    "mlp": ("tensor",),
    "hidden": ("tensor",),
}


def _batch_is_split() -> bool:
    """Whether the mesh being traced for (`under`) splits the batch (no mesh: no)."""
    mesh = jax.sharding.get_abstract_mesh()
    return not mesh.empty and any(mesh.shape[a] > 1 for a in BATCH if a in mesh.axis_names)


def whole_vectors(table: jax.Array) -> jax.Array:
    """An embedding table [V, D] about to be indexed, its vectors gathered whole (FSDP splits D; tensor
    parallelism may keep V split): the rows taken come out split by the batch, and their gradient goes back as one
    reduce-scatter, where a D-split lookup makes XLA replicate the batch's gradient in the backward pass."""
    if not _batch_is_split():
        return table
    return jax.lax.with_sharding_constraint(table, P(P.UNCONSTRAINED, None))


def under(mesh: Mesh, fn):
    """`fn` traced (and run) with `mesh` as the context mesh, so that whole_vectors applies inside it."""

    def call(*args):
        with jax.set_mesh(mesh):
            return fn(*args)

    return call


def parse_mesh(text: str) -> dict[str, int]:
    """`data=2,fsdp=-1` -> {"data": 2, "fsdp": -1}: syntax only (the device count is checked by mesh_shape)."""
    out: dict[str, int] = {}
    for part in text.split(","):
        name, eq, size = part.strip().partition("=")
        if not eq or name not in AXES:
            raise ValueError(f"--mesh {text!r}: {part.strip()!r} is not AXIS=SIZE with AXIS one of {', '.join(AXES)}")
        if name in out:
            raise ValueError(f"--mesh {text!r}: axis {name} given twice")
        try:
            out[name] = int(size)
        except ValueError:
            raise ValueError(f"--mesh {text!r}: size of {name} must be an integer, not {size!r}") from None
        if out[name] == 0 or out[name] < -1:
            raise ValueError(f"--mesh {text!r}: size of {name} must be >= 1, or -1 for the rest of the devices")
    if list(out.values()).count(-1) > 1:
        raise ValueError(f"--mesh {text!r}: at most one axis can be -1")
    return out


def mesh_shape(text: str | None, devices: int, heads: int | None = None, fsdp: bool = False) -> dict[str, int]:
    """Axis sizes for `devices` devices: axes not named are 1, except `data`, which takes the rest (so the
    default is all devices on data); `fsdp=True` (the --fsdp flag) is `data=1,fsdp=-1`."""
    if fsdp and text:
        raise ValueError("pass --mesh or --fsdp, not both (--fsdp is --mesh data=1,fsdp=-1)")
    given = parse_mesh(text) if text else {"data": 1, "fsdp": -1} if fsdp else {}
    sizes = {"data": -1 if -1 not in given.values() else 1, "fsdp": 1, "tensor": 1, **given}
    known = int(np.prod([s for s in sizes.values() if s != -1]))
    where = f"--mesh {text!r}" if text else "--fsdp" if fsdp else "the mesh"
    if -1 in sizes.values():
        if devices % known:
            raise ValueError(f"{where}: {known} does not divide the {devices} devices")
        sizes = {k: devices // known if s == -1 else s for k, s in sizes.items()}
    if int(np.prod(list(sizes.values()))) != devices:
        shape = ",".join(f"{k}={v}" for k, v in sizes.items())
        raise ValueError(
            f"{where}: {shape} is {int(np.prod(list(sizes.values())))} devices, not the {devices} there are"
        )
    if heads is not None and heads % sizes["tensor"]:
        raise ValueError(f"{where}: tensor={sizes['tensor']} does not divide the model's {heads} attention heads")
    return sizes


def make_mesh(shape: dict[str, int] | None = None, devices=None) -> Mesh:
    """A (data, fsdp, tensor) mesh; default all devices on data. Devices are in jax.devices() order (process by
    process), tensor innermost, so tensor-parallel groups stay inside a host when they fit."""
    devices = list(devices if devices is not None else jax.devices())
    shape = shape or {"data": len(devices)}
    sizes = [shape.get(a, 1) for a in AXES]
    return Mesh(np.array(devices).reshape(sizes), AXES)


def check_mesh(mesh: Mesh, heads: int) -> Mesh:
    """A user's mesh for inference: it must have this module's axes, and `tensor` must divide the heads."""
    if tuple(mesh.axis_names) != AXES:
        raise ValueError(f"mesh axes {tuple(mesh.axis_names)}: expected {AXES} (see jaxbert.sharding.make_mesh)")
    if heads % mesh.shape["tensor"]:
        raise ValueError(f"mesh tensor={mesh.shape['tensor']} does not divide the model's {heads} attention heads")
    return mesh


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def batch_sharding(mesh: Mesh, batch_axis: int = 0) -> NamedSharding:
    return NamedSharding(mesh, P(*([None] * batch_axis), BATCH))


def batch_shards(mesh: Mesh) -> int:
    """How many ways a batch is split (the global batch must divide by it)."""
    return int(np.prod([mesh.shape[a] for a in BATCH]))


def spec(axes: tuple[str, ...], shape: tuple[int, ...], mesh: Mesh) -> P:
    """The PartitionSpec of a leaf with logical `axes` and `shape` on `mesh`, by RULES (see the docstring)."""
    used: set[str] = set()
    out = []
    for name, size in zip(axes, shape, strict=True):
        mesh_axes = tuple(a for a in RULES.get(name, ()) if mesh.shape[a] > 1 and a not in used)
        if mesh_axes and size % int(np.prod([mesh.shape[a] for a in mesh_axes])) == 0:
            used.update(mesh_axes)
            out.append(mesh_axes[0] if len(mesh_axes) == 1 else mesh_axes)
        else:
            out.append(None)
    while out and out[-1] is None:
        out.pop()
    return P(*out)


def param_specs(params, mesh: Mesh) -> dict:
    """Tree of PartitionSpecs for a parameter tree (stored or compute layout)."""
    flat = traverse_util.flatten_dict(params)
    return traverse_util.unflatten_dict(
        {path: spec(leaf_axes(path, np.ndim(x)), np.shape(x), mesh) for path, x in flat.items()}
    )


def param_shardings(params, mesh: Mesh) -> dict:
    return jax.tree_util.tree_map(lambda s: NamedSharding(mesh, s), param_specs(params, mesh))


def _names(path) -> tuple[str, ...]:
    return tuple(str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey))


def state_shardings(state, mesh: Mesh):
    """Shardings of a TrainState: parameters by the rules; each optimizer leaf (Adam's moments) like the
    parameter at the same dict path and shape; scalars (step, counts) replicated."""
    by_path = {
        _names(path): (np.shape(x), s)
        for path, x, s in zip(
            *zip(*jax.tree_util.tree_flatten_with_path(state.params)[0]),
            jax.tree_util.tree_leaves(param_specs(state.params, mesh)),
            strict=True,
        )
    }

    def follow(path, x):
        names = _names(path)
        for start in range(len(names)):
            hit = by_path.get(names[start:])
            if hit is not None and hit[0] == np.shape(x):
                return NamedSharding(mesh, hit[1])
        return NamedSharding(mesh, P())

    return jax.tree_util.tree_map_with_path(follow, state)


def process_rows(sharding: NamedSharding, shape: tuple[int, ...], axis: int) -> slice:
    """The rows along `axis` of a global array of `shape` that this process's devices hold: its share of the
    batch (contiguous, since the mesh lists devices process by process)."""
    index = sharding.addressable_devices_indices_map(shape).values()
    starts = [i[axis].start or 0 for i in index]
    stops = [shape[axis] if i[axis].stop is None else i[axis].stop for i in index]
    lo, hi = min(starts), max(stops)
    if sum(b - a for a, b in set(zip(starts, stops, strict=True))) != hi - lo:
        raise ValueError(f"this process's share of the batch is not contiguous: {sorted(set(zip(starts, stops)))}")
    return slice(lo, hi)


def global_batch(local: dict, sharding: NamedSharding, shape_of) -> dict:
    """Global arrays from this process's rows (`shape_of(key)` is each array's global shape)."""
    return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v), shape_of(k)) for k, v in local.items()}


def from_host(batch: dict, sharding: NamedSharding) -> dict:
    """Global arrays from host arrays every process holds whole (e.g. validation batches)."""

    def one(v):
        v = np.asarray(v)
        return jax.make_array_from_callback(v.shape, sharding, lambda i: v[i])

    return {k: one(v) for k, v in batch.items()}
