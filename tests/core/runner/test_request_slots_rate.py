"""ctx.take_request_slot: a rate-limit slot per model request, when it is sent, counted as the attempt's requests."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import pytest

from airflow_provider_datagen.core import RateLimit, RetryPolicy, run_items
from airflow_provider_datagen.core.ratelimit import open_limiter
from airflow_provider_datagen.exceptions import ProcessError
from tests._support.engine import open_log

if TYPE_CHECKING:
    from pathlib import Path


class Throttled(Exception):
    pass


def _slot_taker(requests: int, fail_first: bool = False) -> Any:
    def proc(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        for _ in range(requests):
            ctx.take_request_slot()
        if fail_first and ctx.attempt == 1:
            raise Throttled("429")  # a failed request: counted, nothing recorded
        ctx.record_usage(model="m", input_tokens=10, output_tokens=1, calls=requests, cost_usd=0.0)
        return {"ok": True}

    proc.takes_request_slots = True  # type: ignore[attr-defined]
    return proc


def _used(limit: RateLimit, root: str) -> int:
    """How many requests of ``limit`` this minute's window holds (taken one by one until refused)."""
    other = open_limiter(limit, root=root)
    try:
        free = 0
        while other.try_acquire():
            free += 1
        return limit.requests_per_minute - free
    finally:
        other.close()


def test_a_slot_per_request_and_no_slot_before_the_attempt(tmp_path: Path) -> None:
    log = open_log(tmp_path, "e")
    limit = RateLimit(requests_per_minute=20, key="slots")
    report = run_items(log, [{"id": "a"}, {"id": "b"}], _slot_taker(3), rate_limit=limit)
    assert len(report.processed) == 2
    # 3 slots each, none before the attempt, and calls=3 not charged again
    assert _used(limit, str(log.root)) == 6
    assert log.usage()["requests"] == 6
    assert log.usage()["calls"] == 6
    assert [a["requests"] for a in log.item_usage("a")["attempts"]] == [3]
    log.maintain()  # the usage projection stores the requests too
    assert open_log(tmp_path, "e").usage() == log.usage()


def test_failed_requests_count_with_their_attempt(tmp_path: Path) -> None:
    log = open_log(tmp_path, "e")
    limit = RateLimit(requests_per_minute=20, key="failed")
    retry = RetryPolicy(attempts=2, retry_on=(Throttled,), backoff=0.0)
    report = run_items(log, [{"id": "a"}], _slot_taker(2, fail_first=True), rate_limit=limit, retry=retry)
    assert report.processed == ["a"]
    assert _used(limit, str(log.root)) == 4
    usage = log.usage()
    assert (usage["requests"], usage["calls"]) == (4, 2)
    assert [(a["status"], a["requests"]) for a in log.item_usage("a")["attempts"]] == [
        ("transient", 2),
        ("completed", 2),
    ]


def test_a_failed_attempt_with_requests_and_no_usage_stores_them(tmp_path: Path) -> None:
    def proc(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        ctx.take_request_slot()
        raise RuntimeError("500 from the server")

    proc.takes_request_slots = True  # type: ignore[attr-defined]
    log = open_log(tmp_path, "e")
    report = run_items(log, [{"id": "a"}], proc)
    assert report.failed == ["a"]
    assert log.usage()["requests"] == 1
    assert log.usage()["calls"] == 0


def test_async_slots_wait_on_the_loop(tmp_path: Path) -> None:
    async def proc(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        await ctx.take_request_slot_async()
        await ctx.take_request_slot_async()
        return {"ok": True}

    proc.takes_request_slots = True  # type: ignore[attr-defined]
    log = open_log(tmp_path, "e")
    limit = RateLimit(requests_per_minute=20, key="async")
    report = run_items(log, [{"id": "a"}, {"id": "b"}, {"id": "c"}], proc, rate_limit=limit, concurrency=3)
    assert len(report.processed) == 3
    assert _used(limit, str(log.root)) == 6
    assert log.usage()["requests"] == 6


def test_other_processes_keep_one_slot_per_attempt(tmp_path: Path) -> None:
    def proc(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        ctx.record_usage(model="m", calls=2, cost_usd=0.0)
        return {"ok": True}

    log = open_log(tmp_path, "e")
    limit = RateLimit(requests_per_minute=20, key="plain")
    run_items(log, [{"id": "a"}], proc, rate_limit=limit)
    assert _used(limit, str(log.root)) == 2  # the pre-call slot and the extra call
    assert log.usage()["requests"] == 2  # no count stored: the recorded calls


@pytest.mark.parametrize("late", ["record_usage", "take_request_slot"])
def test_usage_after_the_attempt_ended_raises_naming_item_and_attempt(tmp_path: Path, late: str) -> None:
    kept: list[Any] = []

    def proc(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        kept.append(ctx)
        return {"ok": True}

    log = open_log(tmp_path, "e")
    run_items(log, [{"id": "a"}], proc)
    call = (
        (lambda c: c.record_usage(model="m", cost_usd=0.1))
        if late == "record_usage"
        else (lambda c: c.take_request_slot())
    )
    with pytest.raises(
        ProcessError, match=r"item 'a': ctx\.\w+ was called after attempt 1 ended.*before the process returns"
    ):
        call(kept[0])
    assert log.usage()["calls"] == 0


def test_a_leaked_background_thread_recording_late_raises(tmp_path: Path) -> None:
    go = threading.Event()
    errors: list[BaseException] = []
    threads: list[threading.Thread] = []

    def late(ctx: Any) -> None:
        go.wait()
        try:
            ctx.record_usage(model="m", cost_usd=0.1)
        except BaseException as exc:
            errors.append(exc)

    def proc(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        t = threading.Thread(target=late, args=(ctx,))  # leaked: the process returns before it records
        t.start()
        threads.append(t)
        return {"ok": True}

    log = open_log(tmp_path, "e")
    run_items(log, [{"id": "a"}], proc)
    go.set()
    threads[0].join()
    assert len(errors) == 1
    assert isinstance(errors[0], ProcessError)
    assert "item 'a': ctx.record_usage was called after attempt 1 ended" in str(errors[0])
