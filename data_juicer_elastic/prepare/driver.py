"""Prepare: split a JSONL dataset into a job directory of validated, byte-balanced shards.

The shards and the manifest are built in a staging folder inside the job dir
(beside the coordination's ``runs/``); its ``shards/`` is renamed into place,
then its manifest is linked: ``manifest.json`` marks a prepared job, and a
prepare killed between the two steps is completed by the next one
(prep_staging). The input is read once:
shard boundaries come from file sizes plus a few small seeks (prep_split),
then each shard's byte ranges are validated, normalised, written and hashed
in one pass, one shard per worker (prep_shards); the same pass gives each
input range's sha256, and a stat of every input before and after tells a
changed input. The recipe is not part of the shards: every request gets its
recipe's generation (prep_generation). Repeating a request with the same
input, shard count and row rules is a cheap no-op (stat only; an input whose
mtime moved is re-hashed against its range digests); a different one is
refused with the keys that differ (prep_existing).
"""

from __future__ import annotations

import hashlib
import os
import queue
import shutil
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import yaml

from data_juicer_elastic.errors import UserError
from data_juicer_elastic.job.layout import DJ_WORK, JobDir, shard_id
from data_juicer_elastic.job.manifest import InputFile, Manifest, ShardSource, ShardSpec
from data_juicer_elastic.jsonl import RowRules
from data_juicer_elastic.prepare.existing import confirm_existing
from data_juicer_elastic.prepare.generation import ensure_generation
from data_juicer_elastic.prepare.inputs import (
    STAGING_MARK,
    Dataset,
    Materialised,
    changed_error,
    check_unchanged,
    discover,
    materialise,
)
from data_juicer_elastic.prepare.on_store import StoreStaging
from data_juicer_elastic.prepare.parquet import build as parquet_build
from data_juicer_elastic.prepare.pool import Counter, make_pool
from data_juicer_elastic.prepare.request import PrepareRequest
from data_juicer_elastic.prepare.schema import Conflict, describe, first_conflict, kinds_at, merge, resolve
from data_juicer_elastic.prepare.shards import (
    SYNC_EACH_FROM,
    ShardOutcome,
    ShardTask,
    SourceRange,
    count_rows,
    newlines_before,
    range_lines,
    sync_files,
    write_shard,
)
from data_juicer_elastic.prepare.split import Piece, Stream, TooFewRows, plan
from data_juicer_elastic.prepare.staging import Staging, complete_publication
from data_juicer_elastic.progress import ProgressBar
from data_juicer_elastic.storage.files import disk_full_in, fsync_dir, no_space_error
from data_juicer_elastic.storage.urls import is_s3

INLINE_BELOW = 32 << 20  # smaller inputs are not worth starting worker processes for
MAX_JOBS = 8
REMOTE_SEARCHES = 16  # an s3:// input's line-start searches (one ranged GET each) in flight at once


@dataclass(frozen=True)
class PrepareResult:
    manifest: Manifest
    created: bool
    rows: int
    bytes: int
    seconds: float


def prepare(
    req: PrepareRequest, *, progress: bool | None = None, log: Callable[[str], Any] = print, jobs: int | None = None
) -> PrepareResult:
    """Prepare ``req.job_dir`` (or confirm it already holds exactly this request).

    ``progress``: draw a bar on stderr (None: only when stderr is a terminal).
    ``jobs``: worker processes, 0 to work in this process (None: up to the CPU count, 0 for small inputs).
    """
    started = time.monotonic()
    recipe_sha = _check_request(req)
    job = JobDir(req.job_dir)
    if not job.exists():
        _refuse_occupied(job)
    if job.exists():
        return _existing(job, req, recipe_sha, started, log)
    dataset = discover(req.dataset_path, exclude=(str(job.root),))
    if note := dataset.skipped_note():
        log(note)
    # on an object store the build runs in node-local scratch and is uploaded key by key (prepare.on_store)
    staging = StoreStaging(job) if job.on_object_store else Staging(job.root)
    try:
        with staging:
            if dataset.parquet:
                pq_built = parquet_build(req, dataset, staging.path, recipe_sha)
                built = _Built(pq_built.manifest, pq_built.data_bytes)
            else:
                built = _Build(req, dataset, staging.path, recipe_sha, progress, jobs, job.on_object_store).run()
            if not staging.publish():
                staging.give_way()
                return _existing(JobDir(req.job_dir), req, recipe_sha, started, log)
    except Exception as exc:
        if full := disk_full_in(exc):  # the staging folder is gone: nothing was published
            raise no_space_error(staging.disk, full, "preparing the job dir (nothing was published)") from exc
        raise
    ensure_generation(job, req.recipe_text, recipe_sha, req.policy, log=lambda *_: None)
    seconds = time.monotonic() - started
    mb = built.data_bytes / 1e6
    log(
        f"prepared {built.manifest.total_rows:,} rows, {mb:,.1f} MB into {req.policy.num_shards} shards "
        f"in {seconds:.2f} s ({mb / max(seconds, 1e-9):,.1f} MB/s): {job.root}"
    )
    m = built.manifest
    return PrepareResult(m, True, m.total_rows, m.total_bytes, seconds)


