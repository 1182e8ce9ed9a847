"""The merged output on an S3 store: ``export_path: s3://bucket/prefix/out.jsonl`` (or ``.parquet``, or a folder).

The job dir stays on POSIX; only the output moves. One file: the merge
streams the checked outputs into one multipart upload (``storage/s3_upload``)
completed once, so the object appears whole or not at all, and an object
already there is refused unless the merge may overwrite it (as the local
merge refuses an existing file). A Parquet file is written locally first
(the writer needs a file), then uploaded the same way. A folder: the local
folder export (``folder_export``: links, Parquet schemas unified) is staged
in the generation folder, then each part is put at ``<prefix>/<part>`` and
``_SUCCESS`` last, created once; a killed export resumes, keeping each part
whose size and sha256 metadata already match. The endpoint and credentials
are boto3's own chain (``AWS_ENDPOINT_URL``, ``AWS_PROFILE``, roles);
``merge.json`` records the URL, size and ETag and nothing of them.
``verify_export`` (``dj-elastic verify``) checks an export here against
merge.json as a local one is checked (``folder_export.check_recorded_*``),
reading by streamed ranged GETs.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from data_juicer_elastic.errors import UserError
from data_juicer_elastic.folder_export import PART_RE, SUCCESS, check_recorded_file, check_recorded_folder
from data_juicer_elastic.storage.blocks import BLOCK, FileDigest, blocks, digest_blocks
from data_juicer_elastic.storage.keys import normalise_prefix
from data_juicer_elastic.storage.urls import SCHEME, is_s3, split_s3

STAGING = "s3-export"  # the local folder export staged in the generation folder (links), removed after upload


def location(output: str) -> str:
    """The one spelling of an export path: ``s3://bucket/key`` (no trailing slash) or an absolute path."""
    if not is_s3(output):
        return os.path.abspath(output)
    bucket, key = _split(output)
    return f"{SCHEME}{bucket}/{key}"


def _split(url: str) -> tuple[str, str]:
    try:
        bucket, key = split_s3(url)
        key = normalise_prefix(key)
    except ValueError as exc:
        raise UserError(f"{url}: {exc}" if url not in str(exc) else str(exc)) from None
    if not key:
        raise UserError(f"{url}: an S3 export path is s3://bucket/key (a file) or s3://bucket/prefix/ (a folder)")
    return bucket, key


def store_of(url: str, folder: bool) -> tuple[Any, str]:
    """The store (``storage/s3.py``'s client) and the key within it: a file's parent prefix and its name,
    or a folder's prefix and ``""``."""
    from data_juicer_elastic.storage.store import store_for

    bucket, key = _split(url)
    parent, name = (key, "") if folder else (os.path.dirname(key), os.path.basename(key))
    return store_for(f"{SCHEME}{bucket}/{parent}"), name


@dataclass(frozen=True)
class Stamp:
    """What stands for an S3 output in merge.json (size and ETag of the object, or of a folder's ``_SUCCESS``)."""

    size: int
    etag: str
    version_id: str | None = None

    def record(self) -> dict[str, Any]:
        return {"size": self.size, "etag": self.etag}


def stamp_of(url: str, folder: bool) -> dict[str, Any] | None:
    """The current stamp of an exported object (one HEAD), or None when it is gone."""
    store, name = store_of(url, folder)
    meta = store.head(SUCCESS if folder else name)
    return None if meta is None else {"size": meta.size, "etag": meta.ver}


# --------------------------------------------------------------------------- one file
def open_upload(url: str, overwrite: bool, total: int) -> Any:
    """A ``MultipartWrite`` to ``url`` (stale uploads of a killed merge aborted first); an existing object is
    refused unless ``overwrite``, and replaced only if it is still the one seen here."""
    from data_juicer_elastic.storage.s3_upload import MultipartWrite, abort_stale_uploads, part_size_for

    store, name = store_of(url, folder=False)
    seen = store.head(name)
    if seen is not None and not overwrite:
        raise _exists(url)
    abort_stale_uploads(store, name)
    return MultipartWrite(store, name, seen.ver if seen else None, part_size_for(total))


def complete(upload: Any, url: str) -> Stamp:
    """Complete ``upload`` (the object appears whole, now); an object that appeared meanwhile is refused."""
    from data_juicer_elastic.storage.s3_upload import Refused

    try:
        done = upload.complete()
    except Refused as exc:
        raise UserError(
            f"{url}: another writer put an object there during this merge ({exc}); nothing was written"
        ) from exc
    return Stamp(done.size, done.etag, done.version_id)


def upload_local(path: Path, url: str, overwrite: bool, tick: Callable[[int], None] | None = None) -> Stamp:
    """A finished local file (the merged Parquet) uploaded whole to ``url``."""
    size = os.stat(path).st_size
    with open(path, "rb", buffering=0) as f, open_upload(url, overwrite, size) as up:
        for block in blocks(f, bytearray(BLOCK)):
            up.write(block)
            if tick is not None:
                tick(up.size)
        return complete(up, url)


def _exists(url: str) -> UserError:
    return UserError(
        f"{url}: already exists; pass --overwrite (or overwrite_output) to replace it, or choose another path"
    )


# --------------------------------------------------------------------------- folder
@dataclass
class FolderUpload:
    rows: int
    bytes: int
    uploaded: int
    kept: int
    stamp: Stamp


def staging_folder(gen_dir: Path) -> Path:
    return gen_dir / STAGING


