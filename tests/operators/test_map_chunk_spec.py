"""The map operator takes the plan's processor version and redo choice from its chunk; given, they are checked."""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING, Any

from airflow_provider_datagen.exceptions import ConfigurationError

if TYPE_CHECKING:
    from collections.abc import Callable

DAG_TEMPLATE = """
from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from airflow_provider_datagen.operators.datagen import DatagenMapOperator, DatagenPlanOperator

with DAG({dag_id!r}, schedule=None, start_date=pendulum.datetime(2025, 1, 1), catchup=False):
    plan = DatagenPlanOperator(task_id="plan", pipeline="ops", experiment={dag_id!r},
                               source={source!r}, chunk_size=3, processor_version="v2",
                               redo_completed="other_version")
    gen = DatagenMapOperator.partial(task_id="generate", pipeline="ops", experiment={dag_id!r},
                                     process="tests._support.procs:always_ok"{map_extra}).expand_kwargs(plan.output)
    plan >> gen
"""


def _dag(dag_id: str, map_extra: str = "") -> str:
    source = [{"id": str(i), "text": f"item {i}"} for i in range(5)]
    return textwrap.dedent(DAG_TEMPLATE.format(dag_id=dag_id, source=source, map_extra=map_extra))


def _created_versions(experiment: str) -> list[str | None]:
    from airflow_provider_datagen.hooks.datagen import DatagenHook

    log = DatagenHook().get_log("ops", experiment)
    return sorted(
        {e.processor_version for i in map(str, range(5)) for e in log.events(i) if e.event_type.value == "ITEM_CREATED"}
    )


def test_the_map_task_needs_no_processor_version_of_its_own(run_dag_file: Callable[..., Any]) -> None:
    run = run_dag_file(_dag("ops_spec_bare"), "ops_spec_bare")
    assert run.state == "success"
    assert [run.xcom("generate", map_index=i)["processed"] for i in (0, 1)] == [3, 2]
    assert _created_versions("ops_spec_bare") == ["v2"]  # the plan's, not the old map default "v1"
    assert {c["chunk"]["chunk_format"] for c in run.xcom("plan")} == {1}


def test_a_processor_version_given_to_the_map_task_must_match_the_plans(run_dag_file: Callable[..., Any]) -> None:
    same = run_dag_file(_dag("ops_spec_same", ', processor_version="v2"'), "ops_spec_same")
    assert same.state == "success"
    other = run_dag_file(_dag("ops_spec_other", ', processor_version="v1"'), "ops_spec_other")
    assert other.state == "failed"
    other.assert_failed(
        "generate",
        ConfigurationError,
        r"^processor_version mismatch: the plan produced chunks for processor_version='v2' but this task has "
        r"processor_version='v1'; give DatagenPlanOperator and DatagenMapOperator the same processor_version$",
        map_index=0,
    )
    assert _created_versions("ops_spec_other") == []  # refused before writing
