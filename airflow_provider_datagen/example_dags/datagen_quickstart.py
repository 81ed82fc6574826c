"""Quickstart: plan -> resumable mapped generation -> export, over 200 prompts and a fake model.

Some items fail on their first attempt with a transient error (a deterministic stand-in for a flaky
model API's timeouts); ``generate``'s ``retry=`` policy retries them in place, so the run succeeds on
its own, and the failure lens shows those attempts as transient. Errors the policy does not cover
fail their items and then the ``generate`` task, naming them: clear it (UI, CLI or REST) and only
those items run again (``make demo`` shows this with
``airflow_provider_datagen.example_dags.fakes:fake_model_with_refusals``); completed items are never
invoked twice. The export's fingerprint equals an uninterrupted run's.

Environment knobs (used by the demo and tests): ``DATAGEN_QUICKSTART_EXPERIMENT`` (default
``demo``), ``DATAGEN_QUICKSTART_ITEMS`` (default 200), ``DATAGEN_QUICKSTART_CHUNK`` (default 50),
``DATAGEN_EXPORT_DIR`` (default ``$AIRFLOW_HOME/datagen_exports``), ``DATAGEN_QUICKSTART_PROCESS``
(default the fake model ``airflow_provider_datagen.example_dags.fakes:fake_model``; a
``package.module:function`` of your own runs instead, e.g. your model client or a wrapper that counts
invocations).
"""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import DAG

from airflow_provider_datagen.example_dags.fakes import prompts
from airflow_provider_datagen.operators.datagen import (
    DatagenExportOperator,
    DatagenMapOperator,
    DatagenPlanOperator,
)

EXPERIMENT = os.environ.get("DATAGEN_QUICKSTART_EXPERIMENT", "demo")
N_ITEMS = int(os.environ.get("DATAGEN_QUICKSTART_ITEMS", "200"))
CHUNK = int(os.environ.get("DATAGEN_QUICKSTART_CHUNK", "50"))
PROCESS = os.environ.get("DATAGEN_QUICKSTART_PROCESS", "airflow_provider_datagen.example_dags.fakes:fake_model")
EXPORT_DIR = os.environ.get(
    "DATAGEN_EXPORT_DIR",
    os.path.join(os.environ.get("AIRFLOW_HOME", os.path.expanduser("~/airflow")), "datagen_exports"),
)

with DAG(
    dag_id="datagen_quickstart",
    schedule=None,
    start_date=pendulum.datetime(2025, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=int(os.environ.get("DATAGEN_QUICKSTART_MAX_ACTIVE_RUNS", "1")),
    tags=["datagen", "example"],
    doc_md=__doc__,
):
    plan = DatagenPlanOperator(
        task_id="plan",
        pipeline="quickstart",
        experiment=EXPERIMENT,
        source=prompts(N_ITEMS),
        key_field="id",
        chunk_size=CHUNK,
        processor_version="v1",
    )
    generate = DatagenMapOperator.partial(
        task_id="generate",
        pipeline="quickstart",
        experiment=EXPERIMENT,
        process=PROCESS,
        processor_version="v1",
        checkpoint_every=10,
        # The fake model's timeouts are transient: up to 3 calls per item, 0.5 s then 1 s apart (at
        # most; full jitter). A dict, as it could come from params or a Variable (or a RetryPolicy).
        retry={
            "attempts": 3,
            "retry_on": ["airflow_provider_datagen.example_dags.fakes.TransientModelError", "builtins.TimeoutError"],
            "backoff": 0.5,
            "max_backoff": 5.0,
        },
    ).expand_kwargs(plan.output)
    export = DatagenExportOperator(
        task_id="export",
        pipeline="quickstart",
        experiment=EXPERIMENT,
        destination=os.path.join(EXPORT_DIR, f"quickstart_{EXPERIMENT}.lance"),
        # Runs when nothing was pending too (the mapped task is then skipped, not failed).
        trigger_rule="none_failed",
    )
    plan >> generate >> export
