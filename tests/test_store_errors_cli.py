"""Store and network errors at the CLI boundary (issue 44): one line on stderr and exit 2 (never a
traceback, never 1, which status and verify use for "still running")."""

from __future__ import annotations

import os
import socket

import pytest

from data_juicer_elastic.cli import main


@pytest.mark.parametrize(
    "command", [["status"], ["verify"], ["retry", "--all-failed"], ["merge", "--output", "out.jsonl"]]
)
def test_an_unreachable_endpoint_is_one_line_and_exit_2(command, monkeypatch, capsys, tmp_path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(os, "environ", dict(os.environ))  # --endpoint-url is applied to the environment
    for key, value in {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_MAX_ATTEMPTS": "1"}.items():
        os.environ[key] = value
    url = f"http://127.0.0.1:{port}"
    rc = main([command[0], "--job-dir", "s3://bucket/x", "--endpoint-url", url, *command[1:]])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert url in err[0] and "check" in err[0] and "Traceback" not in err[0]
