"""The dag.test() harness itself: XComs of plain and mapped tasks, and clear + rerun of one failure."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pathlib import Path

MAPPED_DAG = """
from __future__ import annotations

import pendulum
from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG, task


def make_items():
    return [1, 2, 3]


with DAG("harness_mapped", schedule=None, start_date=pendulum.datetime(2024, 1, 1), catchup=False):
    make = PythonOperator(task_id="make", python_callable=make_items)

    @task
    def square(x):
        return x * x

    @task
    def total(values):
        return sum(values)

    total(square.expand(x=make.output))
"""

# ``flaky[1]`` fails on its first call; each call appends a line to calls.jsonl so the test can count
# how often every mapped instance really ran.
FLAKY_DAG = """
from __future__ import annotations

import json
from pathlib import Path

import pendulum
from airflow.sdk import DAG, get_current_context, task


def _record(name, x):
    calls = Path(get_current_context()["dag_run"].conf["calls"])
    with calls.open("a") as f:
        f.write(json.dumps([name, x]) + "\\n")
    return sum(1 for line in calls.read_text().splitlines() if json.loads(line) == [name, x])


with DAG("harness_flaky", schedule=None, start_date=pendulum.datetime(2024, 1, 1), catchup=False):

    @task
    def flaky(x):
        if _record("flaky", x) == 1 and x == 1:
            raise RuntimeError("first attempt of item 1 fails")
        return x * 10

    @task
    def collect(values):
        _record("collect", None)
        return sorted(values)

    collect(flaky.expand(x=[0, 1, 2]))
"""


def test_python_operator_and_mapped_task_xcoms(run_dag_file):
    run = run_dag_file(MAPPED_DAG, "harness_mapped")

    assert run.state == "success"
    assert run.xcom("make") == [1, 2, 3]
    assert run.xcoms("square") == {0: 1, 1: 4, 2: 9}
    assert run.xcom("square", map_index=2) == 9
    assert run.xcom("total") == 14
    assert set(run.states().values()) == {"success"}
    assert len(run.task_instances()) == 5


def test_clear_one_failed_mapped_instance_reruns_only_it(run_dag_file, tmp_path: Path):
    calls = tmp_path / "calls.jsonl"
    run = run_dag_file(FLAKY_DAG, "harness_flaky", calls=str(calls))

    assert run.state == "failed"
    assert run.states() == {
        ("collect", -1): "upstream_failed",
        ("flaky", 0): "success",
        ("flaky", 1): "failed",
        ("flaky", 2): "success",
    }
    # the task's own exception, not just its state; tasks that did not raise have none
    error = run.assert_failed("flaky", RuntimeError, "^first attempt of item 1 fails$", map_index=1)
    assert type(error) is RuntimeError
    assert run.error("flaky", 0) is None and run.error("collect") is None
    with pytest.raises(AssertionError, match="not a ValueError"):
        run.assert_failed("flaky", ValueError, map_index=1)
    with pytest.raises(AssertionError, match="not found in the error message"):
        run.assert_failed("flaky", RuntimeError, "second attempt", map_index=1)
    with pytest.raises(AssertionError, match="is 'success', not 'failed'"):
        run.assert_failed("flaky", RuntimeError, map_index=0)

    run.clear_and_rerun([("flaky", 1)], include_downstream=True)

    assert run.state == "success"
    assert run.error("flaky", 1) is None  # the latest attempt succeeded
    assert run.xcom("collect") == [0, 10, 20]
    lines = [tuple(json.loads(line)) for line in calls.read_text().splitlines()]
    # flaky[0] and flaky[2] ran once; flaky[1] twice; collect once, after the rerun.
    assert sorted(lines) == [("collect", None), ("flaky", 0), ("flaky", 1), ("flaky", 1), ("flaky", 2)]
    assert run.try_numbers() == {("collect", -1): 1, ("flaky", 0): 1, ("flaky", 1): 2, ("flaky", 2): 1}
