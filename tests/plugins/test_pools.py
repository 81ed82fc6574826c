"""A run whose datagen task asks for more pool slots than its pool has is refused as it starts.

The checks run on the DAG as the scheduler holds it (serialized and back), with real ``Pool`` rows of
the session's metadata DB; the listener itself in a running scheduler is covered by
``tests/e2e/test_retries_airflow.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pendulum
import pytest

from airflow_provider_datagen.exceptions import ConfigurationError
from airflow_provider_datagen.plugins.datagen import DatagenPlugin
from airflow_provider_datagen.plugins.pools import PoolSlotsCheck, pool_slots_errors, refuse_unrunnable

if TYPE_CHECKING:
    from pathlib import Path


def scheduler_dag(pool: str, pool_slots: int, *, plan_pool_slots: int = 1) -> Any:
    """A plan -> mapped generate DAG as the scheduler sees it (serialized, then deserialized)."""
    from airflow.sdk import DAG, BaseOperator
    from airflow.serialization.serialized_objects import DagSerialization

    from airflow_provider_datagen.operators.datagen import DatagenMapOperator, DatagenPlanOperator

    with DAG("pools", schedule=None, start_date=pendulum.datetime(2025, 1, 1)) as dag:
        plan = DatagenPlanOperator(
            task_id="plan", pipeline="p", experiment="e", source=[{"id": "a"}], pool_slots=plan_pool_slots
        )
        DatagenMapOperator.partial(
            task_id="generate", pipeline="p", experiment="e", process="m:f", pool=pool, pool_slots=pool_slots
        ).expand_kwargs(plan.output)
        # not a datagen task: left to Airflow whatever it asks for
        BaseOperator(task_id="other", pool=pool, pool_slots=pool_slots + 100)
    return DagSerialization.from_dict(DagSerialization.to_dict(dag))


def test_slots_above_the_pool_size_and_missing_pools_are_named_with_the_fix() -> None:
    dag = scheduler_dag("tiny", 3)
    (err,) = pool_slots_errors(dag.tasks, {"tiny": 2, "default_pool": 128}.get)
    assert isinstance(err, ConfigurationError)
    assert str(err) == (
        "DatagenMapOperator(task_id='generate'): pool_slots=3 is more than pool 'tiny' has (2 slot(s)), so "
        "Airflow would never schedule the task; give pool_slots <= 2, or raise the pool's size to at least 3 "
        "(`airflow pools set tiny 3 ''`)"
    )
    (missing,) = pool_slots_errors(dag.tasks, {"default_pool": 128}.get)
    assert str(missing).startswith(
        "DatagenMapOperator(task_id='generate'): pool='tiny' names a pool that does not exist"
    )
    assert "create the pool with at least 3 slot(s)" in str(missing)
    # the plan task on the default pool is checked too
    errors = pool_slots_errors(scheduler_dag("tiny", 1, plan_pool_slots=4).tasks, {"tiny": 2, "default_pool": 3}.get)
    assert [str(e).split(":")[0] for e in errors] == ["DatagenPlanOperator(task_id='plan')"]


@pytest.mark.parametrize(("size", "slots"), [(3, 3), (8, 1), (-1, 500)])
def test_slots_that_fit_or_an_unlimited_pool_pass(size: int, slots: int) -> None:
    assert pool_slots_errors(scheduler_dag("tiny", slots).tasks, {"tiny": size, "default_pool": 128}.get) == []


def test_the_plugin_registers_the_listener() -> None:
    assert [type(listener) for listener in DatagenPlugin.listeners] == [PoolSlotsCheck]


def test_a_starting_run_is_failed_with_the_reason_as_its_note(airflow_db: Path) -> None:
    from airflow.models.dagrun import DagRun
    from airflow.models.pool import Pool
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState
    from airflow.utils.types import DagRunType

    with create_session() as session:
        Pool.create_or_update_pool("datagen_tiny", slots=2, description="", include_deferred=False, session=session)
        session.flush()
        too_big = DagRun(dag_id="pools", run_id="r1", run_type=DagRunType.MANUAL, state=DagRunState.RUNNING)
        errors = refuse_unrunnable(too_big, scheduler_dag("datagen_tiny", 3), session)
        assert [str(e) for e in errors] == [
            "DatagenMapOperator(task_id='generate'): pool_slots=3 is more than pool 'datagen_tiny' has (2 slot(s)), "
            "so Airflow would never schedule the task; give pool_slots <= 2, or raise the pool's size to at least 3 "
            "(`airflow pools set datagen_tiny 3 ''`)"
        ]
        assert too_big.state == DagRunState.FAILED and too_big.end_date is not None
        assert too_big.note == f"Refused by the datagen provider before any task ran: {errors[0]}"

        fits = DagRun(dag_id="pools", run_id="r2", run_type=DagRunType.MANUAL, state=DagRunState.RUNNING)
        assert refuse_unrunnable(fits, scheduler_dag("datagen_tiny", 2), session) == []
        assert fits.state == DagRunState.RUNNING and fits.note is None
        session.rollback()
