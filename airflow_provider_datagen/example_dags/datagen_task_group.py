"""One declaration: the quick start as a DatagenTaskGroup (plan -> generate -> all_done -> export).

The experiment's names are declared once (:class:`~airflow_provider_datagen.experiment.DatagenExperiment`)
and the group builds the four tasks with the trigger rules a no-op run and a budget stop need. The
export is written as Parquet, which pandas, Polars, DuckDB and Hugging Face ``datasets`` read.

Environment knobs (used by the tests): ``DATAGEN_GROUP_EXPERIMENT`` (default ``demo``),
``DATAGEN_GROUP_ITEMS`` (default 100), ``DATAGEN_GROUP_PROCESS`` (default the fake model),
``DATAGEN_EXPORT_DIR`` (default ``$AIRFLOW_HOME/datagen_exports``).
"""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import DAG

from airflow_provider_datagen.example_dags.fakes import prompts
from airflow_provider_datagen.experiment import DatagenExperiment
from airflow_provider_datagen.task_group import DatagenTaskGroup

EXPERIMENT = DatagenExperiment("quickstart_group", os.environ.get("DATAGEN_GROUP_EXPERIMENT", "demo"))
N_ITEMS = int(os.environ.get("DATAGEN_GROUP_ITEMS", "100"))
PROCESS = os.environ.get("DATAGEN_GROUP_PROCESS", "airflow_provider_datagen.example_dags.fakes:fake_model")
EXPORT_DIR = os.environ.get(
    "DATAGEN_EXPORT_DIR",
    os.path.join(os.environ.get("AIRFLOW_HOME", os.path.expanduser("~/airflow")), "datagen_exports"),
)

with DAG(
    dag_id="datagen_task_group",
    schedule=None,
    start_date=pendulum.datetime(2025, 1, 1, tz="UTC"),
    catchup=False,
    tags=["datagen", "example"],
    doc_md=__doc__,
):
    DatagenTaskGroup(
        "qa",
        experiment=EXPERIMENT,
        source=prompts(N_ITEMS),
        process=PROCESS,
        destination=os.path.join(EXPORT_DIR, f"group_{EXPERIMENT.experiment}"),
        plan_kwargs={"chunk_size": 25},
        map_kwargs={
            "checkpoint_every": 10,
            # the fake model's timeouts are transient: retried in place, up to 3 calls per item
            "retry": {
                "attempts": 3,
                "retry_on": ["airflow_provider_datagen.example_dags.fakes.TransientModelError"],
                "backoff": 0.1,
            },
        },
        sensor_kwargs={"poke_interval": 0.5, "timeout": 600},
        export_kwargs={"format": "parquet"},
    )
