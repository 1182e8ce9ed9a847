"""Fixtures of the chaos suite: small disks (tmpfs), a NAS-like shared mount (two sshfs mounts), and a fresh
prefix of a moto S3 server (``s3_url``: the job dir of the chaos tests on an object store)."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from ..require import in_ci, require
from ..s3server import use_env
from ..test_store_contract import BUCKET, moto_env  # noqa: F401 (moto_env: the server, one per module)
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


@pytest.fixture
def s3_url(moto_env, monkeypatch) -> str:  # noqa: F811
    """A fresh prefix of the server's bucket; this process and the nodes it starts talk to the server."""
    use_env(monkeypatch, moto_env)
    return f"s3://{BUCKET}/chaos/{uuid.uuid4().hex[:12]}"
