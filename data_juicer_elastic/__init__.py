"""Elastic, shared-directory sharding for Data-Juicer recipes.

The package is laid out by layer (docs/DESIGN.md):

* ``storage/`` - atomic writes, publish-once, the shared clock, bulk writes, block reads, lease refresh, the host name
* ``job/`` - the job directory: layout and manifest, records, leases, versions
* ``prepare/`` - input discovery, strict JSONL, the deterministic split
* ``worker/`` - the claim loop, tail pacing, output checks
* ``merge``, ``status`` - the ordered verified merge and read-only views
* ``coordination/`` - run ids, elections, one process's part of a submission
* ``console`` - the story console and each attempt's log
* ``patches/`` - every change to Data-Juicer's, Ray's and loguru's internals, one module per host
* ``plugin/`` - Data-Juicer's front door: the executor, entry-point registry,
  config schema, parse-time validation, the activation hook
* ``ray_runner/`` - one shard through Data-Juicer's RayExecutor on the node-local
  Ray: runtime, shard I/O, failure classes, warm actors, op counting

Only ``plugin/`` and ``ray_runner/`` import Ray or Data-Juicer, ``patches/`` only
inside functions, and ``plugin/`` leaves ``ray_runner/`` unloaded until a
runner is built (tests/test_layers.py holds it to that). This module is
imported at interpreter start by the activation hook's ``.pth`` file, so the
names below are loaded on first use.
"""

__version__ = "0.1.0"

_LAZY = {
    "ElasticError": "data_juicer_elastic.errors",
    "UserError": "data_juicer_elastic.errors",
    "IntegrityError": "data_juicer_elastic.errors",
    "JobFailed": "data_juicer_elastic.errors",
    "JobDir": "data_juicer_elastic.job.layout",
    "Manifest": "data_juicer_elastic.job.manifest",
    "Policy": "data_juicer_elastic.job.manifest",
    "ClaimStore": "data_juicer_elastic.job.claims",
    "PrepareRequest": "data_juicer_elastic.prepare.driver",
    "PrepareResult": "data_juicer_elastic.prepare.driver",
    "prepare": "data_juicer_elastic.prepare.driver",
    "Runner": "data_juicer_elastic.worker.runner",
    "WorkerResult": "data_juicer_elastic.worker.loop",
    "run_worker": "data_juicer_elastic.worker.loop",
    "verify": "data_juicer_elastic.merge",
    "merge": "data_juicer_elastic.merge",
    "VerifyReport": "data_juicer_elastic.merge",
    "MergeResult": "data_juicer_elastic.merge",
    "job_status": "data_juicer_elastic.status",
    "JobStatus": "data_juicer_elastic.status",
    "requeue": "data_juicer_elastic.job.records.retry",
    "JobSpec": "data_juicer_elastic.coordination.session",
    "run_job": "data_juicer_elastic.coordination.session",
    "RayShardRunner": "data_juicer_elastic.ray_runner.runner",
    "ElasticShardExecutor": "data_juicer_elastic.plugin.executor",
}

__all__ = ["__version__", *sorted(_LAZY)]


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(module), name)
