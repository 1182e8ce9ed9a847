"""The layering in DESIGN.md, held by the tree. Each room and what it may import:

* the core (everything but ``plugin/`` and ``ray_runner/``; ``console`` and
  ``patches/`` included): neither Ray nor Data-Juicer, at import time. The
  ``patches/`` modules change Ray's, Data-Juicer's and loguru's internals, but
  import them only inside the functions that do it;
* ``plugin/``, Data-Juicer's front door: Data-Juicer (which itself imports Ray),
  the core; never ``ray_runner/`` at import time (the executor imports the
  runner when it builds one), and ``plugin/hook`` nothing beyond ``os``/``sys``;
* ``ray_runner/``: Ray, Data-Juicer, the core, the front door.

Read from the source (every import statement, those inside functions too), the
package's own imports must also run one way: no module imports from a floor
above its own (:data:`FLOORS`), and no modules import each other in a circle.
So ``patches/`` is handed what it installs (the front door's functions, the op
counters) by the layer that owns it, rather than importing it (CONTRACTS.md).
"""

from __future__ import annotations

import ast
import functools
import pkgutil
import subprocess
import sys
from pathlib import Path

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


# --------------------------------------------------------------------------- the package's own imports
PACKAGE = "data_juicer_elastic"
CLI = f"{PACKAGE}.cli"

# The floors, lowest first (DESIGN.md "Layers", and the rooms above): the core, the front door, the shard
# runner, and the cli, which drives them all ("anything the layers above do not expose").
FLOORS = ("core", PLUGIN, RAY_RUNNER, CLI)

# Imports up a floor that DESIGN.md names, each allowed only inside a function:
# the executor imports the runner when it builds one.
UPWARD_ALLOWED = {(f"{PLUGIN}.executor", f"{RAY_RUNNER}.runner")}

# No circle is allowed (the last one, worker/loop <-> worker/prefetch, went with the one worker loop).
CYCLE_ALLOWED: set[frozenset[str]] = set()


def module_sources() -> dict[str, tuple[Path, bool]]:
    """Every module of the package: its source file, and whether it is a package (``__init__.py``)."""
    root = Path(data_juicer_elastic.__file__).parent
    found = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def imports_in(source: str, name: str, is_package: bool, known: set[str]) -> dict[str, bool]:
    """The package's modules that ``source`` (module ``name``) imports, each with whether only inside a function.

    ``from a.b import c`` is an import of ``a.b.c`` where that is a module, else of ``a.b``; ``import a.b.c``
    of the longest known prefix. An import of the module's own package (or a package above it) is left out:
    Python runs a package's ``__init__`` before any module in it, so that import never loads anything.
    """
    here = name if is_package else name.rpartition(".")[0]
    found: dict[str, bool] = {}

    def add(target: str, inner: bool) -> None:
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name and not name.startswith(f"{target}."):
            found[target] = found.get(target, True) and inner

    def visit(node: ast.AST, inner: bool) -> None:
        for child in ast.iter_child_nodes(node):
            child_inner = inner or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                for alias in child.names:
                    add(alias.name, inner)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = here.split(".")[: len(here.split(".")) - child.level + 1]
                    module = ".".join(base + ([child.module] if child.module else []))
                else:
                    module = child.module or ""
                for alias in child.names:
                    add(f"{module}.{alias.name}" if f"{module}.{alias.name}" in known else module, inner)
            visit(child, child_inner)

    visit(ast.parse(source), False)
    return found


@functools.cache
def import_graph() -> dict[str, dict[str, bool]]:
    """module -> {imported module of the package: only inside functions}, read from the source."""
    sources = module_sources()
    known = set(sources)
    return {
        name: imports_in(path.read_text(encoding="utf-8"), name, is_package, known)
        for name, (path, is_package) in sources.items()
    }


def floor(module: str) -> int:
    for i in range(len(FLOORS) - 1, 0, -1):
        if module == FLOORS[i] or module.startswith(f"{FLOORS[i]}."):
            return i
    return 0


def upward_imports(graph: dict[str, dict[str, bool]], allowed: set[tuple[str, str]]) -> list[str]:
    """Imports of a module from a floor above its own, but for the allowed ones made inside a function."""
    found = []
    for module, targets in sorted(graph.items()):
        for target, inner in sorted(targets.items()):
            if floor(target) > floor(module) and not ((module, target) in allowed and inner):
                where = "inside a function" if inner else "at import time"
                found.append(f"{module} ({FLOORS[floor(module)]}) imports {target} ({FLOORS[floor(target)]}), {where}")
    return found


def find_cycle(graph: dict[str, dict[str, bool]], allowed: set[frozenset[str]]) -> list[str] | None:
    """One circle of imports (its modules, the first repeated at the end), None if there is none.

    The imports between the two modules of an allowed pair are left out.
    """
    edges = {m: sorted(t for t in ts if frozenset({m, t}) not in allowed) for m, ts in graph.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in sorted(edges):
        if start in state:
            continue
        path, stack = [start], [iter(edges[start])]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            elif nxt not in state and nxt in edges:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(edges[nxt]))
    return None


def test_no_module_imports_from_a_floor_above():
    assert upward_imports(import_graph(), UPWARD_ALLOWED) == []


def test_no_import_cycles():
    cycle = find_cycle(import_graph(), CYCLE_ALLOWED)
    assert cycle is None, " -> ".join(cycle or [])


