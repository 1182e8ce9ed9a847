"""prepare: layout, determinism, idempotence, the split, strict validation, normalisation."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import itertools
import os
import time
from concurrent.futures import CancelledError
from pathlib import Path

import orjson
import pytest
import zstandard  # a declared dependency (setup.cfg): README promises .jsonl.zst input
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from data_juicer_elastic.errors import UserError
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.prepare.inputs import check_unchanged, discover
from data_juicer_elastic.progress import ProgressBar

from .prep_helpers import RECIPE, endless_task, lines_of, request, run, shard_bytes, slow_pid, text_rows, write_rows
from .require import require


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return write_rows(tmp_path / "in" / "data.jsonl", text_rows(200))


# layout and manifest ----------------------------------------------------------
def test_layout_and_manifest(tmp_path: Path, data: Path) -> None:
    job_dir = tmp_path / "job"
    result, logs = run(request(data, job_dir, 3))
    assert result.created and result.rows == 200
    assert sorted(os.listdir(job_dir)) == ["current.json", "generations", "manifest.json", "shards"]
    gen = hashlib.sha256(RECIPE).hexdigest()[:16]
    gdir = job_dir / "generations" / gen
    assert os.listdir(job_dir / "generations") == [gen] and JobDir(job_dir).gen_dir == gdir
    assert sorted(os.listdir(gdir)) == [
        "attempts",
        "finalize",
        "generation.json",
        "policy.json",
        "recipe.yaml",
        "state",
    ]
    assert sorted(os.listdir(gdir / "state")) == sorted(JobDir.STATE_SUBDIRS)
    assert all(not os.listdir(gdir / "state" / d) for d in JobDir.STATE_SUBDIRS)
    assert os.listdir(gdir / "attempts") == []
    assert (gdir / "recipe.yaml").read_bytes() == RECIPE
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")], "staging left behind"

    m = JobDir(job_dir).manifest()
    raw = data.read_bytes()
    assert m.dataset_path == str(data) and m.input_kind == "file"
    [f] = m.files
    st = data.stat()
    assert (f.path, f.size, f.mtime_ns, f.rows) == ("data.jsonl", st.st_size, st.st_mtime_ns, 200)
    assert m.recipe_sha256 == hashlib.sha256(RECIPE).hexdigest()
    assert m.versions == {"data_juicer": "1.6.1", "data_juicer_elastic": "0.1.0"}
    assert m.policy.num_shards == 3 and m.total_rows == 200 and m.total_bytes == len(raw)
    assert [s.id for s in m.shards] == [f"part-0000{i}-of-00003" for i in range(3)]
    first = 0
    for spec, data_bytes in zip(m.shards, shard_bytes(job_dir), strict=True):
        assert spec.path == f"shards/{spec.id}.jsonl"
        assert spec.sha256 == hashlib.sha256(data_bytes).hexdigest() and spec.bytes == len(data_bytes)
        assert spec.rows == data_bytes.count(b"\n") and spec.first_row == first
        [src] = spec.sources
        assert src.file == "data.jsonl" and raw[src.start : src.end] == data_bytes
        assert src.sha256 == spec.sha256  # one range, nothing rewritten: the input's digest is the shard's
        assert src.first_line == first + 1
        first += spec.rows
    assert (job_dir / "manifest.json").read_bytes() == __import__(
        "data_juicer_elastic.storage.files", fromlist=["x"]
    ).dumps_json(m.to_dict())
    [summary] = logs
    assert "200 rows" in summary and "MB" in summary and "MB/s" in summary and " s " in summary


def test_directory_input_order_and_sources(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    write_rows(root / "b.jsonl", text_rows(10, 100))
    write_rows(root / "a" / "z.jsonl", text_rows(10, 200))
    write_rows(root / "a.jsonl", text_rows(10, 300))
    (root / "notes.txt").write_text("ignored")
    (root / "a" / "skip.json").write_text("{}")
    result, _ = run(request(root, tmp_path / "job", 4))
    m = result.manifest
    assert m.input_kind == "dir" and [f.path for f in m.files] == ["a.jsonl", "a/z.jsonl", "b.jsonl"]
    merged = b"".join(shard_bytes(tmp_path / "job"))
    expected = b"".join((root / p).read_bytes() for p in ["a.jsonl", "a/z.jsonl", "b.jsonl"])
    assert merged == expected
    lines_per_file = {f.path: f.rows for f in m.files}
    assert lines_per_file == {"a.jsonl": 10, "a/z.jsonl": 10, "b.jsonl": 10}
    seen: dict[str, int] = {}
    for spec in m.shards:
        for src in spec.sources:
            assert src.first_line == seen.get(src.file, 0) + 1
            seen[src.file] = seen.get(src.file, 0) + (root / src.file).read_bytes()[src.start : src.end].count(b"\n")


# determinism and idempotence -------------------------------------------------
def _manifest_minus_time(job_dir: Path) -> dict:
    d = orjson.loads((job_dir / "manifest.json").read_bytes())
    d.pop("created_at")
    return d


@pytest.mark.parametrize("jobs", [0, 3])
def test_source_digests_fingerprint_the_input_as_read(tmp_path: Path, jobs: int) -> None:
    """Each source range's sha256 is of the input lines, whatever was rewritten and however shards cut files."""
    root = tmp_path / "ds"
    write_rows(root / "a.jsonl", [*text_rows(50), {"text": "m", "images": ["rel.png"]}, *text_rows(50, 50)])
    write_rows(root / "b.jsonl", text_rows(7, 200), newline_at_end=False)
    write_rows(root / "c.jsonl", [{"images": ["x.png"]}, *text_rows(90, 300)])
    result, _ = run(request(root, tmp_path / "job", 5), jobs=jobs)
    sources = [src for spec in result.manifest.shards for src in spec.sources]
    assert any(len(spec.sources) > 1 for spec in result.manifest.shards)  # a shard spans files
    for src in sources:
        raw = (root / src.file).read_bytes()[src.start : src.end]
        assert src.sha256 == hashlib.sha256(raw if raw.endswith(b"\n") else raw + b"\n").hexdigest()
    files = {f.path: f for f in result.manifest.files}
    for name in ("a.jsonl", "b.jsonl", "c.jsonl"):  # a file's ranges cover it exactly
        mine = [s for s in sources if s.file == name]
        assert mine[0].start == 0 and mine[-1].end == files[name].size
        assert all(x.end == y.start for x, y in itertools.pairwise(mine))
    rewritten = [s for s in result.manifest.shards if any(b"/rel.png" in line for line in _lines(tmp_path / "job", s))]
    assert rewritten and rewritten[0].sources[0].sha256 != rewritten[0].sha256


