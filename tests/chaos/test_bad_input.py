"""Bad input the rest of the suite does not already try (see tests/test_prepare.py for the basics).

Each: UserError (exit 2) naming the file and line or key, and nothing published.
Already covered in test_prepare.py: invalid UTF-8, blank lines, a JSON array,
string or number as a row, a truncated object, a BOM, two objects on a line,
media not a list or holding a non-string, an empty file, an empty directory, a
directory without .jsonl files, a missing path, symlink loops, dangling links,
num_shards 0/-1/above the row count, a recipe that is no mapping, a job dir
reused with another recipe, input, policy or keys.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from data_juicer_elastic.errors import UserError
from data_juicer_elastic.job.manifest import Policy
from data_juicer_elastic.prepare.driver import PrepareRequest, prepare

from ..jobs import REPO, env_with, jsonl_only
from ..prep_helpers import request, run, text_rows, write_rows

pytestmark = jsonl_only("each test writes bad JSONL by hand (Parquet input checks: tests/test_prepare_parquet.py)")

GOOD = b'{"text": "ok"}\n'


def _refused(tmp_path: Path, dataset: Path, shards: int = 1, **kw) -> str:
    with pytest.raises(UserError) as err:
        run(request(dataset, tmp_path / "job", shards, **kw))
    assert err.value.exit_code == 2
    assert not (tmp_path / "job").exists()
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".job")], "staging left behind"
    return str(err.value)


@pytest.mark.parametrize(
    "content, line, what",
    [
        (b"true\n" + GOOD, 1, "holds a JSON boolean, not a JSON object"),
        (GOOD + b"null\n", 2, "holds null, not a JSON object"),
        (GOOD * 3 + b'{"a": "\\ud800"}\n', 4, "not valid JSON"),  # a lone surrogate escape
        (GOOD + b'{"a":' * 1100 + b"1" + b"}" * 1100 + b"\n", 2, "not valid JSON"),  # nested past the depth limit
        (GOOD + b'{"a": NaN}\n', 2, "not valid JSON"),
        (GOOD + b'{"k\xff": 1}\n', 2, "invalid UTF-8"),
        (GOOD * 2 + b"\x00\n", 3, "not valid JSON"),
        (GOOD + b'{"text": "cut', 2, "not valid JSON"),  # the last line truncated, no newline
        (GOOD + b'{"images": {"a.png": 1}}\n', 2, "'images' must be a list of strings or null, got a JSON object"),
        (GOOD + b'{"audios": [null]}\n', 2, "'audios' must be a list of strings"),
        (GOOD + b'{"videos": "v.mp4"}\n', 2, "'videos' must be a list of strings or null, got a JSON string"),
    ],
)
def test_more_bad_rows_name_file_and_line(tmp_path, content, line, what):
    data = tmp_path / "bad.jsonl"
    data.write_bytes(content)
    msg = _refused(tmp_path, data)
    assert msg.startswith(f"{data}:{line}: ") and what in msg, msg
    assert len(msg) < 500, "the message must not echo the row"


def test_bom_at_the_start_of_a_later_file(tmp_path):
    root = tmp_path / "ds"
    write_rows(root / "a.jsonl", text_rows(50))
    (root / "b.jsonl").write_bytes(b"\xef\xbb\xbf" + GOOD * 3)
    msg = _refused(tmp_path, root, shards=3)
    assert msg.startswith(f"{root / 'b.jsonl'}:1: ") and "byte order mark" in msg


@pytest.mark.parametrize("value", [True, 2.5, "4", None])
def test_num_shards_must_be_a_whole_number(tmp_path, value):
    data = write_rows(tmp_path / "d.jsonl", text_rows(10))
    assert "num_shards" in _refused(tmp_path, data, shards=value)


@pytest.mark.parametrize("recipe", [b"", b"~\n", b"42\n", b"[process]\n"])
def test_recipe_that_is_not_a_mapping(tmp_path, recipe):
    data = write_rows(tmp_path / "d.jsonl", text_rows(10))
    assert "recipe must be a YAML mapping" in _refused(tmp_path, data, recipe_text=recipe)


def test_file_name_that_is_not_utf8(tmp_path):
    root = tmp_path / "ds"
    write_rows(root / "a.jsonl", text_rows(5))
    with open(os.path.join(os.fsencode(root), b"caf\xe9.jsonl"), "wb") as f:
        f.write(GOOD)
    msg = _refused(tmp_path, root)
    assert f"{root}/caf\\xe9.jsonl: the path is not valid UTF-8" in msg


# unreadable and odd files --------------------------------------------------------------------------
@pytest.mark.timeout(60)
@pytest.mark.parametrize("where", ["in-a-folder", "as-the-dataset"])
def test_fifo_is_refused_without_blocking(tmp_path, where):
    root = tmp_path / "ds"
    write_rows(root / "a.jsonl", text_rows(5))
    fifo = root / "pipe.jsonl"
    os.mkfifo(fifo)
    msg = _refused(tmp_path, root if where == "in-a-folder" else fifo)
    assert str(fifo) in msg and "not a regular file" in msg


def _prepare_as_nobody(dataset: str, job_dir: str, queue) -> None:
    os.setgid(65534)
    os.setuid(65534)
    try:
        prepare(PrepareRequest(dataset, job_dir, b"a: 1\n", Policy(num_shards=1)), log=lambda *_: None, jobs=0)
        queue.put("prepared")
    except UserError as exc:
        queue.put(f"UserError: {exc}")
    except BaseException as exc:
        queue.put(f"{type(exc).__name__}: {exc}")


@pytest.mark.skipif(os.geteuid() != 0, reason="test_prepare.py::test_unreadable_file covers this without root")
@pytest.mark.parametrize("what", ["file", "folder"])
def test_unreadable_input_for_a_user_without_permission(what):
    """Root reads everything, so the prepare runs in a forked child that dropped to nobody (65534)."""
    base = Path(tempfile.mkdtemp(prefix="dje-nobody-"))
    try:
        os.chmod(base, 0o777)
        root = base / "ds"
        write_rows(root / "a.jsonl", text_rows(5))
        bad = write_rows(root / "b.jsonl", text_rows(5)) if what == "file" else (root / "sub")
        if what == "folder":
            write_rows(bad / "c.jsonl", text_rows(5))
        for p in (root, *root.rglob("*")):
            os.chmod(p, 0o755 if p.is_dir() else 0o644)
        os.chmod(bad, 0)
        ctx = mp.get_context("fork")
        queue = ctx.Queue()
        child = ctx.Process(target=_prepare_as_nobody, args=(str(root), str(base / "job"), queue))
        child.start()
        outcome = queue.get(timeout=60)
        child.join(30)
        assert outcome == f"UserError: {bad}: cannot be read (Permission denied); make it readable (chmod) or remove it"
        assert sorted(os.listdir(base)) == ["ds"]
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)


# a 100 MB line ----------------------------------------------------------------------------------------
HUGE = 100 << 20
PIPELINE = """
import resource, sys
from data_juicer_elastic.errors import UserError
from data_juicer_elastic.job.layout import JobDir
from data_juicer_elastic.job.manifest import Policy
from data_juicer_elastic.merge import merge
from data_juicer_elastic.prepare.driver import PrepareRequest, prepare
from data_juicer_elastic.worker.loop import run_worker
from tests.runners import copy
data, job, out = sys.argv[1:4]
try:
    req = PrepareRequest(data, job, b"a: 1\\n", Policy(num_shards=2, poll_interval_secs=0.1))
    prepare(req, log=lambda *_: None, jobs=0)
