"""The check an attempt's output passes before it may be published as done."""

from __future__ import annotations

import hashlib

import pytest

from data_juicer_elastic.errors import IntegrityError
from data_juicer_elastic.storage.blocks import BLOCK
from data_juicer_elastic.worker.outputs import inspect_output


@pytest.mark.parametrize(
    "data, line",
    [
        (b'{"a": [1\n2]}, {"b": 1}\n', 1),  # two lines that only parse when joined with a comma
        (b'{"a": 1}\n[1, 2]\n', 2),
        (b'{"a": 1}\n\n{"b": 2}\n', 2),
        (b'{"a": 1}\n"text"\n', 2),
        (b'{"a": 1}{"b": 2}\n', 1),
        (b'{"a": "\xff"}\n', 1),
        (b'{"a": 1}\n{"b": 2}', 2),  # no final newline: truncated
    ],
)
def test_a_line_that_is_not_one_object_is_refused_by_line(tmp_path, data, line):
    path = tmp_path / "processed.jsonl"
    path.write_bytes(data)
    with pytest.raises(IntegrityError, match=rf"processed\.jsonl:{line}: "):
        inspect_output(path)


def test_rows_bytes_and_sha256_across_block_boundaries(tmp_path):
    row = b'{"text": "' + b"x" * 1000 + b'"}\n'
    data = row * (2 * BLOCK // len(row) + 7)  # lines straddle the block boundaries
    path = tmp_path / "processed.jsonl"
    path.write_bytes(data)
    digest = inspect_output(path)
    assert (digest.rows, digest.bytes, digest.sha256) == (
        data.count(b"\n"),
        len(data),
        hashlib.sha256(data).hexdigest(),
    )


def test_an_empty_output_is_zero_rows(tmp_path):
    path = tmp_path / "processed.jsonl"
    path.write_bytes(b"")
    assert inspect_output(path).rows == 0
