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
        ({"export_path": "/tmp/out.parquet"}, "must be a local file ending in .jsonl"),
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
        tmp_path, parse, process=[{"document_deduplicator": None}, {"text_length_filter": {"min_lenn": 10}}]
    )
    assert "process[0] document_deduplicator" in message and "min_lenn" in message
    assert message.rstrip().endswith(
        "run global ops: dedup, selection, grouping, aggregation, in a separate executor_type ray job)."
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
