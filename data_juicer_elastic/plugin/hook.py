"""The activation hook: a meta-path finder that patches Data-Juicer on import.

``data_juicer_elastic.pth`` imports this module at interpreter start and
calls :func:`install`. That must stay cheap (no Data-Juicer, no jsonargparse,
nothing beyond ``sys``): the finder only looks at three module names and
otherwise answers ``None`` at once. When one of them is imported, the real
loader runs first and the patch (in :mod:`data_juicer_elastic.patches.data_juicer`,
which may import Data-Juicer) is applied to the finished module before anyone uses it.
The patch is handed what it installs, :func:`front_door.door`; the patches
import nothing of the plugin (tests/test_layers.py).
"""

from __future__ import annotations

import os
import sys
from types import ModuleType  # tiny and usually loaded already; typing would cost ~2 ms

DISABLE_ENV = "DJ_ELASTIC_DISABLE"

# module name -> name of the function in patches/data_juicer.py that extends it
TARGETS: dict[str, str] = {
    "data_juicer.config.config": "patch_config",
    "data_juicer.core.executor.factory": "patch_factory",
    "data_juicer.tools.process_data": "patch_process_data",
}


def disabled() -> bool:
    return os.environ.get(DISABLE_ENV, "").strip().lower() not in ("", "0", "false", "no")


def apply_patch(module: ModuleType) -> None:
    """Extend ``module`` once (idempotent, so ``importlib.reload`` is safe)."""
    if getattr(module, "__dj_elastic_patched__", False):
        return
    from data_juicer_elastic.patches import data_juicer as patches
    from data_juicer_elastic.plugin.front_door import door

    # False when Data-Juicer's version is not one whose internals the patches know
    module.__dj_elastic_patched__ = bool(getattr(patches, TARGETS[module.__name__])(module, door()))


class _PatchingLoader:
    """Runs the real loader, then patches the module; everything else is delegated."""

    def __init__(self, loader: object) -> None:
        self._loader = loader

    def create_module(self, spec: object) -> ModuleType | None:
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create else None

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        apply_patch(module)

    def __getattr__(self, name: str) -> object:  # get_source, get_filename, is_package, ...
        return getattr(self._loader, name)


class DataJuicerFinder:
    """Meta-path finder that wraps the loaders of the modules in ``TARGETS``."""

    def __init__(self) -> None:
        self._busy: set[str] = set()

    def find_spec(self, name: str, path: object = None, target: object = None) -> object:
        if name not in TARGETS or name in self._busy:
            return None
        self._busy.add(name)
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._busy.discard(name)
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _PatchingLoader(spec.loader)
        return spec


def install() -> bool:
    """Put the finder first on ``sys.meta_path`` (once); patch targets already imported.

    Returns False when switched off by ``DJ_ELASTIC_DISABLE``.
    """
    if disabled():
        return False
    if not any(isinstance(f, DataJuicerFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, DataJuicerFinder())
    for name in TARGETS:
        module = sys.modules.get(name)
        if module is not None:
            apply_patch(module)
    return True
