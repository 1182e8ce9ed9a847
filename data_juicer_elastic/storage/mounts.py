"""Where a job dir may live: a shared POSIX directory or an ``s3://`` URL, never on an object store behind FUSE
(docs/OBJECT_STORE.md s. 3).

Leases and done records rest on ``O_EXCL``, ``link``, ``rename`` and the file
server's mtime. A FUSE mount of a bucket (s3fs, ossfs, mountpoint-s3, gcsfuse,
goofys, ...) fakes them with separate requests, or not at all, so two workers
could both hold a shard. The mount holding a path is read from
``/proc/self/mountinfo``: the longest mount point that contains the path's
real path. JuiceFS, sshfs, NFS, CephFS and Lustre are real POSIX file systems
and pass; so does a system without mountinfo (not Linux), unchecked.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from urllib.parse import urlparse

from data_juicer_elastic.storage.urls import ObjectPath, is_s3, split_s3

MOUNTINFO = "/proc/self/mountinfo"
MOUNTINFO_ENV = "DJ_ELASTIC_MOUNTINFO"  # for tests only: another mountinfo file to read in place of MOUNTINFO
# FUSE daemons that put an object store behind a file system: the fstype's subtype (fuse.<name>), or the
# source of a plain ``fuse`` mount (mountpoint-s3 and blobfuse2 set no subtype; old fstab lines ``s3fs#bucket``)
OBJECT_STORE_FUSE = frozenset(
    ("s3fs", "ossfs", "mountpoint-s3", "gcsfuse", "goofys", "geesefs", "rclone", "blobfuse", "blobfuse2")
)
# daemons whose source field is the bucket itself (``bucket`` or ``bucket:prefix``)
_SOURCE_IS_BUCKET = frozenset(("gcsfuse", "goofys", "geesefs"))
_BUCKET = re.compile(r"[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]")
_ESCAPE = re.compile(r"\\([0-7]{3})")
POSIX_EXAMPLES = "NFS, CephFS, Lustre, JuiceFS, sshfs"


@dataclass(frozen=True)
class Mount:
    """One line of mountinfo: where, what kind, from what."""

    point: str
    fstype: str
    source: str

    @property
    def object_store(self) -> str | None:
        """The FUSE daemon's name when this mount is an object store behind FUSE, else None."""
        kind, _, subtype = self.fstype.partition(".")
        if kind not in ("fuse", "fuseblk"):
            return None
        name = subtype or self.source.partition("#")[0]
        return name if name in OBJECT_STORE_FUSE else None


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes (``\\040``)."""
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[Mount]:
    """Every mount of a mountinfo text, in its order (a later mount on the same point hides an earlier one).

    A line: ``id parent major:minor root point options [optional fields...] - fstype source super-options``.
    """
    mounts = []
    for line in text.splitlines():
        fields = line.split(" ")
        if "-" not in fields[6:]:
            continue  # not a mountinfo line
        dash = fields.index("-", 6)
        if len(fields) < dash + 3:
            continue
        mounts.append(Mount(_unescape(fields[4]), fields[dash + 1], _unescape(fields[dash + 2])))
    return mounts


def mount_of(path: str, mounts: list[Mount]) -> Mount | None:
    """The mount holding ``path`` (an absolute real path): the longest mount point containing it, the last
    listed of equals."""
    best: Mount | None = None
    for mount in mounts:
        point = mount.point.rstrip("/")
        if (path == mount.point or path.startswith(point + "/")) and (
            best is None or len(point) >= len(best.point.rstrip("/"))
        ):
            best = mount
    return best


def read_mounts() -> list[Mount]:
    """This process's mounts; none where there is no mountinfo to read."""
    try:
        with open(os.environ.get(MOUNTINFO_ENV) or MOUNTINFO, encoding="utf-8", errors="surrogateescape") as f:
            return parse_mountinfo(f.read())
    except OSError:
        return []


def is_url(path: str) -> bool:
    """``scheme://...`` or ``scheme:...``; a drive letter (``c:``) is not a scheme."""
    return len(urlparse(path).scheme) > 1


def job_dir_location(job_dir: str) -> str:
    """The one spelling of a job dir every process is given: ``s3://bucket/prefix`` (no trailing slash) or
    an absolute path (``os.path.abspath`` would take ``s3://b/x`` for the relative folder ``s3:/b/x``)."""
    return str(ObjectPath.of(job_dir)) if is_s3(job_dir) else os.path.abspath(job_dir)


def job_dir_problem(job_dir: str, key: str) -> str | None:
    """Why ``job_dir`` (given as ``key``: a recipe key or an option) cannot hold a job, or None."""
    if is_s3(job_dir):
        try:
            split_s3(job_dir)
        except ValueError as exc:
            return f"{key}: {exc}"
        return None
    if is_url(job_dir):
        return (
            f"{key} {job_dir!r} is a URL of a kind this version does not take as a job dir: name an object "
            "store by its S3 API, s3://bucket/prefix (OSS, GCS, MinIO: their S3 endpoint in AWS_ENDPOINT_URL), "
            f"or give a directory on a POSIX file system all nodes share ({POSIX_EXAMPLES})"
        )
    real = os.path.realpath(job_dir)
    mount = mount_of(real, read_mounts())
    daemon = mount.object_store if mount is not None else None
    if mount is None or daemon is None:
        return None
    return (
        f"{key} {job_dir} is on a {mount.fstype} mount ({mount.source} at {mount.point}): an object store "
        "behind FUSE does not keep the O_EXCL, link, rename and mtime semantics that leases and done records "
        f"rest on, so two workers could both hold a shard. Name the store itself instead: "
        f"{store_url(real, mount, daemon)} (its endpoint from AWS_ENDPOINT_URL), or put the job dir on a POSIX "
        f"file system all nodes share ({POSIX_EXAMPLES})"
    )


def store_url(real: str, mount: Mount, daemon: str) -> str:
    """The s3:// URL of the same keys, the bucket named where the mount's source names it."""
    bucket, prefix = "<bucket>", ""
    if daemon in _SOURCE_IS_BUCKET:
        name, _, under = mount.source.partition(":")
        if _BUCKET.fullmatch(name):
            bucket, prefix = name, under.strip("/")
    rel = os.path.relpath(real, mount.point)
    keys = "/".join(p for p in (prefix, "" if rel == "." else rel) if p)
    return f"s3://{bucket}/{keys}"
