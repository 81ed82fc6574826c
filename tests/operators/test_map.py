"""The map operator through dag.test(): a cleared chunk reruns only its failed items; concurrency; the map index
label; retries and rate limits from dicts; bad arguments refused at parse time."""

from __future__ import annotations

import collections
import re
from typing import TYPE_CHECKING, Any

import pytest

from airflow_provider_datagen.core.status import STATUS_KEYS
from airflow_provider_datagen.exceptions import ConfigurationError
from airflow_provider_datagen.operators.datagen import (
    DatagenExportOperator,
    DatagenMapOperator,
    DatagenPlanOperator,
    ItemsFailedError,
)
from tests._support.ops_dag import calls_in, ops_dag, ops_log, sample_items

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path


def test_clear_and_rerun_invokes_only_failed_and_inbox_items(
    run_dag_file: Callable[..., Any], tmp_path: Path, calls: Path
) -> None:
    run = run_dag_file(ops_dag("ops_clear", tmp_path, source=sample_items(), experiment="clear"), "ops_clear")
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
    assert calls_in(calls) == collections.Counter({str(i): 1 for i in range(10)})
    report = run.xcom("generate", key="datagen_report", map_index=0)
    assert report["failed"] == 1 and report["processed"] == 4
    status = run.xcom("generate", key="datagen_status", map_index=0)
    assert set(STATUS_KEYS) <= set(status)
    failures = ops_log("clear").failures("3")
    assert failures[0].error_type == "RuntimeError" and "transient failure of item 3" in failures[0].message
    assert failures[0].try_number == 1 and failures[0].task_id == "generate"
    calls.unlink()

    run.clear_and_rerun([("generate", 0)], include_downstream=False)
    # Only chunk 0 reran: its failed item 3 was the only invocation.
    assert calls_in(calls) == collections.Counter({"3": 1})
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
    assert calls_in(calls) == collections.Counter({"7": 1})
    assert run.state == "success"
    assert run.xcom("export")["rows"] == 10
    for task_id in ("plan", "export", "maintain"):
        assert set(STATUS_KEYS) <= set(run.xcom(task_id, key="datagen_status"))
    assert run.xcom("maintain", key="datagen_status")["completed"] == 10


def test_map_operator_with_concurrency_runs_a_fanout_pipeline_as_sequentially(
    run_dag_file: Callable[..., Any], tmp_path: Path
) -> None:
    """The example's Loop + MapReduce + Conditional pipeline, 4 roots at a time per chunk."""
    from airflow_provider_datagen.example_dags.fakes import questions

    runs = {}
    for name, extra in (("ops_fan_conc", ", concurrency=4"), ("ops_fan_seq", "")):
        dag = ops_dag(
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
    children = [i for i in ops_log("ops_fan_conc").states()["item_id"].to_pylist() if "/solve_twice:" in i]
    assert len(children) == 24  # two solver children per question, created by the threaded run


def test_map_operator_with_concurrency_processes_every_item_once(
    run_dag_file: Callable[..., Any], tmp_path: Path, calls: Path
) -> None:
    dag = ops_dag(
        "ops_conc",
        tmp_path,
        source=sample_items(12),
        experiment="conc",
        process="tests._support.procs:always_ok",
        chunk=6,
        map_extra=", concurrency=4",
    )
    run = run_dag_file(dag, "ops_conc")
    assert run.state == "success"
    assert calls_in(calls) == collections.Counter({str(i): 1 for i in range(12)})
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
        ops_dag(
            "ops_conc_seq",
            tmp_path,
            source=sample_items(12),
            experiment="concseq",
            process="tests._support.procs:always_ok",
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
    dag = ops_dag(
        dag_id,
        tmp_path,
        source=sample_items(10),
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
        ops_dag("ops_mismatch", tmp_path, source=sample_items(4), experiment="mm", map_experiment="other"),
        "ops_mismatch",
    )
    assert run.state == "failed"
    run.assert_failed(
        "generate", ConfigurationError, r"experiment mismatch: .*'mm' but this task has experiment='other'", map_index=0
    )
    assert not calls.exists()
    assert not ops_log("other").exists()


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


def test_map_operator_retries_transient_errors_in_one_run_from_a_dict_policy(
    run_dag_file: Callable[..., Any], tmp_path: Path, calls: Path
) -> None:
    # the dict form, as it would come from params or a Variable; backoff 0 keeps the test fast
    policy = {"attempts": 3, "retry_on": ["builtins.RuntimeError"], "backoff": 0.0, "max_backoff": 0.0}
    dag = ops_dag("ops_retry", tmp_path, source=sample_items(), experiment="retry", map_extra=f", retry={policy!r}")
    run = run_dag_file(dag, "ops_retry")
    assert run.state == "success"  # items 3 and 7 failed their first attempt and were retried in place
    assert calls_in(calls) == collections.Counter({**{str(i): 1 for i in range(10)}, "3": 2, "7": 2})
    assert run.try_numbers()[("generate", 0)] == 1
    assert run.xcom("generate", map_index=0)["invocations"] == 6
    failures = ops_log("retry").failures()
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
        ops_dag("ops_limited", tmp_path, source=sample_items(), experiment="limited", map_extra=extra), "ops_limited"
    )
    assert run.state == "success"
    assert sum(calls_in(calls).values()) == 12  # 10 items, 2 of them retried once
    # the 12 attempts were taken from the key's budget, which every task on this root shares
    other = open_limiter(RateLimit(100, key="ops-model"), root=str(ops_log("limited").root))
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

    src = ops_dag("ops_badretry", tmp_path, source=sample_items(), map_extra=", retry={'attempts': -1}")
    (tmp_path / "dags").mkdir()
    path = write_dag_file(src, "ops_badretry", tmp_path / "dags")
    with pytest.raises(AssertionError, match=r"DatagenMapOperator: retry=\{'attempts': -1\} is not a valid retry"):
        load_dag(path, "ops_badretry")
