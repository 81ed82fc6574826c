"""The budget's bound holds in every driver, and a budget stop leaves no item running (issue 24, points 8, 10).

Point 8: at ``concurrency=16`` the threaded driver started items after the budget was reached (the items
queued before the main thread's check). The worker that would start an item now checks the budget as
the run last saw it, right before the call. Point 10: the runner pulled items into the inbox in groups,
so after a budget stop the pulled items it never started read as ``running``; with a budget each
item's ITEM_CREATED is staged as the item starts.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from airflow_provider_datagen.core import run_items, status_of
from airflow_provider_datagen.core.ledger.budget import RunUsage
from tests._support.engine import make_items, open_log

FIRST_ROUND = 16
BUDGET_TOKENS = 1000


class FirstRound:
    """Items 0..15 start together; item 0 alone reaches the budget, the others return only after the run saw it.

    ``seen`` is set once the run's tally (``RunUsage.add``, in the thread that staged the usage) has
    reached the budget; every call records whether it started after that. While item 0 finishes, every
    other thread is inside a call, so no thread is between its budget check and its call: a start
    after ``seen`` is an item started after the run had seen the budget reached.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.seen = threading.Event()
        self.others_started = threading.Event()
        self.lock = threading.Lock()
        self.others = 0
        self.starts: list[tuple[str, bool]] = []
        add = RunUsage.add

        def spy(meter: RunUsage, records: Any) -> None:
            add(meter, records)
            if meter.tokens >= BUDGET_TOKENS:
                self.seen.set()

        monkeypatch.setattr(RunUsage, "add", spy)

    def start(self, ctx: Any) -> bool:
        """Record the call; whether it is item 0."""
        with self.lock:
            self.starts.append((ctx.item_id, self.seen.is_set()))
            if ctx.item_id == "0":
                return True
            self.others += 1
            if self.others == FIRST_ROUND - 1:
                self.others_started.set()
        return False

    @property
    def after(self) -> list[str]:
        return [iid for iid, late in self.starts if late]


def _sync_process(first: FirstRound) -> Any:
    def process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        if first.start(ctx):
            assert first.others_started.wait(30)
            ctx.record_usage(model="m", input_tokens=BUDGET_TOKENS, output_tokens=0)
        else:
            assert first.seen.wait(30)
            ctx.record_usage(model="m", input_tokens=1, output_tokens=0)
        return {"ok": True}

    return process


def _async_process(first: FirstRound) -> Any:
    async def process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        event = first.others_started if first.start(ctx) else first.seen
        while not event.is_set():  # the loop's one thread: yield until the others have moved
            await asyncio.sleep(0)
        tokens = BUDGET_TOKENS if ctx.item_id == "0" else 1
        ctx.record_usage(model="m", input_tokens=tokens, output_tokens=0)
        return {"ok": True}

    return process


