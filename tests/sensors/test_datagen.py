"""DatagenStatusSensor in poke, reschedule and deferrable modes, through dag.test()."""

from __future__ import annotations

import asyncio
import textwrap
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest
from airflow.sdk.exceptions import AirflowSensorTimeout

from airflow_provider_datagen.core import run_items
from airflow_provider_datagen.core.status import STATUS_KEYS
from airflow_provider_datagen.exceptions import ConfigurationError, ExperimentNotFoundError
from airflow_provider_datagen.sensors.datagen import DatagenStatusSensor, TooManyFailedItemsError
from airflow_provider_datagen.triggers.datagen import DatagenStatusTrigger

if TYPE_CHECKING:
    from collections.abc import Callable

SENSOR_DAG = """
from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from airflow_provider_datagen.sensors.datagen import DatagenStatusSensor

with DAG({dag_id!r}, schedule=None, start_date=pendulum.datetime(2025, 1, 1), catchup=False):
    DatagenStatusSensor(task_id="wait", pipeline="sens", experiment={experiment!r}, condition={condition!r},
                        source={source!r}, max_failed_items={max_failed!r}, mode={mode!r},
                        deferrable={deferrable!r}, poke_interval=0.5, timeout={timeout!r}{extra})
"""


def _items(n: int) -> list[dict[str, Any]]:
    return [{"id": str(i), "x": i} for i in range(n)]


def _log(experiment: str) -> Any:
    from airflow_provider_datagen.hooks.datagen import DatagenHook

    return DatagenHook().get_log("sens", experiment)


