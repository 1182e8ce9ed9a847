"""The watchdog of ray_runner/fate.py without Ray: a SIGKILLed parent's "Ray" dies, its other children do not.

A stand-in worker starts a child run from a fake Ray package folder, whose own child names a fake session
dir and ignores SIGTERM (as Ray's agents do), a child that is not Ray's, and the watchdog. The worker is
killed with SIGKILL: within the issue's 10 s both Ray stand-ins are gone, the other child is not.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from .jobs import wait_for
from .nodes import session_pids
from .reference import env_with

WORKER = """
import subprocess, sys, time
ray_dir, session = sys.argv[1], sys.argv[2]
agent = subprocess.Popen([sys.executable, ray_dir + "/agent.py", session])
other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
dog = subprocess.Popen([sys.executable, "-m", "data_juicer_elastic.ray_runner.fate", str(__import__("os").getpid()),
                        ray_dir], stdin=subprocess.PIPE, start_new_session=True)
dog.stdin.write(("session " + session + "\\n").encode()); dog.stdin.flush()
print(agent.pid, other.pid, dog.pid, flush=True)
time.sleep(300)
"""
AGENT = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                  "time.sleep(300)", "--session-dir=" + sys.argv[1]])
time.sleep(300)
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def test_a_killed_worker_takes_its_ray_along_and_nothing_else(tmp_path: Path):
    ray_dir, session = tmp_path / "fake-ray", tmp_path / "tmp" / "ray" / "session_1"
    ray_dir.mkdir()
    (ray_dir / "agent.py").write_text(AGENT)
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(ray_dir), str(session)],
        stdout=subprocess.PIPE,
        env=env_with(),
        start_new_session=True,
    )
    try:
        assert worker.stdout is not None
        agent, other, dog = map(int, worker.stdout.readline().split())
        grandchild = wait_for(lambda: [p for p in session_pids(worker.pid) if p not in (worker.pid, agent, other)])
        worker.kill()
        worker.wait()
        killed = time.monotonic()
        while (alive(agent) or alive(grandchild[0])) and time.monotonic() - killed < 10:
            time.sleep(0.1)
        assert not alive(agent) and not alive(grandchild[0])
        assert alive(other)  # not Ray's: the watchdog leaves it
        wait_for(lambda: not alive(dog), "the watchdog's exit", timeout=10)
    finally:
        for pid in session_pids(worker.pid):
            os.kill(pid, signal.SIGKILL)
