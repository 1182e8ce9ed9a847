"""The staging folder: the prepared job is built inside the job dir and appears whole, or not at all.

The job dir may exist before prepare (the coordination's ``runs/`` lives in
it), so the staging folder is a hidden folder inside it. Publishing renames
its ``shards/`` into place (the step that decides between racing prepares),
then links its ``manifest.json``, the mark of a prepared job. A prepare killed
between the two leaves a staging folder with a manifest and no shards:
``complete_publication`` links that manifest for it.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

from data_juicer_elastic.errors import UserError
from data_juicer_elastic.prepare.inputs import STAGING_MARK
from data_juicer_elastic.storage.files import fsync_dir, publish_once
from data_juicer_elastic.storage.host import hostname


class Staging:
    """A folder inside the job dir whose shards and manifest are published into it, or that disappears."""

    def __init__(self, target: Path) -> None:
        self.target = target
        self.disk = target  # where a full disk is reported
        token = f"{hostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.path = target / f"{STAGING_MARK}{token}"
        self._published = False
        self._made_parents: list[Path] = []

    def __enter__(self) -> Staging:
        self._made_parents = _make_parents(self.target)
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
        """Rename the shards into place, then link the manifest; False when another prepare got there first."""
        fsync_dir(self.path)
        try:
            os.rename(self.path / "shards", self.target / "shards")
        except OSError as exc:
            if os.path.isdir(self.target / "shards"):
                return False
            raise UserError(
                f"{self.target}: cannot publish the shards ({exc.strerror}); check the path and permissions"
            ) from exc
        self._published = True
        fsync_dir(self.target)
        publish_once(self.target / "manifest.json", (self.path / "manifest.json").read_bytes())
        fsync_dir(self.target)
        self.discard()
        return True

    def discard(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)

    def give_way(self) -> None:
        """Another prepare published first: drop this one, completing the other's publication if it was cut."""
        self.discard()
        complete_publication(self.target)

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


def complete_publication(root: Path) -> bool:
    """Link the manifest of a prepare that published its shards but not yet its manifest; True if one is there."""
    if (root / "manifest.json").exists():
        return True
    if not (root / "shards").exists():
        return False
    for name in sorted(os.listdir(root)):
        staged = root / name
        if name.startswith(STAGING_MARK) and (staged / "manifest.json").exists() and not (staged / "shards").exists():
            publish_once(root / "manifest.json", (staged / "manifest.json").read_bytes())
            shutil.rmtree(staged, ignore_errors=True)
            return True
    return False


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
