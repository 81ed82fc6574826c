"""budget_usd on the plan and map operators through dag.test(): stop, say so, continue when raised.

Each item of these DAGs costs exactly $0.01 (tests._support.procs:paid_model), so the stop is exact.
"""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING, Any

import pytest
from airflow.sdk import DAG

from airflow_provider_datagen.exceptions import ConfigurationError
from airflow_provider_datagen.operators.datagen import DatagenMapOperator, DatagenPlanOperator

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

BUDGET_DAG = """
from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from airflow_provider_datagen.operators.datagen import DatagenExportOperator, DatagenMapOperator, DatagenPlanOperator

with DAG({dag_id!r}, schedule=None, start_date=pendulum.datetime(2025, 1, 1), catchup=False):
    plan = DatagenPlanOperator(task_id="plan", pipeline="budget", experiment={experiment!r},
                               source={source!r}, chunk_size=5, budget_usd={budget!r})
    gen = DatagenMapOperator.partial(task_id="generate", pipeline="budget", experiment={experiment!r},
                                     process="tests._support.procs:paid_model",
                                     checkpoint_every=1, budget_usd={budget!r}).expand_kwargs(plan.output)
    export = DatagenExportOperator(task_id="export", pipeline="budget", experiment={experiment!r},
                                   destination={destination!r}, trigger_rule="none_failed")
    plan >> gen >> export
"""


def _items(n: int = 10) -> list[dict[str, Any]]:
    return [{"id": f"{i:02d}", "text": f"item number {i}"} for i in range(n)]


def _dag(dag_id: str, experiment: str, budget: float | None, tmp: Path) -> str:
    return textwrap.dedent(
        BUDGET_DAG.format(
            dag_id=dag_id,
            experiment=experiment,
            source=_items(),
            budget=budget,
            destination=str(tmp / f"{dag_id}.lance"),
        )
    )


def _log(experiment: str) -> Any:
    from airflow_provider_datagen.hooks.datagen import DatagenHook

    return DatagenHook().get_log("budget", experiment)


def test_map_tasks_stop_on_the_budget_and_a_raised_budget_continues(
    run_dag_file: Callable[..., Any], tmp_path: Path
) -> None:
    first = run_dag_file(_dag("budget_low", "spend", 0.03, tmp_path), "budget_low")
    states = first.states()
    assert states[("generate", 0)] == "skipped"
    assert states[("generate", 1)] == "skipped"
    # the budget skipped both mapped tasks (no item failed). Which chunk dag.test() runs first is its
    # choice, so one of them ran 3 items and the other found the budget spent before its first call.
    reports = sorted(
        (first.xcom("generate", key="datagen_report", map_index=i) for i in (0, 1)),
        key=lambda report: report["invocations"],
    )
    assert reports == [
        {"processed": 0, "skipped": 0, "replayed": 0, "failed": 0, "invocations": 0, "stopped_by_budget": True},
        {"processed": 3, "skipped": 0, "replayed": 0, "failed": 0, "invocations": 3, "stopped_by_budget": True},
    ]
    log = _log("spend")
    status = log.summary()
    assert status["completed"] == 3 and status["failed_items"] == 0
    assert status["usage"]["cost_usd"] == pytest.approx(0.03)
    assert log.budget() == {"budget_usd": 0.03, "budget_tokens": None}

    # a later run at the same budget: the plan returns no chunks (and says why in its log)
    again = run_dag_file(_dag("budget_same", "spend", 0.03, tmp_path), "budget_same")
    assert again.xcom("plan") == []
    assert again.states()[("generate", -1)] in ("skipped", None)
    assert log.usage()["calls"] == 3

    # raised: the rest runs, and the export equals an uninterrupted run's
    raised = run_dag_file(_dag("budget_high", "spend", 1.0, tmp_path), "budget_high")
    assert raised.state == "success"
    assert raised.xcom("export")["rows"] == 10
    assert log.usage()["calls"] == 10  # every item paid once
    whole = run_dag_file(_dag("budget_none", "whole", None, tmp_path), "budget_none")
    assert whole.state == "success"
    assert raised.xcom("export")["fingerprint"] == whole.xcom("export")["fingerprint"]
    assert _log("whole").budget() == {"budget_usd": None, "budget_tokens": None}
    assert whole.xcom("plan", key="datagen_status")["usage"]["calls"] == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"budget_usd": 0}, r"budget_usd=0 is not a positive number"),
        ({"budget_usd": "5"}, r"budget_usd='5' is not a positive number"),
        ({"budget_tokens": 2.5}, r"budget_tokens=2\.5 is not a positive int"),
        ({"budget_tokens": -1}, r"budget_tokens=-1 is not a positive int"),
    ],
)
def test_bad_budgets_are_refused_when_the_dag_is_parsed(kwargs: dict[str, Any], message: str) -> None:
    with DAG("budget_bad", schedule=None):
        with pytest.raises(ConfigurationError, match="DatagenPlanOperator: " + message):
            DatagenPlanOperator(task_id="p", pipeline="p", experiment="e", source=[], **kwargs)
        with pytest.raises(ConfigurationError, match="DatagenMapOperator: " + message):
            DatagenMapOperator.partial(task_id="m", pipeline="p", experiment="e", process="a.b:c", **kwargs)
        with pytest.raises(ConfigurationError, match="DatagenMapOperator: " + message):
            DatagenMapOperator(task_id="m2", pipeline="p", experiment="e", process="a.b:c", source=[], **kwargs)


