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
