"""The worker record, ``state/workers/<worker>.json``: what one worker process started and published.

Each worker process rewrites its own record (atomic replace; nobody else
writes it). It names every attempt the process started and has not yet
counted as published (``pairs``: shard, attempt), and is written BEFORE the
lease of a new attempt is created, so a process killed at any moment leaves
a trace of what it held: a released lease (a failed or interrupted attempt),
a lease that goes stale, or a hole (the record names an attempt whose lease
was never created). The totals (shards published, rows, bytes, seconds, the
latest per-shard rates) let anyone sum the job's progress and its rate from
one small file per process instead of one done record per shard.

A shard is counted done exactly once: its done record names one attempt and
the worker that ran it (``DoneRecord.worker``); that worker's record either
still lists the attempt among its pairs (counted through the done record) or
moved it to ``published`` in the same rewrite that dropped the pair.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass, field

import orjson

from data_juicer_elastic.job.records._read import int_or, number_or_none
from data_juicer_elastic.storage.store import Store

RATES_KEPT = 16  # per-shard rates (input bytes per second) a record keeps, newest last


@dataclass
class WorkerRecord:
    worker: str  # <host>-<pid>-<random>: unique even when a pid is reused
    host: str
    pid: int
    pairs: list[tuple[str, int]] = field(default_factory=list)  # attempts started, not counted as published
    published: int = 0  # done records this process published and dropped from ``pairs``
    input_rows: int = 0  # the manifest's rows of those shards
    output_rows: int = 0
    error_rows: int = 0
    bytes_in: int = 0
    secs: float = 0.0  # processing seconds of those shards
    first_start: float | None = None
    last_finish: float | None = None
    rates: list[float] = field(default_factory=list)  # input bytes per second of its latest shards

    def to_bytes(self) -> bytes:
        d = dataclasses.asdict(self)
        d["pairs"] = [list(p) for p in self.pairs]
        return orjson.dumps(d)


def read_key(store: Store, key: str) -> bytes | None:
    """A small key's bytes; None when missing (a link or a folder at its name
    is none) or unreadable (ESTALE, EACCES)."""
    try:
        got = store.read(key)
    except OSError:
        return None
    return got[0] if got else None


def write_worker(store: Store, prefix: str, record: WorkerRecord) -> None:
    """Replace the record whole at ``<prefix>/<worker>.json`` (``prefix``: the workers folder's key). Fsynced
    before the rename, the folder not (``durable=False``, as these records were always written: a crash of the file
    server may bring back an older version, never a cut one). A missing folder (a job dir made before worker
    records) is made by the first write."""
    store.replace(f"{prefix}/{record.worker}.json", record.to_bytes(), durable=False)


def load_worker(store: Store, key: str) -> WorkerRecord | None:
    """A worker record; None when missing or not one (a link or a folder at its name, unreadable, not a
    record: it then adds nothing to the sums)."""
    data = read_key(store, key)
    try:
        raw = orjson.loads(data) if data else None
    except ValueError:
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("worker"), str):
        return None
    pairs = [
        (p[0], p[1])
        for p in raw.get("pairs") or []
        if isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) and type(p[1]) is int and p[1] > 0
    ]
    rates = [r for r in raw.get("rates") or [] if number_or_none(r) is not None and r > 0]
    return WorkerRecord(
        worker=raw["worker"],
        host=str(raw.get("host", "")),
        pid=int_or(raw.get("pid")),
        pairs=pairs,
        published=max(int_or(raw.get("published")), 0),
        input_rows=int_or(raw.get("input_rows")),
        output_rows=int_or(raw.get("output_rows")),
        error_rows=int_or(raw.get("error_rows")),
        bytes_in=int_or(raw.get("bytes_in")),
        secs=number_or_none(raw.get("secs")) or 0.0,
        first_start=number_or_none(raw.get("first_start")),
        last_finish=number_or_none(raw.get("last_finish")),
        rates=rates[-RATES_KEPT:],
    )


def read_workers(store: Store, prefix: str) -> tuple[list[WorkerRecord], int]:
    """Every readable worker record under ``prefix`` (one listing of a folder with one file per process; a
    missing folder has none), and how many listed records could not be read (ESTALE, a cut read, not a record)."""
    names = [n for n in store.names(prefix) if n.endswith(".json")]
    found = [r for r in (load_worker(store, f"{prefix}/{n}") for n in names) if r is not None]
    return found, len(names) - len(found)


class WorkerLedger:
    """This process's own worker record, kept in memory and rewritten before each new lease.

    Publishing does not rewrite it: the published attempt stays among the
    pairs on disk (counted through its done record) until the next rewrite
    moves it to ``published``; that rewrite comes with the next claim, or at
    the end (``flush``).
    """

    def __init__(self, store: Store, prefix: str, host: str, pid: int, token: str) -> None:
        self.store, self.prefix = store, prefix  # the job's store, the workers folder's key
        self.record = WorkerRecord(worker=f"{_safe(host)}-{pid}-{token}", host=host, pid=pid)
        self._dirty = False
        self._lock = threading.RLock()  # a prefetching worker claims, publishes and fails from several threads

    @property
    def worker(self) -> str:
        return self.record.worker

    def hold(self, shard: str, attempt: int) -> None:
        """Name (shard, attempt) on disk before its lease is created."""
        with self._lock:
            self.record.pairs.append((shard, attempt))
            self.flush(force=True)

    def drop(self, shard: str, attempt: int) -> None:
        """Forget an attempt that lost (superseded, beaten, or never created): it holds nothing."""
        with self._lock:
            self._remove(shard, attempt)

    def published(
        self,
        shard: str,
        attempt: int,
        input_rows: int,
        output_rows: int,
        error_rows: int,
        bytes_in: int,
        start: float | None,
        end: float | None,
    ) -> None:
        with self._lock:
            if self._remove(shard, attempt):
                self._count(input_rows, output_rows, error_rows, bytes_in, start, end)

    def _count(
        self, input_rows: int, output_rows: int, error_rows: int, bytes_in: int, start: float | None, end: float | None
    ) -> None:
        r = self.record
        r.published += 1
        r.input_rows += input_rows
        r.output_rows += output_rows
        r.error_rows += error_rows
        r.bytes_in += bytes_in
        if start is not None and end is not None and end > start:
            r.secs += end - start
            r.rates = [*r.rates, bytes_in / (end - start)][-RATES_KEPT:]
            r.first_start = start if r.first_start is None else min(r.first_start, start)
            r.last_finish = end if r.last_finish is None else max(r.last_finish, end)

    def latest_rate(self) -> float | None:
        return self.record.rates[-1] if self.record.rates else None

    def _remove(self, shard: str, attempt: int) -> bool:
        try:
            self.record.pairs.remove((shard, attempt))
        except ValueError:
            return False
        self._dirty = True
        return True

    def flush(self, force: bool = False) -> None:
        with self._lock:
            if force or self._dirty:
                write_worker(self.store, self.prefix, self.record)
                self._dirty = False


def _safe(host: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in host)[:64] or "host"
