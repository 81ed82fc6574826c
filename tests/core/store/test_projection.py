"""A log object remembers its last fold and re-folds only the items touched since (real Lance logs).

The memo must never change an answer: after any mix of commits (its own or another object's),
maintenance and a log deleted and written again, ``states()`` equals the fold of a fresh object.
"""

from __future__ import annotations

import shutil
from typing import TYPE_CHECKING, Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_datagen.core import CheckpointLog
from airflow_provider_datagen.core.store.table import LanceTable
from tests._support.engine import open_log, raw_events, write_events
from tests._support.profiles import examples

if TYPE_CHECKING:
    import pyarrow as pa
    import pytest


def _sorted(table: pa.Table) -> list[dict[str, Any]]:
    return table.sort_by("item_id").to_pylist()


def _fresh_states(log: CheckpointLog) -> list[dict[str, Any]]:
    return _sorted(open_log(log.root, log.experiment).states())


def _scanned_next_epoch(log: CheckpointLog) -> int:
    return max(raw_events(log)["writer_epoch"].to_pylist(), default=0) + 1


def _write(log: CheckpointLog, writer_id: str, ops: list[tuple[str, int]]) -> None:
    w = log.writer(writer_id, log.next_epoch(), processor_version="v1")  # each write takes over
    with w.batch() as b:
        for op, n in ops:
            item = f"i{n}"
            if op == "create":
                b.item_created(item, input_fingerprint=f"fp{n}")
            elif op == "field":
                b.field_set(item, "x", n)
            elif op == "fail":
                b.failed(item, error="boom", step="s")
            else:
                b.terminal(item)


class ScanCount:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.rows = 0
        self.calls = 0
        original = LanceTable.scan_at

        def scan(log: LanceTable, ds: Any, columns: Any, filter: Any) -> pa.Table:
            table = original(log, ds, columns, filter)
            self.calls += 1
            self.rows += table.num_rows
            return table

        monkeypatch.setattr(LanceTable, "scan_at", scan)
        streamed = LanceTable.batches

        def batches(log: LanceTable, ds: Any, columns: Any, **kw: Any) -> Any:
            self.calls += 1
            for batch in streamed(log, ds, columns, **kw):
                self.rows += batch.num_rows
                yield batch

        monkeypatch.setattr(LanceTable, "batches", batches)


