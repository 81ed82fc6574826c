"""The e2e harness itself: parse, unpause, trigger, XCom, clear one mapped instance, rerun."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pathlib import Path

    from tests.e2e.harness import AirflowClient

pytestmark = pytest.mark.e2e

DAG_ID = "e2e_smoke"
SMOKE_DAG = """
from __future__ import annotations

import json
from pathlib import Path

import pendulum
from airflow.sdk import DAG, get_current_context, task

with DAG("e2e_smoke", schedule=None, start_date=pendulum.datetime(2024, 1, 1), catchup=False):

    @task
    def make():
        return [1, 2, 3]

    @task
    def double(x):
        context = get_current_context()
        with Path(context["dag_run"].conf["calls"]).open("a") as f:
            f.write(json.dumps([context["ti"].map_index, context["ti"].try_number]) + "\\n")
        return 2 * x

    double.expand(x=make())
"""


def test_trigger_xcom_clear_one_mapped_instance_and_rerun(airflow_stack: AirflowClient, tmp_path: Path):
    client = airflow_stack
    client.add_dag_file(SMOKE_DAG, "e2e_smoke.py")
    client.wait_dag_parsed(DAG_ID)
    client.unpause(DAG_ID)
    calls = tmp_path / "calls.jsonl"

    run_id = client.trigger(DAG_ID, {"calls": str(calls)})
    client.wait_success(DAG_ID, run_id, timeout=60)
    assert client.xcom(DAG_ID, run_id, "make") == [1, 2, 3]
    assert client.xcom(DAG_ID, run_id, "double", map_index=1) == 4

    cleared = client.clear(DAG_ID, run_id, [("double", 1)])
    assert [(t["task_id"], t["map_index"]) for t in cleared] == [("double", 1)]
    client.wait_success(DAG_ID, run_id, timeout=60)

    tries = {(t["task_id"], t["map_index"]): t["try_number"] for t in client.task_instances(DAG_ID, run_id)}
    assert tries == {("make", -1): 1, ("double", 0): 1, ("double", 1): 2, ("double", 2): 1}
    lines = sorted(tuple(json.loads(line)) for line in calls.read_text().splitlines())
    assert lines == [(0, 1), (1, 1), (1, 2), (2, 1)]
    assert client.xcom(DAG_ID, run_id, "double", map_index=1) == 4
