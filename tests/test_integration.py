"""End to end through the stock ``dj-process``: elastic_shard jobs against plain Ray runs.

Each recipe runs twice, as a real subprocess with its own Ray: once with
``executor_type: elastic_shard`` and once as one ``executor_type: ray`` run
of the user's own recipe file (the same YAML, executor_type changed, this
package switched off) over the whole input (the reference, tests/reference.py). The
merged output must hold the same rows with the same values, in input order,
except for what DESIGN.md invariant 6 allows: a key null on one side and
absent on the other, media paths made absolute, ``index_key`` holding the
global row index.
"""

from __future__ import annotations

import json
import os
import textwrap

import pytest
import yaml

from data_juicer_elastic.job.layout import JobDir

from .reference import (
    REPO,
    assert_matches_reference,
    dj_process,
    elastic_recipe,
    exploding_recipe,
    input_ids,
    meanwhile,
    read_rows,
    run_elastic,
    run_reference,
    write_jsonl,
)

pytestmark = pytest.mark.slow


# --------------------------------------------------------------------------- recipe 1: index_key, CLI overrides
@pytest.fixture(scope="module")
def index_job(tmp_path_factory):
    """demos/data/text (nested folders, ints and floats in one column, nested structs) with an index_key op."""
    tmp = tmp_path_factory.mktemp("index")
    data = tmp / "data"
    for src in (REPO / "demos/data/text").rglob("*.jsonl"):
        dest = data / src.relative_to(REPO / "demos/data/text")
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(src.read_bytes())
    config = elastic_recipe(
        tmp / "index.yaml",
        data,
        tmp / "out" / "merged.jsonl",
        tmp / "job",
        process=[
            {"whitespace_normalization_mapper": None},
            {"clean_email_mapper": {"index_key": "row_idx"}},
            {"clean_links_mapper": None},
            {"text_length_filter": {"min_len": 20}},
            {"words_num_filter": {"lang": "en", "tokenization": False, "min_num": 4}},
        ],
    )
    op_override = ("--text_length_filter.min_len", "40")
    with meanwhile(lambda: run_reference(config, tmp / "ref", cwd=tmp, overrides=op_override)) as reference:
        out = run_elastic(config, tmp, "--elastic_shard.num_shards", "3", *op_override)
    merged = read_rows(tmp / "out" / "merged.jsonl")
    return {
        "tmp": tmp,
        "config": config,
        "overrides": op_override,
        "data": data,
        "job": tmp / "job",
        "merged": merged,
        "reference": reference.result(),
        "log": out,
    }


def test_index_key_recipe_matches_one_ray_run(index_job):
    assert_matches_reference(
        index_job["merged"], index_job["reference"], input_ids(index_job["data"]), index_key="row_idx"
    )
    assert len(index_job["merged"]) > 100
    assert any(isinstance(r.get("score"), float) for r in index_job["merged"])


def test_command_line_overrides_are_honoured(index_job):
    manifest = json.loads((index_job["job"] / "manifest.json").read_text())
    assert manifest["policy"]["num_shards"] == 3 and len(manifest["shard_table"]["rows"]) == 3
    assert manifest["index_keys"] == ["row_idx"] and manifest["media_keys"] == ["images", "audios", "videos"]
    recipe = yaml.safe_load(JobDir(index_job["job"]).recipe_path.read_text())
    assert {"text_length_filter": {"min_len": 40}} in recipe["process"]
    assert all(len(r["text"]) >= 40 for r in index_job["merged"])
    for attempt in (index_job["job"] / "attempts").glob("*/*"):
        assert (attempt / "process.log").is_file() and (attempt / "processed.jsonl").is_file()
        assert not (attempt / "export.jsonl").exists()


def test_builtin_ray_executor_is_unchanged_by_the_plugin(index_job):
    """The reference above ran with the plugin switched off; the same run with it active gives the same rows."""
    active = index_job["tmp"] / "ref-active"
    plain = run_reference(
        index_job["config"], active, cwd=index_job["tmp"], overrides=index_job["overrides"], plugin=True
    )
    key = lambda r: r["id"]  # noqa: E731  (Ray does not promise an order without preserve_order)
    assert sorted(plain, key=key) == sorted(index_job["reference"], key=key)


