"""A multi-step pipeline per item: a Loop, a MapReduce fan-out into sub-items and a Conditional.

Each question is drafted three times (``refine``, a Loop: a crash resumes at the next iteration),
solved twice by child items ``<key>/solve_twice:0`` and ``:1`` (``solve_twice``, a MapReduce: only its
reduce is recorded on the parent), then routed by a Conditional whose chosen step carries
``selector_step="check"``. The Datagen UI shows each item's trajectory with these coordinates.
"""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import DAG

from airflow_provider_datagen.example_dags.fakes import questions
from airflow_provider_datagen.operators.datagen import (
    DatagenExportOperator,
    DatagenMaintenanceOperator,
    DatagenMapOperator,
    DatagenPlanOperator,
)

EXPERIMENT = os.environ.get("DATAGEN_PIPELINE_EXPERIMENT", "demo")
EXPORT_DIR = os.environ.get(
    "DATAGEN_EXPORT_DIR",
    os.path.join(os.environ.get("AIRFLOW_HOME", os.path.expanduser("~/airflow")), "datagen_exports"),
)

with DAG(
    dag_id="datagen_pipeline",
    schedule=None,
    start_date=pendulum.datetime(2025, 1, 1, tz="UTC"),
    catchup=False,
    tags=["datagen", "example"],
    doc_md=__doc__,
):
    plan = DatagenPlanOperator(
        task_id="plan",
        pipeline="qa",
        experiment=EXPERIMENT,
        source=questions(int(os.environ.get("DATAGEN_PIPELINE_ITEMS", "24"))),
        chunk_size=8,
        processor_version="v1",
    )
    solve = DatagenMapOperator.partial(
        task_id="solve",
        pipeline="qa",
        experiment=EXPERIMENT,
        process="airflow_provider_datagen.example_dags.fakes:qa_pipeline",
        processor_version="v1",
        checkpoint_every=1,
    ).expand_kwargs(plan.output)
    export = DatagenExportOperator(
        task_id="export",
        pipeline="qa",
        experiment=EXPERIMENT,
        destination=os.path.join(EXPORT_DIR, f"qa_{EXPERIMENT}.lance"),
        trigger_rule="none_failed",
    )
    maintain = DatagenMaintenanceOperator(task_id="maintain", pipeline="qa", experiment=EXPERIMENT)
    plan >> solve >> export >> maintain
