"""A budget stop ends the README's quick-start DAG: the all_done sensor is skipped, so is the export.

Each item of these DAGs costs exactly $0.01 (tests._support.procs:paid_model), so a budget of $0.03
stops after 3 of the 10 source items, with 7 left pending that no task will run (issue 24, point 1).
"""

from __future__ import annotations

import asyncio
import json
import re
import textwrap
from typing import TYPE_CHECKING, Any

import pytest
from airflow.sdk.exceptions import AirflowSkipException

from airflow_provider_datagen.core import run_items
from airflow_provider_datagen.core.chunks import plan_chunks, record_plan_source
from airflow_provider_datagen.triggers.datagen import DatagenStatusTrigger

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

#: The README's quick-start DAG (plan -> generate -> all_done -> export) with a budget on plan and map.
#: The sensor's timeout only bounds the test when the stop is not seen (it then fails, not skips).
QUICKSTART_DAG = """
from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from airflow_provider_datagen.operators.datagen import DatagenExportOperator, DatagenMapOperator, DatagenPlanOperator
from airflow_provider_datagen.sensors.datagen import DatagenStatusSensor

with DAG({dag_id!r}, schedule=None, start_date=pendulum.datetime(2025, 1, 1), catchup=False):
    plan = DatagenPlanOperator(task_id="plan", pipeline="qs", experiment={experiment!r}, source={source!r},
                               key_field="id", chunk_size=5, processor_version="v1", budget_usd=0.03)
    generate = DatagenMapOperator.partial(task_id="generate", pipeline="qs", experiment={experiment!r},
                                          process="tests._support.procs:paid_model", processor_version="v1",
                                          checkpoint_every=1, budget_usd=0.03).expand_kwargs(plan.output)
    all_done = DatagenStatusSensor(task_id="all_done", pipeline="qs", experiment={experiment!r},
                                   condition="all_done", source={source!r}, deferrable=True,
                                   poke_interval=0.5, timeout=120, trigger_rule="none_failed")
    export = DatagenExportOperator(task_id="export", pipeline="qs", experiment={experiment!r},
                                   destination={destination!r})
    plan >> generate >> all_done >> export
"""

STOP_MESSAGE = re.compile(
    r"^datagen qs/(\w+) stopped at its budget \(spent \$0\.030000 of a budget_usd of \$0\.030000\) with 7 items "
    r"pending, which no task will run: the condition cannot hold, so this sensor is skipped\. Raise "
    r"budget_usd/budget_tokens \(on the plan and map tasks\) and trigger the DAG again to continue where it "
    r"stopped\.$"
)


def _items(n: int = 10) -> list[dict[str, Any]]:
    return [{"id": f"{i:02d}", "text": f"item number {i}"} for i in range(n)]


def _log(experiment: str) -> Any:
    from airflow_provider_datagen.hooks.datagen import DatagenHook

    return DatagenHook().get_log("qs", experiment)


# dag.test() does not enforce a deferred sensor's timeout: without this bound a sensor that never sees
# the stop (the bug of point 1) hangs the suite instead of failing this test (the thread method: the
# signal one never fires while the in-process triggerer waits)
@pytest.mark.timeout(240, method="thread")
def test_budget_stop_skips_the_quickstart_sensor_and_export(
    run_dag_file: Callable[..., Any], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "prompts.jsonl"
    source.write_text("".join(json.dumps(item) + "\n" for item in _items()))
    dag = QUICKSTART_DAG.format(
        dag_id="qs_budget", experiment="stop", source=str(source), destination=str(tmp_path / "out.lance")
    )
    run = run_dag_file(textwrap.dedent(dag), "qs_budget")
    states = run.states()
    assert states[("generate", 0)] == "skipped" and states[("generate", 1)] == "skipped"
    assert states[("all_done", -1)] == "skipped"
    assert states[("export", -1)] == "skipped"
    assert run.state == "success"  # the run ended: every task is finished, none failed
    assert run.error("all_done") is None  # a skip, not a failure
    # the sensor's warning, in the task's log (dag.test() writes it to this process's output)
    logged = capfd.readouterr()
    lines = [line for line in (logged.out + logged.err).splitlines() if "stopped at its budget" in line]
    assert lines, "the sensor logged no budget stop"
    assert any(STOP_MESSAGE.match(line.split("] ", 1)[-1].split(" [", 1)[0].strip()) for line in lines), lines
    status = run.xcom("all_done", key="datagen_status")
    assert status["stopped_by_budget"] is True
    # counted over the source (point 10): the 7 items no task pulled are never_started, not absent
    assert (status["total"], status["completed"], status["running"], status["never_started"]) == (10, 3, 0, 7)
    assert status["pending"] == 7 and status["removed"] == 0
    summary = _log("stop").summary()  # the source the plan recorded: the same counts without a source
    assert summary["stopped_by_budget"] is True
    assert (summary["total"], summary["completed"], summary["never_started"]) == (10, 3, 7)


def _stopped_experiment(experiment: str) -> list[dict[str, Any]]:
    """An experiment at a budget stop: $0.03 spent of a $0.03 budget, 3 of 10 items completed."""
    from tests._support.procs import paid_model

    log = _log(experiment)
    items = _items()
    planned = plan_chunks(log, items, chunk_size=10)
    record_plan_source(log, items, planned, key_field="id", processor_version="v1", redo_completed="never")
    log.set_budget(0.03, None)
    run_items(log, items[:3], paid_model)
    return items


def test_the_trigger_fires_a_budget_stop_and_the_sensor_skips_on_it(airflow_db: Path) -> None:
    from airflow_provider_datagen.sensors.datagen import DatagenStatusSensor

    _stopped_experiment("trig")
    trigger = DatagenStatusTrigger(pipeline="qs", experiment="trig", condition="all_done", poke_interval=0.1)

    async def first() -> Any:
        # a guard, not a measure: without the budget stop the trigger waits for ever
        return await asyncio.wait_for(anext(aiter(trigger.run())), timeout=120)

    event = asyncio.run(first()).payload
    assert event["outcome"] == "stopped_by_budget"
    assert event["status"]["stopped_by_budget"] is True
    assert STOP_MESSAGE.match(event["message"]), event["message"]
    sensor = DatagenStatusSensor(task_id="s", pipeline="qs", experiment="trig", deferrable=True)
    pushed: dict[str, Any] = {}

    class _TI:
        def xcom_push(self, key: str, value: Any) -> None:
            pushed[key] = value

    with pytest.raises(AirflowSkipException, match=r"stopped at its budget .* Raise budget_usd/budget_tokens"):
        sensor.execute_complete({"ti": _TI()}, event)  # type: ignore[arg-type]
    assert pushed["datagen_status"]["stopped_by_budget"] is True


def test_no_budget_stop_without_pending_items_or_under_the_budget(airflow_db: Path) -> None:
    from tests._support.procs import paid_model

    items = _stopped_experiment("under")
    log = _log("under")
    log.set_budget(1.0, None)
    assert log.summary()["stopped_by_budget"] is False  # under the budget: the map tasks keep going
    log.set_budget(0.03, None)
    assert log.summary()["stopped_by_budget"] is True
    log.set_budget(None, None)
    run_items(log, items, paid_model, epoch=2)
    log.set_budget(0.03, None)
    status = log.summary()
    assert status["pending"] == 0 and status["stopped_by_budget"] is False  # all done: nothing stopped
