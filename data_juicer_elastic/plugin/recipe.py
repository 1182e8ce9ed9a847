"""The recipe snapshot: what every shard runs, as deterministic YAML.

``dj-process`` may be started with command-line overrides, and every node
must agree on the recipe, so the snapshot is built from the parsed config
*before* Data-Juicer derives node-local values (job id, work dir, np capped
at this node's CPU count, per-op work dirs): every top-level key that differs
from the parser's default, and the process list with command-line op
overrides (``--text_length_filter.min_len 10``) merged in. Paths are made
absolute. ``executor_type`` becomes ``ray`` and the ``elastic_shard`` block
is dropped, so the snapshot is exactly the recipe a shard runs (and
``dj-process --config recipe.yaml`` over the whole input is the reference
run the merged output is compared with).
"""

from __future__ import annotations

import copy
import os
import weakref
from typing import Any

import yaml

from data_juicer_elastic.plugin.schema import KEY
from data_juicer_elastic.storage.urls import is_s3

INNER_EXECUTOR = "ray"
_ABSOLUTE_KEYS = ("dataset_path", "export_path", "work_dir")
# the elastic_shard block changes no output row (overwrite_output, speculation, leases): it stays out of the
# snapshot, whose sha256 names the generation, so tuning it reruns no shard (tests/test_generation_key.py)
_DROPPED_KEYS = ("config", KEY, "executor_type")

# id(cfg) -> (weak reference to cfg, snapshot text); see remember()/snapshot_of()
_SNAPSHOTS: dict[int, tuple[weakref.ref, str]] = {}


def plain(value: Any) -> Any:
    """Namespaces, tuples, paths -> dicts, lists, strings (what yaml.safe_dump accepts)."""
    if hasattr(value, "as_dict") and callable(value.as_dict):  # jsonargparse Namespace
        value = value.as_dict()
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    for base in (bool, int, float, str):  # also unwraps subclasses such as PositiveInt
        if isinstance(value, base):
            return base(value)
    return None if value is None else str(value)


def _values(ns: Any) -> dict[str, Any]:
    if ns is None:
        return {}
    return dict(ns) if isinstance(ns, dict) else dict(vars(ns))


def effective_process(cfg: Any, defaults: Any) -> list[dict[str, Any]]:
    """The recipe's process list with command-line op overrides merged in.

    ``defaults`` is the parser's defaults namespace. An op's namespace in
    ``cfg`` holds its defaults plus what the command line set; whatever
    differs from the defaults was set on the command line and applies to
    every occurrence of that op, as Data-Juicer's own merge does.
    """
    overrides: dict[str, dict[str, Any]] = {}
    process = copy.deepcopy(cfg.get("process") or [])
    result = []
    for item in process:
        if not isinstance(item, dict) or len(item) != 1:
            result.append(item)
            continue
        name, args = next(iter(item.items()))
        if name not in overrides:
            current, default = _values(cfg.get(name)), _values(defaults.get(name))
            overrides[name] = {k: v for k, v in current.items() if k not in default or default[k] != v}
        merged = {**_values(args), **overrides[name]}
        result.append({name: merged or None})
    return result


def effective_recipe(cfg: Any, defaults: Any, op_names: set[str] | frozenset[str]) -> dict[str, Any]:
    """The snapshot as a dict: non-default top-level keys, merged process, absolute paths."""
    recipe: dict[str, Any] = {}
    for key, value in _values(cfg).items():
        if key in _DROPPED_KEYS or key in op_names or key.startswith("_") or key == "process":
            continue
        if defaults.get(key) == value:
            continue
        recipe[key] = value
    for key in _ABSOLUTE_KEYS:
        if isinstance(recipe.get(key), str) and recipe[key] and not is_s3(recipe[key]):
            recipe[key] = os.path.abspath(recipe[key])
    if isinstance(recipe.get("custom_operator_paths"), (list, tuple)):
        recipe["custom_operator_paths"] = [os.path.abspath(str(p)) for p in recipe["custom_operator_paths"]]
    recipe["executor_type"] = INNER_EXECUTOR
    recipe["process"] = effective_process(cfg, defaults)
    return plain(recipe)


def to_yaml(recipe: dict[str, Any]) -> str:
    """Deterministic YAML: sorted keys, block style, unicode kept."""
    return yaml.safe_dump(recipe, sort_keys=True, default_flow_style=False, allow_unicode=True, width=1 << 16)


def remember(cfg: Any, text: str) -> None:
    """Attach the snapshot to this parsed config object (without adding a config key)."""
    for key in [k for k, (ref, _) in _SNAPSHOTS.items() if ref() is None]:
        del _SNAPSHOTS[key]
    _SNAPSHOTS[id(cfg)] = (weakref.ref(cfg), text)


def snapshot_of(cfg: Any) -> str | None:
    """The snapshot taken when ``cfg`` was parsed, or None if it was not parsed by dj-process/init_configs."""
    entry = _SNAPSHOTS.get(id(cfg))
    if entry is None or entry[0]() is not cfg:
        return None
    return entry[1]
