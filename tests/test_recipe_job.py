"""`dj-elastic prepare --config` / `dj-elastic run --config`, and the README's demo command, for real.

``prepare`` runs in this process (``cli.main``, Data-Juicer's parser patched by the hook, as in a
``dj-elastic`` process): the parse-time refusals cost no interpreter start. The demo runs as the README
says, in real ``dj-process`` and ``dj-elastic`` processes, and its output is compared row by row with an
independent plain ``executor_type: ray`` run of the same recipe.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from data_juicer_elastic.cli import main as cli_main
from data_juicer_elastic.job.layout import JobDir

from .reference import (
    OFFLINE,
    REPO,
    SCRUBBED,
    assert_matches_reference,
    dj_process,
    env_with,
    input_ids,
    meanwhile,
    read_rows,
    run_reference,
)

DJ_ELASTIC = str(Path(sys.executable).parent / "dj-elastic")


def dj_elastic(*args: str, cwd: Path, timeout: int = 400) -> subprocess.CompletedProcess:
    return subprocess.run([DJ_ELASTIC, *args], cwd=cwd, env=env_with(), capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def demo(tmp_path: Path) -> Path:
    """The shipped demo recipe and data, copied so runs write under tmp_path, not the checkout."""
    shutil.copytree(REPO / "demos" / "data" / "text", tmp_path / "demos" / "data" / "text")
    (tmp_path / "configs").mkdir()
    shutil.copy(REPO / "configs" / "demo.yaml", tmp_path / "configs" / "demo.yaml")
    return tmp_path


@pytest.fixture
def prepare_here(demo: Path, monkeypatch, capsys):
    """``dj-elastic prepare ARGS`` in this process, from the demo folder: (exit code, stderr)."""
    monkeypatch.chdir(demo)
    for name in SCRUBBED:
        monkeypatch.delenv(name, raising=False)
    for key, value in OFFLINE.items():
        monkeypatch.setenv(key, value)

    def run(*args: str) -> tuple[int, str]:
        capsys.readouterr()
        try:
            code = cli_main(["prepare", *args])
        except SystemExit as exc:  # the parser refuses a value as jsonargparse does: exit 2
            code = exc.code
        return code, capsys.readouterr().err

    return run


def manifest(job: Path) -> dict:
    return json.loads((job / "manifest.json").read_text())


def test_prepare_takes_the_recipe_and_command_line_overrides(demo, prepare_here):
    job = demo / "elsewhere" / "job"
    args = (
        "--config",
        "configs/demo.yaml",
        "--job-dir",
        str(job),
        "--num-shards",
        "3",
        "--max-retries",
        "5",
        "--dataset-path",
        "demos/data/text/books.jsonl",
    )
    code, err = prepare_here(*args)
    assert code == 0, err[-3000:]
    m = manifest(job)
    assert len(m["shard_table"]["rows"]) == 3 and m["policy"]["max_retries"] == 5
    assert m["dataset_path"] == str(demo / "demos/data/text/books.jsonl") and m["total_rows"] == 120
    snapshot = yaml.safe_load(JobDir(job).recipe_path.read_text())
    assert snapshot["executor_type"] == "ray" and "elastic_shard" not in snapshot  # what each shard runs
    assert not (demo / "outputs").exists()  # prepare only writes the job dir

    code, err = prepare_here(*args)
    assert code == 0, err[-3000:]
    assert manifest(job) == m

    code, err = prepare_here(*args[:-4], "--num-shards", "4")
    assert code == 2
    assert "num_shards: 3 in job dir, 4 requested" in err
    assert manifest(job) == m


def test_prepare_refuses_a_global_op_a_typo_and_a_bad_value_writing_nothing(demo, prepare_here):
    recipe = yaml.safe_load((demo / "configs" / "demo.yaml").read_text())
    recipe["process"].append({"document_line_deduplicator": {}})
    (demo / "global.yaml").write_text(yaml.safe_dump(recipe))
    code, err = prepare_here("--config", "global.yaml")
    assert code == 2
    assert "document_line_deduplicator" in err
    assert not (demo / "outputs").exists()

    recipe = yaml.safe_load((demo / "configs" / "demo.yaml").read_text())
    recipe["process"].append({"text_length_filter": {"min_lenn": 5}})
    (demo / "typo.yaml").write_text(yaml.safe_dump(recipe))
    code, err = prepare_here("--config", "typo.yaml")
    assert code == 2 and f"process[{len(recipe['process']) - 1}] text_length_filter: Unknown parameter" in err, err
    assert "'min_lenn'" in err and "did you mean: min_len" in err, err
    assert not (demo / "outputs").exists()

    code, err = prepare_here("--config", "configs/demo.yaml", "--num-shards", "0")
    assert code == 2 and "num_shards" in err
    assert not (demo / "outputs").exists()


@pytest.mark.slow
def test_readme_demo_command_and_dj_elastic_run_agree(demo):
    """README's demo: `dj-process --config configs/demo.yaml`; `dj-elastic run` is the same job."""
    recipe = yaml.safe_load((demo / "configs" / "demo.yaml").read_text())
    recipe["export_path"] = "./outputs/again/demo.jsonl"
    recipe["elastic_shard"]["job_dir"] = "./outputs/again/job"
    (demo / "again.yaml").write_text(yaml.safe_dump(recipe))
    # three independent runs at once: the demo, `dj-elastic run` of the same recipe into its own job dir, and
    # one plain executor_type: ray run of the same recipe, this package switched off
    with (
        meanwhile(lambda: run_reference(demo / "configs" / "demo.yaml", demo / "ref", cwd=demo)) as reference,
        meanwhile(lambda: dj_elastic("run", "--config", "again.yaml", cwd=demo)) as again,
    ):
        out = dj_process("--config", "configs/demo.yaml", cwd=demo)
    assert out.returncode == 0, out.stderr[-5000:]
    assert "PASS: 4 shards completed by 1 host(s)" in out.stderr
    merged = (demo / "outputs" / "demo" / "demo.jsonl").read_bytes()
    assert 0 < merged.count(b"\n") < 400  # the filters drop some of the 400 rows
    # row for row what the plain ray run gives
    dataset = demo / yaml.safe_load((demo / "configs" / "demo.yaml").read_text())["dataset_path"]
    assert_matches_reference(
        read_rows(demo / "outputs" / "demo" / "demo.jsonl"), reference.result(), input_ids(dataset)
    )

    run = again.result()
    assert run.returncode == 0, run.stderr[-5000:]
    assert (demo / "outputs" / "again" / "demo.jsonl").read_bytes() == merged

    status = dj_elastic("status", "--job-dir", "outputs/again/job", "--json", cwd=demo)
    assert status.returncode == 0
    assert json.loads(status.stdout)["counts"]["done"] == 4