# --------------------------------------------------------------------------- recipe 2: custom operators
CUSTOM_OPS = '''
from data_juicer.ops.base_op import OPERATORS, Filter, Mapper


@OPERATORS.register_module("dje_test_tag_mapper")
class DjeTestTagMapper(Mapper):
    """Adds a tag derived from the text (a new key)."""

    def process_single(self, sample):
        sample["tag"] = "len-mod-5-" + str(len(sample[self.text_key]) % 5)
        return sample


@OPERATORS.register_module("dje_test_odd_id_filter")
class DjeTestOddIdFilter(Filter):
    """Keeps rows with an odd id."""

    def compute_stats_single(self, sample):
        return sample

    def process_single(self, sample):
        return sample["id"] % 2 == 1
'''


def test_custom_operator_recipe_matches_one_ray_run(tmp_path):
    ops = tmp_path / "ops" / "dje_test_ops.py"
    ops.parent.mkdir()
    ops.write_text(textwrap.dedent(CUSTOM_OPS))
    data = tmp_path / "data.jsonl"  # a single file this time
    write_jsonl(data, [{"id": i, "text": f"sample number {i} " + "word " * (i % 13), "n": i * 3} for i in range(240)])
    config = elastic_recipe(
        tmp_path / "custom.yaml",
        data,
        tmp_path / "out" / "merged.jsonl",
        tmp_path / "job",
        process=[
            {"dje_test_tag_mapper": None},
            {"dje_test_odd_id_filter": None},
            {"text_length_filter": {"min_len": 25}},
        ],
        custom_operator_paths=["ops/dje_test_ops.py"],  # relative to the working directory, as Data-Juicer reads it
    )
    with meanwhile(lambda: run_reference(config, tmp_path / "ref", cwd=tmp_path)) as reference:
        run_elastic(config, tmp_path)
    merged = read_rows(tmp_path / "out" / "merged.jsonl")
    assert_matches_reference(merged, reference.result(), input_ids(data))
    assert merged and all(r["id"] % 2 == 1 and r["tag"].startswith("len-mod-5-") for r in merged)
    snapshot = yaml.safe_load(JobDir(tmp_path / "job").recipe_path.read_text())
    assert snapshot["custom_operator_paths"] == [str(ops)]


def test_a_value_error_in_an_op_fails_its_shard_at_the_first_attempt_and_the_job_exits_2(tmp_path):
    config = exploding_recipe(tmp_path)
    # retries allowed: a ValueError would recur on every attempt, so the shard fails at its first
    config.write_text(config.read_text().replace("max_retries: 0", "max_retries: 2"))
    out = dj_process("--config", str(config), cwd=tmp_path)
    assert out.returncode == 2, out.stderr[-3000:]
    assert "FAIL:" in out.stderr and "part-00000-of-00004" in out.stderr
    job = JobDir(tmp_path / "job")
    failed = json.loads(job.failed_path("part-00000-of-00004").read_text())
    assert "row 7 is cursed" in (job.root / failed["log"]).read_text()
    assert failed["failures"] == 1, failed
    assert [p.name for p in (job.attempts_dir / "part-00000-of-00004").iterdir()] == ["0001"], "it was retried"
    assert not (tmp_path / "out" / "merged.jsonl").exists()


# --------------------------------------------------------------------------- recipe 3: relative media paths
def test_relative_media_paths_in_a_nested_folder(tmp_path):
    from PIL import Image

    root = tmp_path / "data"
    sizes = {"img/big.png": (40, 30), "img/small.png": (6, 6), "sub/pics/wide.png": (64, 16)}
    for rel, size in sizes.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", size, (200, 30, 30)).save(root / rel)
    choices = [["img/big.png"], ["img/small.png"], ["sub/pics/wide.png", "img/big.png"], None, []]
    files = {"a.jsonl": range(0, 40), "sub/deep/b.jsonl": range(40, 90), "sub/c.jsonl": range(90, 120)}
    for rel, ids in files.items():
        rows = []
        for i in ids:
            row = {"id": i, "text": f"  caption {i}  "}
            if choices[i % 5] is not None:
                row["images"] = list(choices[i % 5])
            rows.append(row)
        write_jsonl(root / rel, rows)
    config = elastic_recipe(
        tmp_path / "media.yaml",
        root,
        tmp_path / "out" / "merged.jsonl",
        tmp_path / "job",
        process=[{"whitespace_normalization_mapper": None}, {"image_shape_filter": {"min_width": 10}}],
    )
    # The reference reads a copy whose media paths were made absolute against the dataset root, as the
    # default executor resolves them (a whole-folder Ray run resolves them against the folder's parent).
    ref_root = tmp_path / "ref-data"
    for rel in files:
        rows = read_rows(root / rel)
        for row in rows:
            if row.get("images"):
                row["images"] = [os.path.join(root, p) for p in row["images"]]
        write_jsonl(ref_root / rel, rows)
    with meanwhile(lambda: run_reference(config, tmp_path / "ref", cwd=tmp_path, dataset_path=ref_root)) as reference:
        run_elastic(config, tmp_path)
    merged = read_rows(tmp_path / "out" / "merged.jsonl")
    assert_matches_reference(merged, reference.result(), input_ids(root))
    with_images = [r for r in merged if r.get("images")]
    assert with_images and all(os.path.isabs(p) and os.path.exists(p) for r in with_images for p in r["images"])
    assert not any(str(root / "img/small.png") in (r.get("images") or []) for r in merged)


