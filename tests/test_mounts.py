"""Where a job dir may live (docs/OBJECT_STORE.md section 3): an object store behind FUSE is refused at start
(exit 2, naming the job dir, the mount and the s3:// form), as is a job dir given as a URL other than s3://; POSIX FUSE
file systems (JuiceFS, sshfs) and NFS pass. The mountinfo lines are the shapes each daemon writes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from data_juicer_elastic.storage.mounts import (
    MOUNTINFO_ENV,
    Mount,
    job_dir_problem,
    mount_of,
    parse_mountinfo,
)
from tests.jobs import REPO, env_with, make_job, tree_stats, worker_cmd

ROOT_LINE = "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw,errors=remount-ro"


def line(point: str, fstype: str, source: str, mount_id: int = 120) -> str:
    """One mountinfo line as the kernel writes it (optional fields, then ``-``, fstype, source, super options)."""
    return f"{mount_id} 22 0:{mount_id} / {point} rw,nosuid,nodev,relatime shared:66 - {fstype} {source} rw,user_id=0"


# (fstype, source as the daemon sets it, the daemon refused or None)
SAMPLES = [
    ("fuse.s3fs", "s3fs", "s3fs"),
    ("fuse", "s3fs#data", "s3fs"),  # an old fstab line: s3fs#bucket ... fuse
    ("fuse.ossfs", "ossfs", "ossfs"),
    ("fuse", "mountpoint-s3", "mountpoint-s3"),  # mountpoint-s3 sets no subtype
    ("fuse.mountpoint-s3", "mountpoint-s3", "mountpoint-s3"),
    ("fuse.gcsfuse", "data-bucket", "gcsfuse"),
    ("fuse.goofys", "data-bucket:jobs", "goofys"),
    ("fuse.geesefs", "data-bucket", "geesefs"),
    ("fuse.rclone", "remote:data-bucket", "rclone"),
    ("fuse", "blobfuse", "blobfuse"),
    ("fuse.blobfuse", "blobfuse", "blobfuse"),
    ("fuse", "blobfuse2", "blobfuse2"),
    ("fuse.blobfuse2", "blobfuse2", "blobfuse2"),
    ("fuse.juicefs", "JuiceFS:myjfs", None),
    ("fuse.sshfs", "user@host:/export", None),
    ("fuse.glusterfs", "server:/vol", None),
    ("nfs4", "server:/export", None),
    ("ceph", "10.0.0.1:6789:/", None),
    ("lustre", "10.0.0.2@tcp:/fs", None),
    ("ext4", "/dev/sdb1", None),
]


@pytest.mark.parametrize("fstype, source, daemon", SAMPLES)
def test_each_mount_kind_is_told_apart(fstype: str, source: str, daemon: str | None):
    mounts = parse_mountinfo(f"{ROOT_LINE}\n{line('/mnt/data', fstype, source)}\n")
    assert mounts[1] == Mount("/mnt/data", fstype, source)
    assert mounts[1].object_store == daemon
    assert mount_of("/mnt/data/jobs/run-1", mounts) == mounts[1]


def test_the_longest_mount_point_holds_the_path_and_a_later_mount_hides_an_earlier():
    text = "\n".join(
        [
            ROOT_LINE,
            line("/mnt", "nfs4", "server:/export", 30),
            line("/mnt/s3", "fuse.s3fs", "s3fs", 31),
            line("/mnt/s3/local", "ext4", "/dev/sdc1", 32),
            line("/mnt/over", "fuse.s3fs", "s3fs", 33),
            line("/mnt/over", "nfs4", "server:/over", 34),  # mounted on top: the one seen
        ]
    )
    mounts = parse_mountinfo(text)
    assert mount_of("/mnt/s3/jobs", mounts).fstype == "fuse.s3fs"
    assert mount_of("/mnt/s3", mounts).fstype == "fuse.s3fs"
    assert mount_of("/mnt/s3x/jobs", mounts).fstype == "nfs4"  # a prefix of the name, not of the path
    assert mount_of("/mnt/s3/local/jobs", mounts).fstype == "ext4"
    assert mount_of("/mnt/over/jobs", mounts).source == "server:/over"
    assert mount_of("/home/me", mounts).point == "/"


def test_escaped_spaces_and_optional_fields():
    text = (
        "40 22 0:50 / /mnt/my\\040bucket rw,relatime shared:7 master:3 - fuse.s3fs s3fs rw\n"
        "41 22 0:51 / /mnt/tab\\011and\\134slash rw,relatime - fuse.sshfs me@host:/my\\040dir rw\n"
        "not a mountinfo line\n"
    )
    mounts = parse_mountinfo(text)
    assert mounts == [
        Mount("/mnt/my bucket", "fuse.s3fs", "s3fs"),
        Mount("/mnt/tab\tand\\slash", "fuse.sshfs", "me@host:/my dir"),
    ]
    assert mount_of("/mnt/my bucket/jobs/run-1", mounts) == mounts[0]


def fake_mountinfo(tmp_path: Path, point: Path, fstype: str, source: str) -> Path:
    """A mountinfo file that puts ``point`` (made real) on the given mount, for DJ_ELASTIC_MOUNTINFO."""
    path = tmp_path / "mountinfo"
    path.write_text(f"{ROOT_LINE}\n{line(os.path.realpath(point).replace(' ', chr(92) + '040'), fstype, source)}\n")
    return path


def test_the_message_names_the_job_dir_the_mount_and_the_url_form(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    bucket = tmp_path / "gcs mount"
    monkeypatch.setenv(MOUNTINFO_ENV, str(fake_mountinfo(tmp_path, bucket, "fuse.gcsfuse", "data-bucket")))
    job_dir = str(bucket / "jobs" / "run-1")  # need not exist yet: the mount holding it decides
    problem = job_dir_problem(job_dir, "elastic_shard.job_dir")
    assert problem is not None
    assert f"elastic_shard.job_dir {job_dir} is on a fuse.gcsfuse mount" in problem
    assert os.path.realpath(bucket) in problem and "s3://data-bucket/jobs/run-1" in problem
    assert "Name the store itself instead: s3://data-bucket/jobs/run-1" in problem
    link = tmp_path / "link"
    link.symlink_to(bucket / "jobs", target_is_directory=True)
    assert job_dir_problem(str(link / "run-1"), "--job-dir") is not None  # the real path is what counts
    assert job_dir_problem(str(tmp_path / "elsewhere"), "--job-dir") is None
    monkeypatch.setenv(MOUNTINFO_ENV, str(fake_mountinfo(tmp_path, bucket, "fuse.juicefs", "JuiceFS:myjfs")))
    assert job_dir_problem(job_dir, "--job-dir") is None


@pytest.mark.parametrize("url", ["oss://bucket/jobs", "gs://bucket/jobs", "file:///x"])
def test_a_url_other_than_s3_is_refused_naming_the_s3_form(url: str):
    problem = job_dir_problem(url, "elastic_shard.job_dir")
    assert problem is not None and f"elastic_shard.job_dir {url!r} is a URL of a kind" in problem
    assert "s3://bucket/prefix" in problem


def test_an_s3_job_dir_is_taken_unless_its_url_is_malformed():
    assert job_dir_problem("s3://bucket/jobs/run-1", "--job-dir") is None
    assert job_dir_problem("S3://bucket/jobs/run-1/", "--job-dir") is None
    problem = job_dir_problem("s3://key:secret@bucket/jobs", "--job-dir")
    assert problem is not None and "holds credentials" in problem and "secret" not in problem


def run_cli(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, env=env_with(**env), capture_output=True, text=True, timeout=300)


def test_a_worker_on_an_object_store_mount_is_refused_before_it_touches_the_job(tmp_path: Path):
    """A prepared job under a (faked) ossfs mount: ``dj-elastic worker`` exits 2 naming the job dir, the mount
    and the URL form, and writes nothing; the same job under a JuiceFS mount is worked to the end."""
    job = make_job(tmp_path, rows=20, shards=2, job_dir=tmp_path / "oss" / "jobs" / "run-1")
    before = tree_stats(job.root)
    mountinfo = fake_mountinfo(tmp_path, tmp_path / "oss", "fuse.ossfs", "ossfs")
    out = run_cli(*worker_cmd(job, "copy", "--stop-when-idle"), cwd=REPO, **{MOUNTINFO_ENV: str(mountinfo)})
    assert out.returncode == 2, out.stdout + out.stderr[-3000:]
    message = out.stderr.strip().splitlines()[-1]
    assert message.startswith(f"dj-elastic worker: error: --job-dir {job.root} is on a fuse.ossfs mount"), message
    assert f"ossfs at {os.path.realpath(tmp_path / 'oss')}" in message
    assert "Name the store itself instead: s3://<bucket>/jobs/run-1" in message
    assert tree_stats(job.root) == before
    passing = fake_mountinfo(tmp_path, tmp_path / "oss", "fuse.juicefs", "JuiceFS:myjfs")
    out = run_cli(*worker_cmd(job, "copy"), cwd=REPO, **{MOUNTINFO_ENV: str(passing)})
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert len(list(job.done_dir.iterdir())) == 2


def test_the_cli_refuses_a_url_job_dir_other_than_s3_and_makes_no_folder(tmp_path: Path):
    """``gs://b/x`` is not read as the relative folder ``gs:/b/x``: each --job-dir command refuses it."""
    for command in ("status", "worker"):
        cli = (sys.executable, "-m", "data_juicer_elastic.cli", command)
        out = run_cli(*cli, "--job-dir", "gs://bucket/jobs/run-1", cwd=tmp_path)
        assert out.returncode == 2, out.stdout + out.stderr[-3000:]
        assert "--job-dir 'gs://bucket/jobs/run-1' is a URL of a kind" in out.stderr, out.stderr[-3000:]
    assert list(tmp_path.iterdir()) == []
