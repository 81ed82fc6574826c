"""The batch operator through dag.test() against the in-process fake batch server: deferrable and not, errored rows
resubmitted, a rerun that submits nothing, bad arguments refused naming them, on_kill cancelling the open batches."""

from __future__ import annotations

import json
import textwrap
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest

from airflow_provider_datagen.exceptions import ConfigurationError, ItemsFailedError
from airflow_provider_datagen.llm.batch.step import llm_batch
from airflow_provider_datagen.operators.batch import DatagenBatchOperator
from airflow_provider_datagen.triggers.batch import DatagenBatchTrigger
from dev.batch_server import FakeBatchServer, custom_id_base, serving
from tests._support.ops_dag import sample_items

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from airflow_provider_datagen.core import CheckpointLog

PIPELINE = "batchops"
MODEL = "openai:gpt-4o-mini"

DAG_TEMPLATE = """
from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from airflow_provider_datagen.llm.batch.step import llm_batch
from airflow_provider_datagen.operators.batch import DatagenBatchOperator
from airflow_provider_datagen.operators.datagen import DatagenPlanOperator

step = llm_batch({prompt!r}, {step_kwargs})

with DAG({dag_id!r}, schedule=None, start_date=pendulum.datetime(2025, 1, 1), catchup=False,
         default_args={{"retries": 0}}):
    plan = DatagenPlanOperator(task_id="plan", pipeline={pipeline!r}, experiment={experiment!r},
                               source={source!r}, key_field="id", chunk_size=5,
                               processor_version=step.version{plan_extra})
    DatagenBatchOperator.partial(task_id="generate", pipeline={pipeline!r}, experiment={experiment!r},
                                 process={process}, poll_interval=0.01{extra}).expand_kwargs(plan.output)
"""


def batch_dag(
    dag_id: str,
    *,
    fake: FakeBatchServer | None,
    n: int = 10,
    extra: str = "",
    process: str = "step",
    conn_id: str | None = None,
    experiment: str | None = None,
    prompt: str = "Upper-case this: {{ text }}",
    plan_extra: str = "",
) -> str:
    """A plan >> mapped batch DAG over ``n`` items (chunks of 5) on pipeline ``batchops``, experiment ``dag_id``
    unless ``experiment`` is given."""
    if conn_id is not None:
        step_kwargs = f"llm_conn_id={conn_id!r}"
    else:
        assert fake is not None
        step_kwargs = f"model_id={MODEL!r}, base_url={fake.base_url!r}, api_key='sk-test'"
    return textwrap.dedent(
        DAG_TEMPLATE.format(
            dag_id=dag_id,
            pipeline=PIPELINE,
            experiment=experiment or dag_id,
            source=sample_items(n),
            prompt=prompt,
            plan_extra=plan_extra,
            step_kwargs=step_kwargs,
            process=process,
            extra=extra,
        )
    )


def batch_log(experiment: str) -> CheckpointLog:
    from airflow_provider_datagen.hooks.datagen import DatagenHook

    return DatagenHook().get_log(PIPELINE, experiment)


@pytest.fixture
def fake() -> Iterator[FakeBatchServer]:
    with serving(complete_after_polls=3) as server:
        yield server


@pytest.fixture
def triggers(monkeypatch: pytest.MonkeyPatch) -> list[DatagenBatchTrigger]:
    """Every DatagenBatchTrigger whose run() was started (dag.test() runs them in line)."""
    started: list[DatagenBatchTrigger] = []
    real = DatagenBatchTrigger.run

    def run(self: DatagenBatchTrigger) -> Any:
        started.append(self)
        return real(self)

    monkeypatch.setattr(DatagenBatchTrigger, "run", run)
    return started


def _upper_answers(fake: FakeBatchServer) -> None:
    fake.answer = lambda body: body["messages"][-1]["content"].split(": ", 1)[1].upper()


