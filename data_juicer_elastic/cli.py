"""``dj-elastic``: operate a job directory (status, retry, merge, verify) and run phases.

Every error a user can cause prints one line and exits 2; argument errors
come from jsonargparse and exit 2 as well.
"""

from __future__ import annotations

import gc
import os
import re
import signal
import sys

if __name__ == "__main__" or os.path.basename(sys.argv[0]) == "dj-elastic":
    # Stopped while still importing, before a command's own handling is in place: exit 128+N all the same,
    # at once. Nothing is held yet; and a SystemExit raised here can land in a callback whose exceptions
    # Python only prints (an import lock's weakref callback), which lost the stop: the worker ran on, exit 0.
    def _stopped_while_starting(signum: int, _frame: object) -> None:
        os._exit(128 + signum)

    for _sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(_sig, _stopped_while_starting)

from collections.abc import Callable

import orjson
from jsonargparse import ArgumentParser, Namespace

from data_juicer_elastic.errors import ElasticError, UserError, store_error
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.versions import version_line
from data_juicer_elastic.status import describe_error_rows, error_rows_by_shard, first_line
from data_juicer_elastic.storage.mounts import job_dir_location, job_dir_problem
from data_juicer_elastic.storage.probe import probe_once
from data_juicer_elastic.storage.settings import StorageSettings, endpoint_problem
from data_juicer_elastic.storage.store import store_for
from data_juicer_elastic.worker.signals import Interrupted
from data_juicer_elastic.worker.speculation import Speculation


def _job_dir_arg(p: ArgumentParser) -> None:
    p.add_argument("--job-dir", required=True, help="the shared job directory")
    p.add_argument("--generation", default=None, help="the recipe generation to act on; null: the latest submission's")
    _storage_args(p)


def _storage_args(p: ArgumentParser) -> None:
    """The storage options every command takes."""
    p.add_argument(
        "--endpoint-url",
        default=None,
        help="S3 endpoint of an s3:// job dir (MinIO, OSS, ...); null: AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL. "
        "Region, addressing style and dialect: AWS_REGION, DJ_ELASTIC_S3_ADDRESSING_STYLE, DJ_ELASTIC_S3_DIALECT",
    )


def _job_root(a: Namespace) -> str:
    """``--job-dir`` once checked, before anything reads or writes it: an object store behind FUSE or a URL
    other than ``s3://`` is refused (exit 2), and a store that lets a second create through is refused by the
    probe (exit 2, naming the endpoint), its capability line printed once to stderr."""
    problem = job_dir_problem(a.job_dir, "--job-dir")
    if problem:
        raise UserError(problem)
    _apply_storage(a)
    root = job_dir_location(a.job_dir)
    probe_once(store_for(root), lambda line: print(line, file=sys.stderr))
    return root


def _apply_storage(a: Namespace) -> None:
    if a.endpoint_url is not None:
        if problem := endpoint_problem(a.endpoint_url):
            raise UserError(f"--endpoint-url: {problem}")
        StorageSettings(endpoint_url=a.endpoint_url).apply()  # this process's stores and those it starts


def _job(a: Namespace) -> JobDir:
    return JobDir(_job_root(a), a.generation)


# the recipe's elastic_shard keys `dj-elastic prepare` can override
_PREPARE_OVERRIDES = {
    "--num-shards": int,
    "--lock-timeout-secs": float,
    "--heartbeat-secs": float,
    "--max-retries": int,
    "--poll-interval-secs": float,
}


INPUTS = (  # prepare.inputs.SUFFIXES, discover
    "the input, local or s3://: a .jsonl, .jsonl.gz, .jsonl.zst or .parquet file, or a folder of them searched "
    "recursively (one format per job)"
)
OUTPUTS = (  # merge.merge: parquet_out.output_format, folder_export.is_folder_export
    "where to write, local or s3://: a .parquet file (Parquet), a file with any other suffix (JSONL, uncompressed), "
    "or a folder (no suffix, or a trailing /) of part files in the recipe's export format"
)


def _prepare_args(p: ArgumentParser) -> None:
    from data_juicer_elastic.plugin.schema import setting_help

    p.add_argument("--config", required=True, help="the Data-Juicer recipe (YAML)")
    p.add_argument("--dataset-path", default=None, help=f"{INPUTS}; null: the recipe's")
    p.add_argument("--job-dir", default=None, help="job directory; null: the recipe's elastic_shard.job_dir")
    for option, kind in _PREPARE_OVERRIDES.items():
        key = option[2:].replace("-", "_")
        what = "number of input shards" if key == "num_shards" else setting_help(key).rstrip(".")
        p.add_argument(option, type=kind, default=None, help=f"{what}; null: the recipe's {key}")
    p.add_argument("--ray-address", default=None, help="node-local Ray runtime for workers; null: the recipe's")
    _storage_args(p)


