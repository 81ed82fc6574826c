"""Cooldowns are bounded: a Retry-After is capped at the limiter's ceiling when stored, hostile hints are
ignored, and a stored cooldown beyond the ceiling (an older version's) is ignored, in SQLite and Redis.
A damaged SQLite file is a DatagenError naming it and the fix."""

from __future__ import annotations

import email.utils
import os
import sqlite3
from typing import TYPE_CHECKING, Any

import pytest
import redis

from airflow_provider_datagen.core import RateLimit, RetryPolicy, run_items
from airflow_provider_datagen.core.ratelimit import SharedLimiter, SQLiteStorage, default_storage_path, open_limiter
from airflow_provider_datagen.core.ratelimit.limiter import DEFAULT_MAX_COOLDOWN
from airflow_provider_datagen.core.retry import retry_after_of
from airflow_provider_datagen.exceptions import DatagenError
from tests._support.engine import open_log
from tests.core.ratelimit.test_ratelimit import FakeTime, redis_uri  # noqa: F401  (the redis-server fixture)

if TYPE_CHECKING:
    from pathlib import Path


class RateLimited(Exception):
    def __init__(self, retry_after: Any) -> None:
        super().__init__("429 Too Many Requests")
        self.response = type("Response", (), {"headers": {"Retry-After": retry_after}})()


@pytest.mark.parametrize("hint", ["inf", "nan", "-5", "-0.5", "soon", "1e999", "Mon, 99 Foo 2099 00:00:00 GMT"])
def test_a_hint_that_is_not_seconds_or_a_date_is_ignored(hint: str) -> None:
    assert retry_after_of(RateLimited(hint)) is None


@pytest.mark.parametrize("value", [float("inf"), float("nan"), -1, 10**400])
def test_a_retry_after_attribute_that_is_not_seconds_is_ignored(value: Any) -> None:
    exc = TimeoutError("x")
    exc.retry_after = value  # type: ignore[attr-defined]
    assert retry_after_of(exc) is None


def test_long_hints_are_read_as_asked_and_a_policy_does_not_retry_them() -> None:
    assert retry_after_of(RateLimited("1e308")) == 1e308
    far = email.utils.formatdate(4_070_908_800.0, usegmt=True)  # 2099-01-01
    assert retry_after_of(RateLimited(far), now=lambda: 4_070_908_800.0 - 5) == 5.0
    policy = RetryPolicy(retry_on=(RateLimited,), max_backoff=30.0)
    assert not policy.retryable(RateLimited("1e9"))
    assert policy.retryable(RateLimited("30"))


def _sqlite_limiter(path: str, clock: FakeTime, **kwargs: Any) -> SharedLimiter:
    storage = SQLiteStorage(path, clock=clock)
    return SharedLimiter(RateLimit(100, key="k"), storage, storage, clock=clock, sleep=clock.sleep, **kwargs)


@pytest.mark.parametrize("seconds", [1e9, 1e308, 4_070_908_800.0])
def test_a_cooldown_is_stored_at_most_at_the_ceiling(tmp_path: Path, seconds: float) -> None:
    clock = FakeTime()
    a = _sqlite_limiter(str(tmp_path / "rl.sqlite"), clock, max_cooldown=30.0)
    assert a.cooldown(seconds) == clock.now + 30.0
    assert a.blocked_until() == clock.now + 30.0
    assert a.acquire() == pytest.approx(30.0)  # then it starts: never blocked for the hint's length


def test_the_default_ceiling(tmp_path: Path) -> None:
    clock = FakeTime()
    a = _sqlite_limiter(str(tmp_path / "rl.sqlite"), clock)
    assert a.max_cooldown == DEFAULT_MAX_COOLDOWN == 60.0
    assert a.cooldown(1e9) == clock.now + 60.0


def _older_version_stored(path: str, until: float) -> None:
    """What a version without a ceiling stored: any deadline."""
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("INSERT OR REPLACE INTO cooldowns (key, until) VALUES ('k', ?)", (until,))
    conn.close()


