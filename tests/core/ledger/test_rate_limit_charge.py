"""ctx.record_usage charges a run's rate limit: tokens to the token window, calls beyond the first as requests."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_provider_datagen.core import RateLimit, run_items
from airflow_provider_datagen.core.ratelimit import open_limiter
from tests._support.engine import open_log

if TYPE_CHECKING:
    from pathlib import Path


def test_recorded_tokens_and_extra_calls_are_charged_to_the_shared_limit(tmp_path: Path) -> None:
    def agent(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        # one attempt that made three model calls using 300 tokens in all
        ctx.record_usage(model="m", input_tokens=250, output_tokens=50, calls=3, cost_usd=0.0)
        return {"ok": True}

    log = open_log(tmp_path, "limited")
    limit = RateLimit(requests_per_minute=10, tokens_per_minute=1000, key="k")
    report = run_items(log, [{"id": "a"}, {"id": "b"}], agent, rate_limit=limit)
    assert len(report.processed) == 2
    other = open_limiter(limit, root=str(log.root))
    try:
        # 2 attempts took 1 request each and charged 2 more each: 6 of 10 this minute
        assert not other.try_acquire(cost_requests=5)
        assert other.try_acquire(cost_requests=4)
    finally:
        other.close()
    tokens = open_limiter(RateLimit(requests_per_minute=10, tokens_per_minute=1000, key="k"), root=str(log.root))
    try:
        # 600 tokens were charged: 500 more do not fit in the minute's 1000, 400 do
        assert tokens.try_acquire(cost_requests=1, est_tokens=500) is False
    finally:
        tokens.close()


def test_without_usage_a_limited_run_charges_only_its_attempts(tmp_path: Path) -> None:
    log = open_log(tmp_path, "plain")
    limit = RateLimit(requests_per_minute=10, tokens_per_minute=1000, key="k2")
    run_items(log, [{"id": "a"}, {"id": "b"}], lambda item, ctx: {"ok": True}, rate_limit=limit)
    other = open_limiter(limit, root=str(log.root))
    try:
        assert other.try_acquire(cost_requests=1, est_tokens=1000)  # no token was charged
        assert other.try_acquire(cost_requests=7)  # 2 + 1 of 10 requests used
        assert not other.try_acquire(cost_requests=1)
    finally:
        other.close()
