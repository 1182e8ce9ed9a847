"""The ``elastic_shard`` block of a recipe: keys, types, defaults, help.

Added to Data-Juicer's parser, so jsonargparse type-checks the values in the
YAML and on the command line (``--elastic_shard.num_shards 8``) and
``dj-process --help`` lists them.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field, fields
from typing import Any, Literal, Optional, Union

from jsonargparse.typing import ClosedUnitInterval, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt

from data_juicer_elastic.coordination.spec import JobSpec
from data_juicer_elastic.errors import UserError
from data_juicer_elastic.job.manifest import Policy
from data_juicer_elastic.storage.settings import ADDRESSING_STYLES, DIALECTS, StorageSettings
from data_juicer_elastic.worker.speculation import Speculation

NAME = "elastic_shard"
KEY = NAME  # the recipe key of the block


@dataclass(frozen=True)
class ElasticShardSettings:
    """The block's values. Defaults come from where each setting is used: the manifest's ``Policy``
    (fixed at prepare) and the submission's ``JobSpec``, so the three never disagree."""

    job_dir: str | None = None
    num_shards: int | str = "auto"
    lock_timeout_secs: float = Policy.lock_timeout_secs
    heartbeat_secs: float = Policy.heartbeat_secs
    max_retries: int = Policy.max_retries
    poll_interval_secs: float = Policy.poll_interval_secs
    wait_timeout_secs: float | None = JobSpec.wait_timeout_secs
    run_id: str | None = JobSpec.run_id
    nodes: int | None = JobSpec.nodes
    require_all_nodes: bool = JobSpec.require_all_nodes
    max_shards: int | None = JobSpec.max_shards
    prefetch_shards: int = JobSpec.prefetch_shards
    ray_address: str = Policy.ray_address
    allow_version_mismatch: bool = JobSpec.allow_version_mismatch
    overwrite_output: bool = JobSpec.overwrite_output
    speculation: bool = Speculation.enabled
    speculation_quantile: float = Speculation.quantile
    speculation_multiplier: float = Speculation.multiplier
    speculation_min_secs: float = Speculation.min_secs

    def speculation_policy(self) -> Speculation:
        return Speculation(
            self.speculation, self.speculation_quantile, self.speculation_multiplier, self.speculation_min_secs
        )

    console: str = "story"
    progress_interval_secs: float | None = 30.0
    storage: StorageSettings = field(default_factory=StorageSettings)


