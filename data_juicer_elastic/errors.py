"""Exceptions that carry their exit code, so every entry point exits alike."""

from __future__ import annotations

import re

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit|Failed)\b.*:")


class ElasticError(Exception):
    """Base class: an error this package reports to a person, exit code 2."""

    exit_code = 2


class UserError(ElasticError):
    """Bad input, parameter or recipe: the message names the file/line/key and the fix."""


class IntegrityError(ElasticError):
    """The job directory disagrees with itself (tampered, truncated, or escaping paths)."""


class JobFailed(ElasticError):
    """A shard failed terminally or the job was aborted."""


class PermanentError(ElasticError):
    """An attempt failed in a way every retry would repeat (a row or recipe error): its shard fails at once."""


def one_line(error: object, limit: int = 400) -> str | None:
    """An error as one readable line: colour codes dropped, a traceback reduced to its exception line.

    Ray's task errors carry the remote traceback (coloured) in their message;
    the whole text stays in the attempt's process.log.
    """
    if error is None:
        return None
    lines = [line.strip() for line in _ANSI.sub("", str(error)).splitlines() if line.strip()]
    if not lines:
        return ""
    raised = [line for line in lines[1:] if _EXCEPTION_LINE.match(line)]
    text = lines[0] if not raised or not lines[0].startswith(("RayTaskError", "ray::")) else raised[-1]
    if raised and text != raised[-1] and len(lines) > 3:
        text = f"{text} ... {raised[-1]}"
    return text if len(text) <= limit else text[: limit - 1] + "…"


OVERWRITE = "elastic_shard.overwrite_output: true (dj-elastic merge: --overwrite)"


def output_in_the_way(path: object, what: str = "already exists") -> UserError:
    """The one refusal of an export over something this job dir did not write (``export_target``)."""
    return UserError(f"{path}: {what} and no merge of this job dir wrote it; set {OVERWRITE} to replace it")


def store_error(exc: BaseException, endpoint_from: str = "--endpoint-url, AWS_ENDPOINT_URL") -> str | None:
    """A storage or network failure (OSError, botocore's) as one line naming where and what to check; None for
    any other error. An entry point prints it and exits 2 instead of a traceback; ``endpoint_from`` names where
    its user sets the endpoint."""
    if not isinstance(exc, OSError) and not type(exc).__module__.startswith(("botocore", "urllib3", "boto3")):
        return None
    where = getattr(exc, "filename", None) or getattr(exc, "kwargs", {}).get("endpoint_url")
    what = one_line(exc) or type(exc).__name__
    return (
        f"{where + ': ' if isinstance(where, str) and where not in what else ''}{what}; check the path, or for "
        f"s3:// the endpoint ({endpoint_from}), credentials and network"
    )
