"""The run id: what tells the processes of one submission from those of another.

Every process of one launch must find the same id without talking to the
others: an explicit one, ``DJ_ELASTIC_RUN_ID``, or a launcher's job id. A
fresh id is only invented for a lone process.
"""

from __future__ import annotations

import hashlib
import os
import re
import uuid
from collections.abc import Mapping

from data_juicer_elastic.errors import UserError

RUN_ID_ENV = "DJ_ELASTIC_RUN_ID"
# Launcher job ids, in order of preference; each is shared by every process of one submission.
LAUNCHER_RUN_ID_ENVS = ("PAI_JOB_ID", "DLC_JOB_ID", "JOB_ID", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID")
# Set by launchers that start several processes; > 1 means this process is not alone.
WORLD_SIZE_ENVS = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE", "SLURM_NTASKS")
LOCAL_RANK_ENVS = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID")


def resolve_run_id(explicit: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """The submission's id: explicit, ``DJ_ELASTIC_RUN_ID``, a launcher's job id, or a fresh one.

    A fresh id is only safe for a lone process: several processes of one
    launch would each invent their own and never meet.
    """
    env = os.environ if env is None else env
    if explicit:
        return explicit
    for name in (RUN_ID_ENV, *LAUNCHER_RUN_ID_ENVS):
        value = env.get(name, "").strip()
        if value and value.lower() != "none":  # torchrun's default --rdzv-id is "none"
            if name == "SLURM_JOB_ID" and env.get("SLURM_STEP_ID"):
                value += "." + env["SLURM_STEP_ID"]  # each srun step is its own submission
            return value
    sizes = {name: env[name] for name in WORLD_SIZE_ENVS if _int(env.get(name)) > 1}
    if sizes:
        found = ", ".join(f"{k}={v}" for k, v in sizes.items())
        raise UserError(
            f"this launch starts several processes ({found}) but none of {', '.join(LAUNCHER_RUN_ID_ENVS)} is set, "
            "so they cannot tell they belong to one submission; set the same unique id on every process with "
            f"elastic_shard.run_id or the {RUN_ID_ENV} environment variable (a new id for each submission)"
        )
    return f"local-{uuid.uuid4().hex[:12]}"


def local_rank(env: Mapping[str, str] | None = None) -> int | None:
    """The launcher's rank of this process on its host, if any (logged only: hosts elect)."""
    env = os.environ if env is None else env
    for name in LOCAL_RANK_ENVS:
        if name in env:
            return _int(env[name])
    return None


def _int(value: str | None) -> int:
    try:
        return int(value or 0)
    except ValueError:
        return 0


def safe_key(text: str, limit: int = 48) -> str:
    """A file name for ``text``: readable prefix plus a hash, so distinct texts never collide."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", text)[:limit].strip("._-") or "x"
    return f"{readable}-{hashlib.sha256(text.encode()).hexdigest()[:10]}"