# key -> (jsonargparse type, help); defaults come from the dataclass
_ARGS: dict[str, tuple[Any, str]] = {
    "job_dir": (
        Optional[str],
        "Shared job directory (NAS/NFS/CPFS) every node can read and write, or s3://bucket/prefix on an S3 "
        "endpoint; required with executor_type elastic_shard. Holds the manifest, shards, leases, attempt "
        "outputs and logs.",
    ),
    "num_shards": (
        Union[PositiveInt, Literal["auto"]],
        "Number of contiguous, byte-balanced input shards, or 'auto' to let prepare choose.",
    ),
    "lock_timeout_secs": (PositiveFloat, "A lease not renewed for this long is stale and may be taken over."),
    "heartbeat_secs": (PositiveFloat, "How often a running shard renews its lease (must be below lock_timeout_secs)."),
    "max_retries": (NonNegativeInt, "Failed attempts of one shard retried before it fails terminally (exit 2)."),
    "poll_interval_secs": (PositiveFloat, "How often an idle worker looks for claimable shards."),
    "wait_timeout_secs": (
        Optional[PositiveFloat],
        "How long to wait with no sign of progress from other nodes (prepare coordinator, stalled job) "
        "before failing; null waits indefinitely.",
    ),
    "run_id": (
        Optional[str],
        "Identifies one submission so its nodes coordinate and a later submission can reuse the job "
        "directory; null derives it from the launcher's environment.",
    ),
    "nodes": (Optional[PositiveInt], "Number of nodes expected to take part in this submission."),
    "require_all_nodes": (bool, "Fail unless all `nodes` nodes join the submission."),
    "max_shards": (Optional[PositiveInt], "Stop this node's worker after it completed this many shards."),
    "prefetch_shards": (
        NonNegativeInt,
        "Shards a worker claims and reads in ahead of the one it processes, so its node never waits "
        "between shards (0: one shard at a time). Each holds a lease and counts toward max_shards.",
    ),
    "ray_address": (
        str,
        "Node-local Ray runtime each worker uses: 'local' starts one per worker process; "
        "otherwise the address of a Ray runtime on this node to connect to.",
    ),
    "allow_version_mismatch": (
        bool,
        "Let a node whose Data-Juicer / data-juicer-elastic versions differ from the manifest's work anyway.",
    ),
    "overwrite_output": (
        bool,
        "Replace whatever is at export_path. Without it an output no merge of this job dir wrote is refused; "
        "this job's own earlier output (another recipe generation's) is replaced, saying so.",
    ),
    "speculation": (
        bool,
        "Back up late shards: a worker with nothing left to claim reruns a live shard of another host that "
        "runs well past what its size predicts; the first to finish wins. false switches it off.",
    ),
    "speculation_quantile": (ClosedUnitInterval, "Fraction of the shards done before any backup starts."),
    "speculation_multiplier": (
        PositiveFloat,
        "A shard is late once it has run this many times what its bytes take at the job's median rate "
        "(at least 1); a worker this much slower than the job backs up nothing.",
    ),
    "speculation_min_secs": (NonNegativeFloat, "Never back up a shard that has run less than this many seconds."),
    "console": (
        Literal["story", "full"],
        "'story': the console shows this project's lines (elections, one line per shard, progress) and "
        "Data-Juicer's and Ray's warnings and errors, each once; everything else goes to each attempt's "
        "process.log. 'full': Data-Juicer's and Ray's console output as they ship it "
        "(the environment variable DJ_ELASTIC_CONSOLE=full does the same).",
    ),
    "progress_interval_secs": (
        Optional[PositiveFloat],
        "How often each process logs one progress line for the whole job (shards done/running/pending, "
        "hosts, rows/s, ETA) read from the job dir; null turns it off.",
    ),
}


STORAGE = "storage"  # the sub-block of the S3 settings: elastic_shard.storage.<key>
_STORAGE_ARGS: dict[str, tuple[Any, str]] = {
    "endpoint_url": (
        Optional[str],
        "S3 endpoint of every s3:// path of the job (job_dir, dataset_path, export_path), e.g. "
        "https://oss-cn-hangzhou.aliyuncs.com or http://minio.lan:9000; null: AWS_ENDPOINT_URL_S3 / "
        "AWS_ENDPOINT_URL, else AWS. Credentials never go here: boto3 finds them (AWS_PROFILE, AWS_ACCESS_KEY_ID, "
        "roles).",
    ),
    "region": (Optional[str], "S3 region; null: AWS_REGION / AWS_DEFAULT_REGION or the profile's."),
    "addressing_style": (
        Optional[Literal[ADDRESSING_STYLES]],  # type: ignore[valid-type]
        "virtual (bucket.host; Alibaba OSS takes only this), path (host/bucket) or auto; null: boto3's choice.",
    ),
    "dialect": (
        Optional[Literal[DIALECTS]],  # type: ignore[valid-type]
        "How create-once is spelt: s3 (If-None-Match / If-Match: AWS, MinIO, Ceph) or oss (Alibaba OSS: "
        "x-oss-forbid-overwrite; OSS has no compare-and-swap, so it serves dataset_path and export_path, "
        "not a job dir); null: DJ_ELASTIC_S3_DIALECT, else s3.",
    ),
}


def setting_help(name: str) -> str:
    """The help text of the ``elastic_shard.<name>`` key."""
    return _ARGS[name][1]


