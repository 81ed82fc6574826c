"""Async processes (issue 16): ``async def`` wherever a process or step function goes.

Each run is compared with a sequential run of the same logic as a sync function: the event ids (item,
sequence, id), the export fingerprint and the failure lens must be the same. Latencies are seeded per
item, so items finish out of order; nothing here is timed except the Retry-After floor (a lower bound).
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import pytest

from airflow_provider_datagen.core import ItemStatus, MapReduce, RetryPolicy, Sequence, Step, run_items
from airflow_provider_datagen.core.steps import Conditional, is_async
from airflow_provider_datagen.exceptions import InvalidPipelineError, ItemFailedError, ProcessContractError
from tests._support.engine import flat_output, make_items, open_log, raw_events, results_fp, statuses


def _latency(item_id: str, top: float = 0.004) -> float:
    return random.Random(f"latency-{item_id}").uniform(0.0, top)


def _event_ids(log: Any) -> list[tuple[str, int, str]]:
    events = raw_events(log, ["item_id", "item_seq", "event_id"])
    return sorted(zip(*(events[c].to_pylist() for c in ("item_id", "item_seq", "event_id"))))


def _failures(log: Any) -> list[tuple[str, str, bool, int | None]]:
    return sorted((r.item_id, r.error_type, r.transient, r.attempt) for r in log.failures())


def sync_process(item: dict[str, Any], ctx: Any) -> dict[str, Any] | None:
    if item["id"] % 11 == 3:
        raise ValueError(f"cannot handle {item['id']}")
    if item["id"] % 7 == 5:
        ctx.filter({"why": "sevens"})
        return None
    ctx.append("trail", ctx.item_id)
    return flat_output(item)


class Flight:
    """Counts the calls in flight at once (all on one loop: no lock needed)."""

    def __init__(self) -> None:
        self.now = 0
        self.most = 0


def async_process(flight: Flight, top: float = 0.004) -> Any:
    async def process(item: dict[str, Any], ctx: Any) -> dict[str, Any] | None:
        flight.now += 1
        flight.most = max(flight.most, flight.now)
        try:
            await asyncio.sleep(_latency(ctx.item_id, top))
        finally:
            flight.now -= 1
        return sync_process(item, ctx)

    return process


@pytest.mark.parametrize("concurrency", [1, 8, 256])
def test_an_async_process_equals_a_sequential_run(tmp_path: Any, concurrency: int) -> None:
    items = make_items(300)
    seq = open_log(tmp_path, "seq")
    run_items(seq, items, sync_process)
    flight = Flight()
    aio = open_log(tmp_path, "aio")
    report = run_items(aio, items, async_process(flight), concurrency=concurrency)
    assert _event_ids(aio) == _event_ids(seq)
    assert results_fp(aio) == results_fp(seq)
    assert statuses(aio) == statuses(seq)
    assert _failures(aio) == _failures(seq)
    assert report.invocations == 300 and len(report.failed) == len([i for i in items if i["id"] % 11 == 3])
    # the semaphore: never more than `concurrency` calls in flight, and really that many at once
    assert flight.most == min(concurrency, 300)


def test_an_object_with_an_async_call_is_an_async_process(tmp_path: Any) -> None:
    class Model:
        def __init__(self) -> None:
            self.calls = 0

        async def __call__(self, item: dict[str, Any], ctx: Any) -> dict[str, Any]:
            self.calls += 1
            await asyncio.sleep(0)
            return flat_output(item)

    model = Model()
    assert is_async(model) and is_async(async_process(Flight())) and not is_async(sync_process)
    log = open_log(tmp_path, "obj")
    run_items(log, make_items(20), model, concurrency=4)
    assert model.calls == 20
    assert set(statuses(log).values()) == {ItemStatus.COMPLETED.value}


def test_replayed_failed_and_edited_items_go_through_the_async_driver(tmp_path: Any) -> None:
    items = make_items(40)
    seq, aio = open_log(tmp_path, "seq"), open_log(tmp_path, "aio")
    run_items(seq, items, sync_process)
    run_items(aio, items, async_process(Flight()), concurrency=8)
    # the rerun retries the failed items; an edited source restarts some items
    edited = [dict(i, text=f"edited-{i['id']}") if i["id"] % 5 == 0 else i for i in items]

    def fixed(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        return flat_output(item)

    async def fixed_async(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        await asyncio.sleep(_latency(ctx.item_id))
        return flat_output(item)

    seq_report = run_items(seq, edited, fixed, epoch=2)
    aio_report = run_items(aio, edited, fixed_async, epoch=2, concurrency=8)
    assert sorted(aio_report.processed) == sorted(seq_report.processed) and aio_report.processed
    assert _event_ids(aio) == _event_ids(seq)
    assert results_fp(aio) == results_fp(seq)


def test_async_steps_in_a_pipeline_equal_sync_steps(tmp_path: Any) -> None:
    def build(asynchronous: bool) -> Sequence:
        def first(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
            return {"n": len(item["text"])}

        def over(item: dict[str, Any], ctx: Any) -> list[dict[str, Any]]:
            return [{"k": k} for k in range(item["id"] % 3 + 1)]

        def child(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
            return {"sq": item["k"] * item["k"]}

        async def child_async(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
            await asyncio.sleep(_latency(ctx.item_id))
            return child(item, ctx)

        def last(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
            ctx.set("seen", ctx.fields["n"])
            return {"total": sum(r["sq"] for r in ctx.fields["results"])}

        async def last_async(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
            await asyncio.sleep(_latency(ctx.item_id))
            return last(item, ctx)

        return Sequence(
            "p",
            [
                Step("first", first),
                MapReduce("fan", over=over, map=Step("child", child_async if asynchronous else child)),
                Step("last", last_async if asynchronous else last),
            ],
        )

    items = make_items(30)
    seq = open_log(tmp_path, "seq")
    run_items(seq, items, build(False))
    for concurrency in (1, 4):
        aio = open_log(tmp_path, f"aio{concurrency}")
        run_items(aio, items, build(True), concurrency=concurrency)
        assert _event_ids(aio) == _event_ids(seq)
        assert results_fp(aio) == results_fp(seq)


def test_selectors_and_fanout_callables_must_stay_sync() -> None:
    async def pred(item: dict[str, Any], ctx: Any) -> bool:
        return True

    with pytest.raises(InvalidPipelineError, match=r"Conditional 'c': predicate is async; selectors, fan-out"):
        Conditional("c", pred, Step("s", sync_process))


def _flaky_async(fail_first: int, calls: dict[str, list[int]], error: Any = TimeoutError) -> Any:
    async def process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        calls.setdefault(ctx.item_id, []).append(ctx.attempt)
        await asyncio.sleep(_latency(ctx.item_id, 0.002))
        if ctx.attempt <= fail_first:
            raise error(f"attempt {ctx.attempt} of {ctx.item_id}")
        return {"out": item["text"].upper(), "attempt": ctx.attempt}

    return process


def _policy(waits: list[float], **kw: Any) -> RetryPolicy:
    kw.setdefault("attempts", 5)
    kw.setdefault("retry_on", (TimeoutError,))
    kw.setdefault("backoff", 2.0)
    kw.setdefault("jitter", False)
    return RetryPolicy(sleep=waits.append, **kw)


def test_async_retry_twice_then_success_completes_in_one_run(tmp_path: Any) -> None:
    waits: list[float] = []
    calls: dict[str, list[int]] = {}
    log = open_log(tmp_path, "retry")
    report = run_items(log, make_items(6), _flaky_async(2, calls), retry=_policy(waits), concurrency=4)
    assert report.failed == [] and len(report.processed) == 6
    assert all(a == [1, 2, 3] for a in calls.values())
    assert sorted(waits) == sorted([2.0, 4.0] * 6)
    assert set(statuses(log).values()) == {ItemStatus.COMPLETED.value}
    item = sorted(calls)[0]
    assert [(r.error_type, r.transient, r.attempt, r.wait) for r in log.failures(item)] == [
        ("TimeoutError", True, 1, 2.0),
        ("TimeoutError", True, 2, 4.0),
    ]
    assert log.item_states([item])[item].fields["attempt"] == 3
    # the same rows and results as the sync retried path
    sync_log = open_log(tmp_path, "sync")

    def flaky_sync(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        if ctx.attempt <= 2:
            raise TimeoutError(f"attempt {ctx.attempt} of {ctx.item_id}")
        return {"out": item["text"].upper(), "attempt": ctx.attempt}

    run_items(sync_log, make_items(6), flaky_sync, retry=_policy([]))
    assert _event_ids(log) == _event_ids(sync_log) and results_fp(log) == results_fp(sync_log)


def test_async_non_retryable_error_fails_at_once(tmp_path: Any) -> None:
    waits: list[float] = []
    calls: dict[str, list[int]] = {}
    log = open_log(tmp_path, "fatal")
    report = run_items(log, make_items(3), _flaky_async(1, calls, KeyError), retry=_policy(waits), concurrency=3)
    assert sorted(report.failed) == sorted(calls) and waits == []
    assert all(a == [1] for a in calls.values())
    assert [(r.error_type, r.transient, r.attempt) for r in log.failures()] == [("KeyError", False, 1)] * 3


def test_async_retry_after_is_honoured_with_a_real_wait(tmp_path: Any) -> None:
    class RateLimited(Exception):
        def __init__(self) -> None:
            super().__init__("429 Too Many Requests")
            self.response = type("Response", (), {"headers": {"Retry-After": "0.3"}})()

    seen: list[float] = []

    async def process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        seen.append(time.monotonic())
        if ctx.attempt == 1:
            raise RateLimited
        return {"ok": True}

    log = open_log(tmp_path, "after")
    policy = RetryPolicy(attempts=3, retry_on=(RateLimited,), backoff=0.01, max_backoff=5.0, jitter=True)
    report = run_items(log, make_items(1), process, retry=policy)
    assert report.failed == [] and len(seen) == 2
    assert seen[1] - seen[0] >= 0.3  # the real asyncio wait was at least the header's
    (record,) = log.failures()
    assert record.transient and record.wait is not None and record.wait >= 0.3


def test_async_contract_errors_stop_the_run_after_three_in_a_row(tmp_path: Any) -> None:
    calls: list[str] = []

    async def bad(item: dict[str, Any], ctx: Any) -> Any:
        calls.append(ctx.item_id)
        return ["not", "a", "dict"]

    log = open_log(tmp_path, "contract")
    with pytest.raises(ProcessContractError, match=r"broke the process contract on 3 consecutive items"):
        run_items(log, make_items(50), bad, concurrency=1)
    assert len(calls) == 3
    assert [r.error_type for r in log.failures()] == ["ProcessError"] * 3
    # with items in flight, those already running are acknowledged before it raises
    log2 = open_log(tmp_path, "contract4")
    calls.clear()
    with pytest.raises(ProcessContractError):
        run_items(log2, make_items(50), bad, concurrency=4)
    assert 3 <= len(calls) <= 6 and len(log2.failures()) == len(calls)


def test_a_coroutine_from_a_sync_function_is_a_contract_error_that_says_so(tmp_path: Any) -> None:
    async def inner(item: dict[str, Any]) -> dict[str, Any]:
        return {}

    log = open_log(tmp_path, "coro")
    report = run_items(log, make_items(1), lambda item, ctx: inner(item))
    assert "returned a coroutine" in next(iter(report.errors.values()))


def test_fail_fast_acknowledges_what_is_in_flight_then_raises(tmp_path: Any) -> None:
    started: list[int] = []

    async def process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        started.append(item["id"])
        await asyncio.sleep(0.001 * (item["id"] % 4))
        if item["id"] == 2:
            raise ValueError("boom")
        return {"ok": item["id"]}

    log = open_log(tmp_path, "ff")
    with pytest.raises(ItemFailedError, match=r"fail_fast=True stopped the run"):
        run_items(log, make_items(100), process, fail_fast=True, concurrency=8)
    sts = statuses(log)
    acked = {iid for iid, s in sts.items() if s != ItemStatus.RUNNING.value}
    assert len(started) < 100
    # every started item was acknowledged (in flight ones finish), the failed one is failed
    assert {str(i) for i in started} - acked <= {"2"} and len(log.failures()) == 1


def test_the_budget_hook_stops_starting_new_items(tmp_path: Any) -> None:
    from airflow_provider_datagen.core.runner import run as run_module

    calls: list[str] = []

    async def process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        calls.append(ctx.item_id)
        await asyncio.sleep(0.001)
        return {"ok": True}

    # the usage ledger sets RunShared.stop_pulling from a budget; here a budget of 10 started items
    original = run_module.RunShared
    asked = {"n": 0}

    def budget() -> bool:  # asked once before each new root item
        asked["n"] += 1
        return asked["n"] > 10

    def with_budget(**kw: Any) -> Any:
        shared = original(**kw)
        shared.stop_pulling = budget
        return shared

    log = open_log(tmp_path, "budget")
    run_module.RunShared = with_budget  # type: ignore[misc,assignment]
    try:
        report = run_items(log, make_items(50), process, concurrency=4)
    finally:
        run_module.RunShared = original  # type: ignore[misc]
    assert len(calls) == 10 and len(report.processed) == 10
    sts = statuses(log)
    assert sum(s == ItemStatus.COMPLETED.value for s in sts.values()) == 10
    # the rest stays pending for the next run, which does it
    report = run_items(log, make_items(50), process, concurrency=4, epoch=2)
    assert len(report.processed) == 40 and len(calls) == 50


def test_async_steps_in_a_pipeline_retry_in_place_and_the_loop_thread_ends_with_the_run(tmp_path: Any) -> None:
    import threading

    calls: list[tuple[str, int]] = []

    def first(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        return {"a": item["id"]}

    async def second(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        calls.append((ctx.item_id, ctx.attempt))
        await asyncio.sleep(0)
        if ctx.attempt < 3:
            raise TimeoutError(f"attempt {ctx.attempt}")
        return {"b": ctx.fields["a"] + 1}

    pipeline = Sequence("p", [Step("first", first), Step("second", second)])
    waits: list[float] = []
    log = open_log(tmp_path, "steps-retry")
    report = run_items(log, make_items(4), pipeline, retry=_policy(waits), concurrency=2)
    assert report.failed == [] and sorted(waits) == sorted([2.0, 4.0] * 4)
    assert sorted(calls) == sorted((str(i), a) for i in range(4) for a in (1, 2, 3))
    assert [(r.step, r.transient, r.attempt) for r in log.failures("0")] == [("second", True, 1), ("second", True, 2)]
    assert log.item_states(["0"])["0"].fields == {"a": 0, "b": 1}
    assert not [t for t in threading.enumerate() if t.name == "datagen-steps-loop"]


def test_called_from_inside_a_running_loop_the_run_uses_a_loop_of_its_own(tmp_path: Any) -> None:
    """As in a notebook: run_items is sync, so the caller's loop waits while a helper thread runs the items."""
    items = make_items(30)
    seq = open_log(tmp_path, "seq")
    run_items(seq, items, sync_process)
    aio = open_log(tmp_path, "nested")

    async def notebook_cell() -> Any:
        return run_items(aio, items, async_process(Flight()), concurrency=8)

    report = asyncio.run(notebook_cell())
    assert report.invocations == 30
    assert _event_ids(aio) == _event_ids(seq) and results_fp(aio) == results_fp(seq)


def test_what_counts_as_async() -> None:
    import functools

    async def fn(item: dict[str, Any], ctx: Any, extra: int = 0) -> None:
        return None

    class Client:
        async def answer(self, item: dict[str, Any], ctx: Any) -> None:
            return None

        def __call__(self, item: dict[str, Any], ctx: Any) -> None:  # a sync __call__ beside an async method
            return None

    class Inherits(Client):
        pass

    assert is_async(fn) and is_async(functools.partial(fn, extra=1)) and is_async(Client().answer)
    assert not is_async(Client()) and not is_async(Inherits()) and not is_async(len)
    assert Step("s", functools.partial(fn, extra=2)).is_async and not Step("t", Client()).is_async
