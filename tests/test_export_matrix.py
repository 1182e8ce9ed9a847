"""Every export from every job dir (issue 36): job dir {local, S3} x export {local file, local folder, s3://
object, s3:// folder} x format {jsonl, parquet}, on the moto server and on Ceph RGW (tests/rgw.py).

One small job per job-dir kind and format, worked once by the real worker loop and reused by every export.
Each cell must hold byte for byte what the local job exported to a local path holds (a folder: every part and
``_SUCCESS``), ``verify`` must find it intact, and a second merge without ``--overwrite`` must do what it does
locally: a file (this job's own) is replaced, a complete folder of the same outputs is left as it is.
The Parquet job's parts do not share one schema (``score`` null in one shard, missing in another), so a
folder export rewrites two parts with the unified schema and takes the third as it is (on S3 to S3: copied
by the store).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.json as pj
import pytest

from data_juicer_elastic import s3_export
from data_juicer_elastic.errors import UserError
from data_juicer_elastic.folder_export import SUCCESS
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.merge import merge, merged_already, verify
from data_juicer_elastic.parquet_out import write_shard_parquet
from data_juicer_elastic.storage.store import store_for
from data_juicer_elastic.worker.loop import run_worker

from . import runners
from .jobs import RECIPE, make_job
from .s3server import use_env
from .test_export_through_store import PARQUET_RECIPE
from .test_folder_export_s3_copy import Requests, _prefix, requests  # noqa: F401 (requests: a fixture)
from .test_jobdir_s3 import mirror
from .test_store_contract import BUCKET, moto_env  # noqa: F401 (moto_env: the server, one per module)

SHARDS, ROWS = 3, 30
SCORES = {0: None, 1: 0.25}  # by shard index: a null-typed column, a double one, and none in the last shard
EXPORTS = ("file", "folder", "s3-file", "s3-folder")
Tree = bytes | dict[str, bytes]


def _quiet(*_: object) -> None:
    pass


def scored_copy(shard_path: str, output_path: str, job_dir: str) -> None:
    """Identity, with a Parquet output beside it whose ``score`` column differs by shard (``SCORES``)."""
    runners.copy(shard_path, output_path, job_dir)
    table = pj.read_json(output_path)
    index = int(Path(shard_path).name.split("-")[1])
    if index in SCORES:
        table = table.append_column("score", pa.array([SCORES[index]] * table.num_rows))
    write_shard_parquet(table, Path(output_path).parent, None)


class Jobs:
    """The module's jobs, made on first use: ``(kind, fmt)`` -> job dir (a path, or an s3:// URL)."""

    def __init__(self, tmp: Path, env: dict[str, str], patch: pytest.MonkeyPatch) -> None:
        self.tmp, self.env, self.patch = tmp, env, patch
        self.made: dict[tuple[str, str], str] = {}
        self.wanted: dict[tuple[str, str], Tree] = {}

    def job(self, kind: str, fmt: str) -> str:
        if (kind, fmt) not in self.made:
            recipe, runner = (PARQUET_RECIPE, scored_copy) if fmt == "parquet" else (RECIPE, runners.copy)
            local = make_job(self.tmp / f"{kind}-{fmt}", rows=ROWS, shards=SHARDS, recipe=recipe)
            where = mirror(local, self.patch, self.env)[0] if kind == "s3" else str(local.root)
            result = run_worker(JobDir(where), runner, host="node-a", log=_quiet)
            assert result.exit_code == 0 and result.job_complete, result
            self.made[kind, fmt] = where
        return self.made[kind, fmt]

    def want(self, export: str, fmt: str) -> Tree:
        """What the local job exported to a local path holds (``export``: file or folder)."""
        shape = export.removeprefix("s3-")
        if (shape, fmt) not in self.wanted:
            out = self.output("local", shape, fmt, "reference")
            merge(JobDir(self.job("local", fmt)), out, log=_quiet)
            self.wanted[shape, fmt] = read_tree(out)
        return self.wanted[shape, fmt]

    def output(self, kind: str, export: str, fmt: str, name: str = "out") -> str:
        """A fresh output of ``export``'s kind for the job of ``kind``."""
        base = f"s3://{BUCKET}/exports/{uuid.uuid4().hex[:12]}" if export.startswith("s3-") else str(self.tmp / name)
        where = f"{base}/{kind}-{export}-{fmt}"
        return f"{where}/" if export.endswith("folder") else f"{where}.{fmt}"


def read_tree(output: str) -> Tree:
    """An export's bytes: the file's, or a folder's by name."""
    folder = output.endswith("/")
    if s3_export.is_s3(output):
        url = s3_export.location(output)
        if folder:
            return _prefix(url)
        found = store_for(os.path.dirname(url)).read(os.path.basename(url))
        assert found is not None, url
        return found[0]
    if folder:
        return {p.name: p.read_bytes() for p in sorted(Path(output).iterdir())}
    return Path(output).read_bytes()


