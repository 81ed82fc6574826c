"""Shared rate limits: the RateLimit contract, the moving window, tokens, cooldown, and the budget
shared across processes through the embedded SQLite storage and a real redis-server."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import shutil
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import pytest
import redis

from airflow_provider_datagen.core import RateLimit
from airflow_provider_datagen.core.ratelimit import SharedLimiter, SQLiteStorage, default_storage_path, open_limiter
from airflow_provider_datagen.exceptions import ConfigurationError

if TYPE_CHECKING:
    from collections.abc import Iterator

SPAWN = multiprocessing.get_context("spawn")


class FakeTime:
    """A wall clock that only moves when the limiter sleeps (or the test advances it)."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.now = start
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def fake_limiter(path: str, rate_limit: RateLimit, clock: FakeTime) -> SharedLimiter:
    storage = SQLiteStorage(path, clock=clock)
    return SharedLimiter(rate_limit, storage, storage, clock=clock, sleep=clock.sleep)


# -- RateLimit ---------------------------------------------------------------------------------------


def test_rate_limit_round_trips_through_its_dict():
    limit = RateLimit(requests_per_minute=600, tokens_per_minute=200_000, key="openai")
    assert limit.as_dict() == {"requests_per_minute": 600, "tokens_per_minute": 200_000, "key": "openai"}
    assert RateLimit.from_dict(limit.as_dict()) == limit
    assert RateLimit.from_dict({"requests_per_minute": 5}) == RateLimit(5, None, "default")
    assert RateLimit.coerce({"requests_per_minute": 5, "key": "k"}, owner="X") == RateLimit(5, key="k")
    assert RateLimit.coerce(limit, owner="X") is limit
    assert RateLimit.coerce(None, owner="X") is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"requests_per_minute": 0}, r"RateLimit: requests_per_minute=0 is not an int of 1 or more"),
        ({"requests_per_minute": True}, r"requests_per_minute=True is not an int"),
        ({"requests_per_minute": 1.5}, r"requests_per_minute=1.5 is not an int"),
        ({"requests_per_minute": 5, "tokens_per_minute": -1}, r"tokens_per_minute=-1 is not an int of 1 or more"),
        ({"requests_per_minute": 5, "key": ""}, r"key='' is not a usable budget name"),
        ({"requests_per_minute": 5, "key": "a/b"}, r"key='a/b' is not a usable budget name"),
        ({"requests_per_minute": 5, "key": 7}, r"key=7 is not a usable budget name"),
    ],
)
def test_bad_rate_limit_values_are_configuration_errors(kwargs, message):
    with pytest.raises(ConfigurationError, match=message):
        RateLimit(**kwargs)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"requests_per_minute": 5, "tokens": 9}, r"Op: rate_limit=.* has the unknown key\(s\) 'tokens'; use the keys"),
        ({"key": "k"}, r"Op: rate_limit=.* has no 'requests_per_minute'"),
        ({"requests_per_minute": "600"}, r"Op: rate_limit.requests_per_minute='600' is not an int of 1 or more"),
        ({"requests_per_minute": 5, "key": None}, r"Op: rate_limit.key=None is not a usable budget name"),
        ([600], r"Op: rate_limit=\[600\] is not a RateLimit, a dict or None"),
        ("600/minute", r"Op: rate_limit='600/minute' is not a RateLimit, a dict or None"),
    ],
)
def test_malformed_rate_limit_dicts_name_the_owner_and_the_key(value, message):
    with pytest.raises(ConfigurationError, match=message):
        RateLimit.coerce(value, owner="Op")


# -- the moving window, on the embedded storage with a fake clock -----------------------------------


def test_at_most_n_starts_in_any_60_seconds(tmp_path):
    clock = FakeTime()
    limiter = fake_limiter(str(tmp_path / "rl.sqlite"), RateLimit(3, key="k"), clock)
    assert [limiter.try_acquire() for _ in range(4)] == [True, True, True, False]
    clock.now += 30
    assert limiter.try_acquire() is False
    clock.now += 29.9  # 59.9 s after the first three starts: they are still in the window
    assert limiter.try_acquire() is False
    clock.now += 0.2
    assert [limiter.try_acquire() for _ in range(4)] == [True, True, True, False]


def test_acquire_sleeps_until_the_oldest_start_leaves_the_window(tmp_path):
    clock = FakeTime()
    limiter = fake_limiter(str(tmp_path / "rl.sqlite"), RateLimit(2, key="k"), clock)
    start = clock.now
    assert limiter.acquire() == 0.0
    clock.now += 10
    assert limiter.acquire() == 0.0
    waited = limiter.acquire()
    # The first start (at `start`) must be 60 s old: 50 s more from now, plus the boundary step(s).
    assert 50.0 <= waited < 50.1
    assert clock.now - start >= 60.0
    assert limiter.try_acquire() is False  # the second start (at +10 s) still holds the other slot


