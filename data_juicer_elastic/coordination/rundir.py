"""The run's coordination folder: elections, published outcomes, abort, members.

A run keeps all of it in ``<job_dir>/runs/<run-key>/``, inside the job dir
(prepare publishes the shards and the manifest around it); a generation's
finalize elections use the same records in ``generations/<gen>/finalize/``.
Every record is published once: the first writer wins and nobody reads a half
record.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import orjson

from data_juicer_elastic.coordination.run_id import safe_key
from data_juicer_elastic.errors import UserError
from data_juicer_elastic.storage.files import (
    atomic_write,
    dumps_json,
    publish_once,
    read_json,
    read_record,
    server_now,
)
from data_juicer_elastic.storage.host import holder_gone, identity

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


def run_root(job_dir: str | os.PathLike, run_id: str) -> Path:
    """Where one run's coordination state lives: ``<job_dir>/runs/<run-key>/``."""
    return Path(os.path.abspath(job_dir)) / "runs" / safe_key(run_id)


@dataclass(frozen=True)
class RunDir:
    """One folder of a run's coordination state: elections, outcomes, abort, members."""

    root: Path
    run_id: str
    host: str
    pid: int

    @classmethod
    def open(cls, root: Path, run_id: str, host: str, subdirs: tuple[str, ...] = ("hosts", "members")) -> RunDir:
        try:
            for sub in (*subdirs, "clock"):
                (root / sub).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(
                f"{root}: cannot create the run's coordination folder ({exc.strerror}); "
                "check that the job dir's parent is on the shared filesystem and writable"
            ) from exc
        publish_once(root / "run.json", dumps_json({"run_id": run_id, "created_at": time.time()}))
        return cls(root, run_id, host, os.getpid())

    def path(self, name: str) -> Path:
        return self.root / name

    def now(self) -> float:
        return server_now(self.root / "clock" / f"{safe_key(self.host)}-{self.pid}")

    def register(self, rank: int | None) -> None:
        record = {"host": self.host, "pid": self.pid, "local_rank": rank, "at": time.time()}
        atomic_write(self.root / "members" / f"{safe_key(self.host)}-{self.pid}.json", dumps_json(record))

    def member_hosts(self) -> list[str]:
        names = [n for n in os.listdir(self.root / "members") if n.endswith(".json") and not n.startswith(".")]
        return sorted({read_record(self.root / "members" / n).get("host", "?") for n in names})

    def elect(self, name: str, *, replace_gone: bool = False) -> tuple[bool, dict]:
        """Stand in the election ``name``: (won, the winner's ballot).

        With ``replace_gone``, a winner of this host that provably no longer runs (``storage.host.holder_gone``:
        a node killed and started again under the same host name) is replaced at once (``_succeed``).
        """
        ballot = {"host": self.host, "at": time.time(), **identity(), "pid": self.pid}
        data = dumps_json(ballot)
        if publish_once(self.path(name), data):
            return True, ballot
        if not replace_gone:
            return False, read_record(self.path(name))
        return self._succeed(name, ballot, data)

    def _succeed(self, name: str, ballot: dict, data: bytes) -> tuple[bool, dict]:
        """Take over election ``name`` from gone winners of this host, or find the live winner.

        Succession is a chain of files published once: whoever creates ``<name>.after-<hash of the gone
        ballot>`` (its content: the successor's ballot, byte for byte) succeeds that ballot, so of several
        restarted processes exactly one does; it then copies its ballot over ``<name>`` for readers. A
        successor that died before (or after) that copy is itself succeeded through the next link, named
        after its own ballot's bytes, so the chain never forks.
        """
        path = self.path(name)
        try:
            with open(path, "rb") as f:
                current = f.read()
        except OSError:
            return False, read_record(path)
        while True:
            held = _ballot(current)
            if not holder_gone(held, self.host):
                return False, held
            link = path.with_name(f"{path.name}.after-{hashlib.sha256(current).hexdigest()[:24]}")
            if publish_once(link, data):  # appears whole: a reader never sees a link being written
                atomic_write(path, data)
                return True, ballot
            try:
                with open(link, "rb") as f:
                    current = f.read()
            except OSError:
                return False, held

    def publish(self, name: str, outcome: Outcome) -> Outcome:
        """Publish ``outcome`` unless one is there already; return the one that counts."""
        if publish_once(self.path(name), dumps_json(asdict(outcome))):
            return outcome
        return self.read(name) or outcome

    def read(self, name: str) -> Outcome | None:
        try:
            return Outcome.from_dict(read_json(self.path(name)))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return Outcome(EXIT_FAILED, f"{self.path(name)} is unreadable ({exc!r})")

    def abort(self, message: str) -> Outcome:
        """Stop the whole run; the first abort wins and every process reports it."""
        return self.publish("abort.json", Outcome(EXIT_FAILED, message, self.host, self.pid))

    def aborted(self) -> Outcome | None:
        return self.read("abort.json")

    def heartbeat_age(self, name: str) -> float:
        try:
            return self.now() - os.stat(self.path(name)).st_mtime
        except FileNotFoundError:
            return 0.0


def _ballot(data: bytes) -> dict:
    try:
        held = orjson.loads(data)
    except ValueError:
        return {}
    return held if isinstance(held, dict) else {}


def read_outcome(path: Path) -> Outcome | None:
    d = read_record(path)
    try:
        return Outcome.from_dict(d) if d else None
    except (KeyError, TypeError, ValueError):
        return None
