"""``CheckpointLog.summary()`` counted from the projection's tally and the items changed since.

Whatever the log went through, the status must be the very dict the whole fold gives
(``summary(states())``): same keys, same counts, same failed-id sample, usage included.
"""

from __future__ import annotations

import itertools
import json
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_datagen.core import run_items, status_of
from airflow_provider_datagen.core.status import FAILED_SAMPLE, STATUS_KEYS, Tally, tally
from airflow_provider_datagen.core.store import lance_io, projection
from airflow_provider_datagen.core.store import tally as tally_module
from airflow_provider_datagen.operators.base import folded_status
from tests._support.engine import make_items, open_log
from tests._support.profiles import examples
from tests.core.store.test_projection import ScanCount
from tests.core.store.test_states_of import OPS, N, failing_on, run

if TYPE_CHECKING:
    import pytest

    from airflow_provider_datagen.core import CheckpointLog


def _folded(root: Any, experiment: str) -> dict[str, Any]:
    fresh = open_log(root, experiment)
    return fresh.summary(fresh.states())


def _counted(root: Any, experiment: str) -> tuple[dict[str, Any], Tally | None]:
    fresh = open_log(root, experiment)
    ds = fresh.table.dataset()
    return fresh.summary(), None if ds is None else tally_module.stored_tally(fresh.table, ds)


@settings(max_examples=examples(12), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(OPS, min_size=1, max_size=6))
def test_the_counted_status_is_the_folded_one(tmp_path_factory: pytest.TempPathFactory, ops: list[Any]) -> None:
    root = tmp_path_factory.mktemp("tally")
    log = open_log(root, "t")
    for k, op in enumerate(ops):
        if op[0] == "run":
            run(log, op, f"w{k}")
        elif op[0] == "maintain":
            log.maintain()
        else:
            folded_status(open_log(root, "t"))  # what a mapped task does last
        status, counted = _counted(root, "t")
        assert list(status) == list(STATUS_KEYS)
        assert status == _folded(root, "t"), ops
        if log.projection_version():  # every projection written here carries its tally
            assert counted is not None, ops


@settings(max_examples=examples(12), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ops=st.lists(OPS, min_size=1, max_size=4),
    cuts=st.lists(st.integers(0, 400), max_size=5),
    keep=st.sampled_from([1, 2, 1000]),
)
def test_tallies_of_a_tables_batches_join_to_the_tables(
    tmp_path_factory: pytest.TempPathFactory, ops: list[Any], cuts: list[int], keep: int
) -> None:
    """How a streamed projection is tallied: batch by batch, joined; the first ``keep`` failed ids survive."""
    root = tmp_path_factory.mktemp("joined")
    log = open_log(root, "t")
    for k, op in enumerate(ops):
        if op[0] == "run":
            run(log, op, f"w{k}")
    states = log.states()
    bounds = sorted({0, states.num_rows, *(c for c in cuts if c < states.num_rows)})
    joined = Tally()
    for lo, hi in itertools.pairwise(bounds):
        joined = joined.joined(tally(states.slice(lo, hi - lo), keep=keep), keep)
    assert joined == tally(states, keep=keep)


def _projection_rows(log: CheckpointLog) -> int:
    stored = projection.open_projection(log)
    assert stored is not None
    return stored.dataset.count_rows()


