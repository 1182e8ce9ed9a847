"""Data-Juicer's front door: executor registry, ``elastic_shard`` config, validation, hook, executor.

The Ray shard runner lives in ``ray_runner/``, imported only when a runner is
built; what this package changes inside Data-Juicer is in ``patches/data_juicer.py``.

This package is imported at interpreter start by ``data_juicer_elastic.pth``
(only :mod:`.hook` is), so it must stay free of imports; the public helpers
below load their modules on first use.

* :func:`recipe_keys` - media keys and index keys of a parsed config (for prepare)
* :func:`validate` - parse-time recipe checks (raises UserError)
* :func:`snapshot_of` - the deterministic recipe snapshot taken at parse time
* :func:`settings_from_cfg` - the ``elastic_shard`` block as a dataclass
"""

from __future__ import annotations

_LAZY = {
    "recipe_keys": ".validation",
    "RecipeKeys": ".validation",
    "validate": ".validation",
    "snapshot_of": ".recipe",
    "settings_from_cfg": ".schema",
    "ElasticShardSettings": ".schema",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> object:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(_LAZY[name], __name__), name)
