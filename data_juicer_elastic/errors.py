"""Exceptions that carry their exit code, so every entry point exits alike."""

from __future__ import annotations


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