def test_deferrable_chunks_wait_in_the_trigger_and_record_every_item(
    run_dag_file: Callable[..., Any],
    fake: FakeBatchServer,
    triggers: list[DatagenBatchTrigger],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _upper_answers(fake)
    # the key lives in a connection: the trigger reads it on the triggerer, never from its kwargs
    conn = {"conn_type": "pydanticai", "host": fake.base_url, "password": "sk-conn", "extra": {"model": MODEL}}
    monkeypatch.setenv("AIRFLOW_CONN_BATCH_FAKE", json.dumps(conn))
    run = run_dag_file(batch_dag("batch_defer", fake=None, conn_id="batch_fake"), "batch_defer")
    assert run.state == "success", run.task_errors
    assert fake.creates == 2  # one batch per chunk
    assert len(triggers) == 2 and {t.serialize()[1]["api_key"] for t in triggers} == {None}
    assert all(t.llm_conn_id == "batch_fake" for t in triggers)
    for map_index in (0, 1):
        result = run.xcom("generate", map_index=map_index)
        assert (result["processed"], result["skipped"], result["failed"], result["in_batch"]) == (5, 0, 0, 0)
        assert len(result["batches"]) == 1
        assert run.xcom("generate", key="datagen_status", map_index=map_index)["pipeline"] == PIPELINE
    log = batch_log("batch_defer")
    assert log.summary()["completed"] == 10
    assert log.item_state("3").fields["output"] == "ITEM NUMBER 3"
    assert all(b.polls >= 3 for b in fake.batches)


def test_not_deferrable_polls_in_the_worker(
    run_dag_file: Callable[..., Any], fake: FakeBatchServer, triggers: list[DatagenBatchTrigger]
) -> None:
    run = run_dag_file(batch_dag("batch_sync", fake=fake, extra=", deferrable=False"), "batch_sync")
    assert run.state == "success", run.task_errors
    assert triggers == []  # never deferred
    assert fake.creates == 2
    assert [run.xcom("generate", map_index=i)["processed"] for i in (0, 1)] == [5, 5]
    assert batch_log("batch_sync").summary()["completed"] == 10


def _first_try_errors(cid: str) -> bool:
    """About a third of the items (by their custom_id's digest) error on their first submission."""
    return cid.endswith("-1") and int(cid[:2], 16) % 3 == 0


@pytest.mark.parametrize("deferrable", [True, False])
def test_errored_rows_are_resubmitted_alone_and_a_rerun_submits_nothing(
    run_dag_file: Callable[..., Any], fake: FakeBatchServer, deferrable: bool
) -> None:
    fake.errored = _first_try_errors
    dag_id = f"batch_retry_{deferrable}".lower()
    extra = f", retry={{'attempts': 2}}, deferrable={deferrable}"
    run = run_dag_file(batch_dag(dag_id, fake=fake, extra=extra), dag_id)
    assert run.state == "success", run.task_errors
    resubmitted = {base for base in fake.requests_per_custom_id_base if int(base[:2], 16) % 3 == 0}
    assert resubmitted, "the items give no first-try error: pick another predicate"
    assert fake.requests_per_custom_id_base == {
        base: 2 if base in resubmitted else 1 for base in fake.requests_per_custom_id_base
    }
    assert len(fake.requests_per_custom_id_base) == 10
    assert fake.creates == 2 + sum(1 for i in (0, 1) if len(run.xcom("generate", map_index=i)["batches"]) == 2)
    assert batch_log(dag_id).summary()["completed"] == 10

    creates = fake.creates
    run.clear_and_rerun(["generate"])
    assert run.state == "success", run.task_errors
    assert fake.creates == creates  # everything is done: nothing is submitted again
    for map_index in (0, 1):
        result = run.xcom("generate", map_index=map_index)
        assert (result["processed"], result["skipped"], result["batches"]) == (0, 5, [])


def test_rows_that_keep_erroring_fail_the_task_after_their_attempts(
    run_dag_file: Callable[..., Any], fake: FakeBatchServer
) -> None:
    fake.errored = lambda cid: int(cid[:2], 16) % 3 == 0  # every attempt of these items
    extra = ", retry={'attempts': 2}"
    run = run_dag_file(batch_dag("batch_giveup", fake=fake, extra=extra), "batch_giveup")
    assert run.state == "failed"
    failing = {base for base in fake.requests_per_custom_id_base if int(base[:2], 16) % 3 == 0}
    assert failing
    # each failing item was submitted exactly twice over the task's deferrals, never a third time
    assert {fake.requests_per_custom_id_base[base] for base in failing} == {2}
    failed_indexes = [i for i in (0, 1) if run.states()[("generate", i)] == "failed"]
    assert failed_indexes
    for map_index in failed_indexes:
        run.assert_failed(
            "generate",
            ItemsFailedError,
            r"^\d of 5 items failed in this chunk: .*\(first error: BatchRowError: batch batch_\w+: row \w+-2 errored",
            map_index=map_index,
        )
    assert batch_log("batch_giveup").summary()["completed"] == 10 - len(failing)


def test_a_budget_reached_by_one_chunk_skips_the_next_without_submitting(
    run_dag_file: Callable[..., Any], fake: FakeBatchServer
) -> None:
    run = run_dag_file(batch_dag("batch_budget", fake=fake, extra=", budget_usd=1e-9"), "batch_budget")
    states = {run.states()[("generate", i)] for i in (0, 1)}
    assert states == {"success", "skipped"}, run.task_errors
    assert fake.creates == 1  # the first chunk's batch spent the budget: the second submitted nothing
    skipped = next(i for i in (0, 1) if run.states()[("generate", i)] == "skipped")
    report = run.xcom("generate", key="datagen_report", map_index=skipped)
    assert report["stopped_by_budget"] is True and report["processed"] == 0
    assert batch_log("batch_budget").budget()["budget_usd"] == 1e-9
    assert batch_log("batch_budget").summary()["completed"] == 5


def test_a_process_path_naming_no_module_fails_before_any_write(
    run_dag_file: Callable[..., Any], fake: FakeBatchServer
) -> None:
    dag = batch_dag("batch_nomodule", fake=fake, process="'tests._support.no_such_module:step'")
    run = run_dag_file(dag, "batch_nomodule")
    run.assert_failed(
        "generate",
        ConfigurationError,
        r"^DatagenBatchOperator: process='tests._support.no_such_module:step' names a module it cannot import",
        map_index=0,
    )
    assert fake.creates == 0
    assert batch_log("batch_nomodule").summary()["completed"] == 0


def test_a_process_path_naming_a_plain_function_is_refused(
    run_dag_file: Callable[..., Any], fake: FakeBatchServer
) -> None:
    dag = batch_dag("batch_notstep", fake=fake, process="'tests._support.procs:always_ok'")
    run = run_dag_file(dag, "batch_notstep")
    run.assert_failed(
        "generate",
        ConfigurationError,
        r"^DatagenBatchOperator: process='tests._support.procs:always_ok' is a function, not a batch step; pass the "
        r"step llm_batch\(\.\.\.\) returns",
        map_index=0,
    )
    assert fake.creates == 0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (
            {"process": lambda item, ctx: {}},
            r"^DatagenBatchOperator: process=<function .*> is a function, not a batch step",
        ),
        ({"process": "not a path"}, r"^DatagenBatchOperator: process='not a path' is not a 'package.module:name' path"),
        ({"poll_interval": 0}, r"^DatagenBatchOperator: poll_interval=0 is not a positive number of seconds; give"),
        ({"poll_interval": "60"}, r"^DatagenBatchOperator: poll_interval='60' is not a positive number of seconds"),
        ({"budget_usd": -1.0}, r"budget_usd"),
        ({"retry": {"attempts": 0}}, r"^DatagenBatchOperator: retry=.* is not a valid retry policy"),
    ],
)
def test_bad_arguments_are_refused_when_the_dag_is_parsed(kwargs: dict[str, Any], match: str) -> None:
    base: dict[str, Any] = {"task_id": "g", "pipeline": PIPELINE, "experiment": "e", "process": _STEP}
    with pytest.raises(ConfigurationError, match=match):
        DatagenBatchOperator.partial(**{**base, **kwargs})
    with pytest.raises(ConfigurationError, match=match):
        DatagenBatchOperator(**{**base, **kwargs}, source=[{"id": "1"}])


