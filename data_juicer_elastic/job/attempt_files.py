"""The vocabulary of one attempt: the files in its folder and the outcomes its record may name.

Every module that writes or reads an attempt folder names its files through
:class:`AttemptDir` and its outcomes through :class:`Outcome`, so a file name
or an outcome is spelled once. ``Outcome`` subclasses ``str``: a member equals
the string it stands for (``Outcome.DONE == "done"``), serialises as that
string (``json``, ``orjson``) and formats as it, so records written before this
module existed, and code still comparing with literals, read the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path


class Outcome(str, Enum):
    """What ``attempt.json`` says about how an attempt ended (or that it still runs)."""

    RUNNING = "running"  # written when the attempt starts; a killed worker leaves it so
    DONE = "done"  # its output was verified and published (or the same output already was)
    FAILED = "failed"  # the runner raised; counts against the retry budget
    SUPERSEDED = "superseded"  # its lease was taken over: its output is never published
    LOST_RACE = "lost-race"  # a speculative twin published first
    INTERRUPTED = "interrupted"  # the worker was stopped (signal, abort, given back)
    NO_SPACE = "no-space"  # the disk filled up under it; the worker stopped
    DUPLICATE = "duplicate"  # written by earlier versions for what is now LOST_RACE; still read

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


# Outcomes that do not count against the retry budget: the worker was told to
# stop, someone else took the shard or finished it first, or the disk was full.
NOT_FAILURES = frozenset(
    {Outcome.INTERRUPTED, Outcome.SUPERSEDED, Outcome.DONE, Outcome.DUPLICATE, Outcome.LOST_RACE, Outcome.NO_SPACE}
)
# Outcomes of an attempt that has not ended (None: a record that names none).
UNFINISHED = (None, Outcome.RUNNING)


@dataclass(frozen=True)
class AttemptDir:
    """``generations/<gen>/attempts/<shard>/<attempt>/`` and the files in it."""

    RECORD = "attempt.json"  # host, pid, start, end, outcome, error (job/records/attempt.py)
    LOG = "process.log"  # Data-Juicer's and Ray's messages of this attempt, and its traceback
    OUTPUT = "processed.jsonl"  # the shard's output, joined in row order; what the done record names
    OPS = "ops.json"  # rows in and out per op, rows removed by op errors
    RAY_EXPORT = "export.jsonl"  # Ray's folder of part files, removed once joined into OUTPUT
    WORK = "work"  # Data-Juicer's work dir of the attempt
    RECIPE = "recipe.yaml"  # Data-Juicer's backup of the attempt's config, inside WORK

    path: Path

    @classmethod
    def of(cls, path: str | Path) -> AttemptDir:
        return cls(Path(path))

    @property
    def record(self) -> Path:
        return self.path / self.RECORD

    @property
    def log(self) -> Path:
        return self.path / self.LOG

    @property
    def output(self) -> Path:
        return self.path / self.OUTPUT

    @property
    def ops(self) -> Path:
        return self.path / self.OPS

    @property
    def ray_export(self) -> Path:
        return self.path / self.RAY_EXPORT

    @property
    def work(self) -> Path:
        return self.path / self.WORK
