"""The plan operator through dag.test() and at parse time: a new run plans only pending and edited items; bad
arguments and bad sources are refused; a processor version bump regenerates only when the plan asks."""

from __future__ import annotations

import collections
import json
import re
from typing import TYPE_CHECKING, Any

import pytest

from airflow_provider_datagen.exceptions import (
    ConfigurationError,
    DatagenError,
    InvalidItemError,
)
from airflow_provider_datagen.operators.datagen import (
    DatagenMapOperator,
    DatagenPlanOperator,
    ItemsFailedError,
)
from tests._support.engine import export_rows
from tests._support.ops_dag import calls_in, ops_dag, ops_log, sample_items

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path


def test_new_run_plans_only_pending_and_edited_items(
    run_dag_file: Callable[..., Any], tmp_path: Path, calls: Path
) -> None:
    src = tmp_path / "items.jsonl"
    src.write_text("".join(json.dumps(i) + "\n" for i in sample_items()))
    dag = ops_dag("ops_newrun", tmp_path, source=str(src), experiment="newrun")
    first = run_dag_file(dag, "ops_newrun")
    assert first.state == "failed"
    first.assert_failed("generate", ItemsFailedError, r"items failed in this chunk: '3' ", map_index=0)
    first.assert_failed("generate", ItemsFailedError, r"items failed in this chunk: '7' ", map_index=1)
    calls.unlink()
    second = run_dag_file(dag, "ops_newrun")
    chunks = second.xcom("plan")
    assert [sorted(c["chunk"]["item_ids"]) for c in chunks] == [["3", "7"]]
    assert second.state == "success"
    assert calls_in(calls) == collections.Counter({"3": 1, "7": 1})
    fp_before = second.xcom("export")["fingerprint"]

    edited = sample_items()
    edited[5]["text"] = "an edited item"
    src.write_text("".join(json.dumps(i) + "\n" for i in edited))
    calls.unlink()
    third = run_dag_file(dag, "ops_newrun")
    assert [c["chunk"]["item_ids"] for c in third.xcom("plan")] == [["5"]]
    assert third.xcom("plan", key="datagen_status")["pending"] == 1
    assert calls_in(calls) == collections.Counter({"5": 1})
    assert third.xcom("export")["fingerprint"] != fp_before

    calls.unlink()
    fourth = run_dag_file(dag, "ops_newrun")
    assert fourth.xcom("plan") == []
    assert fourth.states()[("generate", -1)] == "skipped"
    assert fourth.state == "success"
    assert not calls.exists()
    assert fourth.xcom("export")["fingerprint"] == third.xcom("export")["fingerprint"]


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"chunk_size": 0}, "chunk_size=0 is not a positive int; give chunk_size an int of 1 or more"),
        ({"chunk_size": "10"}, "chunk_size='10' is not a positive int; "),
        ({"pipeline": "../x"}, "pipeline='../x' is not a valid name; pipeline name '../x' is not allowed"),
        ({"experiment": ""}, "experiment='' is not a valid name; experiment name is empty"),
        ({"source": 42}, "source=42 is a int, not a list of dicts or a path/URI string; "),
        ({"key_field": ""}, "key_field='' is not a non-empty string; "),
    ],
)
def test_plan_operator_rejects_bad_arguments_at_parse_time(kwargs: dict[str, Any], needle: str) -> None:
    base: dict[str, Any] = {"task_id": "p", "pipeline": "ops", "experiment": "e", "source": sample_items()}
    base.update(kwargs)
    # One message form for every argument error: "<Class>: <param>=<value!r> <problem>; <fix>".
    with pytest.raises(ConfigurationError, match=f"^DatagenPlanOperator: {re.escape(needle)}"):
        DatagenPlanOperator(**base)


@pytest.mark.parametrize(
    ("source", "needle"),
    [
        ("/nonexistent/items.jsonl", "'/nonexistent/items.jsonl' does not exist"),
        ([{"text": "no key"}], "no key field 'id'"),
        ([{"id": "1"}, {"id": "1"}], "duplicate key"),
    ],
)
def test_plan_bad_sources_fail_at_execute_and_write_nothing(
    run_dag_file: Callable[..., Any], tmp_path: Path, source: Any, needle: str
) -> None:
    exp = f"bad{abs(hash(needle)) % 10_000}"
    run = run_dag_file(ops_dag("ops_badsrc", tmp_path, source=source, experiment=exp), "ops_badsrc")
    assert run.state == "failed"
    run.assert_failed("plan", InvalidItemError, needle)
    assert not ops_log(exp).exists()
    from airflow_provider_datagen.core import load_source

    with pytest.raises(DatagenError, match=needle):
        load_source(source)


