"""The op's own batch calls count the rows they see (see collect.py for where the counts go).

Data-Juicer runs a Mapper as ``map_batches(op.process)`` and a Filter as
``map_batches(op.compute_stats)`` then a filter step over ``op.process``;
in actor mode Ray (or a warm actor, ray_runner/warm_ops.py) builds the op from
its class and calls ``op(batch)``, which is the same ``process`` /
``compute_stats``. Wrapping those methods on the op instance (patches/data_juicer.py, which
knows Data-Juicer's methods) makes the batch call Data-Juicer already makes
do the counting: no extra Ray stage, no extra pass over a block. This module
holds what is counted, and hands it to the patches as :data:`COUNTING`.

- a Mapper's ``process`` counts rows in and rows out;
- a Filter's ``compute_stats`` counts rows in, its ``process`` the rows kept;
- with ``skip_op_error`` on (Data-Juicer's default) a batch that raises comes
  back empty and is only logged. The raw ``*_batched`` / ``*_single`` method
  is wrapped in a counter of the rows of a batch that raised, inside
  Data-Juicer's own ``catch_map_*_exception``, so its semantics stay.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from data_juicer_elastic.patches.data_juicer import OpCounting, count_batch_calls
from data_juicer_elastic.ray_runner.op_counts import tally

_planning = threading.local()  # .target: the Target of the op whose Ray stages this thread is planning


@dataclass
class Target:
    """Where an op's counts go: the attempt's count folder (None: not counting) and the op's index."""

    sink: str | None = None
    index: int = 0


def count_op(op: Any, target: Target) -> None:
    """Make ``op``'s batch calls count into ``target`` (read at call time: a warm actor re-aims it per batch)."""
    count_batch_calls(op, target, COUNTING)


@contextmanager
def planning(target: Target | None) -> Iterator[None]:
    """Actor-mode op classes planned meanwhile in this thread count into ``target`` (see :class:`CountedOp`)."""
    _planning.target = target
    try:
        yield
    finally:
        _planning.target = None


def planned() -> Target | None:
    """The Target of the op being planned in this thread, if its rows are counted."""
    return getattr(_planning, "target", None)


class CountedOp:
    """An actor-mode op as Ray Data builds it from its class, counting into ``target``."""

    def __init__(self, op_class: type, args: tuple, kwargs: dict, target: Target) -> None:
        self.op = op_class(*args, **kwargs)
        count_op(self.op, target)

    def __call__(self, batch: Any, *args: Any, **kwargs: Any) -> Any:
        return self.op(batch, *args, **kwargs)


def counted_actor(op_class: type, kw: dict[str, Any], target: Target) -> dict[str, Any]:
    """``map_batches`` keywords that build :class:`CountedOp` around ``op_class`` with the same arguments."""
    args = (op_class, tuple(kw.get("fn_constructor_args") or ()), dict(kw.get("fn_constructor_kwargs") or {}), target)
    return {**kw, "fn_constructor_args": args, "fn_constructor_kwargs": None}


# --------------------------------------------------------------------------- wrappers
def _rows(batch: Any) -> int:
    """Rows of a batch as Data-Juicer's methods take and give it: an Arrow table or a dict of columns."""
    if isinstance(batch, dict):
        return len(next(iter(batch.values()))) if batch else 0
    rows = getattr(batch, "num_rows", None)
    return rows if rows is not None else len(batch)


def mapped(samples: Any, result: Any) -> tuple[tuple[int, int, int, int, int], Any]:
    return (_rows(samples), _rows(result), 0, 1, 1), result


def entered(samples: Any, result: Any) -> tuple[tuple[int, int, int, int, int], Any]:
    return (_rows(samples), 0, 0, 1, 0), result


def kept(samples: Any, result: Any) -> tuple[tuple[int, int, int, int, int], Any]:
    if isinstance(result, dict):  # a batch that raised, as catch_map_batches_exception returns it
        return (0, 0, 0, 0, 1), result
    if isinstance(result, Iterator):  # Data-Juicer's map(): read it once, hand the list on to pyarrow.array
        result = list(result)
    kept = result.count(True) if isinstance(result, list) else int(np.count_nonzero(result))
    return (0, kept, 0, 0, 1), result


def kept_one(sample: Any, result: Any) -> tuple[tuple[int, int, int, int, int], Any]:
    return (0, 1 if result else 0, 0, 0, 1), result


def counting(method: Callable, target: Target, measure: Callable) -> Callable:
    """``method`` counting into ``target`` what ``measure`` reads off each call (mapped, entered, kept)."""

    @functools.wraps(method)
    def counted(samples: Any, *args: Any, **kwargs: Any) -> Any:
        result = method(samples, *args, **kwargs)
        if target.sink is None:
            return result
        delta, result = measure(samples, result)
        tally.add(target.sink, target.index, delta)
        return result

    return counted


def noting_errors(method: Callable, batched: bool, target: Target) -> Callable:
    """``method`` counting the rows of a call that raised (then re-raising, for Data-Juicer to catch)."""

    @functools.wraps(method)
    def noting(samples: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(samples, *args, **kwargs)
        except Exception:
            if target.sink is not None:
                tally.add(target.sink, target.index, (0, 0, _rows(samples) if batched else 1, 0, 0))
            raise

    return noting


# what the Data-Juicer patches count with (patches/data_juicer.py: count_batch_calls, counting_dataset_class)
COUNTING = OpCounting(
    target=Target,
    planning=planning,
    counting=counting,
    noting_errors=noting_errors,
    mapped=mapped,
    entered=entered,
    kept=kept,
    kept_one=kept_one,
)
