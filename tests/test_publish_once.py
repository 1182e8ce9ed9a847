"""Publish-once over NFSv3: a LINK the server did, retransmitted, answers EEXIST; the winner still won."""

from __future__ import annotations

import os

from data_juicer_elastic.storage import files
from data_juicer_elastic.storage.files import publish_once


def test_a_retransmitted_link_that_answers_eexist_is_still_this_call_s_win(tmp_path, monkeypatch):
    real_link = os.link

    def link_then_retransmit(src, dst, *args, **kwargs):  # the server did the first LINK; the reply was lost
        real_link(src, dst, *args, **kwargs)
        raise FileExistsError(17, "File exists", str(dst))

    monkeypatch.setattr(files.os, "link", link_then_retransmit)
    target = tmp_path / "done.json"
    assert publish_once(target, b'{"attempt": 1}') is not None
    assert target.read_bytes() == b'{"attempt": 1}'
    monkeypatch.setattr(files.os, "link", real_link)
    assert publish_once(target, b'{"attempt": 2}') is None  # a real lost race stays one
    assert target.read_bytes() == b'{"attempt": 1}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["done.json"]  # no temp file left behind


def test_the_shared_clock_rides_out_a_mount_that_hiccups(tmp_path):
    """A clock probe that fails for a moment (here its folder is briefly not a folder) is retried, not raised:
    one OSError used to end the claim loop."""
    import shutil
    import threading
    import time

    from data_juicer_elastic.storage.files import server_now

    folder = tmp_path / "clock"
    folder.write_bytes(b"")  # ENOTDIR for the probe inside it

    def heal() -> None:
        time.sleep(0.5)
        folder.unlink()

    threading.Thread(target=heal).start()
    assert abs(server_now(folder / "probe") - time.time()) < 60
    shutil.rmtree(folder)
    folder.write_bytes(b"")
    try:
        server_now(folder / "probe", retry_secs=0.3)
    except NotADirectoryError:
        pass
    else:
        raise AssertionError("a lasting error must still be raised once the retry time is spent")
