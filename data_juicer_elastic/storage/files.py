"""Storage primitives for a shared POSIX directory (NFS, CPFS, sshfs, local).

Everything that makes a file visible to other nodes goes through here:
``atomic_write`` (stage, fsync, rename), ``publish_once`` (first writer wins,
by ``link``), ``create_exclusive`` (O_CREAT|O_EXCL) and ``server_now`` (the
shared filesystem's clock, read from the mtime of a file just touched there).
Nothing here knows about jobs or Data-Juicer.
"""

from __future__ import annotations

import errno
import os
import re
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import orjson

from data_juicer_elastic.errors import UserError
from data_juicer_elastic.storage.bulk_write import BulkWriter
from data_juicer_elastic.storage.host import hostname
from data_juicer_elastic.storage.lapse import lapse_clock

T = TypeVar("T")

_JSON_OPTS = orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS | orjson.OPT_APPEND_NEWLINE


def dumps_json(obj: Any) -> bytes:
    """Canonical JSON: sorted keys, indented, trailing newline (deterministic bytes)."""
    return orjson.dumps(obj, option=_JSON_OPTS)


def read_json(path: str | os.PathLike) -> Any:
    with open(path, "rb") as f:
        return orjson.loads(f.read())


def json_object(data: bytes) -> dict:
    """The JSON object ``data`` holds; {} when it holds something else or no JSON (read as absent)."""
    try:
        held = orjson.loads(data)
    except ValueError:
        return {}
    return held if isinstance(held, dict) else {}


def read_record(path: str | os.PathLike) -> dict:
    """A JSON object record; {} when it is missing, unreadable or not an object (callers treat it as absent)."""
    try:
        data = read_json(path)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def fsync_dir(path: str | os.PathLike) -> None:
    """Make a rename or link inside ``path`` durable. Some filesystems refuse; that is fine."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def temp_name(path: str | os.PathLike) -> Path:
    """A name beside ``path`` that no other process or node will pick."""
    p = Path(path)
    return p.with_name(f".{p.name}.tmp-{hostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def _write_temp(path: str | os.PathLike, data: bytes) -> tuple[Path, os.stat_result]:
    """``data`` fsynced under a temp name beside ``path``, and its ``fstat``: a link or rename keeps the inode,
    size and mtime, so that stat is the published file's without a stat after (one call fewer on a store)."""
    tmp = temp_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
        st = os.fstat(fd)
    except BaseException:
        os.close(fd)
        unlink_quietly(tmp)
        raise
    os.close(fd)
    return tmp, st


