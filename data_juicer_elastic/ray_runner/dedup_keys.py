"""Per-row dedup keys from the recipe's own deduplicator: Data-Juicer's ``compute_hash``, the recipe's arguments.

The keys are never re-derived here, so a Data-Juicer upgrade that changes tokenization or hashing changes ours
with it. What this adds is only the packing: exact keys as the md5's 16 raw bytes; MinHash keys as the band index
(4 bytes, big-endian) before the band's bytes, so equal values in different bands never meet.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from data_juicer_elastic.dedup import keyfile
from data_juicer_elastic.dedup.plan import DedupOp

BAND_BYTES = 4


def build_op(dedup: DedupOp) -> Any:
    """The op that makes the keys: for a ``ray_*`` variant its non-Ray twin (``dedup.builder``), through the op
    registry as ``load_ops`` builds it; building it also checks the arguments the way a run would."""
    import data_juicer.ops  # noqa: F401  (registers the ops)
    from data_juicer.ops.base_op import OPERATORS

    return OPERATORS.modules[dedup.builder](**dict(dedup.args))


def key_length(op: Any, kind: str) -> int:
    """Every key of one dedup has this length: 16 (md5) or band prefix plus ``rows_per_band`` u64 values."""
    if kind == "exact":
        return 16
    return BAND_BYTES + 8 * int(op.num_rows_per_band)


def row_keys(op: Any, kind: str, row: Mapping[str, Any]) -> list[bytes]:
    """The keys of one row, from ``op.compute_hash`` run on a copy (it skips rows that already hold a hash)."""
    from data_juicer.utils.constant import HashKeys

    sample = {k: v for k, v in row.items() if k not in (HashKeys.hash, HashKeys.minhash)}
    sample = op.compute_hash(sample)
    if kind == "exact":
        return [bytes.fromhex(sample[HashKeys.hash])]
    return [band.to_bytes(BAND_BYTES, "big") + bytes(value) for band, value in enumerate(sample[HashKeys.minhash])]


def shard_records(
    op: Any, kind: str, rows: Iterable[Mapping[str, Any]], indices: Iterable[int], buckets: int
) -> list[tuple[int, bytes, int]]:
    """One hash shard's (bucket, key, global index) records, for :func:`keyfile.encode`."""
    out: list[tuple[int, bytes, int]] = []
    for row, index in zip(rows, indices, strict=True):
        for key in row_keys(op, kind, row):
            out.append((keyfile.bucket_of(key, buckets), key, index))
    return out


def shard_keyfile(op: Any, kind: str, rows: Iterable[Mapping[str, Any]], indices: Iterable[int], buckets: int) -> bytes:
    """One hash shard's whole key file."""
    return keyfile.encode(shard_records(op, kind, rows, indices, buckets), buckets, key_length(op, kind))
