"""A real S3 server for the suite: Ceph's radosgw on a one-node Ceph in a temp folder (docs/OBJECT_STORE.md).

moto is a mock; RGW is what users run. Ceph 16 (Debian's ``radosgw``,
``ceph-mon``, ``ceph-osd``) has no standalone backend, so RGW needs a tiny
RADOS cluster: one monitor, one OSD keeping its data in RAM (``memstore``,
capped at ``MEMSTORE_BYTES``), pools of one copy, cephx off, and radosgw's
beast frontend on a free port of 127.0.0.1. Every daemon runs in the
foreground as a child of this process (its pid known, stopped by it, and
killed with it: ``PR_SET_PDEATHSIG``), so nothing outlives the tests.

Run alone: ``python -m tests.rgw`` prints the env a boto3 client needs and
serves until its stdin closes.
"""

from __future__ import annotations

import contextlib
import ctypes
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.require import require
from tests.s3server import create_bucket

DAEMONS = ("ceph-mon", "ceph-osd", "radosgw", "radosgw-admin", "monmaptool", "ceph")
MEMSTORE_BYTES = 2 << 30  # the OSD's RAM cap: the suite stores a few hundred MiB at most
START_SECS = 180.0  # about 20 s alone; a loaded 2-core machine may take several times that
ACCESS_KEY, SECRET_KEY = "DJEELASTICTESTKEY000", "dje-elastic-rgw-test-secret-0000000000000"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_DEFAULT_REGION": "us-east-1"}
CONF = """[global]
fsid = {fsid}
mon host = [v2:127.0.0.1:{v2},v1:127.0.0.1:{v1}]
auth cluster required = none
auth service required = none
auth client required = none
ms mon client mode = crc secure
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
mon allow pool size one = true
mon warn on pool no redundancy = false
mon max pg per osd = 1000
osd crush chooseleaf type = 0
run dir = {root}/run
admin socket = {root}/run/$name.asok
log file = {root}/log/$name.log
mon data = {root}/mon/$name
osd data = {root}/osd/$name
osd objectstore = memstore
memstore device bytes = {memstore}
rgw frontends = beast endpoint=127.0.0.1:{port}
rgw data = {root}/rgw/$name
"""


def available() -> str | None:
    """None if this machine can run the cluster, else what is missing."""
    missing = [tool for tool in DAEMONS if shutil.which(tool) is None]
    return (
        f"Ceph RGW ({', '.join(missing)} not installed: apt-get install radosgw ceph-mon ceph-osd)" if missing else None
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the parent dies (a killed pytest leaves no daemon behind)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Cluster:
    """One mon, one OSD, one radosgw under ``root``; ``start`` returns the env for boto3, ``stop`` kills each."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.conf = root / "ceph.conf"
        self.port = free_port()
        self.procs: list[subprocess.Popen] = []

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def ceph(self, *args: str, tool: str = "ceph") -> str:
        """One admin command against the cluster: its stdout (a failure raises with its stderr)."""
        out = subprocess.run([tool, "-c", str(self.conf), *args], capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            raise RuntimeError(f"{tool} {' '.join(args)}: exit {out.returncode}: {out.stderr.strip()[-2000:]}")
        return out.stdout

    def daemon(self, *args: str) -> None:
        """A daemon in the foreground, a child of this process (its pid is what ``stop`` kills)."""
        log = open(self.root / "log" / f"{args[0]}.out", "ab")
        cmd = [args[0], "-f", "-c", str(self.conf), *args[1:]]
        self.procs.append(
            subprocess.Popen(cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        )
        log.close()

    def start(self, bucket: str) -> dict[str, str]:
        for sub in ("run", "log", "mon", "osd", "rgw"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        fsid, v1, v2 = str(uuid.uuid4()), free_port(), free_port()
        conf = CONF.format(fsid=fsid, v1=v1, v2=v2, root=self.root, memstore=MEMSTORE_BYTES, port=self.port)
        self.conf.write_text(conf)
        monmap = str(self.root / "monmap")
        addrs = f"[v2:127.0.0.1:{v2},v1:127.0.0.1:{v1}]"
        self.ceph("--create", "--fsid", fsid, "--addv", "a", addrs, monmap, tool="monmaptool")
        self.ceph("--mkfs", "-i", "a", "--monmap", monmap, tool="ceph-mon")
        self.daemon("ceph-mon", "-i", "a")
        osd_uuid = str(uuid.uuid4())
        osd_id = self.ceph("osd", "new", osd_uuid).strip()
        (self.root / "osd" / f"osd.{osd_id}").mkdir()  # memstore keeps its fsid file there
        self.ceph("--mkfs", "-i", osd_id, "--osd-uuid", osd_uuid, tool="ceph-osd")
        self.ceph("osd", "crush", "add", f"osd.{osd_id}", "1.0", "root=default", "host=localhost")
        self.daemon("ceph-osd", "-i", osd_id)
        self.daemon("radosgw", "-n", "client.rgw")
        self._wait_answering()
        self.ceph("user", "create", "--uid", "dje", "--display-name", "dje", "--access-key", ACCESS_KEY,
                  "--secret-key", SECRET_KEY, tool="radosgw-admin")  # fmt: skip
        env = {"AWS_ENDPOINT_URL": self.endpoint, **CREDENTIALS}
        create_bucket(bucket, env)
        return env

    def _wait_answering(self) -> None:
        deadline = time.monotonic() + START_SECS
        while True:
            try:
                urllib.request.urlopen(self.endpoint, timeout=5).close()
                return
            except urllib.error.HTTPError:
                return  # any HTTP answer will do
            except OSError:
                dead = [p.args[0] for p in self.procs if p.poll() is not None]
                if dead or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"RGW did not answer at {self.endpoint} (exited: {dead}); see {self.root}/log"
                    ) from None
                time.sleep(0.2)

    def stop(self) -> None:
        """SIGKILL each daemon by its pid (the OSD ignores SIGTERM for seconds; memstore has nothing to flush)."""
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        self.procs.clear()


@contextlib.contextmanager
def rgw_server(bucket: str = "dje-test", root: Path | None = None) -> Iterator[dict[str, str]]:
    """Start the cluster under ``root`` (a fresh temp folder by default), create ``bucket``, yield the env a
    boto3 client needs; stop every daemon after, and remove the folder made here."""
    made = root is None
    root = Path(tempfile.mkdtemp(prefix="dje-rgw-")) if root is None else root
    cluster = Cluster(root)
    try:
        yield cluster.start(bucket)
    finally:
        cluster.stop()
        if made:
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def rgw_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """One RGW for the whole session (about 20 s to start), bucket ``dje-test``: the env for ``use_env``.
    Skipped where Ceph is not installed, failed in CI (tests/require.py)."""
    missing = available()
    require(missing is None, str(missing))
    with rgw_server("dje-test", tmp_path_factory.mktemp("rgw")) as env:
        yield env


def main() -> None:
    with rgw_server() as env:
        for name, value in env.items():
            print(f"export {name}={value}", flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    main()
