"""Every shard is read with the whole input's schema (DESIGN.md invariant 13).

A table of per-shard schema traps is laid out so that each of the 4 shards
holds one group of rows (checked), then run once as elastic_shard and once as
one whole-input ``executor_type: ray`` run of the same recipe (tests/reference.py):
values AND types must be equal (``1 == 1.0 == True`` does not pass here),
except where the input's own value wins (a date string Arrow would read as a
timestamp). Kinds Arrow cannot hold in one column are refused at prepare with
``file:line``; a whole-input ray run fails on them too (measured here).
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.json as pj
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from data_juicer_elastic.errors import UserError
from data_juicer_elastic.job.manifest import Policy
from data_juicer_elastic.prepare.driver import PrepareRequest, prepare
from data_juicer_elastic.ray_runner.arrow_schema import arrow_schema, shard_facts

from .prep_helpers import shard_files, with_inline_shards
from .reference import dj_process, meanwhile, read_rows, run_reference

G = 6  # rows per group; group g lands in shard g
GROUPS = 5
LINE = 400  # every line padded to this many bytes, so the byte-balanced split cuts between groups
DATE = "2023-04-27"


def trap_row(i: int) -> dict[str, Any]:
    """Row ``i``: each key is a trap that a per-shard schema falls into."""
    g = i // G
    row: dict[str, Any] = {"id": i, "text": f"row {i}:  some   text here.\nsecond line" if g < 4 else "short"}
    if g < 4:
        row["output"] = f"an answer\nin two lines {i}"  # absent from shard 4 (an op's text_key)
    row["date"] = "soon" if i == 2 * G else DATE  # strings in the whole input; all dates in shards 0, 1, 3
    row["date_all"] = DATE  # dates in the whole input too: Arrow would read a timestamp
    row["num"] = i + 0.5 if g == 1 else i  # ints in shards 0, 2, 3; float in the whole input
    row["meta"] = [
        {"src": "a", "n": i},
        {"date": DATE, "n": 1.5},
        None if i % 2 else {"src": "c"},
        None,  # all null in shard 3
        {"src": "e"},
    ][g]
    if g < 3:
        row["tags"] = [[], ["x", "y"], None][g]  # absent from shard 3; [] alone in shard 0
    row["s"] = ["", None, "ünï 字 😀 \u00e9", "plain"][i % 4]
    if i % 4 == 3:
        del row["s"]
    if g != 1:
        row["flag"] = i % 2 == 0
    row["maybe"] = "x" if g == 3 else None  # null-only in shards 0-2
    row["objs"] = [[{"a": 1}], [{"b": "z"}], [], [{"a": 2, "b": None}], []][g]
    pad = LINE - len(json.dumps({**row, "pad": ""}, ensure_ascii=False).encode()) - 1
    row["pad"] = "p" * pad
    return row


def write_traps(path: Path) -> list[dict]:
    rows = [trap_row(i) for i in range(GROUPS * G)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(json.dumps(r, ensure_ascii=False).encode() + b"\n" for r in rows))
    assert all(len(line) == LINE for line in path.read_bytes().splitlines(keepends=True))
    return rows


def typed(value: Any) -> Any:
    """A value with its JSON type spelt out, so that 1, 1.0 and True compare unequal."""
    if isinstance(value, dict):
        return {k: typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [typed(v) for v in value]
    return (type(value).__name__, value)


def request(data: Path, job: Path, shards: int = 4) -> PrepareRequest:
    return PrepareRequest(str(data), str(job), b"process: []\n", Policy(num_shards=shards))


def groups_are_shards(job: Path) -> None:
    """The layout the traps rely on: group g of rows is shard g."""
    shards = shard_files(job)
    assert [[json.loads(x)["id"] for x in p.read_bytes().splitlines()] for p in shards] == [
        list(range(g * G, (g + 1) * G)) for g in range(GROUPS)
    ]


# --------------------------------------------------------------------------- without Ray
EXPECTED_COLUMNS = [
    ["id", "int"],
    ["text", "string"],
    ["output", "string"],
    ["date", "string"],
    ["date_all", "string"],
    ["num", "float"],
    ["meta", ["object", [["src", "string"], ["n", "float"], ["date", "string"]]]],
    ["tags", ["list", "string"]],
    ["s", "string"],
    ["flag", "bool"],
    ["maybe", "string"],
    ["objs", ["list", ["object", [["a", "int"], ["b", "string"]]]]],
    ["pad", "string"],
]


def test_prepare_records_the_whole_inputs_columns_and_each_shard_reads_like_the_whole(tmp_path):
    data = tmp_path / "traps.jsonl"
    write_traps(data)
    result = prepare(request(data, tmp_path / "job", GROUPS), log=lambda *_: None)
    assert result.manifest.columns == EXPECTED_COLUMNS
    schema = arrow_schema(result.manifest.columns)
    whole = pj.read_json(str(data))  # Arrow's own inference over the whole input
    assert schema.names == whole.schema.names
    for name in schema.names:  # the same types, but strings never become timestamps
        assert schema.field(name).type == no_timestamps(whole.schema.field(name).type), name
    groups_are_shards(tmp_path / "job")
    shards = shard_files(tmp_path / "job")
    rows = []
    for path in shards:
        facts = shard_facts(str(path))
        assert facts is not None and facts.longest_line == LINE
        alone = pj.read_json(str(path))
        table = pj.read_json(str(path), parse_options=facts.parse_options)
        assert table.schema == schema
        assert alone.schema != schema  # the trap: each shard alone infers another schema
        rows += table.to_pylist()
    whole_alike = pj.read_json(str(data), parse_options=pj.ParseOptions(explicit_schema=schema)).to_pylist()
    assert typed(rows) == typed(whole_alike)  # a row reads the same whatever shard it fell in
    given = [json.loads(line) for line in data.read_bytes().splitlines()]
    for row, want in zip(rows, given, strict=True):  # and as the input wrote it: dates stay strings
        assert row["date"] == want["date"] and row["date_all"] == DATE
        assert (row["meta"] or {}).get("date") == (want["meta"] or {}).get("date")


def no_timestamps(t: pa.DataType) -> pa.DataType:
    """Arrow's inferred type with every timestamp a string (what prepare records)."""
    if pa.types.is_timestamp(t):
        return pa.string()
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, no_timestamps(f.type)) for f in t])
    if pa.types.is_list(t):
        return pa.list_(no_timestamps(t.value_type))
    return t


