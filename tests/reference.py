"""Real ``dj-process`` runs and the row-by-row comparison with a reference run.

The reference is computed independently of the code under test: the user's
own recipe file, with ``executor_type: ray`` and the ``elastic_shard`` block
dropped, run by stock Data-Juicer with this package switched off
(``DJ_ELASTIC_DISABLE=1``) over the original input. The comparison allows
only DESIGN.md invariant 6's exceptions: a key null on one side and absent
on the other, media paths made absolute, ``index_key`` holding the global
row index.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import yaml

from data_juicer_elastic.coordination import run_id as coord

REPO = Path(__file__).resolve().parent.parent
# Nothing may be downloaded: no models, no datasets, no packages through Data-Juicer's lazy installer.
OFFLINE = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "PIP_NO_INDEX": "1",
    "UV_OFFLINE": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
    "PYTHONUNBUFFERED": "1",
}
DJ_PROCESS = str(Path(os.environ.get("VIRTUAL_ENV", Path(sys.executable).parent.parent)) / "bin" / "dj-process")
# Variables a test's child process must not inherit: they would switch the plugin off, point Ray elsewhere, or
# make a lone process look like one rank of a launcher's job (whose run id it would then take).
SCRUBBED = (
    "DJ_ELASTIC_DISABLE",
    "RAY_JOB",
    "RAY_ADDRESS",
    "SLURM_STEP_ID",
    coord.RUN_ID_ENV,
    *coord.LAUNCHER_RUN_ID_ENVS,
    *coord.WORLD_SIZE_ENVS,
    *coord.LOCAL_RANK_ENVS,
)


def env_with(*, repo_on_path: bool = True, **extra: str) -> dict[str, str]:
    """The environment of every process a test starts: scrubbed, offline, then ``extra``.

    ``repo_on_path`` puts this checkout first on PYTHONPATH (so ``tests.runners`` imports); the device check
    leaves it off so that the installed wheel is the code it measures.
    """
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED}
    if repo_on_path:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.update(OFFLINE, **extra)
    return env


def dj_process(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: int = 400
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [DJ_PROCESS, *args], cwd=cwd, env=env_with(**(env or {})), capture_output=True, text=True, timeout=timeout
    )


T = TypeVar("T")


@contextmanager
def meanwhile(call: Callable[[], T]) -> Iterator[Future[T]]:
    """``call`` on a thread of its own while the block runs: for a run that needs nothing of the block's runs
    (a reference run reads the input, not the job). Each run is a process that mostly waits on its imports and
    its Ray start, so two overlap instead of queueing. Read ``.result()`` for its value or its exception;
    leaving the block waits for it.
    """
    with ThreadPoolExecutor(1) as pool:
        yield pool.submit(call)


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def read_rows(path: Path) -> list[dict]:
    """A JSONL file, or Ray's folder of part files."""
    files = sorted(p for p in path.iterdir() if not p.name.startswith(".")) if path.is_dir() else [path]
    return [json.loads(line) for f in files for line in f.read_text().splitlines() if line.strip()]


def input_ids(root: Path) -> list[int]:
    """Ids in input order: files by relative path, lines in file order."""
    files = [root] if root.is_file() else sorted(root.rglob("*.jsonl"), key=lambda p: p.relative_to(root).as_posix())
    return [json.loads(line)["id"] for f in files for line in f.read_text().splitlines()]


