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
whose size and sha256 metadata already match. From a job dir on S3
nothing is staged and no output byte comes through this process: each part
is a server-side ``CopyObject`` of its attempt output (``UploadPartCopy``
ranges above 5 GiB) under the same rules; only a Parquet part whose schema
is not the union of all is rewritten in node-local scratch (``scratch``) and
uploaded. A merged Parquet file from a job dir on S3 is written there too. The endpoint and credentials
are boto3's own chain (``AWS_ENDPOINT_URL``, ``AWS_PROFILE``, roles);
``merge.json`` records the URL, size and ETag and nothing of them.
``verify_export`` (``dj-elastic verify``) checks an export here against
merge.json as a local one is checked (``folder_export.check_recorded_*``),
reading by streamed ranged GETs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from data_juicer_elastic.errors import IntegrityError, UserError, output_in_the_way
from data_juicer_elastic.folder_export import (
    PART_RE,
    SUCCESS,
    Done,
    FolderExport,
    check_output_size,
    check_recorded_file,
    check_recorded_folder,
    check_sidecar_size,
    export_folder,
    manifest_of,
    parquet_manifest,
    parquet_part,
    parquet_result,
    parquet_rewrites,
    parquet_sources,
    part_name,
    rewrite_source,
    same_sources,
)
from data_juicer_elastic.parquet_out import PARQUET
from data_juicer_elastic.storage.blocks import BLOCK, FileDigest, blocks, digest_blocks
from data_juicer_elastic.storage.files import dumps_json
from data_juicer_elastic.storage.keys import Entry, normalise_prefix
from data_juicer_elastic.storage.s3_replies import _code, _refused
from data_juicer_elastic.storage.urls import SCHEME, is_s3, split_s3

if TYPE_CHECKING:
    from data_juicer_elastic.job.layout import JobDir

STAGING = "s3-export"  # the local folder export staged in the generation folder (links), removed after upload
PutPart = Callable[[Any, dict, Entry | None], bool]  # ``_publish``'s way to put one part
COPY_LIMIT = 5 << 30  # S3's largest CopyObject; a larger part is copied as UploadPartCopy ranges (multipart)


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
    from data_juicer_elastic.storage.s3_upload import MultipartWrite, Refused, abort_stale_uploads, part_size_for

    store, name = store_of(url, folder=False)
    seen = store.head(name)
    if seen is not None and not overwrite:
        raise _exists(url)
    abort_stale_uploads(store, name)
    try:  # where Complete ignores If-None-Match (the probe's complete_once) the HEAD before Complete guards:
        # only the finalize election's winner writes the export, so no writer of this job races it
        return MultipartWrite(store, name, seen.ver if seen else None, part_size_for(total))
    except Refused as exc:  # OSS: an object appeared since the HEAD
        raise _exists(url) from exc


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


def refuse_existing(url: str, overwrite: bool) -> None:
    """Before the work that precedes an upload (the merged Parquet file): an object at ``url`` is refused
    unless ``overwrite``, as a local merge refuses before it reads anything (``open_upload`` checks again)."""
    if not overwrite:
        store, name = store_of(url, folder=False)
        if store.head(name) is not None:
            raise _exists(url)


def _exists(url: str) -> UserError:
    return output_in_the_way(url)


# --------------------------------------------------------------------------- folder
@dataclass
class FolderUpload:
    rows: int
    bytes: int
    uploaded: int
    kept: int
    stamp: Stamp


@contextlib.contextmanager
def scratch(job: JobDir) -> Iterator[Path]:
    """A local folder for what an export writes before it uploads it: a POSIX job dir's generation folder
    (its outputs can be linked from there), else a fresh folder in node-local scratch (``$TMPDIR``), removed
    after."""
    if job.files_are_local:
        yield job.gen_dir
        return
    with tempfile.TemporaryDirectory(prefix="dje-export-") as folder:
        yield Path(folder)


def staging_folder(gen_dir: Path) -> Path:
    return gen_dir / STAGING


