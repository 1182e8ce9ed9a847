"""What every process of one submission is asked to do (``JobSpec``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from data_juicer_elastic.errors import UserError
from data_juicer_elastic.job.manifest import Policy
from data_juicer_elastic.worker.runner import Runner
from data_juicer_elastic.worker.speculation import Speculation

if TYPE_CHECKING:
    from data_juicer_elastic.prepare.driver import PrepareRequest


@dataclass(frozen=True)
class JobSpec:
    """What every process of one submission is asked to do.

    ``make_prepare_request`` is called only by the prepare coordinator (it
    validates the recipe and may raise ``UserError``); ``make_runner`` only by
    the one claim-loop process of each host (it starts that host's Ray). A
    runner with a ``close()`` method is closed when the claim loop ends.

    ``nodes`` is informational in elastic mode. With ``require_all_nodes``
    every host completes at most ``ceil(shards / nodes)`` shards in this run,
    so the job can only finish when all ``nodes`` hosts took part; a missing
    node fails the job once nothing has progressed for ``wait_timeout_secs``.

    ``make_prepare_request`` is also called by every other process once
    prepare has published, to check it was asked for what was prepared.
    ``make_runner`` is given the generation's folder (``JobDir(that)`` names it).

    ``overwrite_output`` defaults to False: an output this job dir did not
    write is refused, its own earlier output (another generation's) replaced
    with a line (``export_target``); rerunning a finished job does not rewrite
    it while it is still what the last merge of the same done records wrote
    (``merge.merged_already``).
    """

    job_dir: str
    export_path: str
    make_prepare_request: Callable[[], PrepareRequest]
    make_runner: Callable[[str], Runner]
    run_id: str | None = None
    nodes: int | None = None
    require_all_nodes: bool = False
    max_shards: int | None = None
    prefetch_shards: int = 1
    wait_timeout_secs: float | None = 3600.0
    poll_interval_secs: float = Policy.poll_interval_secs
    allow_version_mismatch: bool = False
    overwrite_output: bool = False
    speculation: Speculation = field(default_factory=Speculation)  # a worker option: may change per submission

    def check(self) -> None:
        if self.nodes is not None and self.nodes < 1:
            raise UserError(f"elastic_shard.nodes must be at least 1, got {self.nodes}")
        if self.require_all_nodes and not self.nodes:
            raise UserError("elastic_shard.require_all_nodes needs elastic_shard.nodes (how many nodes must take part)")
        if self.max_shards is not None and self.max_shards < 1:
            raise UserError(f"elastic_shard.max_shards must be at least 1, got {self.max_shards}")
        if self.prefetch_shards < 0:
            raise UserError(f"elastic_shard.prefetch_shards must be 0 or more, got {self.prefetch_shards}")
        if (self.wait_timeout_secs is not None and self.wait_timeout_secs <= 0) or self.poll_interval_secs <= 0:
            raise UserError("elastic_shard.wait_timeout_secs and poll_interval_secs must be positive")
        self.speculation.check()

    @property
    def timeout(self) -> float:
        """``wait_timeout_secs``, where None (wait indefinitely) is infinity."""
        return math.inf if self.wait_timeout_secs is None else self.wait_timeout_secs


def strict_split_ok(shards: int, nodes: int) -> bool:
    """True when ``nodes - 1`` hosts, each capped at ``ceil(shards / nodes)``, cannot do every shard."""
    return shards >= nodes and (nodes - 1) * math.ceil(shards / nodes) < shards