@pytest.mark.parametrize(
    ("rows", "bad_line", "what"),
    [
        ([{"x": 1}, {"x": None}, {"x": "a"}], 3, "key 'x' holds a string here but a number at data.jsonl:1"),
        ([{"x": [1, None]}, {"x": [2, "b"]}], 2, "the items of the list at key 'x' holds a string here but a number"),
        ([{"m": {"a": {}}}, {"m": {"a": "s"}}], 2, "key 'm' -> 'a' holds a string here but an object"),
        ([{"x": True}, {"y": 1}, {"x": 0}], 3, "key 'x' holds a number here but a boolean at data.jsonl:1"),
        ([{"x": [[1]]}, {"x": [{"a": 1}]}], 2, "the items of the list at key 'x' holds an object here but an array"),
    ],
)
def test_kinds_arrow_cannot_hold_in_one_column_are_refused_at_prepare(tmp_path, rows, bad_line, what):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(UserError) as exc:
        prepare(request(data, tmp_path / "job", 2), log=lambda *_: None)
    message = str(exc.value)
    assert message.startswith(f"{data}:{bad_line}: ") and what.replace("data.jsonl", str(data)) in message, message
    assert "executor_type: ray" in message and not (tmp_path / "job" / "manifest.json").exists()


def test_a_job_dir_prepared_before_schema_5_reads_as_before_and_says_so(tmp_path):
    """No recorded columns or longest lines: Arrow infers each shard's schema; one log line per job."""
    from data_juicer_elastic.job.manifest import manifest_digest
    from data_juicer_elastic.ray_runner import arrow_schema as module
    from data_juicer_elastic.ray_runner.shard_errors import block_size_for

    data = tmp_path / "traps.jsonl"
    write_traps(data)
    prepare(request(data, tmp_path / "job", GROUPS), log=lambda *_: None)
    manifest = tmp_path / "job" / "manifest.json"
    raw = with_inline_shards(tmp_path / "job", json.loads(manifest.read_text()))
    raw.pop("columns")
    for shard in raw["shards"]:
        shard.pop("longest_line")
    raw["schema_version"] = 4
    raw["digest"] = manifest_digest(raw)
    manifest.write_text(json.dumps(raw))
    module._cache.clear()
    said: list[str] = []
    shard = shard_files(tmp_path / "job")[0]
    for _ in range(2):
        facts = shard_facts(str(shard), said.append)
        assert facts is not None and facts.parse_options is None and facts.longest_line is None
    assert len(said) == 1 and "recorded no input schema" in said[0]
    assert block_size_for(str(shard)) is None  # scanned, as before: no line near the reader's block


