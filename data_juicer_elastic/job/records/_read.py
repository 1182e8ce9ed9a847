"""Reading a record file: one place decides what "missing" and "unreadable" mean."""

from __future__ import annotations

from typing import Any

import orjson

from data_juicer_elastic.storage.store import Store

MISSING = object()


def load_key(store: Store, key: str) -> Any:
    """The parsed JSON at ``key`` in ``store``; ``MISSING`` when there is none (a link is none). Raises
    OSError/ValueError."""
    got = store.read(key)
    return MISSING if got is None else orjson.loads(got[0])


def load_record(store: Store, key: str) -> dict:
    """A JSON object record at ``key``; {} when it is missing (a link is), unreadable or not an object: the
    rule of ``files.read_record``, on the store (one open, fstat, read, read, close; nine calls by path)."""
    try:
        data = load_key(store, key)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def number_or_none(value: Any) -> float | None:
    """A JSON number as float (not a bool); None for anything else."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def int_or(value: Any, default: int = 0) -> int:
    return value if type(value) is int else default