def test_an_unchanged_log_is_not_folded_again(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    log = open_log(tmp_path, "same")
    _write(log, "w", [(op, n) for n in range(50) for op in ("create", "field", "done")])
    first = log.states()
    count = ScanCount(monkeypatch)
    assert log.states().equals(first)
    assert count.calls == 0


def test_a_second_fold_reads_only_the_touched_items(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    log = open_log(tmp_path, "delta")
    _write(log, "w", [(op, n) for n in range(400) for op in ("create", "field", "done")])
    log.states()
    _write(log, "w", [(op, n) for n in range(400, 405) for op in ("create", "done")])
    count = ScanCount(monkeypatch)
    after = log.states()
    assert count.rows < 100  # 5 new items' ids and events, not 1,210 events
    assert _sorted(after) == _fresh_states(log)


def test_max_epoch_reads_only_the_rows_its_last_fold_or_the_projection_has_not_seen(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = open_log(tmp_path, "epoch")
    for _ in range(3):  # three takeovers: epochs 1, 2, 3
        _write(log, "w", [(op, n) for n in range(100) for op in ("create", "field", "done")])
    log.maintain()
    _write(log, "w", [("create", 100)])  # epoch 4, after the projection
    count = ScanCount(monkeypatch)
    fresh = open_log(tmp_path, "epoch")  # no fold of its own: the projection and one new row
    assert fresh.max_epoch() + 1 == 5
    assert count.rows == 1
    fresh.states()
    count.rows = 0
    assert fresh.max_epoch() + 1 == 5  # its own fold covers the log: nothing scanned
    assert count.rows == 0
    assert fresh.max_epoch() + 1 == _scanned_next_epoch(fresh)


def test_a_log_written_again_is_folded_from_scratch(tmp_path: Any) -> None:
    log = open_log(tmp_path, "again")
    _write(log, "w", [("create", n) for n in range(5)])
    _write(log, "w", [("done", n) for n in range(5)])
    assert {r["status"] for r in log.states().to_pylist()} == {"completed"}
    other = open_log(tmp_path, "again")
    shutil.rmtree(other.uri)
    other = open_log(tmp_path, "again")
    _write(other, "w", [("create", n) for n in range(5)])
    _write(other, "w", [("fail", n) for n in range(5)])
    log.table.close()  # as a new process would: the version numbers are the same as before
    assert _sorted(log.states()) == _fresh_states(other)
    assert {r["status"] for r in log.states().to_pylist()} == {"running"}


OPS = st.one_of(
    st.tuples(st.just("write"), st.lists(st.tuples(st.sampled_from(["field", "fail", "done"]), st.integers(0, 30)))),
    st.tuples(st.just("new"), st.lists(st.integers(31, 60), max_size=5)),
    st.tuples(st.just("other"), st.lists(st.tuples(st.sampled_from(["field", "done"]), st.integers(0, 30)))),
    st.tuples(st.just("maintain"), st.none()),
    st.tuples(st.just("states"), st.none()),
)


@settings(max_examples=examples(15), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(OPS, min_size=1, max_size=10))
def test_the_memo_never_changes_an_answer(tmp_path_factory: pytest.TempPathFactory, ops: list[Any]) -> None:
    root = tmp_path_factory.mktemp("memo")
    log = open_log(root, "memo")
    _write(log, "w", [("create", n) for n in range(31)])
    created = set(range(31))
    for op, arg in ops:
        if op == "write":
            _write(log, "w", [(o, n) for o, n in arg if n in created])
        elif op == "new":
            fresh = [n for n in dict.fromkeys(arg) if n not in created]
            created.update(fresh)
            _write(log, "w", [("create", n) for n in fresh])
        elif op == "other":  # another process's writer: this object sees it only through the log
            _write(open_log(root, "memo"), "w2", [(o, n) for o, n in arg if n in created])
        elif op == "maintain":
            log.maintain()
        assert log.max_epoch() + 1 == _scanned_next_epoch(log), ops
        assert _sorted(log.states()) == _fresh_states(log), ops
        assert log.max_epoch() + 1 == _scanned_next_epoch(log), ops


def test_a_dataset_without_stable_row_ids_is_always_folded_whole(tmp_path: Any) -> None:
    # Written by another tool: every row reads as created at version 1, so no delta can be trusted.
    src = open_log(tmp_path, "src")
    _write(src, "w", [("create", n) for n in range(5)])
    log = write_events(raw_events(src), tmp_path, "foreign")
    assert not log.table.dataset().has_stable_row_ids
    assert {r["status"] for r in log.states().to_pylist()} == {"running"}
    _write(log, "w", [("done", n) for n in range(5)])
    assert {r["status"] for r in log.states().to_pylist()} == {"completed"}
    assert _sorted(log.states()) == _fresh_states(log)


def test_a_log_told_not_to_remember_folds_keeps_none(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    log = CheckpointLog.open(tmp_path, pipeline="p", experiment="forget", remember_fold=False)
    _write(log, "w", [(op, n) for n in range(20) for op in ("create", "done")])
    first = log.states()
    assert log.fold_memo is None
    count = ScanCount(monkeypatch)
    assert log.states().equals(first)
    assert count.calls > 0  # folded again


def test_the_ui_reader_holds_no_fold_in_its_open_logs(tmp_path: Any) -> None:
    from airflow_provider_datagen.plugins.data import Reader

    log = open_log(tmp_path, "shown")
    _write(log, "w", [(op, n) for n in range(20) for op in ("create", "done")])
    reader = Reader(str(tmp_path))
    prepared = reader.prepared(log.pipeline, "shown")
    assert prepared.summary["completed"] == 20
    assert reader.log(log.pipeline, "shown").fold_memo is None  # the bounded cache holds the fold


def test_a_planner_stores_its_fold_when_it_covers_many_new_events(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_provider_datagen.core import fold_table
    from airflow_provider_datagen.core.chunks import plan_chunks
    from airflow_provider_datagen.core.store import maintenance as maintenance_module
    from tests._support.engine import light_events

    monkeypatch.setattr(maintenance_module, "PROJECTION_MIN_NEW_EVENTS", 500)
    log = open_log(tmp_path, "planned")
    source = [{"id": f"i{n}"} for n in range(320)]
    _write(log, "w", [(op, n) for n in range(100) for op in ("create", "done")])  # 200 events: too few
    plan_chunks(log, source)
    assert log.projection_version() == 0
    _write(log, "w", [(op, n) for n in range(100, 300) for op in ("create", "field", "done")])
    plan_chunks(log, source)  # 800 events the (absent) projection does not cover
    stored = log.projection_version()
    assert stored == log.version
    count = ScanCount(monkeypatch)
    fresh = open_log(tmp_path, "planned")  # a mapped task: reads the projection, scans no event
    assert _sorted(fresh.states()) == _sorted(fold_table(light_events(log)))
    assert count.rows == 0
    _write(log, "w", [("create", 300), ("done", 300)])
    plan_chunks(log, source)  # 2 new events: the stored fold is close enough
    assert log.projection_version() == stored
    count.rows = 0
    assert _sorted(open_log(tmp_path, "planned").states()) == _sorted(fold_table(light_events(log)))
    assert 0 < count.rows < 10  # the item with new events, re-folded from all of its own


def test_no_fold_is_stored_without_one_of_this_log_or_beside_a_maintenance(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_provider_datagen.core.store.maintenance import MaintenanceLease as _MaintenanceLease

    log = CheckpointLog.open(tmp_path, pipeline="p", experiment="nostore", remember_fold=False)
    _write(log, "w", [(op, n) for n in range(50) for op in ("create", "done")])
    log.states()
    assert not log.refresh_projection(min_new_events=1)  # no fold remembered
    log = open_log(tmp_path, "nostore", pipeline="p")
    assert not log.refresh_projection(min_new_events=1)  # nothing folded yet
    log.states()
    lease = _MaintenanceLease(log.uri)
    assert lease.acquire()
    try:
        assert not log.refresh_projection(min_new_events=1)  # a maintenance holds the log
    finally:
        lease.release()
    assert log.refresh_projection(min_new_events=1)
    assert not log.refresh_projection(min_new_events=1)  # the projection already covers this fold
    _write(log, "w", [("done", 1)])
    assert not log.refresh_projection(min_new_events=1)  # its last fold is the one already stored
