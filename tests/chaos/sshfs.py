"""A NAS on one machine: a private sshd on 127.0.0.1 and two sshfs mounts of one directory.

Each mount is one simulated node with its own client-side caches (sshfs's
stat/dir cache and the kernel's FUSE attribute and entry caches), so what one
node writes reaches the other through the server, late, as on NFS.
Everything started here is stopped by ``stop()``, which is safe to call at
any point of a failed ``start()``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path

SSHD = shutil.which("sshd") or ("/usr/sbin/sshd" if os.path.exists("/usr/sbin/sshd") else None)
# one second of client-side caching: leases need lock_timeout > heartbeat + cache + mtime granularity (1 s on sftp)
CACHE_OPTIONS = "cache=yes,cache_timeout=1,attr_timeout=1,entry_timeout=1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SshfsPair:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.share = base / "share"  # the server's directory
        self.mounts = [base / "node-a", base / "node-b"]
        self.port = int(os.environ.get("DJE_SSHFS_PORT") or _free_port())
        self.sshd: subprocess.Popen | None = None
        self.mounted: list[Path] = []

    def unavailable(self) -> str | None:
        """Why the pair cannot run here, or None."""
        if os.geteuid() != 0:
            return "sshfs tests need root (sshd for root@127.0.0.1 and FUSE mounts)"
        missing = [
            name
            for name, found in (
                ("sshfs", shutil.which("sshfs")),
                ("sshd", SSHD),
                ("ssh-keygen", shutil.which("ssh-keygen")),
                ("ssh", shutil.which("ssh")),
            )
            if not found
        ]
        if missing:
            return f"{', '.join(missing)} not installed (apt-get install openssh-server sshfs); .ci/run installs them"
        if not shutil.which("fusermount3") and not shutil.which("fusermount"):
            return "fusermount not installed (apt-get install fuse3)"
        if not os.path.exists("/dev/fuse"):
            return "/dev/fuse is missing: FUSE is not available in this container (run it with --device /dev/fuse)"
        return None

    # setup --------------------------------------------------------------------------------------
    def start(self) -> None:
        keys = self.base / "keys"
        for d in (self.share, keys, *self.mounts):
            d.mkdir(parents=True, exist_ok=True)
        os.chmod(keys, 0o700)
        for name in ("host_key", "client_key"):
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / name)], check=True, capture_output=True
            )
        shutil.copy(keys / "client_key.pub", keys / "authorized_keys")
        os.chmod(keys / "authorized_keys", 0o600)
        config = keys / "sshd_config"
        config.write_text(
            "\n".join(
                [
                    f"Port {self.port}",
                    "ListenAddress 127.0.0.1",
                    f"HostKey {keys / 'host_key'}",
                    f"AuthorizedKeysFile {keys / 'authorized_keys'}",
                    "PermitRootLogin prohibit-password",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM no",
                    "StrictModes no",
                    f"PidFile {keys / 'sshd.pid'}",
                    "Subsystem sftp internal-sftp",
                    "LogLevel ERROR",
                    "MaxStartups 50",
                ]
            )
            + "\n"
        )
        os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege-separation directory
        self.sshd = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(config)], stdout=subprocess.DEVNULL, stderr=open(keys / "sshd.log", "wb")
        )
        self._wait_for_port()
        for mount in self.mounts:
            self._mount(mount, keys / "client_key")

    def _wait_for_port(self, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.sshd is not None and self.sshd.poll() is not None:
                log = (self.base / "keys" / "sshd.log").read_text(errors="replace")
                raise RuntimeError(f"sshd exited with {self.sshd.returncode}: {log.strip()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"sshd did not listen on 127.0.0.1:{self.port} within {timeout}s") from None
                time.sleep(0.1)

    def _mount(self, mount: Path, key: Path) -> None:
        options = ",".join(
            [
                f"IdentityFile={key}",
                "StrictHostKeyChecking=no",
                "UserKnownHostsFile=/dev/null",
                "BatchMode=yes",
                f"port={self.port}",
                "LogLevel=ERROR",
                "ServerAliveInterval=5",
                CACHE_OPTIONS,
            ]
        )
        r = subprocess.run(
            ["sshfs", "-o", options, f"root@127.0.0.1:{self.share}", str(mount)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if r.returncode or not os.path.ismount(mount):
            raise RuntimeError(f"sshfs mount of {mount} failed ({r.returncode}): {r.stderr.strip()}")
        self.mounted.append(mount)

    # teardown -----------------------------------------------------------------------------------
    def stop(self) -> None:
        for mount in reversed(self.mounted):
            for cmd in (
                ["fusermount3", "-u", str(mount)],
                ["fusermount", "-u", str(mount)],
                ["umount", "-l", str(mount)],
            ):
                if shutil.which(cmd[0]) and subprocess.run(cmd, capture_output=True).returncode == 0:
                    break
        self.mounted.clear()
        if self.sshd is not None and self.sshd.poll() is None:
            self.sshd.terminate()
            try:
                self.sshd.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.sshd.kill()
                self.sshd.wait()
        self.sshd = None

    # use ----------------------------------------------------------------------------------------
    def fresh(self) -> tuple[str, Path, Path]:
        """A new folder on the share: (its name, its path through node a, through node b)."""
        name = f"t-{uuid.uuid4().hex[:8]}"
        (self.mounts[0] / name).mkdir()
        return name, self.mounts[0] / name, self.mounts[1] / name
