"""The run's coordination folder: elections, published outcomes, abort, members.

A run keeps all of it in ``<job_dir>/runs/<run-key>/``, inside the job dir
(prepare publishes the shards and the manifest around it); a generation's
finalize elections use the same records in ``generations/<gen>/finalize/``.
Every record goes through the job dir's store (``storage.store``: keys
relative to the job root), as an object store will hold it: an election, an
outcome, the abort and ``run.json`` are ``create``d once (the first writer
wins and nobody reads a half record), a member record and a succession copy
are ``replace``d, ages are the store's own clock (``now``, ``head``) and
members are one ``list``. Folders are made by the store on demand. A
``RunDir`` is made from the job's store (``JobDir.store``) and the folder's
key, so the same records serve a job dir on S3.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from data_juicer_elastic.coordination.run_id import safe_key
from data_juicer_elastic.errors import UserError
from data_juicer_elastic.job.records._read import MISSING, load_key
from data_juicer_elastic.storage.files import dumps_json, json_object
from data_juicer_elastic.storage.host import holder_gone, identity
from data_juicer_elastic.storage.posix import PosixStore
from data_juicer_elastic.storage.store import Store, Ver

EXIT_OK, EXIT_FAILED = 0, 2


@dataclass(frozen=True)
class Outcome:
    """A published result: every process that reads it exits with ``exit_code``."""

    exit_code: int
    message: str
    host: str = ""
    pid: int = 0
    hosts: dict[str, int] = field(default_factory=dict)
    generation: str = ""  # a prepare outcome: the generation it prepared

    @classmethod
    def from_dict(cls, d: Mapping) -> Outcome:
        return cls(
            int(d["exit_code"]),
            str(d["message"]),
            str(d.get("host", "")),
            int(d.get("pid", 0)),
            dict(d.get("hosts") or {}),
            str(d.get("generation", "")),
        )


def run_key(run_id: str) -> str:
    """One run's folder as a key of the job dir's store: ``runs/<run-key>``."""
    return f"runs/{safe_key(run_id)}"


def run_root(job_dir: str | os.PathLike, run_id: str) -> Path:
    """Where one run's coordination state lives: ``<job_dir>/runs/<run-key>/``."""
    return Path(os.path.abspath(job_dir)) / run_key(run_id)