@pytest.mark.parametrize("kind", ["threads", "async"])
def test_no_item_starts_after_the_run_has_seen_the_budget_reached(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    first = FirstRound(monkeypatch)
    process = _sync_process(first) if kind == "threads" else _async_process(first)
    log = open_log(tmp_path, kind)
    report = run_items(log, make_items(300), process, concurrency=FIRST_ROUND, budget_tokens=BUDGET_TOKENS)
    assert report.stopped_by_budget
    assert first.after == []  # before: the threads started the 16 items queued behind the first round
    assert sorted(iid for iid, _ in first.starts) == sorted(str(i) for i in range(FIRST_ROUND))
    assert sorted(report.processed, key=int) == [str(i) for i in range(FIRST_ROUND)]


class Paid:
    """Each call records $0.01; counts its calls (the invocation counter)."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        with self.lock:
            self.calls.append(ctx.item_id)
        ctx.record_usage(model="m", input_tokens=10, output_tokens=1, cost_usd=0.01)
        return {"n": item["id"]}


def _async_paid(paid: Paid) -> Any:
    async def process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        await asyncio.sleep(0)
        return paid(item, ctx)

    return process


@pytest.mark.parametrize(
    ("kind", "concurrency", "every"),
    [("sync", 1, None), ("sync", 1, 3), ("threads", 4, None), ("threads", 4, 1), ("async", 4, None)],
)
def test_a_budget_stop_leaves_no_item_running_and_the_rest_never_started(
    tmp_path: Any, kind: str, concurrency: int, every: int | None
) -> None:
    paid = Paid()
    process = _async_paid(paid) if kind == "async" else paid
    log = open_log(tmp_path, kind)
    items = make_items(300)
    report = run_items(log, items, process, concurrency=concurrency, budget_usd=0.5, checkpoint_every=every)
    assert report.stopped_by_budget
    called = len(paid.calls)
    assert len(set(paid.calls)) == called and report.invocations == called
    if kind == "sync":
        assert called == 50  # checked before each item: the 50th reached $0.50
    summary = status_of(log, items)
    # before: the items pulled into the inbox with the last group and never started read as running
    assert (summary["running"], summary["completed"], summary["never_started"]) == (0, called, 300 - called)
    assert log.summary()["running"] == 0
    # raised, the budget lets the rest run: every item exactly once over both runs
    again = Paid()
    more = run_items(log, items, again, epoch=2, budget_usd=10.0)
    assert not more.stopped_by_budget
    assert sorted(paid.calls + again.calls, key=int) == [str(i) for i in range(300)]


@pytest.mark.parametrize("kind", ["threads", "async"])
def test_an_item_that_waited_for_the_rate_limit_does_not_start_once_the_budget_is_reached(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """Point 8 with a rate limit: the slot is waited for before the budget check, not after it.

    The first slot goes to item 0, which alone reaches the budget; every other wait for a slot ends
    only once the run has seen that (threads) or item 0's call has returned (async: the driver, which
    takes the slots, settles it after the wait). Before, those threads had passed the budget check
    already (the wait was inside the call) and started their items anyway.
    """
    from airflow_provider_datagen.core import RateLimit
    from airflow_provider_datagen.core.runner import run as run_module

    seen = threading.Event()
    returned = threading.Event()
    add = RunUsage.add

    def spy(meter: RunUsage, records: Any) -> None:
        add(meter, records)
        if meter.tokens >= BUDGET_TOKENS:
            seen.set()

    monkeypatch.setattr(RunUsage, "add", spy)
    opened = run_module.open_limiter
    slots = {"n": 0}
    lock = threading.Lock()

    def open_waiting(*args: Any, **kwargs: Any) -> Any:
        limiter = opened(*args, **kwargs)
        acquire = limiter.acquire

        def waiting_acquire(*a: Any, **kw: Any) -> Any:
            with lock:
                slots["n"] += 1
                first = slots["n"] == 1
            if not first:
                assert seen.wait(30)
            return acquire(*a, **kw)

        acquire_async = limiter.acquire_async

        async def waiting_acquire_async(*a: Any, **kw: Any) -> Any:
            with lock:
                slots["n"] += 1
                first = slots["n"] == 1
            # the loop's one thread: the wait ends once item 0's call returned (the driver settles
            # it, and so sees the budget reached, after the wait)
            while not first and not returned.is_set():
                await asyncio.sleep(0.001)
            if not first:
                await asyncio.sleep(0.05)
            return await acquire_async(*a, **kw)

        limiter.acquire = waiting_acquire
        limiter.acquire_async = waiting_acquire_async
        return limiter

    monkeypatch.setattr(run_module, "open_limiter", open_waiting)
    calls: list[str] = []

    def record(ctx: Any) -> dict[str, Any]:
        calls.append(ctx.item_id)
        ctx.record_usage(model="m", input_tokens=BUDGET_TOKENS, output_tokens=0)
        returned.set()
        return {"ok": True}

    def sync_process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        return record(ctx)

    async def async_process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        return record(ctx)

    process = sync_process if kind == "threads" else async_process
    log = open_log(tmp_path, "limited")
    items = make_items(100)
    report = run_items(
        log,
        items,
        process,
        concurrency=8,
        budget_tokens=BUDGET_TOKENS,
        rate_limit=RateLimit(100_000, key="budget-and-limit"),
    )
    assert report.stopped_by_budget
    assert calls == ["0"]  # before: the 7 items waiting for a slot started after it
    summary = status_of(log, items)
    assert (summary["completed"], summary["running"], summary["never_started"]) == (1, 0, 99)


def test_a_rate_limit_wait_that_raises_in_a_worker_fails_its_item_and_the_run_ends(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker thread's slot wait (a budget and a rate limit) is inside its item's guard.

    Before, an error there (the limiter's shared storage gone, say) killed the worker thread outside
    the item's try: the main thread waited for that item forever and the run hung.
    """
    from airflow_provider_datagen.core import RateLimit
    from airflow_provider_datagen.core.runner import run as run_module

    opened = run_module.open_limiter
    calls = {"n": 0}
    lock = threading.Lock()

    class StorageGone(ConnectionError):
        pass

    def open_failing(*args: Any, **kwargs: Any) -> Any:
        limiter = opened(*args, **kwargs)
        acquire = limiter.acquire

        def failing_acquire(*a: Any, **kw: Any) -> Any:
            with lock:
                calls["n"] += 1
                n = calls["n"]
            if n == 3:
                raise StorageGone("the rate limit's storage is unreachable")
            return acquire(*a, **kw)

        limiter.acquire = failing_acquire
        return limiter

    monkeypatch.setattr(run_module, "open_limiter", open_failing)

    def process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        ctx.record_usage("test:model", input_tokens=1, output_tokens=1, cost_usd=0.0)
        return {"out": item["id"]}

    log = open_log(tmp_path, "slot-error")
    report = run_items(
        log,
        make_items(12),
        process,
        concurrency=4,
        budget_tokens=10**9,
        rate_limit=RateLimit(key="slot-error", requests_per_minute=10**6),
        max_repeated_failures=None,
    )
    assert len(report.failed) == 1 and len(report.processed) == 11
    (failed,) = report.failed
    (row,) = log.failures(failed)
    assert (row.error_type, row.message) == ("StorageGone", "the rate limit's storage is unreachable")
    summary = status_of(log, make_items(12))
    assert (summary["completed"], summary["failed_items"]) == (11, 1)
