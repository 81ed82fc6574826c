"""``CheckpointLog.states_of(ids)``: the rows of the whole fold for some items, read from their events alone.

A mapped task classifies its chunk with it instead of folding the log; it must give exactly the rows
``states()`` gives for those ids, whatever happened to them: several processor versions, failed and
replayed items, fan-out children, edited inputs, maintenance (real Lance logs, real ``run_items``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_datagen.core import run_items
from airflow_provider_datagen.core.store import projection
from tests._support.engine import make_items, open_log, steps_pipeline
from tests._support.profiles import examples
from tests.core.store.test_projection import ScanCount

if TYPE_CHECKING:
    import pytest

    from airflow_provider_datagen.core import CheckpointLog

N = 12


def _sorted(table: pa.Table) -> list[dict[str, Any]]:
    return table.sort_by("item_id").to_pylist()


def _rows_for(states: pa.Table, ids: list[str]) -> list[dict[str, Any]]:
    return _sorted(states.filter(pc.is_in(states["item_id"], value_set=pa.array(ids, pa.string()))))


def failing_on(failing: set[str], kind: str) -> Any:
    """A flat process or the steps pipeline (children), where the items in ``failing`` raise."""

    def flat(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        if ctx.item_id in failing:
            raise ValueError(f"boom {ctx.item_id}")
        return {"text": item["text"].upper()}

    if kind == "flat":
        return flat

    def hook(step: str, ctx: Any) -> None:
        if step == "leaf" and ctx.item_id.split("/")[0] in failing:
            raise ValueError(f"boom {ctx.item_id}")

    return steps_pipeline(hook)


def run(log: CheckpointLog, op: tuple[Any, ...], writer: str) -> None:
    _, pv, kind, ids, fail, redo, salt = op
    chosen = [it for it in make_items(N, salt=salt) if it["id"] in ids]
    run_items(
        log,
        chosen,
        failing_on({str(i) for i in fail}, kind),
        processor_version=pv,
        writer_id=writer,
        epoch=log.next_epoch(),
        redo_completed=redo,
    )


RUN = st.tuples(
    st.just("run"),
    st.sampled_from(["v1", "v2"]),
    st.sampled_from(["flat", "steps"]),
    st.sets(st.integers(0, N - 1), min_size=1),
    st.sets(st.integers(0, N - 1), max_size=4),
    st.sampled_from(["never", "other_version"]),
    st.sampled_from(["", "-edited"]),
)
OPS = st.one_of(RUN, st.tuples(st.just("maintain")), st.tuples(st.just("fold")))


@settings(max_examples=examples(12), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(OPS, min_size=1, max_size=6), extra=st.lists(st.integers(0, N + 3), max_size=6))
def test_states_of_gives_the_rows_of_the_whole_fold(
    tmp_path_factory: pytest.TempPathFactory, ops: list[Any], extra: list[int]
) -> None:
    root = tmp_path_factory.mktemp("states_of")
    log = open_log(root, "of")
    for k, op in enumerate(ops):
        if op[0] == "run":
            run(log, op, f"w{k}")
        elif op[0] == "maintain":
            log.maintain()
        else:  # a fold this object remembers, stored as the projection (as a planner or a status does)
            log.states()
            log.refresh_projection(min_new_events=0)
        whole = open_log(root, "of").states()
        children = [i for i in whole["item_id"].to_pylist() if "/" in i][:5]
        # roots with and without events, children, and ids no item has
        ids = list(dict.fromkeys([*(str(i) for i in extra), *children, "nope", "0/9/9"]))
        for reader in (log, open_log(root, "of")):
            assert _sorted(reader.states_of(ids)) == _rows_for(whole, ids), ops


def test_a_chunk_read_scans_only_its_own_items_events(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    log = open_log(tmp_path, "cost")
    run_items(log, make_items(200), failing_on({"3"}, "flat"), writer_id="w", epoch=1)
    log.maintain()
    run_items(log, make_items(220)[200:], failing_on(set(), "flat"), writer_id="w2", epoch=2)
    count = ScanCount(monkeypatch)
    fresh = open_log(tmp_path, "cost")
    got = fresh.states_of(["3", "5", "210"])
    assert {r["item_id"]: (r["status"], r["failures"]) for r in got.to_pylist()} == {
        "3": ("running", 1),
        "5": ("completed", 0),
        "210": ("completed", 0),
    }
    # every event of these three items (on both sides of the maintenance), and no other row
    assert count.rows == sum(len(open_log(tmp_path, "cost").events(i)) for i in ("3", "5", "210"))
    assert fresh.fold_memo is None  # nothing of the whole log is folded or remembered


def test_many_ids_are_taken_from_the_whole_fold(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(projection, "STATES_OF_MAX", 5)
    log = open_log(tmp_path, "many")
    run_items(log, make_items(20), failing_on({"4"}, "flat"), writer_id="w", epoch=1)
    ids = [str(i) for i in range(0, 30, 2)]
    fresh = open_log(tmp_path, "many")
    assert _sorted(fresh.states_of(ids)) == _rows_for(log.states(), ids)
    assert fresh.fold_memo is not None  # the whole fold, remembered as states() does


def test_an_empty_log_or_no_ids_give_no_rows(tmp_path: Any) -> None:
    log = open_log(tmp_path, "empty")
    assert log.states_of(["a"]).num_rows == 0
    run_items(log, make_items(3), failing_on(set(), "flat"), writer_id="w", epoch=1)
    assert log.states_of([]).num_rows == 0
    assert log.states_of(pa.array(["1"], pa.string()))["item_id"].to_pylist() == ["1"]
