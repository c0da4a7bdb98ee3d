"""The initial parameters of a task fine-tune: the checkpoint as the task's head, with whatever it cannot supply
initialized as transformers' `init_params` does, and one sentence per initialized part for the run's log.

transformers' `from_pretrained` initializes missing parameters with a warning and, with
`ignore_mismatched_sizes=True`, re-initializes those of the wrong shape. For a fine-tuning command the data decide
the head, so both happen without a flag, by name in the "model:" line:

- no task head (a sentence encoder, an MLM checkpoint): a new head;
- no pooler (BertForMaskedLM / BertLMHeadModel checkpoints) for a head that pools: a new pooler;
- a classifier for other labels (a different count, names the data do not fit, another task's): a new classifier. The
  whole classifier is renewed, bias included: a bias learned for other labels means nothing for these;
- no cross-attention for a decoder that has it (a bert2bert's decoder warm-started from BERT): new cross-attention.

Only these are ever initialized: any other missing or mismatched parameter is the
converter's one-line error, as for every load.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from jaxbert.checkpoint import find_weights, read_msgpack, read_state_dict
from jaxbert.config import BertConfig
from jaxbert.convert import canonical_key, check_layer_count, expected_keys, flax_to_torch_any, torch_to_flax
from jaxbert.params import init_params


def _state_dict(directory: str) -> dict[str, np.ndarray]:
    path = find_weights(directory)
    # A Flax tree goes through the PyTorch naming so that it gets the converter's checks (as load_params does).
    return flax_to_torch_any(read_msgpack(path)) if path.endswith(".msgpack") else read_state_dict(path)


def _mismatch(name: str, have: tuple, want: tuple, head: str) -> str:
    if name.endswith(".weight") and len(have) == 2 and have[1:] == want[1:]:
        if head == "BertForMultipleChoice":
            return f"{name}: the checkpoint has {have[0]} outputs, multiple choice scores with 1"
        return f"{name}: the checkpoint has {have[0]} labels, the data {want[0]}"
    return f"{name}: shape {have} in the checkpoint, {want} for this task"


def task_params(
    directory: str, config: BertConfig, head: str, seed: int, renew: str | None = None, unused: bool = False
) -> tuple[dict, list[str]]:
    """The checkpoint in `directory` as `head` with `config`'s labels, float32, and what was initialized.

    `renew` (why) re-initializes the classifier even when its shape fits: the data's labels are not the
    checkpoint's. Fresh parameters come from `init_params(config, key(seed), head)`. `unused`: also name the
    checkpoint's weights `head` has no place for (transformers' UNEXPECTED keys), which are dropped.
    """
    state = _state_dict(directory)
    # The config against the weights before anything is built from it: a config.json declaring a billion layers
    # or a vocabulary of 2**31 rows over a small checkpoint is the converter's one-line error, not an allocation
    # of the size it declares (the whole model was initialized here before torch_to_flax checked it).
    check_layer_count(state, config)
    expected = expected_keys(config, head)
    source = {canonical_key(k, head): k for k in state}
    head_names = sorted(n for n in expected if not n.startswith("bert."))
    for name, (_, shape) in expected.items():
        have = tuple(np.shape(state[source[name]])) if name in source else None
        if name not in head_names and have is not None and have != tuple(shape):
            raise ValueError(f"{source[name]}: shape {have} in the checkpoint, expected {tuple(shape)} from the config")
    pooler = sorted(n for n in expected if n.startswith("bert.pooler.") and n not in source)
    # A decoder given cross-attention (a bert2bert warm-started from BERT, as from_encoder_decoder_pretrained)
    cross = sorted(n for n in expected if ".crossattention." in n and n not in source)
    shapes = {n: tuple(np.shape(state[source[n]])) for n in head_names if n in source}
    # The weight first: its shape says how many labels the checkpoint has.
    wrong = sorted(
        (n for n, shape in shapes.items() if shape != tuple(expected[n][1])), key=lambda n: not n.endswith(".weight")
    )
    notes, fresh = [], pooler + cross
    if pooler:
        notes.append(f"the checkpoint has no pooler; initialized a new one ({', '.join(pooler)})")
    if cross:
        notes.append(f"the checkpoint has no cross-attention; initialized it ({', '.join(cross)})")
    if not shapes:
        notes.append(f"the checkpoint has no {head} head; initialized a new one ({', '.join(head_names)})")
    elif renew or wrong:
        why = renew or _mismatch(wrong[0], shapes[wrong[0]], tuple(expected[wrong[0]][1]), head)
        notes.append(f"{why}: initialized a new classifier ({', '.join(head_names)})")
    if shapes and not (renew or wrong):
        fresh += [n for n in head_names if n not in shapes]  # a partial head: complete it
        if len(shapes) < len(head_names):
            notes.append(
                f"the checkpoint's {head} head lacks {', '.join(sorted(set(head_names) - set(shapes)))}; "
                "initialized them"
            )
    else:
        fresh += head_names
    if fresh:
        only = {expected[name][0] for name in fresh}
        init = traverse_util.flatten_dict(jax.device_get(init_params(config, jax.random.key(seed), head, only=only)))
        for name in fresh:
            state.pop(source.get(name, name), None)
            path = expected[name][0]
            state[name] = np.asarray(init[path].T if path[-1] == "kernel" else init[path])
    params, report = torch_to_flax(state, config, head)
    dropped = sorted(k for k, why in report.ignored.items() if why == f"not used by {head}")
    if unused and dropped:
        notes.append(f"the checkpoint's {', '.join(dropped)}: not used by {head} (dropped)")
    return jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), params), notes
