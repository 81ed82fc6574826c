"""The multi-step example DAG (Loop, MapReduce fan-out, Conditional) through dag.test()."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import airflow_provider_datagen.example_dags as example_dags
from airflow_provider_datagen.core import child_item_id

if TYPE_CHECKING:
    from collections.abc import Callable

    import pytest

PIPELINE = Path(example_dags.__file__).parent / "datagen_pipeline.py"


def test_pipeline_example_records_sub_items_and_step_coordinates(
    run_dag_file: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATAGEN_PIPELINE_EXPERIMENT", "pipetest")
    monkeypatch.setenv("DATAGEN_PIPELINE_ITEMS", "6")
    monkeypatch.setenv("DATAGEN_EXPORT_DIR", str(tmp_path))
    run = run_dag_file(PIPELINE, "datagen_pipeline")
    assert run.state == "success"
    assert run.xcom("export")["rows"] == 6
    assert run.xcom("maintain", key="datagen_status")["children"] == 12

    from airflow_provider_datagen.hooks.datagen import DatagenHook

    log = DatagenHook().get_log("qa", "pipetest")
    state = log.item_state("q003")
    assert state.status.value == "completed"
    assert {"draft", "score", "agreement", "route", "final"} <= set(state.fields)
    events = log.subtree("q003")
    loops = [e.coord.iteration for e in events if e.item_id == "q003" and e.coord.step == "refine"]
    assert sorted(set(loops)) == [0, 1, 2]
    children = {e.item_id for e in events if e.item_id != "q003"}
    assert children == {child_item_id("q003", "solve_twice", 0), child_item_id("q003", "solve_twice", 1)}
    parent_rows = [e for e in events if e.item_id == "q003" and e.coord.step == "solve_twice"]
    assert [e.event_type.value for e in parent_rows] == ["FIELD_SET", "FIELD_SET", "STEP_COMPLETED"]
    assert not any(e.event_type.value == "STEP_STARTED" and e.coord.step == "solve_twice" for e in events)
    chosen = [e for e in events if e.coord.selector_step == "check"]
    assert chosen and all(e.coord.step in ("escalate", "accept") for e in chosen)
    assert not any(e.coord.step == "check" for e in events)

    # A second run finds nothing pending: the mapped task is skipped and nothing is invoked.
    again = run_dag_file(PIPELINE, "datagen_pipeline")
    assert again.xcom("plan") == []
    assert again.state == "success"