def test_the_graph_sees_imports_inside_functions():
    """The tests above could pass on a reader that missed imports: check some it must find, and how."""
    graph = import_graph()
    assert graph[f"{PLUGIN}.executor"][f"{RAY_RUNNER}.runner"] is True  # inside a function only
    assert graph[f"{RAY_RUNNER}.runner"][f"{PACKAGE}.patches.data_juicer"] is False  # at import time
    assert graph[f"{PACKAGE}.console"][f"{PACKAGE}.patches.loguru"] is True
    assert f"{PACKAGE}.patches" in graph[f"{PLUGIN}.front_door"]  # a package's __init__ counts as a module
    assert f"{PACKAGE}.patches" not in graph[f"{PACKAGE}.patches.ray"]  # its own package: left out
    assert floor(CLI) == 3 and floor(f"{RAY_RUNNER}.op_counts.hooks") == 2 and floor(f"{PACKAGE}.patches") == 0


def test_the_checks_catch_what_they_are_for():
    """A circle and an import up a floor, made up: the checks must name them, and the allow-lists only theirs."""
    core, door, runner = f"{PACKAGE}.patches.data_juicer", f"{PLUGIN}.front_door", f"{RAY_RUNNER}.op_counts.hooks"
    graph = {core: {door: True, runner: True}, door: {core: False}, runner: {core: False}}
    assert find_cycle(graph, set()) == [core, door, core]
    assert find_cycle(graph, {frozenset({core, door})}) == [core, runner, core]
    assert find_cycle({"a": {"b": False}, "b": {"c": True}, "c": {}}, set()) is None
    assert upward_imports(graph, set()) == [
        f"{core} (core) imports {door} ({PLUGIN}), inside a function",
        f"{core} (core) imports {runner} ({RAY_RUNNER}), inside a function",
    ]
    at_import_time = {f"{PLUGIN}.executor": {f"{RAY_RUNNER}.runner": False}}
    assert len(upward_imports(at_import_time, UPWARD_ALLOWED)) == 1  # allowed only inside a function


# --------------------------------------------------------------------------- the job dir's views read its store
# docs/OBJECT_STORE.md section 6 step 5: these modules read the job dir through ``JobDir.store`` (names, head,
# read), never by path, so they read an S3 job dir once it has one. Only their own calls are checked: what they
# reach through another module (``JobDir.done_ids``, ``ClaimStore.latest_attempts``, ``parquet_out``'s recipe read)
# is that module's step.
STORE_READERS = (f"{PACKAGE}.status", f"{PACKAGE}.report.collect", f"{PACKAGE}.merge")

# A call whose name ends in one of these reads the file system by path (os, os.path, pathlib, storage.files).
PATH_READS = frozenset(
    {
        *("lstat", "stat", "listdir", "scandir", "walk", "exists", "lexists", "isdir", "isfile", "getmtime"),
        *("getsize", "is_dir", "is_file", "iterdir", "glob", "rglob", "read_bytes", "read_text"),
        *("read_record", "read_json"),
    }
)

# (module, function, call) -> why it stays on a path.
TARGET = "the merge target: a local export path, not the job dir (an s3:// target goes through s3_export)"
PATH_READS_ALLOWED = {
    (f"{PACKAGE}.merge", "_check_target", "out.is_dir"): TARGET,
    (f"{PACKAGE}.merge", "_check_target", "os.path.lexists"): TARGET,
}


def path_reads(source: str) -> list[tuple[str, str]]:
    """(function, call) for each call in ``source`` named like a read by path (:data:`PATH_READS`); an import
    of such a name from ``os``, ``os.path`` or ``pathlib`` is one too (function ``import``)."""
    found = []

    def visit(node: ast.AST, func: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else func
            if isinstance(child, ast.Call) and ast.unparse(child.func).rpartition(".")[2] in PATH_READS:
                found.append((func, ast.unparse(child.func)))
            elif isinstance(child, ast.ImportFrom) and child.module in ("os", "os.path", "pathlib"):
                found.extend(("import", f"{child.module}.{a.name}") for a in child.names if a.name in PATH_READS)
            visit(child, inner)

    visit(ast.parse(source), "<module>")
    return found


def test_the_views_read_the_job_dir_through_its_store():
    sources = module_sources()
    found = {
        (module, func, call)
        for module in STORE_READERS
        for func, call in path_reads(sources[module][0].read_text(encoding="utf-8"))
    }
    assert sorted(found - PATH_READS_ALLOWED.keys()) == []
    assert sorted(PATH_READS_ALLOWED.keys() - found) == []  # an entry no longer needed goes


def test_the_path_read_check_sees_each_form():
    """The test above could pass on a reader that missed calls: the forms the views used before step 5."""
    source = """
import os
from os import listdir
from data_juicer_elastic.storage.files import read_record
def a(job):
    return os.lstat(job.claims_dir / "x"), os.path.exists(p), listdir(job.done_dir)
def b(job):
    with os.scandir(job.claims_dir) as it:
        return read_record(job.merge_record_path), job.manifest_path.exists(), job.store.head("x")
"""
    assert path_reads(source) == [
        ("import", "os.listdir"),
        ("a", "os.lstat"),
        ("a", "os.path.exists"),
        ("a", "listdir"),
        ("b", "os.scandir"),
        ("b", "read_record"),
        ("b", "job.manifest_path.exists"),
    ]
