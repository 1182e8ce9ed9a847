"""``dj-elastic``: operate a job directory (status, retry, merge, verify) and run phases.

Every error a user can cause prints one line and exits 2; argument errors
come from jsonargparse and exit 2 as well.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import orjson
from jsonargparse import ArgumentParser, Namespace

from data_juicer_elastic.errors import ElasticError, UserError
from data_juicer_elastic.job.layout import JobDir


def _job_dir_arg(p: ArgumentParser) -> None:
    p.add_argument("--job-dir", required=True, help="the shared job directory")


def _parser() -> ArgumentParser:
    root = ArgumentParser(prog="dj-elastic", description="Elastic shard jobs for Data-Juicer on a shared directory.")
    sub = root.add_subcommands(dest="command")

    p = ArgumentParser(description="Validate the input and split it into shards (run once, on one node).")
    p.add_argument("--config", required=True, help="the Data-Juicer recipe (YAML)")
    p.add_argument("--dataset-path", default=None, help="input JSONL file or directory (default: the recipe's)")
    p.add_argument("--job-dir", default=None, help="job directory (default: the recipe's elastic_shard.job_dir)")
    p.add_argument("--num-shards", type=int, default=None)
    p.add_argument("--lock-timeout-secs", type=float, default=None)
    p.add_argument("--heartbeat-secs", type=float, default=None)
    p.add_argument("--max-retries", type=int, default=None)
    p.add_argument("--poll-interval-secs", type=float, default=None)
    p.add_argument("--ray-address", default=None, help="node-local Ray runtime for workers (default: local)")
    sub.add_subcommand("prepare", p, help="split the input into shards")

    p = ArgumentParser(description="Claim and process shards until the job is complete.")
    _job_dir_arg(p)
    p.add_argument("--max-shards", type=int, default=None, help="stop after completing this many shards")
    p.add_argument("--runner", default=None, help="MODULE:ATTR runner (default: Data-Juicer's RayExecutor)")
    p.add_argument("--allow-version-mismatch", action="store_true")
    p.add_argument("--ray-address", default=None, help="override the manifest's node-local Ray address")
    p.add_argument("--stop-when-idle", action="store_true", help="exit 1 instead of waiting on others' leases")
    p.add_argument(
        "--prefetch-shards", type=int, default=1, help="shards claimed and read in ahead of the one running (0: none)"
    )
    sub.add_subcommand("worker", p, help="claim and run shards")

    p = ArgumentParser(description="Show shard states, hosts, progress.")
    _job_dir_arg(p)
    p.add_argument("--json", action="store_true", help="print a JSON object")
    p.add_argument("--all", action="store_true", help="list every shard, not only unfinished ones")
    sub.add_subcommand("status", p, help="job progress (exit 1 while incomplete)")

    p = ArgumentParser(description="Requeue failed (or done) shards; old records go to state/history.")
    _job_dir_arg(p)
    p.add_argument("--all-failed", action="store_true")
    p.add_argument("--shard-id", nargs="+", default=None)
    sub.add_subcommand("retry", p, help="requeue shards")

    p = ArgumentParser(description="Verify every shard output and write them, in input order, to one file.")
    _job_dir_arg(p)
    p.add_argument("--output", required=True)
    p.add_argument("--overwrite", action="store_true")
    sub.add_subcommand("merge", p, help="verified, ordered, atomic merge")

    p = ArgumentParser(description="Re-check every done record against its output.")
    _job_dir_arg(p)
    p.add_argument("--expect-nodes", type=int, default=None, help="require this many distinct completion hosts")
    sub.add_subcommand("verify", p, help="verify outputs (exit 1 while incomplete)")

    p = ArgumentParser(description="The whole job from a recipe, as `dj-process` runs it on every node.")
    p.add_argument("--config", required=True, help="the Data-Juicer recipe (YAML) with an elastic_shard block")
    sub.add_subcommand("run", p, help="prepare, work and merge, coordinated across nodes")
    return root


def cmd_prepare(a: Namespace) -> int:
    from data_juicer_elastic.plugin.recipe_job import prepare_from_recipe  # imports Data-Juicer

    prepare_from_recipe(a.config, cli_overrides=a)
    return 0


def cmd_worker(a: Namespace) -> int:
    from data_juicer_elastic.job.versions import check_versions
    from data_juicer_elastic.worker.loop import load_runner, run_worker

    job = JobDir(a.job_dir)
    check_versions(job.manifest().versions, allow_mismatch=a.allow_version_mismatch)
    if a.runner:
        runner = load_runner(a.runner)
    else:
        from data_juicer_elastic.plugin.runner import RayShardRunner

        runner = RayShardRunner(ray_address=a.ray_address or job.manifest().policy.ray_address)
    if a.prefetch_shards < 0:
        raise UserError(f"--prefetch-shards must be 0 or more, got {a.prefetch_shards}")
    result = run_worker(
        job.root, runner, max_shards=a.max_shards, stop_when_idle=a.stop_when_idle, prefetch=a.prefetch_shards
    )
    print(f"worker exit {result.exit_code}: {result.message}", file=sys.stderr if result.exit_code else sys.stdout)
    return result.exit_code


def cmd_status(a: Namespace) -> int:
    from data_juicer_elastic.status import job_status

    st = job_status(JobDir(a.job_dir))
    if a.json:
        sys.stdout.buffer.write(orjson.dumps(st.to_dict(), option=orjson.OPT_INDENT_2) + b"\n")
    else:
        print(format_status(st, show_all=a.all))
    return 0 if st.complete else (2 if st.failed else 1)


def format_status(st, *, show_all: bool) -> str:
    c = st.counts
    lines = [
        f"job {st.job_dir}",
        f"shards: {len(st.shards)}  done {c['done']}  running {c['running']}  stale {c['stale']}  "
        f"pending {c['pending']}  failed {c['failed']}",
        f"rows: {st.input_rows_done}/{st.input_rows} input rows done ({st.progress:.1%}), "
        f"{st.output_rows} output rows" + (f", {st.rows_per_sec:.0f} rows/s" if st.rows_per_sec else ""),
    ]
    if st.hosts:
        lines.append("hosts: " + ", ".join(f"{h}={n}" for h, n in sorted(st.hosts.items())))
    shown = [s for s in st.shards if show_all or s.state != "done"]
    if shown:
        lines.append(f"{'shard':<22} {'state':<8} {'attempts':>8} {'rows':>9}  host")
        for s in shown:
            rows = "" if s.rows is None else str(s.rows)
            extra = f"  ({s.error})" if s.error else ""
            lines.append(f"{s.id:<22} {s.state:<8} {s.attempts:>8} {rows:>9}  {s.host or ''}{extra}")
    return "\n".join(lines)


def cmd_retry(a: Namespace) -> int:
    from data_juicer_elastic.status import retry

    requeued = retry(JobDir(a.job_dir), a.shard_id, all_failed=a.all_failed)
    print(f"requeued {len(requeued)} shard(s): {' '.join(requeued)}")
    return 0


def cmd_merge(a: Namespace) -> int:
    from data_juicer_elastic.merge import merge

    merge(JobDir(a.job_dir), a.output, overwrite=a.overwrite)
    return 0


def cmd_verify(a: Namespace) -> int:
    from data_juicer_elastic.merge import verify

    report = verify(JobDir(a.job_dir), expect_nodes=a.expect_nodes)
    for problem in report.problems:
        print(problem, file=sys.stderr)
    hosts = ", ".join(f"{h}={n}" for h, n in sorted(report.hosts.items()))
    print(f"verified {sum(c.ok for c in report.shards)}/{len(report.shards)} shards; hosts: {hosts or 'none'}")
    if not report.ok:
        return 2
    return 0 if report.complete else 1


def cmd_run(a: Namespace) -> int:
    from data_juicer_elastic.plugin.recipe_job import run_from_recipe  # imports Data-Juicer

    return run_from_recipe(a.config)


COMMANDS: dict[str, Callable[[Namespace], int]] = {
    "prepare": cmd_prepare,
    "worker": cmd_worker,
    "status": cmd_status,
    "retry": cmd_retry,
    "merge": cmd_merge,
    "verify": cmd_verify,
    "run": cmd_run,
}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args[args.command])
    except ElasticError as exc:
        print(f"dj-elastic {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except FileNotFoundError as exc:
        err = UserError(f"{exc.filename}: no such file or directory")
        print(f"dj-elastic {args.command}: error: {err}", file=sys.stderr)
        return err.exit_code


if __name__ == "__main__":
    sys.exit(main())
