"""What an S3 reply says: its error code, whether the key was missing or the send retried, the store's clock
(``Date``), a key's Meta. Shared by ``s3.py`` (the store) and ``s3_upload.py`` (its bulk writes, which
``S3Store.upload`` calls), so neither imports the other for them.
"""

from __future__ import annotations

import io
from email.utils import parsedate_to_datetime
from typing import Any

from data_juicer_elastic.storage.conditions import as_sent
from data_juicer_elastic.storage.keys import Meta

RELEASED_META = "dje-released"  # x-amz-meta-dje-released: 1 on a released lease, read by HEAD


def _code(exc: Any) -> str:
    response = getattr(exc, "response", None) or {}  # BotoCoreError (no connection, no credentials) has none
    return str(response.get("Error", {}).get("Code", ""))


def _missing(exc: Any) -> bool:
    return _code(exc) in ("NoSuchKey", "404", "NotFound")


def _refused(exc: Any) -> bool:
    """A precondition failed: S3's 412, or OSS's 409 ``FileAlreadyExists`` (``x-oss-forbid-overwrite``)."""
    return _code(exc) in ("PreconditionFailed", "FileAlreadyExists")


def _retried(exc: Any) -> bool:
    return int(exc.response.get("ResponseMetadata", {}).get("RetryAttempts", 0)) > 0


def _date(resp: dict[str, Any]) -> float:
    """The response's ``Date`` header: the store's clock (1 s resolution)."""
    date = resp.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
    if not date:
        raise RuntimeError("the S3 endpoint sent no Date header, so it offers no clock to age leases by")
    return parsedate_to_datetime(date).timestamp()


def _released(resp: dict[str, Any]) -> bool:
    return resp.get("Metadata", {}).get(RELEASED_META) == "1"


def _meta(resp: dict[str, Any], size: int) -> Meta:
    """A GET's or HEAD's Meta; a PUT's response has no Last-Modified: the write is stamped at its ``Date``."""
    date = _date(resp)
    modified = resp["LastModified"].timestamp() if "LastModified" in resp else date
    return Meta(size, quoted(str(resp["ETag"])), modified, date, _released(resp))


def quoted(etag: str) -> str:
    """An ETag as HEAD and LIST give it, in quotes, whatever form a reply used (RGW's Complete: bare)."""
    return as_sent(etag, True)


class GetBody(io.RawIOBase):
    """A GET's body as a raw stream: ``readinto`` for ``blocks``; a body cut short raises when read to its end
    (botocore's ``StreamingBody.read`` checks the length; its raw stream, which ``with body`` hands out, does not)."""

    def __init__(self, body: Any) -> None:
        self._body = body

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        data = self._body.read(len(buf))
        buf[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._body.close()
        super().close()
