"""The Data-Juicer integration without Ray: hook, packaging, registry, schema, validation, snapshot.

Parsing tests call Data-Juicer's own ``init_configs`` in this process (the
hook patched it when Data-Juicer was imported); nothing here starts Ray.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
import yaml

from data_juicer_elastic.errors import UserError
from tests.reference import OFFLINE

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
QUIET_ENV = OFFLINE


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **QUIET_ENV, **env}
    full_env.pop("DJ_ELASTIC_DISABLE", None) if "DJ_ELASTIC_DISABLE" not in env else None
    return subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, env=full_env, cwd="/", timeout=120)


@pytest.fixture
def parse(monkeypatch):
    """Data-Juicer's init_configs (patched by the hook), run from the repository root, no Ray."""
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("RAY_JOB", raising=False)
    for key, value in QUIET_ENV.items():
        monkeypatch.setenv(key, value)
    from data_juicer.config import init_configs

    def _parse(*args: str):
        return init_configs(list(args), load_configs_only=True)

    return _parse


def write_recipe(path: Path, **recipe) -> Path:
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


# --------------------------------------------------------------------------- the hook
STARTUP_PROBE = """
import sys
finders = [type(f).__name__ for f in sys.meta_path]
heavy = sorted(m for m in ("data_juicer", "jsonargparse", "yaml", "ray", "typing") if m in sys.modules)
print(finders.count("DataJuicerFinder"), heavy)
"""


def test_hook_is_installed_at_startup_without_importing_data_juicer():
    out = run_python(STARTUP_PROBE)
    assert out.returncode == 0 and not out.stderr, out.stderr
    count, heavy = out.stdout.split(" ", 1)
    assert count == "1"
    assert "data_juicer" not in heavy and "jsonargparse" not in heavy and "ray" not in heavy


