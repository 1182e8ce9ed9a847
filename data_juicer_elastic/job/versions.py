"""Versions recorded at prepare time, checked again by every worker.

Read from package metadata, so checking them never imports Data-Juicer.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from data_juicer_elastic import __version__
from data_juicer_elastic.errors import UserError


def current_versions() -> dict[str, str]:
    try:
        dj = version("py-data-juicer")
    except PackageNotFoundError:
        dj = "absent"
    return {"data_juicer": dj, "data_juicer_elastic": __version__}


def version_line() -> str:
    """``dj-elastic --version``: this package's and Data-Juicer's versions, what a bug report needs."""
    versions = current_versions()
    dj = versions["data_juicer"]
    return f"{versions['data_juicer_elastic']} (Data-Juicer {'not installed' if dj == 'absent' else dj})"


def check_versions(recorded: dict[str, str], *, allow_mismatch: bool = False) -> list[str]:
    """Differences between the manifest's versions and this node's; raise unless allowed."""
    here = current_versions()
    diffs = [
        f"{name}: {recorded.get(name)} in the manifest, {here[name]} on this node"
        for name in here
        if recorded.get(name) not in (None, here[name])
    ]
    if diffs and not allow_mismatch:
        raise UserError(
            "version mismatch between the prepared job and this node (" + "; ".join(diffs) + "); "
            "install the same versions on every node, or pass --allow-version-mismatch "
            "(elastic_shard.allow_version_mismatch: true) if you know the outputs stay compatible"
        )
    return diffs
