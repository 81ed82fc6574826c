"""``DatagenPlanOperator(chunk_size="auto")``: one chunk per task instance Airflow runs at once."""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING, Any

import pendulum
import pytest

from airflow_provider_datagen.exceptions import ConfigurationError
from airflow_provider_datagen.operators.datagen import DatagenMapOperator, DatagenPlanOperator

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path


def _plan(dag_kwargs: dict[str, Any] | None = None, **map_kwargs: Any) -> DatagenPlanOperator:
    from airflow.sdk import DAG

    with DAG("sizing", schedule=None, start_date=pendulum.datetime(2025, 1, 1), **(dag_kwargs or {})):
        plan = DatagenPlanOperator(task_id="plan", pipeline="p", experiment="e", source=[], chunk_size="auto")
        DatagenMapOperator.partial(
            task_id="generate", pipeline="p", experiment="e", process="m:f", **map_kwargs
        ).expand_kwargs(plan.output)
    return plan


def test_parallel_slots_is_the_smallest_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__CORE__PARALLELISM", "8")
    assert _plan().parallel_slots() == 8
    assert _plan({"max_active_tasks": 5}).parallel_slots() == 5
    assert _plan(max_active_tis_per_dagrun=3).parallel_slots() == 3
    assert _plan({"max_active_tasks": 5}, max_active_tis_per_dag=2, max_active_tis_per_dagrun=4).parallel_slots() == 2
    monkeypatch.setenv("AIRFLOW__CORE__PARALLELISM", "1")
    assert _plan({"max_active_tasks": 5}).parallel_slots() == 1


@pytest.mark.parametrize("value", [0, "10", "Auto", True, 2.5])
def test_chunk_size_is_a_positive_int_or_auto(value: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"or 'auto' for one chunk per parallel task slot$"):
        DatagenPlanOperator(task_id="p", pipeline="p", experiment="e", source=[], chunk_size=value)


AUTO_DAG = """
import pendulum
from airflow.sdk import DAG
from airflow_provider_datagen.operators.datagen import DatagenMapOperator, DatagenPlanOperator

with DAG({dag_id!r}, schedule=None, start_date=pendulum.datetime(2025, 1, 1), catchup=False):
    plan = DatagenPlanOperator(task_id="plan", pipeline="ops", experiment={dag_id!r},
                               source=[{{"id": str(i), "text": "x"}} for i in range({n})], chunk_size="auto")
    DatagenMapOperator.partial(task_id="generate", pipeline="ops", experiment={dag_id!r},
                               process="tests._support.procs:always_ok",
                               max_active_tis_per_dagrun=3).expand_kwargs(plan.output)
"""


@pytest.mark.parametrize(("n", "sizes"), [(10, [4, 4, 2]), (2, [1, 1])])
def test_auto_plans_one_chunk_per_slot(
    run_dag_file: Callable[..., Any], tmp_path: Path, n: int, sizes: list[int]
) -> None:
    dag_id = f"ops_auto_{n}"
    run = run_dag_file(textwrap.dedent(AUTO_DAG.format(dag_id=dag_id, n=n)), dag_id)
    assert run.state == "success"
    chunks = [c["chunk"]["item_ids"] for c in run.xcom("plan")]
    assert [len(c) for c in chunks] == sizes
    assert [i for c in chunks for i in c] == [str(i) for i in range(n)]
