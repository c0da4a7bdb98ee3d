"""The command line's errors in its own words: argparse types for the flags whose bounds are fixed (`--batch-size 0`
is refused by argparse, before a model loads), and the library's errors about an argument whose bound is the
model's (`max_length 999: must be in [1, 512]`) named by the flag that set it (`--max-length 999: ...`)."""

from __future__ import annotations

import argparse
import math

from jaxbert.inputs import Arg, renaming


def integer(low: int, high: int | None = None):
    """An argparse type: an integer in [low, high] (high None: no upper bound)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if value < low or (high is not None and value > high):
            bound = f"in [{low}, {high}]" if high is not None else f"at least {low}"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {text}")
        return value

    parse.__name__ = "integer"
    return parse


def number(low: float = -math.inf, high: float = math.inf, low_open: bool = True):
    """An argparse type: a finite number in (low, high] ([low, high] unless `low_open`; an infinite bound open)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
        if not (math.isfinite(value) and (low < value if low_open else low <= value) and value <= high):
            raise argparse.ArgumentTypeError(f"must be a finite number{_bounds(low, high, low_open)}, got {text}")
        return value

    parse.__name__ = "number"
    return parse


def _bounds(low: float, high: float, low_open: bool) -> str:
    if math.isinf(low) and math.isinf(high):
        return ""
    if math.isinf(high):
        return f" {'>' if low_open else '>='} {low:g}"
    return f" in {'(' if low_open or math.isinf(low) else '['}{low:g}, {high:g}]"


POSITIVE = integer(1)
NON_NEGATIVE = integer(0)
FINITE = number()
SEED = integer(0, 2**32 - 1)  # JAX's keys hold 32 bits (generate_options)


def as_flags(args, flags: dict[str, str]):
    """The library's ArgumentError / ArgumentTypeError re-raised naming the command's flags: `flags` maps a library
    argument to its flag ({"max_length": "--max-length"}); the flag's destination in `args` is its name without the
    dashes. An argument named alone ("pass max_new_tokens") becomes its flag; one shown with a value ("max_length
    999", "do_sample=True") only where the flag holds that value (`--max-length 999`, `--do-sample`): another value
    (a derived one, or one a file set) is not the flag's. A setting from generation_config.json comes named by its
    file (generate_options), no longer an argument, and keeps its words."""
    return renaming(lambda parts: tuple(flagged(p, args, flags) if isinstance(p, Arg) else p for p in parts))


def flagged(arg: Arg, args, flags: dict[str, str]) -> Arg | str:
    """`arg` named by its flag where the flag set it (see as_flags), else `arg`."""
    flag = flags.get(arg.name)
    if flag is None or arg.shown is None:
        return arg if flag is None else flag
    value = getattr(args, flag.lstrip("-").replace("-", "_"), None)
    if value is True and arg.value is True:  # a switch: do_sample=True
        return flag
    if value is None or isinstance(value, bool) or isinstance(arg.value, bool) or not _same(arg.value, value):
        return arg
    return f"{flag} {arg.shown}"


def _same(a, b) -> bool:
    try:
        return bool(a == b)
    except ValueError:  # an array's truth is ambiguous: no flag holds an array
        return False


def flags_of(parser: argparse.ArgumentParser, **renamed: str) -> dict[str, str]:
    """{library argument: flag} of a subcommand: each flag's destination names the argument it is passed as, but
    for `renamed` ({"max_length": "--max-seq-length"})."""
    flags = {
        action.dest: action.option_strings[-1]
        for action in parser._actions
        if action.option_strings and action.option_strings[-1].startswith("--") and action.dest != "help"
    }
    return {**flags, **renamed}