def _worker_args(p: ArgumentParser) -> None:
    from data_juicer_elastic.plugin.schema import setting_help

    _job_dir_arg(p)
    p.add_argument("--max-shards", type=int, default=None, help="stop after completing this many shards")
    p.add_argument("--runner", default=None, help="MODULE:ATTR runner; null: Data-Juicer's RayExecutor")
    p.add_argument(
        "--allow-version-mismatch",
        action="store_true",
        help="work even where this node's Data-Juicer / data-juicer-elastic versions differ from the manifest's",
    )
    p.add_argument("--ray-address", default=None, help="override the manifest's node-local Ray address")
    p.add_argument("--stop-when-idle", action="store_true", help="exit 1 instead of waiting on others' leases")
    p.add_argument(
        "--prefetch-shards", type=int, default=1, help="shards claimed and read in ahead of the one running (0: none)"
    )
    p.add_argument("--no-speculation", action="store_true", help="never back up another host's late shard")
    for option, default in (
        ("--speculation-quantile", Speculation.quantile),
        ("--speculation-multiplier", Speculation.multiplier),
        ("--speculation-min-secs", Speculation.min_secs),
    ):
        key = option[2:].replace("-", "_")
        p.add_argument(option, type=float, default=default, help=setting_help(key).rstrip("."))


def _status_args(p: ArgumentParser) -> None:
    _job_dir_arg(p)
    p.add_argument("--json", action="store_true", help="print a JSON object")
    p.add_argument(
        "--shards",
        action="store_true",
        help="list every shard with its host, rows and lost attempts: reads every done record "
        "(the summary reads listings and the worker records only)",
    )
    p.add_argument("--all", action="store_true", help="the same as --shards")
    p.add_argument("--watch", action="store_true", help="redraw one progress line in place until the job ends")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between redraws with --watch")


def _retry_args(p: ArgumentParser) -> None:
    _job_dir_arg(p)
    p.add_argument("--all-failed", action="store_true", help="requeue every failed shard (none failed: exit 0)")
    p.add_argument("--shard-id", nargs="+", default=None, help="requeue these shards, failed or done")


def _merge_args(p: ArgumentParser) -> None:
    _job_dir_arg(p)
    p.add_argument("--output", required=True, help=OUTPUTS)
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace whatever is at --output; without it an output no merge of this job dir wrote is refused, "
        "and this job's own earlier output (another generation's) is replaced, saying so",
    )


def _verify_args(p: ArgumentParser) -> None:
    _job_dir_arg(p)
    p.add_argument("--expect-nodes", type=int, default=None, help="require this many distinct completion hosts")


def _run_args(p: ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="the Data-Juicer recipe (YAML) with an elastic_shard block")
    _storage_args(p)


def _report_args(p: ArgumentParser) -> None:
    _job_dir_arg(p)
    p.add_argument(
        "--output",
        default=None,
        help="where to write it (a path, or an s3:// key); null: report.html in the generation's folder "
        "(<job-dir>/generations/<generation>/, where each run's finalize writes it)",
    )


# name -> (description, one-line help, arguments)
SUBCOMMANDS = {
    "prepare": (
        "Validate the input and split it into shards (run once, on one node).",
        "split the input into shards",
        _prepare_args,
    ),
    "worker": ("Claim and process shards until the job is complete.", "claim and run shards", _worker_args),
    "status": ("Show shard states, hosts, progress.", "job progress (exit 1 while incomplete)", _status_args),
    "retry": ("Requeue failed (or done) shards; old records go to state/history.", "requeue shards", _retry_args),
    "merge": (
        "Verify every shard output and write them, in input order, to one file or a folder of part files.",
        "verified, ordered, atomic merge",
        _merge_args,
    ),
    "verify": (
        "Re-check every done record against its output.",
        "verify outputs (exit 1 while incomplete)",
        _verify_args,
    ),
    "run": (
        "The whole job from a recipe, as `dj-process` runs it on every node.",
        "prepare, work and merge, coordinated across nodes",
        _run_args,
    ),
    "report": (
        "One self-contained HTML page: timeline, throughput, hosts, failures, op counts.",
        "write the job report (HTML)",
        _report_args,
    ),
}


