"""The job directory: its layout, its generations, and path confinement.

    <job_dir>/
      manifest.json                 immutable once published: input, row rules, the shards' rows and bytes
      shards/_table.jsonl           the rest of each shard's facts, a line each (job.shard_table)
      shards/part-00000-of-00016.jsonl
      current.json                  the generation the latest submission works on
      runs/<run-key>/               coordination state of one submission (elections, abort, members)
      generations/<gen>/            one per recipe (<gen>: the first 16 hex digits of its sha256)
        generation.json             recipe sha256, created_at (published once)
        recipe.yaml                 snapshot of the recipe (yaml.safe_load only)
        policy.json                 run-time policy of the latest submission of this recipe
        attempts/<shard>/<attempt>/ attempt.json, process.log, work dir, processed.jsonl
        state/claims/<shard>@<attempt>  one lease file per attempt; heartbeat = mtime
        state/done/<shard>.json     first publication wins
        state/failed/<shard>.json   terminal failure after the retry budget
        state/retry/<shard>.json    attempts up to here no longer count (written by retry)
        state/workers/<worker>.json one per worker process: the attempts it started, what it published
        state/lanes/<k>             best-effort hint: the next unclaimed shard of lane k
        state/progress.json         the job's state summed from the worker records (rebuilt by anyone)
        state/history/              what retry archived; nothing is ever deleted
        state/clock/                probe files for the server clock
        finalize/<key>/             the finalize election of one set of done records
        merge.json                  what the merge verified and wrote

The shards depend only on the input, the shard count and the row rules; the
ops live in a generation, so a changed recipe reuses the shards and keeps its
own attempts, records and merge. A ``JobDir`` is one generation of one job:
``JobDir(root)`` is the current generation, ``JobDir(root, gen)`` or
``JobDir("<root>/generations/<gen>")`` a named one, and its ``manifest()``
carries that generation's recipe sha256 and policy. A schema-3 job dir (made
before generations) is read as one generation at the top of the job dir.

Every path read from a record is confined to the job directory: absolute
paths and ``..`` are refused, never followed. The manifest carries a digest of
its own content (``manifest_digest``), so an edit after prepare is refused.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from data_juicer_elastic.errors import IntegrityError, UserError
from data_juicer_elastic.job.attempt_files import AttemptDir
from data_juicer_elastic.job.manifest import (
    INLINE_SHARDS,
    LEGACY_SCHEMA,
    READABLE,
    Manifest,
    Policy,
    ShardSpec,
    manifest_digest,
)
from data_juicer_elastic.job.records._read import MISSING, load_key, load_record
from data_juicer_elastic.job.shard_table import shard_id
from data_juicer_elastic.storage.files import create_exclusive
from data_juicer_elastic.storage.posix import PosixStore
from data_juicer_elastic.storage.store import Store, store_for
from data_juicer_elastic.storage.urls import ObjectPath, is_s3

SHARD_ID_RE = re.compile(r"^part-(\d{5,})-of-(\d{5,})$")
GENERATION_RE = re.compile(r"^[0-9a-f]{16}$")
GENERATIONS = "generations"
DJ_WORK = "dj-work"  # Data-Juicer's work dir of the dj-process runs on this job
SHARDS_CHECKED = ".shards-checked"  # -<mtime_ns>: a worker checked shards/ in that state for links out


def generation_id(recipe_sha256: str) -> str:
    """A generation is named by its recipe: the same recipe always works in the same generation."""
    return recipe_sha256[:16]


def attempt_name(attempt: int) -> str:
    return f"{attempt:04d}"


def confine(root: Path, rel: str, what: str = "path") -> Path:
    """Resolve ``rel`` inside ``root``; refuse absolute paths, ``..`` and symlink escapes."""
    if not isinstance(rel, str) or not rel or os.path.isabs(rel) or ".." in Path(rel).parts:
        raise IntegrityError(f"{what} {rel!r} in {root} points outside the job directory; refusing to follow it")
    path = root / rel
    if isinstance(root, ObjectPath):
        return path  # an object store has no links: the name is the object
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    if real != real_root and not real.startswith(real_root + os.sep):
        raise IntegrityError(f"{what} {rel!r} in {root} resolves outside the job directory; refusing to follow it")
    return path


@dataclass(frozen=True)
class Generation:
    """One recipe's run over the job's shards (``generations/<id>/generation.json``)."""

    id: str
    recipe_sha256: str
    created_at: float = 0.0


@dataclass
class JobDir:
    """Paths of one generation of one job directory. Creating this object touches nothing on disk.

    ``root`` is the job directory (manifest, shards, runs); ``gen_dir`` holds
    everything the generation's ops produce. ``str(job.gen_dir)`` names this
    generation to another process (``JobDir(that path)``).
    """

    root: Path  # an ``ObjectPath`` (``s3://...`` as a path that is no local file) for a job dir on an object store
    _manifest: Manifest | None = field(default=None, repr=False)

    def __init__(
        self, root: str | os.PathLike, generation: str | None = None, *, shared_link_check: bool = False
    ) -> None:
        self._store: Store | None = None
        text = str(root) if isinstance(root, ObjectPath) else os.fspath(root)  # an ObjectPath has no fspath
        if is_s3(text):
            path: Path = ObjectPath.of(text)
            named = len(path.parts) > 3 and path.parent.name == GENERATIONS and GENERATION_RE.match(path.name)
            if generation is None and named:  # /, bucket, [prefix...,] generations, <gen>
                job = store_for(str(path.parent.parent))  # a generation's URL, as ``str(job.gen_dir)`` names it
                if job.head("manifest.json") is not None:
                    path, generation, self._store = path.parent.parent, path.name, job
            self._store = self._store or store_for(text)
        else:
            path = Path(os.path.abspath(root))
            if (
                generation is None
                and path.parent.name == GENERATIONS
                and (path.parent.parent / "manifest.json").exists()
            ):
                path, generation = path.parent.parent, path.name
        self.root = path
        self._generation = generation
        self._manifest = None
        self._raw: Manifest | None = None
        self._gen_dir: Path | None = None  # checked once: a generation's folder is never removed
        self._gen_raw: dict[str, Any] = {}  # generation.json as read, per generation (published once, never changed)
        # lane -> (hint, tail) this object's readers learned (worker.lanes): claims are never undone, so the
        # highest hint and lowest tail seen stay true, and a lane seen exhausted is not read again
        self.lane_ends: dict[int, tuple[int, int]] = {}
        self.shared_link_check = shared_link_check  # a worker: shards/ is listed once per change, by one process

    @property
    def store(self) -> Store:
        """The job dir as a Store (keys relative to ``root``): the records moved off paths go through it."""
        if self._store is None:
            self._store = PosixStore(self.root)
        return self._store

    @property
    def files_are_local(self) -> bool:
        """Does a path name this job's files (a POSIX store: hard links, a runner writing in place, pyarrow
        reading a path)? Else every file goes through ``store`` (an object store; a test's wrapped store)."""
        return isinstance(self.store, PosixStore)

    @property
    def on_object_store(self) -> bool:
        """A job dir given as an ``s3://`` URL: no folders, no links, every read through ``store``."""
        return isinstance(self.root, ObjectPath)

    def _read_json(self, path: Path) -> Any:
        """The JSON at ``path`` in the job dir, read through the store; FileNotFoundError when missing."""
        raw = load_key(self.store, self.key(path))
        if raw is MISSING:
            raise FileNotFoundError(errno.ENOENT, "missing", str(path))
        return raw

    def key(self, path: Path) -> str:
        """``path`` (inside the job dir) as a store key: relative to ``root``, '/'-separated."""
        return path.relative_to(self.root).as_posix()

    # generations ----------------------------------------------------------
    @property
    def generations_dir(self) -> Path:
        return self.root / GENERATIONS

    @property
    def current_path(self) -> Path:
        return self.root / "current.json"

    def legacy(self) -> bool:
        """A schema-3 job dir: one generation, at the top of the job dir (told by its layout, not its manifest)."""
        return not self.on_object_store and (self.root / "state").is_dir()  # schema 3 predates object stores

    @property
    def generation(self) -> str:
        """This object's generation id: the one named, else the current one.

        "" for a schema-3 job dir, and (not remembered) while the job has no generation yet.
        """
        if self._generation is None:
            gen = "" if self.legacy() else self._current()
            if not gen and not self.legacy():
                return ""
            self._generation = gen
        return self._generation

    def _current(self) -> str:
        gen = load_record(self.store, self.key(self.current_path)).get("generation", "")
        if not gen:
            known = self.generation_ids()
            gen = known[-1] if known else ""
        return gen

    def _no_generation(self) -> UserError:
        return UserError(f"{self.root}: no generation yet; run the job (dj-process) or `dj-elastic prepare` first")

    def generation_ids(self) -> list[str]:
        """Every generation of this job, oldest first."""
        gens = [g for g in self.store.names(GENERATIONS) if GENERATION_RE.match(g)]  # a missing folder has none
        if self.on_object_store:  # a prepare killed before a generation's record (made last) left a name only
            gens = [g for g in gens if self._has_generation(g)]
        return sorted(gens, key=lambda g: (self._generation_record(g).created_at, g))

    def _generation_record(self, gen: str) -> Generation:
        try:
            raw = self._generation_json(gen)
            if raw is MISSING:
                raise FileNotFoundError(errno.ENOENT, "missing", str(self.generations_dir / gen / "generation.json"))
            return Generation(gen, raw["recipe_sha256"], raw.get("created_at", 0.0))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise IntegrityError(
                f"{self.generations_dir / gen / 'generation.json'}: missing or unreadable ({exc!r}); "
                "name another generation or run the job again"
            ) from exc

    def _generation_json(self, gen: str) -> Any:
        """``generation.json`` of ``gen`` parsed (``MISSING`` when absent), kept once read: it is published once,
        so the manifest's load and the check that the generation exists share one read. Raises OSError/ValueError."""
        raw = self._gen_raw.get(gen, MISSING)
        if raw is MISSING:
            raw = load_key(self.store, self.key(self.generations_dir / gen / "generation.json"))
            if raw is not MISSING:
                self._gen_raw[gen] = raw
        return raw

    def _has_generation(self, gen: str) -> bool:
        if self.on_object_store:  # no folders: a generation is there once its record is (made last)
            try:  # one GET, kept for the manifest's load (a HEAD, then that GET, was two requests)
                return self._generation_json(gen) is not MISSING
            except (OSError, ValueError):  # there but unreadable: it exists (its load says what is wrong)
                return self.store.head(self.key(self.generations_dir / gen / "generation.json")) is not None
        return (self.generations_dir / gen).is_dir()

    @property
    def gen_dir(self) -> Path:
        if self._gen_dir is not None:
            return self._gen_dir
        gen = self.generation
        if not gen:  # a schema-3 job dir; or none yet: a folder that never exists, so pollers see nothing
            if self.legacy():
                self._gen_dir = self.root
                return self.root
            return self.generations_dir / ".none-yet"
        if not GENERATION_RE.match(gen) or not self._has_generation(gen):
            known = ", ".join(self.generation_ids()) or "none"
            raise UserError(f"{self.root}: no generation {gen!r} (generations: {known}); name one of these")
        self._gen_dir = self.generations_dir / gen
        return self._gen_dir

    @property
    def policy_path(self) -> Path:
        return self.gen_dir / "policy.json"

    # layout ---------------------------------------------------------------
    @property
    def manifest_path(self) -> Path:
        return self.root / "manifest.json"

    @property
    def recipe_path(self) -> Path:
        return self.gen_dir / "recipe.yaml"

    @property
    def shards_dir(self) -> Path:
        return self.root / "shards"

    @property
    def attempts_dir(self) -> Path:
        return self.gen_dir / "attempts"

    @property
    def state_dir(self) -> Path:
        return self.gen_dir / "state"

    @property
    def claims_dir(self) -> Path:
        return self.state_dir / "claims"

    @property
    def done_dir(self) -> Path:
        return self.state_dir / "done"

    @property
    def failed_dir(self) -> Path:
        return self.state_dir / "failed"

    @property
    def retry_dir(self) -> Path:
        return self.state_dir / "retry"

    @property
    def history_dir(self) -> Path:
        return self.state_dir / "history"

    @property
    def clock_dir(self) -> Path:
        return self.state_dir / "clock"

    @property
    def runs_dir(self) -> Path:
        return self.root / "runs"

    @property
    def dj_work_dir(self) -> Path:
        """Data-Juicer's own work dir of each dj-process (its logs, config backup), one folder per run."""
        return self.root / DJ_WORK

    @property
    def finalize_dir(self) -> Path:
        return self.gen_dir / "finalize"

    @property
    def merge_record_path(self) -> Path:
        return self.gen_dir / "merge.json"

    @property
    def workers_dir(self) -> Path:
        return self.state_dir / "workers"

    @property
    def lanes_dir(self) -> Path:
        return self.state_dir / "lanes"

    @property
    def progress_path(self) -> Path:
        return self.state_dir / "progress.json"

    STATE_SUBDIRS = ("claims", "done", "failed", "retry", "history", "clock", "workers", "lanes")

    def done_path(self, sid: str) -> Path:
        return self.done_dir / f"{sid}.json"

    def failed_path(self, sid: str) -> Path:
        return self.failed_dir / f"{sid}.json"

    def done_key(self, sid: str) -> str:
        """The done record's store key (``done_path`` relative to the job root)."""
        return self.key(self.done_path(sid))

    def failed_key(self, sid: str) -> str:
        """The failed record's store key (``failed_path`` relative to the job root)."""
        return self.key(self.failed_path(sid))

    def done_ids(self) -> set[str]:
        """Shards with a done record (one listing of names)."""
        return self._record_ids(self.done_dir)

    def failed_ids(self) -> set[str]:
        """Shards with a terminal failure record (one listing of names)."""
        return self._record_ids(self.failed_dir)

    def _record_ids(self, folder: Path) -> set[str]:
        """The ``<id>.json`` names in ``folder`` (``Store.names``: nothing stat'd; a missing folder has none)."""
        return {n[:-5] for n in self.store.names(self.key(folder)) if n.endswith(".json")}

    def retry_path(self, sid: str) -> Path:
        return self.retry_dir / f"{sid}.json"

    def attempt_dir(self, sid: str, attempt: int) -> Path:
        return self.attempts_dir / sid / attempt_name(attempt)

    def attempt_output(self, sid: str, attempt: int) -> Path:
        return self.attempt_dir(sid, attempt) / AttemptDir.OUTPUT

    def attempt_key(self, sid: str, attempt: int) -> str:
        """The attempt record's store key (``attempts/<shard>/<attempt>/attempt.json`` relative to the job root)."""
        return self.key(self.attempt_dir(sid, attempt) / AttemptDir.RECORD)

    def open_output(self, shard: str, path: Path) -> BinaryIO:
        """An attempt's file (``path`` in this job dir) as a stream through the store, for merge, verify and the
        exports; IntegrityError, naming the shard and what to do, when it is missing or unreadable."""
        try:
            stream = self.store.open_read(self.key(path))
            if stream is not None:
                return stream
            reason = "it is missing"
        except OSError as exc:
            reason = exc.strerror or str(exc)
        raise IntegrityError(f"shard {shard}: {path} cannot be read ({reason}); restore it or rerun the shard")

    def confine(self, rel: str, what: str = "path") -> Path:
        return confine(self.root, rel, what)

    def relative(self, path: Path) -> str:
        """``path`` as records store it: relative to the job directory."""
        return str(path.relative_to(self.root))

    # manifest -------------------------------------------------------------
    def exists(self) -> bool:
        return self.store.head(self.key(self.manifest_path)) is not None

    def manifest(self) -> Manifest:
        """The manifest with this generation's recipe sha256 and policy, loaded and checked once."""
        if self._manifest is None:
            m = self._raw_manifest()
            if not self.generation and not self.legacy():
                raise self._no_generation()
            if self.generation:
                record = self._generation_record(self.generation)
                m = dataclasses.replace(m, recipe_sha256=record.recipe_sha256, policy=self._policy(m.policy))
            self._manifest = m
        return self._manifest

    def _policy(self, prepared: Policy) -> Policy:
        """The generation's run-time policy (its latest submission's); the shard count never changes."""
        try:
            raw = self._read_json(self.policy_path)
            policy = Policy(**raw)
        except FileNotFoundError:
            return prepared
        except (OSError, ValueError, TypeError) as exc:
            raise IntegrityError(f"{self.policy_path}: unreadable policy ({exc!r}); run the job again") from exc
        if policy.num_shards != prepared.num_shards:
            raise IntegrityError(f"{self.policy_path}: num_shards {policy.num_shards} is not the manifest's")
        return policy

    def _raw_manifest(self) -> Manifest:
        """manifest.json as published (cached: it is immutable)."""
        if self._raw is not None:
            return self._raw
        try:
            raw = self._read_json(self.manifest_path)
        except FileNotFoundError:
            raise UserError(
                f"{self.root}: no manifest.json; run `dj-elastic prepare` (or dj-process) for this job first"
            ) from None
        except ValueError as exc:
            raise IntegrityError(f"{self.manifest_path}: not valid JSON ({exc}); prepare the job again") from exc
        if not isinstance(raw, dict):
            raise IntegrityError(f"{self.manifest_path}: not a JSON object; prepare the job again")
        if raw.get("schema_version") in READABLE and raw.get("digest") != manifest_digest(raw):
            raise IntegrityError(
                f"{self.manifest_path}: was edited after prepare (its content does not match its digest); "
                "restore it, or prepare the job again in a new job dir"
            )
        m = Manifest.from_dict(raw, str(self.manifest_path), self.root, self.store)
        if (m.schema_version == LEGACY_SCHEMA) != self.legacy():
            raise IntegrityError(
                f"{self.manifest_path}: schema_version {m.schema_version} does not match the job dir's layout "
                "(state/ at the top is schema 3, generations/ is schema 4); restore it, or prepare a new job dir"
            )
        self._check(m)
        self._raw = m
        return m

    def _check(self, m: Manifest) -> None:
        n = len(m.shards)
        if n != m.policy.num_shards or n < 1:
            raise IntegrityError(f"{self.manifest_path}: {n} shards listed but num_shards is {m.policy.num_shards}")
        if m.schema_version in INLINE_SHARDS:  # schema 6 stores no ids or paths: they follow from the index
            where = self.manifest_path
            for i, s in enumerate(m.shards):
                if s.id != shard_id(i, n):
                    raise IntegrityError(f"{where}: shard {i} is named {s.id!r}, expected {shard_id(i, n)!r}")
                if s.path != f"shards/{s.id}.jsonl":
                    raise IntegrityError(f"{where}: shard {s.id} path {s.path!r} is not shards/{s.id}.jsonl")
        self._check_shard_links()

    def _check_shard_links(self) -> None:
        """Refuse a shard replaced by a link out of the job dir, before anything runs.

        One listing of shards/ (only links need resolving: each file is confined again when opened, in
        ``shard_file``). A worker process (``shared_link_check``) lists it only if no process has yet
        checked the folder in its current state (its mtime names an O_EXCL marker): a listing per worker
        start would cost O(shards) on every node. Other readers list it and write nothing.
        """
        if self.on_object_store:
            return  # no links there
        shards_dir = self.confine("shards", "shards folder")
        try:
            stamp = os.stat(shards_dir).st_mtime_ns
        except FileNotFoundError:
            return
        marker = self.root / f"{SHARDS_CHECKED}-{stamp}"
        if os.path.lexists(marker):
            return
        if self.shared_link_check:
            try:
                if not create_exclusive(marker, b""):
                    return  # another worker checks (or checked) the folder as it is now
            except OSError:
                pass  # a read-only job dir: list it
        try:
            with os.scandir(shards_dir) as entries:
                links = sorted(e.name for e in entries if e.is_symlink())
            for name in links:
                self.confine(f"shards/{name}", "shard path")
        except IntegrityError:
            if self.shared_link_check:
                with contextlib.suppress(OSError):
                    os.unlink(marker)
            raise

    def shard(self, sid: str) -> ShardSpec:
        if not SHARD_ID_RE.match(sid or ""):
            raise UserError(f"{sid!r} is not a shard id (expected part-NNNNN-of-NNNNN)")
        shards = self.manifest().shards
        idx = shards.position(sid)
        if idx is None:
            raise UserError(f"{self.root}: no shard {sid!r} in this job ({len(shards)} shards)")
        return shards[idx]

    def shard_file(self, sid: str) -> Path:
        return self.confine(self.shard(sid).path, "shard path")
