"""A folder export from a job dir on S3 to an s3:// prefix is copied by the store (docs/OBJECT_STORE.md step 11).

Every request the clients send is noted (a ``before-send`` hook on each S3 client made, as
tests/benchmarks/bench_s3_requests.py counts them): each part is one ``CopyObject`` (``UploadPartCopy`` ranges
above ``s3_export.COPY_LIMIT``), no output's body is read by this process, and the prefix holds byte for byte
what a local folder export of the same job holds. A killed export resumes (parts in place kept), a part of
other bytes is replaced, ``--overwrite`` deletes ``_SUCCESS`` before any part moves and creates it last.
"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest

from data_juicer_elastic import s3_export
from data_juicer_elastic.errors import UserError
from data_juicer_elastic.folder_export import SUCCESS
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.records.done import load_done
from data_juicer_elastic.merge import merge, verify
from data_juicer_elastic.storage import s3_upload
from data_juicer_elastic.storage.store import store_for
from data_juicer_elastic.worker.loop import run_worker

from .jobs import make_job
from .runners import copy
from .test_jobdir_s3 import mirror
from .test_store_contract import BUCKET, moto_env  # noqa: F401 (moto_env: the server, one per module)

SHARDS = 6


def _quiet(*_: object) -> None:
    pass


class Requests:
    """Every S3 request sent from now on, in order: (operation, key, headers)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sent: list[tuple[str, str, dict[str, str]]] = []

    def on_send(self, event_name: str, request: Any, **_: Any) -> None:
        key = unquote(urlsplit(request.url).path).removeprefix(f"/{BUCKET}/")
        with self.lock:
            headers = {k: v.decode() if isinstance(v, bytes) else v for k, v in request.headers.items()}
            self.sent.append((event_name.rsplit(".", 1)[-1], key, headers))

    def ops(self, op: str, under: str = "") -> list[tuple[str, dict[str, str]]]:
        return [(k, h) for o, k, h in self.sent if o == op and k.startswith(under)]

    def clear(self) -> None:
        self.sent.clear()


@pytest.fixture
def requests(monkeypatch: pytest.MonkeyPatch) -> Requests:
    import botocore.session

    seen, made = Requests(), botocore.session.Session.create_client

    def create_client(self: Any, *args: Any, **kwargs: Any) -> Any:
        client = made(self, *args, **kwargs)
        client.meta.events.register("before-send.s3", seen.on_send)
        return client

    monkeypatch.setattr(botocore.session.Session, "create_client", create_client)
    return seen


@pytest.fixture
def job_url(tmp_path: Path, moto_env, monkeypatch: pytest.MonkeyPatch, requests: Requests) -> str:  # noqa: F811
    """An S3 job dir, every shard done by the real worker loop (its attempts uploaded from scratch)."""
    local = make_job(tmp_path / "local", rows=120, shards=SHARDS)
    url, _ = mirror(local, monkeypatch, moto_env)
    assert run_worker(JobDir(url), copy, host="node-a", log=_quiet).exit_code == 0
    return url


def _prefix(url: str) -> dict[str, bytes]:
    store = store_for(url)
    return {e.key: store.read(e.key)[0] for e in store.list("")}  # type: ignore[index]


def _outputs(url: str) -> list[str]:
    """The full keys of the job's attempt outputs (what must never be read here)."""
    job = JobDir(url)
    prefix = url.removeprefix(f"s3://{BUCKET}/")
    return [f"{prefix}/{job.key(r.output_path(job))}" for r in (load_done(job, s) for s in job.done_ids()) if r]