def unlink_quietly(path: str | os.PathLike) -> None:
    """Remove ``path`` if it is there (a temp file that may or may not have been renamed away)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def atomic_write(path: str | os.PathLike, data: bytes, *, durable: bool = True) -> os.stat_result:
    """Replace ``path`` with ``data``: readers see the old bytes or the new, never a mix. The new file's stat.

    The bytes are fsynced before the rename either way; ``durable=False`` skips the folder fsync after it,
    so a crash of the machine holding the folder may roll ``path`` back to its old bytes (never a cut file).
    """
    tmp, st = _write_temp(path, data)
    rename_staged(tmp, path, durable=durable)
    return st


def rename_staged(tmp: str | os.PathLike, path: str | os.PathLike, *, durable: bool = True) -> None:
    """Rename the fsynced temp file ``tmp`` over ``path`` (removed again if that fails); ``durable`` as for
    ``atomic_write``."""
    try:
        os.replace(tmp, path)
    except BaseException:
        unlink_quietly(tmp)
        raise
    if durable:
        fsync_dir(Path(path).parent)


def publish_once(
    path: str | os.PathLike, data: bytes, *, durable: bool = True, deadline: float | None = None
) -> os.stat_result | None:
    """Publish ``data`` at ``path`` unless something is already there.

    The bytes are written whole under a temp name first and then hard-linked,
    so the first publisher wins and nobody ever sees a partial record.
    Returns the published file's stat when this call published, None when
    somebody else's file is there. ``durable`` as for ``atomic_write`` (a
    crash may then undo the link: ``path`` missing again). ``deadline``
    (``lapse_clock``): the link, which publishes, is not made once it passed.
    """
    tmp, st = _write_temp(path, data)
    if deadline is not None:
        _before(deadline, tmp, path)
    return link_staged(tmp, path, st, lambda: _holds_bytes(path, data), durable=durable)


def _before(deadline: float, tmp: str | os.PathLike, path: str | os.PathLike) -> None:
    if lapse_clock() >= deadline:
        unlink_quietly(tmp)
        raise TimeoutError(f"{path}: not published, its deadline passed (the lease may have lapsed)")


def link_staged(
    tmp: str | os.PathLike, path: str | os.PathLike, st: os.stat_result, same: Callable[[], bool], *, durable: bool
) -> os.stat_result | None:
    """Link the fsynced temp file ``tmp`` (whose stat is ``st``) at ``path`` unless something is there; ``tmp``
    is removed either way. The published file's stat, or None when somebody else's file is there.

    ``same()``: does what stands at ``path`` hold this call's bytes? Asked only after EEXIST on another
    inode: an NFSv3 LINK retransmitted after the server did it answers EEXIST for the link the first
    transmission made, and the winner must not take it for a lost race. ``durable`` as for ``atomic_write``.
    """
    try:
        os.link(tmp, path)
    except OSError as exc:
        if not lost_race(exc, path):
            raise
        if not _ours(tmp, path, same):
            return None
        st = os.lstat(path)  # ours by its bytes, maybe not our inode (a resent link): what stands there
    finally:
        unlink_quietly(tmp)
    if durable:
        fsync_dir(Path(path).parent)
    return st


def _ours(tmp: str | os.PathLike, path: str | os.PathLike, same: Callable[[], bool]) -> bool:
    """Is what stands at ``path`` this call's own link: our temp's inode, else our bytes (``same``)?"""
    try:
        return os.path.samefile(tmp, path) or same()
    except OSError:
        return False


def _holds_bytes(path: str | os.PathLike, data: bytes) -> bool:
    with open(path, "rb") as f:
        return f.read(len(data) + 1) == data


def stage_blocks(
    path: str | os.PathLike, source: Iterable[Any], *, direct: bool, fsync: bool
) -> tuple[Path, os.stat_result]:
    """``source``'s blocks written to a new temp name beside ``path`` (its folder made on a miss): the temp and
    its stat, for ``rename_staged`` or ``link_staged``. Bulk data (an attempt's output, a downloaded shard),
    so ``BulkWriter`` writes it (``direct``: past the page cache, for bytes nobody here rereads soon);
    ``fsync`` before the stat. Any failure removes the temp again: a cut copy is never left under it."""
    tmp = temp_name(path)
    try:
        out = in_folder(tmp, lambda: BulkWriter(tmp, direct=direct))
        try:
            for block in source:
                out.write(block)
        except BaseException:
            out.abandon()
            raise
        out.close(fsync=fsync)
        return tmp, os.lstat(tmp)
    except BaseException:
        unlink_quietly(tmp)
        raise


def in_folder(path: str | os.PathLike, write: Callable[[], T]) -> T:
    """Run ``write``; if ``path``'s folder is missing, make it and run it again (one mkdir on a miss only)."""
    try:
        return write()
    except FileNotFoundError:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        return write()


def lost_race(exc: OSError, path: str | os.PathLike) -> bool:
    """Did an exclusive create or link fail because ``path`` exists?

    EEXIST says so. sshfs reports a race lost on the server (the name did not
    exist when the kernel looked it up, but did when the sftp server tried)
    as a generic failure, EPERM: then ``path`` being there now says so.
    """
    return isinstance(exc, FileExistsError) or (isinstance(exc, PermissionError) and os.path.lexists(path))


def create_exclusive(path: str | os.PathLike, data: bytes, *, durable: bool = True) -> bool:
    """Create ``path`` with O_CREAT|O_EXCL and write ``data``; False if it exists.

    Used for small lease files whose existence, not content, is the claim. If
    the bytes cannot be written (a full disk) the file is removed again: a
    claim cut short would otherwise read as an attempt that started and was lost.
    ``durable`` as for ``atomic_write``.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError as exc:
        if lost_race(exc, path):
            return False
        raise
    try:
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        unlink_quietly(path)  # ours: O_EXCL made it
        raise
    if durable:
        fsync_dir(Path(path).parent)
    return True


def touch(path: str | os.PathLike) -> None:
    """Set mtime to *now on the file server* by rewriting the file's first byte in place.

    A write is stamped by whoever stores the file: the NFS, SFTP or SMB
    server, or the local kernel. ``utime(path, NULL)`` is not: sshfs, SMB and
    other FUSE or gateway clients turn "now" into an explicit timestamp from
    the client's own clock, so a node whose clock is off would stamp its
    error into every heartbeat. The bytes stay the same (an empty file gets
    one newline). Only when the disk is full and even that fails does this
    fall back to utime.
    """
    fd = os.open(path, os.O_RDWR)
    try:
        first = os.pread(fd, 1, 0) or b"\n"
        try:
            os.pwrite(fd, first, 0)
        except OSError as exc:
            if not is_disk_full(exc):
                raise
            os.utime(fd, None)
    finally:
        os.close(fd)


CLOCK_RETRY_SECS = 30.0  # how long a clock probe rides out a flaky mount before its error stops the caller


def server_now(probe: str | os.PathLike, retry_secs: float = CLOCK_RETRY_SECS) -> float:
    """Current time on the filesystem that holds ``probe`` (created if missing).

    Node clocks may be skewed; the one clock every node sees alike is the one
    that stamps mtimes on the shared directory. No local clock stands in for
    it (that could take a live lease), so an error (a mount that hiccups) is
    retried for ``retry_secs`` before it is raised; a full disk is raised at once.
    """
    deadline, pause = time.monotonic() + retry_secs, 0.05
    while True:
        try:
            return _probe_mtime(probe)
        except OSError as exc:
            if is_disk_full(exc) or time.monotonic() + pause > deadline:
                raise
            time.sleep(pause)
            pause = min(pause * 2, 2.0)


def _probe_mtime(probe: str | os.PathLike) -> float:
    try:
        touch(probe)
    except FileNotFoundError:
        Path(probe).parent.mkdir(parents=True, exist_ok=True)
        with open(probe, "ab"):
            pass
        touch(probe)
    return os.stat(probe).st_mtime


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


_NO_SPACE_TEXT = os.strerror(errno.ENOSPC)


def disk_full_in(exc: BaseException) -> OSError | None:
    """The ENOSPC/EDQUOT error behind ``exc`` (itself, or what it was raised from), if any."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if is_disk_full(cur):
            return cur  # type: ignore[return-value]
        if _NO_SPACE_TEXT in str(cur):  # a Ray task's error reaches us as text (RayTaskError)
            return OSError(errno.ENOSPC, _NO_SPACE_TEXT)
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return None


def no_space_error(path: str | os.PathLike, exc: OSError, doing: str) -> UserError:
    """The error a full disk (or quota) is reported with: the path, what was being done, the fix."""
    return UserError(
        f"{path}: no space left on device while {doing} ({exc.strerror or exc}); "
        "free space (or raise the quota) on that file system and run again"
    )


# A temp name another host left may be removed once it is this old. A merge writes its temp file block by block
# (16 MiB at a time, so its mtime moves every second or so) and then only fsyncs and renames it; a temp file
# untouched for an hour belongs to a process that is gone. A same-host one goes as soon as its pid is gone.
STALE_TEMP_SECS = 3600.0
_TEMP_RE = re.compile(r"^\.(?P<name>.+)\.tmp-(?P<host>.+)-(?P<pid>\d+)-(?P<tag>[0-9a-f]{8})$")


def remove_dead_temps(path: str | os.PathLike, stale_after: float = STALE_TEMP_SECS) -> int:
    """Remove ``temp_name(path)`` files beside ``path`` that dead processes left (``remove_dead_temps_in``)."""
    p = Path(path)
    return remove_dead_temps_in(p.parent, p.name, stale_after)


def remove_dead_temps_in(
    folder: str | os.PathLike, name: str | None = None, stale_after: float = STALE_TEMP_SECS
) -> int:
    """Remove temp files in ``folder`` (of ``name`` only, if given) whose writer is provably gone.

    A process killed while it staged a file (a merge, an export's part) leaves
    its temp file behind. One named with this host and the pid of a process
    that no longer exists is removed; one of another host only once its mtime
    is ``stale_after`` seconds old. Returns how many were removed.
    """
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return 0
    me, now, removed = hostname(), time.time(), 0
    for entry in names:
        m = _TEMP_RE.match(entry)
        if not m or (name is not None and m["name"] != name):
            continue
        path = Path(folder) / entry
        if m["host"] == me:
            dead = not _alive(int(m["pid"]))
        else:
            try:
                dead = now - os.lstat(path).st_mtime > stale_after
            except FileNotFoundError:
                continue
        if dead:
            unlink_quietly(path)
            removed += 1
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