def _ok(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
    return {"y": item["x"] * 2}


def _fail_odd(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
    if item["x"] % 2:
        raise ValueError(f"odd {item['x']}")
    return {"y": item["x"]}


def _dag(
    dag_id: str,
    experiment: str,
    *,
    mode: str = "poke",
    deferrable: bool = False,
    condition: str = "all_done",
    source: Any = None,
    max_failed: int | None = None,
    timeout: float = 60,
    extra: str = "",
) -> str:
    return textwrap.dedent(
        SENSOR_DAG.format(
            extra=extra,
            dag_id=dag_id,
            experiment=experiment,
            condition=condition,
            source=source,
            max_failed=max_failed,
            mode=mode,
            deferrable=deferrable,
            timeout=timeout,
        )
    )


@pytest.mark.parametrize(("mode", "deferrable"), [("poke", False), ("reschedule", False), ("poke", True)])
def test_sensor_returns_folded_status_in_every_mode(
    run_dag_file: Callable[..., Any], mode: str, deferrable: bool
) -> None:
    exp = f"done{mode}{int(deferrable)}"
    run_items(_log(exp), _items(6), _ok)
    dag_id = f"sens_{mode}_{int(deferrable)}"
    run = run_dag_file(_dag(dag_id, exp, mode=mode, deferrable=deferrable), dag_id)
    assert run.state == "success"
    status = run.xcom("wait")
    assert set(STATUS_KEYS) <= set(status)
    assert status["completed"] == 6 and status["pending"] == 0
    assert run.xcom("wait", key="datagen_status") == status


@pytest.mark.parametrize(("mode", "deferrable"), [("poke", False), ("reschedule", False), ("poke", True)])
def test_sensor_waits_until_items_complete(run_dag_file: Callable[..., Any], mode: str, deferrable: bool) -> None:
    exp = f"later{mode}{int(deferrable)}"
    items = _items(4)
    # The thread's log is opened here, before any task runs: a hook called from another thread while
    # dag.test() runs a task in this process would share that task's supervisor channel.
    later = _log(exp)
    run_items(later, items[:2], _ok)
    finished: list[object] = []

    def finish() -> None:
        time.sleep(3)
        finished.append(run_items(later, items, _ok, epoch=2))

    t = threading.Thread(target=finish)
    t.start()
    dag_id = f"sens_later_{mode}_{int(deferrable)}"
    started = time.monotonic()
    # With the source given, the two never-started items count as pending until the thread runs them.
    run = run_dag_file(_dag(dag_id, exp, mode=mode, deferrable=deferrable, source=items), dag_id)
    t.join()
    assert finished, "the thread's run ended with an error"
    assert run.state == "success", run.error("wait")
    assert time.monotonic() - started >= 2.5
    assert run.xcom("wait")["completed"] == 4


MISSING = (
    r"^experiment 'sens'/'{exp}' does not exist: it has no log under root '.+' \(looked for .+\)\. .*Check the "
    r"pipeline and experiment names and the connection's root, or pass allow_missing=True to wait until a run "
    r"creates the experiment\.$"
)


@pytest.mark.parametrize(("mode", "deferrable"), [("poke", False), ("reschedule", False), ("poke", True)])
def test_sensor_on_a_missing_experiment_fails_naming_it(
    run_dag_file: Callable[..., Any], mode: str, deferrable: bool
) -> None:
    exp = f"nosuch{mode}{int(deferrable)}"
    dag_id = f"sens_missing_{mode}_{int(deferrable)}"
    run = run_dag_file(_dag(dag_id, exp, mode=mode, deferrable=deferrable), dag_id)
    assert run.state == "failed"
    run.assert_failed("wait", ExperimentNotFoundError, MISSING.format(exp=exp))
    assert not _log(exp).exists()  # looking never creates the log


@pytest.mark.parametrize(("mode", "deferrable"), [("poke", False), ("reschedule", False), ("poke", True)])
def test_sensor_with_allow_missing_waits_for_the_experiment_to_be_created(
    run_dag_file: Callable[..., Any], mode: str, deferrable: bool
) -> None:
    exp = f"created{mode}{int(deferrable)}"
    later = _log(exp)  # opened before any task runs, as in the test above; opening creates nothing
    created: list[object] = []

    def create() -> None:
        time.sleep(3)
        created.append(run_items(later, _items(3), _ok))

    t = threading.Thread(target=create)
    t.start()
    dag_id = f"sens_created_{mode}_{int(deferrable)}"
    # "no_pending" holds on an empty experiment: the sensor must still wait for the log to exist
    run = run_dag_file(
        _dag(dag_id, exp, mode=mode, deferrable=deferrable, condition="no_pending", extra=", allow_missing=True"),
        dag_id,
    )
    t.join()
    assert created, "the thread's run ended with an error"
    assert run.state == "success", run.error("wait")
    assert run.xcom("wait")["completed"] == 3


def test_trigger_carries_allow_missing_and_reports_a_missing_experiment() -> None:
    trig = DatagenStatusTrigger(pipeline="sens", experiment="nosuchtrig", poke_interval=0.1, allow_missing=True)
    path, kwargs = trig.serialize()
    assert kwargs["allow_missing"] is True
    assert DatagenStatusTrigger(**kwargs).serialize() == (path, kwargs)

    async def first_event(t: DatagenStatusTrigger) -> Any:
        async for ev in t.run():
            return ev
        return None

    strict = DatagenStatusTrigger(pipeline="sens", experiment="nosuchtrig", poke_interval=0.1)
    assert strict.serialize()[1]["allow_missing"] is False
    event = asyncio.run(first_event(strict))
    assert event.payload["outcome"] == "not_found"
    sensor = DatagenStatusSensor(task_id="w", pipeline="sens", experiment="nosuchtrig", deferrable=True)
    with pytest.raises(ExperimentNotFoundError, match=MISSING.format(exp="nosuchtrig")):
        sensor.execute_complete({}, event.payload)  # type: ignore[arg-type]

    async def waits(t: DatagenStatusTrigger) -> bool:
        try:
            await asyncio.wait_for(first_event(t), timeout=1.0)
        except TimeoutError:
            return True
        return False

    assert asyncio.run(waits(trig))  # with allow_missing it keeps polling, firing nothing
    with pytest.raises(ConfigurationError, match=r"^DatagenStatusSensor: allow_missing='yes' is not a bool; "):
        DatagenStatusSensor(task_id="w", pipeline="sens", experiment="e", allow_missing="yes")


def test_sensor_fails_when_failed_items_exceed_the_bound(run_dag_file: Callable[..., Any]) -> None:
    run_items(_log("failing"), _items(6), _fail_odd)
    run = run_dag_file(_dag("sens_fail", "failing", max_failed=1), "sens_fail")
    assert run.state == "failed"
    run.assert_failed(
        "wait",
        TooManyFailedItemsError,
        r"^3 items of sens/failing are failed, more than max_failed_items=1 \(e\.g\. '1', '3', '5'\)",
    )


def test_sensor_times_out_when_condition_never_holds(run_dag_file: Callable[..., Any]) -> None:
    run_items(_log("stuck"), _items(3), _fail_odd)
    run = run_dag_file(_dag("sens_timeout", "stuck", timeout=2), "sens_timeout")
    assert run.state == "failed"
    # the sensor's own timeout, not a failure it detected: max_failed_items is unset
    run.assert_failed("wait", AirflowSensorTimeout, r"^Sensor has timed out; .* exceeds the specified timeout of 2")


def test_poke_reports_failed_ids_and_rerun_advice() -> None:
    run_items(_log("advice"), _items(6), _fail_odd)
    sensor = DatagenStatusSensor(task_id="w", pipeline="sens", experiment="advice", max_failed_items=0)
    with pytest.raises(TooManyFailedItemsError, match=r"'1', '3', '5'.*clear the failed DatagenMapOperator"):
        sensor.poke({"ti": None})  # type: ignore[typeddict-item]


def test_callable_condition_and_bad_arguments() -> None:
    run_items(_log("callable"), _items(3), _ok)
    sensor = DatagenStatusSensor(
        task_id="w", pipeline="sens", experiment="callable", condition=lambda s: s["completed"] >= 3
    )
    assert sensor._holds(sensor._status())
    # One message form for every argument error: "<Class>: <param>=<value!r> <problem>; <fix>".
    with pytest.raises(ConfigurationError, match=r"^DatagenStatusSensor: condition='sometimes' is unknown; use one of"):
        DatagenStatusSensor(task_id="w", pipeline="sens", experiment="e", condition="sometimes")
    with pytest.raises(
        ConfigurationError, match=r"^DatagenStatusSensor: condition=<function .* cannot run in the triggerer"
    ):
        DatagenStatusSensor(task_id="w", pipeline="sens", experiment="e", condition=lambda s: True, deferrable=True)
    with pytest.raises(
        ConfigurationError, match=r"^DatagenStatusSensor: max_failed_items=-1 is not a non-negative int; "
    ):
        DatagenStatusSensor(task_id="w", pipeline="sens", experiment="e", max_failed_items=-1)
    with pytest.raises(
        ConfigurationError, match=r"^DatagenStatusTrigger: condition=<function .* is not a condition name"
    ):
        DatagenStatusTrigger(pipeline="sens", experiment="e", condition=lambda s: True)  # type: ignore[arg-type]


def test_trigger_serializes_to_its_dotted_path_and_reads_in_a_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    run_items(_log("trig"), _items(3), _ok)
    trig = DatagenStatusTrigger(pipeline="sens", experiment="trig", poke_interval=0.1)
    path, kwargs = trig.serialize()
    assert path == "airflow_provider_datagen.triggers.datagen.DatagenStatusTrigger"
    assert DatagenStatusTrigger(**kwargs).serialize() == (path, kwargs)
    threads: list[str] = []
    real = trig._status

    def spy() -> dict[str, Any]:
        threads.append(threading.current_thread().name)
        return real()

    monkeypatch.setattr(trig, "_status", spy)

    async def first_event() -> Any:
        async for ev in trig.run():
            return ev
        return None

    event = asyncio.run(first_event())
    assert event.payload["outcome"] == "done"
    assert event.payload["status"]["completed"] == 3
    assert threads and threads[0] != threading.main_thread().name
