"""A systemic failure stops the chunk early: ``max_repeated_failures`` (issue 24, point 5).

A wrong connection id or an unreachable server fails every item with the same error; before, every item
was paid for (4 attempts each with a retry policy) with no early stop. Now N items in a row failing with
the same type and message end the chunk with :class:`RepeatedFailureError`; items never started stay
``never_started``; errors whose messages differ per item never stop it.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from airflow_provider_datagen.core import RetryPolicy, run_items, status_of
from airflow_provider_datagen.exceptions import ConfigurationError, DatagenError, RepeatedFailureError
from tests._support.engine import flat_output, make_items, open_log, results_fp, statuses

N = 40


class Unreachable(ConnectionError):
    """Stands for an SDK's connection error: the same message on every item."""


class Calls:
    """A process that counts its calls and raises ``Unreachable`` on the items ``bad`` names."""

    def __init__(self, bad: Any = lambda i: True, message: Any = lambda i: "Connection error.") -> None:
        self.bad = bad
        self.message = message
        self.calls: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, item: dict[str, Any], ctx: Any) -> Any:
        with self._lock:
            self.calls.append(ctx.item_id)
        if self.bad(item["id"]):
            raise Unreachable(self.message(item["id"]))
        return flat_output(item)


def _check_stop(err: RepeatedFailureError, count: int) -> None:
    message = str(err)
    assert isinstance(err, DatagenError)
    assert f"{count} items in a row failed with the same error, Unreachable: Connection error." in message
    assert "no new item started, and the items not yet processed stay pending" in message
    assert "Fix the cause and rerun" in message and "max_repeated_failures or pass None" in message
    assert type(err.__cause__) is Unreachable


@pytest.mark.parametrize("every", [None, 1])
def test_five_same_errors_in_a_row_stop_the_chunk_and_the_rest_never_starts(tmp_path: Any, every: int | None) -> None:
    log = open_log(tmp_path, "stop")
    process = Calls()
    with pytest.raises(RepeatedFailureError) as info:
        run_items(log, make_items(N), process, checkpoint_every=every)
    _check_stop(info.value, 5)
    assert process.calls == ["0", "1", "2", "3", "4"]
    for iid in process.calls:
        (row,) = log.failures(iid)
        assert (row.error_type, row.message) == ("Unreachable", "Connection error.")
    assert log.summary()["pending"] == N  # nothing acknowledged as done: every item is retried or run next time
    # fixed, a rerun retries the failed items and runs the rest
    report = run_items(log, make_items(N), flat_process_ok, epoch=2)
    assert sorted(report.processed, key=int) == [str(i) for i in range(N)]
    assert set(statuses(log).values()) == {"completed"}


