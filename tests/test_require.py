"""tests/require.py: a missing tool skips a test locally and fails it under CI."""

from __future__ import annotations

import pytest

from .require import require


@pytest.mark.parametrize("ci", ["true", "1"])
def test_missing_tool_fails_under_ci(monkeypatch, ci):
    monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.fail.Exception, match="CI requires faketime"):
        require(False, "faketime")


def test_missing_tool_skips_locally(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="faketime"):
        require(False, "faketime")
    require(True, "faketime")  # present: nothing happens
