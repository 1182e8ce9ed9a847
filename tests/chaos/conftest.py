"""Fixtures of the chaos suite: small disks (tmpfs) and a NAS-like shared mount (two sshfs mounts)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from ..require import in_ci, require
from .sshfs import SshfsPair


@pytest.fixture
def small_disk(tmp_path: Path):
    """``mount(size)`` a fresh tmpfs of that size (skips where not allowed, fails in CI); ``resize(dir, size)``."""
    mounted: list[Path] = []

    def mount(size: str, name: str = "small") -> Path:
        folder = tmp_path / name
        folder.mkdir()
        require(os.geteuid() == 0, "root, to mount a small tmpfs")
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(folder)],
            capture_output=True,
            text=True,
        )
        require(r.returncode == 0, f"a tmpfs mount (it failed: {r.stderr.strip()}); needs CAP_SYS_ADMIN")
        mounted.append(folder)
        return folder

    def resize(folder: Path, size: str) -> None:
        subprocess.run(["mount", "-o", f"remount,size={size}", str(folder)], check=True)

    yield SimpleNamespace(mount=mount, resize=resize)
    for folder in reversed(mounted):
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


@pytest.fixture(scope="session")
def sshfs_pair(tmp_path_factory):
    """Two sshfs mounts (own attribute caches) of one directory, served by a private sshd on 127.0.0.1."""
    pair = SshfsPair(tmp_path_factory.mktemp("sshfs"))
    reason = pair.unavailable()
    required = in_ci() or bool(os.environ.get("DJE_REQUIRE_SSHFS"))
    if reason and required:
        pytest.fail(f"sshfs tests are required here (CI or DJE_REQUIRE_SSHFS) but {reason}", pytrace=False)
    require(reason is None, str(reason))
    try:
        pair.start()
    except Exception as exc:
        pair.stop()
        if required:
            raise
        pytest.skip(f"could not set up sshfs over loopback: {exc}")
    try:
        yield pair
    finally:
        pair.stop()
