"""Whether an export may replace what is at its output: one rule for every export (a file or a folder,
JSONL or Parquet, local or s3://), so no output is lost by surprise.

Nothing there: written (a writer still refuses one that appears meanwhile). There and written by a merge
of this job dir, as some generation's ``merge.json`` records it (its size and mtime and inode, or its ETag,
unchanged): replaced, one line naming that generation, which ``dj-elastic merge --generation`` writes
again. Anything else: refused (``errors.output_in_the_way``) unless overwrite is asked.

A file merge killed after putting its output in place and before writing ``merge.json`` would leave an
output nobody recorded, refused as foreign by the next run; so it first records its intent
(``merge-intent.json``: the temp file's stamp, which the link or rename keeps), and an output matching an
intent counts as that generation's own.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from data_juicer_elastic import s3_export
from data_juicer_elastic.folder_export import SUCCESS
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.records._read import load_record
from data_juicer_elastic.storage.files import dumps_json

INTENT = "merge-intent.json"


def may_replace(job: JobDir, out: str, folder: bool, overwrite: bool, log: Callable[[str], Any]) -> bool:
    """The ``overwrite`` the writers get for ``out`` (``s3_export.location``'s spelling): True when asked, or
    when what is there is this job's own earlier output (said in one line)."""
    if overwrite:
        return True
    now = stamp_now(out, folder)
    if now is None:
        return False
    gen = _writer(job, out, folder, now)
    if gen is None:
        return False  # the writer refuses it (an identical complete folder it keeps)
    shown = f"{out}/" if folder else out
    if gen == job.generation:
        log(f"{shown}: replacing this generation's earlier merge with the current done records")
    else:
        log(
            f"{shown}: replacing generation {gen}'s output (this job dir wrote it; "
            f"`dj-elastic merge --job-dir {job.root} --generation {gen} --output {shown}` writes it again)"
        )
    return True


def _writer(job: JobDir, out: str, folder: bool, now: dict) -> str | None:
    """The generation whose merge.json records ``out`` exactly as it is ``now``, newest first; None: no one's."""
    jobs = [job] if job.legacy() else [JobDir(job.root, g) for g in reversed(job.generation_ids())]
    for gen in jobs:
        for path in (gen.merge_record_path, gen.merge_record_path.with_name(INTENT)):
            record = load_record(gen.store, gen.key(path))
            stat = record.get("output_stat")
            if record.get("output") != out or (record.get("kind") == "folder") != folder or not isinstance(stat, dict):
                continue
            if now == {k: stat.get(k) for k in now}:
                return gen.generation
    return None


def record_intent(job: JobDir, out: str | Path, tmp: str | Path) -> None:
    """Before a finished temp file becomes the output ``out``: its stamp, so that output counts as this
    generation's own even if the merge dies before ``merge.json`` (link and rename keep inode, size, mtime)."""
    record = {"output": str(out), "kind": "file", "output_stat": stat_of(tmp)}
    job.store.replace(job.key(job.merge_record_path.with_name(INTENT)), dumps_json(record))


def stamp_now(out: str, folder: bool) -> dict | None:
    """What stamps the output now (merge.json's ``output_stat``), None when nothing is there."""
    if s3_export.is_s3(out):
        return s3_export.stamp_of(out, folder)
    try:
        return stat_of(stamped(out, folder))
    except (FileNotFoundError, NotADirectoryError):
        return None


def stamped(out: str | Path, folder: bool) -> str:
    """The file whose size, mtime and inode stand for the output: a folder export's ``_SUCCESS``, else the file."""
    return os.path.join(out, SUCCESS) if folder else str(out)


def stat_of(path: str | Path) -> dict[str, int]:
    st = os.stat(path)
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino}
