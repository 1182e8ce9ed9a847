"""Where a row of a shard came from: the input file and line a person can open.

Errors found while a shard runs name a line of the shard; the manifest's
shard sources (contiguous byte ranges of input files, in shard order, each
with its first line number) map it back to ``file:line`` of the input.
"""

from __future__ import annotations

import os

from data_juicer_elastic.job.layout import JobDir

_BLOCK = 16 << 20


def _lines_in(path: str, start: int, end: int) -> int:
    """Rows in [start, end) of ``path``: newlines, plus a last line without one."""
    count, last = 0, b"\n"
    with open(path, "rb") as f:
        f.seek(start)
        left = end - start
        while left > 0 and (block := f.read(min(_BLOCK, left))):
            count += block.count(b"\n")
            last, left = block[-1:], left - len(block)
    return count + (last != b"\n")


def input_line(job: JobDir, sid: str, line: int) -> str:
    """``file:line`` of the shard's 0-based ``line`` (the shard's own path:line if the input is gone)."""
    manifest = job.manifest()
    spec = job.shard(sid)
    root = manifest.dataset_path if manifest.input_kind == "dir" else os.path.dirname(manifest.dataset_path)
    left = line
    try:
        for i, source in enumerate(spec.sources):
            path = os.path.join(root, source.file) if manifest.input_kind == "dir" else manifest.dataset_path
            if i == len(spec.sources) - 1:  # the last range holds whatever is left
                return f"{path}:{source.first_line + left}"
            if not path.endswith(".jsonl"):  # compressed: ranges count decompressed bytes
                break
            rows = _lines_in(path, source.start, source.end)
            if left < rows:
                return f"{path}:{source.first_line + left}"
            left -= rows
    except OSError:
        pass
    return f"{job.shard_file(sid)}:{line + 1}"
