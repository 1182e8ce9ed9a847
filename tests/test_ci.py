""".ci/run and the shipped launch scripts: a lint finding stops CI, and every script at least parses.

CI runs ``.ci/run`` under ``set -euo pipefail``; these tests run its lint block
the same way, in a scratch folder holding one finding, and check that the
script stops there. The demos' launch scripts are run by people on clusters
this suite cannot reach, so each is checked as far as it can be here: shell
scripts with ``bash -n``, Python with ``compile``, YAML with ``safe_load``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .reference import REPO

CI_RUN = REPO / ".ci" / "run"
AFTER = "the-lines-after-the-block-ran"


def block(script: Path, name: str) -> str:
    """The lines of ``script`` between ``# >>> name`` and ``# <<< name``."""
    text = script.read_text()
    assert f"# >>> {name}\n" in text and f"# <<< {name}\n" in text, f"{script}: no '{name}' block"
    return text.split(f"# >>> {name}\n", 1)[1].split(f"# <<< {name}\n", 1)[0]


def run_lint_block(folder: Path) -> subprocess.CompletedProcess:
    """The lint block of .ci/run in ``folder``, as the script runs it, followed by a line that must not run
    when the block fails."""
    script = f"set -euo pipefail\n{block(CI_RUN, 'lint')}echo {AFTER}\n"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(["bash", "-c", script], cwd=folder, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    "source, finding",
    [("import os\n", "lint"), ('x = {  "a":1 }\n', "format")],
    ids=["lint", "format"],
)
def test_a_lint_or_format_finding_stops_ci(tmp_path, source, finding):
    (tmp_path / "pyproject.toml").write_text("[tool.ruff]\nline-length = 120\n")
    (tmp_path / "module.py").write_text(source)
    out = run_lint_block(tmp_path)
    assert out.returncode != 0 and AFTER not in out.stdout, f"a {finding} finding did not stop .ci/run:\n{out.stdout}"

    (tmp_path / "module.py").write_text('"""Clean."""\n\nX = {"a": 1}\n')
    out = run_lint_block(tmp_path)
    assert out.returncode == 0 and AFTER in out.stdout, out.stdout + out.stderr


def shell_scripts() -> list[Path]:
    """Every file under demos/, tests/device/ and .ci/ that a shell runs (by name or by its first line)."""
    found = []
    for folder in (REPO / "demos", REPO / "tests" / "device", REPO / ".ci"):
        for path in sorted(folder.rglob("*")):
            if not path.is_file() or "data" in path.relative_to(folder).parts:
                continue
            first = path.read_bytes()[:64].split(b"\n", 1)[0]
            if path.suffix in (".sh", ".sbatch") or (first.startswith(b"#!") and b"sh" in first.split(b"/")[-1]):
                found.append(path)
    return found


def test_the_launch_scripts_are_found():
    names = {p.relative_to(REPO).as_posix() for p in shell_scripts()}
    wanted = {"demos/pai_dlc/start.sh", "demos/mpijob/launcher.sh", "demos/slurm/elastic.sbatch"}
    assert wanted | {"demos/torchrun/run.sh", ".ci/run"} <= names, names


@pytest.mark.parametrize("script", shell_scripts(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_shell_script_parses(script):
    out = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"{script}: {out.stderr}"


def python_files() -> list[Path]:
    return sorted(p for folder in ("demos", "configs") for p in (REPO / folder).rglob("*.py"))


def yaml_files() -> list[Path]:
    return sorted(p for folder in ("demos", "configs") for p in (REPO / folder).rglob("*.yaml"))


@pytest.mark.parametrize("path", python_files() + yaml_files(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_shipped_python_compiles_and_yaml_loads(path):
    text = path.read_text()
    if path.suffix == ".py":
        compile(text, str(path), "exec")
    else:
        assert list(yaml.safe_load_all(text)), f"{path}: empty"


def test_every_test_has_a_hard_time_bound(pytestconfig):
    """README promises a hard time bound per test: pytest-timeout is active with a default from pyproject.toml."""
    assert pytestconfig.pluginmanager.hasplugin("timeout"), "pytest-timeout is not installed"
    assert 0 < float(pytestconfig.getini("timeout") or 0) <= 900, pytestconfig.getini("timeout")
