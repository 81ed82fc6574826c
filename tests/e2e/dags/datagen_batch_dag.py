"""Plan -> mapped ``DatagenBatchOperator`` (deferrable) over the fake batch server the test runs on 127.0.0.1.

``tests/e2e/test_batch_airflow.py`` copies this file into the stack's DAGs folder as ``<name>.py`` next to
``<name>.json`` (the knobs: dag id, pipeline, experiment, items, chunk size, the ``pydanticai``
connection id, the poll interval). Imported without that JSON it defines no DAG. The connection (the
fake's base URL and a key) is created by the test through the REST API, so the model step reads it on
the worker and the trigger on the triggerer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CONFIG_PATH = Path(__file__).with_suffix(".json")
CONFIG: dict[str, Any] = json.loads(CONFIG_PATH.read_text()) if CONFIG_PATH.exists() else {}

if CONFIG:
    import pendulum
    from airflow.sdk import DAG

    from airflow_provider_datagen.llm.batch.step import llm_batch
    from airflow_provider_datagen.operators.batch import DatagenBatchOperator
    from airflow_provider_datagen.operators.datagen import DatagenPlanOperator

    step = llm_batch("Upper-case this: {{ text }}", llm_conn_id=CONFIG["llm_conn_id"])

    with DAG(
        dag_id=CONFIG["dag_id"],
        schedule=None,
        start_date=pendulum.datetime(2025, 1, 1, tz="UTC"),
        catchup=False,
        default_args={"retries": 0},
        tags=["datagen", "e2e"],
    ):
        plan = DatagenPlanOperator(
            task_id="plan",
            pipeline=CONFIG["pipeline"],
            experiment=CONFIG["experiment"],
            source=[{"id": str(i), "text": f"item number {i}"} for i in range(int(CONFIG["items"]))],
            key_field="id",
            chunk_size=int(CONFIG["chunk"]),
            processor_version=step.version,
        )
        DatagenBatchOperator.partial(
            task_id="generate",
            pipeline=CONFIG["pipeline"],
            experiment=CONFIG["experiment"],
            process=step,
            poll_interval=float(CONFIG["poll_interval"]),
            deferrable=True,
        ).expand_kwargs(plan.output)
