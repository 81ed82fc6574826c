"""The task-group example DAG through dag.test(): one run generates and exports Parquet; a second run has
nothing pending (generate skipped), the sensor still runs, and the export is unchanged."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow.parquet as pq
import pytest

import airflow_provider_datagen.example_dags as example_dags

if TYPE_CHECKING:
    from collections.abc import Callable

GROUP_DAG = Path(example_dags.__file__).parent / "datagen_task_group.py"


@pytest.fixture
def group_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DATAGEN_GROUP_EXPERIMENT", f"t{os.getpid()}{tmp_path.name[-6:]}".replace("_", ""))
    monkeypatch.setenv("DATAGEN_GROUP_ITEMS", "40")
    monkeypatch.setenv("DATAGEN_EXPORT_DIR", str(tmp_path / "exports"))
    return tmp_path / "exports"


def test_the_task_group_example_runs_and_a_no_op_rerun_exports_nothing_new(
    run_dag_file: Callable[..., object], group_env: Path
) -> None:
    run = run_dag_file(GROUP_DAG, "datagen_task_group")
    assert run.state == "success"  # type: ignore[attr-defined]
    states = run.states()  # type: ignore[attr-defined]
    assert {tid for tid, _ in states} == {"qa.plan", "qa.generate", "qa.all_done", "qa.export"}
    assert [states[("qa.generate", i)] for i in range(2)] == ["success", "success"]  # 40 items, chunks of 25
    exported = run.xcom("qa.export")  # type: ignore[attr-defined]
    assert exported["rows"] == 40 and exported["changed"] is True and exported["format"] == "parquet"
    (dest,) = group_env.iterdir()
    assert pq.read_table(dest / "part-00000.parquet").num_rows == 40
    assert run.xcom("qa.all_done", key="datagen_status")["completed"] == 40  # type: ignore[attr-defined]

    again = run_dag_file(GROUP_DAG, "datagen_task_group")
    assert again.state == "success"  # type: ignore[attr-defined]
    states = again.states()  # type: ignore[attr-defined]
    assert states[("qa.generate", -1)] == "skipped"  # nothing pending: no chunk to map over
    assert states[("qa.all_done", -1)] == "success" and states[("qa.export", -1)] == "success"
    assert again.xcom("qa.export") == {**exported, "changed": False}  # type: ignore[attr-defined]
