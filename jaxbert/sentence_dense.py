"""sentence-transformers' Dense and Dropout modules: the projections some models (LaBSE: Pooling cls, Dense
768 -> 768 tanh, Normalize) put after the pooling, read from their module directories as sentence-transformers
reads them, and applied to the pooled embedding as its Dense.forward does.

A Dense module is `activation(x @ W.T + b)` (+ x, or + x @ R.T when in != out, with use_residual). Its
config.json names the activation by its torch class path; the weights are `linear.weight` [out, in],
`linear.bias` [out] and `residual.weight` [out, in] in model.safetensors (or the older pytorch_model.bin) beside
it. In jaxbert's tree a Dense is {"kernel": [in, out], "bias": [out], "residual": {"kernel": [in, out]}} (the
transposes of PyTorch's, as every kernel), float32 whatever the model's dtype. Dropout is the identity outside
training.
"""

from __future__ import annotations

import dataclasses
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from jaxbert.files import existing_file, read_json
from jaxbert.ops import dense, dropout

FEATURE = "sentence_embedding"  # the only feature a Dense reads and writes here (module_input/output_name)


def _gelu(x):
    return x * 0.5 * (1.0 + jax.lax.erf(x / math.sqrt(2.0)))  # nn.GELU() is the exact erf form


# torch class -> (its module under torch.nn.modules, the function). nn.Tanh etc. take no arguments as
# sentence-transformers builds them (activation_class()), so their defaults are the definitions.
ACTIVATIONS = {
    "Tanh": ("activation", jnp.tanh),
    "Identity": ("linear", lambda x: x),
    "ReLU": ("activation", jax.nn.relu),
    "GELU": ("activation", _gelu),
    "Sigmoid": ("activation", jax.nn.sigmoid),
    "SiLU": ("activation", jax.nn.silu),
}
_DENSE_KEYS = {"in_features", "out_features", "bias", "activation_function", "module_input_name",
               "module_output_name", "use_residual"}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class DenseSpec:
    path: str  # the module's directory, relative to the model directory
    in_features: int
    out_features: int
    bias: bool = True
    activation: str = "Tanh"  # a key of ACTIVATIONS
    residual: bool = False


@dataclasses.dataclass(frozen=True)
class DropoutSpec:
    path: str
    rate: float
    after_normalize: bool = False  # the identity outside training all the same


Step = DenseSpec | DropoutSpec


def _activation(path: str, ref) -> str | tuple[None, str]:
    """ACTIVATIONS' key for a class path (torch.nn.X or torch.nn.modules.<module>.X), else why not."""
    if not isinstance(ref, str):
        return None, f"{path}: activation_function {ref!r} is not a class path"
    name = ref.rsplit(".", 1)[-1]
    if name in ACTIVATIONS and ref in (f"torch.nn.{name}", f"torch.nn.modules.{ACTIVATIONS[name][0]}.{name}"):
        return name
    return None, f"{path}: activation_function {ref} is not run by jaxbert (it runs {', '.join(ACTIVATIONS)})"


def _positive(path: str, config: dict, key: str) -> int:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{path}: {key} {value!r} is not a positive integer")
    return value


def read_dense(directory: str, sub: str) -> tuple[DenseSpec | None, str | None]:
    """(spec, None) of the Dense module at `sub`, or (None, why jaxbert cannot run it). Keys sentence-transformers
    does not take it drops (with a warning), and so does this."""
    name = os.path.join(sub, "config.json")
    path = existing_file(directory, name)
    if path is None:  # sentence-transformers: Dense() missing in_features
        return None, f"{os.path.join(directory, name)}: not found (a Dense module needs it)"
    config = read_json(path)
    given = {k: v for k, v in config.items() if k in _DENSE_KEYS}
    names = {"module_input_name": given.get("module_input_name", FEATURE)}
    output = given.get("module_output_name")
    names["module_output_name"] = names["module_input_name"] if output is None else output  # null: the input's
    for key, value in names.items():
        if value != FEATURE:
            return None, f"{path}: {key} {value!r} (a Dense of another feature) is not run by jaxbert"
    for key, default in (("bias", True), ("use_residual", False)):
        if not isinstance(given.get(key, default), bool):
            return None, f"{path}: {key} {given[key]!r} is not true or false"
    activation = _activation(path, given.get("activation_function", "torch.nn.modules.activation.Tanh"))
    if isinstance(activation, tuple):
        return activation
    spec = DenseSpec(sub, _positive(path, given, "in_features"), _positive(path, given, "out_features"))
    return dataclasses.replace(spec, bias=given.get("bias", True), activation=activation,
                               residual=given.get("use_residual", False)), None  # fmt: skip


