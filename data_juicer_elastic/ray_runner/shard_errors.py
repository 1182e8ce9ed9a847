"""What the runner tells the worker about a failed shard, and how it reads shards with long rows.

An attempt that failed because of the shard's rows or the recipe fails the
same way every time, so retrying it only delays the job's end by
``max_retries`` attempts: such failures become ``PermanentError``, which the
worker treats as terminal at once. A lost node, a killed Ray worker, a full
object store or a flaky mount may heal, so everything else stays retryable.

Arrow names a bad row by its index inside the block it was parsing ("row 0"),
which means nothing to a person; the bad line is found again here (by
bisecting the shard with the same reader) and named as input ``file:line``.
"""

from __future__ import annotations

import io
import mmap
import os
import re
from collections.abc import Iterator
from typing import Any

from data_juicer_elastic.errors import PermanentError, UserError
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.lines import input_line
from data_juicer_elastic.ray_runner.arrow_schema import shard_facts

DEFAULT_BLOCK = 1 << 20  # pyarrow.json's default block size
# An op that raised one of these inside a Ray task did so on the data or the recipe: it recurs.
_RECURRING_IN_OPS = (ValueError, TypeError, KeyError, IndexError, AttributeError, ZeroDivisionError, AssertionError)
# Ray Data wraps an op's exception in a UserCodeException whose cause does not survive the trip back from
# the Ray worker: only the remote traceback's text still names it, on a line of its own.
_NAMES = "|".join(t.__name__ for t in _RECURRING_IN_OPS)
_RAISED_IN_RAY = re.compile(rf"^(?:\x1b\[[0-9;]*m)*(?:{_NAMES})(?::|$)", re.MULTILINE)


def longest_line(path: str) -> int:
    """Bytes of the shard's longest line if it is at least half the reader's default block, else 0.

    A window of ``DEFAULT_BLOCK // 2`` bytes holding a newline proves every
    line inside it is shorter; only lines longer than a window are measured,
    so the scan costs one memrchr per window.
    """
    window, size = DEFAULT_BLOCK // 2, os.path.getsize(path)
    if size < window:
        return 0
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        longest, pos = 0, 0
        while pos + window < size:
            nl = data.rfind(b"\n", pos, pos + window)
            if nl >= 0:
                pos = nl + 1
                continue
            end = data.find(b"\n", pos + window)
            end = size if end < 0 else end + 1
            longest, pos = max(longest, end - pos), end
    return longest


def block_size_for(path: str, configured: int | None = None, job: JobDir | None = None) -> int | None:
    """A JSON reader block size that holds the shard's longest row whole (None: the default does).

    The longest line is prepare's record (manifest schema 5); only an older job dir's shard is scanned.
    ``job``: the shard's job (None: the one whose ``shards/`` holds ``path``).
    """
    facts = shard_facts(path, job=job)
    recorded = facts.longest_line if facts is not None else None
    longest = longest_line(path) if recorded is None else (recorded if recorded >= DEFAULT_BLOCK // 2 else 0)
    if not longest and not configured:
        return None
    needed = max(configured or DEFAULT_BLOCK, 2 * longest)
    return 1 << (needed - 1).bit_length()  # a power of two, as pyarrow's own default


def read_options_for(shard_path: str, configured: Any, job: JobDir | None = None) -> dict[str, Any] | None:
    """The recipe's JSON read options, with a block size that holds the shard's longest row.

    Arrow's JSON reader fails on a row longer than its block ("straddling
    object straddles two block boundaries"); the default block is 1 MiB.
    """
    options = dict(vars(configured) if hasattr(configured, "__dict__") else configured or {})
    block = block_size_for(shard_path, options.get("block_size"), job)
    if block is not None:
        options["block_size"] = block
    return options or None


def arrow_read_options(cfg: Any, shard_path: str, job: JobDir | None = None) -> Any:
    import pyarrow.json as pj

    options = read_options_for(shard_path, getattr(cfg, "read_options", None), job) or {}
    return pj.ReadOptions(**options) if options else None


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def classify(exc: Exception, shard_path: str, job: JobDir, read_options: Any = None) -> Exception:
    """``exc`` itself if a retry may heal it, else a PermanentError naming the input line where it can."""
    import pyarrow as pa
    from data_juicer.core.preflight import PipelineConfigError, PipelineRuntimeError
    from ray.exceptions import RayTaskError

    chain = list(_chain(exc))
    if any(isinstance(e, UserError) for e in chain):
        return PermanentError(str(exc))
    refused = next((e for e in chain if isinstance(e, (PipelineConfigError, PipelineRuntimeError))), None)
    if refused is not None:
        return PermanentError(f"the recipe is refused by Data-Juicer: {refusal(refused)}")
    arrow = next((e for e in chain if isinstance(e, (pa.ArrowInvalid, pa.ArrowTypeError))), None)
    if arrow is not None:
        where = bad_line(shard_path, job, read_options)
        first = str(arrow).strip().splitlines()[0] if str(arrow).strip() else type(arrow).__name__
        at = f"{where}: " if where else ""
        return PermanentError(f"{at}a row Ray's JSON reader refuses ({first}); fix or drop that row, then resubmit")
    if any(isinstance(e, RayTaskError) for e in chain) and (
        any(isinstance(e, _RECURRING_IN_OPS) for e in chain) or _RAISED_IN_RAY.search(str(exc))
    ):
        return PermanentError(f"an op raised on the shard's data: {type(exc).__name__}: {exc}")
    return exc


def refusal(exc: BaseException) -> str:
    """A preflight refusal on one line: its heading and each cause (the console's FAIL line shows one line)."""
    heading = str(exc).strip().splitlines()[0].rstrip(":") if str(exc).strip() else type(exc).__name__
    causes = [str(e).strip() for e in getattr(exc, "errors", None) or []]
    return f"{heading}: {'; '.join(causes)}" if causes else " ".join(str(exc).split())


def bad_line(shard_path: str, job: JobDir, read_options: Any = None) -> str | None:
    """``file:line`` of the first shard line Arrow's JSON reader refuses (None if it reads the whole shard)."""
    import pyarrow as pa
    import pyarrow.json as pj

    with open(shard_path, "rb") as f:
        lines = f.readlines()

    facts = shard_facts(shard_path, job=job)
    parse_options = facts.parse_options if facts is not None else None

    def reads(n: int) -> bool:
        try:
            pj.read_json(io.BytesIO(b"".join(lines[:n])), read_options=read_options, parse_options=parse_options)
            return True
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            return False

    if reads(len(lines)):
        return None
    low, high = 0, len(lines)  # reads(low) holds, reads(high) does not
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if reads(mid) else (low, mid)
    sid = os.path.basename(shard_path).removesuffix(".jsonl")
    try:
        return input_line(job, sid, high - 1)
    except Exception:  # a job dir without this shard (a runner called by hand): the shard's own line
        return f"{shard_path}:{high}"
