"""Usage recorded through ctx by an ``async def`` process: stored like a sync process's, on every path.

The async driver (core/runner/aio.py) ends an attempt through the same staging as the sync paths
(``Runner.finish_leaf``/``fail_leaf``, attempts.py's transient rows), so totals and rows are equal.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import pytest

from airflow_provider_datagen.core import RetryPolicy, run_items
from tests._support.engine import open_log, results_fp

if TYPE_CHECKING:
    from pathlib import Path


class Flaky(Exception):
    pass


def _items(n: int) -> list[dict[str, Any]]:
    return [{"id": f"i{k}", "v": k} for k in range(n)]


def _record(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
    ctx.record_usage(model="m1", input_tokens=10 + item["v"], output_tokens=2, cost_usd=0.001 * ctx.attempt)
    if item["v"] % 5 == 1 and ctx.attempt == 1:
        raise Flaky("429 on the first attempt")
    if item["v"] % 7 == 3:
        raise ValueError("the answer did not parse")  # not retried: the item fails with its usage
    return {"out": item["v"] * 2}


async def _record_async(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
    await asyncio.sleep(0.001 * (item["v"] % 3))  # completion order differs from source order
    return _record(item, ctx)


POLICY = RetryPolicy(attempts=3, retry_on=(Flaky,), backoff=0.0)


@pytest.mark.parametrize("concurrency", [1, 16])
def test_an_async_process_records_the_same_usage_as_a_sync_one(tmp_path: Path, concurrency: int) -> None:
    sync_log, async_log = open_log(tmp_path, "sync"), open_log(tmp_path, "async")
    items = _items(40)
    sync_report = run_items(sync_log, items, _record, retry=POLICY)
    async_report = run_items(async_log, items, _record_async, retry=POLICY, concurrency=concurrency)
    assert sorted(async_report.failed) == sorted(sync_report.failed) == sorted(f"i{v}" for v in (3, 10, 17, 24, 31, 38))
    usage = async_log.usage()
    assert usage == sync_log.usage()
    # 40 first attempts, plus a second one for each of the 8 items with v % 5 == 1
    assert usage["calls"] == 48
    assert usage["input_tokens"] == sum(10 + v for v in range(40)) + sum(10 + v for v in range(40) if v % 5 == 1)
    # the failed items' attempts and the transient first attempts are counted apart
    # (i31 fails its first attempt transiently, then its second for good, at 0.002)
    failed_cost = 0.001 * 8 + 0.001 * 5 + 0.002
    assert usage["failed_attempts_cost_usd"] == pytest.approx(failed_cost)
    assert [(a["attempt"], a["status"]) for a in async_log.item_usage("i1")["attempts"]] == [
        (1, "transient"),
        (2, "completed"),
    ]
    assert [(a["attempt"], a["status"]) for a in async_log.item_usage("i3")["attempts"]] == [(1, "failed")]
    assert results_fp(async_log) == results_fp(sync_log)


def test_an_async_process_without_a_policy_stores_a_failed_attempts_usage(tmp_path: Path) -> None:
    async def proc(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        ctx.record_usage(model="m1", input_tokens=5, output_tokens=1, cost_usd=0.25)
        if item["v"] == 1:
            raise RuntimeError("model said no")
        return {"ok": True}

    log = open_log(tmp_path, "e")
    report = run_items(log, _items(3), proc, concurrency=3)
    assert report.failed == ["i1"]
    usage = log.usage()
    assert usage["calls"] == 3
    assert usage["cost_usd"] == pytest.approx(0.75)
    assert usage["failed_attempts_cost_usd"] == pytest.approx(0.25)
    assert [(a["status"], a["cost_usd"]) for a in log.item_usage("i1")["attempts"]] == [("failed", 0.25)]