def _name_choice_types(parser: Any) -> None:
    """jsonargparse gives an option with both a type hint and choices (``executor_type``: ``str``, and the
    choices this plugin widens) an anonymous ``lambda`` as its type, which ``--help`` prints as
    ``<function <locals>.<lambda> at 0x...>``: a plain ``str`` hint gets ``str`` back (the same conversion)."""
    for action in parser._actions:
        kind = getattr(action, "type", None)
        if action.choices and getattr(kind, "__name__", "") == "<lambda>" and getattr(action, "_typehint", None) is str:
            action.type = str


def add_arguments(parser: Any) -> None:
    """Add ``--elastic_shard.*`` to a jsonargparse parser (no-op if already there)."""
    _name_choice_types(parser)
    if any(getattr(a, "dest", None) == f"{KEY}.job_dir" for a in parser._actions):
        return
    defaults = ElasticShardSettings()
    for f in fields(ElasticShardSettings):
        if f.name == STORAGE:
            for sub in fields(StorageSettings):
                typ, help_text = _STORAGE_ARGS[sub.name]
                parser.add_argument(f"--{KEY}.{STORAGE}.{sub.name}", type=typ, default=None, help=help_text)
            continue
        typ, help_text = _ARGS[f.name]
        parser.add_argument(f"--{KEY}.{f.name}", type=typ, default=getattr(defaults, f.name), help=help_text)


_NOT_ACCEPTED = re.compile(rf"Option '({KEY}\.[\w.]+)' is not accepted")


def suggest_keys(parser: Any) -> None:
    """The parser's "Option 'elastic_shard.x' is not accepted" gains "did you mean ...?", as an op's argument
    typo does (Data-Juicer's preflight), by wrapping this parser's ``error``."""
    error = parser.error
    if getattr(error, "suggests_keys", False):
        return

    def error_with_suggestion(message: str, ex: Exception | None = None) -> Any:
        return error(with_suggestion(message, [a.dest for a in parser._actions]), ex)

    error_with_suggestion.suggests_keys = True  # type: ignore[attr-defined]
    parser.error = error_with_suggestion


def with_suggestion(message: str, keys: list[str]) -> str:
    m = _NOT_ACCEPTED.search(str(message))
    if m is None:
        return message
    prefix = f"{KEY}."  # compared without it: every key shares it
    known = [k.removeprefix(prefix) for k in keys if isinstance(k, str) and k.startswith(prefix)]
    close = difflib.get_close_matches(m.group(1).removeprefix(prefix), known, n=1, cutoff=0.6)
    if close:
        return f"{message}; did you mean '{prefix}{close[0]}'?"
    return f"{message}; the {KEY} keys are {', '.join(known)}"


def settings_from_cfg(cfg: Any) -> ElasticShardSettings:
    """The block of a parsed config as a frozen dataclass (defaults for absent keys)."""
    block = cfg.get(KEY) if hasattr(cfg, "get") else getattr(cfg, KEY, None)
    if block is None:
        return ElasticShardSettings()
    values = _plain(block, "elastic_shard", "the executor's settings")
    known = {f.name for f in fields(ElasticShardSettings)}
    block = _plain(values.get(STORAGE), "elastic_shard.storage", "endpoint_url, region, addressing_style, dialect")
    storage = StorageSettings(**{k: v for k, v in block.items() if v is not None})
    return ElasticShardSettings(**{k: v for k, v in values.items() if k in known and k != STORAGE}, storage=storage)


def _plain(block: Any, name: str, holds: str) -> dict[str, Any]:
    """A (sub-)block as a dict: a jsonargparse Namespace, a dict, or nothing; another value is the user's error."""
    if block is None:
        return {}
    if isinstance(block, dict):
        return dict(block)
    if not hasattr(block, "__dict__"):  # `storage: "http://minio:9000"`: a value where a block belongs
        raise UserError(f"{name}: got {block!r}; it is a block (a mapping) of {holds}")
    return dict(vars(block))
