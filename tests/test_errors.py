"""Every exception class of the package survives pickling: errors cross the prepare pool's pipes."""

from __future__ import annotations

import errno
import importlib
import inspect
import os
import pickle
import pkgutil
from pathlib import Path

import data_juicer_elastic
from data_juicer_elastic.dedup.budget import UnitFailed
from data_juicer_elastic.dedup.driver import Stopped
from data_juicer_elastic.errors import ElasticError, IntegrityError, JobFailed, PermanentError, UserError
from data_juicer_elastic.jsonl import LineProblem
from data_juicer_elastic.prepare.pool import _portable, _relinked
from data_juicer_elastic.prepare.shards import _ShortRead
from data_juicer_elastic.prepare.split import TooFewRows
from data_juicer_elastic.storage.dialects import NoCompareAndSwap
from data_juicer_elastic.storage.files import disk_full_in
from data_juicer_elastic.storage.probe import StoreRefused
from data_juicer_elastic.storage.s3_deadline import DeadlineMissed
from data_juicer_elastic.storage.s3_upload import Refused
from data_juicer_elastic.worker.attempt import ShardMismatch
from data_juicer_elastic.worker.disk_full import NoSpace
from data_juicer_elastic.worker.fencing import Fenced
from data_juicer_elastic.worker.signals import Interrupted


def _no_space() -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/job/shards/x")


def _samples() -> list[BaseException]:
    failed = JobFailed("job ended with exit code 3")
    failed.exit_code = 3
    return [
        ElasticError("e"),
        UserError("bad key"),
        IntegrityError("tampered"),
        failed,
        ShardMismatch("edited shard"),
        PermanentError("/data/in.jsonl:28: a row Ray's JSON reader refuses"),
        LineProblem(3, "bad"),
        TooFewRows(4),
        _ShortRead(),
        NoSpace(Path("/job/attempts/x"), _no_space()),
        Interrupted(15),
        Fenced(),
        StoreRefused("s3://bucket/job at http://127.0.0.1:9000 lets a second create-once write through"),
        Refused("s3://bucket/out/merged.jsonl: exists; pass --overwrite to replace it"),
        NoCompareAndSwap("dialect oss: a PutObject with If-Match cannot be sent; the job dir cannot be on OSS"),
        DeadlineMissed("s3://bucket/job/state/done/part-00000.json: not sent, its deadline is 0.5s away"),
        UnitFailed("dedup unit d0-bucket-00001 failed terminally after 3 failure(s); log: attempts/x/0003"),
        Stopped(),
    ]


def _package_exception_classes() -> set[type]:
    found = set()
    for info in pkgutil.walk_packages(data_juicer_elastic.__path__, "data_juicer_elastic."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, BaseException) and obj.__module__ == module.__name__:
                found.add(obj)
    return found


def _same(a: object, b: object) -> bool:
    if isinstance(a, BaseException):
        return type(a) is type(b) and str(a) == str(b) and _same(vars(a), vars(b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def test_every_package_exception_round_trips_through_pickle():
    samples = _samples()
    assert {type(e) for e in samples} == _package_exception_classes(), "add a sample for each new exception class"
    for exc in samples:
        copy = pickle.loads(pickle.dumps(exc))
        assert _same(exc, copy), f"{type(exc).__name__} changed through pickle: {vars(exc)} -> {vars(copy)}"
    assert pickle.loads(pickle.dumps(LineProblem(3, "bad"))).index == 3


def test_the_pool_carries_the_cause_so_a_full_disk_is_found_without_reading_text():
    try:
        try:
            raise _no_space()
        except OSError as inner:
            raise LineProblem(7, "could not write the shard") from inner
    except LineProblem as exc:
        sent = pickle.loads(pickle.dumps(_portable(exc)))
    got = _relinked(sent)
    assert isinstance(got, LineProblem) and got.index == 7
    full = disk_full_in(got)
    assert full is not None and full.errno == errno.ENOSPC and full.filename == "/job/shards/x"
