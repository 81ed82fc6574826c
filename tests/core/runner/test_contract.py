"""A process that breaks its contract on 3 consecutive items ends the chunk instead of being paid for on every item.

The contract: return a dict of field name -> JSON-serializable value (or None), and write fields through
``ctx.set``/``ctx.append`` under the same rules. One broken item fails alone, as any error of the user's
code; three in a row raise :class:`ProcessContractError` and nothing more is invoked.
"""

from __future__ import annotations

import re
import threading
from typing import Any

import pytest

from airflow_provider_datagen.core import MapReduce, Sequence, Step, run_items
from airflow_provider_datagen.core.runner.contract import CONTRACT_STREAK
from airflow_provider_datagen.exceptions import (
    DatagenError,
    InvalidValueError,
    ItemFailedError,
    ProcessContractError,
    ProcessError,
)
from tests._support.engine import flat_output, make_items, open_log, statuses

N = 20
FIX = "return a dict of field name -> JSON-serializable value, or None"

# (the process's misbehaviour, the FAILED row's error type, what its message says was wrong)
BROKEN = {
    "returns-a-list": (lambda item, ctx: [1, 2], "ProcessError", r"step 'process' returned a list"),
    "returns-a-str": (lambda item, ctx: "text", "ProcessError", r"returned a str"),
    "int-field-name": (lambda item, ctx: {7: "x"}, "ProcessError", r"the field name '7' is not usable"),
    "empty-field-name": (lambda item, ctx: {"": 1}, "ProcessError", r"the field name '' is not usable"),
    "nul-field-name": (lambda item, ctx: {"a\x00b": 1}, "ProcessError", r"without NUL"),
    "long-field-name": (lambda item, ctx: {"f" * 257: 1}, "ProcessError", r"at most 256 characters"),
    "set-value": (lambda item, ctx: {"x": {1, 2}}, "InvalidValueError", r"field 'x' returned by step 'process'"),
    "object-value": (lambda item, ctx: {"x": object()}, "InvalidValueError", r"not JSON-serializable"),
    "nan-value": (lambda item, ctx: {"x": float("nan")}, "InvalidValueError", r"is nan, which JSON cannot"),
    "ctx-set-bad-value": (lambda item, ctx: ctx.set("x", object()), "InvalidValueError", r"field 'x' of item"),
    "ctx-append-bad-name": (lambda item, ctx: ctx.append("", 1), "ProcessError", r"ctx.append got the field name"),
}


class Counting:
    """A process (or step) function that counts its calls and misbehaves on the items ``bad`` names."""

    def __init__(self, misbehave: Any, bad: Any = lambda i: True) -> None:
        self.misbehave = misbehave
        self.bad = bad
        self.calls: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, item: dict[str, Any], ctx: Any) -> Any:
        with self._lock:
            self.calls.append(ctx.item_id)
        if self.bad(item["id"]):
            return self.misbehave(item, ctx)
        return flat_output(item)


