"""``folded_status``: the status every datagen task pushes, and the fold it stores when it had to make one."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_provider_datagen.core import run_items
from airflow_provider_datagen.core.store import maintenance
from airflow_provider_datagen.exceptions import LogWriteError
from airflow_provider_datagen.operators.base import folded_status
from tests._support.engine import make_items, open_log
from tests.core.store.test_projection import ScanCount
from tests.core.store.test_states_of import failing_on

if TYPE_CHECKING:
    import pytest


def _folded(root: Any, experiment: str) -> dict[str, Any]:
    fresh = open_log(root, experiment)
    return fresh.summary(fresh.states())


def test_a_status_that_folded_stores_its_fold_for_the_next_tasks(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = open_log(tmp_path, "store")
    run_items(log, make_items(50), failing_on(set(), "flat"), writer_id="w", epoch=1)
    assert log.projection_version() == 0
    first = folded_status(open_log(tmp_path, "store"))  # no projection: folds, then stores the fold
    assert log.projection_version() == log.version
    assert first["completed"] == 50
    run_items(log, make_items(60)[50:], failing_on(set(), "flat"), writer_id="w2", epoch=2)
    new_events = sum(len(log.events(str(i))) for i in range(50, 60))
    count = ScanCount(monkeypatch)
    second = folded_status(open_log(tmp_path, "store"))
    # the next task counted the ten new items from their own events, read once: the rows since
    assert count.rows == new_events
    assert second == _folded(tmp_path, "store")
    assert second["completed"] == 60
    assert log.projection_version() < log.version


def test_a_projection_the_store_refuses_leaves_the_status_and_the_task_alone(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    log = open_log(tmp_path, "refused")
    run_items(log, make_items(20), failing_on(set(), "flat"), writer_id="w", epoch=1)

    def refuse(*args: Any, **kwargs: Any) -> bool:
        raise LogWriteError("reading the lease s3://b/x/.maintenance.lease failed 4 times: dropped")

    monkeypatch.setattr(maintenance, "store_fold", refuse)
    status = folded_status(open_log(tmp_path, "refused"))
    assert status == _folded(tmp_path, "refused")
    assert status["completed"] == 20
    assert "did not store the state projection" in caplog.text
    assert "failed 4 times: dropped" in caplog.text
    assert log.projection_version() == 0
