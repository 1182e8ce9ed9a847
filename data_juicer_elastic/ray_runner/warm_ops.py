"""Warm actor pools: the actors of actor-mode ops live as long as the worker works on one job.

Data-Juicer runs an actor-mode op (every op that uses CUDA, and any op with
``ray_execution_mode: actor``) as ``map_batches(OpClass, compute=ActorPoolStrategy(n), num_gpus=...)``.
Ray Data starts those ``n`` actors at the start of each execution and kills
them at its end, so a worker that runs one execution per shard loads every
model once per shard. Here the op's actors are started once per job instead:

* While a shard's plan is built (:meth:`WarmOps.active`), ``Dataset.map_batches``
  calls whose UDF is a Data-Juicer op class run with an actor pool strategy
  are rewritten: the stage becomes a light task stage (no CPU, no GPU
  reserved) whose function hands each batch to the op's warm pool, and gets
  the op's own output back. Data-Juicer decides everything else as in a plain
  ``ray`` run: which ops use actors, their resources, batch size, concurrency.
* A warm pool holds ``n`` Ray actors (``n`` = the strategy's size, or its
  minimum for an autoscaling range), each created with the resources Ray
  Data would give the op's actors (``num_cpus``, default 1; ``num_gpus``;
  ``runtime_env``) and holding one instance of the op class built with the
  op's own arguments. The op loads its model on first use, so a node loads
  each model ``n`` times for the whole job.
* A router actor (async, no resources) sends each batch to the least busy
  actor of its pool, so the forwarding tasks never need to know which actor
  is free, and the pool's actors are used evenly whatever the block count.
* The op counts its rows (ray_runner/op_counts/hooks.py) as in a plain run: a warm
  actor's op is wrapped once, and each batch says which attempt's counters
  and which op index it counts into. An op that runs cold is built by
  :class:`CountedOp` around its class for the same reason.
* An actor that dies mid-shard fails the calls it had (the attempt fails and
  is retried by the claim loop) and the router replaces it at once with a new
  one built the same way, which loads its model again on first use.
* Pools only ever hold resources Data-Juicer's own checks already granted
  the op, and at least one CPU of the node is always left to the shard's
  other tasks (reads, task-mode ops, writes): an op whose pool would not fit
  runs as Data-Juicer runs it (actors per shard), with a warning.

The forwarding tasks reserve nothing, so two shards' executions (or a shard
and the prefetch of the next) never wait on resources a warm pool holds.
"""

from __future__ import annotations

import pickle
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import ray

from data_juicer_elastic.patches import ray as ray_patches
from data_juicer_elastic.ray_runner.op_counts.hooks import CountedOp, Target, count_op, counted_actor, planned

PER_ACTOR_DEFAULT_CPUS = 1.0  # what Ray Data reserves for a map actor that names no num_cpus
FORWARD_TASKS_PER_ACTOR = 2  # in-flight batches per warm actor: the next one is queued while one runs
_state = threading.local()  # .session: (WarmOps, work_dir, Counter) of the shard being planned here


# --------------------------------------------------------------------------- actors
class _WarmOp:
    """One Data-Juicer op instance, built once in its own actor process."""

    def __init__(self, op_class: type, args: tuple, kwargs: dict) -> None:
        self.op = op_class(*args, **kwargs)
        self.target = Target()  # re-aimed per batch: the attempt and op index its rows count for
        count_op(self.op, self.target)

    def process(self, batch: Any, work_dir: str | None, count: Target | None) -> tuple[bool, Any]:
        """What Ray Data's actor would do with the batch: call the op on it."""
        if work_dir is not None:
            self.op.work_dir = work_dir  # this attempt's work dir, as a cold actor would have it
        self.target.sink, self.target.index = (count.sink, count.index) if count else (None, 0)
        return True, self.op(batch)

    def where(self) -> dict[str, Any]:
        """pid and the GPUs Ray gave this actor (for logs and tests)."""
        import os

        return {"pid": os.getpid(), "gpu_ids": [str(g) for g in ray.get_gpu_ids()]}