def read_dropout(directory: str, sub: str) -> tuple[DropoutSpec | None, str | None]:
    """The Dropout module at `sub` (rate 0.2 unless its config.json says otherwise)."""
    path = existing_file(directory, os.path.join(sub, "config.json"))
    rate = (read_json(path) if path else {}).get("dropout", 0.2)
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate <= 1:
        return None, f"{path}: dropout {rate!r} is not a probability"
    return DropoutSpec(sub, float(rate)), None


def check_chain(steps: tuple[Step, ...], pooled: int, where: str) -> str | None:
    """Why the Dense modules' sizes do not follow on from the `pooled` dimension and each other, if they do not
    (PyTorch would fail on the first embedding)."""
    size = pooled
    for step in steps:
        if isinstance(step, DenseSpec):
            if step.in_features != size:
                return f"{where}: the Dense at {step.path!r} takes {step.in_features} features, it is given {size}"
            size = step.out_features
    return None


def out_features(steps: tuple[Step, ...], pooled: int) -> int:
    sizes = [s.out_features for s in steps if isinstance(s, DenseSpec)]
    return sizes[-1] if sizes else pooled


def _weights_file(directory: str, sub: str) -> str:
    for name in ("model.safetensors", "pytorch_model.bin"):  # sentence-transformers' order
        path = existing_file(directory, os.path.join(sub, name))
        if path:
            return path
    raise FileNotFoundError(f"{os.path.join(directory, sub)}: no model.safetensors or pytorch_model.bin (Dense)")


def load_dense(directory: str, spec: DenseSpec) -> dict:
    """The float32 parameters of the Dense `spec` from its module directory, every key and shape checked."""
    from jaxbert.checkpoint import read_state_dict

    path = _weights_file(directory, spec.path)
    state = read_state_dict(path)
    shapes = {"linear.weight": (spec.out_features, spec.in_features)}
    if spec.bias:
        shapes["linear.bias"] = (spec.out_features,)
    if spec.residual and spec.in_features != spec.out_features:
        shapes["residual.weight"] = (spec.out_features, spec.in_features)
    for key in state:
        if key not in shapes:
            raise ValueError(f"{path}: unexpected key {key!r} (the config expects {', '.join(shapes)})")
    out = {}
    for key, shape in shapes.items():
        if key not in state:
            raise ValueError(f"{path}: missing key {key!r} {list(shape)}")
        if tuple(np.shape(state[key])) != shape:
            raise ValueError(f"{path}: {key!r} has shape {list(np.shape(state[key]))}, the config says {list(shape)}")
        value = np.asarray(state[key])
        if not np.issubdtype(value.dtype, np.floating) and value.dtype.name != "bfloat16":
            raise ValueError(f"{path}: {key!r} is {value.dtype}, not floating point")
        value = value.astype(np.float32)
        if not np.isfinite(value).all():
            raise ValueError(f"{path}: {key!r} holds non-finite values")
        out[key] = value
    params = {"kernel": out["linear.weight"].T.copy()}
    if spec.bias:
        params["bias"] = out["linear.bias"]
    if "residual.weight" in out:
        params["residual"] = {"kernel": out["residual.weight"].T.copy()}
    return params


def load_steps(directory: str, steps: tuple[Step, ...]) -> tuple[dict, ...]:
    """The parameters of each Dense of `steps`, in order (the Dropouts have none)."""
    return tuple(load_dense(directory, s) for s in steps if isinstance(s, DenseSpec))


def apply(
    params: tuple[dict, ...], steps: tuple[Step, ...], x: Float[Array, "... E"], *, rng=None
) -> Float[Array, "... O"]:
    """The pooled embedding through the Dense and Dropout modules, in float32; dropout only with an `rng`."""
    layers = iter(params)
    x = x.astype(jnp.float32)
    for i, step in enumerate(steps):
        if isinstance(step, DropoutSpec):
            x = dropout(x, step.rate, None if rng is None else jax.random.fold_in(rng, i))
            continue
        p = jax.tree_util.tree_map(lambda a: a.astype(jnp.float32), next(layers))
        y = ACTIVATIONS[step.activation][1](dense({k: v for k, v in p.items() if k != "residual"}, x))
        if step.residual:
            y = y + (x if step.in_features == step.out_features else dense(p["residual"], x))
        x = y
    return x
