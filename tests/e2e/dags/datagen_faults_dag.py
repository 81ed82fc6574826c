"""The quickstart's plan -> resumable mapped generation -> export, configured for the fault tests.

The fault tests (``tests/e2e/test_faults_airflow.py``) copy this file into the stack's DAGs folder as
``<name>.py`` next to ``<name>.json``; the JSON holds the knobs, so each scenario has its own DAG id,
experiment, item count, chunk size, latency and side files without touching the stack's environment.

``model`` is the process: it appends ``item_id, attempt, pid, time`` to the invocation side file
*before* doing the work (so an invocation cut short by SIGKILL is counted too), waits at a barrier
until ``barrier_runs`` DAG runs have reached their first invocation (when set), sleeps the latency,
fails the first attempt of the items listed in ``fail_once``, and otherwise answers like
:func:`airflow_provider_datagen.example_dags.fakes.reliable_fake_model` (the quickstart's answers without the
flaky first attempts), so an in-process run of that function is the uninterrupted baseline. The task
imports it by name (``"<name>:model"``): Airflow puts the DAGs folder on the task's ``sys.path``.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

import pendulum
from airflow.sdk import DAG

from airflow_provider_datagen.example_dags.fakes import prompts, reliable_fake_model
from airflow_provider_datagen.operators.datagen import (
    DatagenExportOperator,
    DatagenMapOperator,
    DatagenPlanOperator,
)

CONFIG: dict[str, Any] = json.loads(Path(__file__).with_suffix(".json").read_text())
MODULE = Path(__file__).stem


class InjectedFailure(RuntimeError):
    """The first attempt of an item listed in ``fail_once``."""


_PASSED_BARRIER: list[bool] = []


def _barrier() -> None:
    """Hold this task's first invocation until ``barrier_runs`` runs have arrived (or a timeout)."""
    need = int(CONFIG.get("barrier_runs", 0))
    if need < 2 or _PASSED_BARRIER:
        return
    from airflow.sdk import get_current_context

    arrivals = Path(CONFIG["barrier_dir"])
    arrivals.mkdir(parents=True, exist_ok=True)
    (arrivals / re.sub(r"[^\w.-]", "_", str(get_current_context()["run_id"]))).touch()
    deadline = time.monotonic() + float(CONFIG.get("barrier_timeout", 90))
    while len(list(arrivals.iterdir())) < need and time.monotonic() < deadline:
        time.sleep(0.05)
    _PASSED_BARRIER.append(True)


def model(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
    with open(CONFIG["invocation_log"], "a", encoding="utf-8") as fh:
        fh.write(f"{ctx.item_id}\t{ctx.attempt}\t{os.getpid()}\t{time.time():.3f}\n")
    _barrier()
    time.sleep(float(CONFIG["latency"]))
    if ctx.attempt == 1 and ctx.item_id in CONFIG.get("fail_once", ()):
        raise InjectedFailure(f"injected failure of {ctx.item_id} on its first attempt")
    return reliable_fake_model(item, ctx)


with DAG(
    dag_id=CONFIG["dag_id"],
    schedule=None,
    start_date=pendulum.datetime(2025, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=int(CONFIG.get("max_active_runs", 1)),
    default_args={"retries": 0},
    tags=["datagen", "e2e"],
):
    plan = DatagenPlanOperator(
        task_id="plan",
        pipeline=CONFIG["pipeline"],
        experiment=CONFIG["experiment"],
        source=prompts(int(CONFIG["items"])),
        key_field="id",
        chunk_size=int(CONFIG["chunk"]),
        processor_version="v1",
    )
    generate = DatagenMapOperator.partial(
        task_id="generate",
        pipeline=CONFIG["pipeline"],
        experiment=CONFIG["experiment"],
        process=f"{MODULE}:model",
        processor_version="v1",
        checkpoint_every=int(CONFIG["checkpoint_every"]),
        fail_fast=bool(CONFIG.get("fail_fast", False)),
    ).expand_kwargs(plan.output)
    export = DatagenExportOperator(
        task_id="export",
        pipeline=CONFIG["pipeline"],
        experiment=CONFIG["experiment"],
        # One export per run: two concurrent runs must not overwrite one dataset at once.
        destination=CONFIG["export_dir"] + "/export_{{ run_id | replace(':', '_') | replace('+', '_') }}.lance",
        trigger_rule="none_failed",
    )
    plan >> generate >> export
