"""The cold fold of a large log, a bucket of items at a time: exactly the rows of the fold at once.

The threshold and the bucket size are forced small so a log of a few hundred events is folded in
many buckets; each log holds several processor versions, failed and replayed items, fan-out
children and edited inputs (real Lance logs, real ``run_items``). Rows may come in another order,
so every comparison is of rows sorted by item id.
"""

from __future__ import annotations

import shutil
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_datagen.core import run_items
from airflow_provider_datagen.core.fold import fold_table
from airflow_provider_datagen.core.schema import LIGHT_COLUMNS
from airflow_provider_datagen.core.store import bucketed_fold, projection
from tests._support.engine import make_items, open_log
from tests._support.profiles import examples
from tests.core.store.test_states_of import RUN, N, failing_on, run

if TYPE_CHECKING:
    from pathlib import Path

    import pytest

    from airflow_provider_datagen.core import CheckpointLog


def _sorted(table: pa.Table) -> list[dict[str, Any]]:
    return table.sort_by("item_id").to_pylist()


def _whole_fold(log: CheckpointLog) -> pa.Table:
    """The fold of every event at once, from a plain scan (the path the bucketed fold must equal)."""
    return fold_table(log.scan(LIGHT_COLUMNS))


class Buckets:
    """Forces the bucketed fold for any log and records how many buckets each fold used."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, events_per_bucket: int = 16) -> None:
        self.used: list[int] = []
        monkeypatch.setattr(bucketed_fold, "BUCKETED_EVENTS", 0)
        monkeypatch.setattr(bucketed_fold, "EVENTS_PER_BUCKET", events_per_bucket)
        original = bucketed_fold.fold_buckets

        def recorded(events: int) -> int:
            k = original(events)
            self.used.append(k)
            return k

        monkeypatch.setattr(bucketed_fold, "fold_buckets", recorded)


def _cold(root: Path, name: str) -> CheckpointLog:
    """A new log object with no memo and no projection: its ``states()`` folds the log."""
    log = open_log(root, name)
    shutil.rmtree(log.projection_uri, ignore_errors=True)
    return open_log(root, name)


@settings(max_examples=examples(10), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    first=RUN,
    ops=st.lists(st.one_of(RUN, st.tuples(st.just("maintain"))), max_size=4),
    extra=st.lists(st.integers(0, N + 3), max_size=6),
)
def test_the_bucketed_fold_gives_the_rows_of_the_whole_fold(
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    first: Any,
    ops: list[Any],
    extra: list[int],
) -> None:
    ops = [first, *ops]
    root = tmp_path_factory.mktemp("bucketed")
    log = open_log(root, "b")
    for k, op in enumerate(ops):
        if op[0] == "run":
            run(log, op, f"w{k}")
        else:
            log.maintain()
    whole = _whole_fold(log)
    with monkeypatch.context() as m:
        buckets = Buckets(m)
        cold = _cold(root, "b")
        states = cold.states()
        assert buckets.used and buckets.used[-1] > 1, ops
        assert _sorted(states) == _sorted(whole), ops
        # the summary counted from the bucketed states is the one of the whole fold
        assert _cold(root, "b").summary() == cold.summary(whole), ops
        children = [i for i in whole["item_id"].to_pylist() if "/" in i][:5]
        ids = list(dict.fromkeys([*(str(i) for i in extra), *children, "nope", "0/9/9"]))
        table, index = _cold(root, "b").states_for(ids)
        assert _sorted(table) == _sorted(whole), ops
        known = set(whole["item_id"].to_pylist())
        got = table["item_id"].to_pylist()
        assert [got[i] if i >= 0 else None for i in index.tolist()] == [i if i in known else None for i in ids]


def test_maintenance_after_a_bucketed_fold_stores_the_whole_fold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = open_log(tmp_path, "m")
    first, edited = make_items(N), make_items(N, salt="-edited")[:6]
    run_items(log, first, failing_on({"2", "5"}, "steps"), processor_version="v1", writer_id="a", epoch=1)
    run_items(log, edited, failing_on({"3"}, "flat"), processor_version="v2", writer_id="b", epoch=2)
    whole = _whole_fold(log)
    buckets = Buckets(monkeypatch)
    # a planner's fold, remembered and stored as it is
    cold = _cold(tmp_path, "m")
    cold.states()
    assert cold.refresh_projection(min_new_events=0)
    stored = projection.read_projection(cold, cold.version)
    assert stored is not None and _sorted(stored.states) == _sorted(whole)
    # maintenance folding the log itself (no memo, no projection)
    again = _cold(tmp_path, "m")
    again.maintain()
    stored = projection.read_projection(again, again.version)
    assert stored is not None and _sorted(stored.states) == _sorted(whole)
    assert len(buckets.used) == 2 and min(buckets.used) > 1
    # and the summary read from that projection's stored counts is the whole fold's
    assert open_log(tmp_path, "m").summary() == again.summary(whole)


def test_a_small_log_is_folded_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = open_log(tmp_path, "s")
    run_items(log, make_items(N), failing_on({"1"}, "steps"), writer_id="a", epoch=1)
    calls: list[int] = []
    monkeypatch.setattr(bucketed_fold, "fold_bucketed", lambda *a: calls.append(1))
    assert _sorted(_cold(tmp_path, "s").states()) == _sorted(_whole_fold(log))
    assert calls == []  # below BUCKETED_EVENTS: no spill, today's streamed fold


def test_an_empty_bucket_and_a_bucket_count_past_the_events_fold_to_the_same_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = open_log(tmp_path, "e")
    run_items(log, make_items(3), failing_on(set(), "flat"), writer_id="a", epoch=1)
    buckets = Buckets(monkeypatch, events_per_bucket=1)  # more buckets than items: some hold nothing
    states = _cold(tmp_path, "e").states()
    assert buckets.used[-1] > 3
    assert _sorted(states) == _sorted(_whole_fold(log))


def test_rows_in_finds_each_id_and_repeats_take_their_first_row() -> None:
    states = pa.table({"item_id": ["a", "b", "c/0", "d"]})
    ids = pa.array(["d", "x", "a", "c/0", "d", "b/1"], pa.string())
    assert bucketed_fold.rows_in(states, ids).tolist() == [3, -1, 0, 2, 3, -1]
    assert bucketed_fold.rows_in(states, ids).tolist() == projection.rows_of(states, ids).tolist()
    assert bucketed_fold.rows_in(states.slice(0, 0), ids).tolist() == [-1] * 6


def test_the_bucket_count_follows_the_events() -> None:
    per = bucketed_fold.EVENTS_PER_BUCKET
    assert bucketed_fold.fold_buckets(0) == 2
    assert bucketed_fold.fold_buckets(per * 3) == 4
    assert bucketed_fold.fold_buckets(49_000_000) == 64
    assert bucketed_fold.fold_buckets(per * 10_000) == bucketed_fold.MAX_BUCKETS