REPEATED_DAG = """
from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from airflow_provider_datagen.operators.datagen import DatagenMapOperator


def unreachable(item, ctx):
    raise ConnectionError("Connection error.")


with DAG({dag_id!r}, schedule=None, start_date=pendulum.datetime(2025, 1, 1), catchup=False):
    DatagenMapOperator(task_id="generate", pipeline="budget", experiment={experiment!r}, process=unreachable,
                       source={source!r}, max_repeated_failures=3)
"""


def test_a_systemic_failure_fails_the_task_with_repeated_failure_error(
    run_dag_file: Callable[..., Any], tmp_path: Path
) -> None:
    from airflow_provider_datagen.exceptions import RepeatedFailureError

    src = textwrap.dedent(REPEATED_DAG.format(dag_id="repeated", experiment="repeated", source=_items(20)))
    run = run_dag_file(src, "repeated")
    assert run.states()[("generate", -1)] == "failed"
    err = run.error("generate")
    assert isinstance(err, RepeatedFailureError), repr(err)
    assert "3 items in a row failed with the same error, ConnectionError: Connection error." in str(err)
    assert "the items not yet processed stay pending" in str(err)
    status = _log("repeated").summary()
    assert status["failed_items"] == 3 and status["completed"] == 0  # three calls paid for, not twenty


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "5"])
def test_a_bad_max_repeated_failures_is_refused_when_the_dag_is_parsed(bad: Any) -> None:
    message = r"DatagenMapOperator: max_repeated_failures=.* is not a positive int; give max_repeated_failures"
    with DAG("repeated_bad", schedule=None):
        with pytest.raises(ConfigurationError, match=message):
            DatagenMapOperator.partial(
                task_id="m", pipeline="p", experiment="e", process="a.b:c", max_repeated_failures=bad
            )
        with pytest.raises(ConfigurationError, match=message):
            DatagenMapOperator(
                task_id="m2", pipeline="p", experiment="e", process="a.b:c", source=[], max_repeated_failures=bad
            )
        ok = DatagenMapOperator(task_id="m3", pipeline="p", experiment="e", process="a.b:c", source=[])
        assert ok.max_repeated_failures == 5
        off = DatagenMapOperator(
            task_id="m4", pipeline="p", experiment="e", process="a.b:c", source=[], max_repeated_failures=None
        )
        assert off.max_repeated_failures is None
