"""The resume engine's behaviour (issue 3) on real Lance logs: inbox, acks, order, failures, bad input.

Each test names the behaviour it pins. Crashes are simulated in-process by :class:`Crash` (a
BaseException raised from the user function, listed in ``reraise``) or by :func:`crash_at_commit`
(every commit from the k-th on dies before writing, as a killed process would leave the log).
"""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_datagen.core import (
    ItemStatus,
    Loop,
    MapReduce,
    Router,
    Sequence,
    Step,
    export_results,
    plan_resume,
    run_items,
)
from airflow_provider_datagen.core.schema import EventType
from airflow_provider_datagen.exceptions import (
    ConfigurationError,
    DatagenError,
    InvalidEventError,
    InvalidItemError,
    InvalidPipelineError,
    InvalidValueError,
    ItemFailedError,
    ProcessError,
    ProcessInterrupted,
)
from tests._support.engine import (
    Crash,
    Recorder,
    crash_at_commit,
    flat_output,
    flat_process,
    make_items,
    open_log,
    raw_events,
    statuses,
)


@pytest.fixture
def log(tmp_path: Any) -> Any:
    return open_log(tmp_path, "main")


def crash_after_calls(n: int, recorder: Recorder | None = None) -> Any:
    """A deterministic process that dies (Crash) at its (n+1)-th call, before doing anything."""
    calls = {"n": 0}

    def process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        if calls["n"] >= n:
            raise Crash(f"crash at call {n + 1}")
        calls["n"] += 1
        if recorder is not None:
            recorder(ctx)
        return flat_output(item)

    return process


# --- the inbox ------------------------------------------------------------------------------------------


def test_item_created_is_committed_before_the_process_function_runs(log: Any) -> None:
    items = make_items(70)
    seen: list[tuple[str, str, int]] = []

    def process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        # Read the durable log from inside the user function: the item must already be in the inbox.
        st = log.item_state(ctx.item_id)
        known = -1
        if item["id"] in (0, 63, 64, 69):
            summary = log.summary()
            known = summary["running"] + summary["completed"]
        seen.append((ctx.item_id, st.status.value, known))
        assert st.status is ItemStatus.RUNNING
        assert st.input_fingerprint == ctx.input_fingerprint
        return flat_output(item)

    report = run_items(log, items, process, checkpoint_every=10, checkpoint_interval=3600)
    assert report.processed == [str(i) for i in range(70)]
    assert all(status == "running" for _, status, _ in seen)
    # The first pull is one commit of 64 ITEM_CREATED rows (max(checkpoint_every, 64)); the rest follow
    # in a second pull, so while item 0 runs exactly 64 items are known to the log.
    assert seen[0][2] == 64
    assert seen[63][2] == 64
    assert seen[64][2] == 70


def test_pull_is_one_commit_of_item_created_rows(log: Any) -> None:
    run_items(log, make_items(5), flat_process(), checkpoint_every=5, checkpoint_interval=3600)
    ev = raw_events(log, ["item_id", "event_type", "item_seq"])
    created = [r for r in ev.to_pylist() if r["event_type"] == EventType.ITEM_CREATED.value]
    assert sorted(r["item_id"] for r in created) == [str(i) for i in range(5)]
    assert all(r["item_seq"] == 0 for r in created)
    assert log.version == 2  # one pull, one ack of all five


# --- acks and group commit ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "every", "expected_versions"),
    [
        (10, 1, 1 + 10),  # one pull, one ack per item (the step and its TERMINAL in one commit)
        (10, 3, 1 + 4),  # acks of 3, 3, 3, 1
        (10, 10, 1 + 1),
        (10, None, 1 + 1),  # group commit: 512 items or 2 s
        (130, 64, 3 + 3),  # pulls of 64, 64, 2; an ack after each group
        (130, 100, 2 + 2),  # pulls of 100 and 30
    ],
)
def test_acks_are_grouped_by_checkpoint_every(log: Any, n: int, every: int | None, expected_versions: int) -> None:
    report = run_items(log, make_items(n), flat_process(), checkpoint_every=every, checkpoint_interval=3600)
    assert log.version == expected_versions
    assert report.commits == expected_versions
    assert statuses(log) == {str(i): "completed" for i in range(n)}