@dataclass(frozen=True)
class RunDir:
    """One folder of a run's coordination state (elections, outcomes, abort, members), as keys of a store."""

    store: Store  # the job dir's store; on POSIX with this process's clock probe in the folder (``at``)
    prefix: str  # the folder's key: runs/<run-key>, or generations/<gen>/finalize/<key>-<n>
    run_id: str
    host: str
    pid: int
    won: dict[str, Ver | None] = field(default_factory=dict, repr=False, compare=False)  # ballots this process wrote

    @classmethod
    def at(cls, store: Store, prefix: str, run_id: str, host: str, pid: int | None = None) -> RunDir:
        """The folder ``prefix`` of the job dir's ``store``; touches nothing.

        On POSIX each process ages ballots by its own clock probe, ``<prefix>/clock/<host>-<pid>`` (a store
        on the same root with that clock key), as it always did: no file is touched by every process of the
        job. A store whose clock is its own (S3: a HEAD's ``Date``) is used as it is.
        """
        pid = os.getpid() if pid is None else pid
        return cls(store.with_clock(f"{prefix}/clock/{safe_key(host)}-{pid}"), prefix, run_id, host, pid)

    @classmethod
    def open(cls, store: Store, prefix: str, run_id: str, host: str) -> RunDir:
        """``at``, and ``run.json`` (the run's id and start) created once by whoever comes first."""
        run = cls.at(store, prefix, run_id, host)
        try:
            run.store.create(run.key("run.json"), dumps_json({"run_id": run_id, "created_at": time.time()}))
        except OSError as exc:
            raise UserError(
                f"{run.where()}: cannot create the run's coordination folder ({exc.strerror or exc}); "
                "check that the job dir's parent is on the shared filesystem and writable"
            ) from exc
        return run

    def key(self, name: str) -> str:
        """``name`` (relative to this folder) as a key of ``store``."""
        return f"{self.prefix}/{name}"

    def where(self, name: str = "") -> str:
        """``name`` (the folder itself when empty) as messages name it: its path on POSIX, else store and key."""
        key = self.key(name) if name else self.prefix
        return str(self.store.path(key)) if isinstance(self.store, PosixStore) else f"{self.store.describe()} {key}"

    def now(self) -> float:
        return self.store.now()

    def register(self, rank: int | None) -> None:
        record = {"host": self.host, "pid": self.pid, "local_rank": rank, "at": time.time()}
        self.store.replace(self.key(f"members/{safe_key(self.host)}-{self.pid}.json"), dumps_json(record))

    def member_hosts(self) -> list[str]:
        keys = [e.key for e in self.store.list(self.key("members")) if e.key.endswith(".json")]
        return sorted({_record(self.store, k).get("host", "?") for k in keys})

    def record(self, name: str) -> dict:
        """The JSON object ``name`` holds; {} when it is missing, unreadable or no object."""
        return _record(self.store, self.key(name))

    def elect(self, name: str, *, replace_gone: bool = False) -> tuple[bool, dict]:
        """Stand in the election ``name``: (won, the winner's ballot).

        With ``replace_gone``, a winner of this host that provably no longer runs (``storage.host.holder_gone``:
        a node killed and started again under the same host name) is replaced at once (``_succeed``). A won
        ballot's version (its create's, or the succession's replace's) is kept in ``won``: the coordinator's
        refresher renews the ballot from it.
        """
        ballot = {"host": self.host, "at": time.time(), **identity(), "pid": self.pid}
        data = dumps_json(ballot)
        meta = self.store.create(self.key(name), data)
        if meta is not None:
            self.won[name] = meta.ver
            return True, ballot
        if not replace_gone:
            return False, self.record(name)
        return self._succeed(name, ballot, data)

    def _succeed(self, name: str, ballot: dict, data: bytes) -> tuple[bool, dict]:
        """Take over election ``name`` from gone winners of this host, or find the live winner.

        Succession is a chain of keys created once: whoever creates ``<name>.after-<hash of the gone
        ballot>`` (its content: the successor's ballot, byte for byte) succeeds that ballot, so of several
        restarted processes exactly one does; it then replaces ``<name>`` with its ballot for readers. A
        successor that died before (or after) that copy is itself succeeded through the next link, named
        after its own ballot's bytes, so the chain never forks.
        """
        key = self.key(name)
        current = _bytes(self.store, key)
        if current is None:
            return False, self.record(name)
        while True:
            held = json_object(current)
            if not holder_gone(held, self.host):
                return False, held
            link = f"{key}.after-{hashlib.sha256(current).hexdigest()[:24]}"
            if self.store.create(link, data) is not None:  # appears whole: a reader never sees a link being written
                self.won[name] = self.store.replace(key, data)
                return True, ballot
            current = _bytes(self.store, link)
            if current is None:
                return False, held

    def publish(self, name: str, outcome: Outcome) -> Outcome:
        """Publish ``outcome`` unless one is there already; return the one that counts."""
        if self.store.create(self.key(name), dumps_json(asdict(outcome))) is not None:
            return outcome
        return self.read(name) or outcome

    def read(self, name: str) -> Outcome | None:
        """The outcome ``name`` holds; None when there is none; a failed one naming it when it is unreadable."""
        try:
            return _outcome(self.store, self.key(name))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return Outcome(EXIT_FAILED, f"{self.where(name)} is unreadable ({exc!r})")

    def abort(self, message: str) -> Outcome:
        """Stop the whole run; the first abort wins and every process reports it."""
        return self.publish("abort.json", Outcome(EXIT_FAILED, message, self.host, self.pid))

    def aborted(self) -> Outcome | None:
        return self.read("abort.json")

    def heartbeat_age(self, name: str) -> float:
        """Seconds since the ballot ``name`` was renewed, on the store's clock (read first); 0 when missing."""
        meta = self.store.head(self.key(name), now=self.now())
        return 0.0 if meta is None else meta.age


def _bytes(store: Store, key: str) -> bytes | None:
    """``key``'s bytes; None when it is missing or cannot be read."""
    try:
        got = store.read(key)
    except OSError:
        return None
    return None if got is None else got[0]


def _record(store: Store, key: str) -> dict:
    data = _bytes(store, key)
    return {} if data is None else json_object(data)


def _outcome(store: Store, key: str) -> Outcome | None:
    """The outcome at ``key``, None when missing; raises OSError, ValueError, KeyError or TypeError if unreadable."""
    raw = load_key(store, key)
    return None if raw is MISSING else Outcome.from_dict(raw)


def read_outcome(store: Store, key: str) -> Outcome | None:
    """The outcome at ``key``; None when it is missing or unreadable (a finalize round, a test's summary)."""
    try:
        return _outcome(store, key)
    except (OSError, ValueError, KeyError, TypeError):
        return None
