"""Who this process is, as other nodes see it in the shared directory.

The one host name of the package: in leases and done records, in elections,
and in temp file names (whose owner's pid is judged alive on this host only).

A lease or a ballot also records its process's identity (``identity``): the
pid, the process's start time (``/proc/<pid>/stat`` field 22, clock ticks
since boot) and the kernel's boot id. A process on the same host can then
prove that holder gone (``holder_gone``): its pid no longer runs, runs a
different process (pid reused: another start time), or was recorded under
another boot. A holder of another host is never judged this way.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

HOSTNAME_ENV = "DJ_ELASTIC_HOSTNAME"
_PROC = "/proc"
_BOOT_ID = "/proc/sys/kernel/random/boot_id"


def hostname() -> str:
    """The node name recorded in leases, done records and temp file names.

    ``DJ_ELASTIC_HOSTNAME`` overrides it, so one machine can play several
    nodes in simulations and tests.
    """
    return os.environ.get(HOSTNAME_ENV) or socket.gethostname()


_boot: list[str | None] = []


def boot_id() -> str | None:
    """This kernel boot's id (Linux), or None where the system has none."""
    if not _boot:
        try:
            with open(_BOOT_ID, encoding="ascii") as f:
                _boot.append(f.read().strip() or None)
        except OSError:
            _boot.append(None)
    return _boot[0]


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, start time) of ``pid`` from /proc; None when /proc does not show it."""
    try:
        with open(f"{_PROC}/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ')'
    fields = data[data.rfind(b")") + 2 :].split()
    try:
        return fields[0].decode("ascii", "replace"), int(fields[19])  # field 3 is state, field 22 the start time
    except (IndexError, ValueError):
        return None


def start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot), or None when unknown or gone."""
    stat = _proc_stat(pid)
    return stat[1] if stat else None


_me: dict[int, dict] = {}


def identity() -> dict:
    """This process's identity as a lease or ballot records it: pid, start time, boot id (None if unknown)."""
    pid = os.getpid()  # a forked child is another process: keyed by pid
    if pid not in _me:
        _me[pid] = {"pid": pid, "start": start_time(pid), "boot": boot_id()}
    return dict(_me[pid])


def holder_gone(record: Mapping, host: str) -> bool:
    """True only when ``record`` (a lease or ballot: host, pid, start, boot) names a process of ``host`` (this
    process's host) that provably no longer runs: another boot, its pid gone or a zombie, or its pid reused
    (another start time). False whenever that cannot be proven, and always for another host's record.
    """
    if record.get("host") != host:
        return False
    pid = record.get("pid")
    if type(pid) is not int or pid <= 0:
        return False
    boot, mine = record.get("boot"), boot_id()
    if isinstance(boot, str) and mine is not None and boot != mine:
        return True
    stat = _proc_stat(pid)
    if not stat:  # not in /proc (which may hide other users' processes), or no /proc: does the pid exist?
        return not _pid_exists(pid)
    state, started = stat
    if state in ("Z", "X"):  # killed, not yet reaped: it runs nothing any more
        return True
    recorded = record.get("start")
    return type(recorded) is int and recorded != started


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True