def test_a_status_after_a_chunk_reads_only_the_chunks_items(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    log = open_log(tmp_path, "cost")
    run_items(log, make_items(300), failing_on({"7", "8"}, "flat"), writer_id="w", epoch=1)
    log.maintain()
    run_items(log, make_items(300)[5:10], failing_on({"8"}, "flat"), writer_id="w2", epoch=2)  # 7 now succeeds
    # items 7 and 8 had two events each (created, failed) when the projection was stored; 5, 6 and 9
    # were done and skipped. The status reads the rows since, then every event of the two items they
    # name, which the projection held: nothing of the other 298 items.
    seven, eight = len(log.events("7")), len(log.events("8"))
    count = ScanCount(monkeypatch)
    status = open_log(tmp_path, "cost").summary()
    assert (status["completed"], status["failed_items"], status["failed_item_ids"]) == (299, 1, ["8"])
    # and the usage ledger reads the rows since its own projection once more (usage_projection.rows_after)
    since = (seven - 2) + (eight - 2)
    assert count.rows == since + seven + eight + since
    assert status == _folded(tmp_path, "cost")


def test_status_of_without_a_source_counts_as_summary_does(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    log = open_log(tmp_path, "status_of")
    run_items(log, make_items(300), failing_on({"7"}, "flat"), writer_id="w", epoch=1)
    log.maintain()
    run_items(log, make_items(310)[300:], failing_on(set(), "flat"), writer_id="w2", epoch=2)
    count = ScanCount(monkeypatch)
    status = status_of(open_log(tmp_path, "status_of"))
    counted_rows = count.rows
    assert (status["completed"], status["failed_items"], status["total"]) == (309, 1, 310)
    count.rows = 0
    assert status == open_log(tmp_path, "status_of").summary()
    assert counted_rows == count.rows  # the very reads of summary(): the ten new items, not the 300 folded
    assert counted_rows < 310
    assert status == _folded(tmp_path, "status_of")


def test_failed_ids_past_the_kept_ones_are_read_again(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(projection, "TALLY_FAILED_IDS", FAILED_SAMPLE + 2)
    log = open_log(tmp_path, "failed")
    items = make_items(40)
    run_items(log, items, failing_on({str(i) for i in range(40)}, "flat"), writer_id="w", epoch=1)
    log.maintain()
    kept = projection.stored_tally(projection.open_projection(log))  # type: ignore[arg-type]
    assert kept is not None and kept.failed == 40 and len(kept.failed_ids) == FAILED_SAMPLE + 2
    # the first kept ids succeed now: fewer than FAILED_SAMPLE of the kept ones are still failed
    cleared = list(kept.failed_ids[:5])
    run_items(log, [it for it in items if str(it["id"]) in cleared], failing_on(set(), "flat"), writer_id="w2", epoch=2)
    status = open_log(tmp_path, "failed").summary()
    assert status["failed_items"] == 35
    assert status == _folded(tmp_path, "failed")
    assert not set(cleared) & set(status["failed_item_ids"])


def test_replaced_refuses_a_sample_it_cannot_vouch_for() -> None:
    base = Tally(roots=30, statuses={"running": 30}, failed=30, failed_ids=tuple(f"{i:02d}" for i in range(21)))
    old = Tally(roots=2, statuses={"running": 2}, failed=2, failed_ids=("00", "01"))
    done = Tally(roots=2, statuses={"completed": 2}, completed_by_version={"v1": 2})
    assert base.replaced(old, done) is None  # 19 kept ids left, and ids past "20" were never listed
    full = Tally(roots=30, statuses={"running": 30}, failed=30, failed_ids=tuple(f"{i:02d}" for i in range(30)))
    after = full.replaced(old, done)
    assert after is not None
    assert after.statuses == {"completed": 2, "running": 28}
    assert (after.completed_by_version, after.failed) == ({"v1": 2}, 28)
    assert after.failed_ids[:2] == ("02", "03")


def test_a_projection_without_a_tally_or_too_many_changes_is_folded(tmp_path: Any) -> None:
    log = open_log(tmp_path, "old")
    run_items(log, make_items(N), failing_on({"1"}, "flat"), writer_id="w", epoch=1)
    log.maintain()
    stored = projection.open_projection(log)
    assert stored is not None
    table = stored.dataset.to_table().replace_schema_metadata(
        {k.decode(): v.decode() for k, v in (stored.dataset.schema.metadata or {}).items() if k != b"tally"}
    )
    lance_io.overwrite_dataset(table, log.projection_uri, None)  # as written before tallies existed
    fresh = open_log(tmp_path, "old")
    assert tally_module.stored_tally(fresh.table, fresh.table.dataset()) is None
    assert fresh.summary() == _folded(tmp_path, "old")
    log.maintain()  # a new projection carries its tally again
    more = [{"id": 1000 + i, "text": "x"} for i in range(1100)]
    run_items(log, more, failing_on(set(), "flat"), writer_id="w2", epoch=2)  # far more than half the items
    fresh = open_log(tmp_path, "old")
    assert tally_module.stored_tally(fresh.table, fresh.table.dataset()) is None
    assert fresh.summary() == _folded(tmp_path, "old")


def test_the_stored_tally_is_the_tally_of_the_stored_rows(tmp_path: Any) -> None:
    log = open_log(tmp_path, "meta")
    run_items(log, make_items(N), failing_on({"2", "3"}, "flat"), writer_id="w", epoch=1)
    log.maintain()
    stored = projection.open_projection(log)
    assert stored is not None
    raw = json.loads((stored.dataset.schema.metadata or {})[b"tally"])
    assert raw["failed_ids"] == ["2", "3"]
    rows = stored.dataset.to_table().replace_schema_metadata(None)
    assert projection.stored_tally(stored) == tally(pa.Table.from_batches(rows.to_batches()), keep=None)