def test_a_call_costing_more_than_the_budget_is_refused(tmp_path):
    limiter = fake_limiter(str(tmp_path / "rl.sqlite"), RateLimit(3, key="k"), FakeTime())
    with pytest.raises(ConfigurationError, match=r"cost_requests=4 is not an int from 1 to requests_per_minute \(3\)"):
        limiter.acquire(cost_requests=4)
    with pytest.raises(ConfigurationError, match=r"est_tokens=-1 is not an int >= 0"):
        limiter.try_acquire(est_tokens=-1)


def test_threads_sharing_one_limiter_start_at_most_n(tmp_path):
    limiter = open_limiter(RateLimit(20, key="k"), root=str(tmp_path))
    barrier = threading.Barrier(8)

    def tries() -> int:
        barrier.wait(timeout=30)
        return sum(limiter.try_acquire() for _ in range(10))

    with ThreadPoolExecutor(8) as pool:
        assert sum(pool.map(lambda _: tries(), range(8))) == 20


def test_acquire_async_waits_on_the_event_loop(tmp_path):
    limiter = open_limiter(RateLimit(20, key="k"), root=str(tmp_path))

    async def main() -> tuple[float, float, bool]:
        deadline = limiter.cooldown(0.3)
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        task = asyncio.create_task(ticker())
        await limiter.acquire_async()
        returned = time.time()
        task.cancel()
        return deadline, returned, ticks > 5

    deadline, returned, loop_ran = asyncio.run(main())
    assert returned >= deadline
    assert loop_ran  # the wait let other tasks run


# -- tokens ----------------------------------------------------------------------------------------


def test_tokens_are_charged_before_and_corrected_after(tmp_path):
    clock = FakeTime()
    path = str(tmp_path / "rl.sqlite")
    limit = RateLimit(100, tokens_per_minute=1000, key="k")
    a, b = fake_limiter(path, limit, clock), fake_limiter(path, limit, clock)
    assert a.try_acquire(est_tokens=600)
    a.charge_tokens(300)  # the call used 900: the window now holds 900 of 1000
    assert a.owed_tokens == 0
    assert b.try_acquire(est_tokens=200) is False  # the budget is shared: 900 + 200 > 1000
    assert b.try_acquire(est_tokens=100)
    # A negative correction cannot be taken back from the window: it is a credit of that limiter.
    b.charge_tokens(-100)
    assert b.owed_tokens == -100
    assert b.try_acquire(est_tokens=100)  # paid by the credit, nothing written
    assert a.try_acquire(est_tokens=1) is False
    clock.now += 60.1
    assert a.try_acquire(est_tokens=1000)


def test_a_charge_that_does_not_fit_is_paid_by_the_next_acquire(tmp_path):
    clock = FakeTime()
    limiter = fake_limiter(str(tmp_path / "rl.sqlite"), RateLimit(100, tokens_per_minute=1000, key="k"), clock)
    assert limiter.try_acquire(est_tokens=800)
    limiter.charge_tokens(700)  # 200 fit now, 500 are owed
    assert limiter.owed_tokens == 500
    start = clock.now
    limiter.acquire()  # pays the 500 once the first 800+200 leave the window, then starts
    assert limiter.owed_tokens == 0
    assert clock.now - start >= 60.0


def test_token_units_bound_the_window_size(tmp_path):
    limiter = fake_limiter(str(tmp_path / "rl.sqlite"), RateLimit(10, tokens_per_minute=200_000), FakeTime())
    assert limiter.token_unit == 200
    assert limiter.try_acquire(est_tokens=50)  # rounded up to one unit: 150 tokens of credit remain
    assert limiter.owed_tokens == -150


# -- cooldown --------------------------------------------------------------------------------------


def test_cooldown_blocks_every_limiter_on_the_key_and_only_moves_later(tmp_path):
    clock = FakeTime()
    path = str(tmp_path / "rl.sqlite")
    a = fake_limiter(path, RateLimit(100, key="k"), clock)
    b = fake_limiter(path, RateLimit(100, key="k"), clock)
    other = fake_limiter(path, RateLimit(100, key="other"), clock)
    deadline = a.cooldown(2.0)
    assert deadline == clock.now + 2.0
    assert b.cooldown(0.5) == deadline  # a shorter cooldown never shortens the one set
    assert b.try_acquire() is False
    assert other.try_acquire() is True
    waited = b.acquire()
    assert waited == pytest.approx(2.0)
    assert clock.now >= deadline
    with pytest.raises(ConfigurationError, match=r"cooldown\(seconds\)=-1 is not a finite number of seconds"):
        a.cooldown(-1)


# -- storages ----------------------------------------------------------------------------------------