def _lines(job_dir: Path, spec: object) -> list[bytes]:
    return (job_dir / spec.path).read_bytes().splitlines()  # type: ignore[attr-defined]


@pytest.mark.parametrize("jobs", [0, 2])
def test_two_prepares_are_identical(tmp_path: Path, jobs: int) -> None:
    root = tmp_path / "ds"
    write_rows(root / "x.jsonl", [{"text": "a", "images": ["i.png"]}, *text_rows(300)])
    write_rows(root / "y" / "y.jsonl", text_rows(300, 1000), newline_at_end=False)
    _r1, _ = run(request(root, tmp_path / "j1", 7, index_keys=("idx",)), jobs=0)
    _r2, _ = run(request(root, tmp_path / "j2", 7, index_keys=("idx",)), jobs=jobs)
    assert shard_bytes(tmp_path / "j1") == shard_bytes(tmp_path / "j2")
    assert _manifest_minus_time(tmp_path / "j1") == _manifest_minus_time(tmp_path / "j2")


def test_repeat_is_a_noop(tmp_path: Path, data: Path) -> None:
    job_dir = tmp_path / "job"
    run(request(data, job_dir, 4))
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in job_dir.rglob("*") if p.is_file()}
    result, logs = run(request(data, job_dir, 4))
    assert not result.created and result.rows == 200
    assert result.manifest == JobDir(job_dir).manifest()
    assert "nothing to do" in logs[0]
    after = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in job_dir.rglob("*") if p.is_file()}
    assert before == after


