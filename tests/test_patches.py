"""The inventory of patches to other packages' internals: version ranges, the applied check, the start-up line."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from data_juicer_elastic import patches
from tests.reference import OFFLINE


@pytest.mark.parametrize(
    "version, spec, expected",
    [
        ("1.6.1", ">=1.6,<1.7", True),
        ("1.7.0", ">=1.6,<1.7", False),
        ("1.5.9", ">=1.6,<1.7", False),
        ("2.60.0", ">=2.60,<2.61", True),
        ("2.61.0", ">=2.60,<2.61", False),
        ("2.60.0rc1", ">=2.60,<2.61", True),
        ("0.7.3", ">=0.7,<0.8", True),
        ("unknown", ">=0.7", False),
    ],
)
def test_version_ranges(version, spec, expected):
    assert patches.in_range(version, spec) is expected


def test_every_patch_is_declared_with_a_host_range_and_fallback():
    found = patches.inventory()
    hosts = {p.host for p in found}
    assert hosts == set(patches.HOSTS)
    for p in found:
        assert p.versions and p.purpose and p.without, p
        assert patches.in_range({"py-data-juicer": "1.6.1", "ray": "2.60.0", "loguru": "0.7.3"}[p.host], p.versions)
    assert len(found) >= 12


def test_a_patch_that_does_not_fit_is_recorded_and_named_once(monkeypatch):
    monkeypatch.setattr(patches, "_INVENTORY", {})
    fits = patches.declare("ray", "ray.fits", ">=2.60,<2.61", "p", "w")
    missing = patches.declare("ray", "ray.missing", ">=2.60,<2.61", "p", "Ray's default")
    strict = patches.declare("py-data-juicer", "dj.thing", ">=1.6,<1.7", "p", "refused", strict=True)
    tried = []

    def lacks() -> bool:
        raise AttributeError("module 'ray' has no attribute 'missing'")

    assert patches.apply(fits, "2.60.0", lambda: True)
    assert not patches.apply(missing, "2.61.0", lacks)  # tried outside its range: its own check decides
    assert not patches.apply(strict, "1.7.0", lambda: tried.append(1) or True)  # strict: never tried
    assert tried == []
    lines: list[str] = []
    line = patches.report(lines.append)
    assert lines == [line] and "ray.missing (AttributeError" in line and "ray 2.61.0 is outside >=2.60,<2.61" in line
    assert "Ray's default" in line and "dj.thing (py-data-juicer 1.7.0 is outside" in line and "ray.fits" not in line
    assert patches.report(lines.append) is None and len(lines) == 1  # named once


PROBE = """
import sys
from loguru import logger
import data_juicer.config.config, data_juicer.core.executor.factory
from data_juicer.tools import process_data
from data_juicer_elastic import console, patches
console.install_story_console("story")
from data_juicer_elastic.patches import data_juicer as dj
dj.check_runner_patches()
print(sorted(p.target for p in patches.inventory() if p.host != "ray" and not p.applied))
"""


def test_the_data_juicer_and_loguru_patches_apply_to_the_installed_versions():
    env = {**os.environ, **OFFLINE}
    env.pop("DJ_ELASTIC_DISABLE", None)
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr[-2000:]


def test_an_install_that_imports_a_patched_module_applies_that_patch_too(monkeypatch):
    """Checking a runner patch imports Data-Juicer, whose config module the hook patches meanwhile."""
    import threading

    monkeypatch.setattr(patches, "_INVENTORY", {})
    outer = patches.declare("py-data-juicer", "dj.outer", ">=1.6,<1.7", "p", "w")
    inner = patches.declare("py-data-juicer", "dj.inner", ">=1.6,<1.7", "p", "w")
    results: list[bool] = []
    install = lambda: patches.apply(inner, "1.6.1", lambda: True)  # noqa: E731
    thread = threading.Thread(target=lambda: results.append(patches.apply(outer, "1.6.1", install)), daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "apply() waits on itself"
    assert results == [True] and patches.get(inner).applied