def export_to_prefix(
    job: JobDir, records: list[Done], exporter: Callable[..., FolderExport], url: str, overwrite: bool, log: Callable
) -> tuple[FolderExport, Stamp]:
    """A folder export to the prefix ``url``. From a job dir on S3 each part is copied there server-side
    (``copy_folder``; ``copy_parquet_folder`` rewrites Parquet parts of another schema and uploads those);
    from a POSIX one ``exporter`` stages the local folder export (links, Parquet schemas unified) in the
    generation folder, which is uploaded (``upload_folder``) and removed."""
    if job.on_object_store:
        copier = copy_folder if exporter is export_folder else copy_parquet_folder
        return copier(job, records, url, overwrite, log)
    staged = staging_folder(job.gen_dir)
    done = exporter(records, staged, overwrite=True, log=log, job=job)
    stamp = upload_folder(staged, url, overwrite, log).stamp
    drop_staging(staged)
    return done, stamp


def upload_folder(staged: Path, url: str, overwrite: bool, log: Callable[[str], Any]) -> FolderUpload:
    """Put a staged local folder export at the prefix ``url``: its parts, then ``_SUCCESS`` created once."""
    from data_juicer_elastic.storage.s3_upload import upload_file

    def put(store: Any, part: dict, seen: Entry | None) -> bool:
        upload_file(store, part["file"], staged / part["file"], part["sha256"])
        return True

    return _publish(url, (staged / SUCCESS).read_bytes(), put, overwrite, log, "uploaded to")


def copy_folder(
    job: JobDir, records: list[Done], url: str, overwrite: bool, log: Callable[[str], Any]
) -> tuple[FolderExport, Stamp]:
    """The folder export of ``records`` (outputs in ``job``'s S3 store) at the prefix ``url``, each part
    copied by the store (``CopyObject``; ``UploadPartCopy`` ranges above ``COPY_LIMIT``): no output byte passes
    through this process. Each output's size is checked by a HEAD (its content was hashed by the worker;
    ``dj-elastic verify`` re-hashes the parts), and the copy takes exactly the object seen
    (``x-amz-copy-source-if-match``)."""
    _copy_target(job, url)
    outputs = {part_name(r.shard): (r, path) for r, path in records}

    def put(store: Any, part: dict, seen: Entry | None) -> bool:
        record, path = outputs[part["file"]]
        return _copy_part(store, job, record.shard, path, lambda n: check_output_size(record, path, n), part, seen)

    done = _publish(url, dumps_json(manifest_of(records)), put, overwrite, log, "copied to")
    return FolderExport(location(url), done.rows, done.bytes, 0, done.uploaded, done.kept), done.stamp


def copy_parquet_folder(
    job: JobDir, records: list[Done], url: str, overwrite: bool, log: Callable[[str], Any]
) -> tuple[FolderExport, Stamp]:
    """The Parquet folder export of ``records`` (in ``job``'s S3 store) at the prefix ``url``, with the parts
    and ``_SUCCESS`` a local export writes (``folder_export.export_parquet_folder``): a part whose schema is
    already the unified one is copied by the store (``_copy_part``, its size checked against its sidecar);
    the others are rewritten with it in node-local scratch (their source checked as it is read) and
    uploaded. A complete export of these sources is left as it is before anything is rewritten."""
    from data_juicer_elastic.storage.s3_upload import upload_file

    store = _copy_target(job, url)
    found = parquet_sources(job, records)
    there = store.read(SUCCESS)
    if there is not None:
        old = _loads(there[0])
        if same_sources(old, found) and _parts_there(store, old):
            return parquet_result(location(url), found, kept=len(found)), Stamp(there[1].size, there[1].ver)
        if not overwrite:
            raise _other_export(url)
    rewrite, schema = parquet_rewrites(job, found)
    with scratch(job) as folder:
        parts, sources, local = [], {}, {}
        for source, again in zip(found, rewrite, strict=True):
            name = part_name(source[0].shard, PARQUET)
            sources[name] = source
            if again:
                local[name] = folder / name
            parts.append(parquet_part(source, rewrite_source(job, source, local[name], schema) if again else None))

        def put(store: Any, part: dict, seen: Entry | None) -> bool:
            if part["file"] in local:
                upload_file(store, part["file"], local[part["file"]], part["sha256"])
                return True
            r, path, meta = sources[part["file"]]
            check = lambda n: check_sidecar_size(r.shard, path, n, meta["bytes"])  # noqa: E731
            return _copy_part(store, job, r.shard, path, check, part, seen)

        done = _publish(url, dumps_json(parquet_manifest(parts)), put, overwrite, log, "copied to")
    return parquet_result(location(url), found, copied=done.uploaded, kept=done.kept), done.stamp


