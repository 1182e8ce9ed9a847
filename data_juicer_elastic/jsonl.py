"""Strict JSONL validation and row normalisation, a block of lines at a time.

Every line must be one UTF-8 JSON object. Lines are handed around with their
newline (``split_lines``), which orjson takes as trailing whitespace. A block
is parsed with C-level chains (``map(orjson.loads)``, a type test, one
``orjson.dumps`` per row for repeated keys); its rows are then handed to a
sink (prepare gathers the input's schema from them). Only when parsing fails
is the block walked line by line, to name the first bad line and say why. Rows are re-serialised
(orjson.dumps) only where something changes: a relative media path made
absolute, or a missing index key filled in; all other lines keep their bytes.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property
from itertools import compress, count, repeat
from operator import is_, ne, not_
from typing import Any

import orjson

BOM = b"\xef\xbb\xbf"
REMOTE_PREFIXES = ("http://", "https://", "s3://", "gs://", "hdfs://")
_WHITESPACE = b" \t\r"


class LineProblem(Exception):
    """A bad line: ``index`` is its position in the block handed in."""

    def __init__(self, index: int, message: str) -> None:
        super().__init__(index, message)  # both in args, so it unpickles (it crosses the prepare pool)
        self.index = index
        self.message = message

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class RowRules:
    media_keys: tuple[str, ...]
    index_keys: tuple[str, ...]
    media_base: str  # absolute folder relative media paths are joined to

    @cached_property
    def media_set(self) -> frozenset[str]:
        return frozenset(self.media_keys)


def split_lines(block: bytes) -> tuple[list[bytes], bytes]:
    """The complete lines of ``block``, each with its newline, and the unterminated rest.

    ``BytesIO.readlines`` finds newlines with memchr: it took half to three
    quarters of the time of ``bytes.split(b"\\n")`` (long lines to short),
    whose one-byte loop was the largest single cost of a shard task.
    """
    lines = io.BytesIO(block).readlines()
    if lines and not lines[-1].endswith(b"\n"):
        rest = lines.pop()
        return lines, rest
    return lines, b""


def process_lines(
    lines: list[bytes], rules: RowRules, first_row: int, sink: Callable[[list[dict]], Any] | None = None
) -> list[bytes] | None:
    """Validate ``lines`` (each ending in a newline); return replacement lines if any row changed.

    None means every line keeps its raw bytes. ``first_row`` is the global row
    index of ``lines[0]`` (used for index keys). ``sink``, if given, is handed
    the block's rows as written (normalised), e.g. to gather the input's schema.
    Raises LineProblem for the first invalid line.
    """
    rows = parse_objects(lines)
    _refuse_repeated_keys(lines, rows)
    if rules.index_keys:
        touched: Iterable[int] = range(len(rows))  # index keys touch (nearly) every row
    elif rules.media_keys:
        touched = compress(count(), map(not_, map(rules.media_set.isdisjoint, rows)))
    else:
        touched = ()
    out: list[bytes] | None = None
    for i in touched:
        if _normalise(rows[i], rules, i, first_row + i):
            if out is None:
                out = list(lines)
            out[i] = orjson.dumps(rows[i], option=orjson.OPT_APPEND_NEWLINE)
    if sink is not None:
        sink(rows)
    return out


def check_objects(lines: list[bytes]) -> None:
    """Raise LineProblem for the first line that is not exactly one JSON object."""
    parse_objects(lines)


def parse_objects(lines: list[bytes]) -> list[dict]:
    """Every line parsed, in one C-level chain; LineProblem naming the first line that is not one object."""
    try:
        rows = list(map(orjson.loads, lines))
    except ValueError:
        rows = None
    if rows is not None and all(map(is_, map(type, rows), repeat(dict))):
        return rows
    for i, line in enumerate(lines):
        problem = diagnose(line)
        if problem:
            raise LineProblem(i, problem)
    raise AssertionError("block failed validation but no line did")  # pragma: no cover


def _refuse_repeated_keys(lines: list[bytes], rows: list[dict]) -> None:
    """Raise LineProblem for the first row that repeats a key, at any depth (orjson keeps the last value).

    Exact, and one ``orjson.dumps`` per row: a line equal to its row's
    re-serialisation repeats no key. Any other line (spaces, escapes, a number
    spelt otherwise, or a dropped key) is compared by quote count: the
    re-serialisation keeps every string delimiter and writes each quote inside
    a string as ``\\"``, so quotes (``\\u0022`` escapes counted as quotes, which
    only over-counts) are missing from it only if a key and its value were
    dropped; only those lines are parsed again, slowly and exactly. Lengths
    alone are not enough: ``{"x":1e6,"y":0,"y":9}`` re-serialises to as many bytes.
    """
    # streamed: a block's re-serialisations kept alive at once cost more than making them (malloc, cache)
    dumped = map(orjson.dumps, rows, repeat(None), repeat(orjson.OPT_APPEND_NEWLINE))
    for i in compress(count(), map(ne, lines, dumped)):
        line = lines[i]
        if line.count(b'"') + line.count(b"\\u0022") != orjson.dumps(rows[i]).count(b'"'):
            _check_unique_keys(line, i)


def _check_unique_keys(line: bytes, index: int) -> None:
    """Parse ``line`` keeping every key; raise LineProblem for the first one repeated in an object."""

    def pairs_hook(pairs: list[tuple[str, object]]) -> dict:
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise LineProblem(
                    index,
                    f"key {key!r} appears twice in one object; Ray's JSON reader refuses such rows "
                    "(JSON parsers differ on which value wins): keep one",
                )
            seen.add(key)
        return dict(pairs)

    json.loads(line, object_pairs_hook=pairs_hook)


def _normalise(row: dict, rules: RowRules, index: int, global_row: int) -> bool:
    changed = False
    for key in rules.media_keys:
        if key in row:
            changed |= _absolute_media(row, key, rules.media_base, index)
    for key in rules.index_keys:
        if key not in row:
            row[key] = global_row
            changed = True
    return changed


def _absolute_media(row: dict, key: str, base: str, index: int) -> bool:
    value = row[key]
    if value is None:
        return False
    if type(value) is not list or not all(type(p) is str for p in value):
        got = _kind(value) if type(value) is not list else "a list holding a non-string"
        raise LineProblem(
            index, f'media key {key!r} must be a list of strings or null, got {got}; write it as ["path", ...]'
        )
    fixed = [p if is_absolute(p) else os.path.join(base, p) for p in value]
    if fixed == value:
        return False
    row[key] = fixed
    return True


def is_absolute(path: str) -> bool:
    """Absolute local paths and URLs are kept, as Data-Juicer's own loader does."""
    return path.startswith(REMOTE_PREFIXES) or os.path.isabs(path)


def diagnose(line: bytes) -> str | None:
    """Why ``line`` is not one JSON object (None if it is one): the what and the fix."""
    if line.endswith(b"\n"):
        line = line[:-1]  # so orjson's positions read "line 1 column N", as the user counts them
    if line.startswith(BOM):
        return "starts with a UTF-8 byte order mark (BOM); save the file as UTF-8 without BOM"
    if not line.strip(_WHITESPACE):
        return "blank line; remove it (every line must hold exactly one JSON object)"
    try:
        line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"invalid UTF-8 at byte {exc.start + 1} of the line; re-encode the file as UTF-8"
    try:
        row = orjson.loads(line)
    except ValueError as exc:
        return f"not valid JSON ({exc}); each line must be one complete JSON object (truncated or split row?)"
    if type(row) is not dict:
        return f'holds {_kind(row)}, not a JSON object; each line must be one object such as {{"text": "..."}}'
    return None


def _kind(value: object) -> str:
    names = {
        list: "a JSON array",
        str: "a JSON string",
        int: "a JSON number",
        float: "a JSON number",
        bool: "a JSON boolean",
        dict: "a JSON object",
        type(None): "null",
    }
    return names.get(type(value), type(value).__name__)