@pytest.mark.parametrize("every", [1, 2, 3, 5])
def test_a_crash_loses_only_unacknowledged_items(log: Any, every: int) -> None:
    """While item i runs, exactly the items of the groups before it are acked (completed in the log)."""
    observed: dict[int, int] = {}

    def process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        observed[item["id"]] = log.summary()["completed"]
        return flat_output(item)

    run_items(log, make_items(11), process, checkpoint_every=every, checkpoint_interval=3600)
    assert observed == {i: (i // every) * every for i in range(11)}


@pytest.mark.parametrize("every", [1, 3, None])
@pytest.mark.parametrize("crash_after", [0, 4, 7])
def test_resume_after_crash_redoes_at_most_the_unacked_group(log: Any, every: int | None, crash_after: int) -> None:
    items = make_items(10)
    first = Recorder()
    with pytest.raises(Crash):
        run_items(log, items, crash_after_calls(crash_after, first), checkpoint_every=every, reraise=(Crash,))
    acked = [i for i, s in statuses(log).items() if s == "completed"]
    group = every or 512
    assert len(first.calls) - len(acked) < group or every is None
    second = Recorder()
    report = run_items(log, items, flat_process(second), checkpoint_every=every, epoch=2)
    assert set(second.calls).isdisjoint(acked)  # an acked item is never invoked again
    assert sorted(second.calls, key=int) == sorted(set(map(str, range(10))) - set(acked), key=int)
    assert sorted(report.skipped) == sorted(acked)
    assert statuses(log) == {str(i): "completed" for i in range(10)}


# --- resume order ---------------------------------------------------------------------------------------


def test_resume_order_is_inbox_then_restarts_then_fresh(log: Any) -> None:
    items = make_items(12)
    # Items 0..5 acked, 6..9 pulled and left in the inbox by a crash; 10, 11 never seen.
    with pytest.raises(Crash):
        run_items(log, items[:10], crash_after_calls(6), checkpoint_every=1, reraise=(Crash,))
    # Item 2 edited after it was acked.
    edited = [dict(it, text="edited") if it["id"] == 2 else it for it in items]
    plan = plan_resume(log, edited)
    assert plan.replay == ["6", "7", "8", "9"]
    assert plan.invalidated == ["2"]
    assert plan.fresh == ["10", "11"]
    assert plan.skip == ["0", "1", "3", "4", "5"]
    rec = Recorder()
    report = run_items(log, list(reversed(edited)), flat_process(rec), checkpoint_every=1, epoch=2)
    # The inbox drains first (in source order), then the edited item, then fresh pulls.
    assert rec.calls == ["9", "8", "7", "6", "2", "11", "10"]
    assert report.replayed == ["9", "8", "7", "6"]
    assert sorted(report.skipped) == ["0", "1", "3", "4", "5"]


def test_completed_and_filtered_items_are_never_invoked_again(log: Any) -> None:
    def process(item: dict[str, Any], ctx: Any) -> dict[str, Any] | None:
        if item["id"] % 3 == 0:
            ctx.filter(reason={"why": "multiple of three"})
            return None
        return flat_output(item)

    items = make_items(9)
    run_items(log, items, process)
    assert statuses(log) == {str(i): ("filtered" if i % 3 == 0 else "completed") for i in range(9)}
    assert log.item_state("3").filter_reason == {"why": "multiple of three"}
    for attempt in range(2):
        rec = Recorder()
        report = run_items(log, list(reversed(items)), flat_process(rec), epoch=2 + attempt, processor_version="v9")
        assert rec.calls == []
        assert report.invocations == 0
        assert sorted(report.skipped) == sorted(str(i) for i in range(9))


# --- failures -------------------------------------------------------------------------------------------


def failing_on(bad: set[int], recorder: Recorder | None = None) -> Any:
    def process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        if recorder is not None:
            recorder(ctx)
        if item["id"] in bad:
            raise ValueError(f"cannot handle {item['id']}")
        return flat_output(item)

    return process


def test_a_failing_item_writes_failed_stays_running_and_the_rest_go_on(log: Any) -> None:
    report = run_items(log, make_items(6), failing_on({2, 4}), checkpoint_every=1)
    assert report.failed == ["2", "4"]
    assert report.processed == ["0", "1", "3", "5"]
    assert "ValueError: cannot handle 2" in report.errors["2"]
    st = statuses(log)
    assert st["2"] == st["4"] == "running"
    assert all(st[i] == "completed" for i in "0135")
    (rec,) = log.failures("2")
    assert rec.error_type == "ValueError"
    assert rec.message == "cannot handle 2"
    assert rec.step == "process"
    assert rec.traceback is not None and "ValueError: cannot handle 2" in rec.traceback
    assert "in process" in rec.traceback  # the user's frame is in the traceback
    assert log.item_state("2").failures == 1


def test_failed_items_are_retried_by_the_next_run_with_a_higher_attempt(log: Any) -> None:
    items = make_items(6)
    run_items(log, items, failing_on({2, 4}))
    plan = plan_resume(log, items)
    assert plan.replay == ["2", "4"] and plan.failed == ["2", "4"]
    attempts: dict[str, int] = {}

    def process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        attempts[ctx.item_id] = ctx.attempt
        return flat_output(item)

    report = run_items(log, items, process, epoch=2)
    assert attempts == {"2": 2, "4": 2}
    assert report.replayed == ["2", "4"] and report.failed == []
    assert statuses(log) == {str(i): "completed" for i in range(6)}
    assert len(log.failures("2")) == 1  # the failure stays in the history


def test_attempt_counts_failures_of_the_current_generation(log: Any) -> None:
    attempts: list[int] = []

    def flaky(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        attempts.append(ctx.attempt)
        if ctx.attempt < 3:
            raise RuntimeError("transient")
        return {"ok": True}

    for epoch in (1, 2, 3):
        run_items(log, [{"id": "a"}], flaky, epoch=epoch)
    assert attempts == [1, 2, 3]
    assert statuses(log) == {"a": "completed"}
    # An edited input is a new generation: attempts start again at 1.
    run_items(log, [{"id": "a", "v": 2}], flaky, epoch=4)
    assert attempts[-1] == 1


def test_fail_fast_stops_at_the_first_failure_and_keeps_acked_work(log: Any) -> None:
    rec = Recorder()
    with pytest.raises(ItemFailedError, match=r"item '3' failed with ValueError: cannot handle 3") as info:
        run_items(log, make_items(8), failing_on({3, 6}, rec), checkpoint_every=1, fail_fast=True)
    assert isinstance(info.value, DatagenError)
    assert rec.calls == ["0", "1", "2", "3"]
    st = statuses(log)
    assert [st[str(i)] for i in range(4)] == ["completed", "completed", "completed", "running"]
    assert len(log.failures("3")) == 1  # the FAILED row was committed before stopping
    rec2 = Recorder()
    run_items(log, make_items(8), failing_on(set(), rec2), fail_fast=True, epoch=2)
    assert rec2.calls == ["3", "4", "5", "6", "7"]  # the failed item first (inbox), then the rest


def test_keyboard_interrupt_ends_the_run_and_keeps_acked_items(log: Any) -> None:
    def process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        if item["id"] == 3:
            raise KeyboardInterrupt
        return flat_output(item)

    with pytest.raises(ProcessInterrupted, match="'3'"):
        run_items(log, make_items(6), process, checkpoint_every=1)
    st = statuses(log)
    assert [st[str(i)] for i in range(3)] == ["completed"] * 3
    assert {st[str(i)] for i in range(3, 6)} == {"running"}


# --- processor version ----------------------------------------------------------------------------------


def test_a_cursor_of_another_processor_version_is_demoted_to_the_first_step(log: Any) -> None:
    calls: list[tuple[str, str]] = []

    def pipeline(version: str, crash_in_c: bool) -> Sequence:
        def a(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
            calls.append(("a", version))
            out = {"a": f"{version}:{item['id']}"}
            if version == "v1":
                out["only_v1"] = True
            return out

        def b(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
            calls.append(("b", version))
            return {"b": ctx.fields["a"] + "+b"}

        def c(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
            if crash_in_c:
                raise Crash
            calls.append(("c", version))
            return {"c": ctx.fields["b"] + "+c"}

        return Sequence("s", [Step("a", a), Step("b", b), Step("c", c)])

    with pytest.raises(Crash):
        run_items(log, [{"id": 1}], pipeline("v1", True), processor_version="v1", checkpoint_every=1, reraise=(Crash,))
    assert [c.step for c in log.item_state("1").completed_steps] == ["a", "b"]
    plan = plan_resume(log, [{"id": 1}], processor_version="v2")
    assert plan.demoted == ["1"] and plan.replay == []
    calls.clear()
    report = run_items(log, [{"id": 1}], pipeline("v2", False), processor_version="v2", epoch=2)
    assert calls == [("a", "v2"), ("b", "v2"), ("c", "v2")]  # from the first step, never from the stale cursor
    assert report.replayed == ["1"]
    st = log.item_state("1")
    assert st.fields == {"a": "v2:1", "b": "v2:1+b", "c": "v2:1+b+c"}  # nothing of the v1 attempt
    assert {c.processor_version for c in st.completed_steps} == {"v2"}
    assert st.processor_version == "v2"


def versioned_process(version: str, shape: str, calls: list[tuple[str, str]]) -> Any:
    """A process (one leaf) or a two-step pipeline whose outputs name ``version``; v1 writes one more field."""

    def gen(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        calls.append((ctx.item_id, version))
        out: dict[str, Any] = {"answer": f"{version}:{item['text']}"}
        if version == "v1":
            out["only_v1"] = True
        return out

    if shape == "leaf":
        return gen
    return Sequence("s", [Step("gen", gen), Step("judge", lambda item, ctx: {"judged": ctx.fields["answer"]})])


@pytest.mark.parametrize(("shape", "concurrency"), [("leaf", 1), ("steps", 1), ("leaf", 4), ("steps", 4)])
def test_other_version_regenerates_every_completed_item_once(
    log: Any, tmp_path: Any, shape: str, concurrency: int
) -> None:
    items = make_items(8)
    calls: list[tuple[str, str]] = []
    run_items(log, items, versioned_process("v1", shape, calls), processor_version="v1")
    v1_events = {iid: log.events(iid) for iid in map(str, range(8))}
    calls.clear()
    # the default keeps them
    kept = run_items(log, items, versioned_process("v2", shape, calls), processor_version="v2", epoch=2)
    assert calls == [] and len(kept.skipped) == 8
    report = run_items(
        log,
        items,
        versioned_process("v2", shape, calls),
        processor_version="v2",
        epoch=3,
        concurrency=concurrency,
        redo_completed="other_version",
    )
    assert sorted(calls) == [(str(i), "v2") for i in range(8)]  # each item re-invoked exactly once
    assert sorted(report.processed) == sorted(report.plan.demoted) == [str(i) for i in range(8)]
    for i, item in enumerate(items):
        st = log.item_state(str(i))
        assert st.status is ItemStatus.COMPLETED and st.processor_version == "v2"
        assert "only_v1" not in st.fields  # the new generation starts clean
        assert st.fields["answer"] == f"v2:{item['text']}"
        history = log.events(str(i))
        assert history[: len(v1_events[str(i)])] == v1_events[str(i)]  # the v1 generation stays in history
        created = [e for e in history if e.event_type is EventType.ITEM_CREATED]
        assert [e.processor_version for e in created] == ["v1", "v2"]
        assert {e.input_fingerprint for e in created} == {st.input_fingerprint}  # under the same input
    result = export_results(log, str(tmp_path / "out.lance"))
    from tests._support.engine import export_rows

    rows = export_rows(tmp_path / "out.lance")
    assert result["rows"] == 8 and all("v2:" in repr(r) and "v1:" not in repr(r) for r in rows)
    assert log.summary()["completed_by_version"] == {"v2": 8}
    calls.clear()
    v2 = versioned_process("v2", shape, calls)
    again = run_items(log, items, v2, processor_version="v2", epoch=4, redo_completed="other_version")
    assert calls == [] and len(again.skipped) == 8  # done under the current version: skipped


def test_other_version_reruns_the_fanout_children_of_a_regenerated_item(log: Any) -> None:
    calls: list[tuple[str, str]] = []

    def pipe(version: str) -> MapReduce:
        def leaf(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
            calls.append((ctx.item_id, version))
            return {"part": f"{version}:{item['v']}"}

        return MapReduce(
            "mr",
            over=lambda item, ctx: [{"v": v} for v in range(2)],
            map=Step("leaf", leaf),
            reduce=lambda children, ctx: {"parts": [c["part"] for c in children]},
        )

    run_items(log, make_items(2), pipe("v1"), processor_version="v1")
    calls.clear()
    run_items(log, make_items(2), pipe("v2"), processor_version="v2", epoch=2, redo_completed="other_version")
    assert sorted(calls) == [(f"{i}/mr:{c}", "v2") for i in range(2) for c in range(2)]
    assert log.item_state("1").fields == {"parts": ["v2:0", "v2:1"]}
    summary = log.summary()
    assert (summary["completed_by_version"], summary["children"]) == ({"v2": 2}, 4)  # roots only


def test_a_bad_redo_completed_is_refused_before_anything_is_written(log: Any) -> None:
    with pytest.raises(
        ConfigurationError,
        match=r"^run_items: redo_completed='v2' is not one of 'never', 'other_version'; pass 'never' .* or "
        r"'other_version'",
    ):
        run_items(log, make_items(2), flat_process(), redo_completed="v2")
    assert log.version == 0


def test_same_processor_version_resumes_from_the_cursor(log: Any) -> None:
    calls: list[str] = []

    def step(name: str, crash: bool = False) -> Step:
        def fn(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
            if crash and ctx.attempt == 1 and not calls.count("resume"):
                raise Crash
            calls.append(name)
            return {name: len(ctx.fields)}

        return Step(name, fn)

    pipe = Sequence("s", [step("a"), step("b"), step("c", crash=True)])
    with pytest.raises(Crash):
        run_items(log, [{"id": 1}], pipe, checkpoint_every=1, reraise=(Crash,))
    calls.append("resume")
    run_items(log, [{"id": 1}], pipe, epoch=2)
    assert calls == ["a", "b", "resume", "c"]
    assert log.item_state("1").fields == {"a": 0, "b": 1, "c": 2}


# --- emissions ------------------------------------------------------------------------------------------


def test_idempotency_key_is_stable_across_replays_and_distinct_per_emission(log: Any) -> None:
    keys: list[tuple[int, str, str, str]] = []

    def process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        k1, k2, other = ctx.idempotency_key("mail"), ctx.idempotency_key("mail"), ctx.idempotency_key("sms")
        keys.append((ctx.attempt, k1, k2, other))
        if ctx.attempt == 1:
            raise RuntimeError("the mail server hung up after sending")
        return {"sent": True}

    run_items(log, [{"id": 1}, {"id": 2}], process)
    run_items(log, [{"id": 1}, {"id": 2}], process, epoch=2)
    (a1, *first1), (a2, *first2), (b1, *second1), (b2, *second2) = keys
    assert (a1, a2, b1, b2) == (1, 1, 2, 2)
    assert first1 == second1 and first2 == second2  # the replay emits under the same keys
    assert len({*first1, *first2}) == 6  # distinct per item, per name and per emission index
    # A crash (not a failure) before the ack replays the same keys too.
    crash_keys: list[str] = []

    def crashing(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        crash_keys.append(ctx.idempotency_key("mail"))
        if len(crash_keys) == 1:
            raise Crash
        return {"sent": True}

    log2 = open_log(log.root, "crash")
    with pytest.raises(Crash):
        run_items(log2, [{"id": 1}], crashing, reraise=(Crash,))
    run_items(log2, [{"id": 1}], crashing, epoch=2)
    assert crash_keys[0] == crash_keys[1] == first1[0]  # derived from content, not from the experiment
    # An edited input is different work: a different key.
    run_items(log2, [{"id": 1, "x": 1}], crashing, epoch=3)
    assert crash_keys[2] != crash_keys[0]


# --- export ---------------------------------------------------------------------------------------------


def test_export_is_deterministic_and_ordered_by_item_id(log: Any, tmp_path: Any) -> None:
    items = make_items(12)
    run_items(log, list(reversed(items)), flat_process(), checkpoint_every=5)
    other = open_log(tmp_path, "other")
    run_items(other, items, flat_process(), checkpoint_every=1)
    a = export_results(log, str(tmp_path / "a.lance"))
    b = export_results(other, str(tmp_path / "b.lance"))
    again = export_results(log, str(tmp_path / "a.lance"))
    assert a == b and a["rows"] == 12 and a["changed"]
    assert again == {**a, "changed": False}  # the destination already held it: nothing written
    from tests._support.engine import export_rows, fields_of_export

    rows = export_rows(tmp_path / "a.lance")
    assert [r["item_id"] for r in rows] == sorted(str(i) for i in range(12))
    assert rows == export_rows(tmp_path / "b.lance")
    assert fields_of_export(tmp_path / "a.lance")["3"] == flat_output(items[3])


def test_export_refuses_to_write_into_a_checkpoint_log(log: Any) -> None:
    run_items(log, make_items(2), flat_process())
    with pytest.raises(DatagenError, match="checkpoint log"):
        export_results(log, log.uri)


# --- bad input ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("items", "match"),
    [
        ([{"id": 1}, {"id": 2}, {"id": 1}], r"duplicate key '1' \(items #0 and #2\)"),
        ([{"id": 1}, {"name": "x"}], r"item #1 has no key field 'id'"),
        ([{"id": 1}, ["id", 2]], r"item #1 is a list, not a dict"),
        ([{"id": 1}, {"id": 2, "x": object()}], r"item '2'.*not JSON-serializable"),
        ([{"id": 1}, {"id": 2, "x": float("nan")}], r"item '2'.*NaN"),
        ([{"id": 1}, {"id": None}], r"item #1.*key None"),
        ("not a list", r"iterable of dicts"),
    ],
)
def test_bad_source_items_are_refused_before_anything_is_written(log: Any, items: Any, match: str) -> None:
    rec = Recorder()
    with pytest.raises(InvalidItemError, match=match):
        run_items(log, items, flat_process(rec))
    assert rec.calls == []
    assert log.version == 0


def test_duplicate_keys_name_both_positions_and_other_sources_still_run(log: Any) -> None:
    with pytest.raises(InvalidItemError):
        run_items(log, [{"id": "a", "text": "x"}, {"id": "a", "text": "y"}], flat_process())
    report = run_items(log, [{"id": "a", "text": "x"}, {"id": "b", "text": "y"}], flat_process())
    assert report.processed == ["a", "b"]


def test_prepared_items_share_the_source_dicts_and_hand_out_copies(log: Any) -> None:
    """No second dict per item (planning 1M items must fit in memory), yet a process that edits its
    input never edits the caller's source; an int key's id and key are one string."""
    import copy
    import pickle

    from airflow_provider_datagen.core import SourceItem, prepare_items

    raw = [{"id": 7, "tags": ["a"]}, {"id": "x/y", "n": 1}]
    first, second = prepare_items(raw)
    assert first.item_id == first.key == "7" and first.item_id is first.key
    assert (second.item_id, second.key) == ("x%2Fy", "x/y")
    assert first.data == raw[0] and first.data is not raw[0]
    first.data["id"] = 8
    assert raw[0]["id"] == 7 and first.data["id"] == 7
    with pytest.raises(AttributeError):
        first.key = "8"
    assert pickle.loads(pickle.dumps(second)) == second == copy.deepcopy(second)
    assert second == SourceItem("x%2Fy", "x/y", {"id": "x/y", "n": 1}, second.fingerprint, 1)

    def edits_its_input(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        item["n"] = -1
        return {"seen": item["id"]}

    source = [{"id": "a", "n": 1}]
    run_items(log, source, edits_its_input)
    assert source == [{"id": "a", "n": 1}]
    assert plan_resume(log, source).skip == ["a"]


@pytest.mark.parametrize(
    ("bad_result", "error", "match"),
    [
        ([1, 2], ProcessError, r"item '3': step 'process' returned a list"),
        ("text", ProcessError, r"item '3': step 'process' returned a str"),
        ({"x": {1, 2}}, InvalidValueError, r"field 'x' returned by step 'process' for item '3' is not JSON"),
        ({"x": object()}, InvalidValueError, r"item '3'"),
        ({"x": float("inf")}, InvalidValueError, r"item '3'"),
        ({"": 1}, ProcessError, r"item '3'"),
        ({"a\x00b": 1}, ProcessError, r"item '3'"),
        ({7: 1}, ProcessError, r"item '3'"),
    ],
)
def test_a_bad_process_result_fails_only_that_item(log: Any, bad_result: Any, error: type, match: str) -> None:
    def process(item: dict[str, Any], ctx: Any) -> Any:
        if item["id"] == 3:
            return bad_result
        return flat_output(item)

    report = run_items(log, make_items(6), process, checkpoint_every=2)
    assert report.failed == ["3"]
    assert report.processed == ["0", "1", "2", "4", "5"]
    (rec,) = log.failures("3")
    assert rec.error_type == error.__name__
    assert issubclass(error, DatagenError)
    import re

    assert re.search(match, rec.message), rec.message
    st = log.item_state("3")
    assert st.status is ItemStatus.RUNNING
    assert st.fields == {}  # nothing of the failed step leaked into the log
    assert st.completed_steps == []


@pytest.mark.parametrize(
    ("action", "error"),
    [
        (lambda ctx: ctx.set("x", object()), InvalidValueError),
        (lambda ctx: ctx.append("x", {1}), InvalidValueError),
        (lambda ctx: ctx.set("", 1), ProcessError),
        (lambda ctx: (ctx.set("x", 1), ctx.append("x", 2)), InvalidEventError),
        (lambda ctx: ctx.filter(reason=b"bytes"), InvalidEventError),
    ],
)
def test_bad_context_calls_fail_only_that_item(log: Any, action: Any, error: type) -> None:
    def process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        if item["id"] == 1:
            action(ctx)
        return {"ok": item["id"]}

    report = run_items(log, make_items(3), process)
    assert report.failed == ["1"] and report.processed == ["0", "2"]
    (rec,) = log.failures("1")
    assert rec.error_type == error.__name__ and issubclass(error, DatagenError)
    assert "'1'" in rec.message


def test_duplicate_step_names_and_unknown_kinds_are_refused_before_any_io(log: Any) -> None:
    def f(item: dict[str, Any], ctx: Any) -> None:
        return None

    with pytest.raises(InvalidPipelineError, match="duplicate step name 'x'"):
        run_items(log, make_items(2), Sequence("s", [Step("x", f), Step("x", f)]))
    with pytest.raises(InvalidPipelineError, match="duplicate step name 's'"):
        run_items(log, make_items(2), Sequence("s", [Loop("s", Step("y", f), times=1)]))
    shared = Step("y", f)
    with pytest.raises(InvalidPipelineError, match="used twice"):
        run_items(log, make_items(2), Sequence("s", [shared, shared]))

    class Weird(Step):
        kind = "Weird"  # type: ignore[assignment]

    with pytest.raises(InvalidPipelineError, match="unknown step kind 'Weird'"):
        run_items(log, make_items(2), Sequence("s", [Weird("w", f)]))
    with pytest.raises(InvalidPipelineError, match="callable"):
        run_items(log, make_items(2), 42)
    with pytest.raises(InvalidPipelineError):
        Sequence("s", [42])  # type: ignore[list-item]
    with pytest.raises(DatagenError):
        Step("bad/name", f)
    with pytest.raises(ConfigurationError, match=r"^run_items: checkpoint_every=0 is not a positive int"):
        run_items(log, make_items(2), f, checkpoint_every=0)
    assert log.version == 0


def test_a_router_without_the_chosen_route_fails_that_item_at_the_router(log: Any) -> None:
    pipe = Router("route", lambda item, ctx: item["kind"], {"a": Step("handle_a", lambda item, ctx: {"a": 1})})
    report = run_items(log, [{"id": 1, "kind": "a"}, {"id": 2, "kind": "zzz"}, {"id": 3, "kind": "a"}], pipe)
    assert report.failed == ["2"] and report.processed == ["1", "3"]
    (rec,) = log.failures("2")
    assert rec.error_type == "ProcessError" and rec.step == "route"
    assert "'zzz'" in rec.message and "'2'" in rec.message


def test_an_error_in_a_selector_or_fanout_callable_is_recorded_at_its_step(log: Any) -> None:
    from airflow_provider_datagen.core import Conditional, MapReduce

    def boom(*_: Any) -> Any:
        raise LookupError("no such thing")

    leaf = Step("leaf", lambda item, ctx: {"x": 1})
    for i, pipe in enumerate(
        [
            Conditional("cond", boom, then=Step("t", lambda item, ctx: None)),
            Router("rt", boom, {"a": Step("ra", lambda item, ctx: None)}),
            MapReduce("mr", over=boom, map=leaf),
        ]
    ):
        lg = open_log(log.root, f"sel{i}")
        report = run_items(lg, [{"id": 1}, {"id": 2}], pipe)
        assert report.failed == ["1", "2"]
        rec = lg.failures("1")[0]
        assert rec.error_type == "LookupError" and rec.step == pipe.name


def test_no_other_item_is_harmed_by_a_bad_item_under_group_commit(log: Any) -> None:
    """A bad item in the middle of an ack group does not cost its neighbours their ack."""

    def process(item: dict[str, Any], ctx: Any) -> Any:
        if item["id"] == 5:
            return {"bad": object()}
        return flat_output(item)

    report = run_items(log, make_items(10), process, checkpoint_every=4)
    assert report.failed == ["5"]
    st = statuses(log)
    assert [i for i, s in st.items() if s != "completed"] == ["5"]
    for i in (4, 6):
        assert log.item_state(str(i)).fields == flat_output(make_items(10)[i])


def test_crash_before_any_commit_leaves_an_empty_log(log: Any) -> None:
    with crash_at_commit(0), pytest.raises(Crash):
        run_items(log, make_items(3), flat_process())
    assert log.version == 0
    rec = Recorder()
    run_items(log, make_items(3), flat_process(rec))
    assert rec.calls == ["0", "1", "2"]
