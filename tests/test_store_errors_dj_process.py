"""Store and network errors at ``dj-process``'s boundary (issue 44): one line on stderr naming the endpoint
and where it is set, exit 2, no traceback, as ``dj-elastic`` does (tests/test_store_errors_cli.py)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from .reference import dj_process, write_jsonl

pytest.importorskip("boto3")


@pytest.mark.slow
def test_dj_process_on_an_unreachable_endpoint_is_one_line_and_exit_2(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    url = f"http://127.0.0.1:{port}"
    write_jsonl(tmp_path / "in.jsonl", [{"text": "a  b"}, {"text": "c"}])
    (tmp_path / "recipe.yaml").write_text(
        "dataset_path: in.jsonl\nexport_path: out.jsonl\nnp: 1\nexecutor_type: elastic_shard\n"
        f"elastic_shard:\n  job_dir: s3://bucket/job\n  storage:\n    endpoint_url: {url}\n"
        "process:\n  - whitespace_normalization_mapper:\n"
    )
    env = {
        "AWS_ACCESS_KEY_ID": "k",
        "AWS_SECRET_ACCESS_KEY": "s",
        "AWS_MAX_ATTEMPTS": "1",
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    }
    out = dj_process("--config", "recipe.yaml", cwd=tmp_path, env=env, timeout=300)
    text = out.stdout + out.stderr
    errors = [line for line in text.splitlines() if "error" in line.lower()]
    assert out.returncode == 2 and "Traceback" not in text, text[-3000:]
    assert len(errors) == 1 and errors[0].startswith("dj-process: error: "), text[-3000:]
    assert url in errors[0] and "elastic_shard.storage.endpoint_url" in errors[0], errors
    assert not (tmp_path / "out.jsonl").exists()