# request checks -------------------------------------------------------------
def _check_request(req: PrepareRequest) -> str:
    n = req.policy.num_shards
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise UserError(f"num_shards must be a whole number >= 1, got {n!r}; set elastic_shard.num_shards")
    for name in ("media_keys", "index_keys"):
        keys = getattr(req, name)
        if not all(isinstance(k, str) and k for k in keys):
            raise UserError(f"{name} must be non-empty strings, got {keys!r}")
    try:
        recipe = yaml.safe_load(req.recipe_text)
    except yaml.YAMLError as exc:
        raise UserError(f"recipe is not valid YAML ({exc}); fix the recipe file") from exc
    if not isinstance(recipe, dict):
        raise UserError(
            f"recipe must be a YAML mapping (key: value lines), got {type(recipe).__name__}; fix the recipe file"
        )
    return hashlib.sha256(req.recipe_text).hexdigest()


def _existing(
    job: JobDir, req: PrepareRequest, recipe_sha: str, started: float, log: Callable[[str], Any]
) -> PrepareResult:
    m = confirm_existing(job, req, recipe_sha, log)
    return PrepareResult(m, False, m.total_rows, m.total_bytes, time.monotonic() - started)


def _refuse_occupied(job: JobDir) -> None:
    """A job dir without a manifest may hold only coordination state and staging folders (on an object store:
    and shards, which its publish keeps where they hold its bytes and refuses where not)."""
    root = job.root
    if job.on_object_store:
        names = set(job.store.names(""))
        if "manifest.json" in names:
            return
        entries = sorted(names - {"runs", DJ_WORK, "shards"})
    else:
        if not os.path.lexists(root):
            return
        if not root.is_dir():
            raise UserError(f"{root}: exists and is not a directory; choose another job dir")
        if complete_publication(root):
            return
        entries = sorted(e for e in os.listdir(root) if e not in ("runs", DJ_WORK) and not e.startswith(STAGING_MARK))
    if entries:
        shown = ", ".join(entries[:5]) + (" ..." if len(entries) > 5 else "")
        raise UserError(
            f"{root}: exists, is not empty ({shown}) and holds no manifest.json; choose a new or empty job dir"
        )


# the build ------------------------------------------------------------------
@dataclass(frozen=True)
class _Built:
    manifest: Manifest
    data_bytes: int