def test_hook_can_be_switched_off():
    out = run_python(
        STARTUP_PROBE
        + """
from data_juicer.config import config
print(getattr(config, "__dj_elastic_patched__", False))
""",
        DJ_ELASTIC_DISABLE="1",
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == "0" and out.stdout.split()[-1] == "False"


def test_hook_adds_only_its_own_modules_at_interpreter_start():
    """What start-up costs is what it imports: the hook and its two parent packages, nothing else.

    (Its import time is measured in tests/benchmarks/bench_hook.py, not asserted here.)
    """

    def modules(**env: str) -> set[str]:
        environ = {k: v for k, v in os.environ.items() if k != "DJ_ELASTIC_DISABLE"} | env
        out = subprocess.run(
            [PYTHON, "-c", "import sys; print('\\n'.join(sys.modules))"],
            capture_output=True,
            text=True,
            cwd="/",
            env=environ,
            check=True,
        )
        return set(out.stdout.split())

    added = modules() - modules(DJ_ELASTIC_DISABLE="1")
    assert added == {"data_juicer_elastic", "data_juicer_elastic.plugin", "data_juicer_elastic.plugin.hook"}


def test_patches_apply_to_modules_imported_before_install():
    out = run_python(
        """
import data_juicer.config.config as c
from data_juicer_elastic.plugin import hook
print(getattr(c, "__dj_elastic_patched__", False), hook.install(), getattr(c, "__dj_elastic_patched__", False))
""",
        DJ_ELASTIC_DISABLE="1",
    )
    # switched off: install() refuses; the module stays as Data-Juicer wrote it
    assert out.stdout.split()[-3:] == ["False", "False", "False"], out.stderr[-2000:]
    out = run_python("""
import sys
from data_juicer_elastic.plugin import hook
sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, hook.DataJuicerFinder)]
import data_juicer.config.config as c
before = getattr(c, "__dj_elastic_patched__", False)
print(before, hook.install(), getattr(c, "__dj_elastic_patched__", False))
""")
    assert out.stdout.split()[-3:] == ["False", "True", "True"], out.stderr[-2000:]


# --------------------------------------------------------------------------- packaging
def _build(tmp_path: Path) -> tuple[Path, Path]:
    """A wheel and an editable wheel built from a copy of the project (no build isolation: offline)."""
    src = tmp_path / "src"
    shutil.copytree(
        REPO,
        src,
        ignore=shutil.ignore_patterns(
            ".venv", ".git", "outputs", "build", "*.egg-info", "__pycache__", ".pytest_cache", "demos"
        ),
    )
    dist = tmp_path / "dist"
    built = []
    for hook in ("build_wheel", "build_editable"):  # one process each: setuptools keeps state between them
        code = f"from setuptools import build_meta as b; import sys; print('BUILT', b.{hook}(sys.argv[1]))"
        out = subprocess.run([PYTHON, "-c", code, str(dist)], cwd=src, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        built.append(dist / next(ln for ln in out.stdout.splitlines() if ln.startswith("BUILT ")).split()[1])
    wheel, editable = built
    return wheel, editable


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> tuple[Path, Path]:
    """One wheel and one editable wheel for the module's tests (they only read them)."""
    return _build(tmp_path_factory.mktemp("wheels"))


def test_wheel_and_editable_wheel_ship_the_pth_at_their_root(wheels):
    wheel, editable = wheels
    pth = (REPO / "data_juicer_elastic" / "plugin" / "data_juicer_elastic.pth").read_bytes()
    for path in (wheel, editable):
        with zipfile.ZipFile(path) as z:
            assert z.read("data_juicer_elastic.pth") == pth, path.name
            record = next(n for n in z.namelist() if n.endswith(".dist-info/RECORD"))
            assert "data_juicer_elastic.pth," in z.read(record).decode()
            entry_points = next(n for n in z.namelist() if n.endswith(".dist-info/entry_points.txt"))
            assert (
                "elastic_shard = data_juicer_elastic.plugin.executor:ElasticShardExecutor"
                in z.read(entry_points).decode()
            )


def test_installed_wheel_activates_and_is_harmless_without_data_juicer(tmp_path, wheels):
    """Install the wheel (unpack into a fresh venv's site-packages, as pip does for a pure wheel)."""
    wheel, _ = wheels
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    env = {k: v for k, v in os.environ.items() if k not in ("DJ_ELASTIC_DISABLE", "PYTHONPATH")}
    # no Data-Juicer in this venv: Python starts cleanly and the import fails as it always would
    out = subprocess.run([py, "-c", STARTUP_PROBE + "import data_juicer"], capture_output=True, text=True, env=env)
    assert out.stdout.startswith("1 "), out.stdout + out.stderr
    assert "ModuleNotFoundError: No module named 'data_juicer'" in out.stderr
    assert "data_juicer_elastic" not in out.stderr
    # now let it see the dev environment's packages (Data-Juicer among them): patched on import
    (site / "zz_dev_packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    out = subprocess.run(
        [
            py,
            "-c",
            "import data_juicer.config.config as c, data_juicer_elastic as e; "
            "print(c.__dj_elastic_patched__, e.__file__)",
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[0] == "True" and out.stdout.split()[1].startswith(str(site))


def test_dev_environment_is_an_editable_install_with_the_hook():
    site = Path(sysconfig.get_paths()["purelib"])
    assert (site / "data_juicer_elastic.pth").read_bytes() == (
        REPO / "data_juicer_elastic" / "plugin" / "data_juicer_elastic.pth"
    ).read_bytes()
    import data_juicer_elastic

    assert Path(data_juicer_elastic.__file__).resolve().parent == REPO / "data_juicer_elastic"


# --------------------------------------------------------------------------- registry and factory
class DummyExecutor:  # replaced by an ExecutorBase subclass in the test (needs Data-Juicer)
    pass


def test_factory_resolves_registered_executors_and_keeps_builtins(monkeypatch):
    from data_juicer.core.executor import DefaultExecutor, RayExecutor
    from data_juicer.core.executor.base import ExecutorBase
    from data_juicer.core.executor.factory import ExecutorFactory

    from data_juicer_elastic.plugin import registry
    from data_juicer_elastic.plugin.executor import ElasticShardExecutor

    assert ExecutorFactory.create_executor("elastic_shard") is ElasticShardExecutor
    assert ExecutorFactory.create_executor("default") is DefaultExecutor
    assert ExecutorFactory.create_executor("ray") is RayExecutor
    with pytest.raises(ValueError):
        ExecutorFactory.create_executor("no_such_executor")

    class Dummy(ExecutorBase):
        def __init__(self, cfg=None):
            self.cfg = cfg

        def run(self, load_data_np=None, skip_return=False):
            return None

    monkeypatch.setattr(sys.modules[__name__], "DummyExecutor", Dummy)
    fake = {
        "dummy": EntryPoint("dummy", f"{__name__}:DummyExecutor", registry.GROUP),
        "bogus": EntryPoint("bogus", "os:path", registry.GROUP),
    }
    monkeypatch.setattr(registry, "_entry_points", lambda: fake)
    assert registry.names() == ["bogus", "dummy"]
    assert ExecutorFactory.create_executor("dummy") is Dummy
    with pytest.raises(TypeError, match="not an ExecutorBase subclass"):
        ExecutorFactory.create_executor("bogus")
    from data_juicer.config.config import build_base_parser

    parser = build_base_parser()
    choices = next(a.choices for a in parser._actions if a.dest == "executor_type")
    assert {"default", "ray", "ray_partitioned", "dummy", "bogus"} <= set(choices)


# --------------------------------------------------------------------------- schema
def test_elastic_shard_keys_are_typed(tmp_path, parse):
    from data_juicer.config.config import build_base_parser

    parser = build_base_parser()
    assert "elastic_shard" in next(a.choices for a in parser._actions if a.dest == "executor_type")
    ok = parser.parse_args(["--auto", "--elastic_shard.num_shards", "8", "--elastic_shard.max_retries", "0"])
    assert ok.elastic_shard.num_shards == 8 and ok.elastic_shard.max_retries == 0
    assert ok.elastic_shard.ray_address == "local" and ok.elastic_shard.wait_timeout_secs == 3600
    assert parser.parse_args(["--auto", "--elastic_shard.num_shards", "auto"]).elastic_shard.num_shards == "auto"
    assert (ok.elastic_shard.speculation, ok.elastic_shard.speculation_quantile) == (True, 0.75)
    off = parser.parse_args(
        ["--auto", "--elastic_shard.speculation", "false", "--elastic_shard.speculation_min_secs", "5"]
    )
    assert off.elastic_shard.speculation is False and off.elastic_shard.speculation_min_secs == 5
    for bad in (
        ["--elastic_shard.speculation_quantile", "1.5"],
        ["--elastic_shard.speculation_multiplier", "0"],
        ["--elastic_shard.speculation_min_secs", "-1"],
        ["--elastic_shard.num_shards", "0"],
        ["--elastic_shard.num_shards", "many"],
        ["--elastic_shard.lock_timeout_secs", "-1"],
        ["--elastic_shard.max_retries", "-1"],
        ["--elastic_shard.require_all_nodes", "maybe"],
        ["--elastic_shard.no_such_key", "1"],
    ):
        with pytest.raises(SystemExit) as exc:
            parser.parse_args(["--auto", *bad])
        assert exc.value.code == 2, bad


# --------------------------------------------------------------------------- validation
def test_validation_names_every_offending_op(tmp_path, parse):
    recipe = write_recipe(
        tmp_path / "r.yaml",
        dataset_path=str(REPO / "demos/data/text"),
        export_path=str(tmp_path / "o/out.jsonl"),
        executor_type="elastic_shard",
        elastic_shard={"job_dir": str(tmp_path / "job")},
        process=[
            {"whitespace_normalization_mapper": None},
            {"document_minhash_deduplicator": {"num_bands": 4}},
            {"document_line_deduplicator": None},
            {"random_selector": {"select_num": 3}},
            {"naive_grouper": None},
            {"meta_tags_aggregator": {"meta_tag_key": "x"}},
            {"ray_repartition_pipeline": None},
            {"text_length_filter": {"min_len": 3, "stats_export_path": str(tmp_path / "stats.jsonl")}},
            {
                "general_fused_op": {
                    "fused_op_list": [{"clean_email_mapper": None}, {"document_simhash_deduplicator": None}]
                }
            },
            {
                "fused_sequential_batch_op": {
                    "op_specs": [{"class_name": "topk_specified_field_selector", "kwargs": {}}]
                }
            },
            {"no_such_mapper": None},
            {"words_num_filter": {"lang": "en", "tokenization": False}},
        ],
    )
    with pytest.raises(UserError) as exc:
        parse("--config", str(recipe))
    message = str(exc.value)
    for where in (
        "process[1] document_minhash_deduplicator: give both num_bands and num_rows_per_band (missing: "
        "num_rows_per_band)",
        "process[2] document_line_deduplicator: has no staged form yet; the deduplicators that run here: "
        "document_deduplicator, document_minhash_deduplicator,",
        "process[3] random_selector",
        "process[4] naive_grouper",
        "process[5] meta_tags_aggregator",
        "process[6] ray_repartition_pipeline",
        "process[7] text_length_filter: stats_export_path",
        "process[8] general_fused_op > fused_op_list[1] document_simhash_deduplicator",
        "process[9] fused_sequential_batch_op > op_specs[0] topk_specified_field_selector",
        "process[10] no_such_mapper: unknown operator",
    ):
        assert where in message, where
    assert "process[0]" not in message and "process[11]" not in message
    assert str(recipe) in message
    assert not (tmp_path / "o").exists() and not (tmp_path / "job").exists()


@pytest.mark.parametrize(
    "change, expected",
    [
        ({"elastic_shard": {}}, "elastic_shard.job_dir is not set"),
        ({"elastic_shard": {"job_dir": "oss://bucket/jobs/run-1"}}, r"is a URL of a kind .* s3://bucket/prefix"),
        ({"dataset_path": "gs://bucket/data.jsonl"}, r"is remote; .* or JSONL on S3"),
        ({"dataset_path": "s3://key:secret@bucket/data.jsonl"}, r"s3://bucket/\.\.\.: the URL holds credentials"),
        ({"dataset_path": "/nonexistent/data.jsonl"}, "does not exist"),
        ({"dataset_path": str(REPO / "setup.cfg")}, "is not JSONL"),
        ({"dataset_path": "", "dataset": {"configs": [{"type": "local", "path": "x.jsonl"}]}}, "dataset / generated"),
        ({"export_path": "/tmp/out.csv"}, "must be a file ending in .jsonl or .parquet"),
        ({"export_path": "gs://bucket/out.jsonl"}, "export_path 'gs://bucket/out.jsonl' is remote"),
        ({"export_shard_size": 1 << 20}, "export_shard_size is not supported"),
        ({"elastic_shard": {"job_dir": "/tmp/j", "heartbeat_secs": 60, "lock_timeout_secs": 30}}, "must be below"),
    ],
)
def test_validation_of_paths_and_settings(tmp_path, parse, change, expected):
    with pytest.raises(UserError, match=expected):
        parse("--config", str(one_op_recipe(tmp_path, **change)))


def test_an_s3_dataset_path_passes_validation_and_stays_a_url_in_the_snapshot(tmp_path, parse):
    """Whether the object exists is the store's to say, at prepare; the snapshot keeps the URL as written."""
    from data_juicer_elastic.plugin import snapshot_of

    cfg = parse("--config", str(one_op_recipe(tmp_path, dataset_path="s3://bucket/in/")))
    assert yaml.safe_load(snapshot_of(cfg))["dataset_path"] == "s3://bucket/in/"


def one_op_recipe(tmp_path: Path, **change) -> Path:
    """A valid elastic_shard recipe of one mapper (job dir ``tmp_path/job``), with ``change`` applied."""
    recipe = {
        "dataset_path": str(REPO / "demos/data/text"),
        "export_path": str(tmp_path / "out.jsonl"),
        "executor_type": "elastic_shard",
        "elastic_shard": {"job_dir": str(tmp_path / "job")},
        "process": [{"whitespace_normalization_mapper": None}],
        **change,
    }
    return write_recipe(tmp_path / "r.yaml", **recipe)


def test_a_job_dir_on_an_object_store_mount_is_refused_at_parse_time(tmp_path, parse, monkeypatch):
    """The parse-time check reads the mount table (here a fake one, through the test-only variable)."""
    from data_juicer_elastic.storage.mounts import MOUNTINFO_ENV

    mountinfo = tmp_path / "mountinfo"
    root, bucket = "22 1 8:1 / / rw - ext4 /dev/sda1 rw", f"30 22 0:50 / {tmp_path.resolve()} rw - fuse.s3fs s3fs rw"
    mountinfo.write_text(f"{root}\n{bucket}\n")
    monkeypatch.setenv(MOUNTINFO_ENV, str(mountinfo))
    with pytest.raises(UserError, match=rf"elastic_shard.job_dir {tmp_path / 'job'} is on a fuse.s3fs mount"):
        parse("--config", str(one_op_recipe(tmp_path)))
    assert not (tmp_path / "job").exists()


def test_deduplicators_with_a_staged_form_are_accepted(tmp_path, parse):
    """Each deduplicator of dedup/plan.py parses as an op of process (tests/test_dedup_job.py runs them)."""
    minhash = {"num_bands": 4, "num_rows_per_band": 8, "num_permutations": 32}
    recipe = one_op_recipe(
        tmp_path,
        process=[
            {"whitespace_normalization_mapper": None},
            {"document_deduplicator": None},
            {"ray_document_deduplicator": None},
            {"document_minhash_deduplicator": minhash},
            {"ray_bts_minhash_deduplicator": minhash},
            {"text_length_filter": {"min_len": 3}},
        ],
    )
    cfg = parse("--config", str(recipe))
    assert [next(iter(op)) for op in cfg.process][1:5] == [
        "document_deduplicator",
        "ray_document_deduplicator",
        "document_minhash_deduplicator",
        "ray_bts_minhash_deduplicator",
    ]


def test_other_executor_types_are_not_validated(tmp_path, parse):
    recipe = write_recipe(
        tmp_path / "r.yaml",
        dataset_path=str(REPO / "demos/data/text"),
        export_path=str(tmp_path / "out.parquet"),
        executor_type="default",
        process=[{"document_deduplicator": None}],
    )
    cfg = parse("--config", str(recipe))
    from data_juicer_elastic.plugin import snapshot_of

    assert cfg.executor_type == "default" and snapshot_of(cfg) is None


def test_recipe_keys(parse, tmp_path):
    from jsonargparse import Namespace

    from data_juicer_elastic.plugin import recipe_keys

    cfg = Namespace(
        image_key="imgs",
        audio_key="audios",
        video_key="imgs",
        process=[
            {"clean_email_mapper": {"index_key": "row_id"}},
            {
                "general_fused_op": {
                    "fused_op_list": [
                        {"text_length_filter": {"index_key": "idx"}},
                        {"clean_links_mapper": {"index_key": "row_id"}},
                    ]
                }
            },
            {
                "fused_sequential_batch_op": {
                    "op_specs": [{"class_name": "clean_html_mapper", "kwargs": {"index_key": "k"}}]
                }
            },
            {"whitespace_normalization_mapper": None},
        ],
    )
    keys = recipe_keys(cfg)
    assert keys.media_keys == ("imgs", "audios")
    assert keys.index_keys == ("row_id", "idx", "k")


# --------------------------------------------------------------------------- shipped configs and the snapshot
@pytest.mark.parametrize("name", ["demo.yaml", "gpu_demo.yaml", "gpu_demo_4gpu.yaml"])
def test_shipped_configs_parse_and_validate(parse, name):
    cfg = parse("--config", f"configs/{name}")
    from data_juicer_elastic.plugin import recipe_keys, settings_from_cfg, snapshot_of

    assert cfg.executor_type == "elastic_shard" and snapshot_of(cfg)
    assert settings_from_cfg(cfg).job_dir
    ops = {next(iter(op)): next(iter(op.values())) for op in cfg.process}
    if name.startswith("gpu_demo"):
        assert list(ops) == [
            "whitespace_normalization_mapper",
            "query_sentiment_detection_mapper",
            "query_topic_detection_mapper",
            "text_pair_similarity_filter",
            "text_length_filter",
        ]
        gpu_ops = [n for n in ops if n not in ("whitespace_normalization_mapper", "text_length_filter")]
        for op in gpu_ops:
            assert ops[op]["num_gpus"] == 0.3 and ops[op].get("ray_execution_mode") is None  # Data-Juicer's actors
            assert ops[op]["num_proc"] == (4 if name == "gpu_demo_4gpu.yaml" else 1)
        assert "clip-vit-base-patch32" in ops["text_pair_similarity_filter"]["hf_clip"]
        assert ops["text_pair_similarity_filter"]["text_key_second"] == "target_text"
        if name == "gpu_demo_4gpu.yaml":
            assert cfg.override_num_blocks == 4
            assert all(ops[op]["batch_size"] == 1 for op in gpu_ops)
    assert recipe_keys(cfg).index_keys == ()


def test_snapshot_is_deterministic_node_independent_and_includes_cli_overrides(parse):
    args = (
        "--config",
        "configs/demo.yaml",
        "--text_length_filter.min_len",
        "33",
        "--elastic_shard.num_shards",
        "7",
        "--np",
        "1",
    )
    from data_juicer_elastic.plugin import settings_from_cfg, snapshot_of

    first = parse(*args)
    second = parse(*args)
    text = snapshot_of(first)
    assert text == snapshot_of(second)
    assert settings_from_cfg(first).num_shards == 7
    recipe = yaml.safe_load(text)
    assert recipe["executor_type"] == "ray" and "elastic_shard" not in recipe
    assert recipe["np"] == 1
    assert recipe["dataset_path"] == str(REPO / "demos/data/text")
    assert recipe["export_path"] == str(REPO / "outputs/demo/demo.jsonl")
    ops = [next(iter(op)) for op in recipe["process"]]
    assert ops[:2] == ["whitespace_normalization_mapper", "punctuation_normalization_mapper"]
    assert recipe["process"][4] == {"text_length_filter": {"min_len": 33, "max_len": 5000}}
    for derived in ("job_id", "work_dir", "event_log_dir", "ds_cache_dir", "config", "partition"):
        assert derived not in recipe
    assert "work_dir" not in text and "num_proc" not in text


def test_other_data_juicer_versions_are_left_alone_unless_elastic_shard_is_asked_for(tmp_path):
    recipe = write_recipe(tmp_path / "r.yaml", executor_type="elastic_shard", elastic_shard={"job_dir": "/x"})
    probe = """
import sys, data_juicer
data_juicer.__version__ = "1.7.0"
sys.argv = ["dj-process", *sys.argv[1:]]
try:
    import data_juicer.config.config as c
    print("imported", getattr(c, "__dj_elastic_patched__", False))
except SystemExit as exc:
    print("exit", exc.code)
"""
    asked = subprocess.run(
        [PYTHON, "-c", probe, "--config", str(recipe)],
        capture_output=True,
        text=True,
        env={**os.environ, **QUIET_ENV},
        timeout=120,
    )
    assert asked.stdout.split() == ["exit", "2"], asked.stdout + asked.stderr[-2000:]
    assert "needs Data-Juicer 1.6.x, found 1.7.0" in asked.stderr
    other = write_recipe(tmp_path / "o.yaml", executor_type="default")
    plain = subprocess.run(
        [PYTHON, "-c", probe, "--config", str(other)],
        capture_output=True,
        text=True,
        env={**os.environ, **QUIET_ENV},
        timeout=120,
    )
    assert plain.stdout.split() == ["imported", "False"], plain.stdout + plain.stderr[-2000:]


def test_auto_num_shards_sizes_the_files_prepare_reads(tmp_path, monkeypatch):
    """A linked input folder and file count, a job dir inside the dataset does not: as prepare reads them."""
    from data_juicer_elastic.plugin import executor
    from data_juicer_elastic.prepare.inputs import discover

    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "deep").mkdir(parents=True)
    (elsewhere / "deep" / "b.jsonl").write_bytes(b'{"text": "b"}\n' * 300)
    (elsewhere / "c.jsonl").write_bytes(b'{"text": "c"}\n' * 200)
    data = tmp_path / "data"
    (data / "job" / "shards").mkdir(parents=True)
    (data / "a.jsonl").write_bytes(b'{"text": "a"}\n' * 100)
    (data / "linked").symlink_to(elsewhere / "deep", target_is_directory=True)
    (data / "c.jsonl").symlink_to(elsewhere / "c.jsonl")
    (data / "job" / "shards" / "part-00000-of-00001.jsonl").write_bytes(b'{"text": "x"}\n' * 1000)

    read = discover(str(data), exclude=(str(data / "job"),)).inputs
    assert sorted(s.rel for s in read) == ["a.jsonl", "c.jsonl", "linked/b.jsonl"]
    assert executor.input_bytes(str(data), str(data / "job")) == 14 * 600 == sum(s.seen.size for s in read)
    monkeypatch.setattr(executor, "AUTO_SHARD_BYTES", 14 * 100)
    assert executor.auto_num_shards(str(data), None, str(data / "job")) == 6


# --------------------------------------------------------------------------- other executors as shipped
LOGURU_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ \| (\w+)\s*\| ([\w.<>]+:[\w<>]+) - (.*)$", re.M)
CAUGHT = re.compile(r"An error has been caught in function '([^']+)'")


def _shape(console: str) -> dict:
    """What a plain run's console is made of, without times, pids and paths: where each of Data-Juicer's
    log lines comes from, the config table's keys, what ``main``'s ``logger.catch`` says, the last line."""
    return {
        "log": [(level, where) for level, where, _ in LOGURU_LINE.findall(console)],
        "table": re.findall(r"^│ (\S+)", console, re.M),
        "caught": CAUGHT.findall(console),
        "error": console.strip().splitlines()[-1],
    }


@pytest.mark.slow
def test_a_failing_plain_ray_run_looks_as_shipped(tmp_path):
    """Issue 24: with another executor the installed plugin leaves Data-Juicer's output and log as shipped.

    The same failing ``executor_type: ray`` recipe (an op's text_key the data does not have, which
    Data-Juicer's preflight refuses inside RayExecutor.run) runs with the plugin active and switched off.
    """
    from tests.reference import dj_process, write_jsonl

    write_jsonl(tmp_path / "data.jsonl", [{"text": f"row {i} text"} for i in range(4)])
    shapes, written = {}, {}
    for label, env in (("plugin", {}), ("disabled", {"DJ_ELASTIC_DISABLE": "1"})):
        recipe = write_recipe(
            tmp_path / f"{label}.yaml",
            project_name="failing",
            dataset_path=str(tmp_path / "data.jsonl"),
            export_path=str(tmp_path / label / "out.jsonl"),
            executor_type="ray",
            ray_address="local",
            np=1,
            process=[{"text_length_filter": {"min_len": 3, "text_key": "no_such_key"}}],
        )
        out = dj_process("--config", str(recipe), cwd=tmp_path, env=env)
        console = out.stdout + out.stderr
        assert out.returncode == 1, console[-3000:]
        assert "no_such_key" in console and "data_juicer_elastic" not in console, console[-3000:]
        shapes[label] = _shape(console)
        files = (p.relative_to(tmp_path / label) for p in (tmp_path / label).rglob("*") if p.is_file())
        job_id = re.compile(r"\d{8}_\d{6}_[0-9a-f]{6}")  # Data-Juicer's work dir: time and a random part
        written[label] = sorted(re.sub(r"\d", "#", job_id.sub("JOB", str(f))).replace(label, "RECIPE") for f in files)
    assert shapes["plugin"]["caught"] == ["<module>"]  # main's logger.catch sees dj-process's own frame
    assert shapes["plugin"]["log"] and shapes["plugin"]["table"]
    assert shapes["plugin"] == shapes["disabled"]
    assert written["plugin"] == written["disabled"]
