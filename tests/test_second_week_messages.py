"""Issue 37, "a user's second week": the refusals say what applies to them, and nothing else.

Data-Juicer's own ``init_configs`` in this process (as tests/test_plugin.py); nothing starts Ray.
"""

from __future__ import annotations

import pytest

from data_juicer_elastic.errors import UserError

from .test_plugin import REPO, parse, write_recipe  # noqa: F401 (parse: a fixture)

HINT = "shard-independent Mapper/Filter ops"


def refusal(tmp_path, parse, **change) -> str:  # noqa: F811
    recipe = {
        "dataset_path": str(REPO / "demos/data/text"),
        "export_path": str(tmp_path / "out.jsonl"),
        "executor_type": "elastic_shard",
        "elastic_shard": {"job_dir": str(tmp_path / "job")},
        "process": [{"whitespace_normalization_mapper": None}],
    }
    recipe.update(change)
    with pytest.raises(UserError) as exc:
        parse("--config", str(write_recipe(tmp_path / "r.yaml", **recipe)))
    return str(exc.value)


@pytest.mark.parametrize(
    "change, problem",
    [
        ({"process": [{"text_length_filter": {"min_lenn": 10}}]}, "min_lenn"),
        ({"process": [{"whitespace_normalisation_mapper": None}]}, "unknown operator"),
        ({"export_path": "/tmp/out.csv"}, "must be a file ending in .jsonl or .parquet"),
        ({"dataset_path": str(REPO / "setup.cfg")}, "is not JSONL"),
    ],
)
def test_typo_and_format_refusals_do_not_end_with_the_global_ops_line(tmp_path, parse, change, problem):  # noqa: F811
    message = refusal(tmp_path, parse, **change)
    assert problem in message
    assert HINT not in message, message
    assert "every op argument" not in message, message


def test_a_global_op_refusal_still_explains_shard_independence(tmp_path, parse):  # noqa: F811
    message = refusal(
        tmp_path, parse, process=[{"document_line_deduplicator": None}, {"text_length_filter": {"min_lenn": 10}}]
    )
    assert "process[0] document_line_deduplicator" in message and "min_lenn" in message
    assert message.rstrip().endswith(
        "(run other global ops: selection, grouping, aggregation, other dedups, in a separate executor_type ray job)."
    ), message


def test_an_edited_recipe_under_an_ended_run_id_gets_one_message_naming_the_way_out(tmp_path):
    from .cluster import Cluster, finish

    c = Cluster(tmp_path, rows=40, shards=4)
    assert finish([c.start_one("node-0", "--project", "alpha", run_id="sim-1")]) == [0]
    [again] = [c.start_one("node-1", "--project", "beta", run_id="sim-1")]
    assert finish([again]) == [2], again.output
    line = again.last_line()
    assert "FAIL: run sim-1 already ended (exit 0) with a different recipe" in line, again.output
    assert "'alpha'" in line and "'beta'" in line and "new run id" in line, line
    assert "reporting its recorded outcome" not in again.output, again.output
    assert "this process's recipe differs" not in again.output, again.output
    # the same recipe under the ended run id: the one line saying its outcome is replayed, then that outcome
    [same] = [c.start_one("node-2", "--project", "alpha", run_id="sim-1")]
    assert finish([same]) == [0], same.output
    assert "run sim-1 already ended (exit 0); reporting its recorded outcome" in same.output
    assert same.last_line().split("| ")[-1].startswith("PASS:"), same.output


NOISE_PROBE = """
import logging, sys
from loguru import logger
logger.remove()
logger.add(sys.stderr, level="INFO")  # as Data-Juicer sets its console and its log file up
logger.add(sys.argv[1], level="INFO")
import ray  # Ray's console handler
from data_juicer_elastic import console
console.install_story_console(sys.argv[2])
console.quiet_ray_console()  # as the runner does before ray.init
logging.getLogger("ray._private.authentication.authentication_token_setup").warning(
    "Token authentication is enabled for this Ray cluster. Set RAY_AUTH_MODE=disabled to opt out.")
logging.getLogger("ray._private.services").warning(
    "Found multiple active Ray instances: {'a:1', 'b:2'}. Connecting to latest cluster at b:2.")
logger.warning("No config file found in work directory: /j/dj-work/x")
with console.attempt_log(sys.argv[3]):
    for op in ("a_mapper", "b_filter"):
        logger.warning(f"Neither the required memory nor cpu of Op[{op}] is specified. We recommend ...")
logging.getLogger("ray.data").warning("a warning of Ray's that is news")
"""
NOISE = (
    "Token authentication is enabled",
    "Found multiple active Ray instances",
    "No config file found in work directory",
    "Neither the required memory nor cpu",
)


@pytest.mark.parametrize("mode", ["story", "full"])
def test_start_up_and_per_op_noise_goes_to_the_logs_in_story_mode(tmp_path, mode):
    import subprocess
    import sys

    from .jobs import env_with

    process_log, attempt_log = tmp_path / "process.log", tmp_path / "attempt.log"
    out = subprocess.run(
        [sys.executable, "-c", NOISE_PROBE, str(process_log), mode, str(attempt_log)],
        capture_output=True,
        text=True,
        env=env_with(),
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    console = out.stdout + out.stderr
    assert "a warning of Ray's that is news" in console, console
    if mode == "full":
        assert all(noise in console for noise in NOISE), console
        return
    assert not [noise for noise in NOISE if noise in console], console
    process, attempt = process_log.read_text(), attempt_log.read_text()
    assert all(noise in process for noise in NOISE[:3]), process
    assert attempt.count("Neither the required memory nor cpu") == 2, attempt


@pytest.mark.parametrize(
    "size, nodes, expected",
    [
        (2 << 20, None, 8),  # 2 MB, nodes unset: was 1
        (2 << 20, 3, 12),  # was 3: no slack at all
        (100 << 10, None, 1),  # too small to be worth splitting (each shard at least 64 KiB)
        (100 << 10, 3, 3),  # still one per node
        (3 << 30, 2, 12),  # one per 256 MiB wins over the floor
    ],
)
def test_auto_num_shards_gives_each_node_several_shards(tmp_path, monkeypatch, size, nodes, expected):
    from loguru import logger

    from data_juicer_elastic.plugin import executor

    monkeypatch.setattr(executor, "input_bytes", lambda *_: size)
    monkeypatch.setattr(executor, "parquet_row_groups", lambda *_: None)  # a JSONL input of that size
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), level="INFO", format="{message}")
    try:
        assert executor.auto_num_shards(str(tmp_path), nodes, None) == expected
    finally:
        logger.remove(sink)
    [line] = [x for x in lines if x.startswith("num_shards auto:")]
    assert f"num_shards auto: {expected} for" in line, line
