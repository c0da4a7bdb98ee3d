"""Reading local text files: one text per line (.txt) or JSON lines with a "text" field (.jsonl), with
errors that name the file and line."""

from __future__ import annotations

import dataclasses
import os

from jaxbert.files import json_line
from jaxbert.inputs import lone_surrogate


@dataclasses.dataclass
class TextFile:
    texts: list[str]
    empty_lines: int


def utf8_lines(path: str, keep_ends: bool = False):
    """(number, text) of each line of a UTF-8 file, the line break removed (kept with `keep_ends`: a CSV reader
    needs them, as a quoted cell's own line breaks are its text); a byte order mark (Excel's "CSV UTF-8" starts
    with one) is dropped, or it would be part of the first text or column name."""
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8-sig" if n == 1 else "utf-8")
                yield n, line if keep_ends else line.rstrip("\r\n")
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}:{n}: not UTF-8 ({e.reason} at byte {e.start} of the line)") from None


def text_lines(path: str):
    r"""(number, text) of each line of a plain text file as Python's text mode reads it, and datasets' text loader
    (run_mlm's) with it: "\n", "\r\n" and a lone "\r" each end a line (universal newlines), so a file saved with
    old Mac line ends is many lines, not one. The number is that of the "\n" line holding it."""
    for n, raw in utf8_lines(path, keep_ends=True):
        text = raw.replace("\r\n", "\n").replace("\r", "\n")
        parts = text.split("\n")
        if text.endswith("\n") or not text:  # not text: a file of a byte order mark alone holds no line
            parts.pop()
        for part in parts:
            yield n, part


def check_input_file(path: str) -> None:
    """An input file is a regular file: a directory, a pipe (`<(...)`, /dev/stdin) or a missing path each named as
    what it is ("no such file" for a directory or a pipe that exists misled)."""
    if os.path.isfile(path):
        return
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path}: is a directory, not a file")
    if os.path.exists(path):
        raise ValueError(f"{path}: not a regular file (a pipe or a device): give a file, it may be read more than once")
    raise FileNotFoundError(f"{path}: no such file")


def is_jsonl(path: str) -> bool:
    """JSON lines by the extension, in any case (TEXTS.JSONL too: read as plain lines, its records would be texts)."""
    return path.lower().endswith(".jsonl")


def read_text_file(path: str, allow_empty: bool = False, keep_empty: bool = False) -> TextFile:
    """txt: one text per line; jsonl: a "text" field per line. Empty (or whitespace-only) lines and "text" fields are
    skipped and counted, or with `keep_empty` a .txt file's are texts too: where outputs go line for line with the input
    (embed, predict), skipping them would shift every later output onto the wrong line. A .jsonl file's blank
    lines hold no record and are skipped either way."""
    check_input_file(path)
    texts, empty = [], 0
    for n, line in utf8_lines(path) if is_jsonl(path) else text_lines(path):
        if not line.strip():
            empty += 1
            if not keep_empty or is_jsonl(path):
                continue
        if is_jsonl(path):
            record = json_line(line, f"{path}:{n}")
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise ValueError(f'{path}:{n}: expected an object with a string "text" field')
            line = record["text"]
            at = lone_surrogate(line)  # a JSON "\ud800" escape: the tokenizer would name the text's index, not the line
            if at is not None:
                code = f"U+{ord(line[at]):04X}"
                raise ValueError(f'{path}:{n}: "text" character {at + 1}: {code} is a lone surrogate, not Unicode')
            if not line.strip() and not keep_empty:  # an empty "text" is an empty line, as run_mlm's filter has it
                empty += 1
                continue
        texts.append(line)
    if not texts and not allow_empty:
        raise ValueError(f"{path}: no text (0 non-empty lines)")
    return TextFile(texts, empty)
