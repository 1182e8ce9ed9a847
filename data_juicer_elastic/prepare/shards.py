"""Writing one shard: read its byte ranges once, validate, normalise, write, hash.

Runs in a worker process (prep_pool, one task per shard), so everything here
is a plain picklable dataclass or a top-level function. A task reads its
ranges in 1 MB blocks (``pread``, or ranged GETs of an s3:// input:
prepare.source; cache-sized: split and parse stay in cache; measured faster
than 8-16 MB blocks), validates each block of lines
(prep_jsonl), writes the lines (raw bytes unless a row changed) and hashes
what it wrote, in one pass. The same pass fingerprints the input: each
range's sha256 is taken over the lines read (each ending in a newline). While
those equal what was written, one hash serves both; a second one starts only
for a shard's later ranges, or from the first rewritten row on.
Bad input is returned, not raised, with the range and the line inside it; the
parent turns that into ``file:line``.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from data_juicer_elastic.errors import UserError
from data_juicer_elastic.jsonl import LineProblem, RowRules, process_lines, split_lines
from data_juicer_elastic.prepare.schema import Fields
from data_juicer_elastic.prepare.source import read_blocks
from data_juicer_elastic.storage.bulk_write import BulkWriter

BLOCK = 1 << 20
SYNC_EACH_FROM = 8 << 20  # shards this big are fsynced by their task; smaller ones together at the end

# Told how many input bytes were read, once per block (progress bar). It may raise to stop the task:
# that is how a task running in the preparing process is cancelled (prep_pool).
_progress: Callable[[int], None] | None = None


def set_progress_hook(hook: Callable[[int], None] | None) -> None:
    global _progress
    _progress = hook


def _advance(nbytes: int) -> None:
    if _progress is not None:
        _progress(nbytes)


@dataclass(frozen=True)
class SourceRange:
    """Bytes [start, end) of one plain input; starts and ends at line boundaries."""

    file: int  # index into the input list
    data_path: str
    start: int
    end: int
    rules: RowRules


@dataclass(frozen=True)
class ShardTask:
    index: int
    out_path: str
    ranges: tuple[SourceRange, ...]
    first_row: int  # global index of the shard's first row (exact when index keys are set)
    fsync: bool = True


@dataclass(frozen=True)
class BadLine:
    range_index: int  # which of the task's ranges
    line_in_range: int  # 0-based line number inside that range; -1 when the file itself changed
    message: str


@dataclass(frozen=True)
class ShardOutcome:
    index: int
    rows: int
    bytes: int
    sha256: str
    range_rows: tuple[int, ...]
    range_sha256: tuple[str, ...] = ()  # of each range's input lines, newline-terminated
    bad: BadLine | None = None
    columns: list | None = None  # prepare.schema summary of the rows written (merged by the parent)
    longest_line: int = 0  # bytes of the longest line written, its newline included


@dataclass
class _Facts:
    """What a shard task learns about the rows it writes, on the way."""

    fields: Fields
    longest_line: int = 0


class _ShortRead(Exception):
    pass


def write_shard(task: ShardTask) -> ShardOutcome:
    digest = hashlib.sha256()
    out = BulkWriter(task.out_path)
    facts = _Facts(Fields())
    try:
        range_rows, range_sha, bad = _write_ranges(task, out, digest, facts)
    except BaseException:
        out.abandon()  # the staging folder goes with it
        raise
    out.close(fsync=task.fsync and bad is None)  # a bad shard is thrown away with the staging folder
    return ShardOutcome(
        task.index,
        sum(range_rows),
        out.size,
        digest.hexdigest(),
        tuple(range_rows),
        tuple(range_sha),
        bad,
        facts.fields.summary(),
        facts.longest_line,
    )


def _write_ranges(
    task: ShardTask, out: BulkWriter, digest: Any, facts: _Facts
) -> tuple[list[int], list[str], BadLine | None]:
    """Rows and input sha256 of each range, written in order; the first bad line stops it."""
    range_rows: list[int] = []
    range_sha: list[str] = []
    row = task.first_row
    for r_index, rng in enumerate(task.ranges):
        try:
            rows, sha = _write_range(rng, row, out, digest, facts, shares_digest=r_index == 0)
        except LineProblem as exc:
            return range_rows, range_sha, BadLine(r_index, exc.index, exc.message)
        except _ShortRead:
            return range_rows, range_sha, BadLine(r_index, -1, "the file got shorter while prepare read it")
        range_rows.append(rows)
        range_sha.append(sha)
        row += rows
    return range_rows, range_sha, None


def _write_range(
    rng: SourceRange, first_row: int, out: BulkWriter, digest: Any, facts: _Facts, shares_digest: bool
) -> tuple[int, str]:
    """Write one range, adding what is written to ``digest``; its rows and the sha256 of its lines as read.

    A LineProblem's index counts from the range's first line.
    """
    source = digest if shares_digest else hashlib.sha256()  # shared while what is read is what is written
    rows = 0
    for lines, raw in _chunks(rng.data_path, rng.start, rng.end):
        try:
            changed = process_lines(lines, rng.rules, first_row + rows, facts.fields.add_rows)
        except LineProblem as exc:
            raise LineProblem(rows + exc.index, exc.message) from None
        facts.longest_line = max(facts.longest_line, max(map(len, lines if changed is None else changed)))
        if changed is not None and source is digest:
            source = digest.copy()  # from here on, what is written differs from what was read
        if source is not digest:
            for part in raw:
                source.update(part)
        for part in raw if changed is None else (b"".join(changed),):
            digest.update(part)
            out.write(part)
        rows += len(lines)
    return rows, source.hexdigest()


def _chunks(path: str, start: int, end: int) -> Iterator[tuple[list[bytes], list[bytes | memoryview]]]:
    """Complete lines of [start, end) (each with its newline), a block at a time, with their raw bytes.

    ``raw`` concatenated equals the lines concatenated; a last line without
    its newline (file end) gets one added.
    """
    carry: list[bytes] = []
    pos = start
    for block in read_blocks(path, start, end, BLOCK):
        pos += len(block)
        _advance(len(block))
        lines, tail = split_lines(block)
        if not lines:
            carry.append(block)
            continue
        raw: list[bytes | memoryview] = [memoryview(block)[: len(block) - len(tail)]]
        if carry:
            lines[0] = b"".join(carry) + lines[0]
            raw = [*carry, *raw]
        carry = [tail] if tail else []
        yield lines, raw
    if pos < end:
        raise _ShortRead
    if carry:
        line = b"".join(carry)
        yield [line + b"\n"], [line, b"\n"]


def sync_files(paths: list[str]) -> None:
    """Make small written shards durable together: one ``syncfs`` of their filesystem (Linux), else
    an fsync each from 16 threads (concurrent fsyncs share journal commits).

    One fsync per small shard, in order, cost a journal commit each: 5 ms a shard on a quiet
    disk, which made prepare's time per shard grow with the shard count (B13).
    """
    if not paths:
        return
    fd = os.open(os.path.dirname(paths[0]) or ".", os.O_RDONLY)
    try:
        if _syncfs(fd):
            return
    finally:
        os.close(fd)
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(_fsync_path, paths))


def _syncfs(fd: int) -> bool:
    """True once the filesystem holding ``fd`` is synced; False where there is no syncfs."""
    try:
        syncfs = ctypes.CDLL(None, use_errno=True).syncfs
    except (AttributeError, OSError):
        return False
    if syncfs(fd) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"syncfs: {os.strerror(err)}")
    return True


def _fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def range_lines(path: str, start: int, end: int) -> Iterator[bytes]:
    """The lines of [start, end), each ending in a newline (for error paths: one Python step per line)."""
    for lines, _ in _chunks(path, start, end):
        yield from lines


def count_rows(path: str, start: int, end: int) -> int:
    """Rows in [start, end): newlines, plus a last line without one."""
    rows, pos, last = 0, start, b"\n"
    for block in read_blocks(path, start, end, BLOCK):
        rows += block.count(b"\n")
        pos += len(block)
        last = block[-1:]
    if pos < end:
        raise UserError(f"{path}: got shorter while prepare read it; wait until nothing writes it, then prepare again")
    return rows + (last != b"\n")


def newlines_before(path: str, offset: int) -> int:
    """How many lines of ``path`` come before byte ``offset`` (to report file:line)."""
    return sum(block.count(b"\n") for block in read_blocks(path, 0, offset, BLOCK))
