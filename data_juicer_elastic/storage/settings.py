"""Where an S3 store is and how to speak to it: endpoint, region, addressing style and dialect.

One set per process, from the environment (boto3's own names where it has
them): ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``, ``AWS_REGION`` /
``AWS_DEFAULT_REGION``, and this package's ``DJ_ELASTIC_S3_ADDRESSING_STYLE``
and ``DJ_ELASTIC_S3_DIALECT``. A recipe's ``elastic_shard.storage`` block
(and ``dj-elastic --endpoint-url``) is written into the environment by
:meth:`StorageSettings.apply` before the first store is built, so the job
dir, the input and the export of this process, and every process it starts
(prepare's children, a local Ray), build their clients alike. Credentials are
never part of it: boto3 finds them (``AWS_PROFILE``, ``AWS_ACCESS_KEY_ID``,
roles), and nothing here reads, stores or logs them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from urllib.parse import urlsplit

DIALECTS = ("s3", "oss")  # s3: If-None-Match / If-Match; oss: x-oss-forbid-overwrite (storage/dialects.py)
ADDRESSING_STYLES = ("auto", "virtual", "path")
ENDPOINT_ENVS = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")  # boto3's own, the service-specific one first
REGION_ENVS = ("AWS_REGION", "AWS_DEFAULT_REGION")
ADDRESSING_ENV = "DJ_ELASTIC_S3_ADDRESSING_STYLE"
DIALECT_ENV = "DJ_ELASTIC_S3_DIALECT"


@dataclass(frozen=True)
class StorageSettings:
    """``elastic_shard.storage``: None leaves a value to boto3's chain (endpoint, region) or its default."""

    endpoint_url: str | None = None
    region: str | None = None
    addressing_style: str | None = None  # auto, virtual (OSS takes only this) or path (MinIO without DNS)
    dialect: str | None = None  # s3 (the default) or oss

    @property
    def dialect_name(self) -> str:
        return self.dialect or "s3"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> StorageSettings:
        env = os.environ if environ is None else environ
        return cls(
            endpoint_url=_first(env, ENDPOINT_ENVS),
            region=_first(env, REGION_ENVS),
            addressing_style=env.get(ADDRESSING_ENV) or None,
            dialect=env.get(DIALECT_ENV) or None,
        )

    def problems(self, where: str = "elastic_shard.storage.") -> list[str]:
        """What is wrong with these values, each naming its key after ``where`` (never echoing a credential)."""
        found = []
        if self.endpoint_url is not None and (problem := endpoint_problem(self.endpoint_url)):
            found.append(f"{where}endpoint_url: {problem}")
        if self.addressing_style is not None and self.addressing_style not in ADDRESSING_STYLES:
            found.append(f"{where}addressing_style {self.addressing_style!r}: one of {', '.join(ADDRESSING_STYLES)}")
        if self.dialect is not None and self.dialect not in DIALECTS:
            found.append(f"{where}dialect {self.dialect!r}: one of {', '.join(DIALECTS)}")
        return found

    def apply(self, environ: MutableMapping[str, str] | None = None) -> None:
        """Make these the process's settings: written into the environment, which every store built from now
        on reads (``from_env``) and every child process inherits. A value left None keeps the environment's."""
        env = os.environ if environ is None else environ
        if self.endpoint_url is not None:  # S3's own variable only: the generic one would send STS there too
            env[ENDPOINT_ENVS[0]] = self.endpoint_url
        if self.region is not None:
            for name in REGION_ENVS:
                env[name] = self.region
        if self.addressing_style is not None:
            env[ADDRESSING_ENV] = self.addressing_style
        if self.dialect is not None:
            env[DIALECT_ENV] = self.dialect


def endpoint_problem(url: str) -> str | None:
    """Why ``url`` cannot be an endpoint: not http(s)://host, or credentials, a query or a fragment in it (they
    would be logged with the endpoint); None when it can."""
    try:
        parts = urlsplit(url)
        port_ok = parts.port is None or parts.port > 0
    except ValueError:
        return "not a URL (https://host[:port])"
    if parts.username is not None or parts.password is not None:
        return "the URL holds credentials; remove them (boto3 reads AWS_PROFILE, AWS_ACCESS_KEY_ID or a role)"
    if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
        return f"{url!r} is not an http(s) URL (https://host[:port])"
    if parts.query or parts.fragment:
        return f"{url!r}: an endpoint takes no query or fragment"
    return None


def _first(env: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    return next((env[n] for n in names if env.get(n)), None)