class _Parser(ArgumentParser):
    """Argument errors name options as typed (``--job-dir``), not as jsonargparse's keys (``status.job_dir``)."""

    _KEY = re.compile(r"\b(?:" + "|".join(SUBCOMMANDS) + r")\.([a-z_]+)\b")

    def error(self, message: str, *args: object, **kwargs: object):  # type: ignore[override]
        message = self._KEY.sub(lambda m: "--" + m.group(1).replace("_", "-"), message)
        return super().error(message, *args, **kwargs)


def _parser() -> ArgumentParser:
    root = _Parser(
        prog="dj-elastic",
        description="Elastic shard jobs for Data-Juicer on a shared directory.",
        version=version_line(),
    )
    sub = root.add_subcommands(dest="command")
    for name, (description, help_text, add_args) in SUBCOMMANDS.items():
        p = ArgumentParser(description=description)
        add_args(p)
        sub.add_subcommand(name, p, help=help_text)
    return root


def cmd_prepare(a: Namespace) -> int:
    from data_juicer_elastic.plugin.recipe_job import prepare_from_recipe  # imports Data-Juicer

    _apply_storage(a)
    prepare_from_recipe(a.config, cli_overrides=a)
    return 0


def cmd_worker(a: Namespace) -> int:
    from data_juicer_elastic.job.versions import check_versions
    from data_juicer_elastic.worker.loop import run_worker
    from data_juicer_elastic.worker.runner import load_runner

    job = JobDir(_job_root(a), a.generation, shared_link_check=True)  # shards/ listed once per change, not per worker
    check_versions(job.manifest().versions, allow_mismatch=a.allow_version_mismatch)
    if a.runner:
        runner = load_runner(a.runner)
    else:
        from data_juicer_elastic.console import install_story_console
        from data_juicer_elastic.ray_runner.runner import RayShardRunner

        install_story_console()  # DJ_ELASTIC_CONSOLE=full keeps Data-Juicer's and Ray's output
        runner = RayShardRunner(ray_address=a.ray_address or job.manifest().policy.ray_address)
    speculation = Speculation(
        not a.no_speculation, a.speculation_quantile, a.speculation_multiplier, a.speculation_min_secs
    )
    speculation.check()
    if a.prefetch_shards < 0:
        raise UserError(f"--prefetch-shards must be 0 or more, got {a.prefetch_shards}")
    result = run_worker(
        job,
        runner,
        max_shards=a.max_shards,
        stop_when_idle=a.stop_when_idle,
        speculation=speculation,
        prefetch=a.prefetch_shards,
    )
    print(f"worker exit {result.exit_code}: {result.message}", file=sys.stderr if result.exit_code else sys.stdout)
    return result.exit_code


def cmd_status(a: Namespace) -> int:
    from data_juicer_elastic.status import job_status

    if a.watch:
        from data_juicer_elastic.watch import watch

        return watch(str(_job(a).gen_dir) if a.generation else _job_root(a), a.interval)
    per_shard = a.shards or a.all
    collecting = gc.isenabled()
    gc.disable()  # 100,000s of objects and no cycles are made here: the collector would only walk them
    try:
        st = job_status(_job(a), details=per_shard, per_shard=per_shard)
    finally:
        if collecting:
            gc.enable()
    if a.json:
        sys.stdout.buffer.write(orjson.dumps(st.to_dict(), option=orjson.OPT_INDENT_2) + b"\n")
    else:
        print(format_status(st, show_all=per_shard))
    return 0 if st.complete else (2 if st.failed else 1)


def format_status(st, *, show_all: bool) -> str:
    c = st.counts
    lines = [
        f"job {st.job_dir}" + (f"  generation {st.generation}" if st.generation else ""),
        f"shards: {st.shard_count}  done {c['done']}  running {c['running']}  stale {c['stale']}  "
        f"pending {c['pending']}  failed {c['failed']}",
        f"rows: {st.input_rows_done}/{st.input_rows} input rows done ({st.progress:.1%}), "
        f"{st.output_rows} output rows" + (f", {st.rows_per_sec:.0f} rows/s" if st.rows_per_sec else ""),
    ]
    if st.error_rows:
        lines.append(
            f"op errors: {st.error_rows} row(s) removed by ops that raised (skip_op_error); "
            "see each shard's ops.json and process.log, or `dj-elastic report`"
        )
    lines += st.dedup_lines()
    if st.hosts:
        lines.append("hosts: " + ", ".join(f"{h}={n}" for h, n in sorted(st.hosts.items())))
    if st.earlier_attempts:
        lines.append(
            f"retried: {st.earlier_attempts} earlier attempt(s) (failed, lost or beaten by a backup)"
            + ("" if st.per_shard else "; --shards tells which")
        )
    shown = [s for s in st.shards if show_all or s.state != "done"]
    if shown:
        lines.append(f"{'shard':<22} {'state':<8} {'attempts':>8} {'rows':>9}  host")
        for s in shown:
            rows = "" if s.rows is None else str(s.rows)
            notes = [f"{s.lost} attempt(s) lost: killed or stalled"] if s.lost else []
            notes += [f"{first_line(s.error)}; log: {s.log or '?'}"] if s.error is not None else []
            extra = f"  ({'; '.join(notes)})" if notes else ""
            lines.append(f"{s.id:<22} {s.state:<8} {s.attempts:>8} {rows:>9}  {s.host or ''}{extra}")
    lines += [f"backup: {s.id} {backup_line(s.backup)}" for s in st.shards if s.backup and "won" not in s.backup]
    won = sum(1 for s in st.shards if s.backup and "won" in s.backup)
    if won:
        lines.append(f"backups that won: {won} shard(s)")
    return "\n".join(lines)