def flat_process_ok(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
    return flat_output(item)


def test_the_count_is_after_the_retries_and_configurable(tmp_path: Any) -> None:
    log = open_log(tmp_path, "retried")
    process = Calls()
    policy = RetryPolicy(attempts=4, retry_on=(ConnectionError,), backoff=0.0, jitter=False)
    with pytest.raises(RepeatedFailureError) as info:
        run_items(log, make_items(N), process, retry=policy, max_repeated_failures=2)
    _check_stop(info.value, 2)
    assert process.calls == ["0"] * 4 + ["1"] * 4  # each item's four attempts, then the stop


def test_a_streak_is_broken_by_a_success_or_another_error_and_none_disables_it(tmp_path: Any) -> None:
    # four in a row, then a success, repeatedly: never five in a row
    process = Calls(bad=lambda i: i % 5 != 4)
    report = run_items(open_log(tmp_path, "broken"), make_items(N), process)
    assert len(process.calls) == N and len(report.failed) == N - N // 5
    # the message differs per item (it names the item): never the same error
    process = Calls(message=lambda i: f"item {i} was refused")
    report = run_items(open_log(tmp_path, "differ"), make_items(N), process)
    assert len(process.calls) == N and len(report.failed) == N
    process = Calls()
    report = run_items(open_log(tmp_path, "off"), make_items(N), process, max_repeated_failures=None)
    assert len(process.calls) == N and len(report.failed) == N


def test_a_streak_that_spans_pulls_leaves_no_item_pulled_and_never_started(tmp_path: Any) -> None:
    # items 62.. fail: the streak starts in the first pull (64 items); the next pull holds only the 3 items
    # that can still complete it, so the stop leaves no item pulled (read as running) and never started
    process = Calls(bad=lambda i: i >= 62)
    log = open_log(tmp_path, "span")
    with pytest.raises(RepeatedFailureError):
        run_items(log, make_items(200), process)
    assert len(process.calls) == 67
    summary = status_of(log, make_items(200))
    assert (summary["completed"], summary["running"], summary["never_started"]) == (62, 5, 200 - 67)


def _pulled_never_running(log: Any, invoked: set[str]) -> None:
    """After a clean stop, only the items that ran are ``running`` (failed); the rest the log holds never started."""
    st = statuses(log)
    running = {iid for iid, status in st.items() if status == "running"}
    assert running <= invoked  # no item pulled by the run and never started reads running
    summary = log.summary()
    assert summary["running"] == summary["failed_items"] == len(running)
    assert summary["never_started"] == len(st) - summary["completed"] - len(running) > 0


def test_a_streak_inside_a_pull_releases_the_rest_of_the_pull(tmp_path: Any) -> None:
    # The first pull holds 64 items; items 10.. fail, so the stop comes at item 14, inside that pull.
    # Before, the 49 items pulled after it stayed running (ITEM_CREATED only) and replayed first next
    # run; now the stop releases them (a TERMINAL never_started) and they read never_started.
    process = Calls(bad=lambda i: i >= 10)
    log = open_log(tmp_path, "inside")
    with pytest.raises(RepeatedFailureError):
        run_items(log, make_items(200), process)
    assert len(process.calls) == 15
    _pulled_never_running(log, set(process.calls))
    summary = status_of(log, make_items(200))
    assert (summary["completed"], summary["running"], summary["never_started"]) == (10, 5, 185)
    # the next run pulls them afresh, and ends as an uninterrupted run does
    report = run_items(log, make_items(200), flat_process_ok, epoch=2)
    assert sorted(report.processed, key=int) == [str(i) for i in range(10, 200)]
    fresh = open_log(tmp_path, "fresh")
    run_items(fresh, make_items(200), flat_process_ok)
    assert results_fp(log) == results_fp(fresh)


def test_a_release_reads_the_same_in_both_folds(tmp_path: Any) -> None:
    from airflow_provider_datagen.core.fold import fold_events

    log = open_log(tmp_path, "folds")
    with pytest.raises(RepeatedFailureError):
        run_items(log, make_items(100), Calls(bad=lambda i: i >= 3))
    vectorized = statuses(log)
    reference = {iid: fold_events(iid, log.events(iid)).status.value for iid in vectorized}
    assert reference == vectorized
    assert sum(1 for v in reference.values() if v == "never_started") == 64 - 8  # the first pull's rest


@pytest.mark.parametrize("concurrency", [2, 4])
def test_threads_release_the_queued_and_pulled_items_a_stop_never_starts(tmp_path: Any, concurrency: int) -> None:
    log = open_log(tmp_path, f"release-{concurrency}")
    process = Calls(bad=lambda i: i >= 7)
    with pytest.raises(RepeatedFailureError):
        run_items(log, make_items(N * 5), process, concurrency=concurrency)
    _pulled_never_running(log, set(process.calls))
    run_items(log, make_items(N * 5), flat_process_ok, epoch=2, concurrency=concurrency)
    assert set(statuses(log).values()) == {"completed"}


def test_the_async_driver_releases_the_rest_of_the_pull(tmp_path: Any) -> None:
    calls: list[str] = []

    async def process(item: dict[str, Any], ctx: Any) -> Any:
        calls.append(ctx.item_id)
        await asyncio.sleep(0)
        raise Unreachable("Connection error.")

    log = open_log(tmp_path, "async-release")
    with pytest.raises(RepeatedFailureError):
        run_items(log, make_items(N * 5), process, concurrency=3)
    _pulled_never_running(log, set(calls))


@pytest.mark.parametrize("concurrency", [2, 4])
def test_threads_stop_submitting_and_acknowledge_what_runs(tmp_path: Any, concurrency: int) -> None:
    log = open_log(tmp_path, f"threads-{concurrency}")
    process = Calls()
    with pytest.raises(RepeatedFailureError) as info:
        run_items(log, make_items(N), process, concurrency=concurrency)
    _check_stop(info.value, 5)
    invoked = set(process.calls)
    # a thread starts its next item only once its failure is acknowledged: at most the ones in flight ran on
    assert 5 <= len(invoked) <= 5 - 1 + concurrency
    assert all(len(log.failures(iid)) == 1 for iid in invoked)


def test_the_async_driver_stops_too(tmp_path: Any) -> None:
    calls: list[str] = []

    async def process(item: dict[str, Any], ctx: Any) -> Any:
        calls.append(ctx.item_id)
        await asyncio.sleep(0)
        raise Unreachable("Connection error.")

    log = open_log(tmp_path, "async")
    with pytest.raises(RepeatedFailureError) as info:
        run_items(log, make_items(N), process, concurrency=3)
    _check_stop(info.value, 5)
    assert 5 <= len(calls) <= 5 - 1 + 3


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "5"])
def test_a_bad_max_repeated_failures_is_refused(tmp_path: Any, bad: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"max_repeated_failures=.* is not an int >= 1 or None"):
        run_items(open_log(tmp_path, "bad"), make_items(2), Calls(), max_repeated_failures=bad)
