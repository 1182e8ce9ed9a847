"""Issue 37, "a user's second week": what ``--help`` and argument errors say."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from data_juicer_elastic.cli import _parser, main

from .jobs import REPO, env_with


def help_of(*command: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "data_juicer_elastic.cli", *command, "--help"],
        cwd=REPO,
        env=env_with(COLUMNS="200"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def options(text: str) -> dict[str, str]:
    """option -> its help text (wrapped lines joined)."""
    found: dict[str, str] = {}
    current = None
    for line in text.splitlines():
        m = re.match(r"\s{2}(?:ARG:\s+)?(--[\w.-]+)(?: [A-Z_]+)?\s*(.*)", line)
        if m:
            current = m.group(1)
            found[current] = m.group(2).strip()
        elif current and line.startswith(" " * 10):
            found[current] = (found[current] + " " + line.strip()).strip()
    return found


@pytest.mark.parametrize("command", ["prepare", "worker", "status", "retry", "merge", "verify", "run", "report"])
def test_every_option_says_what_it_is_and_names_its_default_once(command):
    helps = options(help_of(command))
    assert helps, helps
    for option, text in helps.items():
        if option == "--help" or (command == "retry" and option != "--job-dir"):
            continue  # retry's own options are someone else's (issue 37)
        assert not text.startswith("("), f"{command} {option}: no description: {text!r}"
        assert text.count("default:") <= 1, f"{command} {option}: {text!r}"


def test_report_output_names_where_the_report_is_written():
    text = options(help_of("report"))["--output"]
    assert "generations" in text and "<job-dir>/report.html" not in text, text


def test_a_missing_option_is_named_as_typed(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["status"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--job-dir" in err and "status.job_dir" not in err, err
    assert _parser() is not None


def test_dj_process_help_names_executor_types_type():
    out = subprocess.run(
        [sys.executable, "-m", "data_juicer.tools.process_data", "--help"],
        cwd=REPO,
        env=env_with(COLUMNS="200"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    text = options(out.stdout)["--executor_type"]
    assert "lambda" not in text and "(type: str, default: default)" in text, text
