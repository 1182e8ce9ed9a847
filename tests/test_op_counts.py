"""Per-op row counting without Ray: the counters' files, the hooks on Data-Juicer's ops, the per-op record.

Ray itself is exercised by test_runner (task, warm and cold actor ops) and
test_console (rows removed by op errors, end to end).
"""

from __future__ import annotations

import multiprocessing
import os
import shutil

import pyarrow as pa
import pytest

from data_juicer_elastic.ray_runner.op_counts import tally as op_tally
from data_juicer_elastic.ray_runner.op_counts.collect import per_op
from data_juicer_elastic.ray_runner.op_counts.hooks import CountedOp, Target, count_op, counted_actor

IN, OUT, ERR, IN_CALLS, OUT_CALLS = range(op_tally.WIDTH)


def _add_in_child(sink: str) -> None:
    op_tally.add(sink, 0, (5, 4, 1, 1, 1))


def test_counters_of_many_processes_and_a_grown_file_are_summed(tmp_path):
    sink = str(tmp_path / "sink")
    os.mkdir(sink)
    op_tally.add(sink, 0, (10, 9, 0, 1, 1))
    op_tally.add(sink, 40, (3, 0, 0, 1, 0))  # past the first mapping: the file grows, counts stay
    op_tally.add(sink, 0, (1, 1, 0, 1, 1))
    child = multiprocessing.get_context("fork").Process(target=_add_in_child, args=(sink,))
    child.start()
    child.join()
    assert child.exitcode == 0
    assert len(os.listdir(sink)) == 2  # one file per process
    counters = op_tally.read(sink)
    assert counters[0] == [16, 14, 1, 3, 3]
    assert counters[40] == [3, 0, 0, 1, 0]
    assert all(c == [0] * op_tally.WIDTH for i, c in enumerate(counters) if i not in (0, 40))


def test_a_reused_process_counts_each_attempt_apart_and_lets_go_of_gone_ones(tmp_path):
    first, second = str(tmp_path / "a1"), str(tmp_path / "a2")
    os.mkdir(first)
    os.mkdir(second)
    op_tally.add(first, 1, (7, 7, 0, 1, 1))
    shutil.rmtree(first)  # the runner collected it
    op_tally.add(second, 1, (2, 2, 0, 1, 1))
    assert first not in op_tally._mappings and second in op_tally._mappings
    assert op_tally.read(second)[1] == [2, 2, 0, 1, 1]
    op_tally.add(first, 0, (1, 1, 0, 1, 1))  # a straggler batch of the ended attempt: not an error
    assert not os.path.exists(first)


def _names(*kinds: str) -> list[tuple[str, str]]:
    return [(f"op{i}", kind) for i, kind in enumerate(kinds)]


def test_per_op_takes_rows_out_from_the_counters_or_the_neighbours():
    mapper, filt, dedup = [100, 100, 0, 4, 4], [100, 60, 2, 4, 4], [0, 0, 0, 0, 0]
    after_dedup = [50, 50, 0, 3, 3]
    ops = per_op(_names("Mapper", "Filter", "Deduplicator", "Mapper"), [mapper, filt, dedup, after_dedup], 100, 50)
    assert [(o["rows_in"], o["rows_out"], o["error_rows"]) for o in ops] == [
        (100, 100, 0),
        (100, 60, 2),
        (60, 50, 0),  # what the next op counted in
        (50, 50, 0),
    ]
    assert [o["counted"] for o in ops] == [True, True, False, True]
    last = per_op(_names("Mapper", "Deduplicator"), [mapper], 100, 42)
    assert last[1]["rows_out"] == 42  # the shard's output rows
    zero = [0] * op_tally.WIDTH
    twice = per_op(_names("Deduplicator", "Deduplicator", "Mapper"), [zero, zero, [5, 5, 0, 1, 1]], 100, 5)
    assert [(o["rows_in"], o["rows_out"]) for o in twice] == [(100, None), (None, 5), (5, 5)]  # one unknown


def test_per_op_counts_an_op_that_got_no_rows_as_zero():
    ops = per_op(_names("Filter", "Mapper"), [[10, 0, 0, 1, 1]], 10, 0)
    assert [(o["rows_in"], o["rows_out"]) for o in ops] == [(10, 0), (0, 0)]


# --------------------------------------------------------------------------- hooks on real Data-Juicer ops
@pytest.fixture
def sink(tmp_path):
    path = tmp_path / "sink"
    path.mkdir()
    return str(path)


