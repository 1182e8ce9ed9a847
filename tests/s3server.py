"""A moto S3 server in its own process, for the object-store tests (docs/OBJECT_STORE.md section 6).

moto checks ``If-None-Match``/``If-Match`` and then writes, without a lock, so
only serialised requests make that check-then-write atomic (two racing creates
could both win). The werkzeug server is threaded, but moto runs one request at
a time (``Serialised``): each request's body is read in its own thread first,
and the answer is written after, so a client stopped mid-request (SIGSTOP, a
kill) holds up only its own connection, as on a real store; a single-threaded
server waited for the rest of that request and every other client's timed out
(tests/chaos/test_chaos_s3.py's stalled worker, 1 run in 3). Optional WSGI
middleware, per server:

* ``strip``: request headers removed before moto sees them (``If-None-Match``
  plays a store that ignores create-once; the probe must refuse it);
* ``latency_ms`` (or ``DJE_S3_LATENCY_MS``): a pause before each request;
* ``forget_completed``: a Complete of an upload already completed answers 404
  ``NoSuchUpload``, as stores that drop an upload once completed do (moto, like
  AWS, answers it 200 again), so a resent Complete must be resolved by its ETag.

moto answers ListObjectsV2 by walking (and copying) the whole bucket, so a job's
listings cost time in proportion to every key it has written: the workers of a
4,000-shard benchmark took 839 s. ``install_sorted_listing`` (done in the server
process) keeps each bucket's key names sorted and answers a listing by bisecting
to its prefix and start, with moto's own answers (same keys, folders, order,
pagination tokens); tests/test_s3server_listing.py compares the two. And moto
routes each request by listing its own package folder twice (a stat a module,
about a third of its time per request): the server lists it once.

Run alone: ``python -m tests.s3server [--strip If-None-Match] [--latency-ms N] [--forget-completed]``
prints ``port N`` once it listens, and exits when its stdin closes (so a
parent that dies takes it along).
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import io
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

ROOT = Path(__file__).resolve().parents[1]
START_SECS = 60.0  # moto imports a lot; a loaded 2-core machine may take a while
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


class Middleware:
    """Strips request headers and/or sleeps before each request, then hands it to moto."""

    def __init__(
        self,
        app: Callable[..., Iterable[bytes]],
        strip: Iterable[str] = (),
        latency_ms: float = 0.0,
        forget_completed: bool = False,
    ):
        self.app, self.latency = app, latency_ms / 1000.0
        self.strip = {"HTTP_" + h.upper().replace("-", "_") for h in strip}
        self.completed: set[str] | None = set() if forget_completed else None

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        for name in self.strip:
            environ.pop(name, None)
        if self.latency:
            time.sleep(self.latency)
        upload = self._completing(environ)
        if upload is None:
            return self.app(environ, start_response)
        if upload in self.completed:  # type: ignore[operator]
            start_response("404 Not Found", [("Content-Type", "application/xml")])
            return [b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>NoSuchUpload</Code></Error>"]
        statuses: list[str] = []
        body = list(self.app(environ, lambda status, *a: (statuses.append(status), start_response(status, *a))[1]))
        if statuses and statuses[0].startswith("200"):
            self.completed.add(upload)  # type: ignore[union-attr]
        return body

    def _completing(self, environ: dict[str, Any]) -> str | None:
        """The upload id of a CompleteMultipartUpload (POST ?uploadId=), when completed uploads are forgotten."""
        if self.completed is None or environ.get("REQUEST_METHOD") != "POST":
            return None
        return parse_qs(environ.get("QUERY_STRING", "")).get("uploadId", [None])[0]


class Serialised:
    """moto one request at a time; the request's body read before, and the answer sent after, outside the lock."""

    def __init__(self, app: Callable[..., Iterable[bytes]]):
        self.app, self.lock = app, threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        length = environ.get("CONTENT_LENGTH")
        stream = environ["wsgi.input"]
        body = stream.read(int(length)) if length else stream.read() if environ.get("wsgi.input_terminated") else b""
        environ["wsgi.input"] = io.BytesIO(body)
        with self.lock:
            return list(self.app(environ, start_response))


