"""The README's quick-start DAG under a budget stop, in real Airflow (issue 24, point 1 and its "Done when").

The README's "Quick start" block is taken as written; only its placeholders are replaced (the source,
the process, the destination, the DAG id) and ``budget_usd`` is added to the plan and map tasks. Each
item costs exactly $0.01 (``tests._support.procs:paid_model``), so a $0.03 budget stops the map tasks
with most of the 230 items never sent. Before the fix the ``all_done`` sensor (``trigger_rule=
"none_failed"``) waited for items no task would run until its timeout (7 days by default); now the
sensor and the export end skipped and the run ends, within a minute of the stop, as success. A second
DAG with the budget raised continues where the first stopped: every item is paid exactly once.

Run alone (it starts the Airflow stack): ``pytest -s tests/e2e/test_budget_stop_airflow.py``.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING, Any

import lance
import pytest

from airflow_provider_datagen.core import CheckpointLog
from tests.test_readme import _block, _substitute

if TYPE_CHECKING:
    from pathlib import Path

    from tests.e2e.harness import AirflowClient

pytestmark = pytest.mark.e2e

N_ITEMS = 230  # three chunks of the README's chunk_size=100
BUDGET_USD = 0.03
#: how long after the map tasks stopped the run may take to end (the Done-when's bound)
END_WITHIN_S = 60.0


def readme_dag(dag_id: str, source: Path, destination: Path, budget_usd: float) -> str:
    """The README's quick-start DAG with a budget on the plan and map tasks, placeholders replaced."""
    return _substitute(
        _block("Quick start", "with DAG("),
        {
            '"my_generation"': repr(dag_id),
            '"/data/prompts.jsonl"': repr(str(source)),
            '"my_pkg.model:answer"': repr("tests._support.procs:paid_model"),
            '"/data/results/qa_e1.lance"': repr(str(destination)),
            # the quick start is a DatagenTaskGroup: the budget goes to its plan and map tasks
            'plan_kwargs={"chunk_size": 100},': (
                f'plan_kwargs={{"chunk_size": 100, "budget_usd": {budget_usd!r}}},\n'
                f'        map_kwargs={{"budget_usd": {budget_usd!r}}},'
            ),
        },
    )


def _when(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _run(client: AirflowClient, dag_id: str, dag: str, timeout: float) -> tuple[str, dict[tuple[str, int], dict]]:
    client.add_dag_file(dag, f"{dag_id}.py")
    client.wait_dag_parsed(dag_id, timeout=180)
    client.unpause(dag_id)
    run_id = client.trigger(dag_id)
    state = client.wait_run(dag_id, run_id, timeout=timeout)
    assert state == "success", client.failures(dag_id, run_id)
    return run_id, {(t["task_id"], t["map_index"]): t for t in client.task_instances(dag_id, run_id)}


def test_the_readme_dag_under_a_budget_stop_ends_skipped_within_a_minute(
    airflow_stack: AirflowClient, tmp_path: Path
) -> None:
    client = airflow_stack
    rows: list[dict[str, Any]] = [
        {"id": f"p{i:03d}", "prompt": f"what is {i} plus {i}?", "text": f"item {i}"} for i in range(N_ITEMS)
    ]
    source = tmp_path / "prompts.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    destination = tmp_path / "results" / "qa_e1.lance"

    # -- the stop: the map tasks skip at the budget, then the sensor and the export, and the run ends --
    dag_id = "readme_budget_stop"
    # the run's own timeout is a guard: before the fix it would wait for the sensor's 7-day timeout
    run_id, tis = _run(client, dag_id, readme_dag(dag_id, source, destination, BUDGET_USD), timeout=300)
    states = {key: ti["state"] for key, ti in tis.items()}
    assert states == {
        ("qa.plan", -1): "success",
        **{("qa.generate", i): "skipped" for i in range(3)},
        ("qa.all_done", -1): "skipped",
        ("qa.export", -1): "skipped",
    }, states
    stopped = max(_when(ti["end_date"]) for (task, _), ti in tis.items() if task == "qa.generate")
    run = client.get(f"/dags/{dag_id}/dagRuns/{run_id}")
    ended = _when(run["end_date"])
    print(f"\nbudget stop: the run ended {(ended - stopped).total_seconds():.1f} s after the last map task stopped")
    assert (ended - stopped).total_seconds() < END_WITHIN_S, (stopped, ended)

    sensor_log = client.task_log(dag_id, run_id, "qa.all_done", tis[("qa.all_done", -1)]["try_number"])
    assert "stopped at its budget" in sensor_log, sensor_log[-3000:]
    assert "Raise budget_usd/budget_tokens" in sensor_log
    assert "budget_usd of $0.030000" in sensor_log

    status = client.xcom(dag_id, run_id, "qa.all_done", key="datagen_status")
    assert status["stopped_by_budget"] is True
    assert status["total"] == N_ITEMS and status["running"] == 0 and status["removed"] == 0
    assert status["completed"] >= 3 and status["pending"] > 0
    assert status["completed"] + status["never_started"] == N_ITEMS, status
    assert not destination.exists()  # the export was skipped

    root = str(client.stack.settings.home / "datagen")  # the hook's embedded default root
    summary = CheckpointLog.open(root, pipeline="qa", experiment="e1").summary()
    assert summary["stopped_by_budget"] is True
    assert (summary["completed"], summary["never_started"], summary["running"]) == (
        status["completed"],
        status["never_started"],
        0,
    )

    # -- the fix the sensor names: raise the budget and trigger again; it continues where it stopped --
    again = "readme_budget_raised"
    run_id, tis = _run(client, again, readme_dag(again, source, destination, 100.0), timeout=300)
    assert {ti["state"] for ti in tis.values()} == {"success"}, {k: t["state"] for k, t in tis.items()}
    done = client.xcom(again, run_id, "qa.all_done", key="datagen_status")
    assert (done["completed"], done["pending"], done["stopped_by_budget"]) == (N_ITEMS, 0, False)
    assert client.xcom(again, run_id, "qa.export")["rows"] == N_ITEMS
    assert lance.dataset(str(destination)).count_rows() == N_ITEMS
    usage = CheckpointLog.open(root, pipeline="qa", experiment="e1").usage()
    assert usage["calls"] == N_ITEMS  # every item paid once over both runs: none asked again
