"""The records the storage interface hands back, and its key rules (``store.py`` re-exports them).

Kept apart from ``store.py`` so the backends can import them while
``store.store_for`` imports the backends: no import circle.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

Ver = str
"""An opaque version of a key's content: compare for equality, pass back as ``if_ver``, never parse it."""


@dataclass(frozen=True)
class Meta:
    """One key's size and version, and its age on the store's own clock.

    ``modified`` and ``store_now`` are both the store's (S3: one response's
    ``Last-Modified`` and ``Date``; POSIX: one stat, then the clock the caller
    passed or a probe). ``clock`` is that reading, or how to take it: POSIX
    probes its clock (5 calls) only when ``store_now`` is first asked for, so
    a caller that needs no age, or holds a ``now`` already, pays nothing.
    ``released``: the key was given up by ``Store.release`` (a lease that is
    claimable at once, whatever its age).
    """

    size: int
    ver: Ver
    modified: float
    clock: float | Callable[[], float] = field(repr=False, compare=False)
    released: bool = False

    @cached_property
    def store_now(self) -> float:
        return float(self.clock) if isinstance(self.clock, int | float) else self.clock()

    @property
    def age(self) -> float:
        return self.store_now - self.modified


@dataclass(frozen=True)
class Entry:
    """One key of a listing (job-relative)."""

    key: str
    size: int
    ver: Ver
    modified: float


def normalise_key(key: str) -> str:
    """``key`` as the one spelling every backend stores it under; ValueError if it leaves the store.

    ``a//b/./c`` is ``a/b/c``. An absolute key, a ``..`` part or an empty key
    is refused rather than resolved, as ``JobDir.confine`` refuses them today.
    """
    norm = _normalise(key, "key")
    if not norm:
        raise ValueError(f"store key {key!r} is empty")
    return norm


def normalise_prefix(prefix: str) -> str:
    """A listing's prefix (a folder; ``""`` is the whole store), normalised and confined like a key."""
    return _normalise(prefix, "prefix")


def _normalise(key: str, what: str) -> str:
    if not isinstance(key, str) or "\x00" in key:
        raise ValueError(f"store {what} {key!r} is not a string without NUL bytes")
    if key.startswith("/"):
        raise ValueError(f"store {what} {key!r} is absolute; keys are relative to the store's root")
    parts = [p for p in key.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ValueError(f"store {what} {key!r} has a '..' part; it would leave the store's root")
    return "/".join(parts)  # no part is empty or absolute: what posixpath.join would give, at 1/3 the cost


def is_internal(key: str) -> bool:
    """Keys with a part starting with '.' (temp names, ``.probe/``, ``.clock``) are the store's own: never listed."""
    return any(part.startswith(".") for part in key.split("/"))
