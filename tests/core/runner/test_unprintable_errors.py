"""An error whose ``__str__``/``__repr__`` is broken fails only its item, in every driver (issue 24, point 4).

An SDK error that formats a malformed response body may raise from ``__str__`` or return something that
is not a string. Before, a threaded run hung (its worker thread died) and a sequential or async run ended
with the formatting error, so every rerun paid again for the items before it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from airflow_provider_datagen.core import RetryPolicy, run_items
from airflow_provider_datagen.core.error_text import describe_error, error_message, error_traceback
from tests._support.engine import flat_output, make_items, open_log, statuses

N = 12
BAD = {3, 7}


class StrRaises(ValueError):
    def __str__(self) -> str:
        raise RuntimeError("the body could not be decoded")

    def __repr__(self) -> str:
        raise RuntimeError("no repr either")


class StrNotAString(ValueError):
    def __str__(self) -> Any:
        return 42

    def __repr__(self) -> Any:
        return None


HOSTILE = {"str-raises": StrRaises, "str-returns-int": StrNotAString}


def _process(error: type[BaseException]) -> Any:
    def process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        if item["id"] in BAD:
            raise error()
        return flat_output(item)

    return process


def _async(error: type[BaseException]) -> Any:
    async def process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        await asyncio.sleep(0)
        if item["id"] in BAD:
            raise error()
        return flat_output(item)

    return process


def _check(log: Any, report: Any, error: type[BaseException]) -> None:
    name = error.__name__
    failed = sorted(str(i) for i in BAD)
    assert sorted(report.failed) == failed
    assert sorted(report.processed, key=int) == [str(i) for i in range(N) if i not in BAD]
    assert report.errors == {iid: f"{name}: <unprintable {name}>" for iid in failed}
    for iid in failed:
        (row,) = log.failures(iid)
        assert (row.error_type, row.message) == (name, f"<unprintable {name}>")
    done = statuses(log)
    assert {iid: done[iid] for iid in failed} == {iid: "running" for iid in failed}  # failed: pending
    assert sum(v == "completed" for v in done.values()) == N - len(BAD)


@pytest.mark.parametrize("kind", list(HOSTILE))
@pytest.mark.parametrize(
    "mode",
    [
        {"concurrency": 1},
        {"concurrency": 4},
        {"concurrency": 1, "retry": RetryPolicy(attempts=2, retry_on=(KeyError,))},
        {"concurrency": 4, "retry": RetryPolicy(attempts=2, retry_on=(KeyError,))},
    ],
    ids=["sync", "threads", "sync-guarded", "threads-guarded"],
)
def test_an_unprintable_error_fails_only_its_item(tmp_path: Any, kind: str, mode: dict[str, Any]) -> None:
    error = HOSTILE[kind]
    log = open_log(tmp_path, kind)
    report = run_items(log, make_items(N), _process(error), **mode)
    _check(log, report, error)


@pytest.mark.parametrize("kind", list(HOSTILE))
@pytest.mark.parametrize("concurrency", [1, 4])
def test_an_unprintable_error_fails_only_its_item_in_the_async_driver(
    tmp_path: Any, kind: str, concurrency: int
) -> None:
    error = HOSTILE[kind]
    log = open_log(tmp_path, kind)
    report = run_items(log, make_items(N), _async(error), concurrency=concurrency)
    _check(log, report, error)


def test_a_retried_unprintable_error_is_recorded_as_a_transient_row(tmp_path: Any) -> None:
    calls: list[int] = []

    def process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        calls.append(ctx.attempt)
        if ctx.attempt == 1:
            raise StrRaises()
        return flat_output(item)

    log = open_log(tmp_path, "retried")
    policy = RetryPolicy(attempts=2, retry_on=(ValueError,), backoff=0.0, jitter=False)
    report = run_items(log, make_items(1), process, retry=policy)
    assert report.processed == ["0"] and calls == [1, 2]
    assert set(statuses(log).values()) == {"completed"}


def test_the_formatter_never_raises() -> None:
    try:
        raise StrRaises()
    except StrRaises as exc:
        caught = exc
    assert error_message(caught) == "<unprintable StrRaises>"
    assert describe_error(StrNotAString()) == "StrNotAString: <unprintable StrNotAString>"
    assert describe_error(ValueError("fine")) == "ValueError: fine"
    text = error_traceback(caught)
    assert text is not None and "test_the_formatter_never_raises" in text and "StrRaises" in text
    assert error_traceback(ValueError("never raised")) is None
