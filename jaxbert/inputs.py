"""Host-side checks of what callers pass in, before anything reaches a device.

JAX gathers clamp out-of-range indices and `jnp.asarray(x, int32)` truncates floats, so a bad token id, a float
mask or a wrong shape would otherwise give a wrong answer instead of an error. Each check names the argument,
the value and its position; as an ArgumentError where a caller may know the argument by another name.
"""

from __future__ import annotations

import collections.abc
import contextlib
import itertools
from typing import NamedTuple

import numpy as np

from jaxbert.config import BertConfig


class Arg(NamedTuple):
    """An argument an error names: `name`, and `shown`, its `value` as the message writes it after `sep` (None:
    the message names the argument alone: "pass max_new_tokens")."""

    name: str
    value: object = None
    shown: str | None = None
    sep: str = " "

    @classmethod
    def showing(cls, name: str, value, form=str, sep: str = " ") -> Arg:
        return cls(name, value, form(value), sep)

    def __str__(self) -> str:
        return self.name if self.shown is None else f"{self.name}{self.sep}{self.shown}"


class _Parts:
    """A message made of its text and the arguments it names (Arg), joined: a caller that knows an argument by
    another name (a method's parameter, a CLI flag, the file a setting came from) renames it from these fields,
    where rewording the text would have to guess which words name what."""

    def __str__(self) -> str:
        return "".join(map(str, self.args))


class ArgumentError(_Parts, ValueError):
    """A ValueError about arguments: ArgumentError(Arg.showing("max_length", 999), ": must be in [1, 512]")."""


class ArgumentTypeError(_Parts, TypeError):
    """ArgumentError's TypeError."""


def positive_int(name: str, value, upper: int | None = None) -> int:
    """An integer argument (not a bool, float or string) in [1, upper]."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ArgumentTypeError(Arg(name), f" must be an integer, got {type(value).__name__} {value!r}")
    if value < 1 or (upper is not None and value > upper):
        raise ArgumentError(Arg.showing(name, value), f": must be in [1, {upper}]" if upper else ": must be ≥ 1")
    return int(value)


def lone_surrogate(text: str) -> int | None:
    """Where `text` holds a lone surrogate (a str that is not Unicode text: Python makes them of undecodable bytes,
    surrogateescape turning the command line's byte 0xff into \\udcff, and of JSON's "\\ud800" escapes), or None.
    The encoder finds it, in C."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return e.start
    return None


def items(name) -> collections.abc.Callable[[int], str]:
    """The name of a list's item i: `name` (a function of i, the caller's), or `name[i]` of a list named `name`."""
    return name if callable(name) else lambda i: f"{name}[{i}]"


def only(name: str) -> collections.abc.Callable[[int], str]:
    """Item names of a one-item list that stands for the caller's single argument `name` (fill_mask's `text`)."""
    return lambda i: name


def check_unicode(texts: list[str], name="texts") -> None:
    """An ArgumentError naming the first text (`items(name)` of its index; the text itself when it is the only one)
    holding a lone surrogate, and where: the tokenizers library refuses such a text with a message naming neither.
    A pass over the texts, so call it only once the fast path has failed."""
    for i, text in enumerate(texts):
        at = lone_surrogate(text)
        if at is None:
            continue
        code = ord(text[at])
        hint = f"; invalid UTF-8 byte 0x{code - 0xDC00:02x} on the command line?" if 0xDC80 <= code <= 0xDCFF else ""
        shown = repr(text if len(text) <= 60 else text[:60] + "...") if len(texts) == 1 else None
        why = f": not valid Unicode (a lone surrogate \\u{code:04x} at character {at}{hint})"
        raise ArgumentError(Arg(items(name)(i), text, shown), why)


def ordered(texts, name="texts") -> list:
    """`texts` as a list, in its order; a set or a mapping is refused: it has no order of its own, so outputs
    "in input order" would be in whatever order it iterates (a dict: its keys). sentence-transformers' encode refuses
    both (a set is no input type there, a dict one multimodal input keyed by modality)."""
    if isinstance(texts, (collections.abc.Set, collections.abc.Mapping)):
        kind = type(texts).__name__
        raise TypeError(f"{name} is a {kind}, which has no order for the outputs to follow; give a list")
    return list(texts)


