"""plan -> mapped generation -> export on the distributed stack, with its knobs in a JSON file beside it.

The celery tests (``tests/e2e/celery/``) write ``<name>.json`` and this file as ``<name>.py`` into every
DAGs folder of the stack (the dag-processor's and each worker host's). The datagen root is the
``datagen_default`` connection's: ``s3://datagen/root`` on the moto server.

``model`` appends ``item_id, attempt, pid, host, time`` to the invocation file (a directory both hosts
reach, none of their own) *before* doing the work, so an invocation cut short by a dying host is
counted too; it sleeps the latency, fails the first attempt of the items listed in ``fail_once``,
and otherwise answers like :func:`airflow_provider_datagen.example_dags.fakes.reliable_fake_model`.

Knobs: ``queue`` pins ``generate`` to one host's queue (``host-a``, ``host-b``); ``executor`` runs the
DAG on another executor (``LocalExecutor``: the scheduler's own processes); ``maintenance`` adds
``maintain_a`` and ``maintain_b`` (``DatagenMaintenanceOperator`` on ``host-a`` and ``host-b``) after the
plan, released together by a barrier once ``barrier_invocations`` items have been invoked.
"""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pendulum
from airflow.sdk import DAG

from airflow_provider_datagen.example_dags.fakes import prompts, reliable_fake_model
from airflow_provider_datagen.operators.datagen import (
    DatagenExportOperator,
    DatagenMaintenanceOperator,
    DatagenMapOperator,
    DatagenPlanOperator,
)

CONFIG: dict[str, Any] = json.loads(Path(__file__).with_suffix(".json").read_text())
MODULE = Path(__file__).stem


class InjectedFailure(RuntimeError):
    """The first attempt of an item listed in ``fail_once``."""


def model(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
    host = os.environ.get("DATAGEN_STACK_HOST", "?")
    line = f"{ctx.item_id}\t{ctx.attempt}\t{os.getpid()}\t{host}\t{time.time():.3f}\n"
    with open(CONFIG["invocation_log"], "a", encoding="utf-8") as fh:
        fh.write(line)
    time.sleep(float(CONFIG["latency"]))
    if ctx.attempt == 1 and ctx.item_id in CONFIG.get("fail_once", ()):
        raise InjectedFailure(f"injected failure of {ctx.item_id} on its first attempt")
    return reliable_fake_model(item, ctx)


def barrier(context: Any) -> None:
    """Hold each maintenance task until both have arrived and the writers are under way."""
    arrivals = Path(CONFIG["barrier_dir"])
    arrivals.mkdir(parents=True, exist_ok=True)
    (arrivals / context["ti"].task_id).touch()
    deadline = time.monotonic() + 180
    need = int(CONFIG.get("barrier_invocations", 0))
    calls = Path(CONFIG["invocation_log"])
    while time.monotonic() < deadline:
        invoked = len(calls.read_text().splitlines()) if calls.exists() else 0
        if len(list(arrivals.iterdir())) >= 2 and invoked >= need:
            return  # both maintenance tasks leave within ~20 ms of each other: a real race for the lease
        time.sleep(0.02)


default_args: dict[str, Any] = {
    "retries": int(CONFIG.get("retries", 0)),
    "retry_delay": timedelta(seconds=1),
}
if CONFIG.get("executor"):
    default_args["executor"] = CONFIG["executor"]

with DAG(
    dag_id=CONFIG["dag_id"],
    schedule=None,
    start_date=pendulum.datetime(2025, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=int(CONFIG.get("max_active_runs", 1)),
    max_active_tasks=64,
    default_args=default_args,
    tags=["datagen", "e2e", "celery"],
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
    queue = {"queue": CONFIG["queue"]} if CONFIG.get("queue") else {}
    generate = DatagenMapOperator.partial(
        task_id="generate",
        pipeline=CONFIG["pipeline"],
        experiment=CONFIG["experiment"],
        process=f"{MODULE}:model",
        processor_version="v1",
        checkpoint_every=int(CONFIG["checkpoint_every"]),
        concurrency=int(CONFIG.get("concurrency", 1)),
        fail_fast=bool(CONFIG.get("fail_fast", False)),
        **queue,
    ).expand_kwargs(plan.output)
    export = DatagenExportOperator(
        task_id="export",
        pipeline=CONFIG["pipeline"],
        experiment=CONFIG["experiment"],
        destination=CONFIG["export_prefix"] + "/{{ run_id | replace(':', '_') | replace('+', '_') }}.lance",
        trigger_rule="none_failed",
    )
    plan >> generate >> export
    if CONFIG.get("maintenance"):
        for host in ("a", "b"):
            plan >> DatagenMaintenanceOperator(
                task_id=f"maintain_{host}",
                pipeline=CONFIG["pipeline"],
                experiment=CONFIG["experiment"],
                queue=f"host-{host}",
                pre_execute=barrier,
            )