def test_different_request_is_refused_with_what_differs(tmp_path: Path, data: Path) -> None:
    job_dir = tmp_path / "job"
    run(request(data, job_dir, 16))
    with pytest.raises(UserError, match="num_shards: 16 in job dir, 8 requested"):
        run(request(data, job_dir, 8))
    before = shard_bytes(job_dir)
    result, logs = run(request(data, job_dir, 16, recipe_text=b"process: []\n"))  # a new generation, same shards
    assert not result.created and "generation" in logs[0] and shard_bytes(job_dir) == before
    assert len(JobDir(job_dir).generation_ids()) == 2
    with pytest.raises(UserError, match=r"index_keys: \[\] in job dir, \['idx'\] requested"):
        run(request(data, job_dir, 16, index_keys=("idx",)))
    with open(data, "ab") as f:
        f.write(b'{"text": "one more"}\n')
    with pytest.raises(UserError) as err:
        run(request(data, job_dir, 8))
    assert "input data.jsonl: changed since prepare" in str(err.value) and "num_shards" in str(err.value)
    other = write_rows(tmp_path / "other.jsonl", text_rows(50))
    with pytest.raises(UserError, match="dataset_path"):
        run(request(other, job_dir, 16))


def test_job_dir_inside_dataset_dir_is_not_an_input(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    write_rows(root / "a.jsonl", text_rows(20))
    run(request(root, root / "job", 2))
    result, _ = run(request(root, root / "job", 2))
    assert not result.created and [f.path for f in result.manifest.files] == ["a.jsonl"]


def test_occupied_dir_without_manifest_is_refused_and_kept(tmp_path: Path, data: Path) -> None:
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    (job_dir / "mine.txt").write_text("keep")
    with pytest.raises(UserError, match="not empty"):
        run(request(data, job_dir, 2))
    assert os.listdir(job_dir) == ["mine.txt"]


def test_empty_existing_dir_is_used(tmp_path: Path, data: Path) -> None:
    (tmp_path / "job").mkdir()
    result, _ = run(request(data, tmp_path / "job", 2))
    assert result.created and (tmp_path / "job" / "manifest.json").exists()


# the split ------------------------------------------------------------------------
@pytest.mark.parametrize("shards", [1, 2, 7, 64, 1000])
def test_exact_contiguous_byte_balanced_shards(tmp_path: Path, shards: int) -> None:
    rows = [{"t": "y" * (10 + (i * 37) % 300)} for i in range(1000)]
    data = write_rows(tmp_path / "d.jsonl", rows)
    raw = data.read_bytes()
    result, _ = run(request(data, tmp_path / "job", shards, media_keys=()))
    parts = shard_bytes(tmp_path / "job")
    assert len(parts) == shards and all(parts) and b"".join(parts) == raw
    longest = max(len(line) + 1 for line in raw.splitlines())
    ideal = len(raw) / shards
    if shards < 1000:
        assert all(abs(len(p) - ideal) <= 2 * longest for p in parts), [len(p) for p in parts]
    assert sum(s.rows for s in result.manifest.shards) == 1000


def test_huge_lines_never_leave_a_shard_empty(tmp_path: Path) -> None:
    rows = [{"t": "a"}, {"t": "b" * (3 << 20)}, {"t": "c"}, {"t": "d"}, {"t": "e" * (2 << 20)}, {"t": "f"}]
    data = write_rows(tmp_path / "d.jsonl", rows)
    for shards in (2, 3, 4, 5, 6):
        job_dir = tmp_path / f"job{shards}"
        run(request(data, job_dir, shards))
        parts = shard_bytes(job_dir)
        assert len(parts) == shards and all(parts) and b"".join(parts) == data.read_bytes()


@pytest.mark.parametrize("shards", [0, -1, 11])
def test_bad_shard_count(tmp_path: Path, shards: int) -> None:
    data = write_rows(tmp_path / "d.jsonl", text_rows(10))
    with pytest.raises(UserError, match="num_shards") as err:
        run(request(data, tmp_path / "job", shards))
    if shards > 0:
        assert "only 10 rows" in str(err.value)
    assert not (tmp_path / "job").exists()


def test_num_shards_equal_rows_across_files(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    write_rows(root / "a.jsonl", text_rows(3))
    write_rows(root / "b.jsonl", text_rows(2), newline_at_end=False)
    result, _ = run(request(root, tmp_path / "job", 5))
    assert [s.rows for s in result.manifest.shards] == [1] * 5
    with pytest.raises(UserError, match="only 5 rows"):
        run(request(root, tmp_path / "job6", 6))


# strict validation ------------------------------------------------------------------
GOOD = b'{"text": "ok"}\n'


@pytest.mark.parametrize(
    "content, line, what",
    [
        (b"\xef\xbb\xbf" + GOOD * 3, 1, "byte order mark"),
        (GOOD * 2 + b'[{"text": "x"}]\n' + GOOD, 3, "JSON array"),
        (GOOD + b'"just a string"\n' + GOOD, 2, "JSON string"),
        (GOOD * 4 + b"42\n", 5, "JSON number"),
        (GOOD * 3 + b'{"text": "cut\n' + GOOD, 4, "not valid JSON"),
        (GOOD + b'{"text": "caf\xe9"}\n' + GOOD, 2, "invalid UTF-8"),
        (GOOD * 2 + b"\n" + GOOD, 3, "blank line"),
        (GOOD * 2 + b"  \r\n" + GOOD, 3, "blank line"),
        (GOOD * 3 + b"\n", 4, "blank line"),
        (GOOD + b'{"a": 1} {"b": 2}\n', 2, "not valid JSON"),
        (GOOD + b'{"images": "a.png"}\n', 2, "'images' must be a list of strings or null"),
        (GOOD * 2 + b'{"videos": ["a.mp4", 3]}\n', 3, "'videos' must be a list of strings"),
    ],
)
def test_bad_input_names_file_line_and_leaves_nothing(tmp_path: Path, content: bytes, line: int, what: str) -> None:
    data = tmp_path / "in" / "bad.jsonl"
    data.parent.mkdir()
    data.write_bytes(content)
    job_dir = tmp_path / "deep" / "er" / "job"
    with pytest.raises(UserError) as err:
        run(request(data, job_dir, 1))
    assert f"{data}:{line}: " in str(err.value) and what in str(err.value)
    assert not (tmp_path / "deep").exists()
    assert sorted(os.listdir(tmp_path)) == ["in"]


@pytest.mark.parametrize("jobs", [0, 2])
def test_bad_line_deep_in_a_later_file_and_shard(tmp_path: Path, jobs: int) -> None:
    root = tmp_path / "ds"
    write_rows(root / "a.jsonl", text_rows(500))
    rows = [orjson.dumps(r) for r in text_rows(400)]
    rows[333] = b'{"text": "broken"'
    (root / "b.jsonl").write_bytes(b"\n".join(rows) + b"\n")
    rows[100] = b"[]"  # an earlier bad line in the same file wins
    (root / "c.jsonl").write_bytes(b"\n".join(rows) + b"\n")
    with pytest.raises(UserError, match=rf"{root / 'b.jsonl'}:334: not valid JSON \(.*line 1 column 18"):
        run(request(root, tmp_path / "job", 9), jobs=jobs)
    assert not (tmp_path / "job").exists()


def test_missing_final_newline_is_added(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    write_rows(root / "a.jsonl", text_rows(5), newline_at_end=False)
    write_rows(root / "b.jsonl", text_rows(5, 5), newline_at_end=False)
    result, _ = run(request(root, tmp_path / "job", 2))
    merged = b"".join(shard_bytes(tmp_path / "job"))
    assert merged == (root / "a.jsonl").read_bytes() + b"\n" + (root / "b.jsonl").read_bytes() + b"\n"
    assert result.manifest.total_rows == 10 and [f.rows for f in result.manifest.files] == [5, 5]


@pytest.mark.parametrize("kind", ["empty-file", "empty-dir", "no-jsonl", "missing", "empty-in-dir"])
def test_unusable_dataset(tmp_path: Path, kind: str) -> None:
    root = tmp_path / "ds"
    if kind == "empty-file":
        root = tmp_path / "e.jsonl"
        root.write_bytes(b"")
        expect = "empty file"
    elif kind == "empty-dir":
        root.mkdir()
        expect = "empty"
    elif kind == "no-jsonl":
        root.mkdir()
        (root / "data.json").write_text("{}")
        expect = "no *.jsonl"
    elif kind == "missing":
        expect = "does not exist"
    else:
        write_rows(root / "a.jsonl", text_rows(3))
        (root / "b.jsonl").write_bytes(b"")
        expect = "empty file"
    with pytest.raises(UserError, match=expect) as err:
        run(request(root, tmp_path / "job", 1))
    assert str(root) in str(err.value) or kind == "empty-in-dir"
    assert not (tmp_path / "job").exists()


def test_symlink_loops_and_dangling_links(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    write_rows(root / "sub" / "a.jsonl", text_rows(3))
    os.symlink(root, root / "sub" / "loop")
    with pytest.raises(UserError, match="symlink loop"):
        run(request(root, tmp_path / "job", 1))
    os.unlink(root / "sub" / "loop")
    os.symlink("self.jsonl", root / "self.jsonl")
    with pytest.raises(UserError, match=rf"{root / 'self.jsonl'}: symlink loop"):
        run(request(root, tmp_path / "job", 1))
    os.unlink(root / "self.jsonl")
    os.symlink(tmp_path / "nowhere.jsonl", root / "gone.jsonl")
    with pytest.raises(UserError, match=rf"{root / 'gone.jsonl'}: does not exist"):
        run(request(root, tmp_path / "job", 1))
    os.unlink(root / "gone.jsonl")
    os.symlink(root / "sub", root / "alias")  # a non-looping folder link is followed
    result, _ = run(request(root, tmp_path / "job", 1))
    assert [f.path for f in result.manifest.files] == ["alias/a.jsonl", "sub/a.jsonl"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_file(tmp_path: Path) -> None:
    data = write_rows(tmp_path / "ds" / "a.jsonl", text_rows(3))
    data.chmod(0)
    with pytest.raises(UserError, match="cannot be read"):
        run(request(tmp_path / "ds", tmp_path / "job", 1))


def test_recipe_must_be_a_mapping(tmp_path: Path, data: Path) -> None:
    for recipe in (b"- a\n- b\n", b"just text\n", b"a: [1, 2\n"):
        with pytest.raises(UserError, match="recipe"):
            run(request(data, tmp_path / "job", 1, recipe_text=recipe))
    assert not (tmp_path / "job").exists()


# normalisation ---------------------------------------------------------------------
def test_media_paths_file_input(tmp_path: Path) -> None:
    folder = tmp_path / "in"
    rows = [
        {"text": "rel", "images": ["a.png", "sub/b.png"], "audios": ["x.wav"]},
        {"text": "abs", "images": ["/abs/c.png"]},
        {
            "text": "urls",
            "images": ["http://h/a.png", "https://h/b.png", "s3://b/c.png", "gs://b/d.png", "hdfs://n/e.png"],
        },
        {"text": "null", "images": None, "videos": None},
        {"text": "empty", "images": []},
        {"text": "none"},
        {"text": "mixed", "videos": ["/v/a.mp4", "b.mp4"]},
    ]
    data = write_rows(folder / "d.jsonl", rows)
    raw_lines = data.read_bytes().splitlines()
    run(request(data, tmp_path / "job", 2))
    out = b"".join(shard_bytes(tmp_path / "job"))
    got = lines_of(out)
    assert got[0]["images"] == [f"{folder}/a.png", f"{folder}/sub/b.png"] and got[0]["audios"] == [f"{folder}/x.wav"]
    assert got[6]["videos"] == ["/v/a.mp4", f"{folder}/b.mp4"]
    out_lines = out.splitlines()
    for i in (1, 2, 3, 4, 5):  # untouched rows keep their bytes
        assert out_lines[i] == raw_lines[i]
    assert out_lines[0] == orjson.dumps(got[0])


def test_media_paths_directory_input_resolve_against_root(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    (root / "deep" / "er").mkdir(parents=True)
    (root / "deep" / "er" / "d.jsonl").write_bytes(b'{"text": "t", "images": ["img/1.png"]}\n{ "text" : "kept" }\n')
    run(request(root, tmp_path / "job", 1))
    out = shard_bytes(tmp_path / "job")[0]
    assert lines_of(out)[0]["images"] == [f"{root}/img/1.png"]
    assert out.splitlines()[1] == b'{ "text" : "kept" }'


def test_custom_media_keys(tmp_path: Path) -> None:
    data = write_rows(tmp_path / "d.jsonl", [{"pics": ["a.png"], "images": "not checked"}])
    run(request(data, tmp_path / "job", 1, media_keys=("pics",)))
    assert lines_of(shard_bytes(tmp_path / "job")[0]) == [{"pics": [f"{tmp_path}/a.png"], "images": "not checked"}]


@pytest.mark.parametrize("jobs", [0, 2])
def test_index_keys_are_filled_with_the_global_row(tmp_path: Path, jobs: int) -> None:
    root = tmp_path / "ds"
    rows = text_rows(30)
    rows[4]["idx"] = 1000  # a value the row has is kept (a string would be refused: see test_schema)
    write_rows(root / "a.jsonl", rows)
    write_rows(root / "b.jsonl", text_rows(25, 30), newline_at_end=False)
    run(request(root, tmp_path / "job", 6, index_keys=("idx", "other")), jobs=jobs)
    got = [row for part in shard_bytes(tmp_path / "job") for row in lines_of(part)]
    assert len(got) == 55
    assert [r["idx"] for r in got] == [i if i != 4 else 1000 for i in range(55)]
    assert [r["other"] for r in got] == list(range(55))


# compressed inputs ----------------------------------------------------------------
def test_compressed_inputs_match_plain(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    write_rows(plain / "a.jsonl", text_rows(40))
    write_rows(plain / "b.jsonl", [*text_rows(40, 40), {"images": ["p.png"]}], newline_at_end=False)
    write_rows(plain / "c.jsonl", text_rows(40, 81))
    packed = tmp_path / "packed"
    packed.mkdir()
    (packed / "a.jsonl.gz").write_bytes(gzip.compress((plain / "a.jsonl").read_bytes()))
    (packed / "b.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress((plain / "b.jsonl").read_bytes()))
    (packed / "c.jsonl").write_bytes((plain / "c.jsonl").read_bytes())
    r1, _ = run(request(plain, tmp_path / "j1", 5))
    r2, _ = run(request(packed, tmp_path / "j2", 5))
    a1, a2 = shard_bytes(tmp_path / "j1"), shard_bytes(tmp_path / "j2")
    # byte ranges refer to the decompressed stream, so the split is the same; only the media base differs
    assert [s.sources for s in r1.manifest.shards] == [
        tuple(dataclasses.replace(src, file=src.file.replace(".gz", "").replace(".zst", "")) for src in s.sources)
        for s in r2.manifest.shards
    ]
    assert [x.replace(str(plain).encode(), b"@") for x in a1] == [x.replace(str(packed).encode(), b"@") for x in a2]
    assert {"images": [f"{packed}/p.png"]} in lines_of(b"".join(a2))
    f2 = {f.path: f for f in r2.manifest.files}
    gz = packed / "a.jsonl.gz"
    assert f2["a.jsonl.gz"].size == gz.stat().st_size and f2["a.jsonl.gz"].rows == 40
    assert not list(tmp_path.glob("**/.inputs"))


def test_corrupt_compressed_input(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    root.mkdir()
    (root / "a.jsonl.gz").write_bytes(gzip.compress(GOOD * 10)[:-12])
    with pytest.raises(UserError, match=r"a\.jsonl\.gz: not a valid \.gz file"):
        run(request(root, tmp_path / "job", 1))
    (root / "a.jsonl.gz").write_bytes(b"not gzip at all")
    with pytest.raises(UserError, match=r"not a valid \.gz file"):
        run(request(root, tmp_path / "job", 1))
    assert not (tmp_path / "job").exists()


def test_bad_line_in_compressed_input_names_decompressed_line(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    root.mkdir()
    (root / "a.jsonl.gz").write_bytes(gzip.compress(GOOD * 6 + b"[1]\n"))
    with pytest.raises(UserError, match=rf"{root / 'a.jsonl.gz'}:7: holds a JSON array"):
        run(request(root, tmp_path / "job", 1))


# changed input --------------------------------------------------------------------
def test_input_changed_while_reading_is_refused(tmp_path: Path, data: Path) -> None:
    dataset = discover(str(data))
    [spec] = dataset.inputs
    check_unchanged(spec)  # unchanged: fine
    with open(data, "ab") as f:
        f.write(GOOD)
    with pytest.raises(UserError, match=rf"{data}: changed while prepare read it \(size"):
        check_unchanged(spec)
    os.replace(write_rows(tmp_path / "other.jsonl", text_rows(200)), data)  # same size, new inode
    with pytest.raises(UserError, match="changed while prepare read it"):
        check_unchanged(spec)


# progress -------------------------------------------------------------------------
def test_progress_bar_draws_only_when_enabled() -> None:
    out = io.StringIO()
    bar = ProgressBar(100 << 20, "prepare", enabled=True, stream=out, delay=0, interval=0)
    bar.update(50 << 20)
    bar.close()
    assert "prepare:" in out.getvalue() and " 50%|" in out.getvalue() and out.getvalue().endswith("\n")
    quiet = io.StringIO()
    bar = ProgressBar(10, "prepare", stream=quiet, delay=0, interval=0)  # StringIO is no terminal
    bar.update(5)
    bar.close()
    assert quiet.getvalue() == ""


def test_progress_true_does_not_change_output(tmp_path: Path, data: Path, capsys: pytest.CaptureFixture) -> None:
    run(request(data, tmp_path / "j1", 3), progress=True)
    run(request(data, tmp_path / "j2", 3), progress=False)
    assert shard_bytes(tmp_path / "j1") == shard_bytes(tmp_path / "j2")


# the pieces prepare is built from ------------------------------------------------
@pytest.mark.parametrize("where, direct", [("disk", True), ("disk", False), ("shm", True)])
def test_bulk_writer_bytes_match(tmp_path: Path, where: str, direct: bool) -> None:
    from data_juicer_elastic.storage.bulk_write import ALIGN, BUFFER, BulkWriter

    folder = tmp_path if where == "disk" else Path("/dev/shm")
    require(folder.is_dir(), "/dev/shm")
    for size in (0, 1, ALIGN - 1, ALIGN, ALIGN + 1, BUFFER - 1, BUFFER, 2 * BUFFER + ALIGN + 3):
        path = folder / f"dje-bulk-{os.getpid()}-{size}"
        data = os.urandom(size)
        try:
            with BulkWriter(path, direct=direct) as w:
                for i in range(0, size, 777_777):  # uneven pieces
                    w.write(memoryview(data)[i : i + 777_777])
            assert path.read_bytes() == data and w.size == size
            with pytest.raises(FileExistsError):
                BulkWriter(path)
        finally:
            path.unlink(missing_ok=True)


def test_worker_processes_need_no_main_guard(tmp_path: Path) -> None:
    """Workers are fresh interpreters: a script without a main guard, with a thread running, works."""
    import subprocess
    import sys

    data = write_rows(tmp_path / "d.jsonl", text_rows(2000))
    script = tmp_path / "unguarded.py"
    script.write_text(
        "import threading, sys\n"
        "threading.Thread(target=threading.Event().wait, daemon=True).start()\n"
        "from data_juicer_elastic.prepare.driver import prepare, PrepareRequest\n"
        "from data_juicer_elastic.job.layout import Policy\n"
        f"req = PrepareRequest({str(data)!r}, {str(tmp_path / 'job')!r}, b'a: 1\\n', Policy(num_shards=4))\n"
        "r = prepare(req, jobs=2)\n"
        "print('rows', r.rows)\n"
    )
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "rows 2000" in proc.stdout
    assert b"".join(shard_bytes(tmp_path / "job")) == data.read_bytes()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    files=st.lists(st.lists(st.integers(1, 300), min_size=1, max_size=12), min_size=1, max_size=4),
    last_newline=st.booleans(),
    data=st.data(),
)
def test_plan_properties(tmp_path: Path, files: list[list[int]], last_newline: bool, data: st.DataObject) -> None:
    """Any files, any n <= rows: n non-empty contiguous ranges, each starting at a line start."""
    from data_juicer_elastic.prepare.split import TooFewRows, plan

    paths, sizes, starts, offset = [], [], set(), 0
    for k, lengths in enumerate(files):
        body = b"".join(b"x" * (n - 1) + b"\n" for n in lengths)
        if not last_newline:
            body = body[:-1] or b"x"
        path = tmp_path / f"plan-{k}.jsonl"
        path.write_bytes(body)
        starts |= {offset + i + 1 for i, c in enumerate(body) if c == 10 and i + 1 < len(body)} | {offset}
        paths.append(str(path))
        sizes.append(len(body))
        offset += len(body)
    rows = len(starts)
    n = data.draw(st.integers(1, rows + 1))
    if n > rows:
        with pytest.raises(TooFewRows) as err:
            plan(paths, sizes, n)
        assert err.value.rows == rows
        return
    _, ranges = plan(paths, sizes, n)
    assert len(ranges) == n and ranges[0][0] == 0 and ranges[-1][1] == offset
    assert all(a < b for a, b in ranges) and all(x[1] == y[0] for x, y in itertools.pairwise(ranges))
    assert {a for a, _ in ranges} <= starts


def test_child_pool_reports_errors_and_dead_workers() -> None:
    from data_juicer_elastic.prepare.pool import ChildPool, Counter

    with ChildPool(2, Counter(), work_here=False) as pool:  # every task in a child: one of them exits
        ok = pool.submit(divmod, 7, 2)
        bad = pool.submit(int, "not a number")
        assert ok.result(timeout=60) == (3, 1)
        with pytest.raises(ValueError, match="not a number"):
            bad.result(timeout=60)
        dead = pool.submit(os._exit, 3)
        with pytest.raises(RuntimeError, match=r"worker process died \(exit code 3\)"):
            dead.result(timeout=60)


def test_child_pool_shares_work_between_this_process_and_children() -> None:
    from data_juicer_elastic.prepare.pool import ChildPool, Counter

    with ChildPool(2, Counter()) as pool:
        pids = [f.result(timeout=60) for f in [pool.submit(slow_pid, 0.2) for _ in range(12)]]
    assert os.getpid() in pids and len(set(pids)) == 3


def test_cancelling_the_pool_stops_the_task_running_in_this_process() -> None:
    """After a bad line elsewhere, prepare must not wait for a long shard here to finish."""
    import threading

    from data_juicer_elastic.prepare.pool import ChildPool, Counter

    pool = ChildPool(0, Counter())
    task = pool.submit(endless_task)
    deadline = time.monotonic() + 30
    while not task.running() and time.monotonic() < deadline:
        time.sleep(0.01)
    stopper = threading.Thread(target=pool.shutdown, kwargs={"cancel_futures": True})
    stopper.start()
    stopper.join(timeout=30)
    assert not stopper.is_alive(), "shutdown waited for the running task"
    with pytest.raises(CancelledError):
        task.result(timeout=1)


def test_pool_works_here_without_a_python(tmp_path: Path, data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from data_juicer_elastic.prepare.pool import ChildPool, Counter, make_pool

    monkeypatch.setattr("sys.executable", str(tmp_path / "no-python-here"))
    with make_pool(3, Counter()) as pool:
        assert isinstance(pool, ChildPool) and pool.submit(divmod, 7, 2).result(timeout=60) == (3, 1)
    with pytest.raises(OSError):
        ChildPool(2, Counter(), work_here=False)
    result, _ = run(request(data, tmp_path / "job", 3), jobs=2)
    assert result.created and result.rows == 200