def test_a_preflight_refusal_names_its_cause_on_one_line():
    from data_juicer.core.preflight import PipelineRuntimeError

    from data_juicer_elastic.ray_runner.shard_errors import classify

    cause = "text_key 'output' not found in dataset columns"
    err = classify(PipelineRuntimeError([cause]), "/nowhere/shards/part-00000-of-00001.jsonl", "/nowhere")
    assert "\n" not in str(err) and cause in str(err), str(err)
    assert str(err).startswith("the recipe is refused by Data-Juicer: Pipeline runtime preflight errors detected: ")


# --------------------------------------------------------------------------- real runs
def elastic_recipe(path: Path, recipe: dict, data: Path, job: Path, shards: int = 4) -> Path:
    recipe = {
        **recipe,
        "dataset_path": str(data),
        "export_path": str(path.parent / "merged.jsonl"),
        "executor_type": "elastic_shard",
        "elastic_shard": {
            "job_dir": str(job),
            "num_shards": shards,
            "max_retries": 0,
            "heartbeat_secs": 2.0,
            "poll_interval_secs": 0.5,
            "wait_timeout_secs": 120.0,
        },
    }
    path.write_text(yaml.safe_dump(recipe, sort_keys=False, allow_unicode=True))
    return path


def run_both(tmp: Path, recipe: dict, data: Path, shards: int = 4) -> tuple[list[dict], list[dict]]:
    config = elastic_recipe(tmp / "recipe.yaml", recipe, data, tmp / "job", shards)
    with meanwhile(lambda: run_reference(config, tmp / "ref", cwd=tmp)) as reference:
        out = dj_process("--config", str(config), cwd=tmp)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    return read_rows(tmp / "merged.jsonl"), reference.result()


@pytest.mark.slow
def test_schema_traps_match_one_whole_input_ray_run_value_and_type(tmp_path):
    data = tmp_path / "traps.jsonl"
    rows = write_traps(data)
    recipe = {
        "project_name": "traps",
        "np": 2,
        "process": [
            {"whitespace_normalization_mapper": None},
            # Shard 4 has no "output" column: Data-Juicer's runtime preflight refused it (text_key not found), the
            # job failed where one ray run passed. Its rows (text "short") are filtered out before the op that
            # reads "output" (which raises on a null text) in either run.
            {"text_length_filter": {"min_len": 8}},
            {"average_line_length_filter": {"text_key": "output", "min_len": 0, "max_len": 10000}},
        ],
    }
    merged, reference = run_both(tmp_path, recipe, data, GROUPS)
    groups_are_shards(tmp_path / "job")
    kept = [r["id"] for r in rows if "output" in r]
    assert [r["id"] for r in merged] == [r["id"] for r in reference] == kept
    rows = [r for r in rows if "output" in r]
    columns = json.loads((tmp_path / "job" / "manifest.json").read_text())["columns"]
    untouched = [[k, t] for k, t in columns if k != "text"]  # the ops rewrite text and add __dj__stats__
    for got, ref, row in zip(merged, reference, rows, strict=True):
        # What one whole-input read gives, as the input spelt it: absent keys null, ints of a float column floats,
        # objects with every field, dates as strings.
        assert typed({k: got[k] for k, _ in untouched}) == typed(conform(row, ["object", untouched])), got["id"]
        assert typed(got["text"]) == typed(ref["text"]) and typed(got["__dj__stats__"]) == typed(ref["__dj__stats__"])
        assert not [d for d in strict_differences(got, ref) if not documented(*d)], got["id"]
    assert any(documented(*d) for got, ref in zip(merged, reference, strict=True) for d in strict_differences(got, ref))


