"""The whole input's columns and their JSON types, gathered in prepare's one pass (no Arrow here).

Ray infers an Arrow schema per block, and a shard is read as blocks of its
own, so without a recorded schema a row's values depended on its neighbours
(DESIGN.md invariant 13): a column absent from one shard, dates read as
timestamps where every string in a shard parses as one, ints kept in an
all-int shard. Prepare already parses every row; each block of parsed rows is
folded into a :class:`Fields` tree by C-level chains (``zip`` of keys and
``map(type, values)`` into one ``dict.fromkeys``), about 0.1 µs per key and
value; nested objects and lists are folded the same way, a level at a time.

The recorded form (``Manifest.columns``) is plain JSON: a type is ``"null"``,
``"bool"``, ``"int"``, ``"float"``, ``"string"``, ``["list", type]`` or
``["object", [[name, type], ...]]``; fields keep their first-seen order, as
Arrow orders them. Kinds Arrow cannot hold in one column (a number and a
string, an object and a string, a boolean and a number, also inside lists)
are a :class:`Conflict` (``first_conflict``); a whole-input Arrow read fails on them too.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import chain, compress, repeat
from operator import is_
from typing import Any

_NAMES = {type(None): "null", bool: "bool", int: "int", float: "float", str: "string", list: "list", dict: "object"}
_NUMBER = ("int", "float")
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_NO_FIELDS: dict[str, Any] = {}  # stands for an absent object: adds no field


class _Absent:
    """The type of the stand-in for an absent key."""


_ABSENT = _Absent()
Summary = dict[str, Any]  # a node of a shard's summary: {"t": [kinds], "f": [[name, node], ...], "i": node}
ColumnType = Any  # the recorded form: str | ["list", type] | ["object", [[name, type], ...]]


class _Slot:
    """What one position (a column, an object's field, a list's items) held, in first-seen order."""

    __slots__ = ("fields", "items", "types")

    def __init__(self) -> None:
        self.types: dict[type, None] = {}
        self.fields: Fields | None = None
        self.items: _Slot | None = None

    def add_values(self, values: list[Any]) -> None:
        self.types.update(dict.fromkeys(map(type, values)))
        if int in self.types:
            self.check_ints(_of_type(values, int))
        self.add_nested(values)

    def check_ints(self, ints: list[int]) -> None:
        """Integers beyond 64 bits (orjson keeps up to 2**64 - 1 as int) make Arrow read a float column."""
        if ints and (min(ints) < _INT64_MIN or max(ints) > _INT64_MAX):
            self.types[float] = None

    def add_column(self, rows: list[dict[str, Any]], key: str) -> int:
        """Fold column ``key`` of a block of objects; how many of them hold it."""
        types = set(map(type, map(dict.get, rows, repeat(key), repeat(_ABSENT))))
        held = len(rows)
        if _Absent in types:
            types.discard(_Absent)
            held -= sum(map(is_, map(dict.get, rows, repeat(key), repeat(_ABSENT)), repeat(_ABSENT)))
        self.types.update(dict.fromkeys(types))
        if int in types:
            values = map(dict.get, rows, repeat(key), repeat(0))
            self.check_ints(list(values) if types == {int} else _of_type(list(values), int))
        if types == {dict}:  # objects only (an absent one reads as empty): no filtering pass
            self.add_objects(list(map(dict.get, rows, repeat(key), repeat(_NO_FIELDS))))
        elif dict in types or list in types:
            self.add_nested(list(map(dict.get, rows, repeat(key))))
        return held

    def add_objects(self, objects: list[dict[str, Any]]) -> None:
        if self.fields is None:
            self.fields = Fields()
        self.fields.add_rows(objects)

    def add_nested(self, values: list[Any]) -> None:
        """Fold the objects and lists among ``values`` (their types are already counted)."""
        if dict in self.types:
            self.add_objects(_of_type(values, dict))
        if list in self.types:
            if self.items is None:
                self.items = _Slot()
            self.items.add_values(list(chain.from_iterable(_of_type(values, list))))

    def summary(self) -> Summary:
        node: Summary = {"t": [_NAMES[t] for t in self.types]}
        if self.fields is not None:
            node["f"] = self.fields.summary()
        if self.items is not None:
            node["i"] = self.items.summary()
        return node


def _of_type(values: list[Any], kind: type) -> list[Any]:
    return list(compress(values, map(is_, map(type, values), repeat(kind))))


class Fields:
    """The keys of a set of objects (the rows, or one column's objects) and what each held."""

    __slots__ = ("slots",)

    def __init__(self) -> None:
        self.slots: dict[str, _Slot] = {}

    def add_rows(self, rows: list[dict[str, Any]]) -> None:
        """Fold a block of objects, a known column at a time; keys not seen before are found by count.

        Per known column one C-level chain (``dict.get`` -> ``type`` -> set): cheaper than
        hashing (key, type) pairs, about half. The keys the columns found are counted
        against ``sum(map(len, rows))``; only a block with a new key is walked for it. Sparse
        objects (many more known keys than a row holds) are folded pair by pair instead.
        """
        total = sum(map(len, rows))
        slots = self.slots
        if len(slots) > 2 * total // max(len(rows), 1) + 8:
            self._add_pairs(rows)
            return
        found = sum([slot.add_column(rows, key) for key, slot in slots.items()])
        if found != total:
            for key in dict.fromkeys(chain.from_iterable(rows)):  # first-seen order, as Arrow orders fields
                if key not in slots:
                    slots[key] = _Slot()
                    slots[key].add_column(rows, key)

    def _add_pairs(self, rows: list[dict[str, Any]]) -> None:
        kinds = map(type, chain.from_iterable(map(dict.values, rows)))
        pairs = set(zip(chain.from_iterable(rows), kinds, strict=True))
        slots = self.slots
        if not slots.keys() >= {key for key, _ in pairs}:
            for key in dict.fromkeys(chain.from_iterable(rows)):
                if key not in slots:
                    slots[key] = _Slot()
        nested: dict[str, None] = {}
        for key, kind in pairs:
            slots[key].types[kind] = None
            if kind is int:
                slots[key].check_ints(_of_type(list(map(dict.get, rows, repeat(key))), int))
            if kind is dict or kind is list:
                nested[key] = None
        for key in nested:
            slots[key].add_nested(list(map(dict.get, rows, repeat(key))))

    def summary(self) -> list[list[Any]]:
        """Picklable, JSON-able form (it crosses the prepare pool): ``[[name, node], ...]``."""
        return [[key, slot.summary()] for key, slot in self.slots.items()]


# --------------------------------------------------------------------------- merge and resolve (the parent)
def merge(a: list[list[Any]], b: list[list[Any]]) -> list[list[Any]]:
    """Two summaries' fields, ``a``'s first (shards are merged in input order)."""
    out = {key: node for key, node in a}
    for key, node in b:
        out[key] = _merge_node(out[key], node) if key in out else node
    return [[k, v] for k, v in out.items()]


def _merge_node(a: Summary, b: Summary) -> Summary:
    node: Summary = {"t": list(dict.fromkeys([*a["t"], *b["t"]]))}
    if "f" in a or "f" in b:
        node["f"] = merge(a.get("f", []), b.get("f", []))
    if "i" in a or "i" in b:
        node["i"] = _merge_node(a["i"], b["i"]) if "i" in a and "i" in b else a.get("i") or b["i"]
    return node


@dataclass(frozen=True)
class Conflict:
    """Kinds Arrow cannot hold in one column, at ``path`` (e.g. ``("meta", "date")``; ``"[]"`` is a list's items)."""

    path: tuple[str, ...]
    kinds: tuple[str, ...]  # as JSON names them: number, string, boolean, object, array


def first_conflict(fields: list[list[Any]], path: tuple[str, ...] = ()) -> Conflict | None:
    """The first position of a merged summary that holds two kinds Arrow cannot unify (None: there is none)."""
    for key, node in fields:
        found = _node_conflict(node, (*path, key))
        if found is not None:
            return found
    return None


def _node_conflict(node: Summary, path: tuple[str, ...]) -> Conflict | None:
    kinds = dict.fromkeys(json_kind(t) for t in node["t"] if t != "null")
    if len(kinds) > 1:
        return Conflict(path, tuple(kinds))
    if "i" in node and (found := _node_conflict(node["i"], (*path, "[]"))) is not None:
        return found
    return first_conflict(node.get("f", []), path)


def resolve(fields: list[list[Any]]) -> list[list[Any]]:
    """The recorded columns of a merged summary that has no Conflict."""
    return [[key, _resolve_node(node)] for key, node in fields]


def _resolve_node(node: Summary) -> ColumnType:
    kinds = [t for t in node["t"] if t != "null"]
    if not kinds:
        return "null"
    if kinds[0] in _NUMBER:
        return "float" if "float" in kinds else "int"
    if kinds[0] == "list":
        return ["list", _resolve_node(node["i"])]
    if kinds[0] == "object":
        return ["object", resolve(node.get("f", []))]
    return kinds[0]


def json_kind(name: str) -> str:
    """What a person calls a kind: Arrow refuses mixing these, and int with float is one (number)."""
    return {"int": "number", "float": "number", "bool": "boolean", "list": "array"}.get(name, name)


def kinds_at(value: Any, path: tuple[str, ...]) -> Iterator[str]:
    """The JSON kinds found at ``path`` inside one row (a list's items each count), nulls left out."""
    if not path:
        if value is not None:
            yield json_kind(_NAMES[type(value)])
        return
    step, rest = path[0], path[1:]
    if step == "[]" and type(value) is list:
        for item in value:
            yield from kinds_at(item, rest)
    elif type(value) is dict and step in value:
        yield from kinds_at(value[step], rest)


def describe(path: tuple[str, ...]) -> str:
    """A path as a person reads it: ``key 'meta' -> 'date'``, ``the items of the list at key 'x'``."""
    keys = [repr(step) for step in path if step != "[]"]
    where = "key " + " -> ".join(keys) if keys else "the row"
    return f"the items of the list at {where}" if path and path[-1] == "[]" else where
