"""The operators follow the current source (issue 24, point 6): a deleted row leaves the export and the counts.

tests/core/test_export_current_source.py checks ``export_results`` and ``log.summary()``; this runs the
same story through the DAG a user writes (plan -> map -> all_done sensor -> export): a finished source,
then 2 rows edited, 1 added and 1 deleted, and the DAG run again. The export task's XCom holds the new
source's rows and ``"removed": 1``; the sensor's ``datagen_status`` counts over that source with the
removed item apart; ``DatagenExportOperator(include_removed=True)`` exports every completed item.
"""

from __future__ import annotations

import json
import textwrap
from typing import TYPE_CHECKING, Any

import lance

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

DAG = """
import pendulum
from airflow.sdk import DAG
from airflow_provider_datagen.operators.datagen import DatagenExportOperator, DatagenMapOperator, DatagenPlanOperator
from airflow_provider_datagen.sensors.datagen import DatagenStatusSensor

with DAG({dag_id!r}, schedule=None, start_date=pendulum.datetime(2025, 1, 1), catchup=False):
    plan = DatagenPlanOperator(task_id="plan", pipeline="rm", experiment="e", source={source!r},
                               key_field="id", chunk_size=4, processor_version="v1")
    generate = DatagenMapOperator.partial(task_id="generate", pipeline="rm", experiment="e",
                                          processor_version="v1",
                                          process="tests._support.procs:always_ok").expand_kwargs(plan.output)
    all_done = DatagenStatusSensor(task_id="all_done", pipeline="rm", experiment="e", condition="all_done",
                                   source={source!r}, poke_interval=0.5, timeout=60, trigger_rule="none_failed")
    export = DatagenExportOperator(task_id="export", pipeline="rm", experiment="e", destination={current!r})
    export_all = DatagenExportOperator(task_id="export_all", pipeline="rm", experiment="e",
                                       destination={everything!r}, include_removed=True)
    plan >> generate >> all_done >> [export, export_all]
"""


def _write(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_a_deleted_row_leaves_the_export_operator_and_the_sensor_counts(
    run_dag_file: Callable[..., Any], tmp_path: Path
) -> None:
    source = tmp_path / "items.jsonl"
    rows = [{"id": f"{i:02d}", "text": f"item {i}"} for i in range(10)]
    _write(source, rows)
    current, everything = tmp_path / "current.lance", tmp_path / "all.lance"
    dag = textwrap.dedent(
        DAG.format(dag_id="rm_export", source=str(source), current=str(current), everything=str(everything))
    )
    first = run_dag_file(dag, "rm_export")
    assert first.state == "success", first.states()
    assert (first.xcom("export")["rows"], first.xcom("export")["removed"]) == (10, 0)

    # 2 rows edited, 1 added, 1 deleted (row 05): 10 rows
    edited = [dict(r, text=r["text"] + " (edited)") if r["id"] in ("01", "02") else r for r in rows]
    _write(source, [r for r in edited if r["id"] != "05"] + [{"id": "10", "text": "item 10"}])
    second = run_dag_file(dag, "rm_export")
    assert second.state == "success", second.states()
    status = second.xcom("all_done", key="datagen_status")
    assert (status["total"], status["completed"], status["pending"], status["removed"]) == (10, 10, 0, 1)
    out = second.xcom("export")
    assert (out["rows"], out["removed"]) == (10, 1)
    exported = lance.dataset(str(current)).to_table(columns=["item_id"])["item_id"].to_pylist()
    assert sorted(exported) == [f"{i:02d}" for i in range(11) if i != 5]
    # include_removed=True: every completed item, the deleted one too
    out_all = second.xcom("export_all")
    assert (out_all["rows"], out_all["removed"]) == (11, 0)
    assert "05" in lance.dataset(str(everything)).to_table(columns=["item_id"])["item_id"].to_pylist()
