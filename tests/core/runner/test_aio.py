"""The async driver leaves no slot idle (issue 26): an item's successor starts as soon as its call returns.

Each slot is a worker coroutine that acknowledges its item and starts the next one in the step of the
loop where the call returned. The fakes below are deterministic: a call returns after a fixed number of
turns of the loop, and schedules a marker callback (``loop.call_soon``) just before it returns. A
driver that needs another coroutine to wake before the next item starts (the done-callback and wake-up
of a task per item) lets that marker run first; a worker that goes straight on does not. No timing.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
from typing import Any

import pytest

from airflow_provider_datagen.core import RetryPolicy, run_items
from airflow_provider_datagen.core.runner.driver import Runner
from tests._support.engine import flat_output, make_items, open_log, statuses


def _recording(monkeypatch: pytest.MonkeyPatch, events: list[tuple[str, str]]) -> None:
    """Record each acknowledgement (finish_leaf, fail_leaf) in ``events``, in the order they are staged."""
    finish, fail = Runner.finish_leaf, Runner.fail_leaf

    def finish_leaf(self: Runner, item: Any, ctx: Any, result: Any) -> None:
        events.append(("acknowledged", item.item_id))
        finish(self, item, ctx, result)

    def fail_leaf(self: Runner, item: Any, exc: BaseException, usage: Any = None) -> None:
        events.append(("acknowledged", item.item_id))
        fail(self, item, exc, usage)

    monkeypatch.setattr(Runner, "finish_leaf", finish_leaf)
    monkeypatch.setattr(Runner, "fail_leaf", fail_leaf)


def _process(events: list[tuple[str, str]], turns: Any = lambda item: 1) -> Any:
    async def process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        events.append(("started", ctx.item_id))
        for _ in range(turns(item)):
            await asyncio.sleep(0)
        # runs at the loop's next turn: after whatever the driver does in this one
        asyncio.get_running_loop().call_soon(events.append, ("loop turned", ctx.item_id))
        events.append(("returned", ctx.item_id))
        if item["id"] % 4 == 3:
            raise ValueError(f"cannot handle {item['id']}")
        return flat_output(item)

    return process


@pytest.mark.parametrize("retry", [None, RetryPolicy(attempts=2)], ids=["plain", "guarded"])
def test_the_successor_starts_in_the_turn_its_predecessor_returned(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, retry: RetryPolicy | None
) -> None:
    """One slot: each item is acknowledged and the next one started before the loop turns again."""
    events: list[tuple[str, str]] = []
    _recording(monkeypatch, events)
    log = open_log(tmp_path, "succ")
    items = make_items(6)
    report = run_items(log, items, _process(events), concurrency=1, retry=retry)
    ids = [e[1] for e in events if e[0] == "started"]
    assert len(ids) == 6 and report.invocations == 6
    for before, after in itertools.pairwise(ids):
        turned = events.index(("loop turned", before))
        assert events.index(("returned", before)) < events.index(("acknowledged", before)) < turned
        # the successor's call began before the loop turned after its predecessor's return
        assert events.index(("started", after)) < turned
    assert sorted(statuses(log).values()).count("completed") == 5
    assert [r.item_id for r in log.failures()] == ["3"]


def test_acknowledgements_follow_the_order_the_calls_return(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Four slots, calls returning out of order: each item is acknowledged right after its own return."""
    events: list[tuple[str, str]] = []
    _recording(monkeypatch, events)
    log = open_log(tmp_path, "order")
    items = make_items(24)
    turns = lambda item: (item["id"] * 5) % 7 + 1  # noqa: E731 - a deterministic, shuffled return order
    report = run_items(log, items, _process(events, turns), concurrency=4)
    returned = [e[1] for e in events if e[0] == "returned"]
    acked = [e[1] for e in events if e[0] == "acknowledged"]
    assert acked == returned
    # the report lists items in acknowledgement order
    assert report.processed == [iid for iid in returned if int(iid) % 4 != 3]
    assert report.failed == [iid for iid in returned if int(iid) % 4 == 3]
    for iid in returned:  # nothing runs between a return and its acknowledgement
        assert events.index(("acknowledged", iid)) == events.index(("returned", iid)) + 1
    assert returned != sorted(returned, key=int)
    most, now = 0, 0
    for kind, _ in events:
        now += {"started": 1, "returned": -1}.get(kind, 0)
        most = max(most, now)
    assert most == 4  # every slot busy while items remain
    assert len(statuses(log)) == 24


def test_a_cancelled_error_raised_by_the_call_ends_the_run_as_before(tmp_path: Any) -> None:
    """A worker tells its own cancellation from a CancelledError the call raised: the latter is the item's
    failure, which (not an Exception) ends the run as it did with a task per item; the item is not completed."""

    async def process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        await asyncio.sleep(0)
        if item["id"] == 2:
            raise asyncio.CancelledError("the call gave up")
        return flat_output(item)

    log = open_log(tmp_path, "cancel")
    with pytest.raises(asyncio.CancelledError, match="the call gave up"):
        run_items(log, make_items(5), process, concurrency=2)
    assert statuses(log).get("2") != "completed"


def test_a_handler_that_returns_lets_the_slots_go_on(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A signal stops the workers from starting items until the driver ran its handler; one that returns
    (it does not end the run) has the driver open the slots again, and every item completes once."""
    events: list[tuple[str, str]] = []
    _recording(monkeypatch, events)
    handled: list[int] = []

    def handler(sig: int, frame: Any) -> None:
        handled.append(sum(1 for e in events if e[0] == "started"))

    async def process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        events.append(("started", ctx.item_id))
        if item["id"] == 3:
            os.kill(os.getpid(), signal.SIGHUP)
        for _ in range(item["id"] % 3 + 1):
            await asyncio.sleep(0)
        events.append(("returned", ctx.item_id))
        return flat_output(item)

    previous = signal.signal(signal.SIGHUP, handler)
    try:
        log = open_log(tmp_path, "sig")
        report = run_items(log, make_items(12), process, concurrency=3)
    finally:
        signal.signal(signal.SIGHUP, previous)
    assert signal.getsignal(signal.SIGHUP) is previous  # the driver restored what it took over
    assert len(handled) == 1 and handled[0] < 12  # run by the driver, mid-run
    assert sorted(report.processed, key=int) == [str(k) for k in range(12)]
    assert sorted(statuses(log).values()) == ["completed"] * 12
    started = [e[1] for e in events if e[0] == "started"]
    assert len(started) == len(set(started)) == 12
