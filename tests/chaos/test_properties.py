"""Properties over random corpora, directory layouts and shard counts, with the identity runner.

merge(worker(prepare(x))) equals x after normalisation (a final newline added,
relative media paths made absolute, every other line byte for byte); shard
boundaries are contiguous and cover every input byte; two prepares of the same
request are byte-identical but for the timestamp.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from data_juicer_elastic.errors import UserError
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.manifest import Policy
from data_juicer_elastic.merge import merge
from data_juicer_elastic.prepare.driver import PrepareRequest, prepare
from data_juicer_elastic.worker.loop import run_worker

from ..jobs import RECIPE, jsonl_only
from ..runners import copy

pytestmark = jsonl_only("random JSONL corpora: byte-exact shard boundaries and line normalisation")

# Each media path the corpora use, and what README promises it becomes ("{base}": the JSONL file's folder
# for a file input, the dataset root for a folder): written out by hand, not derived from prepare's rule.
RESOLVED = {
    "a.png": "{base}/a.png",
    "sub/b.png": "{base}/sub/b.png",
    "/abs/c.png": "/abs/c.png",
    "http://h/d.png": "http://h/d.png",
    "https://h/g.png": "https://h/g.png",
    "s3://b/e.png": "s3://b/e.png",
    "gs://b/h.png": "gs://b/h.png",
    "hdfs://n/i.png": "hdfs://n/i.png",
    "./f.png": "{base}/./f.png",
    "ü.png": "{base}/ü.png",
}

text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=8)
# One scalar kind per corpus (with nulls): prepare refuses a key whose values mix kinds Arrow cannot hold in
# one column (tests/test_schema.py checks that refusal), so mixed kinds would mostly test the refusal.
_KINDS = {
    "bool": st.booleans(),
    "int": st.integers(-(2**53), 2**53),
    "float": st.floats(allow_nan=False, allow_infinity=False),
    "text": text,
}
scalars = st.none() | st.shared(st.sampled_from(sorted(_KINDS)), key="kind").flatmap(_KINDS.__getitem__)
values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3), max_leaves=6
)
media_path = st.sampled_from(sorted(RESOLVED))
rows = st.builds(
    lambda base, images: {**base, **({} if images is False else {"images": images})},
    st.dictionaries(st.text(st.characters(blacklist_categories=("Cs",)), max_size=5), values, max_size=4),
    st.one_of(st.just(False), st.none(), st.lists(media_path, max_size=3)),
)
styles = st.sampled_from(["orjson", "spaced", "ascii"])
names = st.lists(
    st.sampled_from(["a", "b", "z", "sub/a", "sub/b", "sub/deep/x", "é", "0"]), min_size=1, max_size=4, unique=True
)


@st.composite
def corpora(draw):
    files = []
    for name in draw(names):
        body = draw(st.lists(rows, min_size=1, max_size=10))
        files.append((f"{name}.jsonl", body, draw(styles), draw(st.booleans())))
    single = len(files) == 1 and draw(st.booleans())
    total = sum(len(f[1]) for f in files)
    return files, single, draw(st.integers(1, min(total, 16))), draw(st.sampled_from([0, 0, 0, 2]))


def _line(row: dict, style: str) -> bytes:
    if style == "orjson":
        return orjson.dumps(row)
    return json.dumps(row, ensure_ascii=style == "ascii", separators=(", ", ": ")).encode()


def _expected_line(raw: bytes, base: str) -> bytes:
    row = orjson.loads(raw)
    images = row.get("images")
    if not images:
        return raw
    fixed = [RESOLVED[p].format(base=base) for p in images]
    return raw if fixed == images else orjson.dumps({**row, "images": fixed})


def _manifest_minus_time(job: Path) -> dict:
    d = orjson.loads((job / "manifest.json").read_bytes())
    d.pop("created_at")
    return d


@settings(
    max_examples=int(os.environ.get("DJE_PROPERTY_EXAMPLES", "50")),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(corpora())
def test_merge_of_prepare_is_the_normalised_input(case):
    files, single, shards, jobs = case
    with tempfile.TemporaryDirectory(prefix="dje-prop-") as tmp:
        root = Path(tmp) / "ds"
        raws: dict[str, list[bytes]] = {}
        for name, body, style, final_newline in files:
            path = root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            lines = [_line(r, style) for r in body]
            path.write_bytes(b"\n".join(lines) + (b"\n" if final_newline else b""))
            raws[name] = lines
        dataset = root / files[0][0] if single else root
        policy = Policy(num_shards=shards, poll_interval_secs=0.01)

        def req(job: str) -> PrepareRequest:
            return PrepareRequest(str(dataset), str(Path(tmp) / job), RECIPE, policy)

        try:
            prepare(req("j1"), log=lambda *_: None, jobs=0)
        except UserError as exc:  # a key holding objects here and lists or scalars there: refused whole
            assert "cannot hold both" in str(exc)
            assert not (Path(tmp) / "j1" / "manifest.json").exists()
            return
        job = JobDir(Path(tmp) / "j1")
        m = job.manifest()

        # contiguous shard boundaries covering every byte of every file, in path order
        order = sorted(raws) if not single else [files[0][0]]
        assert [f.path for f in m.files] == ([Path(order[0]).name] if single else order)
        covered = {f.path: 0 for f in m.files}
        lines_seen = {f.path: 0 for f in m.files}
        row = 0
        for spec in m.shards:
            assert spec.rows >= 1 and spec.first_row == row and spec.sources
            for src in spec.sources:
                assert src.start == covered[src.file] and src.end > src.start
                assert src.first_line == lines_seen[src.file] + 1
                covered[src.file] = src.end
                data = (dataset if single else root / src.file).read_bytes()[src.start : src.end]
                lines_seen[src.file] += data.count(b"\n") + (not data.endswith(b"\n"))
            row += spec.rows
        assert covered == {f.path: f.size for f in m.files}
        assert row == m.total_rows == sum(len(v) for v in raws.values())

        # identity run, merge, compare with the normalised input
        assert run_worker(job.root, copy, log=lambda *_: None).exit_code == 0
        out = Path(tmp) / "merged.jsonl"
        merge(job, str(out), log=lambda *_: None)
        base = str(dataset.parent) if single else str(root)
        expected = b"".join(_expected_line(raw, base) + b"\n" for name in order for raw in raws[name])
        assert out.read_bytes() == expected

        # a second prepare of the same request is byte-identical
        prepare(req("j2"), log=lambda *_: None, jobs=jobs)
        for spec in m.shards:
            assert (Path(tmp) / "j2" / spec.path).read_bytes() == (job.root / spec.path).read_bytes()
        assert _manifest_minus_time(Path(tmp) / "j2") == _manifest_minus_time(job.root)