class _Build:
    """One prepare into a staging folder: materialise, plan, write shards, hash, record."""

    def __init__(
        self,
        req: PrepareRequest,
        dataset: Dataset,
        staging: Path,
        recipe_sha: str,
        progress: bool | None,
        jobs: int | None,
        scratch: bool = False,
    ) -> None:
        self.req, self.dataset, self.staging, self.recipe_sha = req, dataset, staging, recipe_sha
        self.progress, self.jobs = progress, jobs
        self.scratch = scratch  # node-local scratch, uploaded once built: nothing there needs an fsync
        self.inputs = dataset.inputs

    def run(self) -> _Built:
        counter = Counter()
        with make_pool(self._job_count(), counter) as pool:
            mats = self._materialise(pool)
            stream, pieces = self._plan(mats)
            tasks = self._tasks(pool, mats, pieces)
            futures = [pool.submit(write_shard, t) for t in tasks]
            outcomes = _collect(futures, counter, stream.total, self.progress)
            self._raise_bad_line(outcomes, tasks, mats)
        if not self.scratch:
            sync_files([t.out_path for t in tasks if not t.fsync])
        for spec in self.inputs:
            check_unchanged(spec)
        columns = self._columns(outcomes, tasks, mats)  # type: ignore[arg-type]  # no None left
        manifest = self._manifest(pieces, outcomes, columns)  # type: ignore[arg-type]
        self._write_layout(manifest)
        return _Built(manifest, stream.total)

    def _plan(self, mats: list[Materialised]) -> tuple[Stream, list[list[Piece]]]:
        n = self.req.policy.num_shards
        try:
            parallel = REMOTE_SEARCHES if any(is_s3(m.data_path) for m in mats) else 1  # not a decompressed copy
            stream, ranges = plan([m.data_path for m in mats], [m.data_size for m in mats], n, parallel)
        except TooFewRows as exc:
            raise UserError(
                f"num_shards: {n} requested but the input has only {exc.rows} rows; "
                f"set num_shards between 1 and {exc.rows}"
            ) from exc
        return stream, [stream.pieces(a, b) for a, b in ranges]

    def _job_count(self) -> int:
        """Workers to use, this process included; 0 or 1 means this process alone."""
        n = self.req.policy.num_shards
        if self.jobs is not None:
            return max(0, min(self.jobs, n))
        cpus = os.cpu_count() or 1
        if cpus == 1 or sum(s.seen.size for s in self.inputs) < INLINE_BELOW:
            return 0
        return min(cpus, MAX_JOBS, n)

    def _materialise(self, pool: Executor) -> list[Materialised]:
        folder = self.staging / ".inputs"
        folder.mkdir()
        futures = [pool.submit(materialise, s, str(folder / f"{i:06d}.jsonl")) for i, s in enumerate(self.inputs)]
        return [f.result() for f in futures]

    def _tasks(self, pool: Executor, mats: list[Materialised], pieces: list[list[Piece]]) -> list[ShardTask]:
        rules = [RowRules(self.req.media_keys, self.req.index_keys, s.media_base) for s in self.inputs]
        first_rows = self._first_rows(pool, mats, pieces) if self.req.index_keys else [0] * len(pieces)
        shards = self.staging / "shards"
        shards.mkdir()
        n = len(pieces)
        return [
            ShardTask(
                index=i,
                out_path=str(shards / f"{shard_id(i, n)}.jsonl"),
                ranges=tuple(SourceRange(p.file, mats[p.file].data_path, p.start, p.end, rules[p.file]) for p in ps),
                first_row=first_rows[i],
                fsync=not self.scratch and sum(p.end - p.start for p in ps) >= SYNC_EACH_FROM,
            )
            for i, ps in enumerate(pieces)
        ]

    def _first_rows(self, pool: Executor, mats: list[Materialised], pieces: list[list[Piece]]) -> list[int]:
        """Global row index of each shard's first row: only index keys need it before writing."""
        counts = [[pool.submit(count_rows, mats[p.file].data_path, p.start, p.end) for p in ps] for ps in pieces]
        firsts, row = [], 0
        for shard_counts in counts:
            firsts.append(row)
            row += sum(f.result() for f in shard_counts)
        return firsts

    def _raise_bad_line(
        self, outcomes: list[ShardOutcome | None], tasks: list[ShardTask], mats: list[Materialised]
    ) -> None:
        """Report the first bad line in input order as file:line, with what to do."""
        for outcome, task in zip(outcomes, tasks, strict=True):
            if outcome is None or outcome.bad is None:
                continue
            rng = task.ranges[outcome.bad.range_index]
            spec = self.inputs[rng.file]
            if outcome.bad.line_in_range < 0:
                raise changed_error(spec)
            check_unchanged(spec)  # a line cut by a concurrent writer is a change, not bad input
            line = newlines_before(mats[rng.file].data_path, rng.start) + outcome.bad.line_in_range + 1
            raise UserError(f"{spec.path}:{line}: {outcome.bad.message}")

    def _columns(self, outcomes: list[ShardOutcome], tasks: list[ShardTask], mats: list[Materialised]) -> list:
        """The whole input's columns from the shards' summaries, merged in input order (prepare.schema)."""
        merged: list = []
        for outcome in outcomes:
            merged = merge(merged, outcome.columns or [])
        conflict = first_conflict(merged)
        if conflict is not None:
            raise self._conflict_error(conflict, outcomes, tasks, mats)
        return resolve(merged)

    def _conflict_error(
        self, conflict: Conflict, outcomes: list[ShardOutcome], tasks: list[ShardTask], mats: list[Materialised]
    ) -> UserError:
        """Name the first row whose kind at the conflict's path differs from the first one seen (error path).

        The written shards are scanned (rows as normalised: a filled index key counts), each line
        named by its input file and line.
        """
        first: tuple[str, str] | None = None  # kind, file:line
        for outcome, task in zip(outcomes, tasks, strict=True):
            lines = range_lines(task.out_path, 0, outcome.bytes)
            for rng, rows in zip(task.ranges, outcome.range_rows, strict=True):
                spec, before = self.inputs[rng.file], newlines_before(mats[rng.file].data_path, rng.start)
                for n, line in zip(range(before + 1, before + rows + 1), lines, strict=False):
                    for kind in kinds_at(orjson.loads(line), conflict.path):
                        if first is None:
                            first = kind, f"{spec.path}:{n}"
                        elif kind != first[0]:
                            return UserError(
                                f"{spec.path}:{n}: {describe(conflict.path)} holds {_a(kind)} here but "
                                f"{_a(first[0])} at {first[1]}; Arrow (Ray's reader) cannot hold both in one "
                                "column, so one whole-input `executor_type: ray` run fails on this input too: "
                                "give every value there one kind (e.g. write the numbers as strings) "
                                "or move one kind to another key"
                            )
        kinds = " and ".join(conflict.kinds)  # pragma: no cover  (the scan finds what the summaries found)
        return UserError(f"{self.dataset.root}: {describe(conflict.path)} holds {kinds}; give it one kind")

    def _manifest(self, pieces: list[list[Piece]], outcomes: list[ShardOutcome], columns: list) -> Manifest:
        n = len(pieces)
        file_rows = [0] * len(self.inputs)
        shards, row = [], 0
        for i, (ps, outcome) in enumerate(zip(pieces, outcomes, strict=True)):
            sources = []
            for p, rows, sha in zip(ps, outcome.range_rows, outcome.range_sha256, strict=True):
                sources.append(ShardSource(self.inputs[p.file].rel, p.start, p.end, file_rows[p.file] + 1, sha))
                file_rows[p.file] += rows
            sid = shard_id(i, n)
            shards.append(
                ShardSpec(
                    sid,
                    f"shards/{sid}.jsonl",
                    outcome.rows,
                    outcome.bytes,
                    outcome.sha256,
                    row,
                    tuple(sources),
                    outcome.longest_line,
                )
            )
            row += outcome.rows
        files = tuple(
            InputFile(s.rel, s.seen.size, s.seen.mtime_ns, rows, s.seen.etag)
            for s, rows in zip(self.inputs, file_rows, strict=True)
        )
        return self.req.manifest(self.dataset.root, self.dataset.kind, self.recipe_sha, files, shards, columns=columns)

    def _write_layout(self, manifest: Manifest) -> None:
        shutil.rmtree(self.staging / ".inputs")
        fsync_dir(self.staging / "shards")
        manifest.write(self.staging)