def test_embedded_storage_lives_beside_a_local_root_and_per_host_for_an_object_store(tmp_path, monkeypatch):
    assert default_storage_path(str(tmp_path)) == str(tmp_path / "datagen_checkpoints" / ".ratelimits.sqlite")
    assert default_storage_path(f"file://{tmp_path}") == str(tmp_path / "datagen_checkpoints" / ".ratelimits.sqlite")
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "home"))
    s3 = default_storage_path("s3://bucket/prefix")
    assert s3.startswith(str(tmp_path / "home" / "datagen_ratelimits") + os.sep)
    assert s3 == default_storage_path("s3://bucket/prefix/") != default_storage_path("s3://bucket/other")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"storage_uri": "memcached://h:1"}, r"storage_uri='memcached://h:1' is not a rate limit storage URI"),
        ({"storage_uri": "redis//h"}, r"storage_uri='redis//h' is not a rate limit storage URI; give one of"),
        ({"storage_uri": "mongodb://u:pw@h:1"}, r"storage_uri='mongodb://\*\*\*@h:1' is not"),
        ({}, r"open_limiter: root=None is empty and no storage_uri is given"),
    ],
)
def test_open_limiter_refuses_unusable_storages(kwargs, message):
    with pytest.raises(ConfigurationError, match=message):
        open_limiter(RateLimit(5), **kwargs)


# -- shared across processes -----------------------------------------------------------------------


def _try_many(root: str | None, uri: str | None, key: str, tries: int, barrier: Any, results: Any) -> None:
    limiter = open_limiter(RateLimit(requests_per_minute=20, key=key), root=root, storage_uri=uri)
    barrier.wait(timeout=60)
    results.put(sum(limiter.try_acquire() for _ in range(tries)))


def _successes(root: str | None, uri: str | None, keys: list[str]) -> int:
    """Each process tries 30 starts at once against its key; the total that got through."""
    barrier, results = SPAWN.Barrier(len(keys)), SPAWN.Queue()
    procs = [SPAWN.Process(target=_try_many, args=(root, uri, key, 30, barrier, results)) for key in keys]
    for proc in procs:
        proc.start()
    try:
        counts = [results.get(timeout=120) for _ in procs]
    finally:
        for proc in procs:
            proc.join(timeout=30)
    assert all(proc.exitcode == 0 for proc in procs), [proc.exitcode for proc in procs]
    return sum(counts)


@pytest.mark.slow  # `make test` runs it; `make unit`, the inner loop, leaves it out
def test_four_processes_on_one_key_share_one_budget(tmp_path):
    # requests_per_minute=20: 4 x 30 tries on one key start exactly 20 calls in the first window.
    assert _successes(str(tmp_path), None, ["openai"] * 4) == 20
    # The same on four keys: each key has its own 20.
    assert _successes(str(tmp_path), None, ["k1", "k2", "k3", "k4"]) == 80


def _wait_out_cooldown(root: str | None, uri: str | None, ready: Any, go: Any, results: Any) -> None:
    limiter = open_limiter(RateLimit(requests_per_minute=100, key="openai"), root=root, storage_uri=uri)
    ready.set()
    go.wait(timeout=60)
    before = time.time()
    limiter.acquire()
    results.put((before, time.time()))


def _cooldown_across_processes(root: str | None, uri: str | None) -> None:
    ready, go, results = SPAWN.Event(), SPAWN.Event(), SPAWN.Queue()
    proc = SPAWN.Process(target=_wait_out_cooldown, args=(root, uri, ready, go, results))
    proc.start()
    try:
        assert ready.wait(timeout=60)
        deadline = open_limiter(RateLimit(100, key="openai"), root=root, storage_uri=uri).cooldown(2.0)
        go.set()
        before, returned = results.get(timeout=60)
    finally:
        proc.join(timeout=30)
    assert proc.exitcode == 0
    # The other process asked before the deadline and was let through only after it.
    assert before < deadline <= returned


def test_a_cooldown_holds_back_another_process(tmp_path):
    _cooldown_across_processes(str(tmp_path), None)


# -- a real redis-server -------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def redis_uri(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server = shutil.which("redis-server")
    if server is None:
        pytest.fail("redis-server is not installed: run `make redis` (Debian's redis-server package)", pytrace=False)
    port = _free_port()
    workdir = tmp_path_factory.mktemp("redis")
    proc = subprocess.Popen(
        [server, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no", "--dir", str(workdir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        client = redis.Redis(host="127.0.0.1", port=port)
        deadline = time.monotonic() + 20
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"redis-server did not start on 127.0.0.1:{port}", pytrace=False)
                time.sleep(0.05)
        client.close()
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_two_processes_share_one_budget_through_redis(redis_uri):
    assert _successes(None, redis_uri, ["openai"] * 2) == 20
    assert _successes(None, redis_uri, ["r1", "r2"]) == 40


def test_a_cooldown_holds_back_another_process_through_redis(redis_uri):
    _cooldown_across_processes(None, redis_uri)


def test_tokens_are_shared_through_redis(redis_uri):
    limit = RateLimit(100, tokens_per_minute=1000, key="tokens")
    a, b = open_limiter(limit, storage_uri=redis_uri), open_limiter(limit, storage_uri=redis_uri)
    assert a.try_acquire(est_tokens=900)
    assert b.try_acquire(est_tokens=200) is False
    assert b.try_acquire(est_tokens=100)
