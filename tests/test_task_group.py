"""DatagenTaskGroup: the four tasks wired as the quick start wires them, every operator's kwargs reachable,
and a budget stop that skips the sensor and the export and ends the run (under dag.test())."""

from __future__ import annotations

import json
import textwrap
from typing import TYPE_CHECKING, Any

import pendulum
import pytest
from airflow.sdk import DAG

from airflow_provider_datagen.exceptions import ConfigurationError
from airflow_provider_datagen.experiment import DatagenExperiment
from airflow_provider_datagen.task_group import DatagenTaskGroup

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

EXP = DatagenExperiment("qs", "e1", processor_version="v2", datagen_conn_id="my_datagen")


def _group(**kw: Any) -> tuple[DAG, DatagenTaskGroup]:
    with DAG("g", schedule=None, start_date=pendulum.datetime(2025, 1, 1)) as dag:
        group = DatagenTaskGroup(
            "qa", experiment=EXP, source=[{"id": "a"}], process="m:f", destination="/tmp/out", **kw
        )
    return dag, group


def test_the_group_wires_plan_generate_sensor_export() -> None:
    dag, group = _group(export_kwargs={"format": "parquet"}, sensor_kwargs={"poke_interval": 5})
    assert sorted(dag.task_dict) == ["qa.all_done", "qa.export", "qa.generate", "qa.plan"]
    assert dag.task_dict["qa.plan"].downstream_task_ids == {"qa.generate"}
    assert dag.task_dict["qa.generate"].downstream_task_ids == {"qa.all_done"}
    assert dag.task_dict["qa.all_done"].downstream_task_ids == {"qa.export"}
    sensor, export = group.all_done, group.export
    assert sensor.trigger_rule == "none_failed" and export.trigger_rule == "all_success"
    assert sensor.poke_interval == 5 and sensor.deferrable and sensor.source == [{"id": "a"}]
    assert export.format == "parquet" and export.datagen_conn_id == "my_datagen"
    assert group.plan.processor_version == "v2" and group.plan.pipeline == "qs"
    assert type(group.generate).__name__ == "MappedOperator"
    assert group.generate.partial_kwargs["experiment"] == EXP  # resolved when each mapped task is built


def test_kwargs_reach_the_operators_and_batch_mode() -> None:
    _, group = _group(plan_kwargs={"chunk_size": 7, "budget_usd": 1.5}, map_kwargs={"poll_interval": 4.0}, batch=True)
    assert group.plan.chunk_size == 7 and group.plan.budget_usd == 1.5
    assert group.generate.operator_class.__name__ == "DatagenBatchOperator"
    assert group.generate.partial_kwargs["poll_interval"] == 4.0


def test_bad_group_arguments_are_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"experiment='e1' is a str, not a DatagenExperiment"):
        _group_with(experiment="e1")
    with pytest.raises(ConfigurationError, match=r"map_kwargs=\['x'\] is not a dict of keyword arguments"):
        _group(map_kwargs=["x"])
    with pytest.raises(ConfigurationError, match=r"pipeline='other' differs from the experiment's pipeline='qs'"):
        _group(export_kwargs={"pipeline": "other"})


def _group_with(**kw: Any) -> None:
    with DAG("g2", schedule=None, start_date=pendulum.datetime(2025, 1, 1)):
        DatagenTaskGroup("qa", source=[], process="m:f", destination="/tmp/out", **kw)


#: The group with a budget on the plan and the map: each item costs $0.01, so $0.03 stops after 3 of 10.
BUDGET_DAG = """
from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from airflow_provider_datagen.experiment import DatagenExperiment
from airflow_provider_datagen.task_group import DatagenTaskGroup

with DAG({dag_id!r}, schedule=None, start_date=pendulum.datetime(2025, 1, 1), catchup=False):
    DatagenTaskGroup(
        "qa",
        experiment=DatagenExperiment("qsg", {experiment!r}),
        source={source!r},
        process="tests._support.procs:paid_model",
        destination={destination!r},
        plan_kwargs={{"chunk_size": 5, "budget_usd": 0.03}},
        map_kwargs={{"checkpoint_every": 1, "budget_usd": 0.03}},
        sensor_kwargs={{"poke_interval": 0.5, "timeout": 120}},
    )
"""


# dag.test() does not enforce a deferred sensor's timeout (see tests/sensors/test_budget_stop.py)
@pytest.mark.timeout(240, method="thread")
def test_a_budget_stop_skips_the_groups_sensor_and_export(run_dag_file: Callable[..., Any], tmp_path: Path) -> None:
    source = tmp_path / "prompts.jsonl"
    source.write_text("".join(json.dumps({"id": f"{i:02d}", "text": f"item {i}"}) + "\n" for i in range(10)))
    destination = tmp_path / "out.lance"
    dag = BUDGET_DAG.format(dag_id="qsg_budget", experiment="stop", source=str(source), destination=str(destination))
    run = run_dag_file(textwrap.dedent(dag), "qsg_budget")
    states = run.states()
    assert states[("qa.generate", 0)] == "skipped" and states[("qa.generate", 1)] == "skipped"
    assert states[("qa.all_done", -1)] == "skipped" and states[("qa.export", -1)] == "skipped"
    assert run.state == "success" and run.error("qa.all_done") is None  # ended at once, a skip
    status = run.xcom("qa.all_done", key="datagen_status")
    assert status["stopped_by_budget"] is True
    assert (status["total"], status["completed"], status["never_started"]) == (10, 3, 7)
    assert not destination.exists()