def _quiet_handler() -> type:
    """moto's request handler without its one-line-per-request log (the tests make thousands)."""
    from moto.moto_server.werkzeug_app import MotoRequestHandler

    class Quiet(MotoRequestHandler):
        def log_request(self, *args: Any, **kwargs: Any) -> None:
            pass

    return Quiet


def install_sorted_listing() -> None:
    """New buckets keep their key names sorted; ListObjectsV2 bisects them (moto's own walk stays the fallback)."""
    from moto.s3 import models

    if getattr(models.S3Backend.list_objects_v2, "walks", None):
        return
    walk = models.S3Backend.list_objects_v2

    class SortedKeys(models._VersionedKeyStore):  # type: ignore[name-defined]
        """moto's key store (name -> versions) plus ``names``, its keys in order, kept on each add and pop."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.names = sorted(dict.keys(self))

        def _add(self, name: str) -> None:
            if not dict.__contains__(self, name):
                bisect.insort(self.names, name)

        def __setitem__(self, name: str, value: Any) -> Any:
            self._add(name)
            return super().__setitem__(name, value)

        def setlist(self, name: Any, versions: Any) -> Any:
            self._add(name)
            return super().setlist(name, versions)

        def pop(self, name: str) -> None:  # type: ignore[override]
            super().pop(name)
            del self.names[bisect.bisect_left(self.names, name)]

        def __delitem__(self, name: str) -> None:
            super().__delitem__(name)
            del self.names[bisect.bisect_left(self.names, name)]

    def list_objects_v2(
        self: Any,
        bucket: Any,
        prefix: str | None,
        delimiter: str | None,
        continuation_token: str | None,
        start_after: str | None,
        max_keys: int,
    ) -> Any:
        known = not continuation_token or continuation_token in self._pagination_tokens
        if (
            type(bucket.keys) is not SortedKeys
            or isinstance(bucket, models.FakeTableStorageBucket)
            or max_keys < 0
            or not known
        ):
            return walk(self, bucket, prefix, delimiter, continuation_token, start_after, max_keys)
        after = self._pagination_tokens[continuation_token] if continuation_token else start_after or None
        listed = _listed(bucket.keys, prefix or "", delimiter, after, models.FakeDeleteMarker)
        return self._truncate_result(list(islice(listed, max_keys + 1)), max_keys)

    list_objects_v2.walks = walk  # type: ignore[attr-defined]
    models._VersionedKeyStore = SortedKeys
    models.S3Backend.list_objects_v2 = list_objects_v2


def _listed(keys: Any, prefix: str, delimiter: str | None, after: str | None, deleted: type) -> Iterator[Any]:
    """What moto lists under ``prefix`` past ``after``, in order: the latest version of each key that is not a
    delete marker, and each folder (``prefix`` + part + ``delimiter``) once, where a delete marker counts too."""
    names = keys.names
    i = (
        bisect.bisect_right(names, after)
        if after is not None and after >= prefix
        else bisect.bisect_left(names, prefix)
    )
    while i < len(names) and names[i].startswith(prefix):
        name = names[i]
        rest = name[len(prefix) :]
        if delimiter and delimiter in rest:
            folder = prefix + rest.split(delimiter)[0] + delimiter
            if after is None or folder > after:
                yield folder
            i = _past(names, folder, i)
            continue
        versions = dict.get(keys, name)
        if versions and not isinstance(versions[-1], deleted):
            yield versions[-1]
        i += 1


def _past(names: list[str], folder: str, i: int) -> int:
    """The index of the first name from ``i`` on that does not start with ``folder``."""
    last = ord(folder[-1])
    if last == sys.maxunicode:
        while i < len(names) and names[i].startswith(folder):
            i += 1
        return i
    return bisect.bisect_left(names, folder[:-1] + chr(last + 1), i)


def _list_moto_modules_once() -> None:
    """moto's request routing lists its package folder (one stat a module) twice a request; it does not change."""
    from moto import backends

    modules = tuple(backends.list_of_moto_modules())
    backends.list_of_moto_modules = lambda: modules


