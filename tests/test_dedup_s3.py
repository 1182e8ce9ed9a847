"""The dedup recipe of tests/test_dedup_job.py with its job dir on S3 (a moto server), input and export local: two
``dj-process`` nodes, one killed -9 inside a bucket unit and restarted (tests/test_dedup_kill.py), export what
Data-Juicer's default executor exports on the whole input, row for row; every stage unit's outputs and done
records are objects of the bucket, none under the local folder."""

from __future__ import annotations

import uuid

import pytest
import yaml

from data_juicer_elastic.storage.store import store_for
from tests.s3server import use_env
from tests.test_dedup_job import check, elastic_config
from tests.test_dedup_kill import check_taken_over, dataset, killed_in_unit_and_restarted  # noqa: F401 (fixture)
from tests.test_dj_process_s3 import aws_env
from tests.test_store_contract import BUCKET, moto_env  # noqa: F401 (the moto server, one per module)

pytest.importorskip("moto")
pytestmark = pytest.mark.slow


def test_on_an_s3_job_dir_a_node_killed_in_a_bucket_equals_the_default_executor(
    tmp_path,
    dataset,  # noqa: F811
    moto_env,  # noqa: F811
    monkeypatch,
):
    path, rows, want = dataset
    url = f"s3://{BUCKET}/jobs/{uuid.uuid4().hex[:12]}"
    config = elastic_config(tmp_path, path)
    body = yaml.safe_load(config.read_text())
    body["elastic_shard"]["job_dir"] = url
    config.write_text(yaml.safe_dump(body, sort_keys=False))
    killed_in_unit_and_restarted(tmp_path, config, "d0-bucket-00001", **aws_env(moto_env))
    check(tmp_path, rows, want)
    assert not (tmp_path / "job").exists()
    use_env(monkeypatch, moto_env)
    store = store_for(url)
    check_taken_over(store, "d0-bucket-00001")
    assert any("/dedup/1/join/" in e.key for e in store.list("generations"))