def stamp(output: str) -> dict | None:
    """What stands for the export (``merged_already``'s stamp): a folder's ``_SUCCESS``, or the file."""
    folder = output.endswith("/")
    if s3_export.is_s3(output):
        return s3_export.stamp_of(s3_export.location(output), folder)
    st = os.stat(os.path.join(output, SUCCESS) if folder else output)
    return {"ino": st.st_ino, "mtime_ns": st.st_mtime_ns, "size": st.st_size}


@pytest.fixture(scope="module", params=["moto", "rgw"])
def jobs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jobs]:
    """The module's jobs on each S3 server: moto, and Ceph RGW (``rgw_env``, tests/conftest.py)."""
    env = request.getfixturevalue(f"{request.param}_env")
    with pytest.MonkeyPatch.context() as patch:
        use_env(patch, env)
        yield Jobs(tmp_path_factory.mktemp(f"matrix-{request.param}"), env, patch)


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
@pytest.mark.parametrize("export", EXPORTS)
@pytest.mark.parametrize("kind", ["local", "s3"])
def test_every_export_from_every_job_dir_holds_what_the_local_export_holds(
    jobs: Jobs, kind: str, export: str, fmt: str
) -> None:
    want = jobs.want(export, fmt)
    job, out = jobs.job(kind, fmt), jobs.output(kind, export, fmt)
    done = merge(JobDir(job), out, log=_quiet)
    assert done.rows == ROWS and done.shards == SHARDS
    assert read_tree(out) == want
    report = verify(JobDir(job))
    assert report.ok and report.problems == [], report.problems
    assert merged_already(JobDir(job), out) is not None

    before, said = stamp(out), []
    merge(JobDir(job), out, log=said.append)
    if export.endswith("folder"):  # a complete folder of these outputs: left as it is
        assert stamp(out) == before and read_tree(out) == want
    else:  # this job dir's own output: replaced, saying so (export_target)
        assert "replacing this generation's earlier merge" in said[0] and read_tree(out) == want


def test_a_parquet_folder_from_s3_to_s3_copies_parts_of_the_unified_schema(
    jobs: Jobs,
    requests: Requests,  # noqa: F811
) -> None:
    """Parts whose schema is already the unified one are copied by the store; the others are rewritten in
    node-local scratch and uploaded; ``_SUCCESS`` last."""
    job, out = jobs.job("s3", "parquet"), jobs.output("s3", "s3-folder", "parquet")
    dest = s3_export.location(out).removeprefix(f"s3://{BUCKET}/") + "/"
    requests.clear()
    merge(JobDir(job), out, log=_quiet)
    copied = sorted(k.removeprefix(dest) for k, _ in requests.ops("CopyObject", dest))
    assert copied == [f"part-00001-of-0000{SHARDS}.parquet"]
    written = [k.removeprefix(dest) for k, _ in requests.ops("PutObject", dest)]
    assert written[-1] == SUCCESS and len(written) + len(requests.ops("CreateMultipartUpload", dest)) == 3
    want = jobs.want("folder", "parquet")
    assert read_tree(out) == want

    # killed before _SUCCESS, a rewritten part lost: that part alone is rewritten and put, the rest kept
    store = store_for(s3_export.location(out))
    assert store.delete(SUCCESS) and store.delete(f"part-00000-of-0000{SHARDS}.parquet")
    requests.clear()
    merge(JobDir(job), out, log=_quiet)
    put = [(op, k.removeprefix(dest)) for op, k, _ in requests.sent if op in ("PutObject", "CopyObject") and dest in k]
    assert put == [("PutObject", f"part-00000-of-0000{SHARDS}.parquet"), ("PutObject", SUCCESS)]
    assert read_tree(out) == want


def test_a_parquet_object_already_there_is_refused_before_an_output_is_read(
    jobs: Jobs,
    requests: Requests,  # noqa: F811
) -> None:
    """As a local merge refuses before it reads anything: no output fetched, nothing written in scratch."""
    job = jobs.job("s3", "parquet")
    out = jobs.output("s3", "s3-object", "parquet")
    merge(JobDir(job), out, log=_quiet)
    url = s3_export.location(out)
    store_for(os.path.dirname(url)).replace(os.path.basename(url), b"someone else's\n")  # no merge of this job's
    requests.clear()
    with pytest.raises(UserError, match="already exists and no merge of this job dir wrote it"):
        merge(JobDir(job), out, log=_quiet)
    read = [k for k, _ in requests.ops("GetObject") if k.endswith(".parquet")]
    assert read == [] and requests.ops("CreateMultipartUpload") == [], requests.sent