def _loads(manifest: bytes) -> dict:
    """A ``_SUCCESS`` found at the prefix; one that is no manifest reads as one of no parts."""
    try:
        found = orjson.loads(manifest)
    except orjson.JSONDecodeError:
        return {}
    return found if isinstance(found, dict) and isinstance(found.get("parts"), list) else {}


def _copy_target(job: JobDir, url: str) -> Any:
    """The store of the prefix ``url``, on the job dir's endpoint (a server-side copy needs one)."""
    store, _ = store_of(url, folder=True)
    if store.endpoint != job.store.endpoint:
        raise UserError(
            f"{url}/: the job dir is at {job.store.endpoint}, the export at {store.endpoint}; a server-side copy "
            "needs one endpoint: export to a local folder, or to a prefix on the job dir's endpoint"
        )
    return store


def _publish(
    url: str,
    manifest_bytes: bytes,
    put: Callable[[Any, dict, Entry | None], bool],
    overwrite: bool,
    log: Callable,
    did: str,
) -> FolderUpload:
    """The parts ``manifest_bytes`` (a ``_SUCCESS``) lists put at the prefix ``url`` by ``put`` (given the
    store, the part and the key as listed there, None when missing; False: the part was found in place
    after all), then ``_SUCCESS`` created once. A complete export of exactly these parts is left as it is;
    one of other parts is refused without ``overwrite``, else its ``_SUCCESS`` is deleted first; keys that
    are no part files are refused; a part already there with its size and sha256 (metadata) is kept, so a
    killed export resumes; parts of another export are deleted."""
    store, _ = store_of(url, folder=True)
    manifest = orjson.loads(manifest_bytes)
    found = store.read(SUCCESS)
    if found is not None and found[0] == manifest_bytes and _parts_there(store, manifest):
        return _folder_result(manifest, 0, len(manifest["parts"]), Stamp(found[1].size, found[1].ver))
    if found is not None and not overwrite:
        raise _other_export(url)
    listed = {e.key: e for e in store.list("")}
    foreign = sorted(k for k in listed if k != SUCCESS and not PART_RE.match(k))
    if foreign:
        raise UserError(
            f"{url}/: holds keys that are not part files of an export ({', '.join(foreign[:3])}); "
            "export into an empty or new prefix"
        )
    if found is not None:
        store.delete(SUCCESS)  # from here on the prefix reads as incomplete until the new manifest is there
    written = kept = 0
    for part in manifest["parts"]:
        seen = listed.get(part["file"])
        if (seen is not None and _part_there(store, part)) or not put(store, part, seen):
            kept += 1  # put there by an earlier (killed) export
            continue
        written += 1
    wanted = {p["file"] for p in manifest["parts"]}
    for key in listed:
        if PART_RE.match(key) and key not in wanted:
            store.delete(key)
    meta = store.create(SUCCESS, manifest_bytes)
    if meta is None:
        raise UserError(f"{url}/: another export wrote {SUCCESS} during this one; nothing was replaced")
    log(f"{written} part(s) {did} {url}/, {kept} already there")
    return _folder_result(manifest, written, kept, Stamp(meta.size, meta.ver))


def _other_export(url: str) -> UserError:
    return output_in_the_way(f"{url}/", "holds a complete export of other outputs")


