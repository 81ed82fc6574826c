"""run_items(rate_limit=...): every call of a leaf step takes a start from the key's shared budget."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import pytest

from airflow_provider_datagen.core import RateLimit, RetryPolicy, run_items
from airflow_provider_datagen.core.ratelimit import open_limiter
from airflow_provider_datagen.exceptions import ConfigurationError
from tests._support.engine import open_log

if TYPE_CHECKING:
    from pathlib import Path


def _items(n: int) -> list[dict[str, Any]]:
    return [{"id": f"i{k}", "v": k} for k in range(n)]


def test_each_call_takes_a_start_from_the_budget_other_processes_see(tmp_path: Path) -> None:
    log = open_log(tmp_path, "limited")
    report = run_items(log, _items(4), lambda item, ctx: {"v": item["v"]}, rate_limit=RateLimit(10, key="k"))
    assert report.as_dict()["processed"] == 4
    # another limiter on the same root and key sees the 4 starts: 6 remain in this minute
    other = open_limiter(RateLimit(10, key="k"), root=str(log.root))
    try:
        assert not other.try_acquire(cost_requests=7)
        assert other.try_acquire(cost_requests=6)
    finally:
        other.close()
    # a key of its own has its whole budget
    fresh = open_limiter(RateLimit(10, key="other"), root=str(log.root))
    try:
        assert fresh.try_acquire(cost_requests=10)
    finally:
        fresh.close()


def test_every_attempt_counts_and_a_retry_after_cools_the_key_down(tmp_path: Path) -> None:
    class Throttled(Exception):
        retry_after = 1.0

    calls: list[str] = []

    def flaky(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        calls.append(item["id"])
        if ctx.attempt == 1:
            raise Throttled("429 Too Many Requests")
        return {"ok": True}

    log = open_log(tmp_path, "throttled")
    started = time.time()
    report = run_items(
        log,
        _items(2),
        flaky,
        retry=RetryPolicy(attempts=3, retry_on=(Throttled,), backoff=0.0, sleep=lambda s: None),
        rate_limit=RateLimit(20, key="api"),
    )
    assert report.as_dict()["processed"] == 2 and report.as_dict()["failed"] == 0
    assert len(calls) == 4  # two attempts per item
    other = open_limiter(RateLimit(20, key="api"), root=str(log.root))
    try:
        # the 429's Retry-After was shared: the key was blocked until at least a second after it came
        assert other.blocked_until() >= started + 1.0
        assert not other.try_acquire(cost_requests=17)  # 4 attempts were charged, not 2 items
        assert other.try_acquire(cost_requests=16)
    finally:
        other.close()


def test_a_malformed_rate_limit_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    log = open_log(tmp_path, "bad")
    with pytest.raises(ConfigurationError, match=r"^run_items: rate_limit"):
        run_items(log, _items(2), lambda item, ctx: None, rate_limit={"requests_per_minute": 0})
    with pytest.raises(ConfigurationError, match=r"^run_items: rate_limit=.* is not a RateLimit, a dict or None"):
        run_items(log, _items(2), lambda item, ctx: None, rate_limit=600)  # type: ignore[arg-type]
    assert not log.exists()


class _Throttled(Exception):
    """A 429 whose Retry-After is an attribute (seconds)."""

    retry_after = 2.0


def _blocked_and_charged(log: Any, key: str) -> tuple[float, int]:
    """The key's cooldown deadline, and the requests left of a budget of 20 (taken to see the charges)."""
    other = open_limiter(RateLimit(20, key=key), root=str(log.root))
    try:
        blocked = other.blocked_until()
        left = next(n for n in range(20, 0, -1) if other.try_acquire(cost_requests=n)) if not blocked else -1
        return blocked, left
    finally:
        other.close()


def test_a_rate_limit_alone_takes_the_limiters_own_hook_not_a_one_attempt_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_provider_datagen.core.runner import attempts

    def no_tenacity(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a run with a rate limit and no retry must not build a tenacity Retrying")

    monkeypatch.setattr(attempts, "failed_first", no_tenacity)
    monkeypatch.setattr(RetryPolicy, "retrying", no_tenacity)
    seen: list[int] = []

    def process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        seen.append(ctx.attempt)
        if item["v"] == 1:
            raise TimeoutError("not retried: no policy")
        return {"v": item["v"]}

    log = open_log(tmp_path, "alone")
    report = run_items(log, _items(3), process, rate_limit=RateLimit(20, key="alone"))
    assert report.as_dict()["processed"] == 2 and report.as_dict()["failed"] == 1 and seen == [1, 1, 1]
    # the failed row is that of a run without a policy: no attempt payload, not transient
    (record,) = log.failures()
    assert (record.error_type, record.transient, record.attempt) == ("TimeoutError", False, None)
    assert _blocked_and_charged(log, "alone") == (0.0, 17)  # three calls took three starts


def test_a_429_that_is_not_retried_still_cools_the_key_down(tmp_path: Path) -> None:
    def process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        raise _Throttled("429 Too Many Requests")

    log = open_log(tmp_path, "cool")
    started = time.time()
    report = run_items(log, _items(1), process, rate_limit=RateLimit(20, key="cool"))
    assert report.as_dict()["failed"] == 1
    blocked, _ = _blocked_and_charged(log, "cool")
    assert blocked >= started + 2.0
    # with a policy whose retry_on does not name it, the same
    log2 = open_log(tmp_path, "cool2")
    started = time.time()
    policy = RetryPolicy(attempts=3, retry_on=(KeyError,), sleep=lambda s: None)
    run_items(log2, _items(1), process, retry=policy, rate_limit=RateLimit(20, key="cool2"))
    assert _blocked_and_charged(log2, "cool2")[0] >= started + 2.0


def test_an_async_process_takes_its_starts_without_blocking_the_loop(tmp_path: Path) -> None:
    import asyncio

    async def process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        await asyncio.sleep(0)
        if item["v"] == 2:
            raise _Throttled("429")
        return {"v": item["v"]}

    log = open_log(tmp_path, "async")
    started = time.time()
    report = run_items(log, _items(4), process, rate_limit=RateLimit(20, key="async"), concurrency=4)
    assert report.as_dict()["processed"] == 3 and report.as_dict()["failed"] == 1
    blocked, _ = _blocked_and_charged(log, "async")
    assert blocked >= started + 2.0  # the 429 of the async call cooled the key down
    other = open_limiter(RateLimit(20, key="async"), root=str(log.root), clock=lambda: time.time() + 3.0)
    try:
        assert not other.try_acquire(cost_requests=17)  # four calls took four starts
        assert other.try_acquire(cost_requests=16)
    finally:
        other.close()
