"""Usage values are bounded: record_usage refuses absurd values; an older version's stay readable."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from airflow_provider_datagen.core import run_items, status_of
from airflow_provider_datagen.core.fold.usage import MAX_COUNT, NANOS, SATURATED
from airflow_provider_datagen.core.ledger.budget import Budget, budget_reached
from airflow_provider_datagen.core.ledger.records import UsageRecord
from airflow_provider_datagen.core.runner import context as context_module
from airflow_provider_datagen.exceptions import UsageValueError
from tests._support.engine import open_log

if TYPE_CHECKING:
    from pathlib import Path


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"input_tokens": 2**64}, "input_tokens=18446744073709551616 is above the most one call may record"),
        ({"output_tokens": 10**12 + 1}, "output_tokens=1000000000001 is above the most one call may record"),
        ({"cost_usd": 9.2e9}, "cost_usd=9200000000.0 is above the most one call may record (1,000,000 USD)"),
    ],
)
def test_record_usage_refuses_values_no_model_reports(tmp_path: Path, kwargs: dict[str, Any], message: str) -> None:
    def proc(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        ctx.record_usage(model="m", **{"cost_usd": 0.0, **kwargs})
        return {"ok": True}

    log = open_log(tmp_path, "e")
    report = run_items(log, [{"id": "a"}], proc)
    assert report.failed == ["a"]
    assert report.errors["a"].startswith("UsageValueError: ctx.record_usage: " + message)
    assert log.usage()["calls"] == 0
    with pytest.raises(UsageValueError, match="the most one call may record"):
        context_module.usage_record("m", 2**64, 0, 0.0, 1)


def test_the_bounds_scale_with_calls() -> None:
    assert context_module.usage_record("m", 3 * 10**12, 0, 3e6, 3).input_tokens == 3 * 10**12
    with pytest.raises(UsageValueError, match=r"above the most 3 calls may record \(3,000,000,000,000 tokens\)"):
        context_module.usage_record("m", 3 * 10**12 + 1, 0, 0.0, 3)


def _unchecked(
    model: Any, input_tokens: Any, output_tokens: Any, cost_usd: Any, calls: Any, request_key: Any = None
) -> UsageRecord:
    """What an older version recorded: the values as given, unchecked."""
    return UsageRecord(model, calls, input_tokens, output_tokens, cost_usd, request_key=request_key)


def test_a_log_holding_older_unbounded_values_stays_readable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def hostile(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        if item["id"] == "a":
            ctx.record_usage(model="m", input_tokens=2**64, output_tokens=2**70, cost_usd=9.2e9)
        else:
            ctx.record_usage(model="m", input_tokens=5, cost_usd=9.2e9)
        return {"ok": True}

    log = open_log(tmp_path, "e")
    monkeypatch.setattr(context_module, "usage_record", _unchecked)
    run_items(log, [{"id": "a"}, {"id": "b"}, {"id": "c"}], hostile)
    monkeypatch.undo()

    usage = log.usage()
    # each stored entry is read at its bound: never ArrowInvalid, never wrapped
    assert usage["input_tokens"] == MAX_COUNT + 5 + 5
    assert usage["output_tokens"] == MAX_COUNT
    assert usage["cost_usd"] == 3 * 10**9  # three entries, each read at MAX_USD
    assert usage["cost_usd"] > 0
    assert open_log(tmp_path, "e").usage() == usage  # a cold read: the vectorized fold
    assert log.item_usage("a")["input_tokens"] == MAX_COUNT
    assert log.item_usage("a")["attempts"][0]["input_tokens"] == MAX_COUNT
    nanos, _ = log.usage_spend()
    assert 0 < nanos <= SATURATED and nanos == 3 * 10**9 * NANOS
    # the budget a plan checks is reached, not ignored
    assert budget_reached(log, Budget(usd=100.0)) == f"spent ${nanos / NANOS:.6f} of a budget_usd of $100.000000"
    assert log.summary()["usage"]["input_tokens"] == usage["input_tokens"]
    assert status_of(log)["usage"]["cost_usd"] == usage["cost_usd"]
    log.maintain()  # stores the usage projection (int64 sums)
    assert open_log(tmp_path, "e").usage() == usage  # read from the projection
    # a run with a budget reads the spend and stops at once
    report = run_items(log, [{"id": "d"}], lambda item, ctx: {"ok": True}, budget_usd=100.0, epoch=2)
    assert report.processed == []
