"""Operators through dag.test(): both rerun paths touch only pending work; XComs; bad input."""

from __future__ import annotations

import collections
import json
import re
import textwrap
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_datagen.core.status import STATUS_KEYS
from airflow_provider_datagen.exceptions import (
    ConfigurationError,
    DatagenError,
    ExperimentNotFoundError,
    InvalidItemError,
)
from airflow_provider_datagen.operators.datagen import (
    DatagenExportOperator,
    DatagenMapOperator,
    DatagenPlanOperator,
    ItemsFailedError,
)
from tests._support.engine import export_rows
from tests._support.profiles import examples

if TYPE_CHECKING:
    from collections.abc import Callable
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


def _items(n: int = 10) -> list[dict[str, Any]]:
    return [{"id": str(i), "text": f"item number {i}"} for i in range(n)]


def _dag(
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


@pytest.fixture
def calls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "calls.tsv"
    monkeypatch.setenv("DATAGEN_TEST_CALLS", str(path))
    return path


def _calls(path: Path) -> collections.Counter[str]:
    if not path.exists():
        return collections.Counter()
    return collections.Counter(line.split("\t")[0] for line in path.read_text().splitlines())


def _log(experiment: str) -> CheckpointLog:
    from airflow_provider_datagen.hooks.datagen import DatagenHook

    return DatagenHook().get_log("ops", experiment)


def test_clear_and_rerun_invokes_only_failed_and_inbox_items(
    run_dag_file: Callable[..., Any], tmp_path: Path, calls: Path
) -> None:
    run = run_dag_file(_dag("ops_clear", tmp_path, source=_items(), experiment="clear"), "ops_clear")
    assert run.state == "failed"
    states = run.states()
    assert states[("generate", 0)] == "failed" and states[("generate", 1)] == "failed"
    assert states[("export", -1)] == "upstream_failed"
    for map_index, item in ((0, "3"), (1, "7")):
        # each chunk's task fails with the summary naming its failed item and that item's own error
        run.assert_failed(
            "generate",
            ItemsFailedError,
            rf"^1 of 5 items failed in this chunk: '{item}' \(first error: .*transient failure of item {item}\)",
            map_index=map_index,
        )
    assert _calls(calls) == collections.Counter({str(i): 1 for i in range(10)})
    report = run.xcom("generate", key="datagen_report", map_index=0)
    assert report["failed"] == 1 and report["processed"] == 4
    status = run.xcom("generate", key="datagen_status", map_index=0)
    assert set(STATUS_KEYS) <= set(status)
    failures = _log("clear").failures("3")
    assert failures[0].error_type == "RuntimeError" and "transient failure of item 3" in failures[0].message
    assert failures[0].try_number == 1 and failures[0].task_id == "generate"
    calls.unlink()

    run.clear_and_rerun([("generate", 0)], include_downstream=False)
    # Only chunk 0 reran: its failed item 3 was the only invocation.
    assert _calls(calls) == collections.Counter({"3": 1})
    assert run.try_numbers()[("generate", 0)] == 2
    assert run.xcom("generate", map_index=0) == {
        "processed": 1,
        "skipped": 4,
        "replayed": 1,
        "failed": 0,
        "invocations": 1,
    }
    calls.unlink()
    run.clear_and_rerun([("generate", 1)], include_downstream=True)
    assert _calls(calls) == collections.Counter({"7": 1})
    assert run.state == "success"
    assert run.xcom("export")["rows"] == 10
    for task_id in ("plan", "export", "maintain"):
        assert set(STATUS_KEYS) <= set(run.xcom(task_id, key="datagen_status"))
    assert run.xcom("maintain", key="datagen_status")["completed"] == 10


def test_new_run_plans_only_pending_and_edited_items(
    run_dag_file: Callable[..., Any], tmp_path: Path, calls: Path
) -> None:
    src = tmp_path / "items.jsonl"
    src.write_text("".join(json.dumps(i) + "\n" for i in _items()))
    dag = _dag("ops_newrun", tmp_path, source=str(src), experiment="newrun")
    first = run_dag_file(dag, "ops_newrun")
    assert first.state == "failed"
    first.assert_failed("generate", ItemsFailedError, r"items failed in this chunk: '3' ", map_index=0)
    first.assert_failed("generate", ItemsFailedError, r"items failed in this chunk: '7' ", map_index=1)
    calls.unlink()
    second = run_dag_file(dag, "ops_newrun")
    chunks = second.xcom("plan")
    assert [sorted(c["chunk"]["item_ids"]) for c in chunks] == [["3", "7"]]
    assert second.state == "success"
    assert _calls(calls) == collections.Counter({"3": 1, "7": 1})
    fp_before = second.xcom("export")["fingerprint"]

    edited = _items()
    edited[5]["text"] = "an edited item"
    src.write_text("".join(json.dumps(i) + "\n" for i in edited))
    calls.unlink()
    third = run_dag_file(dag, "ops_newrun")
    assert [c["chunk"]["item_ids"] for c in third.xcom("plan")] == [["5"]]
    assert third.xcom("plan", key="datagen_status")["pending"] == 1
    assert _calls(calls) == collections.Counter({"5": 1})
    assert third.xcom("export")["fingerprint"] != fp_before

    calls.unlink()
    fourth = run_dag_file(dag, "ops_newrun")
    assert fourth.xcom("plan") == []
    assert fourth.states()[("generate", -1)] == "skipped"
    assert fourth.state == "success"
    assert not calls.exists()
    assert fourth.xcom("export")["fingerprint"] == third.xcom("export")["fingerprint"]


def test_interrupted_history_exports_the_uninterrupted_fingerprint(
    run_dag_file: Callable[..., Any], tmp_path: Path, calls: Path
) -> None:
    flaky = run_dag_file(_dag("ops_hist", tmp_path, source=_items(), experiment="hist"), "ops_hist")
    flaky.clear_and_rerun([("generate", 0), ("generate", 1)], include_downstream=True)
    assert flaky.state == "success"
    clean = run_dag_file(
        _dag("ops_clean", tmp_path, source=_items(), experiment="clean", process="tests._support.procs:always_ok"),
        "ops_clean",
    )
    assert clean.state == "success"
    assert flaky.xcom("export")["fingerprint"] == clean.xcom("export")["fingerprint"]
    assert flaky.xcom("export")["rows"] == clean.xcom("export")["rows"] == 10


def test_map_operator_with_concurrency_runs_a_fanout_pipeline_as_sequentially(
    run_dag_file: Callable[..., Any], tmp_path: Path
) -> None:
    """The example's Loop + MapReduce + Conditional pipeline, 4 roots at a time per chunk."""
    from airflow_provider_datagen.example_dags.fakes import questions

    runs = {}
    for name, extra in (("ops_fan_conc", ", concurrency=4"), ("ops_fan_seq", "")):
        dag = _dag(
            name,
            tmp_path,
            source=questions(12),
            experiment=name,
            process="airflow_provider_datagen.example_dags.fakes:qa_pipeline",
            chunk=6,
            map_extra=extra,
        )
        runs[name] = run = run_dag_file(dag, name)
        assert run.state == "success"
        assert [run.xcom("generate", map_index=i)["processed"] for i in (0, 1)] == [6, 6]
        assert run.xcom("export")["rows"] == 12
    assert runs["ops_fan_conc"].xcom("export")["fingerprint"] == runs["ops_fan_seq"].xcom("export")["fingerprint"]
    children = [i for i in _log("ops_fan_conc").states()["item_id"].to_pylist() if "/solve_twice:" in i]
    assert len(children) == 24  # two solver children per question, created by the threaded run


def test_map_operator_with_concurrency_processes_every_item_once(
    run_dag_file: Callable[..., Any], tmp_path: Path, calls: Path
) -> None:
    dag = _dag(
        "ops_conc",
        tmp_path,
        source=_items(12),
        experiment="conc",
        process="tests._support.procs:always_ok",
        chunk=6,
        map_extra=", concurrency=4",
    )
    run = run_dag_file(dag, "ops_conc")
    assert run.state == "success"
    assert _calls(calls) == collections.Counter({str(i): 1 for i in range(12)})
    for map_index in (0, 1):
        assert run.xcom("generate", map_index=map_index) == {
            "processed": 6,
            "skipped": 0,
            "replayed": 0,
            "failed": 0,
            "invocations": 6,
        }
    statuses = run.xcoms("generate", key="datagen_status")
    assert sorted(statuses) == [0, 1]
    for status in statuses.values():
        assert set(STATUS_KEYS) <= set(status)
        # each chunk acknowledged all its items before its status was taken: nothing left in flight
        assert status["running"] == status["failed_items"] == 0 and status["completed"] >= 6
    assert max(s["completed"] for s in statuses.values()) == 12
    assert run.xcom("export")["rows"] == 12
    clean = run_dag_file(
        _dag(
            "ops_conc_seq", tmp_path, source=_items(12), experiment="concseq", process="tests._support.procs:always_ok"
        ),
        "ops_conc_seq",
    )
    assert clean.xcom("export")["fingerprint"] == run.xcom("export")["fingerprint"]


@pytest.mark.parametrize(
    ("map_extra", "expected"),
    [
        ("", lambda chunk: chunk["label"]),
        # a user's own template wins over the chunk's label
        (", map_index_template=\"part {{ task.chunk['index'] }}\"", lambda chunk: f"part {chunk['index']}"),
    ],
    ids=["default", "user_template"],
)
def test_mapped_task_instances_show_their_chunk_as_map_index(
    run_dag_file: Callable[..., Any], tmp_path: Path, map_extra: str, expected: Callable[[dict[str, Any]], str]
) -> None:
    """The UI names each mapped instance by its chunk's key range (``partial`` used to drop the template)."""
    dag_id = f"ops_label_{'user' if map_extra else 'default'}"
    dag = _dag(
        dag_id,
        tmp_path,
        source=_items(10),
        experiment=dag_id,
        process="tests._support.procs:always_ok",
        chunk=4,
        map_extra=map_extra,
    )
    run = run_dag_file(dag, dag_id)
    assert run.state == "success"
    chunks = [c["chunk"] for c in run.xcom("plan")]
    assert [c["label"] for c in chunks] == ["0 … 3 (4 items)", "4 … 7 (4 items)", "8 … 9 (2 items)"]
    rendered = {ti.map_index: ti.rendered_map_index for ti in run.task_instances() if ti.task_id == "generate"}
    assert rendered == {c["index"]: expected(c) for c in chunks}


def test_mismatching_experiment_between_plan_and_map_fails_before_writing(
    run_dag_file: Callable[..., Any], tmp_path: Path, calls: Path
) -> None:
    run = run_dag_file(
        _dag("ops_mismatch", tmp_path, source=_items(4), experiment="mm", map_experiment="other"), "ops_mismatch"
    )
    assert run.state == "failed"
    run.assert_failed(
        "generate", ConfigurationError, r"experiment mismatch: .*'mm' but this task has experiment='other'", map_index=0
    )
    assert not calls.exists()
    assert not _log("other").exists()


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

    run_items(_log("typo_real"), _items(2), lambda item, ctx: {"y": 1})
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
    assert not dest.exists() and not _log("typo_rael").exists()
    assert _asset_events(run) == 0


def test_an_unchanged_export_writes_no_version_and_emits_no_asset_event(
    run_dag_file: Callable[..., Any], tmp_path: Path, calls: Path
) -> None:
    import lance

    items = _items(4)
    dag = _dag("ops_same", tmp_path, source=items, experiment="same", process="tests._support.procs:always_ok")
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
    with_input = _dag(
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
    base: dict[str, Any] = {"task_id": "p", "pipeline": "ops", "experiment": "e", "source": _items()}
    base.update(kwargs)
    # One message form for every argument error: "<Class>: <param>=<value!r> <problem>; <fix>".
    with pytest.raises(ConfigurationError, match=f"^DatagenPlanOperator: {re.escape(needle)}"):
        DatagenPlanOperator(**base)


def test_map_and_export_operators_reject_bad_arguments() -> None:
    with pytest.raises(ConfigurationError, match=r"^DatagenMapOperator: process='no colon here' is not a callable"):
        DatagenMapOperator(task_id="m", pipeline="ops", experiment="e", process="no colon here", source=[])
    with pytest.raises(ConfigurationError, match=r"^DatagenMapOperator: checkpoint_every=0 is not a positive int; "):
        DatagenMapOperator(task_id="m", pipeline="ops", experiment="e", process=print, source=[], checkpoint_every=0)
    with pytest.raises(ConfigurationError, match=r"^DatagenMapOperator: chunk=None and source=None leave nothing"):
        DatagenMapOperator(task_id="m", pipeline="ops", experiment="e", process=print)
    for bad in (0, -1, True, "4", 2.0):
        with pytest.raises(
            ConfigurationError, match=rf"^DatagenMapOperator: concurrency={re.escape(repr(bad))} is not a positive int"
        ):
            DatagenMapOperator(task_id="m", pipeline="ops", experiment="e", process=print, source=[], concurrency=bad)
    # threads hand each completed step to the task's writer, so per-step commits work with them too
    per_step = DatagenMapOperator(
        task_id="m", pipeline="ops", experiment="e", process=print, source=[], checkpoint_every=1, concurrency=2
    )
    assert (per_step.checkpoint_every, per_step.concurrency) == (1, 2)
    assert DatagenMapOperator(task_id="m", pipeline="ops", experiment="e", process=print, source=[]).concurrency == 1
    with pytest.raises(
        ConfigurationError, match=r"^DatagenExportOperator: destination='out.lance' is a relative path; "
    ):
        DatagenExportOperator(task_id="x", pipeline="ops", experiment="e", destination="out.lance")
    # a relative source is refused when the DAG is parsed, with the same message; templates wait for rendering
    with pytest.raises(ConfigurationError, match=r"^DatagenPlanOperator: source='items.jsonl' is a relative path; "):
        DatagenPlanOperator(task_id="p", pipeline="ops", experiment="e", source="items.jsonl")
    assert DatagenPlanOperator(task_id="p", pipeline="ops", experiment="e", source="{{ var.value.src }}").source
    with pytest.raises(
        ConfigurationError,
        match=r"^DatagenExportOperator: include_input=True needs the items' inputs, and the log keeps only their "
        r"fingerprints; pass source= and key_field= as given to DatagenPlanOperator",
    ):
        DatagenExportOperator(task_id="x", pipeline="ops", experiment="e", destination="/o.lance", include_input=True)


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
    run = run_dag_file(_dag("ops_badsrc", tmp_path, source=source, experiment=exp), "ops_badsrc")
    assert run.state == "failed"
    run.assert_failed("plan", InvalidItemError, needle)
    assert not _log(exp).exists()
    from airflow_provider_datagen.core import load_source

    with pytest.raises(DatagenError, match=needle):
        load_source(source)


def test_unknown_process_path_fails_the_task_naming_it(
    run_dag_file: Callable[..., Any], tmp_path: Path, calls: Path
) -> None:
    from airflow_provider_datagen.operators.datagen import resolve_process

    for bad, needle in (
        ("tests._support.nope:fn", "names a module it cannot import: module 'tests._support.nope'"),
        ("tests._support.procs:missing", "names a missing attribute: module 'tests._support.procs' has no attribute"),
        ("tests._support.procs:not_callable", "is a int, not a callable or a Step; "),
    ):
        with pytest.raises(ConfigurationError, match=f"^DatagenMapOperator: process={re.escape(repr(bad))} {needle}"):
            resolve_process(bad)
    run = run_dag_file(
        _dag("ops_badproc", tmp_path, source=_items(3), experiment="badproc", process="tests._support.nope:fn"),
        "ops_badproc",
    )
    assert run.state == "failed"
    run.assert_failed(
        "generate",
        ConfigurationError,
        r"^DatagenMapOperator: process='tests\._support\.nope:fn' names a module it cannot import",
        map_index=0,
    )
    assert not calls.exists()
    assert not _log("badproc").exists()


_JINJA_BITS = st.lists(
    st.sampled_from(["a", " ", "é", "\n", "\r", "\t", "{", "}", "%", "#", "{{", "}}", "{%", "%}", "{#", "#}", "x"]),
    max_size=8,
).map("".join)


@pytest.mark.parametrize(
    "dag_kwargs",
    [
        {},
        {"jinja_environment_kwargs": {"keep_trailing_newline": True}},
        {"jinja_environment_kwargs": {"line_statement_prefix": "%", "line_comment_prefix": "##"}},
        {"jinja_environment_kwargs": {"variable_start_string": "<<", "variable_end_string": ">>"}},
        {"render_template_as_native_obj": True},
    ],
)
@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=_JINJA_BITS)
def test_templated_fields_render_exactly_as_airflow_renders_them(dag_kwargs: dict[str, Any], text: str) -> None:
    """Strings without Jinja markup skip compilation (a 1,000-item inline source cost the plan ~0.4 s);
    every string, marked up or not, renders to what Airflow's own ``render_template`` gives."""
    import pendulum
    from airflow.sdk import DAG
    from airflow.sdk.bases.operator import BaseOperator

    with DAG("render_eq", schedule=None, start_date=pendulum.datetime(2025, 1, 1), **dag_kwargs):
        op = DatagenPlanOperator(task_id="p", pipeline="ops", experiment="e", source=[])
    env = op.get_template_env()
    context: Any = {"x": 7}

    def outcome(render: Callable[[], Any]) -> Any:
        try:
            value = render()
        except Exception as exc:
            return ("error", type(exc))
        return (type(value), value)

    ours = outcome(lambda: op.render_template(text, context, env))
    airflows = outcome(lambda: BaseOperator.render_template(op, text, context, env))
    assert ours == airflows
    marked_up = f"{env.variable_start_string} x {env.variable_end_string}"
    nested = op.render_template([{"id": "p1", "v": [marked_up, "plain"]}], context, env)
    assert nested in ([{"id": "p1", "v": ["7", "plain"]}], [{"id": "p1", "v": [7, "plain"]}])


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
        source=_items(10),
        version=version,
        plan_extra=plan_extra,
        destination=str(tmp / "versions_export.lance"),
    )