def test_redo_completed_takes_the_plans_values_only() -> None:
    op = DatagenBatchOperator(
        task_id="g", pipeline=PIPELINE, experiment="e", process=_STEP, source=[], redo_completed="other_version"
    )
    assert op.redo_completed == "other_version"
    with pytest.raises(ConfigurationError, match=r"redo_completed='always'"):
        DatagenBatchOperator(
            task_id="g", pipeline=PIPELINE, experiment="e", process=_STEP, source=[], redo_completed="always"
        )


def test_a_plan_with_other_version_resubmits_items_completed_under_another_version(
    run_dag_file: Callable[..., Any], fake: FakeBatchServer
) -> None:
    _upper_answers(fake)
    run = run_dag_file(batch_dag("batch_redo_v1", fake=fake, experiment="batch_redo"), "batch_redo_v1")
    assert run.state == "success", run.task_errors
    old_version = batch_log("batch_redo").item_state("3").processor_version
    assert set(fake.requests_per_custom_id_base.values()) == {1}

    # the step's prompt changed (a new version); a plan that keeps other versions' items submits nothing
    edited = {"experiment": "batch_redo", "prompt": "Upper-case this, again: {{ text }}"}
    run = run_dag_file(batch_dag("batch_redo_keep", fake=fake, **edited), "batch_redo_keep")
    assert run.state == "success", run.task_errors
    assert fake.creates == 2 and set(fake.requests_per_custom_id_base.values()) == {1}
    assert batch_log("batch_redo").item_state("3").processor_version == old_version

    # one with redo_completed="other_version" submits every item again, as a new generation
    fake.answer = lambda body: body["messages"][-1]["content"].upper()
    src = batch_dag("batch_redo_v2", fake=fake, plan_extra=', redo_completed="other_version"', **edited)
    run = run_dag_file(src, "batch_redo_v2")
    assert run.state == "success", run.task_errors
    assert fake.creates == 4
    assert sorted(fake.requests_per_custom_id_base.values()) == [2] * 10
    assert [run.xcom("generate", map_index=i)["processed"] for i in (0, 1)] == [5, 5]
    log = batch_log("batch_redo")
    state = log.item_state("3")
    assert state.processor_version != old_version and state.fields["output"] == "UPPER-CASE THIS, AGAIN: ITEM NUMBER 3"
    assert log.summary()["completed"] == 10


