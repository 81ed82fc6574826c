"""In-place retries of transient errors (issue 16): ``run_items(retry=RetryPolicy(...))``.

A fake sleep records the waits, so no test sleeps for real except the SIGKILL one (a subprocess
killed during a real backoff wait).
"""

from __future__ import annotations

import email.utils
import os
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import pytest

from airflow_provider_datagen.core import ItemStatus, RetryPolicy, Sequence, Step, run_items
from airflow_provider_datagen.core.retry import retry_after_of
from airflow_provider_datagen.core.schema import EventType
from airflow_provider_datagen.exceptions import ConfigurationError, ProcessContractError
from tests._support import REPO
from tests._support.engine import make_items, open_log, raw_events, results_fp, statuses


class RateLimited(Exception):
    """A 429 with a Retry-After, shaped like an SDK's error (``exc.response.headers``)."""

    def __init__(self, retry_after: str) -> None:
        super().__init__(f"429 Too Many Requests (retry after {retry_after})")
        self.response = type("Response", (), {"headers": {"Retry-After": retry_after}})()


class Fatal(ValueError):
    """Not transient."""


class Waits(list[float]):
    """A fake sleep: records each wait instead of sleeping."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def flaky(
    fail_first: int, error: type[Exception] | Any = TimeoutError, calls: dict[str, list[int]] | None = None
) -> Any:
    """A process whose items fail their first ``fail_first`` attempts (by ``ctx.attempt``)."""

    def process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        if calls is not None:
            calls.setdefault(ctx.item_id, []).append(ctx.attempt)
        if ctx.attempt <= fail_first:
            raise error(f"attempt {ctx.attempt} of {ctx.item_id} timed out") if isinstance(error, type) else error
        return {"out": item["text"].upper(), "attempt": ctx.attempt}

    return process


@pytest.fixture
def log(tmp_path: Any) -> Any:
    return open_log(tmp_path, "retry")


def _policy(waits: Waits, **kw: Any) -> RetryPolicy:
    kw.setdefault("attempts", 5)
    kw.setdefault("retry_on", (TimeoutError,))
    kw.setdefault("backoff", 2.0)
    kw.setdefault("max_backoff", 60.0)
    kw.setdefault("jitter", False)
    return RetryPolicy(sleep=waits, **kw)


def test_a_retryable_error_twice_then_success_completes_in_the_same_run(log: Any) -> None:
    waits, calls = Waits(), {}
    report = run_items(log, make_items(3), flaky(2, calls=calls), retry=_policy(waits))
    assert report.failed == [] and sorted(report.processed) == sorted(calls)
    assert set(statuses(log).values()) == {ItemStatus.COMPLETED.value}
    assert all(a == [1, 2, 3] for a in calls.values())
    assert waits == [2.0, 4.0] * 3  # backoff doubling, no jitter
    item = sorted(calls)[0]
    records = log.failures(item)
    assert [(r.error_type, r.transient, r.attempt, r.wait) for r in records] == [
        ("TimeoutError", True, 1, 2.0),
        ("TimeoutError", True, 2, 4.0),
    ]
    assert "attempt 1 of" in records[0].message and "TimeoutError" in (records[0].traceback or "")
    st = log.item_states([item])[item]
    assert st.status is ItemStatus.COMPLETED and st.failures == 0 and st.retries == 2
    assert st.fields["attempt"] == 3  # the call that returned saw the third attempt
    # the state table (vectorized fold) keeps transient rows out of failures, as the reference fold does
    table = log.states()
    assert table["failures"].to_pylist() == [0, 0, 0]
    failed_rows = [e for e in raw_events(log).to_pylist() if e["event_type"] == EventType.FAILED.value]
    assert len(failed_rows) == 6 and {e["status"] for e in failed_rows} == {"transient"}


def test_a_non_retryable_error_fails_at_once(log: Any) -> None:
    waits, calls = Waits(), {}
    report = run_items(log, make_items(2), flaky(1, Fatal, calls), retry=_policy(waits))
    assert sorted(report.failed) == sorted(calls)
    assert all(a == [1] for a in calls.values()) and waits == []
    records = log.failures()
    assert [(r.error_type, r.transient, r.attempt) for r in records] == [("Fatal", False, 1)] * 2
    assert set(log.states()["failures"].to_pylist()) == {1}


def test_exhausted_attempts_fail_the_item_after_n_calls(log: Any) -> None:
    waits, calls = Waits(), {}
    report = run_items(log, make_items(1), flaky(99, calls=calls), retry=_policy(waits, attempts=3))
    (item,) = calls
    assert report.failed == [item] and calls[item] == [1, 2, 3]
    assert "TimeoutError: attempt 3" in report.errors[item]
    assert [(r.transient, r.attempt) for r in log.failures(item)] == [(True, 1), (True, 2), (False, 3)]
    st = log.item_states([item])[item]
    assert st.status is ItemStatus.RUNNING and st.failures == 1 and st.retries == 2
    # the next run gets a fresh budget and numbers its attempts on from the log
    calls.clear()
    report = run_items(log, make_items(1), flaky(4, calls=calls), retry=_policy(waits, attempts=3), epoch=2)
    assert report.processed == [item] and calls[item] == [4, 5]


def test_retry_after_is_honoured(log: Any) -> None:
    waits = Waits()
    state = {"n": 0}

    def process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        state["n"] += 1
        if state["n"] == 1:
            raise RateLimited("7")
        if state["n"] == 2:
            when = email.utils.formatdate(time.time() + 30, usegmt=True)
            raise RateLimited(when)
        return {"ok": True}

    policy = _policy(waits, retry_on=(RateLimited,), backoff=0.5, jitter=True)
    report = run_items(log, make_items(1), process, retry=policy)
    assert report.failed == [] and len(waits) == 2
    assert waits[0] >= 7.0 and 27.0 <= waits[1] <= 30.0
    assert [r.wait for r in log.failures()] == waits


def test_a_retry_after_beyond_max_backoff_is_not_waited_for(log: Any) -> None:
    waits = Waits()

    def process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        raise RateLimited("120")

    report = run_items(log, make_items(1), process, retry=_policy(waits, retry_on=(RateLimited,)))
    assert len(report.failed) == 1 and waits == []
    assert "RateLimited: 429" in next(iter(report.errors.values()))


def test_retry_after_sources() -> None:
    exc = TimeoutError("x")
    exc.retry_after = 3  # type: ignore[attr-defined]
    assert retry_after_of(exc) == 3.0
    assert retry_after_of(RateLimited("1.5")) == 1.5
    assert retry_after_of(RateLimited("soon")) is None
    assert retry_after_of(RateLimited(email.utils.formatdate(100.0, usegmt=True)), now=lambda: 90.0) == 10.0
    assert retry_after_of(ValueError("plain")) is None


def test_dotted_names_match_the_class_hierarchy_without_importing_it(log: Any) -> None:
    # an SDK's error defined in a private module and re-exported by its package, as openai does
    ns: dict[str, Any] = {"__name__": "fakesdk._exceptions"}
    exec("class APIError(Exception): pass\nclass RateLimitError(APIError): pass", ns)
    rate_limit = ns["RateLimitError"]
    by_package = RetryPolicy(retry_on=("fakesdk.RateLimitError",))
    assert by_package.matches(rate_limit("429"))
    assert RetryPolicy(retry_on=("fakesdk._exceptions.APIError",)).matches(rate_limit("429"))  # a base class
    assert RetryPolicy(retry_on=("builtins.TimeoutError",)).matches(TimeoutError())
    assert not by_package.matches(ns["APIError"]("other"))
    assert not RetryPolicy(retry_on=("otherpkg.RateLimitError",)).matches(rate_limit("429"))
    assert not by_package.matches(KeyboardInterrupt())  # type: ignore[arg-type]
    waits = Waits()
    report = run_items(
        log, make_items(2), flaky(1, rate_limit), retry=_policy(waits, retry_on=("fakesdk.RateLimitError",))
    )
    assert report.failed == [] and waits == [2.0, 2.0]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"attempts": 0}, r"RetryPolicy: attempts=0 is not an int >= 1"),
        ({"attempts": True}, r"attempts=True is not an int >= 1"),
        ({"attempts": 2.0}, r"attempts=2.0 is not an int >= 1"),
        ({"backoff": -1}, r"backoff=-1 is not a number of seconds >= 0"),
        ({"max_backoff": float("inf")}, r"max_backoff=inf is not a number of seconds >= 0"),
        ({"backoff": 5, "max_backoff": 1}, r"max_backoff=1 is below backoff=5; give max_backoff >= backoff"),
        ({"retry_on": ("RateLimitError",)}, r"retry_on='RateLimitError' is not an Exception subclass or a dotted"),
        ({"retry_on": (KeyboardInterrupt,)}, r"retry_on=<class 'KeyboardInterrupt'> is not an Exception subclass"),
        ({"retry_on": 3}, r"retry_on=3 is not a tuple"),
        ({"jitter": "yes"}, r"jitter='yes' is not a bool"),
    ],
)
def test_bad_policies_are_configuration_errors(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        RetryPolicy(**kwargs)


def test_bad_retry_arguments_are_refused_before_any_write(log: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"run_items: retry=\{'attempts': 3\} is not a RetryPolicy"):
        run_items(log, make_items(1), flaky(0), retry={"attempts": 3})  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"has unknown keys \['tries'\]"):
        RetryPolicy.from_dict({"tries": 3})
    assert not log.exists()


def test_the_dict_form_round_trips() -> None:
    policy = RetryPolicy(attempts=5, retry_on=(TimeoutError, "openai.RateLimitError"), backoff=2.0, max_backoff=60.0)
    d = policy.as_dict()
    assert d == {
        "attempts": 5,
        "retry_on": ["builtins.TimeoutError", "openai.RateLimitError"],
        "backoff": 2.0,
        "max_backoff": 60.0,
        "jitter": True,
    }
    again = RetryPolicy.from_dict(d)
    assert again.as_dict() == d and again.matches(TimeoutError()) and RetryPolicy.coerce(d) == again


def test_jitter_is_full_jitter_up_to_the_capped_backoff(log: Any) -> None:
    waits = Waits()
    run_items(log, make_items(20), flaky(3), retry=_policy(waits, jitter=True, backoff=1.0, max_backoff=3.0))
    assert len(waits) == 60 and len(set(waits)) > 10
    assert all(0 <= w <= cap for w, cap in zip(waits, [1.0, 2.0, 3.0] * 20))


def test_contract_errors_are_never_retried(log: Any) -> None:
    waits = Waits()

    def bad(item: dict[str, Any], ctx: Any) -> Any:
        return ["not", "a", "dict"]

    with pytest.raises(ProcessContractError):
        run_items(log, make_items(3), bad, retry=_policy(waits, retry_on=(Exception,)))
    assert waits == [] and [r.transient for r in log.failures()] == [False] * 3


def test_under_concurrency_the_wait_happens_in_the_worker_and_blocks_no_other_item(log: Any) -> None:
    started = threading.Event()
    release = threading.Event()
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        started.set()
        release.wait(30)  # this item's backoff lasts until the others are done

    calls: dict[str, list[int]] = {}
    lock = threading.Lock()

    def process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        with lock:
            calls.setdefault(ctx.item_id, []).append(ctx.attempt)
            done = sum(1 for a in calls.values() if a[-1] > 1 or item["id"] != 0)
        if item["id"] == 0 and ctx.attempt == 1:
            raise TimeoutError("slow")
        if item["id"] != 0 and done >= 11:
            release.set()
        return {"out": item["id"]}

    policy = RetryPolicy(attempts=3, retry_on=(TimeoutError,), backoff=1.0, jitter=False, sleep=sleep)
    report = run_items(log, make_items(12), process, retry=policy, concurrency=4)
    assert report.failed == [] and len(report.processed) == 12
    assert started.is_set() and waits == [1.0]
    first = min(calls)  # item 0's id sorts first
    assert calls[first] == [1, 2]
    assert set(statuses(log).values()) == {ItemStatus.COMPLETED.value}
    assert [(r.transient, r.attempt) for r in log.failures()] == [(True, 1)]


def test_in_a_pipeline_only_the_failing_step_reruns(log: Any) -> None:
    calls: list[tuple[str, int]] = []

    def first(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        calls.append(("first", ctx.attempt))
        return {"a": 1}

    def second(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        calls.append(("second", ctx.attempt))
        if ctx.attempt < 3:
            raise TimeoutError("later")
        return {"b": ctx.fields["a"] + 1}

    def third(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        calls.append(("third", ctx.attempt))
        return {"c": ctx.attempt}

    pipeline = Sequence("p", [Step("first", first), Step("second", second), Step("third", third)])
    waits = Waits()
    report = run_items(log, make_items(1), pipeline, retry=_policy(waits))
    assert report.failed == []
    assert calls == [("first", 1), ("second", 1), ("second", 2), ("second", 3), ("third", 3)]
    assert [(r.step, r.attempt) for r in log.failures()] == [("second", 1), ("second", 2)]
    (iid,) = report.processed
    assert log.item_states([iid])[iid].fields == {"a": 1, "b": 2, "c": 3}


@pytest.mark.parametrize("concurrency", [1, 3])
def test_resumed_equals_uninterrupted_with_retries(tmp_path: Any, concurrency: int) -> None:
    items = make_items(12)
    clean = open_log(tmp_path, "clean")
    run_items(clean, items, flaky(2), retry=_policy(Waits()), concurrency=concurrency)

    class Killed(BaseException):
        pass

    crashed = open_log(tmp_path, "crashed")
    state = {"n": 0}

    def dies_in_the_middle(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        state["n"] += 1
        if state["n"] == 17:
            raise Killed
        return flaky(2)(item, ctx)

    with pytest.raises(Killed):
        run_items(
            crashed,
            items,
            dies_in_the_middle,
            retry=_policy(Waits()),
            checkpoint_every=1,
            reraise=(Killed,),
            concurrency=concurrency,
        )
    report = run_items(crashed, items, flaky(2), retry=_policy(Waits()), epoch=2, concurrency=concurrency)
    assert report.failed == []
    assert results_fp(crashed) == results_fp(clean)
    assert set(statuses(crashed).values()) == {ItemStatus.COMPLETED.value}


_CHILD = textwrap.dedent(
    """
    import os, sys, time
    sys.path.insert(0, {repo!r})
    from airflow_provider_datagen.core import RetryPolicy, run_items
    from tests._support.engine import make_items, open_log

    marker = {marker!r}

    def sleep(seconds):
        open(marker, "w").close()  # the parent kills us during this wait
        time.sleep(seconds)

    def process(item, ctx):
        if item["id"] == 5 and ctx.attempt == 1:
            raise TimeoutError("transient")
        return {{"out": item["text"].upper(), "attempt": ctx.attempt}}

    log = open_log({root!r}, "killed")
    policy = RetryPolicy(attempts=3, retry_on=(TimeoutError,), backoff=60.0, max_backoff=60.0, jitter=False,
                         sleep=sleep)
    run_items(log, make_items(10), process, checkpoint_every={every}, retry=policy)
    """
)


@pytest.mark.parametrize("every", [1, 4])
def test_a_sigkill_during_a_backoff_wait_resumes_to_the_same_result(tmp_path: Any, every: int) -> None:
    def process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        if item["id"] == 5 and ctx.attempt == 1:
            raise TimeoutError("transient")
        return {"out": item["text"].upper(), "attempt": ctx.attempt}

    policy = RetryPolicy(
        attempts=3, retry_on=(TimeoutError,), backoff=60.0, max_backoff=60.0, jitter=False, sleep=Waits()
    )
    clean = open_log(tmp_path, "clean")
    run_items(clean, make_items(10), process, retry=policy)

    marker = str(tmp_path / "sleeping")
    code = _CHILD.format(repo=str(REPO), marker=marker, root=str(tmp_path), every=every)
    child = subprocess.Popen([sys.executable, "-c", code], cwd=str(REPO))
    try:
        deadline = time.monotonic() + 120
        while not os.path.exists(marker):
            assert child.poll() is None, "the worker ended before its backoff wait"
            assert time.monotonic() < deadline, "the worker never reached its backoff wait"
            time.sleep(0.05)
        os.kill(child.pid, 9)
        assert child.wait(30) == -9
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    killed = open_log(tmp_path, "killed")
    transient = [r for r in killed.failures() if r.transient]
    # checkpoint_every=1 commits the transient row before the wait; in a group of 4 it was still staged
    assert len(transient) == (1 if every == 1 else 0)
    report = run_items(killed, make_items(10), process, retry=policy, epoch=killed.next_epoch())
    assert report.failed == []
    assert results_fp(killed) == results_fp(clean)
    assert set(statuses(killed).values()) == {ItemStatus.COMPLETED.value}
