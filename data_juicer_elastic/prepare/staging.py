"""The staging folder: the job dir is built beside its target and appears by one rename, or not at all."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

from data_juicer_elastic.errors import UserError
from data_juicer_elastic.prepare.inputs import STAGING_MARK
from data_juicer_elastic.storage.files import fsync_dir
from data_juicer_elastic.storage.host import hostname


class Staging:
    """A folder beside the job dir that becomes it by one rename, or disappears."""

    def __init__(self, target: Path) -> None:
        self.target = target
        token = f"{hostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.path = target.parent / f".{target.name}{STAGING_MARK}{token}"
        self._published = False
        self._made_parents: list[Path] = []

    def __enter__(self) -> Staging:
        self._made_parents = _make_parents(self.target.parent)
        try:
            os.mkdir(self.path)
        except OSError as exc:
            self._remove_parents()
            raise UserError(
                f"{self.path}: cannot create the staging folder ({exc.strerror}); "
                f"check permissions on {self.target.parent}"
            ) from exc
        return self

    def publish(self) -> bool:
        """Rename into place; False when another prepare got there first."""
        try:
            os.rename(self.path, self.target)
        except OSError as exc:
            if os.path.isdir(self.target) and os.listdir(self.target):
                return False
            raise UserError(
                f"{self.target}: cannot create the job dir ({exc.strerror}); check the path and permissions"
            ) from exc
        self._published = True
        fsync_dir(self.target.parent)
        return True

    def discard(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)

    def __exit__(self, exc_type: object, *_: object) -> None:
        if self._published:
            return
        self.discard()
        if exc_type is not None:
            self._remove_parents()

    def _remove_parents(self) -> None:
        for made in reversed(self._made_parents):
            try:
                os.rmdir(made)
            except OSError:
                break


def _make_parents(parent: Path) -> list[Path]:
    """Create missing parent folders, returning those made (so a failure can remove them)."""
    missing = []
    p = parent
    while not p.exists():
        missing.append(p)
        p = p.parent
    made = []
    for p in reversed(missing):
        try:
            os.mkdir(p)
        except FileExistsError:
            continue
        except OSError as exc:
            raise UserError(f"{p}: cannot create the job dir's parent ({exc.strerror}); check the path") from exc
        made.append(p)
    return made
