"""Where an attempt's runner reads its shard and writes its files: in the job dir itself, or in node-local scratch.

A POSIX job dir is a folder every node shares, so the runner reads the shard
file where prepare put it and writes straight into the attempt's folder
(``Direct``: today's path, no copy). An object store has no folders and no
files to write into (docs/OBJECT_STORE.md, invariants 4-6): the shard is
downloaded to ``$TMPDIR/dje-<job-hash>/p<pid>-<start>/<shard>/<attempt>/``, the runner writes
there, and the files readers expect in the attempt's folder (the output,
``ops.json``, ``process.log``; a Parquet-exporting recipe's
``processed.parquet`` and its sidecar) are uploaded before the done record
may be published (``Scratch``). ``attempt.json`` is a store record either way.
The scratch folder goes when the attempt ends, however it ends; what a killed
worker left goes when the next worker of the job starts on that node (each
process works under its own ``p<pid>-<start>`` folder, removed once
``host.holder_gone`` proves its process gone). The last attempt to end removes the empty folders above it.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Protocol

from data_juicer_elastic import parquet_out
from data_juicer_elastic.errors import IntegrityError
from data_juicer_elastic.job.attempt_files import AttemptDir
from data_juicer_elastic.job.layout import JobDir, attempt_name
from data_juicer_elastic.storage.blocks import digest_file
from data_juicer_elastic.storage.host import holder_gone, hostname, identity
from data_juicer_elastic.worker.disk_full import space_for
from data_juicer_elastic.worker.outputs import OutputDigest

KEPT = (AttemptDir.OPS, AttemptDir.LOG)  # what a failed attempt's folder holds for status, report and people
# written beside the output where the recipe exports Parquet (``write_shard_parquet``), the sidecar last: the
# exports read both (``parquet_out.shard_parquet``), so a done attempt's store holds them as its output
BESIDE = (parquet_out.OUTPUT, parquet_out.SIDECAR)


class Placement(Protocol):
    """One attempt's files: ``folder`` is what the runner sees as the attempt's folder (its output's parent)."""

    folder: Path

    def make(self) -> None:
        """The folder, fresh; ``IntegrityError`` when the job dir already holds one (something else wrote it)."""
        ...

    def shard(self, sid: str) -> Path:
        """The shard's file for the runner to read (its bytes unchecked; a missing one does not exist there)."""
        ...

    def keep(self, digest: OutputDigest | None = None) -> None:
        """Put the attempt's files where the job's readers look; with ``digest``, the output too, last, and
        checked against it once stored. Only then may the done record be published. Files already kept are
        not put again."""
        ...

    def drop(self) -> None:
        """The attempt ended: remove what only this node needed. Never fails."""
        ...


class Direct:
    """The runner works in the job dir's own attempt folder: nothing to copy, keep or drop."""

    def __init__(self, job: JobDir, sid: str, attempt: int) -> None:
        self.job, self.sid, self.attempt = job, sid, attempt
        self.folder = job.attempt_dir(sid, attempt)

    def make(self) -> None:
        """One already there, or one outside the job dir, is refused: the ``mkdir`` is the fresh-attempt check."""
        try:
            with space_for(self.folder):
                self.folder.parent.mkdir(parents=True, exist_ok=True)
                self.job.confine(str(self.folder.parent.relative_to(self.job.root)), "attempts folder")
                os.mkdir(self.folder)
        except FileExistsError as exc:
            raise IntegrityError(
                f"{self.folder}: already exists although attempt {self.attempt} of {self.sid} was just "
                "claimed; something other than a worker wrote into the job dir: refusing to use it"
            ) from exc

    def shard(self, sid: str) -> Path:
        return self.job.shard_file(sid)

    def keep(self, digest: OutputDigest | None = None) -> None:
        pass

    def drop(self) -> None:
        pass


class Scratch:
    """The runner works in a node-local folder; the store gets the attempt's files by ``upload``.

    The fresh-attempt check is the create of ``attempt.json`` (the attempt's first record write), since a
    store has no folder to make. Uploads are create-once: a key already in this attempt's prefix was put
    there by something other than this attempt, and is refused.
    """

    def __init__(self, job: JobDir, sid: str, attempt: int, base: Path) -> None:
        self.job, self.sid, self.attempt = job, sid, attempt
        self.folder = process_folder(base) / sid / attempt_name(attempt)
        self.prefix = job.key(job.attempt_dir(sid, attempt))
        self.kept: set[str] = set()  # uploaded already: a failure after the output's upload keeps the rest only

    def make(self) -> None:
        """A folder a killed worker left at this name (a job dir made again at the same place) is cleared.
        A parent another attempt's ``drop`` removed as it was made is made again."""
        with space_for(self.folder):
            shutil.rmtree(self.folder, ignore_errors=True)
            for tries_left in (2, 1, 0):
                try:
                    self.folder.mkdir(parents=True)
                    return
                except FileNotFoundError:
                    if not tries_left:
                        raise

    def shard(self, sid: str) -> Path:
        """Downloaded beside the attempt's files, under the shard file's own name (runners may read it)."""
        source = self.job.shard_file(sid)
        local = self.folder / source.name
        with space_for(local):
            self.job.store.download(self.job.key(source), local)
        return local

    def keep(self, digest: OutputDigest | None = None) -> None:
        """The output first, then its Parquet files: a failure after it (its check, an upload) keeps the log
        with its traceback."""
        if digest is not None:
            self._upload(AttemptDir.OUTPUT)
            self._check(digest)
            self._upload_present(BESIDE)
        self._upload_present(KEPT)

    def drop(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
        # the shard's, this process's, then the job's on this node (``dje-<hash>``): each once nothing uses it
        for folder in (self.folder.parent, self.folder.parent.parent, self.folder.parent.parent.parent):
            try:
                folder.rmdir()  # once nothing else of it runs here
            except OSError:
                break

    def _upload_present(self, names: tuple[str, ...]) -> None:
        """Those of ``names`` the runner wrote, not kept already, in order."""
        for name in names:
            if name not in self.kept and (self.folder / name).exists():
                self._upload(name)

    def _upload(self, name: str) -> None:
        key = f"{self.prefix}/{name}"
        if self.job.store.upload(key, self.folder / name, create_once=True) is None:
            raise IntegrityError(
                f"{self.job.store.describe()}: {key} was already there when attempt {self.attempt} of {self.sid} "
                "uploaded it; something other than this attempt wrote it: not publishing"
            )
        self.kept.add(name)

    def _check(self, digest: OutputDigest) -> None:
        """Re-read the stored output (one streamed GET on S3) and compare it with what was checked here
        (invariant 5)."""
        key = f"{self.prefix}/{AttemptDir.OUTPUT}"
        with self.job.open_output(self.sid, self.job.attempt_output(self.sid, self.attempt)) as stream:
            stored = digest_file(stream)
        if (stored.bytes, stored.sha256) != (digest.bytes, digest.sha256):
            raise IntegrityError(
                f"{self.job.store.describe()}: {key} reads back as {stored.bytes} bytes, sha256 "
                f"{stored.sha256[:12]}…, not the {digest.bytes} bytes, sha256 {digest.sha256[:12]}… uploaded"
            )


def scratch_base(job: JobDir, root: str | os.PathLike | None = None) -> Path:
    """``<root or $TMPDIR>/dje-<hash>``: one folder per job dir and generation on this node."""
    where = f"{job.store.describe()}\0{job.generation}".encode()
    return Path(root or tempfile.gettempdir()) / f"dje-{hashlib.sha256(where).hexdigest()[:16]}"


def process_folder(base: Path) -> Path:
    """This process's folder under ``base``; its first use in a process removes the folders of this node's
    processes that provably no longer run (killed workers: their shards and partial outputs)."""
    me = identity()
    mine = f"p{me['pid']}-{me['start'] or 0}"
    if (str(base), me["pid"]) not in _swept:
        _swept.add((str(base), me["pid"]))
        _remove_dead(base, mine)
    return base / mine


_swept: set[tuple[str, int]] = set()  # (base, pid): swept once per process


def _remove_dead(base: Path, mine: str) -> None:
    try:
        names = os.listdir(base)
    except OSError:
        return  # nothing yet (or unreadable: left as it is)
    host = hostname()
    for name in names:
        m = _PROCESS.fullmatch(name)
        if m and name != mine and holder_gone({"host": host, "pid": int(m[1]), "start": int(m[2]) or None}, host):
            shutil.rmtree(base / name, ignore_errors=True)


_PROCESS = re.compile(r"p(\d+)-(\d+)")


def placement_for(job: JobDir, sid: str, attempt: int, scratch: Path | None = None) -> Placement:
    """``Direct`` on a POSIX job dir, else ``Scratch`` under ``scratch`` (tests pass one to force it on POSIX)."""
    if scratch is None and job.files_are_local:
        return Direct(job, sid, attempt)
    return Scratch(job, sid, attempt, scratch or scratch_base(job))