def check_texts(texts, name="texts") -> list[str]:
    """`texts` as a list of strings, or a TypeError naming the first that is not (a single string: wrap it)."""
    if isinstance(texts, str):
        raise TypeError(f"{name} must be a list of strings, got a single string (wrap it in a list)")
    texts = ordered(texts, name)
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"{name}[{i}] is {type(text).__name__}, not a string")
    return texts


def as_array(name: str, value, dtype=None) -> np.ndarray:
    """np.asarray, its error naming the argument: rows of different lengths or an item that is no number got numpy's
    message alone ('setting an array element with a sequence...', 'could not convert string to float')."""
    try:
        return np.asarray(value, dtype)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{name} is not a rectangular array of numbers ({str(e).splitlines()[0]})") from None


def _integer_array(name: str, value, allow_bool: bool = False) -> np.ndarray:
    arr = as_array(name, value)
    if not (np.issubdtype(arr.dtype, np.integer) or (allow_bool and arr.dtype == np.bool_)):
        raise TypeError(f"{name} must be integers{' or booleans' if allow_bool else ''}, got dtype {arr.dtype}")
    return arr


def _mask_array(name: str, label: str, value) -> np.ndarray:
    """An attention mask as integers: integers or booleans, or floats (transformers takes 0./1. masks, as a
    tokenizer's output cast to float gives them) each exactly 0 or 1: the int32 cast on the way to the devices
    would turn 0.5 into 0 and NaN into anything, so any other float is named by position."""
    arr = as_array(name, value)
    if not (np.issubdtype(arr.dtype, np.floating) or arr.dtype.name == "bfloat16"):
        return _integer_array(name, arr, allow_bool=True).astype(np.int64)
    bad = np.argwhere((arr != 0) & (arr != 1))
    if bad.size:
        pos = tuple(int(i) for i in bad[0])
        raise ValueError(f"{label} {float(arr[pos])} at position {pos} is not 0 or 1")
    return arr.astype(np.int64)


def _check_range(name: str, values: np.ndarray, upper: int, what: str):
    bad = np.argwhere((values < 0) | (values >= upper))
    if bad.size:
        pos = tuple(int(i) for i in bad[0])
        raise ValueError(f"{name} {int(values[pos])} at position {pos} is outside [0, {upper}) ({what})")


def check_arrays(
    config: BertConfig,
    input_ids,
    attention_mask=None,
    token_type_ids=None,
    position_ids=None,
    ndim: int = 2,
    *,
    names: tuple[str, str] = ("input_ids", "attention_mask"),
) -> None:
    """input_ids [B, L] ([B, C, L] for multiple choice, ndim=3), non-empty, in the vocabulary; the others of the
    same shape, integer-typed and in range (attention_mask 0/1, may be boolean or 0./1. floats). `names`: the
    caller's names of the ids and the mask (generate's prompt_ids, a bert2bert's decoder_input_ids)."""
    ids_name, mask_name = names
    ids = _integer_array(ids_name, input_ids)
    layout = "[batch, choices, length]" if ndim == 3 else "[batch, length]"
    if ids.ndim != ndim:
        hint = " (wrap a single sequence in a list)" if ids.ndim == ndim - 1 else ""
        raise ValueError(f"{ids_name} must be {ndim}-D {layout}, got shape {ids.shape}{hint}")
    if 0 in ids.shape:
        raise ValueError(f"{ids_name} is empty: shape {ids.shape}")
    _check_range("token id", ids, config.vocab_size, "vocab_size")
    others = (
        (mask_name, attention_mask, "attention mask value", 2, "0 or 1"),
        ("token_type_ids", token_type_ids, "token type id", config.type_vocab_size, "type_vocab_size"),
        ("position_ids", position_ids, "position id", config.max_position_embeddings, "max_position_embeddings"),
    )
    for name, arr, label, upper, what in others:
        if arr is None:
            continue
        arr = _mask_array(name, label, arr) if name == mask_name else _integer_array(name, arr)
        if arr.shape != ids.shape:
            raise ValueError(f"{name} shape {arr.shape} does not match {ids_name} shape {ids.shape}")
        _check_range(label, arr.astype(np.int64), upper, what)
    if position_ids is None and ids.shape[-1] > config.max_position_embeddings:
        raise ValueError(
            f"sequence length {ids.shape[-1]} exceeds max_position_embeddings {config.max_position_embeddings}"
        )