def fixed(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
    return flat_output(item)


@pytest.mark.parametrize("kind", list(BROKEN))
def test_three_consecutive_contract_errors_end_the_chunk_and_name_the_function_item_and_fix(
    tmp_path: Any, kind: str
) -> None:
    misbehave, error_type, wrong = BROKEN[kind]
    log = open_log(tmp_path, kind)
    process = Counting(misbehave)
    with pytest.raises(ProcessContractError) as info:
        run_items(log, make_items(N), process, checkpoint_every=1)
    err = info.value
    assert isinstance(err, ProcessError) and isinstance(err, DatagenError)
    message = str(err)
    assert f"the process function {Counting.__module__}.Counting" in message
    assert "on 3 consecutive items" in message and "item '2'" in message
    assert re.search(wrong, message), message
    assert FIX in message and "rerun" in message
    assert type(err.__cause__).__name__ == error_type  # the third item's own error is the cause
    # only the three items that broke the contract were invoked; they keep their FAILED rows
    assert process.calls == ["0", "1", "2"]
    for iid in ("0", "1", "2"):
        (rec,) = log.failures(iid)
        assert rec.error_type == error_type and re.search(wrong, rec.message), rec.message
    # every item is still pending: the fixed function processes all of them, the failed ones included
    report = run_items(log, make_items(N), fixed, epoch=2)
    assert sorted(report.processed, key=int) == [str(i) for i in range(N)]
    assert set(statuses(log).values()) == {"completed"}


def test_ordinary_exceptions_on_every_item_keep_failing_items_one_by_one(tmp_path: Any) -> None:
    """An error raised by the user's code is the item's, even when it is one of ours: the run goes on."""

    def raises(item: dict[str, Any], ctx: Any) -> None:
        if item["id"] % 2:
            raise ValueError(f"model refused {item['id']}")
        raise InvalidValueError(f"the model's own check refused {item['id']}")

    log = open_log(tmp_path, "ordinary")
    report = run_items(log, make_items(N), Counting(raises))
    assert sorted(report.failed, key=int) == [str(i) for i in range(N)] and report.processed == []


@pytest.mark.parametrize(
    "pattern",
    [
        "BBgBBgBBgBBgBBgBBgBB",  # a good item between resets the count
        "BBvBBvBBvBBvBBvBBvBB",  # so does an item failing for another reason
    ],
)
def test_only_consecutive_contract_errors_count(tmp_path: Any, pattern: str) -> None:
    def misbehave(item: dict[str, Any], ctx: Any) -> Any:
        if pattern[item["id"]] == "v":
            raise ValueError("not a contract error")
        return [item["id"]]

    process = Counting(misbehave, bad=lambda i: pattern[i] != "g")
    report = run_items(open_log(tmp_path, "reset"), make_items(N), process)
    assert len(process.calls) == N
    assert sorted(report.failed, key=int) == [str(i) for i, c in enumerate(pattern) if c != "g"]
    # three in a row after good items stop at the third
    process = Counting(lambda item, ctx: [1], bad=lambda i: i in (3, 4, 5))
    with pytest.raises(ProcessContractError, match=r"item '5'"):
        run_items(open_log(tmp_path, "three"), make_items(N), process)
    assert process.calls == [str(i) for i in range(6)]


def test_fail_fast_still_stops_at_the_first_broken_item(tmp_path: Any) -> None:
    with pytest.raises(ItemFailedError, match=r"item '0' failed with ProcessError.*returned a list"):
        run_items(open_log(tmp_path, "ff"), make_items(N), Counting(lambda item, ctx: [1]), fail_fast=True)


def test_a_step_pipeline_names_the_step_and_its_function(tmp_path: Any) -> None:
    def summarize(item: dict[str, Any], ctx: Any) -> Any:
        return ["not", "a", "dict"]

    pipeline = Sequence("qa", [Step("prompt", fixed), Step("summarize", summarize)])
    log = open_log(tmp_path, "steps")
    with pytest.raises(ProcessContractError) as info:
        run_items(log, make_items(N), pipeline)
    qualname = f"{summarize.__module__}.{summarize.__qualname__}"
    assert str(info.value).startswith(f"step 'summarize' ({qualname}) broke the process contract on 3 consecutive")
    assert "item '2': step 'summarize' returned a list" in str(info.value)
    assert [r.step for iid in ("0", "1", "2") for r in log.failures(iid)] == ["summarize"] * 3
    # item 3 was pulled but never started: the stop released it (issue 24), so it is not left running
    assert log.item_state("3").status.value == "never_started" and not log.item_state("3").completed_steps


def test_a_fanout_reduce_is_held_to_the_contract_too(tmp_path: Any) -> None:
    def reduce(children: list[dict[str, Any]], ctx: Any) -> Any:
        return len(children)

    leaf = Step("leaf", lambda item, ctx: {"n": item["n"]})
    pipeline = MapReduce("fan", over=lambda item, ctx: [{"n": 1}, {"n": 2}], map=leaf, reduce=reduce)
    with pytest.raises(ProcessContractError, match=r"^step 'fan' \(.*reduce\) broke the process contract"):
        run_items(open_log(tmp_path, "fan"), make_items(N), pipeline)


@pytest.mark.parametrize("concurrency", [2, 4])
def test_under_concurrency_the_run_stops_submitting_and_acknowledges_what_runs(tmp_path: Any, concurrency: int) -> None:
    log = open_log(tmp_path, f"threads-{concurrency}")
    process = Counting(lambda item, ctx: [1])
    with pytest.raises(ProcessContractError, match="on 3 consecutive items"):
        run_items(log, make_items(N), process, concurrency=concurrency)
    invoked = set(process.calls)
    # nothing is submitted after the third error is acknowledged: at most the items then in flight ran
    assert CONTRACT_STREAK <= len(invoked) <= CONTRACT_STREAK - 1 + concurrency
    assert all(len(log.failures(iid)) == 1 for iid in invoked)  # each invoked item kept its FAILED row
    again = Counting(lambda item, ctx: None, bad=lambda i: False)
    report = run_items(log, make_items(N), again, epoch=2, concurrency=concurrency)
    assert sorted(again.calls, key=int) == [str(i) for i in range(N)]  # the rest stayed pending
    assert set(report.replayed) >= invoked
