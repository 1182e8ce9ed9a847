"""Tests that need a tool the machine may lack: skipped on a laptop, failed in CI.

``.ci/run`` installs every tool the suite needs and sets ``CI=true``; there
a missing tool is a broken CI setup, and a skip would hide that the tests
it guards never ran.
"""

from __future__ import annotations

import os

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def require(ok: bool, what: str) -> None:
    """Go on if ``ok``; otherwise skip saying ``what`` is missing, or fail with it under CI."""
    if ok:
        return
    if in_ci():
        pytest.fail(f"CI requires {what}; .ci/run installs and sets it up", pytrace=False)
    pytest.skip(what)
