"""DatagenStatusSensor's usage conditions: max_cost_usd and max_tokens fail it once spend is above them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from airflow_provider_datagen.core import run_items
from airflow_provider_datagen.exceptions import ConfigurationError, UsageLimitExceededError
from airflow_provider_datagen.sensors.datagen import DatagenStatusSensor
from tests.sensors.test_datagen import _dag, _items, _log

if TYPE_CHECKING:
    from collections.abc import Callable


def _paid(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
    ctx.record_usage(model="m", input_tokens=100, output_tokens=20, cost_usd=0.01)
    return {"y": item["x"]}


@pytest.mark.parametrize("deferrable", [False, True])
def test_the_sensor_fails_when_spend_is_above_max_cost_usd(run_dag_file: Callable[..., Any], deferrable: bool) -> None:
    exp = f"spent{int(deferrable)}"
    run_items(_log(exp), _items(5), _paid)  # $0.05, 600 tokens
    dag_id = f"sens_cost_{int(deferrable)}"
    # all_done holds already, but the watchdog fires first
    run = run_dag_file(_dag(dag_id, exp, deferrable=deferrable, extra=", max_cost_usd=0.04"), dag_id)
    run.assert_failed(
        "wait", UsageLimitExceededError, r"^sens/spent\d: recorded cost \$0\.050000 is above max_cost_usd=\$0\.040000"
    )


def test_the_sensor_fails_when_tokens_are_above_max_tokens_and_passes_under_both(
    run_dag_file: Callable[..., Any],
) -> None:
    run_items(_log("tokens"), _items(5), _paid)
    run = run_dag_file(_dag("sens_tokens", "tokens", extra=", max_tokens=599"), "sens_tokens")
    run.assert_failed("wait", UsageLimitExceededError, r"recorded tokens 600 are above max_tokens=599")
    ok = run_dag_file(_dag("sens_under", "tokens", extra=", max_tokens=600, max_cost_usd=0.05"), "sens_under")
    assert ok.state == "success"
    assert ok.xcom("wait")["usage"]["input_tokens"] == 500


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_cost_usd": -1}, r"max_cost_usd=-1 is not a non-negative number"),
        ({"max_cost_usd": float("nan")}, r"max_cost_usd=nan is not a non-negative number"),
        ({"max_tokens": 1.5}, r"max_tokens=1\.5 is not a non-negative int"),
        ({"max_tokens": True}, r"max_tokens=True is not a non-negative int"),
    ],
)
def test_bad_limits_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match="DatagenStatusSensor: " + message):
        DatagenStatusSensor(task_id="w", pipeline="sens", experiment="x", **kwargs)
