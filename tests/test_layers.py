"""The layering in DESIGN.md, held by the tree. Each room and what it may import:

* the core (everything but ``plugin/`` and ``ray_runner/``; ``console`` and
  ``patches/`` included): neither Ray nor Data-Juicer, at import time. The
  ``patches/`` modules change Ray's, Data-Juicer's and loguru's internals, but
  import them only inside the functions that do it;
* ``plugin/``, Data-Juicer's front door: Data-Juicer (which itself imports Ray),
  the core; never ``ray_runner/`` at import time (the executor imports the
  runner when it builds one), and ``plugin/hook`` nothing beyond ``os``/``sys``;
* ``ray_runner/``: Ray, Data-Juicer, the core, the front door.
"""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import data_juicer_elastic

BLOCKED = ("ray", "data_juicer")
PLUGIN = "data_juicer_elastic.plugin"
RAY_RUNNER = "data_juicer_elastic.ray_runner"
ENV = {"DJ_ELASTIC_DISABLE": "1", "PATH": "/usr/bin:/bin"}

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

# Every front-door module imported (Data-Juicer allowed), then: did any of them pull in the runner?
FRONT_DOOR_PROBE = """
import importlib, sys
for name in {modules!r}:
    importlib.import_module(name)
print(sorted(m for m in sys.modules if m.startswith({runner!r})))
"""


def all_modules() -> list[str]:
    return [info.name for info in pkgutil.walk_packages(data_juicer_elastic.__path__, "data_juicer_elastic.")]


def core_modules() -> list[str]:
    names = [n for n in all_modules() if not n.startswith((PLUGIN, RAY_RUNNER))]
    assert "data_juicer_elastic.worker.loop" in names and "data_juicer_elastic.cli" in names
    assert "data_juicer_elastic.console" in names and "data_juicer_elastic.patches.ray" in names
    return names


def run_probe(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV)


def test_core_imports_without_ray_or_data_juicer():
    modules = core_modules()
    out = run_probe(PROBE.format(blocked=BLOCKED, modules=modules))
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["ok", str(len(modules))]


def test_the_probe_does_block_them():
    """The test above could pass with a finder that blocks nothing: check it refuses a plugin module."""
    for module in (f"{PLUGIN}.executor", f"{RAY_RUNNER}.warm_ops"):
        out = run_probe(PROBE.format(blocked=BLOCKED, modules=[module]))
        assert out.returncode != 0 and "blocked for this test:" in out.stderr, module


def test_front_door_leaves_the_runner_unloaded():
    front_door = [n for n in all_modules() if n.startswith(PLUGIN)]
    assert f"{PLUGIN}.executor" in front_door and f"{PLUGIN}.front_door" in front_door
    out = run_probe(FRONT_DOOR_PROBE.format(modules=front_door, runner=RAY_RUNNER))
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "[]", out.stdout


def test_the_front_door_probe_sees_the_runner():
    """The test above could pass if it never saw ray_runner: importing the runner must show up."""
    out = run_probe(FRONT_DOOR_PROBE.format(modules=[f"{RAY_RUNNER}.runner"], runner=RAY_RUNNER))
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"'{RAY_RUNNER}.runner'" in out.stdout


def test_public_api_resolves():
    for name in data_juicer_elastic.__all__:
        assert getattr(data_juicer_elastic, name) is not None, name
