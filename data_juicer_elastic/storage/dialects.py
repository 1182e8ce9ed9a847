"""How each dialect spells a conditional write on the wire, as botocore event hooks on the store's client.

The store always asks in S3's words: ``IfNoneMatch="*"`` for create-once (PutObject, CompleteMultipartUpload,
CopyObject, and CreateMultipartUpload, where S3 itself has no precondition), ``IfMatch`` for compare-and-swap.
``s3`` sends them as they are (Initiate's is dropped). ``oss`` (Alibaba OSS's S3-compatible endpoint) answers
``If-None-Match`` and ``If-Match`` on PutObject with NotImplemented (docs/OBJECT_STORE.md, "Dialects"), so
create-once becomes ``x-oss-forbid-overwrite: true`` (a 409 ``FileAlreadyExists`` when a key is there), on
Initiate as well as on Complete. OSS has no compare-and-swap on PUT at all: a conditional PutObject or
DeleteObject raises :class:`NoCompareAndSwap` before it is sent (the probe refuses such a job dir first);
Complete's ``If-Match`` (replacing an export the merge saw) is dropped, leaving the HEAD just before Complete
as the guard, as on a store that ignores it.
"""

from __future__ import annotations

from typing import Any

from data_juicer_elastic.errors import UserError

FORBID_OVERWRITE = "x-oss-forbid-overwrite"
CREATE_ONCE = "dje_create_once"  # request context: an Initiate asked for create-once
_CREATE_OPS = ("PutObject", "CompleteMultipartUpload", "CopyObject")
_SWAP_OPS = ("PutObject", "DeleteObject", "CopyObject")


class NoCompareAndSwap(UserError):
    """The dialect's store cannot replace a key only if unchanged: a lease renewal there would race."""


def keeps_if_match(dialect: str) -> bool:
    """Whether the dialect's store replaces a key conditionally on its version (lease renewals need it)."""
    return dialect != "oss"


def install(client: Any, dialect: str) -> None:
    """Hook ``client`` so that its requests speak ``dialect`` (one of ``settings.DIALECTS``)."""
    client.meta.events.register("before-parameter-build.s3.CreateMultipartUpload", _initiate_condition)
    if dialect == "oss":
        client.meta.events.register("before-sign.s3", _oss_headers)


def _initiate_condition(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
    """Take ``IfNoneMatch`` off an Initiate (S3 has no such parameter there) into the request's context."""
    if params.pop("IfNoneMatch", None) == "*":
        context[CREATE_ONCE] = True


def _oss_headers(request: Any, operation_name: str, **_: Any) -> None:
    """S3's preconditions rewritten into OSS's before the request is signed."""
    headers = request.headers
    create_once = (operation_name in _CREATE_OPS and headers.get("If-None-Match") in ("*", b"*")) or (
        operation_name == "CreateMultipartUpload" and request.context.get(CREATE_ONCE)
    )
    if create_once:
        del headers["If-None-Match"]
        headers[FORBID_OVERWRITE] = "true"
    if "If-Match" in headers and operation_name == "CompleteMultipartUpload":
        del headers["If-Match"]  # the HEAD before Complete guards it (s3_upload.MultipartWrite.complete)
    elif "If-Match" in headers and operation_name in _SWAP_OPS:
        raise NoCompareAndSwap(
            f"{operation_name} If-Match: Alibaba OSS (storage dialect oss) has no compare-and-swap on a write, so a "
            "lease renewal or a conditional replace there could overwrite another process's write; put the job dir "
            "on AWS S3, MinIO or a shared POSIX directory (OSS serves dataset_path and export_path)"
        )