def _table(ids: list[int]) -> pa.Table:
    return pa.table({"id": ids, "text": [f"  row {i} " + "x" * (i % 7) for i in ids]})


def _cursed_mapper(**kwargs):
    from data_juicer.ops.base_op import Mapper

    class Cursed(Mapper):
        def process_single(self, sample):
            if sample["id"] == 3:
                raise ValueError("cursed")
            return sample

    return Cursed(**kwargs)


def test_a_batched_mapper_counts_rows_in_and_out(sink):
    from data_juicer.ops.mapper.whitespace_normalization_mapper import WhitespaceNormalizationMapper

    op = WhitespaceNormalizationMapper()
    count_op(op, Target(sink, 0))
    out = op.process(_table(list(range(10))))
    assert out["text"][0] == "row 0"  # Data-Juicer's own result
    op.process(_table([10, 11]))
    assert op_tally.read(sink)[0] == [12, 12, 0, 2, 2]


def test_a_single_sample_mapper_counts_the_row_that_raised_and_keeps_skip_op_error(sink):
    op = _cursed_mapper(skip_op_error=True)
    count_op(op, Target(sink, 2))
    outs = [op.process(_table([i])) for i in range(5)]  # Ray hands a single-sample op one-row batches
    assert [len(o["id"]) for o in outs] == [1, 1, 1, 0, 1]
    assert op_tally.read(sink)[2] == [5, 4, 1, 5, 5]


def test_without_skip_op_error_the_error_propagates_uncounted(sink):
    op = _cursed_mapper(skip_op_error=False)
    count_op(op, Target(sink, 0))
    with pytest.raises(ValueError, match="cursed"):
        op.process(_table([3]))
    assert not os.listdir(sink) or op_tally.read(sink)[0][ERR] == 0


def test_a_batched_filter_counts_rows_in_and_rows_kept(sink):
    from data_juicer.core.data.ray_dataset import filter_batch
    from data_juicer.ops.filter.text_length_filter import TextLengthFilter
    from data_juicer.utils.constant import Fields

    op = TextLengthFilter(min_len=10)
    count_op(op, Target(sink, 1))
    table = _table(list(range(14)))
    table = table.append_column(Fields.stats, [[{} for _ in range(table.num_rows)]])
    stats = pa.Table.from_pydict(op.compute_stats(table))
    kept = filter_batch(stats, op.process)
    assert kept.num_rows == sum(len(t) >= 10 for t in table["text"].to_pylist())
    assert op_tally.read(sink)[1] == [14, kept.num_rows, 0, 1, 1]


def test_a_single_sample_filter_counts_each_row_it_keeps(sink):
    from data_juicer.ops.base_op import Filter
    from data_juicer.utils.constant import Fields

    class LongText(Filter):
        def compute_stats_single(self, sample):
            sample[Fields.stats]["n"] = len(sample["text"])
            return sample

        def process_single(self, sample):
            return sample[Fields.stats]["n"] >= 10

    op = LongText(skip_op_error=True)
    count_op(op, Target(sink, 0))
    rows = [{"text": t, Fields.stats: {}} for t in ("short", "long enough text", "x" * 12)]
    stats = [op.compute_stats(pa.Table.from_pylist([r])) for r in rows]  # one-row batches, as Ray gives them
    kept = [op.process({k: v[0] for k, v in s.items()}) for s in stats]  # Ray's filter(): one row at a time
    assert kept == [False, True, True]
    assert op_tally.read(sink)[0] == [3, 2, 0, 3, 3]


def test_an_actor_built_from_the_op_class_counts_like_the_op(sink):
    from data_juicer.ops.mapper.whitespace_normalization_mapper import WhitespaceNormalizationMapper

    kw = counted_actor(WhitespaceNormalizationMapper, {"fn_constructor_kwargs": {"text_key": "text"}}, Target(sink, 3))
    actor = CountedOp(*kw["fn_constructor_args"])
    assert actor(_table([1, 2, 3]))["text"] == ["row 1 x", "row 2 xx", "row 3 xxx"]
    assert op_tally.read(sink)[3] == [3, 3, 0, 1, 1]


def test_a_target_with_no_folder_counts_nothing(tmp_path):
    op = _cursed_mapper(skip_op_error=True)
    target = Target()
    count_op(op, target)
    assert len(op.process(_table([3]))["id"]) == 0
    target.sink, target.index = str(tmp_path), 0  # a warm actor re-aims its op per batch
    op.process(_table([3]))
    assert op_tally.read(str(tmp_path))[0] == [1, 0, 1, 1, 1]