def conform(value: Any, recorded: Any) -> Any:
    """``value`` read with the recorded type (prepare.schema's form): what the guarantee says comes out."""
    if value is None:
        return None
    if recorded == "float":
        return float(value)
    if isinstance(recorded, list) and recorded[0] == "list":
        return [conform(v, recorded[1]) for v in value]
    if isinstance(recorded, list):
        return {k: conform(value.get(k), t) for k, t in recorded[1]}
    return value


def strict_differences(a: Any, b: Any) -> list[tuple[Any, Any]]:
    """Leaf pairs that differ in value or JSON type (keys must match too)."""
    if isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys():
        return [d for k in a for d in strict_differences(a[k], b[k])]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for x, y in zip(a, b, strict=True) for d in strict_differences(x, y)]
    return [] if typed(a) == typed(b) else [(a, b)]


def documented(ours: Any, ray: Any) -> bool:
    """The differences README names: a date string Ray reads as a timestamp (written as epoch ms), and an int
    that Ray's JSON writer (pandas) writes as a float when a null shares its block (blocks differ between runs)."""
    date = ours == DATE and type(ray) is int and ray == 1682553600000
    return date or (type(ours) is int and type(ray) is float and ours == ray)


@pytest.mark.slow
def test_data_juicers_shipped_sample_and_recipe_match_one_ray_run(tmp_path):
    import data_juicer

    hpo = Path(data_juicer.__file__).parent / "tools" / "hpo"
    data = tmp_path / "demo.jsonl"
    data.write_bytes((hpo / "demo-redpajama-c4-refined.jsonl").read_bytes())
    recipe = yaml.safe_load((hpo / "configs" / "process.yaml").read_text())
    recipe["np"] = 2
    merged, reference = run_both(tmp_path, recipe, data)
    assert len(merged) > 0 and typed(merged) == typed(reference)


@pytest.mark.slow
def test_one_whole_input_ray_run_fails_where_prepare_refuses(tmp_path):
    """Measured, not assumed: the kinds prepare refuses also fail a plain ray run of the same input."""
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"text": "a", "x": [1, "b"]}) + "\n" + json.dumps({"text": "b", "x": [2]}) + "\n")
    config = elastic_recipe(
        tmp_path / "recipe.yaml", {"process": [{"whitespace_normalization_mapper": None}]}, data, tmp_path / "job", 1
    )
    with pytest.raises(AssertionError, match=r"reference run .* failed"):
        run_reference(config, tmp_path / "ref", cwd=tmp_path)
    out = dj_process("--config", str(config), cwd=tmp_path)
    assert out.returncode == 2 and f"{data}:1: the items of the list at key 'x'" in out.stdout + out.stderr


def test_arrow_reads_pyarrow_json_as_the_runner_passes_it(tmp_path):
    """The recorded schema goes through Data-Juicer's stream reader's keyword (parse_options) unchanged."""
    schema = arrow_schema([["d", "string"], ["m", ["object", [["a", "int"]]]], ["e", ["list", "null"]]])
    table = pj.read_json(io.BytesIO(b'{"d":"2023-04-27"}\n'), parse_options=pj.ParseOptions(explicit_schema=schema))
    assert table.to_pylist() == [{"d": "2023-04-27", "m": None, "e": None}]


# --------------------------------------------------------------------------- the fold against a plain walk
json_values = st.recursive(
    st.one_of(
        st.none(), st.booleans(), st.integers(-5, 5), st.floats(-2, 2), st.sampled_from(["", "s", DATE, 1 << 63])
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=3), st.dictionaries(st.sampled_from("abcd"), children, max_size=3)
    ),
    max_leaves=8,
)
json_rows = st.lists(st.dictionaries(st.sampled_from("abcdefghijkl"), json_values, max_size=5), min_size=1, max_size=30)