except UserError as exc:
    print("refused:", str(exc)[:300])
else:
    assert run_worker(job, copy, log=lambda *_: None).exit_code == 0
    merge(JobDir(job), out, log=lambda *_: None)
    print("merged")
print("peak MiB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
"""


@pytest.mark.timeout(180)
@pytest.mark.parametrize("valid", [True, False])
def test_a_100_mb_line_is_handled_in_bounded_memory(tmp_path, valid):
    """Accepted (prepare, worker, merge) or, when broken, refused with file:line; never more than ~8x the line."""
    data = tmp_path / "data.jsonl"
    with open(data, "wb") as f:
        f.write(GOOD)
        f.write(b'{"text": "' + b"x" * HUGE + (b'"}\n' if valid else b"\n"))
        f.write(GOOD * 2)
    out = tmp_path / "merged.jsonl"
    p = subprocess.run(
        [sys.executable, "-c", PIPELINE, str(data), str(tmp_path / "job"), str(out)],
        cwd=REPO,
        env=env_with(),
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stdout.splitlines()
    peak = int(lines[-1].split()[-1])
    if valid:
        assert lines[0] == "merged"
        assert out.stat().st_size == data.stat().st_size
        with open(out, "rb") as merged, open(data, "rb") as original:
            while block := original.read(16 << 20):
                assert merged.read(16 << 20) == block
    else:
        assert lines[0].startswith(f"refused: {data}:2: not valid JSON"), lines[0]
        assert not (tmp_path / "job").exists()
    assert peak < 8 * (HUGE >> 20) + 200, f"peak RSS {peak} MiB for a 100 MiB line"


# through real processes ---------------------------------------------------------------------------------
def test_bad_input_fails_every_node_of_a_coordinated_run_and_publishes_nothing(tmp_path):
    data = tmp_path / "input" / "data.jsonl"
    data.parent.mkdir()
    data.write_bytes(GOOD * 20 + b"[1, 2]\n" + GOOD)
    procs = []
    for host in ("node-0", "node-1"):
        cmd = [
            sys.executable,
            "-m",
            "tests.coord_node",
            "--job-dir",
            str(tmp_path / "job"),
            "--export",
            str(tmp_path / "out.jsonl"),
            "--dataset",
            str(data),
            "--shards",
            "2",
        ]
        procs.append(
            subprocess.Popen(
                cmd,
                cwd=REPO,
                env=env_with(DJ_ELASTIC_HOSTNAME=host, DJ_ELASTIC_RUN_ID="bad"),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [2, 2], outputs
    for text in outputs:
        assert f"{data}:21: holds a JSON array" in text.strip().splitlines()[-1], text
    assert os.listdir(tmp_path / "job") == ["runs"] and not (tmp_path / "out.jsonl").exists()  # only the elections
