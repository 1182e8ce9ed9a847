"""The S3 server a benchmark runs on, by name: ``moto`` (tests/s3server.py) or ``rgw`` (tests/rgw.py).

Shared by bench_s3_requests.py (``--server``) and bench_end_to_end.py (``--s3 --server``), so that a server
is started one way only. Not collected by pytest.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

KINDS = ("moto", "rgw")
# how each server's processes show in /proc: moto's python's command line, or Ceph's daemons' names
_MARKS = {"moto": (b"tests.s3server",), "rgw": (b"ceph-mon", b"ceph-osd", b"radosgw")}


def serving(kind: str, bucket: str, latency_ms: float = 0.0) -> contextlib.AbstractContextManager[dict[str, str]]:
    """Start the server ``kind`` with ``bucket`` created; the context yields the env a boto3 client needs and
    stops the server after. ``latency_ms`` (a pause before each request) is moto's only."""
    if kind == "rgw":
        from tests.rgw import available, rgw_server

        missing = available()
        if missing:
            raise SystemExit(f"--server rgw: {missing}")
        return rgw_server(bucket)
    if kind != "moto":
        raise ValueError(f"unknown server {kind!r} (one of {', '.join(KINDS)})")
    from tests.s3server import s3_server

    return s3_server(bucket, latency_ms=latency_ms)


def server_cpu(kind: str) -> float:
    """CPU seconds used so far by the server processes of ``kind`` that this process started (children of it):
    the CPU that RUSAGE_CHILDREN misses, since the server is waited for only at the end. Linux /proc."""
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # from the state on: ppid, ..., utime, stime
            command = (stat.parent / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(fields[1]) != os.getpid():
            continue
        if any(mark in part for mark in _MARKS[kind] for part in command[:3]):
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total
