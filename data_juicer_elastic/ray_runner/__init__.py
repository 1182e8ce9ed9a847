"""The Ray shard runner: one shard through Data-Juicer's RayExecutor on this node's own Ray.

* :mod:`.runner` - ``RayShardRunner``: an attempt's three stages (load, process, finish)
* :mod:`.runtime` - the node-local Ray runtime, started once per worker process
* :mod:`.configs` - the job's recipe as Data-Juicer parses it, each attempt's copy
* :mod:`.shard_io` - the shard read into Ray's object store; Ray's part files joined in order
* :mod:`.shard_errors` - which failures recur on every attempt; long rows
* :mod:`.warm_ops` - the actors of actor-mode ops kept for the whole job
* :mod:`.op_counts` - rows in and out of every op, and rows op errors removed

May import Ray, Data-Juicer, the core and ``plugin/``'s front door; nothing
but the executor's ``make_runner`` and ``dj-elastic worker`` imports it.
"""

from __future__ import annotations


def __getattr__(name: str) -> object:
    if name == "RayShardRunner":
        from data_juicer_elastic.ray_runner.runner import RayShardRunner

        return RayShardRunner
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
