"""budget_usd/budget_tokens on run_items: stop pulling at the budget, finish what runs, continue when raised.

Each item of these runs costs exactly ``COST`` (the caller's cost), so where a run stops is exact:
a run starts no new item once what the log holds plus what it recorded reaches the budget.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import pytest

from airflow_provider_datagen.core import run_items, status_of
from airflow_provider_datagen.core.ledger import budget as budget_module
from tests._support.engine import open_log, results_fp

if TYPE_CHECKING:
    from pathlib import Path

COST = 0.01


def _items(n: int, start: int = 0) -> list[dict[str, Any]]:
    return [{"id": f"i{k:03d}", "v": k} for k in range(start, start + n)]


def _paid(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
    ctx.record_usage(model="m", input_tokens=100, output_tokens=20, cost_usd=COST)
    return {"out": item["v"] * 3}


@pytest.mark.parametrize("every", [None, 1])
def test_the_run_stops_at_the_budget_and_continues_when_it_is_raised(tmp_path: Path, every: int | None) -> None:
    items = _items(20)
    log = open_log(tmp_path, "budget")
    report = run_items(log, items, _paid, budget_usd=0.05, checkpoint_every=every)
    # the fifth item's usage reaches $0.05: no sixth item starts, nothing is failed
    assert report.stopped_by_budget
    assert len(report.processed) == 5
    assert report.failed == []
    status = status_of(log, items)
    assert status["completed"] == 5
    assert status["failed_items"] == 0
    assert status["pending"] == 15
    assert status["usage"]["cost_usd"] == pytest.approx(0.05)
    assert log.budget() == {"budget_usd": 0.05, "budget_tokens": None}
    # the same budget again: nothing starts
    again = run_items(log, items, _paid, budget_usd=0.05, checkpoint_every=every)
    assert again.stopped_by_budget
    assert again.processed == []
    assert again.invocations == 0
    # raised: the run continues exactly where it stopped, and ends as an uninterrupted run
    rest = run_items(log, items, _paid, budget_usd=1.0, checkpoint_every=every)
    assert not rest.stopped_by_budget
    assert len(rest.processed) == 15
    assert log.budget() == {"budget_usd": 1.0, "budget_tokens": None}
    whole = open_log(tmp_path, "uninterrupted")
    run_items(whole, items, _paid)
    assert results_fp(log) == results_fp(whole)
    assert log.usage() == whole.usage()  # every item paid once


def test_a_token_budget_stops_the_same_way(tmp_path: Path) -> None:
    log = open_log(tmp_path, "tokens")
    report = run_items(log, _items(10), _paid, budget_tokens=300)  # 120 tokens an item
    assert report.stopped_by_budget
    assert len(report.processed) == 3
    assert log.budget() == {"budget_usd": None, "budget_tokens": 300}


def test_a_budget_already_spent_by_an_earlier_run_starts_nothing(tmp_path: Path) -> None:
    log = open_log(tmp_path, "earlier")
    run_items(log, _items(4), _paid, writer_id="first")
    report = run_items(log, _items(4, start=4), _paid, writer_id="second", epoch=2, budget_usd=0.04)
    assert report.stopped_by_budget
    assert report.invocations == 0


def test_a_run_that_finishes_under_its_budget_is_not_stopped(tmp_path: Path) -> None:
    log = open_log(tmp_path, "under")
    report = run_items(log, _items(3), _paid, budget_usd=1.0)
    assert not report.stopped_by_budget
    assert len(report.processed) == 3


def test_threads_finish_the_items_in_flight_and_start_no_more(tmp_path: Path) -> None:
    concurrency = 4
    started = threading.Semaphore(0)

    def slow(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        started.release()
        return _paid(item, ctx)

    log = open_log(tmp_path, "threads")
    report = run_items(log, _items(40), slow, budget_usd=0.1, concurrency=concurrency)
    assert report.stopped_by_budget
    assert report.failed == []
    # every started item finished (none abandoned), and at most `concurrency` started past the budget
    assert report.invocations == len(report.processed)
    assert 10 <= len(report.processed) <= 10 + concurrency
    usage = log.usage()
    assert usage["calls"] == len(report.processed)
    assert usage["cost_usd"] <= 0.1 + concurrency * COST + 1e-9


def test_concurrent_runs_share_the_budget_through_the_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The documented bound: re-reading the log before each item (refresh 0) with each ack committed
    (checkpoint_every=1), the total spend is at most the budget plus, per run, its ``concurrency``
    items in flight and one item started on a read that another run's commit overtook."""
    monkeypatch.setattr(budget_module, "REFRESH_SECONDS", 0.0)
    runs, concurrency, budget = 3, 2, 0.2
    barrier = threading.Barrier(runs)
    reports: list[Any] = [None] * runs

    def one(k: int) -> None:
        log = open_log(tmp_path, "shared")
        barrier.wait()
        reports[k] = run_items(
            log,
            _items(30, start=100 * k),
            _paid,
            writer_id=f"task{k}",
            epoch=k + 1,
            checkpoint_every=1,
            concurrency=concurrency,
            budget_usd=budget,
        )

    threads = [threading.Thread(target=one, args=(k,)) for k in range(runs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r is not None and r.failed == [] for r in reports)
    spent = open_log(tmp_path, "shared").usage()["cost_usd"]
    assert spent >= budget - 1e-9  # 90 items were asked for: the budget stopped them, not the source
    assert any(r.stopped_by_budget for r in reports)
    assert spent <= budget + runs * (concurrency + 1) * COST + 1e-9
