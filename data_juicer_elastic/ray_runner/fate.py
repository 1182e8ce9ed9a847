"""A node-local Ray that dies with its worker, even one killed with SIGKILL.

Ray binds gcs_server and the raylet to the process that starts them
(``PR_SET_PDEATHSIG``), but a SIGKILLed raylet cannot take its children
along: the dashboard and runtime-env agents, reparented to pid 1, ignore
SIGTERM and live on. So the worker starts a small watchdog first, in a
session of its own (a kill of the worker's group spares it), that needs
nothing from the dead: it notes Ray's processes (the worker's children run
from Ray's package, and their descendants) every second, learns the session
dir once Ray is up, and when its parent is gone, or the worker says
``sweep``, SIGKILLs every noted process and every process that names the
session dir (command line or an open file), until none is left for half a second.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

POLL = 0.2  # seconds between looks at the parent
NOTE_EVERY = 1.0  # seconds between notes of Ray's processes
QUIET = 0.5  # a sweep ends once it found nothing for this long
GIVE_UP = 8.0  # and in any case after this long (the bound is 10 s)


class Watchdog:
    """The worker's end: start it before ``ray.init``, name the session, ``release`` at the stop."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc

    @classmethod
    def start(cls) -> Watchdog:
        import ray

        ray_dir = os.path.dirname(os.path.abspath(ray.__file__))
        cmd = [sys.executable, "-m", __name__, str(os.getpid()), ray_dir]
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,  # never holds a launcher's pipe open after the node died
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        return cls(proc)

    def name_session(self, session_dir: str) -> None:
        self._say(f"session {session_dir}\n")

    def release(self, timeout: float = GIVE_UP + 4) -> bool:
        """Have it sweep and wait for it: True once it ended with nothing of Ray's left."""
        self._say("sweep\n")
        try:
            return self.proc.wait(timeout) == 0
        except subprocess.TimeoutExpired:
            return False
        finally:
            if self.proc.stdin:
                try:
                    self.proc.stdin.close()
                except OSError:
                    pass

    def _say(self, line: str) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(line.encode())
            self.proc.stdin.flush()
        except (OSError, ValueError):
            pass  # it is gone already: nothing to tell


def processes() -> dict[int, tuple[int, int]]:
    """Every live process: pid -> (parent pid, start time in clock ticks)."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            if fields[0] not in (b"Z", b"X"):
                table[int(entry)] = (int(fields[1]), int(fields[19]))
    return table


def descendants(roots: set[int], table: dict[int, tuple[int, int]]) -> set[int]:
    """``roots`` and every process below them in ``table``."""
    found, frontier = set(roots), set(roots)
    while frontier:
        frontier = {pid for pid, (ppid, _) in table.items() if ppid in frontier and pid not in found}
        found |= frontier
    return found


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def names(pid: int, session_dir: str) -> bool:
    """Does the process name ``session_dir`` in its command line or hold a file under it open?"""
    if not os.path.isabs(session_dir) or len(session_dir) < 2:
        return False  # an empty or relative name would match every process
    if session_dir in cmdline(pid):
        return True
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(session_dir + os.sep):
                return True
        except OSError:
            continue
    return False


def note(parent: int, ray_dir: str, noted: dict[int, int]) -> None:
    """Add the parent's children run from Ray's package, and their descendants, to ``noted`` (pid -> start)."""
    table = processes()
    roots = {pid for pid, (ppid, _) in table.items() if ppid == parent and ray_dir in cmdline(pid)}
    noted.update({pid: table[pid][1] for pid in descendants(roots, table)})


def ancestors(pid: int, table: dict[int, tuple[int, int]]) -> dict[int, int]:
    """``pid`` and the processes above it: pid -> start time."""
    found: dict[int, int] = {}
    while pid in table and pid not in found:
        found[pid] = table[pid][1]
        pid = table[pid][0]
    return found


def sweep(noted: dict[int, int], session_dir: str | None, elders: dict[int, int]) -> bool:
    """SIGKILL Ray's processes until none is found for ``QUIET`` seconds; False at ``GIVE_UP``. The parent
    (a worker that stopped Ray holds files of the session open), its ancestors (``elders``: the launcher)
    and this process are spared, whatever they name."""
    start = quiet_since = time.monotonic()
    while time.monotonic() - start < GIVE_UP:
        table = processes()
        doomed = {pid for pid, (_, st) in table.items() if noted.get(pid) == st}
        if session_dir:
            doomed |= {pid for pid in table if pid not in doomed and names(pid, session_dir)}
        spared = {1, os.getpid()} | {pid for pid, (_, st) in table.items() if elders.get(pid) == st}
        doomed = descendants(doomed - spared, table) - spared
        for pid in doomed:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        now = time.monotonic()
        if doomed:
            quiet_since = now
        elif now - quiet_since >= QUIET:
            return True
        time.sleep(0.1)
    return False


def watch(parent: int, ray_dir: str) -> int:
    """The watchdog's life: note while the parent lives, then sweep. Exit 0 when nothing was left."""
    noted: dict[int, int] = {}
    session_dir = None
    last_note = 0.0
    stdin = sys.stdin.buffer
    elders = ancestors(parent, processes())
    while os.getppid() == parent:
        if time.monotonic() - last_note >= NOTE_EVERY:
            note(parent, ray_dir, noted)
            last_note = time.monotonic()
        if not select.select([stdin], [], [], POLL)[0]:
            continue
        line = stdin.readline().decode(errors="replace").strip()
        if not line or line == "sweep":
            break  # EOF (the parent died or let go) or asked
        if line.startswith("session "):
            session_dir = line.split(" ", 1)[1]
    return 0 if sweep(noted, session_dir, elders) else 1


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the node's death is what ends it
    sys.exit(watch(int(sys.argv[1]), sys.argv[2]))