# --------------------------------------------------------------------------- refusals and the plugin switch
def test_global_ops_are_refused_by_name_and_nothing_is_written(tmp_path):
    config = elastic_recipe(
        tmp_path / "global.yaml",
        REPO / "demos/data/text",
        tmp_path / "out" / "merged.jsonl",
        tmp_path / "job",
        process=[
            {"whitespace_normalization_mapper": None},
            {"document_line_deduplicator": None},
            {"document_minhash_deduplicator": None},
            {"topk_specified_field_selector": {"field_key": "score"}},
            {"text_length_filter": {"min_len": 3, "stats_export_path": str(tmp_path / "stats.jsonl")}},
        ],
    )
    before = sorted(p.name for p in tmp_path.iterdir())
    out = dj_process("--config", str(config), cwd=tmp_path)
    assert out.returncode == 2, out.stderr[-3000:]
    for op in (
        "process[1] document_line_deduplicator",
        "process[2] document_minhash_deduplicator: give both num_bands and num_rows_per_band",
        "process[3] topk_specified_field_selector",
        "process[4] text_length_filter: stats_export_path",
    ):
        assert op in out.stderr
    assert "Traceback" not in out.stderr and "process[0]" not in out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_bad_elastic_shard_value_is_refused_by_the_parser(tmp_path):
    config = elastic_recipe(
        tmp_path / "bad.yaml",
        REPO / "demos/data/text",
        tmp_path / "out.jsonl",
        tmp_path / "job",
        process=[{"whitespace_normalization_mapper": None}],
    )
    recipe = yaml.safe_load(config.read_text())
    recipe["elastic_shard"]["num_shards"] = 0
    config.write_text(yaml.safe_dump(recipe))
    out = dj_process("--config", str(config), cwd=tmp_path)
    assert out.returncode == 2
    assert 'Parser key "elastic_shard.num_shards"' in out.stderr
    out = dj_process("--config", str(config), "--elastic_shard.num_shards", "two", cwd=tmp_path)
    assert out.returncode == 2 and "elastic_shard.num_shards" in out.stderr
    assert not (tmp_path / "job").exists()


def test_switched_off_plugin_leaves_data_juicer_as_shipped(tmp_path):
    config = elastic_recipe(
        tmp_path / "e.yaml",
        REPO / "demos/data/text",
        tmp_path / "out.jsonl",
        tmp_path / "job",
        process=[{"whitespace_normalization_mapper": None}],
    )
    with (
        meanwhile(lambda: dj_process("--help", cwd=tmp_path, env={"DJ_ELASTIC_DISABLE": "1"})) as off_help,
        meanwhile(lambda: dj_process("--help", cwd=tmp_path)) as on_help,
    ):
        out = dj_process("--config", str(config), cwd=tmp_path, env={"DJ_ELASTIC_DISABLE": "1"})
    assert out.returncode == 2 and "not among choices" in out.stderr and "elastic_shard" in out.stderr
    out = off_help.result()
    assert out.returncode == 0 and "elastic_shard" not in out.stdout
    out = on_help.result()
    assert out.returncode == 0 and "--elastic_shard.num_shards" in out.stdout


def test_default_executor_is_unchanged_by_the_plugin(tmp_path):
    def output(label: str, env: dict[str, str]) -> bytes:
        recipe = {
            "project_name": "default-check",
            "dataset_path": str(REPO / "demos/data/text/books.jsonl"),
            "export_path": str(tmp_path / label / "result.jsonl"),
            "np": 1,
            "process": [{"whitespace_normalization_mapper": None}, {"text_length_filter": {"min_len": 30}}],
        }
        config = tmp_path / f"{label}.yaml"
        config.write_text(yaml.safe_dump(recipe))
        out = dj_process("--config", str(config), cwd=tmp_path, env=env)
        assert out.returncode == 0, out.stderr[-3000:]
        return (tmp_path / label / "result.jsonl").read_bytes()

    with meanwhile(lambda: output("disabled", {"DJ_ELASTIC_DISABLE": "1"})) as disabled:
        plugin = output("plugin", {})
    assert plugin == disabled.result() and plugin