def first_outside(flat, starts, upper: int) -> tuple[int, int, int] | None:
    """(sequence, position in it, value) of the first id of `flat` (sequences concatenated, sequence i beginning at
    starts[i]) outside [0, upper); None when every id is inside."""
    bad = np.flatnonzero((flat < 0) | (flat >= upper))
    if not bad.size:
        return None
    i = int(np.searchsorted(starts, bad[0], side="right")) - 1
    return i, int(bad[0] - starts[i]), int(flat[bad[0]])


def check_encoded(config: BertConfig, enc, name=lambda i: f"texts[{i}]") -> None:
    """Tokenized texts (tokenizer.Encoded) within the model's vocabulary and token types, named by text (`name` of
    its index) and token: the batches' own check (check_arrays) can name only a row and column of packed or
    length-sorted rows."""
    tables = (("token id", enc.ids, config.vocab_size, "vocab_size"),)
    tables += (("token type id", enc.type_ids, config.type_vocab_size, "type_vocab_size"),)
    for label, rows, upper, what in tables:
        lengths = np.array([len(row) for row in rows], np.int64)
        flat = np.fromiter(itertools.chain.from_iterable(rows), np.int64, int(lengths.sum()))
        found = first_outside(flat, np.cumsum(lengths) - lengths, upper)
        if found:
            i, at, value = found
            raise ValueError(f"{name(i)}: {label} {value} at position {at} is outside [0, {upper}) ({what})")


def check_encoder_states(config: BertConfig, batch: int, states, mask):
    """encoder_hidden_states [B, S, D] (finite floats) and its mask [B, S] (0/1), for cross-attention only;
    returned as float32 / int32 numpy arrays (or None)."""
    if states is None:
        if mask is not None:
            raise ValueError("encoder_attention_mask given without encoder_hidden_states")
        return None, None
    if not config.add_cross_attention:
        raise ValueError("encoder_hidden_states given, but this model has no cross-attention")
    states = np.asarray(states)
    if states.ndim != 3 or states.shape[0] != batch or states.shape[2] != config.hidden_size:
        raise ValueError(f"encoder_hidden_states shape {states.shape}: expected ({batch}, S, {config.hidden_size})")
    if not np.issubdtype(states.dtype, np.floating) or not np.isfinite(states).all():
        raise ValueError("encoder_hidden_states must be finite floating-point values")
    if mask is not None:
        mask = _mask_array("encoder_attention_mask", "encoder attention mask value", mask)
        if mask.shape != states.shape[:2]:
            raise ValueError(
                f"encoder_attention_mask shape {mask.shape} does not match encoder_hidden_states {states.shape[:2]}"
            )
        _check_range("encoder attention mask value", mask.astype(np.int64), 2, "0 or 1")
        mask = mask.astype(np.int32)
    return states.astype(np.float32), mask


@contextlib.contextmanager
def renaming(change):
    """An ArgumentError / ArgumentTypeError raised inside, re-raised with its parts passed through `change` (tuple
    -> tuple: an Arg replaced by another, or by final text) where that changes them; other errors pass as they
    are."""
    try:
        yield
    except (ArgumentError, ArgumentTypeError) as e:
        parts = tuple(change(e.args))
        if len(parts) == len(e.args) and all(a is b for a, b in zip(parts, e.args)):
            raise
        raise type(e)(*parts) from None
