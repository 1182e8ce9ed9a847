"""What an S3 endpoint was seen to honour, and ETags as it accepts them (docs/OBJECT_STORE.md section 3).

Servers differ where the protocol needs them most: Ceph RGW 16 honours
``If-Match`` only with the ETag unquoted (a quoted current ETag is refused
412), AWS and moto take the quoted form, and some servers ignore a condition
on one request (Complete, Copy, Delete) while keeping it on PUT. The startup
probe (``probe.py``) finds out on the server at hand and records it here, by
endpoint, for every store of this process on that endpoint: nothing is
decided by a server's name.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

_SEEN: dict[str, Capabilities] = {}  # by endpoint URL: what this process's probe found there


@dataclass(frozen=True)
class Capabilities:
    """Which conditional requests the store honours (create-once on PUT is required, so not listed)."""

    if_match: bool  # PUT If-Match: a replace on a stale version is refused (412)
    etag_quoted: bool = True  # If-Match takes the ETag in quotes (RFC 7232); False: only bare
    get_if_match: bool = True  # GET If-Match on a stale version: 412
    delete_if_match: bool = True  # DELETE If-Match on a stale version: 412, the key kept
    complete_once: bool = True  # CompleteMultipartUpload If-None-Match: * onto a key: 412
    copy_once: bool = True  # CopyObject If-None-Match: * onto a key: 412

    def line(self, store: Any) -> str:
        """The one log line, naming each conditional request and whether the store honours it."""
        said = [f"{LABELS[f.name]} {'yes' if getattr(self, f.name) else 'no'}" for f in fields(self)]
        said[0] += f" (ETag {'quoted' if self.etag_quoted else 'unquoted'})"
        del said[1]
        return f"store: {store.describe()}: create-once yes, " + ", ".join(said)


LABELS = {
    "if_match": "If-Match",
    "etag_quoted": "",
    "get_if_match": "GET If-Match",
    "delete_if_match": "DELETE If-Match",
    "complete_once": "Complete If-None-Match",
    "copy_once": "Copy If-None-Match",
}


def learn(endpoint: str, found: Capabilities) -> None:
    _SEEN[endpoint] = found


def seen(endpoint: str) -> Capabilities | None:
    """What the probe found at ``endpoint`` in this process; None before it ran there."""
    return _SEEN.get(endpoint)


def bare(etag: str) -> str:
    """An ETag without its quotes (and a weak one's ``W/``): the form ETags are compared in."""
    etag = str(etag).strip()
    if etag.startswith("W/"):
        etag = etag[2:]
    return etag[1:-1] if len(etag) >= 2 and etag[0] == etag[-1] == '"' else etag


def same_etag(a: str | None, b: str | None) -> bool:
    """Whether two ETags name one version, whatever quotes each came with (None: no object)."""
    if a is None or b is None:
        return a is b
    return bare(a) == bare(b)


def as_sent(etag: str, quoted: bool) -> str:
    """``etag`` in the form the server takes in ``If-Match`` / ``CopySourceIfMatch``."""
    return f'"{bare(etag)}"' if quoted else bare(etag)