def _a(kind: str) -> str:
    return f"an {kind}" if kind[0] in "aeiou" else f"a {kind}"


def _collect(futures: list[Future], counter: Counter, total: int, progress: bool | None) -> list[ShardOutcome | None]:
    """Wait for the shard tasks, drawing progress; stop early once a bad line is sure to be the first.

    Outcomes of shards after the first bad one may be None (cancelled or not waited for).
    Each task says it finished through a queue, so waiting costs O(1) per task
    (``concurrent.futures.wait`` over the pending set cost O(tasks) per call: 100,000 shards took hours).
    """
    bar = ProgressBar(total, "prepare", progress)
    finished: queue.SimpleQueue[int] = queue.SimpleQueue()
    for i, f in enumerate(futures):
        f.add_done_callback(lambda _, i=i: finished.put(i))
    done = [False] * len(futures)
    first_bad, lowest_open = len(futures), 0  # lowest_open: the first task not finished yet
    try:
        while lowest_open < first_bad:
            try:
                i = finished.get(timeout=0.2)
            except queue.Empty:
                bar.update(counter.value)
                continue
            while i is not None:
                done[i] = True
                if futures[i].result().bad is not None:  # result() re-raises a task's exception
                    first_bad = min(first_bad, i)
                i = _next_finished(finished)
            while lowest_open < len(futures) and done[lowest_open]:
                lowest_open += 1
            bar.update(counter.value)
    finally:
        bar.close()
    return [f.result() if f.done() and i <= first_bad else None for i, f in enumerate(futures)]


def _next_finished(finished: queue.SimpleQueue[int]) -> int | None:
    try:
        return finished.get_nowait()
    except queue.Empty:
        return None
