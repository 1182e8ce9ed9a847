"""Repeated keys are found exactly, at every depth, whatever the numbers' spelling (issue 26, hole 1).

orjson keeps a repeated key's last value and drops the rest; Ray's JSON reader refuses the row. Prepare
used to compare a line's length with its row's re-serialisation, which a number's respelling can make
up exactly: ``{"x":1e6,"y":0,"y":9}`` re-serialises as ``{"x":1000000.0,"y":9}``, as long.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from data_juicer_elastic.jsonl import LineProblem, RowRules, process_lines

RULES = RowRules((), (), "/")
# Spellings orjson re-serialises longer, shorter or alike (1e6 -> 1000000.0, 1.50 -> 1.5, -0 -> 0)
NUMBERS = ["0", "-0", "7", "1e6", "1E6", "1.0", "1.50", "1e-3", "2.5e+2", "0.1", "-1.0e0", "123456789012", "1.0000"]


class Raw(str):
    """A number token written as spelt."""


def dump(value: Any, ascii_only: bool) -> str:
    """JSON text of ``value``; an object is a list of (key, value) pairs, so a key may repeat."""
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, tuple):  # an object
        return "{" + ",".join(f"{json.dumps(k, ensure_ascii=ascii_only)}:{dump(v, ascii_only)}" for k, v in value) + "}"
    if isinstance(value, list):
        return "[" + ",".join(dump(v, ascii_only) for v in value) + "]"
    return json.dumps(value, ensure_ascii=ascii_only)


keys = st.sampled_from(["x", "y", "z", "é", 'q"', "a\\b", "long_key_name"])
leaves = st.one_of(st.none(), st.booleans(), st.text(max_size=4), st.sampled_from(NUMBERS).map(Raw))


def objects(children: st.SearchStrategy) -> st.SearchStrategy:
    pairs = st.lists(st.tuples(keys, children), max_size=4, unique_by=lambda kv: kv[0])
    return pairs.map(tuple)


values = st.recursive(
    leaves, lambda children: st.one_of(st.lists(children, max_size=3), objects(children)), max_leaves=12
)
rows = objects(values)


def objects_in(value: Any) -> list[tuple]:
    """Every object in ``value``, outermost first."""
    found = [value] if isinstance(value, tuple) else []
    children = [v for _, v in value] if isinstance(value, tuple) else value if isinstance(value, list) else []
    return found + [o for c in children for o in objects_in(c)]


def with_repeat(row: tuple, which: int, key: str, value: Any, at: int) -> tuple:
    """``row`` with ``key`` added twice (or once more) to its ``which``-th object, the copy at position ``at``."""
    target = objects_in(row)[which % len(objects_in(row))]

    def rebuild(v: Any) -> Any:
        if v is target:
            pairs = list(v) if any(k == key for k, _ in v) else [*v, (key, Raw("0"))]
            pairs.insert(at % (len(pairs) + 1), (key, value))
            return tuple(pairs)
        if isinstance(v, tuple):
            return tuple((k, rebuild(x)) for k, x in v)
        if isinstance(v, list):
            return [rebuild(x) for x in v]
        return v

    return rebuild(row)


def check(line: str) -> None:
    process_lines([line.encode() + b"\n"], RULES, 0)


@settings(max_examples=300, deadline=None)
@given(rows, st.integers(0, 50), keys, values, st.integers(0, 5), st.booleans())
@example((("x", Raw("1e6")), ("y", Raw("0"))), 0, "y", Raw("9"), 5, False)  # as long as its re-serialisation
def test_a_repeated_key_at_any_depth_is_refused(row, which, key, value, at, ascii_only):
    check(dump(row, ascii_only))  # without the repeat it passes
    line = dump(with_repeat(row, which, key, value, at), ascii_only)
    with pytest.raises(LineProblem, match="appears twice in one object"):
        check(line)


def test_the_respelling_that_hid_a_repeat_is_as_long():
    import orjson

    line = b'{"x":1e6,"y":0,"y":9}'
    assert len(orjson.dumps(orjson.loads(line))) == len(line)  # what the length check saw
    with pytest.raises(LineProblem, match="'y' appears twice"):
        process_lines([line + b"\n"], RULES, 0)
