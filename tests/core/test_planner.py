"""``plan_resume(redo_completed=...)`` on real Lance logs: a processor-version bump and done items (issue 15.1)."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_datagen.core import plan_resume, run_items, status_of
from airflow_provider_datagen.core.chunks import plan_chunks
from airflow_provider_datagen.exceptions import ConfigurationError
from tests._support.engine import flat_output, make_items, open_log


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