class _Router:
    """Sends each batch to the least busy actor of one pool (async: many batches in flight).

    An actor that died is replaced at once by a new one built the same way
    (it loads its model again on first use); only the attempt whose batch it
    had fails.
    """

    def __init__(self, actors: list[Any], spawn: tuple[dict, type, tuple, dict]) -> None:
        self.actors = actors
        self.spawn = spawn  # actor options, op class, args, kwargs
        self.busy = [0] * len(actors)
        self.next = 0  # ties go round the pool, so every actor gets work even one batch at a time

    async def submit(self, refs: list[Any], work_dir: str | None, count: Target | None) -> list[Any]:
        n = len(self.actors)
        i = min(((self.next + k) % n for k in range(n)), key=lambda j: self.busy[j])
        self.next = (i + 1) % n
        actor = self.actors[i]
        self.busy[i] += 1
        try:
            done, out = actor.process.options(num_returns=2).remote(refs[0], work_dir, count)
            await done  # raises if the op raised or the actor died: the caller's task fails
        except ray.exceptions.RayActorError:
            self._replace(i, actor)
            raise
        finally:
            self.busy[i] -= 1
        return [out]

    def _replace(self, i: int, dead: Any) -> None:
        if self.actors[i] is not dead:  # replaced already by another batch's failure
            return
        options, op_class, args, kwargs = self.spawn
        ray.kill(dead, no_restart=True)
        self.actors[i] = ray.remote(_WarmOp).options(**options).remote(op_class, args, kwargs)

    def where(self) -> list[Any]:
        return [a.where.remote() for a in self.actors]


def forward_batch(batch: Any, *, router: Any, work_dir: str | None, count: Target | None) -> Any:
    """The stage that replaces an actor-mode op: the op's warm pool processes the batch."""
    [out] = ray.get(router.submit.remote([ray.put(batch)], work_dir, count))
    return ray.get(out)


# --------------------------------------------------------------------------- pools
@dataclass
class WarmPool:
    """The warm actors of one op of the job, and their router."""

    size: int
    cpus: float
    gpus: float
    actors: list[Any] = field(default_factory=list)
    router: Any = None

    def start(self, op_class: type, args: tuple, kwargs: dict, runtime_env: Any) -> None:
        options: dict[str, Any] = {"num_cpus": self.cpus, "max_restarts": 0}
        if self.gpus:
            options["num_gpus"] = self.gpus
        if runtime_env:
            options["runtime_env"] = runtime_env
        cls = ray.remote(_WarmOp)
        self.actors = [cls.options(**options).remote(op_class, args, kwargs) for _ in range(self.size)]
        spawn = (options, op_class, args, kwargs)
        self.router = ray.remote(_Router).options(num_cpus=0).remote(self.actors, spawn)

    def where(self) -> list[dict[str, Any]]:
        return ray.get(ray.get(self.router.where.remote()))

    def kill(self) -> None:
        for actor in [self.router, *self.actors]:
            if actor is not None:
                ray.kill(actor)
        self.actors, self.router = [], None


def _signature(op_class: type, kw: dict[str, Any]) -> bytes:
    """What makes two map_batches calls the same op (the per-attempt work dir left out)."""
    kwargs = {k: v for k, v in (kw.get("fn_constructor_kwargs") or {}).items() if k != "work_dir"}
    parts = (
        f"{op_class.__module__}.{op_class.__qualname__}",
        tuple(kw.get("fn_constructor_args") or ()),
        kwargs,
        kw.get("num_cpus"),
        kw.get("num_gpus"),
        kw.get("runtime_env"),
        repr(kw.get("compute")),
    )
    try:
        return pickle.dumps(parts)
    except Exception:  # an unpicklable argument: its repr identifies it well enough
        return repr(parts).encode()