def _copy_part(
    store: Any, job: JobDir, shard: str, path: Path, check: Callable[[int], None], part: dict, seen: Entry | None
) -> bool:
    """Copy the shard's file at ``path`` to ``part`` by the store, once ``check`` passed its size (a HEAD):
    ``If-None-Match: *`` where the part was missing, ``If-Match`` the ETag listed where another part was
    there (a store that ignores them, moto, replaces whatever is there: the listing and HEAD before stand as
    the guard). A refused copy is fine when the part is now in place (another export, or our own request
    resent); else it is refused."""
    from data_juicer_elastic.storage.s3_upload import SHA_META

    source = job.store.head_response(job.key(path))
    if source is None:
        raise IntegrityError(f"shard {shard}: {path} cannot be read (it is missing); restore it or rerun the shard")
    size = int(source["ContentLength"])
    check(size)
    copy = {"Bucket": store.bucket, "Key": store._full(part["file"]), "MetadataDirective": "REPLACE"}
    # A store that ignores If-None-Match on Copy (moto, RGW 16: the probe's copy_once) leaves the listing and
    # the HEAD before as the guard: only the finalize election's winner exports this job, so no other writer
    # of the job races it; the ETags go in the form the probe found the store takes.
    condition = {"IfMatch": store.sent(seen.ver)} if seen else {"IfNoneMatch": "*"}
    copy |= {"Metadata": {SHA_META: part["sha256"]}, **condition}
    copy |= {"CopySource": {"Bucket": job.store.bucket, "Key": job.store._full(job.key(path))}}
    copy |= {"CopySourceIfMatch": job.store.sent(str(source["ETag"]))}
    from botocore.exceptions import ParamValidationError

    target = f"{location(store.url)}/{part['file']}"
    try:
        if size > COPY_LIMIT:
            _copy_ranges(store, part["file"], copy, size)
        else:
            store.client.copy_object(**copy)
    except ParamValidationError as exc:  # a botocore whose S3 model predates conditional copies
        raise UserError(f"{target}: this botocore cannot send a conditional CopyObject ({exc}); upgrade boto3") from exc
    except store._client_error as exc:
        if not (_refused(exc) or _code(exc) in ("ConditionalRequestConflict", "NoSuchUpload", "NoSuchKey")):
            raise UserError(f"{target}: the store refused the copy from {path}: {exc}") from exc
        if _part_there(store, part):
            return False
        raise UserError(
            f"{target}: another writer changed it during this export, or its source "
            f"{path} changed ({_code(exc)}); nothing else was replaced: export again"
        ) from exc
    return True


def _copy_ranges(store: Any, name: str, copy: dict[str, Any], size: int) -> None:
    """``copy`` (CopyObject's arguments) of an object over ``COPY_LIMIT`` as a multipart upload of
    ``UploadPartCopy`` ranges, completed under the copy's condition; aborted on any error (a killed one is
    aborted by the next export to the key once stale)."""
    from data_juicer_elastic.storage.s3_upload import IN_FLIGHT, abort_stale_uploads, part_size_for

    client = store.client
    abort_stale_uploads(store, name)
    where = {"Bucket": copy["Bucket"], "Key": copy["Key"]}
    upload = {**where, "UploadId": client.create_multipart_upload(**where, Metadata=copy["Metadata"])["UploadId"]}
    step = part_size_for(size)
    source = {"CopySource": copy["CopySource"], "CopySourceIfMatch": copy["CopySourceIfMatch"]}

    def one(n: int) -> dict[str, Any]:
        span = f"bytes={n * step}-{min(size, (n + 1) * step) - 1}"
        resp = client.upload_part_copy(**upload, **source, PartNumber=n + 1, CopySourceRange=span)
        return {"PartNumber": n + 1, "ETag": resp["CopyPartResult"]["ETag"]}

    try:
        with ThreadPoolExecutor(IN_FLIGHT, thread_name_prefix="dje-s3-copy") as pool:
            parts = list(pool.map(one, range(-(-size // step))))
        condition = {k: copy[k] for k in ("IfMatch", "IfNoneMatch") if k in copy}
        client.complete_multipart_upload(**upload, MultipartUpload={"Parts": parts}, **condition)
    except BaseException:
        with contextlib.suppress(*store.errors):
            client.abort_multipart_upload(**upload)
        raise


def _part_there(store: Any, part: dict) -> bool:
    """Is ``part`` at its key with its size and sha256 (metadata): one HEAD."""
    from data_juicer_elastic.storage.s3_upload import sha256_of

    return sha256_of(store, part["file"]) == (part["bytes"], part["sha256"])


def _parts_there(store: Any, manifest: dict) -> bool:
    return all(_part_there(store, p) for p in manifest["parts"])


def _folder_result(manifest: dict, uploaded: int, kept: int, stamp: Stamp) -> FolderUpload:
    return FolderUpload(manifest["rows"], manifest["bytes"], uploaded, kept, stamp)


def drop_staging(staged: Path) -> None:
    shutil.rmtree(staged, ignore_errors=True)


# --------------------------------------------------------------------------- verify
def verify_export(record: dict[str, Any]) -> list[str]:
    """The export merge.json names re-read (``dj-elastic verify``), as a local one is (``check_recorded_*``): the
    stamp (size and ETag, one HEAD) of a folder's ``_SUCCESS`` or of the one object against merge.json, then a
    folder's parts against its ``_SUCCESS``, or the object's rows and sha256, by streamed ranged GETs."""
    from data_juicer_elastic.storage.s3_objects import S3Objects

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
    objects: Any  # storage.s3_objects.S3Objects
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
