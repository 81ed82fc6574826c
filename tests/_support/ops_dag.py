"""The operator suites' shared DAG: plan >> map (mapped over the plan's chunks) >> export >> maintain, on pipeline
``ops``, with the items, the call counts and the log its tests read back."""

from __future__ import annotations

import collections
import textwrap
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

    from airflow_provider_datagen.core import CheckpointLog


DAG_TEMPLATE = """
from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from airflow_provider_datagen.operators.datagen import (
    DatagenExportOperator, DatagenMaintenanceOperator, DatagenMapOperator, DatagenPlanOperator)

with DAG({dag_id!r}, schedule=None, start_date=pendulum.datetime(2025, 1, 1), catchup=False):
    plan = DatagenPlanOperator(task_id="plan", pipeline="ops", experiment={experiment!r},
                               source={source!r}, key_field="id", chunk_size={chunk}, processor_version="v1")
    gen = DatagenMapOperator.partial(task_id="generate", pipeline="ops", experiment={map_experiment!r},
                                     process={process!r}, processor_version="v1",
                                     checkpoint_every=2{map_extra}).expand_kwargs(plan.output)
    export = DatagenExportOperator(task_id="export", pipeline="ops", experiment={experiment!r},
                                   destination={destination!r}, trigger_rule="none_failed"{export_extra})
    maintain = DatagenMaintenanceOperator(task_id="maintain", pipeline="ops", experiment={experiment!r})
    plan >> gen >> export >> maintain
"""


def sample_items(n: int = 10) -> list[dict[str, Any]]:
    return [{"id": str(i), "text": f"item number {i}"} for i in range(n)]


def ops_dag(
    dag_id: str,
    tmp: Path,
    *,
    source: Any,
    experiment: str = "e1",
    map_experiment: str | None = None,
    process: str = "tests._support.procs:fail_3_and_7_once",
    chunk: int = 5,
    map_extra: str = "",
    export_extra: str = "",
) -> str:
    return textwrap.dedent(
        DAG_TEMPLATE.format(
            map_extra=map_extra,
            export_extra=export_extra,
            dag_id=dag_id,
            experiment=experiment,
            map_experiment=map_experiment or experiment,
            source=source,
            chunk=chunk,
            process=process,
            destination=str(tmp / f"{dag_id}_export.lance"),
        )
    )


def calls_in(path: Path) -> collections.Counter[str]:
    if not path.exists():
        return collections.Counter()
    return collections.Counter(line.split("\t")[0] for line in path.read_text().splitlines())


def ops_log(experiment: str) -> CheckpointLog:
    from airflow_provider_datagen.hooks.datagen import DatagenHook

    return DatagenHook().get_log("ops", experiment)