def upload_folder(staged: Path, url: str, overwrite: bool, log: Callable[[str], Any]) -> FolderUpload:
    """Put a staged local folder export at the prefix ``url``: its parts, then ``_SUCCESS`` created once."""
    from data_juicer_elastic.storage.s3_upload import sha256_of, upload_file

    store, _ = store_of(url, folder=True)
    manifest_bytes = (staged / SUCCESS).read_bytes()
    manifest = orjson.loads(manifest_bytes)
    found = store.read(SUCCESS)
    if found is not None and found[0] == manifest_bytes and _parts_there(store, manifest):
        return _folder_result(manifest, 0, len(manifest["parts"]), Stamp(found[1].size, found[1].ver))
    if found is not None and not overwrite:
        raise UserError(
            f"{url}/: holds a complete export of other outputs; pass --overwrite (or overwrite_output) to "
            "replace it, or choose another prefix"
        )
    keys = [e.key for e in store.list("")]
    foreign = sorted(k for k in keys if k != SUCCESS and not PART_RE.match(k))
    if foreign:
        raise UserError(
            f"{url}/: holds keys that are not part files of an export ({', '.join(foreign[:3])}); "
            "export into an empty or new prefix"
        )
    if found is not None:
        store.delete(SUCCESS)  # from here on the prefix reads as incomplete until the new manifest is there
    uploaded = kept = 0
    for part in manifest["parts"]:
        name = part["file"]
        if sha256_of(store, name) == (part["bytes"], part["sha256"]):
            kept += 1  # put there by an earlier (killed) export
            continue
        upload_file(store, name, staged / name, part["sha256"])
        uploaded += 1
    wanted = {p["file"] for p in manifest["parts"]}
    for key in keys:
        if PART_RE.match(key) and key not in wanted:
            store.delete(key)
    meta = store.create(SUCCESS, manifest_bytes)
    if meta is None:
        raise UserError(f"{url}/: another export wrote {SUCCESS} during this one; nothing was replaced")
    log(f"{uploaded} part(s) uploaded to {url}/, {kept} already there")
    return _folder_result(manifest, uploaded, kept, Stamp(meta.size, meta.ver))


def _parts_there(store: Any, manifest: dict) -> bool:
    from data_juicer_elastic.storage.s3_upload import sha256_of

    return all(sha256_of(store, p["file"]) == (p["bytes"], p["sha256"]) for p in manifest["parts"])


def _folder_result(manifest: dict, uploaded: int, kept: int, stamp: Stamp) -> FolderUpload:
    return FolderUpload(manifest["rows"], manifest["bytes"], uploaded, kept, stamp)


def drop_staging(staged: Path) -> None:
    shutil.rmtree(staged, ignore_errors=True)


# --------------------------------------------------------------------------- verify
def verify_export(record: dict[str, Any]) -> list[str]:
    """The export merge.json names re-read (``dj-elastic verify``), as a local one is (``check_recorded_*``): the
    stamp (size and ETag, one HEAD) of a folder's ``_SUCCESS`` or of the one object against merge.json, then a
    folder's parts against its ``_SUCCESS``, or the object's rows and sha256, by streamed ranged GETs."""
    from data_juicer_elastic.storage.s3 import S3Objects

    url = record["output"]
    try:
        bucket, key = _split(url)
        objects = S3Objects()  # boto3's own chain, as the export used: AWS_ENDPOINT_URL, AWS_PROFILE, ...
        if record.get("kind") == "folder":
            return check_recorded_folder(
                _Prefix(url, objects, bucket, key), _head(objects, bucket, f"{key}/{SUCCESS}"), record
            )
        now = _head(objects, bucket, key)
        size = now["size"] if now else 0
        return check_recorded_file(now, record, lambda: digest_blocks(objects.blocks(bucket, key, 0, size, BLOCK)))
    except UserError as exc:  # names the URL and the endpoint, never a credential
        return [str(exc)]


def _head(objects: Any, bucket: str, key: str) -> dict[str, Any] | None:
    """The object's stamp as merge.json's ``output_stat`` holds it (``Stamp.record``); None when it is gone."""
    info = objects.head(bucket, key)
    return None if info is None else Stamp(info.size, info.etag).record()


@dataclass
class _Prefix:
    """A folder export under an s3:// prefix as ``check_export`` reads it: one LIST, then ranged GETs."""

    where: str
    objects: Any  # storage.s3.S3Objects
    bucket: str
    prefix: str
    listed: dict[str, int] | None = None  # name under the prefix -> size

    def _listing(self) -> dict[str, int]:
        if self.listed is None:
            start = f"{self.prefix}/"
            self.listed = {o.key[len(start) :]: o.size for o in self.objects.list(self.bucket, start)}
        return self.listed

    def success(self) -> bytes | None:
        size = self._listing().get(SUCCESS)
        return None if size is None else b"".join(self.objects.blocks(self.bucket, self._key(SUCCESS), 0, size, BLOCK))

    def names(self) -> list[str]:
        return list(self._listing())

    def digest(self, name: str) -> FileDigest | str:
        size = self._listing().get(name)
        if size is None:
            return f"{self.where}/{name}: is missing ({SUCCESS} lists it); export the job again"
        try:
            return digest_blocks(self.objects.blocks(self.bucket, self._key(name), 0, size, BLOCK))
        except UserError as exc:
            return str(exc)

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}"
