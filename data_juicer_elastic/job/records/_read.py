"""Reading a record file: one place decides what "missing" and "unreadable" mean."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from data_juicer_elastic.storage.files import read_json

MISSING = object()


def load_object(path: Path) -> Any:
    """The parsed JSON at ``path``; ``MISSING`` when there is no file. Raises OSError/ValueError."""
    try:
        return read_json(path)
    except FileNotFoundError:
        return MISSING


def number_or_none(value: Any) -> float | None:
    """A JSON number as float (not a bool); None for anything else."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def int_or(value: Any, default: int = 0) -> int:
    return value if type(value) is int else default