# --- processor versions (issue 15.1) --------------------------------------------------------------------

VERSIONED_DAG = """
from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from airflow_provider_datagen.operators.datagen import DatagenExportOperator, DatagenMapOperator, DatagenPlanOperator

with DAG({dag_id!r}, schedule=None, start_date=pendulum.datetime(2025, 1, 1), catchup=False):
    plan = DatagenPlanOperator(task_id="plan", pipeline="ops", experiment="versions", source={source!r},
                               chunk_size=4, processor_version={version!r}{plan_extra})
    gen = DatagenMapOperator.partial(task_id="generate", pipeline="ops", experiment="versions",
                                     process="tests._support.procs:answer_{version}",
                                     processor_version={version!r}).expand_kwargs(plan.output)
    export = DatagenExportOperator(task_id="export", pipeline="ops", experiment="versions",
                                   destination={destination!r}, trigger_rule="none_failed")
    plan >> gen >> export
"""


def _versioned_dag(tmp: Path, version: str, plan_extra: str = "") -> str:
    return VERSIONED_DAG.format(
        dag_id="ops_versions",
        source=sample_items(10),
        version=version,
        plan_extra=plan_extra,
        destination=str(tmp / "versions_export.lance"),
    )


def test_a_version_bump_regenerates_only_when_the_plan_asks(
    run_dag_file: Callable[..., Any], tmp_path: Path, calls: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    v1 = run_dag_file(_versioned_dag(tmp_path, "v1"), "ops_versions")
    assert v1.state == "success"
    assert calls_in(calls) == collections.Counter({str(i): 1 for i in range(10)})
    assert v1.xcom("export", key="datagen_status")["completed_by_version"] == {"v1": 10}
    calls.unlink()

    # the default keeps the v1 outputs and says how to regenerate them (the task log goes to stdout)
    capfd.readouterr()
    kept = run_dag_file(_versioned_dag(tmp_path, "v2"), "ops_versions")
    assert kept.state == "success" and kept.xcom("plan") == []
    assert not calls.exists()
    hint = (
        "10 completed or filtered items were produced by other processor versions (v1: 10); they are kept. "
        "Pass redo_completed='other_version' to regenerate them."
    )
    assert hint in capfd.readouterr().out
    assert kept.xcom("plan", key="datagen_status")["completed_by_version"] == {"v1": 10}

    redo = run_dag_file(_versioned_dag(tmp_path, "v2", ', redo_completed="other_version"'), "ops_versions")
    assert redo.state == "success"
    chunks = redo.xcom("plan")
    assert [c["chunk"]["item_ids"] for c in chunks] == [["0", "1", "2", "3"], ["4", "5", "6", "7"], ["8", "9"]]
    assert {c["redo_completed"] for c in chunks} == {c["chunk"]["redo_completed"] for c in chunks} == {"other_version"}
    assert "they are kept" not in capfd.readouterr().out
    assert calls_in(calls) == collections.Counter({str(i): 1 for i in range(10)})  # every item, once
    assert redo.xcom("export", key="datagen_status")["completed_by_version"] == {"v2": 10}
    assert redo.xcom("export")["rows"] == 10
    rows = export_rows(tmp_path / "versions_export.lance")
    assert all("v2:" in repr(r) and "v1:" not in repr(r) for r in rows)
    history = ops_log("versions").events("3")
    assert [e.processor_version for e in history if e.event_type.value == "ITEM_CREATED"] == ["v1", "v2"]
    calls.unlink()

    again = run_dag_file(_versioned_dag(tmp_path, "v2", ', redo_completed="other_version"'), "ops_versions")
    assert again.xcom("plan") == [] and not calls.exists()  # done under v2: nothing to redo


def test_a_bad_redo_completed_is_refused_at_parse_time() -> None:
    needle = r"redo_completed='always' is not one of 'never', 'other_version'; pass 'never'"
    with pytest.raises(ConfigurationError, match=rf"^DatagenPlanOperator: {needle}"):
        DatagenPlanOperator(task_id="p", pipeline="ops", experiment="e", source=sample_items(), redo_completed="always")
    with pytest.raises(ConfigurationError, match=rf"^DatagenMapOperator: {needle}"):
        DatagenMapOperator(
            task_id="m", pipeline="ops", experiment="e", process=print, source=[], redo_completed="always"
        )
    assert DatagenPlanOperator(task_id="p", pipeline="ops", experiment="e", source=[]).redo_completed == "never"