def walk(node: dict, value: Any) -> None:
    """A plain recursive walk: each position's kinds, fields in first-seen order, list items together."""
    kind = {type(None): "null", bool: "bool", int: "int", float: "float", str: "string"}.get(type(value))
    if kind == "int" and not -(1 << 63) <= value < 1 << 63:
        kind = "wide int"
    kind = kind or ("list" if isinstance(value, list) else "object")
    node.setdefault("t", {})[kind] = None
    if kind == "object":
        for k, v in value.items():
            walk(node.setdefault("f", {}).setdefault(k, {}), v)
    if kind == "list":
        items = node.setdefault("i", {})
        for v in value:
            walk(items, v)


def plain(node: dict) -> Any:
    """The recorded type of a walked position; ValueError where Arrow could not hold it."""
    kinds = {k for k in node.get("t", {}) if k != "null"}
    kinds = {"float" if k == "wide int" else k for k in kinds}  # Arrow reads ints beyond 64 bits as floats
    if kinds <= {"int", "float"}:
        return "float" if "float" in kinds else "int" if kinds else "null"
    if len(kinds) > 1:
        raise ValueError(kinds)
    if kinds == {"list"}:
        return ["list", plain(node.get("i", {}))]
    if kinds == {"object"}:
        return ["object", [[k, plain(v)] for k, v in node.get("f", {}).items()]]
    return kinds.pop()


@settings(max_examples=300, deadline=None)
@given(json_rows, st.lists(st.integers(1, 30), max_size=6), st.integers(1, 4))
def test_the_block_fold_equals_a_plain_walk_of_every_row(rows, cuts, shards):
    from data_juicer_elastic.prepare.schema import Fields, first_conflict, merge, resolve

    whole: dict = {}
    walk(whole, {"_": None})  # a root object
    for row in rows:
        walk(whole["f"]["_"], row)
    try:
        want = plain(whole["f"]["_"])[1]
    except ValueError:
        want = None
    merged: list = []
    bounds = sorted({0, len(rows), *(c % len(rows) for c in cuts)})
    per_shard = max(1, len(bounds) // shards)
    for s in range(0, len(bounds) - 1, per_shard):  # shards of blocks, blocks of rows
        fields = Fields()
        for a, b in zip(bounds[s : s + per_shard], bounds[s + 1 : s + per_shard + 1], strict=False):
            fields.add_rows(rows[a:b])
        merged = merge(merged, fields.summary())
    got = None if first_conflict(merged) else resolve(merged)
    assert got == want


# --------------------------------------------------------------------------- facts read, not recomputed
def test_a_follower_takes_the_published_auto_shard_count_without_walking_the_input(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from data_juicer_elastic.plugin import executor

    data = tmp_path / "traps.jsonl"
    write_traps(data)
    settings = SimpleNamespace(
        num_shards="auto", nodes=None, job_dir=str(tmp_path / "job"), lock_timeout_secs=300, heartbeat_secs=30,
        max_retries=2, poll_interval_secs=5, ray_address="local",
    )  # fmt: skip
    assert executor.policy_from(settings, str(data)).num_shards == 1  # nothing prepared: the input is sized
    prepare(request(data, tmp_path / "job", 3), log=lambda *_: None)

    def walked(*_: Any, **__: Any) -> None:
        raise AssertionError("the input was walked again")

    monkeypatch.setattr(executor, "discover", walked)
    assert executor.policy_from(settings, str(data)).num_shards == 3


def test_the_runner_reads_the_recorded_longest_line_instead_of_scanning(tmp_path, monkeypatch):
    from data_juicer_elastic.ray_runner import shard_errors

    data = tmp_path / "long.jsonl"
    long_row = json.dumps({"text": "x" * (3 << 20)}) + "\n"
    data.write_text(json.dumps({"text": "a"}) + "\n" + long_row + json.dumps({"text": "b"}) + "\n")
    result = prepare(request(data, tmp_path / "job", 2), log=lambda *_: None)
    assert sorted(s.longest_line for s in result.manifest.shards)[-1] == len(long_row)
    shards = shard_files(tmp_path / "job")
    scanned = [shard_errors.longest_line(str(p)) for p in shards]

    def scan(_: str) -> int:
        raise AssertionError("the shard was scanned for its longest line")

    monkeypatch.setattr(shard_errors, "longest_line", scan)
    got = [shard_errors.block_size_for(str(p)) for p in shards]
    assert got == [shard_errors.DEFAULT_BLOCK * 8 if n else None for n in scanned] and any(got)
