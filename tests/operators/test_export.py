"""The export operator through dag.test(): an interrupted history exports the uninterrupted fingerprint; a missing
experiment is named; an unchanged export writes no version and emits no asset event."""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING, Any

from airflow_provider_datagen.exceptions import ExperimentNotFoundError
from tests._support.ops_dag import ops_dag, ops_log, sample_items

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path


def test_interrupted_history_exports_the_uninterrupted_fingerprint(
    run_dag_file: Callable[..., Any], tmp_path: Path, calls: Path
) -> None:
    flaky = run_dag_file(ops_dag("ops_hist", tmp_path, source=sample_items(), experiment="hist"), "ops_hist")
    flaky.clear_and_rerun([("generate", 0), ("generate", 1)], include_downstream=True)
    assert flaky.state == "success"
    clean = run_dag_file(
        ops_dag(
            "ops_clean", tmp_path, source=sample_items(), experiment="clean", process="tests._support.procs:always_ok"
        ),
        "ops_clean",
    )
    assert clean.state == "success"
    assert flaky.xcom("export")["fingerprint"] == clean.xcom("export")["fingerprint"]
    assert flaky.xcom("export")["rows"] == clean.xcom("export")["rows"] == 10


EXPORT_ONLY_DAG = """
from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from airflow_provider_datagen.operators.datagen import DatagenExportOperator

with DAG({dag_id!r}, schedule=None, start_date=pendulum.datetime(2025, 1, 1), catchup=False):
    DatagenExportOperator(task_id="export", pipeline="ops", experiment={experiment!r}, destination={destination!r})
"""


def _asset_events(run: Any, task_id: str = "export") -> int:
    """How many asset events the run's task emitted (rows of the metadata DB's asset_event table)."""
    from airflow.models.asset import AssetEvent
    from airflow.utils.session import create_session
    from sqlalchemy import func, select

    with create_session() as session:
        return int(
            session.scalar(
                select(func.count())
                .select_from(AssetEvent)
                .where(
                    AssetEvent.source_dag_id == run.dag_id,
                    AssetEvent.source_run_id == run.run_id,
                    AssetEvent.source_task_id == task_id,
                )
            )
        )


def test_export_of_a_missing_experiment_fails_naming_it(run_dag_file: Callable[..., Any], tmp_path: Path) -> None:
    from airflow_provider_datagen.core import run_items

    run_items(ops_log("typo_real"), sample_items(2), lambda item, ctx: {"y": 1})
    dest = tmp_path / "typo_export.lance"
    dag = textwrap.dedent(EXPORT_ONLY_DAG.format(dag_id="ops_typo", experiment="typo_rael", destination=str(dest)))
    run = run_dag_file(dag, "ops_typo")
    assert run.state == "failed"
    run.assert_failed(
        "export",
        ExperimentNotFoundError,
        r"^experiment 'ops'/'typo_rael' does not exist: it has no log under root '.+' \(looked for .+\)\. "
        r"Experiments of pipeline 'ops' under this root: .*'typo_real'.*\. Nothing was exported\. Check "
        r"the pipeline and experiment names .* or run the generation first\.$",
    )
    assert not dest.exists() and not ops_log("typo_rael").exists()
    assert _asset_events(run) == 0


def test_an_unchanged_export_writes_no_version_and_emits_no_asset_event(
    run_dag_file: Callable[..., Any], tmp_path: Path, calls: Path
) -> None:
    import lance

    items = sample_items(4)
    dag = ops_dag("ops_same", tmp_path, source=items, experiment="same", process="tests._support.procs:always_ok")
    dest = str(tmp_path / "ops_same_export.lance")
    first = run_dag_file(dag, "ops_same")
    assert first.state == "success"
    exported = first.xcom("export")
    assert exported["changed"] is True and exported["rows"] == 4
    assert lance.dataset(dest).version == 1 and _asset_events(first) == 1

    second = run_dag_file(dag, "ops_same")  # nothing pending: the same content again
    assert second.state == "success"
    assert second.states()[("generate", -1)] == "skipped"
    assert second.xcom("export") == {**exported, "changed": False}
    assert lance.dataset(dest).version == 1
    assert _asset_events(second) == 0

    # the same content in another layout is a new version, announced
    with_input = ops_dag(
        "ops_same",
        tmp_path,
        source=items,
        experiment="same",
        process="tests._support.procs:always_ok",
        export_extra=f", include_input=True, source={items!r}",
    )
    third = run_dag_file(with_input, "ops_same")
    assert third.state == "success"
    assert third.xcom("export")["changed"] is True
    assert third.xcom("export")["fingerprint"] == exported["fingerprint"]
    assert lance.dataset(dest).version == 2 and _asset_events(third) == 1
    assert lance.dataset(dest).to_table()["input"].to_pylist() == items


def test_a_parquet_export_announces_only_a_change(
    run_dag_file: Callable[..., Any], tmp_path: Path, calls: Path
) -> None:
    import pyarrow.parquet as pq

    dag = ops_dag(
        "ops_pq",
        tmp_path,
        source=sample_items(3),
        experiment="pq",
        process="tests._support.procs:always_ok",
        export_extra=", format='parquet'",
    )
    dest = tmp_path / "ops_pq_export.lance"
    first = run_dag_file(dag, "ops_pq")
    assert first.state == "success"
    exported = first.xcom("export")
    assert exported["changed"] is True and exported["rows"] == 3 and exported["format"] == "parquet"
    assert pq.read_table(dest / "part-00000.parquet").num_rows == 3 and _asset_events(first) == 1
    second = run_dag_file(dag, "ops_pq")
    assert second.state == "success"
    assert second.xcom("export") == {**exported, "changed": False}
    assert _asset_events(second) == 0
