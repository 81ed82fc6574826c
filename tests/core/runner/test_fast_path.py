"""The one-step short path of the runner writes exactly what the general driver writes.

``run_items`` drives a fresh item of a one-step pipeline (a plain process function) through
``_Runner.run_fresh_leaf`` instead of the general frame-tracking driver. Hypothesis draws a behaviour
per item (return fields or None, ``ctx.set``/``ctx.append``, filters, errors of every kind, blobs,
idempotency keys); both paths run on real Lance logs and must leave identical events (ids included,
so sequence numbers, fingerprints and coordinates agree) and identical reports.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_datagen.core import run_items
from airflow_provider_datagen.core.runner.driver import Runner as _Runner
from airflow_provider_datagen.exceptions import ProcessContractError
from tests._support.engine import open_log, raw_events
from tests._support.profiles import examples

BEHAVIOURS = [
    "none",
    "dict",
    "set",
    "append",
    "set_and_return",
    "conflict",
    "filter",
    "filter_none",
    "filter_bytes",
    "raise",
    "bad_return",
    "bad_name",
    "blob",
    "big",
    "idem",
    "view",
    "nan",
]


def process(item: dict[str, Any], ctx: Any) -> Any:
    b, i = item["b"], item["n"]
    if b == "none":
        return None
    if b == "dict":
        return {"out": i, "nested": {"k": [i, str(i)]}}
    if b == "set":
        ctx.set("a", i)
        return None
    if b == "append":
        ctx.append("l", i)
        ctx.append("l", {"v": i})
        return None
    if b == "set_and_return":
        ctx.set("a", 1)
        return {"b": 2, "a2": 3}
    if b == "conflict":
        ctx.append("x", 1)
        return {"x": 2}
    if b == "filter":
        ctx.set("partial", i)
        ctx.filter({"why": "short", "n": i})
        return None
    if b == "filter_none":
        ctx.filter()
        return {"kept": True}
    if b == "filter_bytes":
        ctx.filter(b"not json")
    if b == "raise":
        raise ValueError(f"boom {i}")
    if b == "bad_return":
        return [1, 2]
    if b == "bad_name":
        return {"": 1}
    if b == "blob":
        return {"img": bytes(range(i % 7 + 1)) * 10}
    if b == "big":
        return {"t": "x" * 70_000}
    if b == "idem":
        return {"k1": ctx.idempotency_key("send"), "k2": ctx.idempotency_key("send")}
    if b == "view":
        return {"seen": dict(ctx.fields), "attempt": ctx.attempt, "fp": ctx.input_fingerprint, "key": ctx.key}
    if b == "nan":
        return {"f": float("nan")}
    raise AssertionError(b)


def _run(root: Any, name: str, items: list[dict[str, Any]], every: int | None) -> tuple[Any, Any]:
    log = open_log(root, name)
    try:
        report: Any = _summary(run_items(log, items, process, checkpoint_every=every))
    except ProcessContractError as exc:  # three contract errors in a row stop both paths alike
        report = ("stopped", str(exc))
    events = raw_events(log).sort_by([("item_id", "ascending"), ("item_seq", "ascending")])
    # A traceback names the runner's frames, which differ by path; the error it ends with may not.
    last_lines = [None if t is None else t.rstrip().splitlines()[-1] for t in events["error_traceback"].to_pylist()]
    events = events.drop_columns(["created_at", "error_traceback"]).append_column("error_line", pa.array(last_lines))
    return events, report


def _summary(report: Any) -> tuple[Any, ...]:
    return (
        report.processed,
        report.failed,
        report.errors,
        report.skipped,
        report.replayed,
        report.invocations,
        report.commits,
        report.events,
    )


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    behaviours=st.lists(st.sampled_from(BEHAVIOURS), min_size=1, max_size=12),
    every=st.sampled_from([None, 1, 3]),
)
def test_the_one_step_path_writes_what_the_general_driver_writes(
    tmp_path_factory: pytest.TempPathFactory, behaviours: list[str], every: int | None
) -> None:
    root = tmp_path_factory.mktemp("fast")
    items = [{"id": f"k{i}", "n": i, "b": b} for i, b in enumerate(behaviours)]
    fast_events, fast_report = _run(root, "fast", items, every)
    with pytest.MonkeyPatch.context() as mp:
        calls: list[str] = []
        general = _Runner.run_root

        def via_general(self: _Runner, src: Any, replayed: bool) -> None:
            calls.append(src.item_id)
            general(self, src, None, replayed)

        mp.setattr(_Runner, "run_fresh_leaf", via_general)
        slow_events, slow_report = _run(root, "general", items, every)
    ids = [it["id"] for it in items]
    if fast_report[0] == "stopped":
        assert calls and calls == ids[: len(calls)]  # the general driver ran every item up to the stop
    else:
        assert calls == ids  # the general driver really ran every item
    assert fast_events.equals(slow_events), (behaviours, every)
    assert fast_report == slow_report


def test_the_short_path_is_taken_for_a_process_function(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    taken: list[str] = []
    short = _Runner.run_fresh_leaf

    def spy(self: _Runner, src: Any, replayed: bool) -> None:
        taken.append(src.item_id)
        short(self, src, replayed)

    monkeypatch.setattr(_Runner, "run_fresh_leaf", spy)
    items = [{"id": f"k{i}", "n": i, "b": "dict"} for i in range(5)]
    run_items(open_log(tmp_path, "spy"), items, process)
    assert taken == [it["id"] for it in items]
