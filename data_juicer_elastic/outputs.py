"""Re-reading an attempt's output before it may be published as done."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import orjson

from .errors import IntegrityError

BLOCK = 16 << 20


@dataclass(frozen=True)
class OutputDigest:
    rows: int
    bytes: int
    sha256: str


def _check_lines(lines: list[bytes], path: Path, first_line: int) -> None:
    """Every line is one JSON object. One orjson call per block; per line only to report."""
    if not lines:
        return
    try:
        parsed = orjson.loads(b"[" + b",".join(lines) + b"]")
        if len(parsed) == len(lines) and all(type(row) is dict for row in parsed):
            return
    except orjson.JSONDecodeError:
        pass
    for offset, line in enumerate(lines):
        try:
            ok = type(orjson.loads(line)) is dict
        except orjson.JSONDecodeError:
            ok = False
        if not ok:
            raise IntegrityError(f"{path}:{first_line + offset}: output row is not one JSON object")


def inspect_output(path: str | Path) -> OutputDigest:
    """Rows, bytes and sha256 of a JSONL output, checking every line is a JSON object."""
    path = Path(path)
    digest = hashlib.sha256()
    rows = size = 0
    tail = b""
    with open(path, "rb") as f:
        while block := f.read(BLOCK):
            digest.update(block)
            size += len(block)
            data = tail + block
            cut = data.rfind(b"\n") + 1
            lines, tail = data[:cut].split(b"\n")[:-1], data[cut:]
            _check_lines(lines, path, rows + 1)
            rows += len(lines)
    if tail:
        raise IntegrityError(f"{path}:{rows + 1}: output does not end with a newline (truncated?)")
    return OutputDigest(rows=rows, bytes=size, sha256=digest.hexdigest())