@pytest.mark.parametrize("until", [1e9 + 1_000_000.0, 1e308, float("inf")])
def test_a_stored_cooldown_beyond_the_ceiling_is_ignored_in_sqlite(tmp_path: Path, until: float) -> None:
    clock = FakeTime()
    path = str(tmp_path / "rl.sqlite")
    a = _sqlite_limiter(path, clock, max_cooldown=30.0)
    a.try_acquire()  # creates the file
    _older_version_stored(path, until)
    assert a.blocked_until() == 0.0
    assert a.try_acquire() is True
    # a new cooldown replaces it (it does not "only move later" from a hostile value)
    assert a.cooldown(5.0) == clock.now + 5.0
    assert a.blocked_until() == clock.now + 5.0


def test_a_stored_cooldown_within_the_ceiling_still_holds(tmp_path: Path) -> None:
    clock = FakeTime()
    path = str(tmp_path / "rl.sqlite")
    a = _sqlite_limiter(path, clock, max_cooldown=30.0)
    a.try_acquire()
    _older_version_stored(path, clock.now + 20.0)
    assert a.try_acquire() is False
    assert a.cooldown(5.0) == clock.now + 20.0  # only moves later


def test_redis_caps_and_ignores_cooldowns_beyond_the_ceiling(redis_uri: str) -> None:  # noqa: F811
    limit = RateLimit(100, key="bounded")
    a = open_limiter(limit, storage_uri=redis_uri, max_cooldown=30.0)
    client = redis.Redis.from_url(redis_uri)
    key = a._cooldowns._key("bounded")  # type: ignore[attr-defined]
    try:
        before = a._clock()
        deadline = a.cooldown(1e308)  # raised OverflowError before: no ceiling
        assert before + 30.0 <= deadline <= a._clock() + 30.0
        assert 0 < client.pttl(key) <= 31_000
        # an older version's deadline in 2099 (and garbage): ignored, then replaced
        for stored in ("4070908800.0", "inf", "not a number"):
            client.set(key, stored)
            assert a.blocked_until() == 0.0
            assert a.try_acquire() is True
            new = a.cooldown(2.0)
            assert new <= a._clock() + 2.0
            assert a.blocked_until() == new
            client.delete(key)
    finally:
        client.close()


def test_memory_storage_ignores_cooldowns_beyond_the_ceiling() -> None:
    a = open_limiter(RateLimit(100, key="mem-bounded"), storage_uri="memory://", max_cooldown=10.0)
    assert a.cooldown(1e308) <= a._clock() + 10.0
    a._cooldowns.block_until("mem-bounded", 1e308)  # what an unbounded caller stored
    assert a.blocked_until() == 0.0


def test_a_run_caps_the_cooldown_at_its_policys_max_backoff(tmp_path: Path) -> None:
    calls: list[int] = []

    def proc(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        calls.append(ctx.attempt)
        raise RateLimited("1e308")  # not retried (beyond max_backoff), the key cools down 20 s only

    log = open_log(tmp_path, "e")
    limit = RateLimit(100, key="run-bounded")
    retry = RetryPolicy(retry_on=(RateLimited,), max_backoff=20.0, backoff=0.0)
    report = run_items(log, [{"id": "a"}], proc, rate_limit=limit, retry=retry)
    assert report.failed == ["a"] and calls == [1]
    assert "RateLimited" in report.errors["a"]
    other = open_limiter(limit, root=str(log.root))
    try:
        assert 0 < other.blocked_until() - other._clock() <= 20.0
    finally:
        other.close()


def test_a_damaged_sqlite_file_names_the_file_and_the_fix(tmp_path: Path) -> None:
    path = default_storage_path(str(tmp_path))
    (tmp_path / "datagen_checkpoints").mkdir()
    with open(path, "wb") as f:
        f.write(b"this is not a database" * 100)
    limiter = open_limiter(RateLimit(10, key="k"), root=str(tmp_path))
    with pytest.raises(DatagenError, match=r"the rate limit storage .* is not a readable SQLite database") as info:
        limiter.acquire()
    message = str(info.value)
    assert path in message
    assert "file is not a database" in message
    assert "delete that file" in message
    assert isinstance(info.value.__cause__, sqlite3.DatabaseError)
    # the fix works: deleted, the next call starts afresh
    os.remove(path)
    assert limiter.try_acquire() is True
    limiter.close()