def differences(a: Any, b: Any, where: str = "$") -> list[str]:
    """Value and type differences, where a key null on one side and absent on the other counts as equal.

    Types count: ``1``, ``1.0`` and ``True`` are equal to Python's ``==`` but are three different JSON
    values (DESIGN.md invariant 13: a row's values do not depend on the shard it fell in).
    """
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                present = b.get(key) if key not in a else a.get(key)
                if present is not None:
                    out.append(f"{where}.{key}: only on one side ({present!r})")
            else:
                out += differences(a[key], b[key], f"{where}.{key}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in differences(x, y, f"{where}[{i}]")]
    if type(a) is not type(b):
        return [f"{where}: {a!r} ({type(a).__name__}) != {b!r} ({type(b).__name__})"]
    return [] if a == b else [f"{where}: {a!r} != {b!r}"]


def assert_matches_reference(
    merged: list[dict], reference: list[dict], input_ids: list[int], index_key: str | None = None
) -> None:
    position = {row_id: i for i, row_id in enumerate(input_ids)}
    merged_ids = [r["id"] for r in merged]
    assert merged_ids == sorted(merged_ids, key=position.__getitem__), "merged output is not in input order"
    by_id = {r["id"]: r for r in reference}
    assert len(by_id) == len(reference) and set(merged_ids) == set(by_id), (
        f"rows differ: only merged {sorted(set(merged_ids) - set(by_id))[:10]}, "
        f"only reference {sorted(set(by_id) - set(merged_ids))[:10]}"
    )
    assert len(merged_ids) == len(set(merged_ids)), "a row was merged twice"
    problems = []
    for row in merged:
        row = dict(row)
        if index_key:
            assert row.pop(index_key) == position[row["id"]], f"{index_key} of id {row['id']} is not its row index"
        problems += differences(row, by_id[row["id"]], f"id={row['id']}")
    assert not problems, problems[:20]


def elastic_recipe(path: Path, dataset: Path, export: Path, job: Path, process: list, **extra: Any) -> Path:
    """A user's ``executor_type: elastic_shard`` recipe file: 4 shards, no retries, short test timeouts."""
    recipe = {
        "project_name": path.stem,
        "dataset_path": str(dataset),
        "export_path": str(export),
        "np": 2,
        "executor_type": "elastic_shard",
        "elastic_shard": {
            "job_dir": str(job),
            "num_shards": 4,
            "max_retries": 0,
            "heartbeat_secs": 2.0,
            "lock_timeout_secs": 60.0,
            "poll_interval_secs": 0.5,
            "wait_timeout_secs": 120.0,
        },
        "process": process,
        **extra,
    }
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def exploding_recipe(tmp_path: Path) -> Path:
    """40 rows through ``dje_test_exploding_mapper`` (tests/ops/exploding_ops.py), which raises on row 7 every
    time, with ``skip_op_error: false``: the shard holding it fails on each attempt."""
    data = tmp_path / "data.jsonl"
    write_jsonl(data, [{"id": i, "text": f"text {i}"} for i in range(40)])
    return elastic_recipe(
        tmp_path / "fail.yaml",
        data,
        tmp_path / "out" / "merged.jsonl",
        tmp_path / "job",
        process=[{"dje_test_exploding_mapper": None}],
        skip_op_error=False,
        custom_operator_paths=[str(REPO / "tests" / "ops" / "exploding_ops.py")],
    )


def run_elastic(config: Path, cwd: Path, *overrides: str) -> subprocess.CompletedProcess:
    """``dj-process --config`` of an elastic recipe, which must pass."""
    out = dj_process("--config", str(config), *overrides, cwd=cwd)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    assert "PASS:" in out.stderr + out.stdout
    return out


def reference_recipe(user_recipe: Path, out_dir: Path, dataset_path: Path | None = None) -> Path:
    """The user's own recipe file as a plain ``executor_type: ray`` run writing into ``out_dir``."""
    recipe = yaml.safe_load(user_recipe.read_text())
    recipe.pop("elastic_shard", None)
    recipe.update(executor_type="ray", export_path=str(out_dir / "reference.jsonl"), ray_address="local")
    if dataset_path is not None:
        recipe["dataset_path"] = str(dataset_path)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "reference.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def run_reference(
    user_recipe: Path,
    out_dir: Path,
    *,
    cwd: Path,
    dataset_path: Path | None = None,
    overrides: tuple[str, ...] = (),
    plugin: bool = False,
) -> list[dict]:
    """Rows of one ``executor_type: ray`` run of the user's recipe and the user's command-line op overrides.

    This package is switched off unless ``plugin``: the reference owes it nothing.
    """
    config = reference_recipe(user_recipe, out_dir, dataset_path)
    env = {} if plugin else {"DJ_ELASTIC_DISABLE": "1"}
    out = dj_process("--config", str(config), *overrides, cwd=cwd, env=env)
    assert out.returncode == 0, f"reference run of {config} failed:\n{out.stderr[-5000:]}"
    return read_rows(out_dir / "reference.jsonl")