_STEP = llm_batch("{{ text }}", model_id=MODEL, base_url="http://127.0.0.1:9/v1", api_key="k")


class _TI:
    dag_id, run_id, task_id, map_index, try_number = "d", "r", "generate", -1, 1

    def __init__(self) -> None:
        self.pushed: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed[key] = value


def test_on_kill_cancels_the_open_batches_of_a_worker_waiting_on_them(
    checkpoint_log: Callable[..., CheckpointLog], monkeypatch: pytest.MonkeyPatch
) -> None:
    with serving(complete_after_polls=10**6) as fake:  # never ends on its own
        step = llm_batch("{{ text }}", model_id=MODEL, base_url=fake.base_url, api_key="k")
        op = DatagenBatchOperator(
            task_id="generate",
            pipeline="p",
            experiment="kill",
            process=step,
            source=sample_items(4),
            poll_interval=0.01,
            deferrable=False,
        )
        monkeypatch.setattr(op, "get_log", lambda: checkpoint_log("kill"))
        outcome: dict[str, Any] = {}

        def execute() -> None:
            try:
                outcome["result"] = op.execute({"ti": _TI()})  # type: ignore[typeddict-item]
            except BaseException as exc:
                outcome["error"] = exc

        worker = threading.Thread(target=execute, daemon=True)
        worker.start()
        deadline = time.monotonic() + 60
        while op._waiting is None or not fake.batches or fake.batches[0].polls < 2:
            assert time.monotonic() < deadline and worker.is_alive(), outcome
            time.sleep(0.01)
        op.on_kill()
        worker.join(60)
        assert not worker.is_alive()
        assert fake.creates == 1 and fake.batches[0].cancel_requested_at is not None
        # the cancelled rows came back cancelled and failed their items (a rerun resubmits them)
        assert isinstance(outcome.get("error"), ItemsFailedError), outcome
        assert "row" in str(outcome["error"]) and "cancelled" in str(outcome["error"])
        assert {custom_id_base(c) for c in fake.batches[0].custom_ids} == set(fake.requests_per_custom_id_base)
