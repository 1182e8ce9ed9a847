"""Re-reading an attempt's output before it may be published as done."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from data_juicer_elastic.errors import IntegrityError
from data_juicer_elastic.jsonl import LineProblem, check_objects, split_lines
from data_juicer_elastic.storage.blocks import Digester, blocks


@dataclass(frozen=True)
class OutputDigest:
    rows: int
    bytes: int
    sha256: str


def _check_lines(lines: list[bytes], path: Path, first_line: int) -> None:
    try:
        check_objects(lines)
    except LineProblem as bad:
        raise IntegrityError(
            f"{path}:{first_line + bad.index}: output row is not one JSON object ({bad.message})"
        ) from None


def inspect_output(path: str | Path) -> OutputDigest:
    """Rows, bytes and sha256 of a JSONL output, checking every line is a JSON object."""
    path = Path(path)
    d = Digester()
    tail = b""
    for block in blocks(path):
        first_row = d.rows + 1
        d.update(block)
        lines, tail = split_lines(tail + block if tail else bytes(block))
        _check_lines(lines, path, first_row)
    if tail:
        raise IntegrityError(f"{path}:{d.rows + 1}: output does not end with a newline (truncated?)")
    return OutputDigest(rows=d.rows, bytes=d.bytes, sha256=d.result().sha256)
