"""A node leaves nothing behind: no Ray process once it is killed, no scratch or Ray folder once it ends well.

Real ``dj-process`` nodes (tests/nodes.py), each with ``TMPDIR`` a fresh, short folder of its own (Ray puts its
session folder there, and its socket paths must stay under the kernel's 107 bytes), so what a node left is
told apart from what other Rays on this machine left.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from .jobs import wait_for
from .nodes import Node, Nodes, session_pids
from .reference import dj_process, exploding_recipe
from .s3server import s3_server
from .test_dj_process_s3 import aws_env
from .test_store_contract import BUCKET

pytestmark = pytest.mark.slow

BOUND = 10.0  # seconds a killed node's Ray may outlive it (issue 43)


@pytest.fixture
def node_tmp():
    folder = Path(tempfile.mkdtemp(prefix="djt-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def ray_sessions(tmp: Path) -> list[Path]:
    return sorted((tmp / "ray").glob("session_2*"))


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def node_processes(node: Node, session: Path) -> dict[int, str]:
    """Live processes of the node: in its process session (Ray's included), or naming its Ray session folder."""
    found = {pid: cmdline(pid) for pid in session_pids(node.proc.pid)}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and str(session) in cmdline(int(entry)):
            found[int(entry)] = cmdline(int(entry))
    return {pid: cmd for pid, cmd in found.items() if pid != os.getpid() and cmd}


def test_a_node_killed_mid_shard_leaves_no_ray_process(tmp_path, node_tmp):
    nodes = Nodes(tmp_path, rows=40, shards=2)
    node = nodes.start("n1", gated=True, TMPDIR=str(node_tmp))
    try:
        gate = node.gate
        assert gate is not None
        wait_for(lambda: (gate / "entered").exists(), "a shard in the gate", timeout=300, proc=node.proc, log=node.log)
        [session] = ray_sessions(node_tmp)
        before = node_processes(node, session)
        assert len(before) > 3, before  # the node, gcs_server, raylet, agents, workers
        os.kill(node.proc.pid, signal.SIGKILL)
        killed = time.monotonic()
        node.proc.wait()
        left = before
        while left and time.monotonic() - killed < BOUND:
            time.sleep(0.2)
            left = node_processes(node, session)
        assert not left, f"{BOUND:g}s after the kill, still alive: {left}"
    finally:
        nodes.stop_all()


def left_behind(tmp: Path) -> list[str]:
    left = [str(p.relative_to(tmp)) for p in tmp.rglob("*")]
    return [p for p in left if p.startswith("dje-") or "dj-work" in p or "session_" in p]


def test_a_clean_run_leaves_no_ray_session(tmp_path, node_tmp):
    nodes = Nodes(tmp_path, rows=40, shards=2)
    node = nodes.start("n1", TMPDIR=str(node_tmp))
    try:
        assert node.wait(300) == 0, node.tail()
    finally:
        nodes.stop_all()
    assert not left_behind(node_tmp)


def test_a_clean_run_on_an_s3_job_dir_leaves_no_scratch_and_no_ray_session(tmp_path, node_tmp):
    """On a store the attempts' scratch and Data-Juicer's work dir are node-local, under ``$TMPDIR/dje-*``."""
    nodes = Nodes(tmp_path, rows=40, shards=2, job_dir=f"s3://{BUCKET}/jobs/{uuid.uuid4().hex[:12]}")
    with s3_server(BUCKET) as server:
        try:
            node = nodes.start("n1", TMPDIR=str(node_tmp), **aws_env(server))
            assert node.wait(300) == 0, node.tail()
        finally:
            nodes.stop_all()
    assert "Traceback" not in node.output, node.tail()
    assert not left_behind(node_tmp)


def test_a_failed_run_keeps_only_ray_logs_and_says_where(tmp_path, node_tmp):
    config = exploding_recipe(tmp_path)
    out = dj_process("--config", str(config), cwd=tmp_path, env={"TMPDIR": str(node_tmp)})
    assert out.returncode == 2, out.stderr[-3000:]
    [session] = ray_sessions(node_tmp)
    assert [p.name for p in session.iterdir()] == ["logs"]
    assert f"this node's Ray logs are kept in {session / 'logs'} (an attempt failed here)" in out.stderr, out.stderr[
        -3000:
    ]
