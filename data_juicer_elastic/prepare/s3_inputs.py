"""Input discovery on S3: ``s3://bucket/key`` (one object) or ``s3://bucket/prefix/`` (the JSONL objects under it).

The same rules as a local dataset (prepare.inputs), so the same bytes give
the same inputs in the same order: a key that names an object is a file
input; otherwise the keys under ``key/`` are a folder, taken by their path
relative to it, sorted, ``*.jsonl`` only (other names are listed as skipped,
hidden ones left out silently). Each object is fingerprinted by its size and
ETag (a HEAD or the listing); only the URL, the size and the ETag are
recorded. Compressed JSONL and Parquet objects are refused by name: they are
not read from S3 yet.
"""

from __future__ import annotations

import posixpath

from data_juicer_elastic.errors import UserError
from data_juicer_elastic.prepare.inputs import PARQUET, STAGING_MARK, Dataset, Fingerprint, InputSpec, codec_of
from data_juicer_elastic.prepare.source import S3_SCHEME, s3_objects, split_s3_url
from data_juicer_elastic.storage.s3 import ObjectInfo

NOT_YET = {
    "gz": "compressed JSONL (.jsonl.gz)",
    "zst": "compressed JSONL (.jsonl.zst)",
    PARQUET: "Parquet",
}


def discover_s3(url: str) -> Dataset:
    """The inputs a dataset URL names; UserError (exit 2) naming the URL when there are none or one is refused."""
    bucket, key = split_s3_url(url)
    objects = s3_objects()
    if key and not key.endswith("/"):
        info = objects.head(bucket, key)
        if info is not None:
            return Dataset(url, "file", (_spec(bucket, info, posixpath.basename(key), posixpath.dirname(key)),))
    prefix = key if not key or key.endswith("/") else key + "/"
    found: list[InputSpec] = []
    skipped: list[str] = []
    listed = False
    for info in objects.list(bucket, prefix):
        listed = True
        rel = info.key[len(prefix) :]
        if not rel or rel.endswith("/") or any(STAGING_MARK in part for part in rel.split("/")):
            continue  # a folder marker, or a prepare's staging folder
        matched, _ = codec_of(rel)
        if matched:
            found.append(_spec(bucket, info, rel, prefix.rstrip("/")))
        elif not posixpath.basename(rel).startswith("."):
            skipped.append(rel)
    if not found:
        if not listed:
            raise UserError(
                f"{url}: does not exist (no object at this key and none under it at {objects.endpoint}); "
                "fix the bucket or key"
            )
        raise UserError(
            f"{url}: no *.jsonl objects found under it (searched recursively); name the input objects *.jsonl "
            "or pass the object itself"
        )
    found.sort(key=lambda s: s.rel)
    return Dataset(url, "dir", tuple(found), tuple(sorted(skipped)))


def fingerprint_s3(url: str) -> Fingerprint:
    """The object's size and ETag now (one HEAD); UserError when it is gone."""
    bucket, key = split_s3_url(url)
    info = s3_objects().head(bucket, key)
    if info is None:
        raise UserError(f"{url}: does not exist any more; put it back, then prepare again")
    return _fingerprint(info)


def _fingerprint(info: ObjectInfo) -> Fingerprint:
    return Fingerprint(info.size, 0, 0, 0, info.etag)


def _spec(bucket: str, info: ObjectInfo, rel: str, folder: str) -> InputSpec:
    url = f"{S3_SCHEME}{bucket}/{info.key}"
    _, codec = codec_of(rel)
    if codec is not None:
        raise UserError(
            f"{url}: {NOT_YET[codec]} input on S3 is not supported yet; elastic_shard reads plain *.jsonl "
            "objects from S3: store it as plain JSONL, or copy it to a local or shared folder and pass that path"
        )
    if info.size == 0:
        raise UserError(f"{url}: empty object; add rows (one JSON object per line) or remove it")
    media_base = f"{S3_SCHEME}{bucket}/{folder}".rstrip("/")
    return InputSpec(rel=rel, path=url, codec=None, media_base=media_base, seen=_fingerprint(info))
