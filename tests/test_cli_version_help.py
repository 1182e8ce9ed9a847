"""``dj-elastic --version`` and the help of the options that take data (issue 44): the versions a bug report
needs, read without importing Data-Juicer; help that names every format the code accepts."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version

import pytest

import data_juicer_elastic
from data_juicer_elastic.cli import main
from data_juicer_elastic.prepare.inputs import SUFFIXES

from .reference import REPO, env_with

SHOW = """
import sys
from data_juicer_elastic.cli import main
try:
    main(["--version"])
except SystemExit as exc:
    print("exit", exc.code, "data_juicer imported:", "data_juicer" in sys.modules)
"""


def test_version_names_both_packages_without_importing_data_juicer() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SHOW], cwd=REPO, env=env_with(), capture_output=True, text=True, timeout=120
    )
    expected = f"dj-elastic {data_juicer_elastic.__version__} (Data-Juicer {version('py-data-juicer')})"
    assert out.stdout.splitlines() == [expected, "exit 0 data_juicer imported: False"], out.stdout + out.stderr


def _help(command: str, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    return " ".join(capsys.readouterr().out.split())


def _option(text: str, option: str) -> str:
    """The help of one option: from its name to the next option's."""
    start = text.index(f"{option} {option[2:].upper().replace('-', '_')} ", text.index("options:"))
    end = text.find(" --", start + len(option) + 1)
    return text[start:end]


def test_prepare_dataset_path_help_names_every_input_format(capsys: pytest.CaptureFixture[str]) -> None:
    text = _option(_help("prepare", capsys), "--dataset-path")
    for suffix in SUFFIXES:  # what prepare.inputs.discover takes
        assert f"{suffix} " in text or f"{suffix}," in text, (suffix, text)
    assert "folder" in text and "s3://" in text and "local" in text, text


def test_merge_output_help_names_every_output_format(capsys: pytest.CaptureFixture[str]) -> None:
    text = _option(_help("merge", capsys), "--output")
    for what in (".parquet", "JSONL", "folder", "part files", "s3://", "local"):
        assert what in text, (what, text)
