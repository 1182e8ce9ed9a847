"""Generations: one recipe's run over a job's shards, and the input recheck that lets shards be reused.

The shards depend on the input, the shard count and the row rules, never on
the ops. A submission whose recipe differs from every earlier one starts a
new generation (``generations/<gen>/``, named by the recipe's sha256) over
the same shards; the same recipe again works in its old generation and
finishes what is left there. Each generation keeps its own recipe snapshot,
run-time policy, attempts, leases, done and failed records and merge record,
so outputs of two recipes never mix. ``current.json`` names the generation the
latest submission works on: ``dj-elastic status/merge/verify/retry`` default
to it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import socket
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import yaml

from data_juicer_elastic.errors import IntegrityError
from data_juicer_elastic.job.layout import JobDir, generation_id
from data_juicer_elastic.job.manifest import Policy, ShardSource
from data_juicer_elastic.prepare.inputs import STAGING_MARK, InputSpec, _decompressor
from data_juicer_elastic.prepare.on_store import StoreRecords
from data_juicer_elastic.storage.blocks import BLOCK
from data_juicer_elastic.storage.files import atomic_write, dumps_json, fsync_dir, read_json, read_record


def ensure_generation(
    job: JobDir, recipe_text: bytes, recipe_sha: str, policy: Policy, log: Callable[[str], Any] = print
) -> tuple[JobDir, bool]:
    """The generation of ``recipe_text`` (made whole by one rename if new), with ``policy``, made current.

    Also says whether it is new. On an object store its records go through the store (prepare.on_store).
    """
    gen = generation_id(recipe_sha)
    target = job.generations_dir / gen
    files: _Disk | StoreRecords = StoreRecords(job) if job.on_object_store else _Disk(job)
    new = not files.exists(target / "generation.json")
    if new:
        record = {"generation": gen, "recipe_sha256": recipe_sha, "created_at": time.time()}
        files.create_generation(target, recipe_text, dumps_json(dataclasses.asdict(policy)), dumps_json(record))
        log(f"{job.root}: generation {gen} started for this recipe (the shards are reused)")
    else:
        recorded = files.read_json(target / "generation.json").get("recipe_sha256")
        if recorded != recipe_sha:
            raise IntegrityError(
                f"{target}/generation.json: recipe sha256 {str(recorded)[:16]}… shares its first 16 digits with "
                f"{recipe_sha[:16]}… but differs; use a new job dir"
            )
        current = JobDir(job.root, gen)
        if current.manifest().policy != policy:
            files.write(current.policy_path, dumps_json(dataclasses.asdict(policy)))
    if files.read_record(job.current_path).get("generation") != gen:
        files.write(job.current_path, dumps_json({"generation": gen, "at": time.time()}))
    return JobDir(job.root, gen), new


class _Disk:
    """A generation's records as files of a POSIX job dir; a new generation made whole by one rename."""

    def __init__(self, job: JobDir) -> None:
        self.job = job

    def exists(self, path: Path) -> bool:
        return path.exists()

    def read_json(self, path: Path) -> Any:
        return read_json(path)

    def read_record(self, path: Path) -> dict:
        return read_record(path)

    def write(self, path: Path, data: bytes) -> None:
        atomic_write(path, data)

    def create_generation(self, target: Path, recipe_text: bytes, policy_json: bytes, record: bytes) -> None:
        _create(self.job, target, recipe_text, policy_json, record)


def _create(job: JobDir, target: os.PathLike, recipe_text: bytes, policy_json: bytes, record: bytes) -> None:
    job.generations_dir.mkdir(exist_ok=True)
    token = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    staging = job.generations_dir / f"{STAGING_MARK}{token}"
    try:
        for sub in ("attempts", "finalize", *(f"state/{s}" for s in JobDir.STATE_SUBDIRS)):
            (staging / sub).mkdir(parents=True)
        atomic_write(staging / "recipe.yaml", recipe_text)
        atomic_write(staging / "policy.json", policy_json)
        atomic_write(staging / "generation.json", record)
        try:
            os.rename(staging, target)
        except OSError:
            if not os.path.exists(os.path.join(target, "generation.json")):
                raise
        else:
            fsync_dir(job.generations_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


# input recheck ------------------------------------------------------------------------------------


def same_content(spec: InputSpec, sources: list[ShardSource]) -> bool:
    """True when the file's ranges still hash to what prepare recorded (a copy or a restore moved its mtime).

    Reads the file once, in order (compressed inputs decompressed as prepare did).
    """
    plain = spec.codec is None or spec.parquet  # a Parquet input's ranges are its raw bytes
    with open(spec.path, "rb") as raw:
        reader = _Reader(raw if plain else _decompressor(spec.codec, raw))
        pos = 0
        for src in sorted(sources, key=lambda s: s.start):
            digest = hashlib.sha256()
            if src.start != pos or reader.hash(src.end - src.start, digest) != src.end - src.start:
                return False
            pos = src.end
            if not spec.parquet and reader.at_end() and reader.last != b"\n":
                digest.update(b"\n")  # prepare ends a file's last line with a newline
            if digest.hexdigest() != src.sha256:
                return False
        return reader.at_end()


class _Reader:
    """Sequential blocks of a stream, with the last byte handed out (to tell a missing final newline)."""

    def __init__(self, stream: BinaryIO) -> None:
        self.stream, self.pending, self.last = stream, b"", b"\n"

    def hash(self, n: int, digest: Any) -> int:
        """Hash the next ``n`` bytes; how many there were."""
        got = 0
        while got < n:
            block = self.pending or self.stream.read(BLOCK)
            if not block:
                break
            take = block[: n - got]
            digest.update(take)
            got += len(take)
            self.pending, self.last = block[len(take) :], take[-1:]
        return got

    def at_end(self) -> bool:
        if not self.pending:
            self.pending = self.stream.read(BLOCK)
        return not self.pending


# recipe differences -------------------------------------------------------------------------------


def recipe_differences(old_text: str, new_text: str, limit: int = 8) -> list[str]:
    """What differs between two recipe snapshots, by top-level key and by op (for refusals)."""
    try:
        old, new = yaml.safe_load(old_text) or {}, yaml.safe_load(new_text) or {}
    except yaml.YAMLError:
        return ["recipe: differs (one side is not valid YAML)"]
    if not isinstance(old, dict) or not isinstance(new, dict):
        return ["recipe: differs"]
    out = [
        f"{key}: {old.get(key)!r} in the job's recipe, {new.get(key)!r} in this one"
        for key in sorted(old.keys() | new.keys())
        if key != "process" and old.get(key) != new.get(key)
    ]
    before, after = old.get("process") or [], new.get("process") or []
    for i in range(max(len(before), len(after))):
        a = before[i] if i < len(before) else None
        b = after[i] if i < len(after) else None
        if a != b:
            out.append(f"process[{i}]: {_op(a)} in the job's recipe, {_op(b)} in this one")
    return out[:limit] + ([f"... and {len(out) - limit} more"] if len(out) > limit else [])


def _op(item: Any) -> str:
    if item is None:
        return "nothing"
    if isinstance(item, dict) and len(item) == 1:
        name, args = next(iter(item.items()))
        shown = ", ".join(f"{k}={v!r}" for k, v in sorted((args or {}).items())) if isinstance(args, dict) else ""
        return f"{name}({shown})"
    return repr(item)
