"""A DAG file using the datagen operators parses without importing Lance, pyarrow or numpy.

Every DAG parse (the dag-processor's, and each task's own at start-up) pays for what the file imports;
under load a parse importing Lance and pyarrow passed ``[core] dagbag_import_timeout`` (30 s) and the
task was rescheduled. The operators check their arguments with light modules only; the core is
imported when a task executes.
"""

from __future__ import annotations

import json
import subprocess
import sys

PARSE = """
import json, sys
import pendulum
from airflow.sdk import DAG
from airflow_provider_datagen.operators.datagen import (
    DatagenExportOperator, DatagenMaintenanceOperator, DatagenMapOperator, DatagenPlanOperator)
from airflow_provider_datagen.sensors.datagen import DatagenStatusSensor

with DAG("parse", schedule=None, start_date=pendulum.datetime(2025, 1, 1)):
    plan = DatagenPlanOperator(task_id="plan", pipeline="p", experiment="e", source=[{"id": "a"}],
                               chunk_size="auto", redo_completed="other_version")
    gen = DatagenMapOperator.partial(
        task_id="generate", pipeline="p", experiment="e", process="m:f", concurrency=8,
        retry={"attempts": 3, "retry_on": ["builtins.TimeoutError"], "backoff": 0.5},
    ).expand_kwargs(plan.output)
    export = DatagenExportOperator(task_id="export", pipeline="p", experiment="e", destination="/tmp/x.lance")
    maintain = DatagenMaintenanceOperator(task_id="maintain", pipeline="p", experiment="e")
    plan >> gen >> export >> maintain
print(json.dumps(sorted(m for m in ("lance", "pyarrow", "numpy", "pandas") if m in sys.modules)))
"""


def test_parsing_a_datagen_dag_imports_no_lance_pyarrow_or_numpy() -> None:
    out = subprocess.run([sys.executable, "-c", PARSE], capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_the_light_redo_completed_values_are_the_planners() -> None:
    from airflow_provider_datagen.core.planner import REDO_COMPLETED
    from airflow_provider_datagen.operators.plan import _REDO_COMPLETED

    assert set(_REDO_COMPLETED) == set(REDO_COMPLETED)