def serve(strip: Iterable[str], latency_ms: float, forget_completed: bool = False) -> None:
    """Serve moto on a free port of 127.0.0.1, one request at a time (``Serialised``); print the port; stop when
    stdin closes."""
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import make_server

    install_sorted_listing()
    _list_moto_modules_once()
    app = Middleware(DomainDispatcherApplication(create_backend_app), strip, latency_ms, forget_completed)
    server = make_server("127.0.0.1", 0, Serialised(app), threaded=True, request_handler=_quiet_handler())
    threading.Thread(target=_exit_on_eof, daemon=True).start()
    print(f"port {server.server_port}", flush=True)
    server.serve_forever()


def _exit_on_eof() -> None:
    sys.stdin.read()
    os._exit(0)


@contextlib.contextmanager
def s3_server(
    bucket: str = "dje-test", strip: Iterable[str] = (), latency_ms: float = 0.0, forget_completed: bool = False
) -> Iterator[dict[str, str]]:
    """Start a server process, create ``bucket``, yield the env a boto3 client needs; kill the process after."""
    cmd = [sys.executable, "-m", "tests.s3server", "--latency-ms", str(latency_ms)]
    cmd += ["--forget-completed"] if forget_completed else []
    for header in strip:
        cmd += ["--strip", header]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = _first_line(proc)
        if not line.startswith("port "):
            raise RuntimeError(f"the moto server did not start (exit {proc.poll()}, said {line!r})")
        endpoint = f"http://127.0.0.1:{int(line.split()[1])}"
        _wait_answering(endpoint, proc)
        server_env = {"AWS_ENDPOINT_URL": endpoint, **CREDENTIALS}
        create_bucket(bucket, server_env)
        yield server_env
    finally:
        proc.kill()
        proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()


def use_env(monkeypatch: Any, env: dict[str, str]) -> None:
    """Point boto3's standard chain at the server and nothing else (no profile, config or credential file)."""
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def _first_line(proc: subprocess.Popen) -> str:
    """The server's first line of output, or "" if it said nothing within START_SECS (a thread waits)."""
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(proc.stdout.readline() if proc.stdout else ""), daemon=True)
    reader.start()
    reader.join(START_SECS)
    return got[0].strip() if got else ""


def _wait_answering(endpoint: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + START_SECS
    while True:
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=5).close()
            return
        except urllib.error.HTTPError:
            return  # any HTTP answer will do
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def create_bucket(bucket: str, server_env: dict[str, str]) -> None:
    """``bucket`` on the server ``server_env`` names (its endpoint and keys), as a user's first step."""
    import boto3

    session = boto3.session.Session(
        aws_access_key_id=server_env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=server_env["AWS_SECRET_ACCESS_KEY"],
        region_name=server_env["AWS_DEFAULT_REGION"],
    )
    session.client("s3", endpoint_url=server_env["AWS_ENDPOINT_URL"]).create_bucket(Bucket=bucket)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strip", action="append", default=[], help="a request header to remove (repeatable)")
    latency = float(os.environ.get("DJE_S3_LATENCY_MS", "0") or 0)
    parser.add_argument("--latency-ms", type=float, default=latency, help="a pause before each request")
    parser.add_argument("--forget-completed", action="store_true", help="a repeated Complete: NoSuchUpload")
    args = parser.parse_args(argv)
    serve(args.strip, max(args.latency_ms, latency), args.forget_completed)


if __name__ == "__main__":
    main()
