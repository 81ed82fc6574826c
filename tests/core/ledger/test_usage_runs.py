"""Usage recorded through ctx in real runs: where it is stored, what log.usage()/item_usage() fold from it.

Every path that ends an attempt stores its usage: the one-step fast path, the general driver (steps,
fan-out reduce), worker threads, transient retries and failures. A batch that lands twice counts once.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest

from airflow_provider_datagen.core import RetryPolicy, run_items, status_of
from airflow_provider_datagen.core.events import canonical_json
from airflow_provider_datagen.core.fold.usage import empty_usage, usage_of_events
from airflow_provider_datagen.core.schema import EVENT_SCHEMA, NON_BLOB_COLUMNS, EventType
from airflow_provider_datagen.core.steps import Sequence, Step
from airflow_provider_datagen.exceptions import ConfigurationError
from tests._support.engine import open_log, results_fp

if TYPE_CHECKING:
    from pathlib import Path

    from airflow_provider_datagen.core import CheckpointLog

ITEM_KEYS = {"attempt", "step", "status", "model", "input_tokens", "output_tokens", "cost_usd", "calls", "requests"}
USAGE_KEYS = {
    "calls",
    "requests",
    "input_tokens",
    "output_tokens",
    "cost_usd",
    "unpriced_calls",
    "by_model",
    "failed_attempts_cost_usd",
    "reused_calls",
    "saved_usd",
}


def _items(n: int) -> list[dict[str, Any]]:
    return [{"id": f"i{k}", "v": k} for k in range(n)]


def _model(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
    ctx.record_usage(model="m1", input_tokens=100, output_tokens=10, cost_usd=0.01)
    ctx.record_usage(model="unpriced:x", input_tokens=1, output_tokens=1, calls=2)
    return {"out": item["v"] * 2}


def _all_events(log: CheckpointLog) -> list[Any]:
    return [ev for iid in log.states()["item_id"].to_pylist() for ev in log.events(iid)]


@pytest.mark.parametrize("concurrency", [1, 4])
def test_a_process_records_usage_with_its_completion(tmp_path: Path, concurrency: int) -> None:
    log = open_log(tmp_path, "e")
    report = run_items(log, _items(6), _model, concurrency=concurrency)
    assert len(report.processed) == 6
    usage = log.usage()
    assert set(usage) == USAGE_KEYS
    assert usage["calls"] == 18
    assert usage["input_tokens"] == 606
    assert usage["output_tokens"] == 66
    assert usage["cost_usd"] == pytest.approx(0.06)
    assert usage["unpriced_calls"] == 12
    assert usage["failed_attempts_cost_usd"] == 0.0
    assert usage["by_model"]["m1"] == {
        "calls": 6,
        "input_tokens": 600,
        "output_tokens": 60,
        "cost_usd": pytest.approx(0.06),
        "unpriced_calls": 0,
    }
    assert usage == usage_of_events(_all_events(log))
    # stored in the STEP_COMPLETED that ends the attempt, within the seven event types
    done = [ev for ev in log.events("i0") if ev.event_type is EventType.STEP_COMPLETED]
    assert json.loads(done[0].value_json) == {
        "attempt": 1,
        "usage": [
            {
                "model": "m1",
                "calls": 1,
                "input_tokens": 100,
                "output_tokens": 10,
                "cost_usd": 0.01,
                "unpriced_calls": 0,
            },
            {
                "model": "unpriced:x",
                "calls": 2,
                "input_tokens": 1,
                "output_tokens": 1,
                "cost_usd": None,
                "unpriced_calls": 2,
            },
        ],
    }
    # the status dict carries it, from status_of and summary alike
    assert status_of(log)["usage"] == usage
    assert log.summary()["usage"] == usage


def test_usage_does_not_change_the_export(tmp_path: Path) -> None:
    with_usage, without = open_log(tmp_path, "a"), open_log(tmp_path, "b")
    run_items(with_usage, _items(5), _model)
    run_items(without, _items(5), lambda item, ctx: {"out": item["v"] * 2})
    assert results_fp(with_usage) == results_fp(without)


def test_no_usage_reads_as_empty(tmp_path: Path) -> None:
    log = open_log(tmp_path, "e")
    assert log.usage() == empty_usage()  # no log yet
    run_items(log, _items(3), lambda item, ctx: {"out": 1})
    assert log.usage() == empty_usage()
    assert status_of(log)["usage"] == empty_usage()
    assert log.budget() == {"budget_usd": None, "budget_tokens": None}


def test_failed_and_transient_attempts_count_apart_and_item_usage_lists_them(tmp_path: Path) -> None:
    class Flaky(Exception):
        pass

    def proc(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        ctx.record_usage(model="m1", input_tokens=10, output_tokens=1, cost_usd=0.001 * ctx.attempt)
        if item["id"] == "i1" and ctx.attempt == 1:
            raise Flaky("429")
        if item["id"] == "i2":
            raise ValueError("bad answer")  # not retried: fails with its usage
        return {"ok": True}

    log = open_log(tmp_path, "e")
    report = run_items(log, _items(3), proc, retry=RetryPolicy(attempts=3, retry_on=(Flaky,), backoff=0.0))
    assert report.failed == ["i2"]
    usage = log.usage()
    assert usage["calls"] == 4  # i0, i1 twice, i2
    assert usage["cost_usd"] == pytest.approx(0.001 + 0.001 + 0.002 + 0.001)
    assert usage["failed_attempts_cost_usd"] == pytest.approx(0.001 + 0.001)
    i1 = log.item_usage("i1")
    assert i1["calls"] == 2
    assert i1["failed_attempts_cost_usd"] == pytest.approx(0.001)
    assert [(a["attempt"], a["status"], a["cost_usd"]) for a in i1["attempts"]] == [
        (1, "transient", 0.001),
        (2, "completed", 0.002),
    ]
    assert all(set(a) >= ITEM_KEYS for a in i1["attempts"])
    i2 = log.item_usage("i2")
    assert [(a["attempt"], a["status"], a["step"], a["model"]) for a in i2["attempts"]] == [
        (1, "failed", "process", "m1")
    ]
    # the failure lens still reads the FAILED row's attempt record
    assert [f.error_type for f in log.failures("i2")] == ["ValueError"]


def test_failed_usage_without_a_retry_policy_on_the_fast_path(tmp_path: Path) -> None:
    def proc(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        ctx.record_usage(model="m1", input_tokens=7, output_tokens=3, cost_usd=0.5)
        raise RuntimeError("model said no")

    log = open_log(tmp_path, "e")
    report = run_items(log, _items(2), proc)
    assert len(report.failed) == 2
    usage = log.usage()
    assert usage["cost_usd"] == 1.0
    assert usage["failed_attempts_cost_usd"] == 1.0
    assert log.item_usage("i0")["attempts"][0]["status"] == "failed"
    # the rerun fails again and its attempt counts too (money was spent again)
    run_items(log, _items(2), proc)
    assert log.usage()["cost_usd"] == 2.0
    assert [a["attempt"] for a in log.item_usage("i0")["attempts"]] == [1, 2]


def test_steps_and_a_fanout_reduce_record_usage_in_their_own_rows(tmp_path: Path) -> None:
    def first(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        ctx.record_usage(model="m1", input_tokens=1, output_tokens=1, cost_usd=0.25)
        return {"a": 1}

    def second(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        ctx.record_usage(model="m2", input_tokens=2, output_tokens=2, cost_usd=0.5)
        return {"b": 2}

    log = open_log(tmp_path, "e")
    run_items(log, _items(3), Sequence("both", [Step("first", first), Step("second", second)]))
    usage = log.usage()
    assert usage["cost_usd"] == 2.25
    assert set(usage["by_model"]) == {"m1", "m2"}
    assert [(a["step"], a["model"]) for a in log.item_usage("i0")["attempts"]] == [("first", "m1"), ("second", "m2")]


def test_a_batch_landing_twice_is_counted_once(tmp_path: Path) -> None:
    log = open_log(tmp_path, "e")
    run_items(log, _items(4), _model)
    before = log.usage()
    rows = log.scan(NON_BLOB_COLUMNS)  # no value is blob-stored here
    again = rows.append_column(EVENT_SCHEMA.field("value_blob"), pa.nulls(rows.num_rows, pa.large_binary()))
    log.append(again.select(EVENT_SCHEMA.names).cast(EVENT_SCHEMA))  # every row again: a batch landing twice
    assert log.stats()["events"] == 2 * rows.num_rows
    assert log.usage() == before  # this object read the copies as new rows since its last read
    assert open_log(tmp_path, "e").usage() == before  # a fresh one reads every row at once
    assert log.item_usage("i0")["calls"] == 3


def test_a_remembered_read_adds_only_what_was_committed_since(tmp_path: Path) -> None:
    log = open_log(tmp_path, "e")
    run_items(log, _items(3), _model)
    assert log.usage()["calls"] == 9
    memo = log.usage_memo
    assert memo is not None and memo.version == log.version
    run_items(log, _items(5), _model, epoch=2)  # two more items
    assert log.usage() == open_log(tmp_path, "e").usage()
    assert log.usage()["calls"] == 15
    assert log.usage_spend(exclude_writer=("w1", 2)) == (30_000_000, 336)  # the first run's 3 items


def test_record_usage_refuses_bad_arguments_as_the_items_error(tmp_path: Path) -> None:
    def proc(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        ctx.record_usage(model="m", input_tokens=-5)
        return {}

    log = open_log(tmp_path, "e")
    report = run_items(log, _items(1), proc)
    assert report.failed == ["i0"]
    assert "input_tokens=-5 is not an int >= 0" in report.errors["i0"]
    assert log.usage() == empty_usage()
    with pytest.raises(ConfigurationError, match="budget_usd=0 is not a positive number"):
        run_items(log, _items(1), proc, budget_usd=0)
    with pytest.raises(ConfigurationError, match=r"budget_tokens=1\.5 is not a positive int"):
        run_items(log, _items(1), proc, budget_tokens=1.5)


def test_the_canonical_value_of_a_usage_row_is_what_the_fold_reads(tmp_path: Path) -> None:
    log = open_log(tmp_path, "e")
    run_items(log, _items(1), _model)
    row = next(ev for ev in log.events("i0") if ev.event_type is EventType.STEP_COMPLETED)
    assert row.value_json == canonical_json(json.loads(row.value_json))
