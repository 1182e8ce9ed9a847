"""The layering in DESIGN.md, held by the tree: only ``plugin/`` may import Ray or Data-Juicer."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import data_juicer_elastic

BLOCKED = ("ray", "data_juicer")

# A finder that refuses the blocked packages, then every core module imported in turn.
PROBE = """
import importlib, importlib.abc, sys
BLOCKED = {blocked!r}
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"blocked for this test: {{name}}")
        return None
sys.meta_path.insert(0, Refuse())
for name in {modules!r}:
    importlib.import_module(name)
print("ok", len({modules!r}))
"""


def core_modules() -> list[str]:
    names = [
        info.name
        for info in pkgutil.walk_packages(data_juicer_elastic.__path__, "data_juicer_elastic.")
        if not info.name.startswith("data_juicer_elastic.plugin")
    ]
    assert "data_juicer_elastic.worker.loop" in names and "data_juicer_elastic.cli" in names
    return names


def test_core_imports_without_ray_or_data_juicer():
    modules = core_modules()
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(blocked=BLOCKED, modules=modules)],
        capture_output=True,
        text=True,
        env={"DJ_ELASTIC_DISABLE": "1", "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["ok", str(len(modules))]


def test_the_probe_does_block_them():
    """The test above could pass with a finder that blocks nothing: check it refuses a plugin module."""
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(blocked=BLOCKED, modules=["data_juicer_elastic.plugin.executor"])],
        capture_output=True,
        text=True,
        env={"DJ_ELASTIC_DISABLE": "1", "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode != 0 and "blocked for this test: data_juicer" in out.stderr


def test_public_api_resolves():
    for name in data_juicer_elastic.__all__:
        assert getattr(data_juicer_elastic, name) is not None, name