class WarmOps:
    """The warm pools of one job on this worker; :meth:`close` releases them."""

    def __init__(self, log: Any = None) -> None:
        self.pools: dict[tuple[bytes, int], WarmPool] = {}
        self._cold: set[tuple[bytes, int]] = set()
        self._log = log

    @contextmanager
    def active(self, work_dir: str | None) -> Iterator[None]:
        """Actor-mode ops planned in this thread meanwhile run on the warm pools (where Ray lets us route
        ``Dataset.map_batches``, patches/ray.py; else they run as Data-Juicer runs them)."""
        install_warm_ops()
        _state.session = (self, work_dir, Counter())
        try:
            yield
        finally:
            _state.session = None

    def rewrite(
        self, op_class: type, kw: dict[str, Any], work_dir: str | None, seen: Counter, count: Target | None
    ) -> dict | None:
        """map_batches keywords that send the op's batches to its warm pool; None: run it cold."""
        sig = _signature(op_class, kw)
        key = (sig, seen[sig])
        seen[sig] += 1
        if key in self._cold:
            return None
        pool = self.pools.get(key) or self._start(key, op_class, kw)
        if pool is None:
            return None
        new = {k: v for k, v in kw.items() if k in ("batch_size", "batch_format", "zero_copy_batch")}
        new.update(
            fn_kwargs={"router": pool.router, "work_dir": work_dir, "count": count},
            compute=ray.data.TaskPoolStrategy(size=FORWARD_TASKS_PER_ACTOR * pool.size),
            num_cpus=0,
        )
        return new

    def _start(self, key: tuple[bytes, int], op_class: type, kw: dict[str, Any]) -> WarmPool | None:
        compute = kw["compute"]
        size = int(compute.min_size)
        cpus = float(kw.get("num_cpus") or PER_ACTOR_DEFAULT_CPUS)
        gpus = float(kw.get("num_gpus") or 0)
        total = ray.cluster_resources()
        used_cpus = sum(p.size * p.cpus for p in self.pools.values())
        used_gpus = sum(p.size * p.gpus for p in self.pools.values())
        if used_cpus + size * cpus > total.get("CPU", 0) - 1 or used_gpus + size * gpus > total.get("GPU", 0):
            self._cold.add(key)
            self._say(
                f"{op_class.__name__}: {size} warm actor(s) of {cpus:g} CPU / {gpus:g} GPU would not leave "
                f"one CPU of this node's {total.get('CPU', 0):g} free beside the other warm ops; "
                "it runs with fresh actors per shard"
            )
            return None
        pool = WarmPool(size=size, cpus=cpus, gpus=gpus)
        pool.start(
            op_class,
            tuple(kw.get("fn_constructor_args") or ()),
            kw.get("fn_constructor_kwargs") or {},
            kw.get("runtime_env"),
        )
        self.pools[key] = pool
        self._say(f"{op_class.__name__}: {size} warm actor(s) ({cpus:g} CPU, {gpus:g} GPU each) kept for this job")
        return pool

    def _say(self, message: str) -> None:
        if self._log is not None:
            self._log(message)
        else:
            from loguru import logger

            logger.info(message)

    def close(self) -> None:
        """Kill every warm actor (their GPUs and CPUs go back to the node)."""
        for pool in self.pools.values():
            pool.kill()
        self.pools.clear()
        self._cold.clear()


# --------------------------------------------------------------------------- the hook
def _is_op_class(fn: Any) -> bool:
    if not isinstance(fn, type):
        return False
    from data_juicer.ops.base_op import OP

    return issubclass(fn, OP)


def _map_batches(self: Any, fn: Any, *args: Any, **kw: Any) -> Any:
    session = getattr(_state, "session", None)
    actor_pool = isinstance(kw.get("compute"), ray.data.ActorPoolStrategy)
    if session is not None and not args and actor_pool and _is_op_class(fn):
        warm, work_dir, seen = session
        count = planned()
        new = warm.rewrite(fn, kw, work_dir, seen, count)
        if new is not None:
            return ray_patches.original_map_batches(self, forward_batch, **new)
        if count is not None:
            fn, kw = CountedOp, counted_actor(fn, kw, count)
    return ray_patches.original_map_batches(self, fn, *args, **kw)


def install_warm_ops() -> bool:
    """Route ``Dataset.map_batches`` through :func:`_map_batches` (inert outside :meth:`WarmOps.active`)."""
    return ray_patches.route_map_batches(_map_batches)
