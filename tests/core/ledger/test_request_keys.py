"""An attempt's usage entries name the requests it made (``"request_keys"``): stored, read back, summed as before."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from airflow_provider_datagen.core import CheckpointLog, run_items
from airflow_provider_datagen.core.fold.usage import usage_of_events
from airflow_provider_datagen.core.ledger import attempt_entries, usage_record
from airflow_provider_datagen.core.ledger.records import reused_record
from airflow_provider_datagen.exceptions import ConfigurationError

if TYPE_CHECKING:
    from pathlib import Path

K1, K2, K3 = "1" * 64, "2" * 64, "3" * 64
MODEL = "openai:gpt-4o-mini"


def _keyed(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
    ctx.take_request_slot()
    ctx.record_usage(MODEL, 100, 10, cost_usd=0.01, request_key=K1)
    ctx.take_request_slot()
    ctx.record_usage(MODEL, 120, 12, cost_usd=0.02, request_key=K2)
    ctx.record_reused(MODEL, 50, 5, saved_usd=0.03, request_key=K3)
    return {"x": 1}


def _plain(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
    ctx.take_request_slot()
    ctx.record_usage(MODEL, 100, 10, cost_usd=0.01)
    ctx.take_request_slot()
    ctx.record_usage(MODEL, 120, 12, cost_usd=0.02)
    ctx.record_reused(MODEL, 50, 5, saved_usd=0.03)
    return {"x": 1}


def _completed(log: CheckpointLog, item: str) -> dict[str, Any]:
    (ev,) = [e for e in log.events(item) if e.event_type.value == "STEP_COMPLETED"]
    assert ev.value_json is not None
    return json.loads(ev.value_json)


def test_the_keys_are_stored_per_entry_in_call_order(tmp_path: Path) -> None:
    log = CheckpointLog.open(tmp_path, pipeline="p", experiment="e")
    run_items(log, [{"id": "a"}], _keyed)
    sent, reused = _completed(log, "a")["usage"]
    assert (sent["calls"], sent["request_keys"]) == (2, [K1, K2])
    assert (reused["reused"], reused["request_keys"]) == (True, [K3])


def test_keys_change_no_sum_and_both_folds_agree(tmp_path: Path) -> None:
    keyed = CheckpointLog.open(tmp_path, pipeline="p", experiment="keyed")
    plain = CheckpointLog.open(tmp_path, pipeline="p", experiment="plain")
    items = [{"id": str(i)} for i in range(4)]
    run_items(keyed, items, _keyed)
    run_items(plain, items, _plain)  # what an older version stored: no keys
    assert "request_keys" not in json.dumps(_completed(plain, "0"))
    usage = keyed.usage()
    assert usage == plain.usage()
    assert (usage["calls"], usage["requests"], usage["reused_calls"]) == (8, 8, 4)
    assert usage["saved_usd"] == pytest.approx(0.12)
    events = [ev for i in range(4) for ev in keyed.events(str(i))]
    assert usage_of_events(events) == usage  # the reference fold over the same rows
    assert keyed.usage_spend() == plain.usage_spend()
    # the item's attempts read the same, keys or not
    assert keyed.item_usage("0") == plain.item_usage("0")


def test_records_keep_the_key_and_entries_collect_them() -> None:
    records = [
        usage_record(MODEL, 1, 1, None, 1, request_key=K1),
        usage_record(MODEL, 1, 1, None, 1),  # a call of no known request
        usage_record("anthropic:claude-sonnet-4-5", 1, 1, None, 1, request_key=K2),
        reused_record(MODEL, 1, 1, None, request_key=K3),
    ]
    entries = attempt_entries(records)
    assert [(e["model"], e.get("reused", False), e.get("request_keys")) for e in entries] == [
        (MODEL, False, [K1]),
        ("anthropic:claude-sonnet-4-5", False, [K2]),
        (MODEL, True, [K3]),
    ]
    assert "request_keys" not in attempt_entries([usage_record(MODEL, 1, 1, None, 1)])[0]


@pytest.mark.parametrize(
    ("key", "calls", "message"),
    [
        ("abc", 1, "is not a request key"),
        ("A" * 64, 1, "is not a request key"),
        (123, 1, "is not a request key"),
        (K1, 2, "names one request but calls=2"),
    ],
)
def test_a_bad_key_names_the_argument(key: Any, calls: int, message: str) -> None:
    with pytest.raises(ConfigurationError, match=f"request_key=.* {message}"):
        usage_record(MODEL, 1, 1, None, calls, request_key=key)
