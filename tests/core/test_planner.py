"""``plan_resume(redo_completed=...)`` on real Lance logs: a processor-version bump and done items (issue 15.1)."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from airflow_provider_datagen.core import plan_resume, planner, run_items, status_of
from airflow_provider_datagen.core.chunks import plan_chunks
from airflow_provider_datagen.exceptions import ConfigurationError, InvalidItemError
from tests._support.engine import calling_threads, flat_output, make_items, open_log


@pytest.fixture
def log(tmp_path: Any) -> Any:
    """Items 0-5 under v1: 0-3 completed, 4 filtered, 5 running (a v1 attempt that failed)."""
    lg = open_log(tmp_path, "main")

    def process(item: dict[str, Any], ctx: Any) -> dict[str, Any] | None:
        if item["id"] == 4:
            ctx.filter(reason="short")
            return None
        if item["id"] == 5:
            raise ValueError("flaky model")
        return flat_output(item)

    run_items(lg, make_items(6), process, processor_version="v1")
    return lg


def test_by_default_a_version_bump_keeps_done_items_and_counts_them(log: Any) -> None:
    plan = plan_resume(log, make_items(6), processor_version="v2")
    assert plan.skip == ["0", "1", "2", "3", "4"]
    assert plan.demoted == ["5"]  # only the in-flight item restarts
    assert plan.kept_other_version == {"v1": 5}
    assert plan_resume(log, make_items(6), processor_version="v2", redo_completed="never").skip == plan.skip


def test_other_version_makes_done_items_of_another_version_pending(log: Any) -> None:
    plan = plan_resume(log, make_items(7), processor_version="v2", redo_completed="other_version")
    assert plan.skip == []
    assert plan.demoted == ["0", "1", "2", "3", "4", "5"]  # filtered items are redone too
    assert plan.fresh == ["6"]
    assert plan.pending == ["0", "1", "2", "3", "4", "5", "6"]
    assert plan.kept_other_version == {}
    assert set(plan.last_seq) == {str(i) for i in range(6)}  # the new generation appends after the old one


def test_other_version_still_skips_items_done_under_the_current_version(log: Any) -> None:
    plan = plan_resume(log, make_items(6), processor_version="v1", redo_completed="other_version")
    assert (plan.skip, plan.replay, plan.demoted) == (["0", "1", "2", "3", "4"], ["5"], [])


def test_an_edited_item_stays_invalidated_whatever_redo_completed(log: Any) -> None:
    items = make_items(6)
    items[0]["text"] = "edited"
    plan = plan_resume(log, items, processor_version="v2", redo_completed="other_version")
    assert plan.invalidated == ["0"] and "0" not in plan.demoted


@pytest.mark.parametrize("bad", ["always", "", None, True, "Other_Version"])
def test_a_bad_redo_completed_is_refused_naming_both_values(log: Any, bad: Any) -> None:
    with pytest.raises(
        ConfigurationError, match=r"^plan_resume: redo_completed=.* is not one of 'never', 'other_version'; pass"
    ):
        plan_resume(log, make_items(6), processor_version="v2", redo_completed=bad)


def test_plan_chunks_carry_the_choice_and_refuse_a_bad_value_before_any_write(log: Any) -> None:
    version = log.version
    with pytest.raises(ConfigurationError, match=r"^plan_chunks: redo_completed='all' is not one of"):
        plan_chunks(log, make_items(6), processor_version="v2", redo_completed="all")
    assert log.version == version
    result = plan_chunks(log, make_items(6), processor_version="v2", chunk_size=4, redo_completed="other_version")
    assert [c["item_ids"] for c in result.chunks] == [["0", "1", "2", "3"], ["4", "5"]]
    assert {c["redo_completed"] for c in result.chunks} == {"other_version"}
    assert {c["redo_completed"] for c in plan_chunks(log, make_items(6), processor_version="v2").chunks} == {"never"}


def test_status_counts_completed_items_by_processor_version(log: Any) -> None:
    assert log.summary()["completed_by_version"] == {"v1": 4}
    run_items(
        log, make_items(6)[:2], lambda item, ctx: {"v": 2}, processor_version="v2", redo_completed="other_version"
    )
    assert log.summary()["completed_by_version"] == {"v1": 2, "v2": 2}
    # with a source: only its items that are done for their current input count
    items = make_items(6)
    items[3]["text"] = "edited"
    assert status_of(log, items)["completed_by_version"] == {"v1": 1, "v2": 2}
    assert status_of(log, make_items(1))["completed_by_version"] == {"v2": 1}


def source_of_every_class() -> list[dict[str, Any]]:
    items = make_items(9)  # 6-8 never seen
    items[2]["text"] = "edited"  # invalidated
    return items[::-1]


def test_a_large_raw_source_reads_its_states_beside_the_fingerprinting_and_plans_the_same(
    log: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    items = source_of_every_class()
    threads = calling_threads(monkeypatch, "states_for")
    expected = plan_resume(log, items, processor_version="v2")
    assert threads == ["MainThread"]  # below READ_AHEAD_ROWS: one read, after the fingerprints
    assert expected.invalidated == ["2"] and expected.fresh == ["8", "7", "6"] and expected.demoted == ["5"]
    monkeypatch.setattr(planner, "READ_AHEAD_ROWS", 2)
    before = sys.getswitchinterval()
    threads.clear()
    assert plan_resume(log, items, processor_version="v2") == expected
    assert len(threads) == 1 and threads[0].startswith("datagen-plan")  # one read, beside, and used
    assert sys.getswitchinterval() == before
    # str keys too (ids as given), and an explicit states table needs no read at all
    threads.clear()
    named = [{**item, "id": f"k{item['id']}"} for item in items]
    assert plan_resume(log, named) == plan_resume(log, named, states=log.states())
    assert len(threads) == 1 and threads[0].startswith("datagen-plan")  # the second plan read nothing


def test_a_read_ahead_is_dropped_when_the_fingerprinting_declines_or_finds_a_repeat(
    log: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a key with a '/' is no id as given: the read of the keys is dropped and the items' ids read
    items = [{**item, "id": f"k{item['id']}"} for item in source_of_every_class()] + [{"id": "a/b", "text": "x"}]
    repeated = [*make_items(4), make_items(4)[1]]
    with pytest.raises(InvalidItemError) as alone:
        plan_resume(log, repeated)
    expected = plan_resume(log, items, processor_version="v2")
    assert expected.fresh[-1] == "a%2Fb"
    monkeypatch.setattr(planner, "READ_AHEAD_ROWS", 2)
    threads = calling_threads(monkeypatch, "states_for")
    assert plan_resume(log, items, processor_version="v2") == expected
    assert len(threads) == 2 and threads[0].startswith("datagen-plan") and threads[1] == "MainThread"
    # a repeated key: Arrow's count says so, and prepare_items raises the error naming both items
    with pytest.raises(InvalidItemError) as ahead:
        plan_resume(log, repeated)
    assert str(ahead.value) == str(alone.value) and "duplicate" in str(ahead.value)
