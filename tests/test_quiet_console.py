"""The demo's console holds only story lines, on a local job dir and on an S3 one (a moto server).

On S3 each node printed botocore's ``Found credentials in environment variables.`` for every client it
made (10 of about 30 lines): Data-Juicer's ops call ``logging.basicConfig(level=INFO)`` at import, so every
library's INFO reached the console. Data-Juicer's ``dataset_path config is set`` line and Ray Data's
"Progress bars disabled" hint were on it too, each in a timestamp format of its own; both belong in the
node's log file.
"""

from __future__ import annotations

import gzip
import logging
import os
import re
import uuid
from pathlib import Path

import pytest
import yaml

from data_juicer_elastic import console

from .reference import REPO, dj_process, meanwhile

BUCKET = "dje-test"
STORY_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \| (INFO|WARNING|ERROR|SUCCESS) +\| \S")
HINTS = ("dataset_path config is set", "Progress bars disabled", "botocore", "Found credentials")


def demo_recipe(tmp: Path, job_dir: str) -> Path:
    recipe = yaml.safe_load((REPO / "configs" / "demo.yaml").read_text())
    recipe["dataset_path"] = str(REPO / "demos" / "data" / "text")
    recipe["export_path"] = str(tmp / "out" / "demo.jsonl")
    recipe["elastic_shard"]["job_dir"] = job_dir
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / "demo.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def story_only(out) -> list[str]:
    lines = (out.stdout + out.stderr).splitlines()
    assert out.returncode == 0, "\n".join(lines[-60:])
    assert [x for x in lines if not STORY_LINE.match(x)] == [], "\n".join(lines)
    assert not [x for x in lines if any(h in x for h in HINTS)], "\n".join(lines)
    assert "PASS:" in lines[-1], lines[-1]
    return lines


def node_log(job_dir: Path) -> str:
    """Data-Juicer's log files of the node (compressed at exit)."""
    texts = []
    for path in (job_dir / "dj-work").glob("*/logs/*"):
        data = path.read_bytes()
        texts.append((gzip.decompress(data) if path.suffix == ".gz" else data).decode(errors="replace"))
    return "".join(texts)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_demo_prints_only_story_lines_on_disk_and_on_s3(tmp_path: Path):
    pytest.importorskip("moto")
    from .s3server import s3_server
    from .test_dj_process_s3 import aws_env

    disk = demo_recipe(tmp_path / "disk", str(tmp_path / "disk" / "job"))
    s3 = demo_recipe(tmp_path / "s3", f"s3://{BUCKET}/jobs/{uuid.uuid4().hex[:12]}")
    with s3_server(BUCKET) as server, meanwhile(lambda: dj_process("--config", str(disk), cwd=disk.parent)) as on_disk:
        on_s3 = dj_process("--config", str(s3), cwd=s3.parent, env=aws_env(server))
        on_disk = on_disk.result()
    disk_lines, s3_lines = story_only(on_disk), story_only(on_s3)
    assert sum("store: s3://" in x for x in s3_lines) == 1  # the S3 run's one line more: the store it probed
    log = node_log(tmp_path / "disk" / "job")
    assert "dataset_path config is set" in log and "Progress bars disabled" in log  # kept, in the node's log
    print(f"console lines: {len(disk_lines)} on disk, {len(s3_lines)} on S3")


def test_library_loggers_are_at_warning_unless_someone_asked_for_more(monkeypatch: pytest.MonkeyPatch):
    for name in console.LIBRARY_LOGGERS:
        monkeypatch.setattr(logging.getLogger(name), "level", logging.NOTSET)
    monkeypatch.setattr(logging.getLogger("urllib3"), "level", logging.DEBUG)  # asked for
    monkeypatch.delenv(console.CONSOLE_ENV, raising=False)
    assert console.quiet_libraries("full") is False
    assert logging.getLogger("botocore").level == logging.NOTSET
    assert console.quiet_libraries("story") is True
    assert logging.getLogger("botocore.credentials").getEffectiveLevel() == logging.WARNING
    assert logging.getLogger("s3transfer").level == logging.WARNING
    assert logging.getLogger("urllib3").level == logging.DEBUG


def test_root_console_lines_go_to_the_log_not_the_console(monkeypatch: pytest.MonkeyPatch, capfd):
    """A library's INFO through a ``basicConfig`` handler on stderr: into loguru (the node's log files)."""
    from loguru import logger

    handler = logging.StreamHandler(os.fdopen(2, "w", closefd=False))
    handler.setFormatter(logging.Formatter("ROOT %(message)s"))
    monkeypatch.setattr(logging.getLogger(), "handlers", [handler])
    monkeypatch.setattr(logging.getLogger(), "level", logging.INFO)
    seen: list[str] = []
    sink = logger.add(lambda m: seen.append(str(m)), level="INFO", format="{name}: {message}")
    try:
        console.quiet_libraries("story")
        logging.getLogger("some.library").info("a hint nobody can act on")
        logging.getLogger("some.library").warning("a warning worth one line")
        handler.flush()
    finally:
        logger.remove(sink)
        handler.close()
    err = capfd.readouterr().err
    assert "ROOT a hint" not in err and "ROOT a warning worth one line" in err
    assert seen == ["some.library: a hint nobody can act on\n"]
