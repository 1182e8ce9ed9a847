"""The test server's sorted listing answers as moto's own walk (tests/s3server.py ``install_sorted_listing``).

Both run on the same real moto backend and bucket, in this process: each listing is paged through to its
end with either, and every page must match (the same key objects and folders, in the same order, the same
truncation and continuation token). moto's own listing stays the one to match, quirks included: a folder
is listed for a delete marker too, and a start past a folder's name skips it even where keys under it sort
later.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.s3server import install_sorted_listing

models = pytest.importorskip("moto.s3.models")

NAMES = [
    "a",
    "a/",
    "a//b",
    "a/b",
    "a/b/c",
    "a/b/d",
    "a/b/d/e",
    "a/bc",
    "a/x",
    "a/y/z/1",
    "a/y/z/2",
    "a0",
    "ab",
    "ab/c",
    "b/1",
    "b/2/3",
    "c.d/e",
    "jobs/j1/shards/part-00000",
    "jobs/j1/shards/part-00001",
    "jobs/j1/done/part-00000",
    "jobs/j1/lanes/w1/hint",
    "jobs/j10/shards/part-00000",
    "z",
    "\u00e9/1",
    "\u00e9t\u00e9",
]
DELETED = ["a/b/c", "a/y/z/1", "a/y/z/2", "jobs/j1/lanes/w1/hint", "z"]
PREFIXES = [None, "", "a", "a/", "a/b", "a/y/", "b/", "jobs/j1/", "jobs/j1", "\u00e9", "q"]
DELIMITERS = [None, "/", "b", "/b"]
STARTS = [None, "", "a", "a/", "a/b", "a/b/", "a/c", "b", "jobs/j1/lanes/", "zz"]
MAX_KEYS = [0, 1, 2, 3, 1000]


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A fresh S3 backend with the sorted listing, which this test process forgets afterwards."""
    monkeypatch.setattr(models, "_VersionedKeyStore", models._VersionedKeyStore)
    monkeypatch.setattr(models.S3Backend, "list_objects_v2", models.S3Backend.list_objects_v2)
    install_sorted_listing()
    return models.S3Backend(region_name="us-east-1", account_id="123456789012")


def new_bucket(backend: Any, versioned: bool = False) -> str:
    name = f"dje-listing-{uuid.uuid4().hex[:12]}"
    backend.create_bucket(name, "us-east-1")
    if versioned:
        backend.put_bucket_versioning(name, "Enabled")
    assert hasattr(backend.get_bucket(name).keys, "names"), "the bucket does not keep its names sorted"
    return name


def pages(backend: Any, lister: Any, bucket: str, **query: Any) -> Iterator[tuple[list[Any], bool, str | None]]:
    """Each page of one listing, each the key objects and folder names it holds, to its end."""
    token = None
    while True:
        keys, truncated, token = lister(backend, backend.get_bucket(bucket), continuation_token=token, **query)
        yield list(keys), truncated, token
        if not truncated:
            return


def assert_same_listings(backend: Any, bucket: str) -> None:
    """Every query of the grid, paged to its end, answers the same by the sorted listing and moto's walk."""
    sorted_listing = models.S3Backend.list_objects_v2
    walk = sorted_listing.walks
    assert walk is not sorted_listing
    keys = backend.get_bucket(bucket).keys
    assert keys.names == sorted(dict.keys(keys))
    for prefix in PREFIXES:
        for delimiter in DELIMITERS:
            for start in STARTS:
                for max_keys in MAX_KEYS:
                    query = dict(prefix=prefix, delimiter=delimiter, start_after=start, max_keys=max_keys)
                    got = [
                        ([_item(i) for i in items], *rest)
                        for items, *rest in pages(backend, sorted_listing, bucket, **query)
                    ]
                    want = [
                        ([_item(i) for i in items], *rest) for items, *rest in pages(backend, walk, bucket, **query)
                    ]
                    if got != want:  # a short message: pytest's own diff of long lists takes minutes
                        pytest.fail(f"{query}: sorted listing {got[:4]}, moto {want[:4]}")


def _item(item: Any) -> tuple[str, int]:
    """A folder by its name, a key by its name and which version object it is."""
    return (item, 0) if isinstance(item, str) else (item.name, id(item))


def test_nested_prefixes_delimiters_pages_and_deleted_keys(backend: Any):
    bucket = new_bucket(backend)
    for name in NAMES:
        backend.put_object(bucket, name, b"x")
    backend.put_object(bucket, "a/b", b"replaced")  # a second write of a key: still one name
    for name in DELETED:
        backend.delete_object(bucket, name)
    assert_same_listings(backend, bucket)


def test_delete_markers_of_a_versioned_bucket(backend: Any):
    """A deleted key keeps its versions behind a delete marker: not listed, yet its folder is (as moto does)."""
    bucket = new_bucket(backend, versioned=True)
    for name in NAMES:
        backend.put_object(bucket, name, b"x")
        backend.put_object(bucket, name, b"y")
    for name in DELETED:
        backend.delete_object(bucket, name)
    backend.put_object(bucket, "z", b"back")  # a key written again after its delete marker
    assert_same_listings(backend, bucket)


def test_random_writes_and_deletes(backend: Any):
    """Names from a small alphabet (many shared prefixes, empty parts), written and deleted at random."""
    rng = random.Random(36)
    bucket = new_bucket(backend)
    live: set[str] = set()
    for _ in range(400):
        name = "".join(rng.choice("ab/") for _ in range(rng.randint(1, 6)))
        if name in live and rng.random() < 0.4:
            backend.delete_object(bucket, name)
            live.discard(name)
        else:
            backend.put_object(bucket, name, b"x")
            live.add(name)
    assert sorted(live) == backend.get_bucket(bucket).keys.names
    assert_same_listings(backend, bucket)
