"""The lease protocol's last holes (issue 43): each test fails on the code before its fix.

Real servers only (moto in its own process, tests/s3server.py); no test times anything.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from data_juicer_elastic.job.claims import ClaimStore
from data_juicer_elastic.job.layout import JobDir

from .jobs import make_job
from .s3server import s3_server
from .test_jobdir_s3 import mirror
from .test_store_contract import BUCKET


@pytest.fixture(scope="module")
def moto_env() -> Iterator[dict[str, str]]:
    with s3_server(BUCKET) as env:
        yield env


def s3_job(tmp_path, monkeypatch, env) -> JobDir:
    url, _ = mirror(make_job(tmp_path, rows=4, shards=1), monkeypatch, env)
    return JobDir(url)


def test_a_lease_renewed_1_2_s_ago_on_whole_second_stamps_is_live_at_a_2_s_timeout(tmp_path, moto_env, monkeypatch):
    """Renewed at 100.9, read at 102.1: S3 says Last-Modified 100, Date 102, an age of 2 for 1.2 s. Stale only
    past the timeout plus the store's 1 s resolution: at Date 103 (at least 2.1 s) it is."""
    job = s3_job(tmp_path, monkeypatch, moto_env)
    claims = ClaimStore(job, lock_timeout=2.0, host="node-a")
    sid = job.manifest().shards[0].id
    assert claims.try_claim(sid, 0) is not None
    real_head = claims.store.head
    stamps = {"modified": 100.0, "clock": 102.0}

    def whole_seconds(key: str, now: float | None = None):
        meta = real_head(key, now)
        return None if meta is None else dataclasses.replace(meta, **stamps)

    monkeypatch.setattr(claims.store, "head", whole_seconds)
    assert claims.is_live(sid, 1, 102.0)
    stamps["clock"] = 103.0
    assert not claims.is_live(sid, 1, 103.0)
