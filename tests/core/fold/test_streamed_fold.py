"""A cold fold of a real Lance log streams its light columns in batches (two scans of one version).

However the scans are cut into batches, the states and the plan are those of a fold of the whole
table; scans of one version that disagree are a corrupted log, never a misaligned fold.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from airflow_provider_datagen.core import fold_table, plan_resume, prepare_items, run_items
from airflow_provider_datagen.core.planner import classify
from airflow_provider_datagen.core.store import table as table_module
from airflow_provider_datagen.exceptions import LogCorruptedError
from tests._support.engine import light_events, make_items, open_log

if TYPE_CHECKING:
    from airflow_provider_datagen.core import CheckpointLog


def _flaky(item: dict[str, Any], ctx: Any) -> dict[str, Any] | None:
    if item["id"] % 7 == 3:
        raise ValueError("flaky")
    if item["id"] % 11 == 5:
        ctx.filter("odd one out")
        return None
    return {"out": item["id"] * 2}


def _log_with_history(tmp_path: Any) -> tuple[CheckpointLog, list[dict[str, Any]]]:
    """A log with completed, failed, filtered, re-run and edited items, in many commits by two epochs."""
    log = open_log(tmp_path, "streamed")
    items = make_items(60)
    # the rerun replays the failed items first, in a row with one error: no stop for repeated failures
    run_items(log, items, _flaky, checkpoint_every=4, max_repeated_failures=None)
    edited = [dict(it, text="edited") if it["id"] % 5 == 0 else it for it in items]
    edited += [dict(it, id=it["id"] + 60) for it in make_items(10)]
    run_items(log, edited, _flaky, checkpoint_every=9, max_repeated_failures=None)
    return log, edited


@pytest.mark.parametrize("rows", [1, 7, 64])
def test_a_fold_in_small_batches_equals_the_fold_of_the_whole_table(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, rows: int
) -> None:
    log, items = _log_with_history(tmp_path)
    whole = fold_table(light_events(log)).sort_by("item_id")
    monkeypatch.setattr(table_module, "_SCAN_BATCH_ROWS", rows)
    seen: list[int] = []
    streamed = table_module.LanceTable.batches

    def batches(self: CheckpointLog, ds: Any, columns: Any, **kw: Any) -> Any:
        for batch in streamed(self, ds, columns, **kw):
            seen.append(batch.num_rows)
            yield batch

    monkeypatch.setattr(table_module.LanceTable, "batches", batches)
    fresh = open_log(tmp_path, "streamed")
    assert fresh.states().sort_by("item_id").equals(whole)
    assert max(seen) <= rows and len(seen) > 2  # it really was read in batches
    plan = plan_resume(open_log(tmp_path, "streamed"), items)
    assert plan.skip and plan.replay and plan.failed  # done and failed items, seen through the stream
    assert vars(plan) == vars(classify(prepare_items(items), whole, "v1", plan.log_version))


def test_scans_of_one_version_that_disagree_are_a_corrupted_log(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    _log_with_history(tmp_path)
    monkeypatch.setattr(table_module, "_SCAN_BATCH_ROWS", 16)
    streamed = table_module.LanceTable.batches

    def short_other_stream(self: CheckpointLog, ds: Any, columns: Any, **kw: Any) -> Any:
        parts = list(streamed(self, ds, columns, **kw))
        return iter(parts if "item_id" in columns else parts[:-1])

    monkeypatch.setattr(table_module.LanceTable, "batches", short_other_stream)
    with pytest.raises(LogCorruptedError, match=r"two scans of version \d+ differ"):
        open_log(tmp_path, "streamed").states()
