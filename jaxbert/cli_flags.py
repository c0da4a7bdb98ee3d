"""The command line's errors in its own words: argparse types for the flags whose bounds are fixed (`--batch-size 0`
is refused by argparse, before a model loads), and the library's errors about an argument whose bound is the
model's (`max_length 999: must be in [1, 512]`) re-worded with the flag that set it (`--max-length 999: ...`)."""

from __future__ import annotations

import argparse
import math
import re

from jaxbert.inputs import rewording


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
    """The library's TypeError / ValueError re-worded with the command's flags: `flags` maps a library argument to
    its flag ({"max_length": "--max-length"}); the flag's destination in `args` is its name without the dashes.
    Where a flag was given (or has a default), `max_length 999` (the argument and the flag's value) becomes
    `--max-length 999`, and a message starting with the argument's name starts with the flag; advice to `pass
    max_new_tokens` names the flag whether given or not. An error about a value from a file (generation_config.json
    starts its message with the path) keeps its words: the flag did not set that value."""
    return rewording(lambda message: reworded(message, args, flags))


def reworded(message: str, args, flags: dict[str, str]) -> str:
    """`message` with the library's argument names turned into `flags` (see as_flags)."""
    for name, flag in flags.items():
        value = getattr(args, flag.lstrip("-").replace("-", "_"), None)
        if value is True:  # a switch: do_sample=True
            message = re.sub(rf"\b{name}=True\b", flag, message)
        elif value is not None and value is not False:
            shown = "|".join(re.escape(v) for v in {str(value), repr(value)})
            message = re.sub(rf"(?<![\w.-]){name}(?=[ =](?:{shown})(?![\w.]))[ =]", f"{flag} ", message)
            # "question must be a non-empty string"; not the name of another value ("num_beams 3" with --num-beams 2)
            message = re.sub(rf"^{name}\b(?![=.-]| [-\d'\"\[(])", flag, message)
        message = re.sub(rf"\bpass {name}\b", f"pass {flag}", message)
        message = re.sub(rf"^{name}: unset\b", f"{flag}: unset", message)
    return message


def flags_of(parser: argparse.ArgumentParser, **renamed: str) -> dict[str, str]:
    """{library argument: flag} of a subcommand: each flag's destination names the argument it is passed as, but
    for `renamed` ({"max_length": "--max-seq-length"})."""
    flags = {
        action.dest: action.option_strings[-1]
        for action in parser._actions
        if action.option_strings and action.option_strings[-1].startswith("--") and action.dest != "help"
    }
    return {**flags, **renamed}