def test_a_version_bump_regenerates_only_when_the_plan_asks(
    run_dag_file: Callable[..., Any], tmp_path: Path, calls: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    v1 = run_dag_file(_versioned_dag(tmp_path, "v1"), "ops_versions")
    assert v1.state == "success"
    assert _calls(calls) == collections.Counter({str(i): 1 for i in range(10)})
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
    assert _calls(calls) == collections.Counter({str(i): 1 for i in range(10)})  # every item, once
    assert redo.xcom("export", key="datagen_status")["completed_by_version"] == {"v2": 10}
    assert redo.xcom("export")["rows"] == 10
    rows = export_rows(tmp_path / "versions_export.lance")
    assert all("v2:" in repr(r) and "v1:" not in repr(r) for r in rows)
    history = _log("versions").events("3")
    assert [e.processor_version for e in history if e.event_type.value == "ITEM_CREATED"] == ["v1", "v2"]
    calls.unlink()

    again = run_dag_file(_versioned_dag(tmp_path, "v2", ', redo_completed="other_version"'), "ops_versions")
    assert again.xcom("plan") == [] and not calls.exists()  # done under v2: nothing to redo


def test_a_bad_redo_completed_is_refused_at_parse_time() -> None:
    needle = r"redo_completed='always' is not one of 'never', 'other_version'; pass 'never'"
    with pytest.raises(ConfigurationError, match=rf"^DatagenPlanOperator: {needle}"):
        DatagenPlanOperator(task_id="p", pipeline="ops", experiment="e", source=_items(), redo_completed="always")
    with pytest.raises(ConfigurationError, match=rf"^DatagenMapOperator: {needle}"):
        DatagenMapOperator(
            task_id="m", pipeline="ops", experiment="e", process=print, source=[], redo_completed="always"
        )
    assert DatagenPlanOperator(task_id="p", pipeline="ops", experiment="e", source=[]).redo_completed == "never"


def test_map_operator_retries_transient_errors_in_one_run_from_a_dict_policy(
    run_dag_file: Callable[..., Any], tmp_path: Path, calls: Path
) -> None:
    # the dict form, as it would come from params or a Variable; backoff 0 keeps the test fast
    policy = {"attempts": 3, "retry_on": ["builtins.RuntimeError"], "backoff": 0.0, "max_backoff": 0.0}
    dag = _dag("ops_retry", tmp_path, source=_items(), experiment="retry", map_extra=f", retry={policy!r}")
    run = run_dag_file(dag, "ops_retry")
    assert run.state == "success"  # items 3 and 7 failed their first attempt and were retried in place
    assert _calls(calls) == collections.Counter({**{str(i): 1 for i in range(10)}, "3": 2, "7": 2})
    assert run.try_numbers()[("generate", 0)] == 1
    assert run.xcom("generate", map_index=0)["invocations"] == 6
    failures = _log("retry").failures()
    assert [(f.item_id, f.transient, f.attempt, f.wait, f.try_number) for f in failures] == [
        ("3", True, 1, 0.0, 1),
        ("7", True, 1, 0.0, 1),
    ]
    assert "transient failure of item 3" in failures[0].message
    assert run.xcom("export")["rows"] == 10
    assert run.xcom("maintain", key="datagen_status")["failed_items"] == 0


def test_map_operator_takes_every_attempt_from_a_dict_rate_limit(
    run_dag_file: Callable[..., Any], tmp_path: Path, calls: Path
) -> None:
    from airflow_provider_datagen.core import RateLimit
    from airflow_provider_datagen.core.ratelimit import open_limiter

    policy = {"attempts": 3, "retry_on": ["builtins.RuntimeError"], "backoff": 0.0, "max_backoff": 0.0}
    limit = {"requests_per_minute": 100, "key": "ops-model"}
    extra = f", retry={policy!r}, rate_limit={limit!r}"
    run = run_dag_file(
        _dag("ops_limited", tmp_path, source=_items(), experiment="limited", map_extra=extra), "ops_limited"
    )
    assert run.state == "success"
    assert sum(_calls(calls).values()) == 12  # 10 items, 2 of them retried once
    # the 12 attempts were taken from the key's budget, which every task on this root shares
    other = open_limiter(RateLimit(100, key="ops-model"), root=str(_log("limited").root))
    try:
        assert not other.try_acquire(cost_requests=89)
        assert other.try_acquire(cost_requests=88)
    finally:
        other.close()
    with pytest.raises(
        ConfigurationError, match=r"^DatagenMapOperator: rate_limit.requests_per_minute=0 is not an int of 1 or more"
    ):
        DatagenMapOperator.partial(
            task_id="m", pipeline="ops", experiment="e", process=print, rate_limit={"requests_per_minute": 0}
        )


def test_a_malformed_retry_policy_is_refused_at_parse_time(tmp_path: Path) -> None:
    from airflow_provider_datagen.core import RetryPolicy

    base: dict[str, Any] = {"task_id": "m", "pipeline": "ops", "experiment": "e", "process": print, "source": []}
    for bad, needle in (
        ({"attempts": 0}, r"attempts=0 is not an int >= 1"),
        ({"tries": 3}, r"has unknown keys \['tries'\]"),
        ({"retry_on": ["RuntimeError"]}, r"retry_on='RuntimeError' is not an Exception subclass or a dotted"),
        ("attempts=3", r"is not a dict"),
    ):
        pattern = rf"^DatagenMapOperator: retry={re.escape(repr(bad))} is not a valid retry policy; .*{needle}"
        with pytest.raises(ConfigurationError, match=pattern):
            DatagenMapOperator(**base, retry=bad)
        with pytest.raises(ConfigurationError, match=pattern):  # mapped: checked by partial(), at parse
            DatagenMapOperator.partial(**{k: v for k, v in base.items() if k != "source"}, retry=bad)
    # a policy object is kept in its serialisable dict form
    op = DatagenMapOperator(**base, retry=RetryPolicy(attempts=4, retry_on=(TimeoutError,)))
    assert op.retry == {
        "attempts": 4,
        "retry_on": ["builtins.TimeoutError"],
        "backoff": 1.0,
        "max_backoff": 60.0,
        "jitter": True,
    }
    assert DatagenMapOperator(**base).retry is None
    # a malformed dict in a DAG file is an import error of that file
    from tests._support.dagtest import load_dag, write_dag_file

    src = _dag("ops_badretry", tmp_path, source=_items(), map_extra=", retry={'attempts': -1}")
    (tmp_path / "dags").mkdir()
    path = write_dag_file(src, "ops_badretry", tmp_path / "dags")
    with pytest.raises(AssertionError, match=r"DatagenMapOperator: retry=\{'attempts': -1\} is not a valid retry"):
        load_dag(path, "ops_badretry")
