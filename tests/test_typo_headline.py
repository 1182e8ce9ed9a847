"""A typo is not headlined as a recipe that cannot run shard by shard (issue 44): "cannot run with
executor_type elastic_shard" is for ops refused for their kind; an argument typo or a top-level key typo is
named on its own, with the recipe file, so the user fixes the word instead of changing executors."""

from __future__ import annotations

import pytest

from .test_plugin import REPO, parse, write_recipe  # noqa: F401 (parse: a fixture)
from .test_second_week_messages import refusal

HEADLINE = "this recipe cannot run with executor_type elastic_shard"


def test_an_op_argument_typo_is_headlined_by_the_file_and_the_argument(tmp_path, parse) -> None:  # noqa: F811
    message = refusal(tmp_path, parse, process=[{"text_length_filter": {"min_lenn": 10}}])
    first = message.splitlines()[0]
    assert HEADLINE not in message, message
    assert first.startswith(f"{tmp_path / 'r.yaml'}: process[0] text_length_filter: Unknown parameter 'min_lenn'")
    assert "did you mean: min_len" in first, message


def test_several_typos_are_listed_under_their_count(tmp_path, parse) -> None:  # noqa: F811
    process = [{"text_length_filter": {"min_lenn": 10}}, {"whitespace_normalisation_mapper": None}]
    message = refusal(tmp_path, parse, process=process)
    assert HEADLINE not in message and message.splitlines()[0] == f"{tmp_path / 'r.yaml'}: 2 problems:", message
    assert "min_lenn" in message and "process[1] whitespace_normalisation_mapper: unknown operator" in message


def test_an_op_refused_for_its_kind_keeps_the_headline(tmp_path, parse) -> None:  # noqa: F811
    message = refusal(tmp_path, parse, process=[{"document_line_deduplicator": None}])  # no staged form
    assert message.splitlines()[0] == f"{tmp_path / 'r.yaml'}: {HEADLINE}:", message
    assert "process[0] document_line_deduplicator" in message


def test_a_top_level_key_typo_is_named_not_headlined_as_unrunnable(tmp_path, parse, capsys) -> None:  # noqa: F811
    recipe = write_recipe(
        tmp_path / "r.yaml",
        dataset_path=str(REPO / "demos/data/text"),
        export_path=str(tmp_path / "out.jsonl"),
        exporter_type="jsonl",
        executor_type="elastic_shard",
        elastic_shard={"job_dir": str(tmp_path / "job")},
        process=[{"whitespace_normalization_mapper": None}],
    )
    with pytest.raises(SystemExit) as exc:
        parse("--config", str(recipe))
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "exporter_type" in err and HEADLINE not in err, err
    assert "Traceback" not in err, err
