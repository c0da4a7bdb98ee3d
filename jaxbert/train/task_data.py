"""Labelled data files for task fine-tuning: JSON lines (.jsonl), CSV (.csv) or TSV (.tsv), read into rows that remember
their file and line, so every error about a value names file, line and column.

JSON lines keep JSON's types (a label may be an integer, a number, a string or a list). CSV/TSV cells are text (TSV
unquoted: quotes are part of the text): a label cell is read as an integer, else a number (ASCII digits, no "_"
separators), else a JSON array when it starts with "[", else a string, and an empty one is an error as a JSON null is
(an empty text cell too, a missing value to `datasets`); a list column (token-classification words and tags,
multiple-choice options, multi-label labels) is a JSON array in one cell, or numbered columns NAME0, NAME1, ...
(SWAG's ending0..ending3), never one of them alone.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import os

from jaxbert.files import json_line
from jaxbert.inputs import lone_surrogate
from jaxbert.texts import check_input_file, text_lines, utf8_lines

_MAX_CELL = 2**31 - 1  # characters of a CSV cell (the whole file is in memory anyway)
FORMATS = {".jsonl": "json", ".csv": ",", ".tsv": "\t", ".json": "squad"}  # .json: SQuAD JSON (task_qa.py)


@dataclasses.dataclass(frozen=True)
class Row:
    path: str
    line: int
    values: dict
    typed: bool  # JSON values (True) or CSV/TSV text cells (False)

    def where(self, column: str) -> str:
        return f"{self.path}:{self.line}: column {column!r}"

    def get(self, column: str):
        if column in self.values and self.values[column] is not None:
            return self.values[column]
        if not self.typed and f"{column}0" in self.values:  # numbered columns: a list
            return [self.values[name] for name in self._numbered(column)]
        if column in self.values:
            raise ValueError(f"{self.where(column)}: the value is null")
        names = ", ".join(map(repr, self.values)) or "none"
        raise ValueError(f"{self.path}:{self.line}: no column {column!r} (columns: {names})")

    def _numbered(self, column: str) -> list[str]:
        """The columns NAME0, NAME1, ... of a list given as numbered CSV/TSV columns, in order; a gap is an error:
        without NAME2, NAME3 would be item 2 (an option index, a tag's word) without a word."""
        names = [f"{column}{i}" for i in range(len(self.values)) if f"{column}{i}" in self.values]
        missing = next(i for i in range(len(names) + 1) if f"{column}{i}" not in self.values)
        if missing < len(names):
            raise ValueError(
                f"{self.path}:{self.line}: column {column!r} is numbered columns {', '.join(names)}, without "
                f"{column}{missing}: each number from 0 needs its column"
            )
        return names

    def unicode(self, column: str, value, item: int | None = None):
        """`value`, or an error where it holds a lone surrogate (only a JSON "\\ud800" escape makes one): a str
        that cannot be encoded would otherwise fail far away, in the tokenizer, naming no file."""
        if isinstance(value, list):
            return [self.unicode(column, v, i) for i, v in enumerate(value)]
        at = lone_surrogate(value) if isinstance(value, str) else None
        if at is not None:
            item = f"item {item}, " if item is not None else ""
            raise ValueError(
                f"{self.where(column)}: {item}character {at + 1}: U+{ord(value[at]):04X} is a lone surrogate, "
                "not valid Unicode"
            )
        return value

    def text(self, column: str, empty_cell: bool = False) -> str:
        """The text in `column`. An empty CSV/TSV cell is refused (unless `empty_cell`: the tasks that skip empty
        texts), as a JSON null is: `datasets` (pandas) reads it as a missing value, None, which transformers'
        run_*.py scripts cannot tokenize (run_swag formats it into the text "None")."""
        value = self.get(column)
        if not isinstance(value, str):
            raise ValueError(f"{self.where(column)}: expected a string, got {_kind(value)}")
        if not (self.typed or value or empty_cell):
            raise ValueError(f"{self.where(column)}: the cell is empty; expected a text")
        return self.unicode(column, value)

    def texts(self, column: str) -> list[str]:
        """A list of strings: a JSON array, or (CSV/TSV) a JSON array in the cell or numbered columns."""
        value = self.get(column)
        if not self.typed and isinstance(value, str):
            value = parse_cell(self, column, value, want_list=True)
        elif not self.typed and (empty := next((i for i, v in enumerate(value) if v == ""), None)) is not None:
            # numbered columns (SWAG's ending0..ending3): an empty cell is a missing value to `datasets`, not a text
            raise ValueError(
                f"{self.where(f'{column}{empty}')}: the cell is empty; expected a text (item {empty} of {column!r})"
            )
        if not isinstance(value, list):
            raise ValueError(f"{self.where(column)}: expected a list of strings, got {_kind(value)}")
        if (bad := next((i for i, v in enumerate(value) if not isinstance(v, str)), None)) is not None:
            # "got a list" named neither the item nor what it is (a null word, a number for an option)
            raise ValueError(f"{self.where(column)}: expected a list of strings; item {bad} is {_kind(value[bad])}")
        return self.unicode(column, value)

    def label(self, column: str):
        """A label as JSON would have it: int, float, str or list (CSV/TSV cells parsed, see the module doc;
        numbered columns a list of such cells)."""
        value = self.get(column)
        if self.typed:
            return self.unicode(column, value)
        if isinstance(value, list):  # not its first column's cell alone: one-hot columns label0, label1, ...
            return [self._label_cell(name) for name in self._numbered(column)]
        return self._label_cell(column)

    def _label_cell(self, column: str):
        cell = self.values[column]
        if not cell.strip():  # as a JSON null: not a class named ""
            raise ValueError(f"{self.where(column)}: the cell is empty; expected a label")
        return self.unicode(column, parse_cell(self, column, cell))


def _kind(value) -> str:
    if isinstance(value, list):
        return "a list"
    return {
        bool: "true/false",
        int: "an integer",
        float: "a number",
        str: "a string",
        dict: "an object",
        type(None): "null",
    }.get(type(value), type(value).__name__)


def parse_cell(row: Row, column: str, cell: str, want_list: bool = False):
    text = cell.strip()
    if text.startswith("["):
        try:
            return json.loads(text)
        except (ValueError, RecursionError):
            raise ValueError(f"{row.where(column)}: {cell!r} is not a JSON array") from None
    # Python's int() and float() also read "1_0" (10) and non-ASCII digits ("\u0663" is 3), and float() "nan",
    # "inf" and "Infinity", which JSON does not write: label names, not numbers.
    if want_list or not text.isascii() or "_" in text:
        return cell
    for kind in (int, float):
        try:
            value = kind(text)
        except ValueError:
            continue
        return value if math.isfinite(value) else cell
    return cell


def read_rows(path: str, flag: str = "--train-file", lines: str | None = None) -> list[Row]:
    """Every row of a .jsonl / .csv / .tsv file, in order; blank lines skipped. An empty file is an error.
    `lines`: a task of plain texts (causal LM) also reads a .txt file, each non-blank line the row's column
    `lines` (SQuAD .json is question answering's alone)."""
    ext = os.path.splitext(path)[1].lower()
    if lines is not None and ext in (".txt", ".json"):
        if ext == ".json":
            raise ValueError(f"{flag} {path}: expected a .txt (one text per line), .jsonl, .csv or .tsv file")
        check_input_file(path)
        rows = [Row(path, n, {lines: text}, True) for n, text in text_lines(path) if text.strip()]
        if not rows:
            raise ValueError(f"{path}: no examples (empty file)")
        return rows
    if ext not in FORMATS:
        raise ValueError(f"{flag} {path}: expected a .jsonl, .csv or .tsv file (or SQuAD .json)")
    check_input_file(path)
    if FORMATS[ext] == "squad":
        from jaxbert.train.task_qa import read_squad

        return read_squad(path)
    rows = _read_json(path) if FORMATS[ext] == "json" else _read_csv(path, FORMATS[ext])
    if not rows:
        raise ValueError(f"{path}: no examples (empty file)")
    return rows


def _read_json(path: str) -> list[Row]:
    rows = []
    for n, line in utf8_lines(path):
        if not line.strip():
            continue
        record = json_line(line, f"{path}:{n}")
        if not isinstance(record, dict):
            raise ValueError(f"{path}:{n}: expected a JSON object, got {_kind(record)}")
        rows.append(Row(path, n, record, True))
    return rows


def _records(path: str, delimiter: str):
    """(line number, fields) per record. TSV has no quoting (IANA text/tab-separated-values; GLUE's files and
    transformers' reader use none): a cell is the text between tabs, quotes kept, one line per record. CSV cells
    may be quoted and then hold commas, quotes ("") and line breaks."""
    if delimiter == "\t":
        yield from ((n, line.split("\t")) for n, line in utf8_lines(path))
        return
    # UTF-8 checked line by line, with the line's number; the line breaks as written, which the reader parses: a
    # quoted cell's "\r\n" is its text (a QA context's answer offsets count the "\r").
    text = "".join(line for _, line in utf8_lines(path, keep_ends=True))
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    # A cell may hold a whole document: the csv module's default limit of 131,072 characters refused such a file as
    # "not valid CSV" (pandas, behind `datasets`, has none). Raised for this read only: it is the process's setting.
    limit = csv.field_size_limit(_MAX_CELL)
    try:
        records = [(reader.line_num, fields) for fields in reader]
        _closed(path, text, records[-2][0] + 1 if len(records) > 1 else 1)
    except csv.Error as e:
        raise ValueError(f"{path}:{reader.line_num}: not valid CSV ({e})") from None
    finally:
        csv.field_size_limit(limit)
    yield from records


def _closed(path: str, text: str, start: int) -> None:
    """The last record, from line `start`, closes its quotes: the csv module (not strict) ends a quoted cell left
    open at the end of the file there, so one stray quote made the rest of the file one cell, its rows lost inside
    a text or a label (pandas, behind `datasets`, refuses it: "EOF inside string"). Read strict, only that record
    (strict also refuses text after a closing quote, which the lenient reading keeps)."""
    tail = "".join(io.StringIO(text, newline="").readlines()[start - 1 :])
    try:
        for _ in csv.reader(io.StringIO(tail, newline=""), strict=True):
            pass
    except csv.Error as e:
        if "unexpected end of data" in str(e):
            why = "a quoted cell is never closed (its quote runs to the end of the file)"
            raise ValueError(f"{path}:{start}: {why}") from None


def _read_csv(path: str, delimiter: str) -> list[Row]:
    header, rows = None, []
    for n, fields in _records(path, delimiter):
        if not any(f.strip() for f in fields):
            continue
        if header is None:
            header = fields
            if len(set(header)) != len(header):
                raise ValueError(f"{path}:{n}: repeated column names in the header")
            continue
        if len(fields) != len(header):
            raise ValueError(f"{path}:{n}: {len(fields)} fields, the header has {len(header)}")
        rows.append(Row(path, n, dict(zip(header, fields)), False))
    return rows