def backup_line(b: dict) -> str:
    """One running backup: which attempt on which host backs up which, and how late the original is."""
    late = ""
    if b.get("original_elapsed_secs") is not None and b.get("expected_secs"):
        late = (
            f", original running {b['original_elapsed_secs']:.0f}s of an expected {b['expected_secs']:.0f}s "
            f"({b['original_elapsed_secs'] / b['expected_secs']:.1f}x)"
        )
    state = "live" if b.get("original_live") else "not live"
    return (
        f"attempt {b['attempt']} on host={b.get('host')} backs up attempt {b['original_attempt']} "
        f"on host={b.get('original_host')} ({state}){late}"
    )


def cmd_retry(a: Namespace) -> int:
    from data_juicer_elastic.job.records.retry import requeue

    job = _job(a)
    requeued = requeue(job, a.shard_id, all_failed=a.all_failed)
    if not requeued:  # --all-failed found none: what was asked for holds already, so this is no error (exit 0)
        print("no shard has failed: nothing to requeue (a done shard is requeued by name, with --shard-id)")
        return 0
    print(f"requeued {len(requeued)} shard(s): {' '.join(requeued)}")
    return 0


def cmd_merge(a: Namespace) -> int:
    from data_juicer_elastic.merge import merge

    merge(_job(a), a.output, overwrite=a.overwrite)
    return 0


def cmd_verify(a: Namespace) -> int:
    from data_juicer_elastic.merge import verify

    report = verify(_job(a), expect_nodes=a.expect_nodes)
    for problem in report.problems:
        print(problem, file=sys.stderr)
    hosts = ", ".join(f"{h}={n}" for h, n in sorted(report.hosts.items()))
    print(f"verified {sum(c.ok for c in report.shards)}/{len(report.shards)} shards; hosts: {hosts or 'none'}")
    dropped = describe_error_rows(error_rows_by_shard(_job(a)))
    if dropped:
        print(dropped)
    if not report.ok:
        return 2
    return 0 if report.complete else 1


def cmd_run(a: Namespace) -> int:
    from data_juicer_elastic.plugin.recipe_job import run_from_recipe  # imports Data-Juicer

    _apply_storage(a)
    return run_from_recipe(a.config)


def cmd_report(a: Namespace) -> int:
    from data_juicer_elastic.report import write_report

    path = write_report(_job(a).gen_dir, a.output)
    print(f"report written to {path}")
    return 0


COMMANDS: dict[str, Callable[[Namespace], int]] = {
    "prepare": cmd_prepare,
    "worker": cmd_worker,
    "status": cmd_status,
    "retry": cmd_retry,
    "merge": cmd_merge,
    "verify": cmd_verify,
    "run": cmd_run,
    "report": cmd_report,
}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args[args.command])
    except ElasticError as exc:
        print(f"dj-elastic {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except Interrupted as exc:  # a stop that landed where no command handles it (between a guard's parts)
        print(f"dj-elastic {args.command}: interrupted by {exc}", file=sys.stderr)
        return 128 + exc.signum
    except FileNotFoundError as exc:
        err = UserError(f"{exc.filename}: no such file or directory")
        print(f"dj-elastic {args.command}: error: {err}", file=sys.stderr)
        return err.exit_code
    except Exception as exc:
        if not store_error(exc):
            raise
        print(f"dj-elastic {args.command}: error: {store_error(exc)}", file=sys.stderr)
        return 2  # never 1: status and verify say "still running" with it


if __name__ == "__main__":
    sys.exit(main())
