"""Prepare onto a job dir on an object store: built in node-local scratch, then published key by key.

A bucket has no folders, renames or links, so nothing appears whole by one
rename as the POSIX staging folder does (prepare.staging). The build (the same
shard writers, the same ``Manifest.write``) runs in a scratch folder under the
node's temp dir; publishing puts every shard at its key create-once, then the
shard table, then creates ``manifest.json`` last: the mark of a prepared job,
so no reader sees a manifest whose shards are not all there. A key already
there is kept when it holds this prepare's bytes (a racing prepare of the same
request, or one killed mid-upload that this one completes); other bytes with
no manifest are refused (an unfinished prepare of another request). The loser
of the manifest's create checks the winner's as a repeat does. A generation is
published the same way: recipe.yaml and policy.json, then ``generation.json``
created last (``JobDir`` reads a generation as there once that key is).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from data_juicer_elastic.errors import UserError
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.records._read import load_record
from data_juicer_elastic.job.shard_table import TABLE_NAME
from data_juicer_elastic.prepare.inputs import STAGING_MARK
from data_juicer_elastic.storage.blocks import blocks

UPLOADS = 16  # shard PUTs in flight: one round trip each, so latency, not bandwidth, bounds a small shard's
COMPARE_BLOCK = 1 << 20  # a clashing key is compared with the local shard a block at a time
MANIFEST = "manifest.json"


class StoreStaging:
    """A scratch folder on this node that the build writes into; ``publish`` puts it on the job's store."""

    def __init__(self, job: JobDir) -> None:
        self.job = job
        self.disk = Path(tempfile.gettempdir())  # where a full disk is reported
        self.path = self.disk  # set on entry

    def __enter__(self) -> StoreStaging:
        self.path = Path(tempfile.mkdtemp(prefix=STAGING_MARK, dir=self.disk))
        return self

    def __exit__(self, *_: object) -> None:
        self.discard()

    def discard(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)

    def give_way(self) -> None:
        """Another prepare published first: its manifest is there whole, so nothing is left to complete."""
        self.discard()

    def publish(self) -> bool:
        """Shards, then the shard table, then ``manifest.json`` created; False when another prepare's is there."""
        store = self.job.store
        if store.head(MANIFEST) is not None:
            return False
        shards = self.path / "shards"
        names = sorted(n for n in os.listdir(shards) if n != TABLE_NAME)
        with ThreadPoolExecutor(UPLOADS) as pool:
            clashes = [key for key in pool.map(self._put, names) if key]
        if not clashes and os.path.exists(shards / TABLE_NAME):  # schema 6; a Parquet build writes one too
            clashes = [key for key in [self._put(TABLE_NAME)] if key]
        if clashes:
            if store.head(MANIFEST) is not None:
                return False
            raise UserError(
                f"{self.job.root / clashes[0]}: holds other bytes than this prepare's ({len(clashes)} key(s) "
                "so), and the job dir has no manifest.json: a prepare of another request is running there or "
                f"was stopped before it finished; once none runs, remove {self.job.root / 'shards'} "
                "(or choose a new job dir)"
            )
        return store.create(MANIFEST, (self.path / MANIFEST).read_bytes()) is not None

    def _put(self, name: str) -> str | None:
        """Upload one file of ``shards/`` create-once: its key when another's bytes hold it, else None."""
        key, local = f"shards/{name}", self.path / "shards" / name
        store = self.job.store
        if store.upload(key, local, create_once=True) is not None or _holds(store, key, local):
            return None
        return key


def _holds(store: Any, key: str, local: Path) -> bool:
    """Whether ``key`` holds exactly the local file's bytes (read in blocks, never whole)."""
    stream = store.open_read(key)
    if stream is None:
        return False
    with stream, open(local, "rb") as mine:
        for block in blocks(stream, bytearray(COMPARE_BLOCK)):
            if mine.read(len(block)) != block:
                return False
        return mine.read(1) == b""


class StoreRecords:
    """A generation's records read and written through the job's store (``generation.ensure_generation``)."""

    def __init__(self, job: JobDir) -> None:
        self.job, self.store = job, job.store

    def exists(self, path: Path) -> bool:
        return self.store.head(self.job.key(path)) is not None

    def read_json(self, path: Path) -> Any:
        return self.job._read_json(path)

    def read_record(self, path: Path) -> dict:
        return load_record(self.store, self.job.key(path))  # type: ignore[arg-type]  # any Store reads alike

    def write(self, path: Path, data: bytes) -> None:
        self.store.replace(self.job.key(path), data)

    def create_generation(self, target: Path, recipe_text: bytes, policy_json: bytes, record: bytes) -> None:
        """Recipe and policy, then ``generation.json`` created last (a racing prepare's, if first, stands)."""
        self.write(target / "recipe.yaml", recipe_text)
        self.write(target / "policy.json", policy_json)
        self.store.create(self.job.key(target / "generation.json"), record)
