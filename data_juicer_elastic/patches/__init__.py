"""Every change this package makes to the internals of another package, in one place per host.

Data-Juicer 1.6 has no executor plug-in point and no op observer, Ray Data
has no switch for some of its defaults, and loguru has no public way to find
the sinks that write to the console. Where this package needs one of those,
it changes the host's internals, and every such change lives in the host's
module here: :mod:`.data_juicer`, :mod:`.ray`, :mod:`.loguru`. Each one is
declared with :func:`declare`: what it changes, the host versions it was
written for, and what happens without it. :func:`apply` installs it and
checks that it took; :func:`report` then makes one log line at start-up
naming every patch that did not apply (docs/UPSTREAM.md: the extension points
that would make the Data-Juicer ones unnecessary).

This module and the host modules import their hosts only inside functions,
so they load without Data-Juicer or Ray, and nothing of this package above
them: what a patch installs (the front door's functions, the op counters) is
passed in by the layer that owns it (tests/test_layers.py).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass

HOSTS = ("py-data-juicer", "ray", "loguru")


@dataclass
class Patch:
    """One change to a host's internals."""

    host: str  # the distribution whose internals it changes (one of HOSTS)
    target: str  # the attribute or behaviour changed, as a dotted path
    versions: str  # the host versions it was written for, e.g. ">=1.6,<1.7"
    purpose: str  # what it is for
    without: str  # what happens where it does not apply
    strict: bool = False  # never tried outside ``versions`` (else tried, and its own check decides)
    applied: bool | None = None  # None: not tried in this process
    problem: str = ""  # why it did not apply
    reported: bool = False


_INVENTORY: dict[str, Patch] = {}
_lock = threading.RLock()  # an install may import a module whose own patches apply meanwhile


def declare(host: str, target: str, versions: str, purpose: str, without: str, *, strict: bool = False) -> str:
    """Add a patch to the inventory (at import of its host module); returns ``target`` as its key."""
    if host not in HOSTS:
        raise ValueError(f"unknown host {host!r}")
    _INVENTORY.setdefault(target, Patch(host, target, versions, purpose, without, strict))
    return target


def inventory() -> list[Patch]:
    """Every patch of every host (the host modules are imported for their declarations)."""
    from data_juicer_elastic.patches import data_juicer, loguru, ray  # noqa: F401

    return list(_INVENTORY.values())


def get(target: str) -> Patch:
    return _INVENTORY[target]


def _numbers(version: str) -> tuple[int, ...]:
    """The leading numeric parts of a version: "2.60.0rc1" -> (2, 60, 0)."""
    parts = []
    for piece in version.split("."):
        m = re.match(r"\d+", piece)
        if m is None:
            break
        parts.append(int(m.group()))
        if m.end() < len(piece):
            break
    return tuple(parts)


def in_range(version: str, spec: str) -> bool:
    """Whether ``version`` meets every clause of ``spec`` (``>=1.6,<1.7``; comparisons on numeric parts)."""
    have = _numbers(version)
    if not have:
        return False
    for clause in spec.split(","):
        m = re.fullmatch(r"\s*(>=|<=|==|<|>)\s*([\w.]+)\s*", clause)
        if m is None:
            raise ValueError(f"bad version range {spec!r}")
        op, bound = m.group(1), _numbers(m.group(2))
        width = max(len(have), len(bound))
        a, b = have + (0,) * (width - len(have)), bound + (0,) * (width - len(bound))
        ok = {">=": a >= b, "<=": a <= b, "==": a == b, "<": a < b, ">": a > b}[op]
        if not ok:
            return False
    return True


def apply(target: str, version: str, install: Callable[[], bool]) -> bool:
    """Install one declared patch for a host at ``version``; True if it applied.

    ``install`` does the change and returns its own check (the host now holds
    the replacement); a host that lacks what it changes raises AttributeError,
    ImportError, KeyError or TypeError, which counts as not applied. Applying
    again after success does nothing.
    """
    patch = _INVENTORY[target]
    with _lock:
        if patch.applied:
            return True
        outside = not in_range(version, patch.versions)
        if outside and patch.strict:
            patch.applied, patch.problem = False, f"{patch.host} {version} is outside {patch.versions}"
            return False
        try:
            ok = bool(install())
            problem = "" if ok else "its check failed after installing"
        except (AttributeError, ImportError, KeyError, TypeError) as exc:
            ok, problem = False, f"{type(exc).__name__}: {exc}"
        if not ok and outside:
            problem += f" ({patch.host} {version} is outside {patch.versions})"
        patch.applied, patch.problem = ok, problem
        return ok


def not_applied() -> list[Patch]:
    """Patches tried in this process that did not apply."""
    return [p for p in _INVENTORY.values() if p.applied is False]


def report(log: Callable[[str], object]) -> str | None:
    """One line naming the patches that did not apply and were not reported yet (None: nothing new)."""
    with _lock:
        new = [p for p in _INVENTORY.values() if p.applied is False and not p.reported]
        for p in new:
            p.reported = True
    if not new:
        return None
    line = "data-juicer-elastic: not applied: " + "; ".join(f"{p.target} ({p.problem}; {p.without})" for p in new)
    log(line)
    return line