def test_the_parts_are_copied_by_the_store_and_equal_a_local_export(tmp_path, job_url, requests) -> None:
    merge(JobDir(job_url), f"{tmp_path / 'local-parts'}/", log=_quiet)
    want = {p.name: p.read_bytes() for p in (tmp_path / "local-parts").iterdir()}
    assert len(want) == SHARDS + 1
    out = f"{job_url}-export/parts"
    dest = out.removeprefix(f"s3://{BUCKET}/") + "/"
    outputs = _outputs(job_url)

    requests.clear()
    done = merge(JobDir(job_url), f"{out}/", log=_quiet)
    copies = requests.ops("CopyObject", dest)
    assert len(copies) == SHARDS and done.rows == 120
    for _, headers in copies:
        assert headers.get("If-None-Match") == "*" and headers.get("x-amz-copy-source-if-match")
    read = {k for op, k, _ in requests.sent if op == "GetObject"}
    assert not read & set(outputs), "an output's body came through this process"
    assert not requests.ops("UploadPart") and [k for k, _ in requests.ops("PutObject", dest)] == [dest + SUCCESS]
    assert _prefix(out) == want  # the parts and _SUCCESS, byte for byte
    assert verify(JobDir(job_url)).ok

    # a killed export (no _SUCCESS, a part missing, one of other bytes) resumes: one copy each, the rest kept
    store = store_for(out)
    names = sorted(n for n in want if n != SUCCESS)
    assert store.delete(SUCCESS) and store.delete(names[0])
    assert store.replace(names[1], b"other bytes\n") is not None
    requests.clear()
    merge(JobDir(job_url), f"{out}/", log=_quiet)
    assert sorted(k for k, _ in requests.ops("CopyObject", dest)) == [dest + names[0], dest + names[1]]
    assert requests.ops("CopyObject", dest + names[1])[0][1].get("If-Match")  # replaced only if still that one
    assert _prefix(out) == want

    # another export there: refused without --overwrite; with it, _SUCCESS goes first and comes back last
    assert store.replace(SUCCESS, want[SUCCESS].replace(b'"rows"', b'"rows" ', 1)) is not None
    with pytest.raises(UserError, match="holds a complete export"):
        merge(JobDir(job_url), f"{out}/", log=_quiet)
    assert store.delete(names[2])
    requests.clear()
    merge(JobDir(job_url), f"{out}/", overwrite=True, log=_quiet)
    order = [
        (op, k)
        for op, k, _ in requests.sent
        if k.startswith(dest) and op in ("CopyObject", "PutObject", "DeleteObject")
    ]
    assert order == [("DeleteObject", dest + SUCCESS), ("CopyObject", dest + names[2]), ("PutObject", dest + SUCCESS)]
    assert _prefix(out) == want


def test_a_part_over_the_copy_limit_is_copied_in_ranges(job_url, requests, monkeypatch) -> None:
    monkeypatch.setattr(s3_export, "COPY_LIMIT", 0)  # every part: multipart, UploadPartCopy
    out = f"{job_url}-ranged"
    dest = out.removeprefix(f"s3://{BUCKET}/") + "/"
    requests.clear()
    merge(JobDir(job_url), f"{out}/", log=_quiet)
    assert not requests.ops("CopyObject") and len(requests.ops("UploadPartCopy", dest)) == SHARDS
    assert len(requests.ops("CompleteMultipartUpload", dest)) == SHARDS
    assert not {k for op, k, _ in requests.sent if op == "GetObject"} & set(_outputs(job_url))
    assert verify(JobDir(job_url)).ok  # every part re-read against _SUCCESS and merge.json

    # an object in several ranges (5 MiB parts, the smallest S3 takes but the last), bytes and metadata kept
    monkeypatch.setattr(s3_upload, "PART_SIZE", s3_upload.MIN_PART)
    src, dst = store_for(f"{job_url}-big"), store_for(f"{job_url}-big-out")
    data = uuid.uuid4().bytes * (s3_upload.MIN_PART // 16) + b"tail\n"
    meta = src.create("part-00000-of-00001.jsonl", data)
    assert meta is not None
    copy = {"Bucket": BUCKET, "Key": dst._full("part-00000-of-00001.jsonl"), "MetadataDirective": "REPLACE"}
    copy |= {"Metadata": {s3_upload.SHA_META: "x"}, "IfNoneMatch": "*", "CopySourceIfMatch": meta.ver}
    copy |= {"CopySource": {"Bucket": BUCKET, "Key": src._full("part-00000-of-00001.jsonl")}}
    requests.clear()
    s3_export._copy_ranges(dst, "part-00000-of-00001.jsonl", copy, len(data))
    spans = sorted(h["x-amz-copy-source-range"] for _, h in requests.ops("UploadPartCopy"))
    assert spans == [f"bytes=0-{s3_upload.MIN_PART - 1}", f"bytes={s3_upload.MIN_PART}-{len(data) - 1}"]
    assert dst.read("part-00000-of-00001.jsonl")[0] == data  # type: ignore[index]
    assert s3_upload.sha256_of(dst, "part-00000-of-00001.jsonl") == (len(data), "x")
