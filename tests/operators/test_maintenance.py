"""The maintenance operator: one active instance by default; ``execute`` maintains the log and pushes its status.

The full DAG (plan >> map >> export >> maintain, tests/_support/ops_dag.py) runs it through dag.test() in
test_map.py; these tests check the operator alone, without Airflow's metadata DB.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from airflow_provider_datagen.core import run_items
from airflow_provider_datagen.exceptions import ConfigurationError
from airflow_provider_datagen.operators.datagen import STATUS_XCOM_KEY, DatagenMaintenanceOperator
from tests._support.engine import make_items

if TYPE_CHECKING:
    from collections.abc import Callable

    from airflow_provider_datagen.core import CheckpointLog


class _RecordingTI:
    """The one task-instance call ``execute`` makes: ``xcom_push``."""

    def __init__(self) -> None:
        self.pushed: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed[key] = value


def test_maintenance_runs_one_instance_at_a_time_unless_told_otherwise() -> None:
    assert DatagenMaintenanceOperator(task_id="m", pipeline="ops", experiment="e").max_active_tis_per_dag == 1
    wider = DatagenMaintenanceOperator(task_id="m", pipeline="ops", experiment="e", max_active_tis_per_dag=3)
    assert wider.max_active_tis_per_dag == 3
    with pytest.raises(ConfigurationError, match=r"^DatagenMaintenanceOperator: experiment='' is not a valid name; "):
        DatagenMaintenanceOperator(task_id="m", pipeline="ops", experiment="")


def test_maintenance_maintains_the_log_and_pushes_its_status(
    checkpoint_log: Callable[..., CheckpointLog], monkeypatch: pytest.MonkeyPatch
) -> None:
    log = checkpoint_log("maint", pipeline="ops")
    run_items(log, make_items(6), lambda item, ctx: {"y": 1})
    op = DatagenMaintenanceOperator(task_id="m", pipeline="ops", experiment="maint")
    monkeypatch.setattr(op, "get_log", lambda: checkpoint_log("maint", pipeline="ops"))
    ti = _RecordingTI()
    result = op.execute({"ti": ti})  # type: ignore[typeddict-item]
    assert isinstance(result, dict)
    status = ti.pushed[STATUS_XCOM_KEY]
    assert (status["pipeline"], status["experiment"], status["completed"]) == ("ops", "maint", 6)


def test_maintenance_drops_old_responses_when_asked(
    checkpoint_log: Callable[..., CheckpointLog], monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    import datetime as dt

    from airflow_provider_datagen.core import ResponseStore
    from airflow_provider_datagen.core.store.responses import ResponseEntry

    log = checkpoint_log("maint", pipeline="ops")
    run_items(log, make_items(2), lambda item, ctx: {"y": 1})
    store = ResponseStore.open(log.root)
    old = dt.datetime.now(dt.UTC) - dt.timedelta(days=30)
    store.put_many([ResponseEntry("a" * 64, "{}", "m", created_at=old), ResponseEntry("b" * 64, "{}", "m")])
    with pytest.raises(ConfigurationError, match="responses_older_than"):
        DatagenMaintenanceOperator(task_id="m", pipeline="ops", experiment="maint", responses_older_than=30)
    op = DatagenMaintenanceOperator(
        task_id="m", pipeline="ops", experiment="maint", responses_older_than=dt.timedelta(days=7)
    )
    monkeypatch.setattr(op, "get_log", lambda: checkpoint_log("maint", pipeline="ops"))
    monkeypatch.setattr(type(op), "hook", property(lambda self: _Hook(log.root)))
    result = op.execute({"ti": _RecordingTI()})  # type: ignore[typeddict-item]
    assert result["responses"]["dropped"] == 1 and result["responses"]["entries"] == 1
    assert set(ResponseStore.open(log.root).get_many(["a" * 64, "b" * 64])) == {"b" * 64}


class _Hook:
    def __init__(self, root: str) -> None:
        self.root = root

    def get_response_store(self) -> Any:
        from airflow_provider_datagen.core import ResponseStore

        return ResponseStore.open(self.root)
