"""In-chunk concurrency (``run_items(..., concurrency=N)``) on real Lance logs.

Each test compares a threaded run with a sequential one on the same source: the folded states, the
export fingerprint and the failure lens must be the same, every item runs exactly once, and a crash
mid-run keeps acknowledged items and replays the rest. No timing is asserted: the sleeps only make
items finish out of order.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from typing import Any

import pytest

from airflow_provider_datagen.core import Loop, MapReduce, Sequence, Step, run_items
from airflow_provider_datagen.core.runner import MIN_PULL
from airflow_provider_datagen.exceptions import ConfigurationError, ItemFailedError
from tests._support.engine import (
    Crash,
    calling_threads,
    flat_output,
    make_items,
    open_log,
    raw_events,
    results_fp,
    statuses,
    steps_pipeline,
)

N = 40


def _sleep_for(item_id: str) -> float:
    # seeded per item: the same "random" latency in every run, so items finish out of submission order
    return random.Random(f"latency-{item_id}").uniform(0.0, 0.004)


class Calls:
    """Thread-safe invocation counter that also tracks the most calls in flight at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.by_item: Counter[str] = Counter()
        self.now = 0
        self.max_now = 0

    def __enter__(self) -> None:
        with self._lock:
            self.now += 1
            self.max_now = max(self.max_now, self.now)

    def __exit__(self, *exc: Any) -> None:
        with self._lock:
            self.now -= 1

    def record(self, item_id: str) -> None:
        with self._lock:
            self.by_item[item_id] += 1


def pipeline(calls: Calls, bad: frozenset[int] = frozenset(), crash_on: int | None = None) -> Sequence:
    """Two steps per item (set, then append and sometimes filter): several events per item buffer."""

    def first(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        calls.record(ctx.item_id)
        with calls:
            time.sleep(_sleep_for(ctx.item_id))
            if crash_on is not None and item["id"] == crash_on:
                raise Crash(f"crash on item {crash_on}")
            if item["id"] in bad:
                raise ValueError(f"cannot handle {item['id']}")
        return flat_output(item)

    def second(item: dict[str, Any], ctx: Any) -> None:
        with calls:
            time.sleep(_sleep_for(ctx.item_id) / 2)
        ctx.append("trail", f"{ctx.item_id}:{ctx.fields['score']}")
        ctx.append("trail", ctx.idempotency_key("emit"))
        if item["id"] % 9 == 4:
            ctx.filter({"why": "nine"})

    return Sequence("seq", [Step("first", first), Step("second", second)])


def folded(log: Any) -> dict[str, tuple[str, dict[str, Any], int]]:
    ids = [str(i) for i in range(N)]
    return {iid: (st.status.value, dict(st.fields), st.failures) for iid, st in log.item_states(ids).items()}


def test_threaded_run_folds_to_the_sequential_states_and_fingerprint(tmp_path: Any) -> None:
    seq_log, par_log = open_log(tmp_path, "seq"), open_log(tmp_path, "par")
    seq_calls, par_calls = Calls(), Calls()
    seq = run_items(seq_log, make_items(N), pipeline(seq_calls))
    par = run_items(par_log, make_items(N), pipeline(par_calls), concurrency=4)
    assert par_calls.by_item == seq_calls.by_item == Counter({str(i): 1 for i in range(N)})
    assert sorted(par.processed) == sorted(seq.processed) and len(par.processed) == N
    assert par.invocations == seq.invocations == 2 * N
    assert par.failed == [] and par.replayed == []
    assert folded(par_log) == folded(seq_log)
    assert statuses(par_log) == statuses(seq_log)
    assert "filtered" in statuses(par_log).values()
    assert results_fp(par_log) == results_fp(seq_log)
    # a rerun finds nothing to do
    again = Calls()
    assert run_items(par_log, make_items(N), pipeline(again), concurrency=4, epoch=2).processed == []
    assert not again.by_item


def test_failures_are_recorded_as_in_a_sequential_run_and_retried_alone(tmp_path: Any) -> None:
    bad = frozenset({3, 11, 12, 30})
    seq_log, par_log = open_log(tmp_path, "seq"), open_log(tmp_path, "par")
    seq = run_items(seq_log, make_items(N), pipeline(Calls(), bad))
    par = run_items(par_log, make_items(N), pipeline(Calls(), bad), concurrency=4)
    assert sorted(par.failed) == sorted(seq.failed) == sorted(str(i) for i in bad)
    assert par.errors == seq.errors
    for iid in par.failed:
        (p,), (s,) = par_log.failures(iid), seq_log.failures(iid)
        assert (
            (p.error_type, p.message, p.step)
            == (s.error_type, s.message, s.step)
            == (
                "ValueError",
                f"cannot handle {iid}",
                "first",
            )
        )
    assert folded(par_log) == folded(seq_log)
    # the rerun (threaded too) touches only the failed items
    retry = Calls()
    report = run_items(par_log, make_items(N), pipeline(retry), concurrency=4, epoch=2)
    assert retry.by_item == Counter({str(i): 1 for i in bad})
    assert sorted(report.processed) == sorted(str(i) for i in bad)
    run_items(seq_log, make_items(N), pipeline(Calls()), epoch=2)
    assert folded(par_log) == folded(seq_log)
    assert results_fp(par_log) == results_fp(seq_log)


def test_a_reraised_crash_keeps_acked_items_and_the_rest_replay(tmp_path: Any) -> None:
    clean_log, log = open_log(tmp_path, "clean"), open_log(tmp_path, "crashy")
    run_items(clean_log, make_items(N), pipeline(Calls()))
    with pytest.raises(Crash, match="crash on item 25"):
        run_items(log, make_items(N), pipeline(Calls(), crash_on=25), concurrency=4, reraise=(Crash,))
    done = {iid for iid, st in statuses(log).items() if st in ("completed", "filtered")}
    # the crash flushed what was acknowledged: at least every item submitted before 25 but the 3 in flight
    assert "25" not in done and 20 <= len(done) < N
    resumed = Calls()
    report = run_items(log, make_items(N), pipeline(resumed), concurrency=4, epoch=2)
    # acknowledged items are never invoked again; everything else runs exactly once more
    assert set(resumed.by_item) == {str(i) for i in range(N)} - done
    assert set(resumed.by_item.values()) == {1}
    assert set(report.skipped) == done
    assert folded(log) == {iid: (s, f, 0) for iid, (s, f, _) in folded(clean_log).items()}
    assert results_fp(log) == results_fp(clean_log)


def test_fail_fast_acknowledges_running_items_and_raises_the_first_failure(tmp_path: Any) -> None:
    log = open_log(tmp_path, "ff")
    calls = Calls()
    with pytest.raises(ItemFailedError, match="cannot handle 5"):
        run_items(log, make_items(N), pipeline(calls, frozenset({5})), concurrency=4, fail_fast=True)
    st = statuses(log)
    invoked = set(calls.by_item)
    assert len(invoked) < N  # nothing more was submitted after the failure
    # every item that ran is acknowledged: done, or failed with its FAILED row
    assert {iid for iid in invoked if st[iid] == "running"} == {"5"}
    assert len(log.failures("5")) == 1
    rerun = Calls()
    run_items(log, make_items(N), pipeline(rerun), concurrency=4, epoch=2)
    assert set(rerun.by_item) == {str(i) for i in range(N)} - (invoked - {"5"})


@pytest.mark.parametrize("concurrency", [1, 2, 4, 7])
def test_no_more_than_concurrency_items_are_in_flight(tmp_path: Any, concurrency: int) -> None:
    calls = Calls()
    run_items(open_log(tmp_path, "bound"), make_items(N), pipeline(calls), concurrency=concurrency)
    assert calls.max_now <= concurrency  # fails if more items than concurrency ever run at once
    assert calls.by_item == Counter({str(i): 1 for i in range(N)})


@pytest.mark.parametrize("concurrency", [2, 4, 7])
def test_the_first_items_really_run_at_the_same_time(tmp_path: Any, concurrency: int) -> None:
    """The first ``concurrency`` items meet at a barrier: it only opens if they are all in flight at once."""
    calls = Calls()
    barrier = threading.Barrier(concurrency, timeout=30)

    def process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        calls.record(ctx.item_id)
        with calls:
            if item["id"] < concurrency:
                barrier.wait()  # BrokenBarrierError (a failed item) if they ran one after another
        return flat_output(item)

    log = open_log(tmp_path, "overlap")
    report = run_items(log, make_items(N), process, concurrency=concurrency)
    assert report.failed == []
    assert calls.max_now == concurrency
    assert set(statuses(log).values()) == {"completed"}


def test_the_next_pull_starts_while_the_last_items_of_a_pull_still_run(tmp_path: Any) -> None:
    """The last item of the first pull waits for the first item of the second: no drain between pulls."""
    second_started = threading.Event()
    waited: list[bool] = []

    def process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        if item["id"] == MIN_PULL:  # the first item of the second pull
            second_started.set()
        if item["id"] == MIN_PULL - 1:  # the last item of the first pull
            waited.append(second_started.wait(timeout=10))
        return flat_output(item)

    log = open_log(tmp_path, "no-barrier")
    report = run_items(log, make_items(MIN_PULL + 10), process, concurrency=2)
    assert waited == [True]
    assert report.failed == [] and set(statuses(log).values()) == {"completed"}
    sequential = open_log(tmp_path, "sequential")
    run_items(sequential, make_items(MIN_PULL + 10), lambda item, ctx: flat_output(item))
    assert results_fp(log) == results_fp(sequential)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"concurrency": 0}, "^run_items: concurrency=.* is not an int >= 1; pass 1"),
        ({"concurrency": -1}, "^run_items: concurrency=.* is not an int >= 1; pass 1"),
        ({"concurrency": True}, "^run_items: concurrency=.* is not an int >= 1; pass 1"),
        ({"concurrency": "4"}, "^run_items: concurrency=.* is not an int >= 1; pass 1"),
        ({"concurrency": 2.0}, "^run_items: concurrency=.* is not an int >= 1; pass 1"),
    ],
)
def test_bad_concurrency_arguments_are_refused_before_any_write(tmp_path: Any, kwargs: Any, match: str) -> None:
    log = open_log(tmp_path, "bad")
    run_items(log, make_items(3), pipeline(Calls()))
    version = log.version
    calls = Calls()
    with pytest.raises(ConfigurationError, match=match):
        run_items(log, make_items(6), pipeline(calls), epoch=2, **kwargs)
    assert log.version == version and not calls.by_item


def _fanout_pipeline(calls: Calls, crash_on: str | None = None) -> Any:
    """Every driver and a MapReduce fan-out (tests._support.engine's "steps"), with per-leaf latency."""

    def hook(step: str, ctx: Any) -> None:
        calls.record(f"{ctx.item_id}@{step}#{ctx.iteration}")
        with calls:
            time.sleep(_sleep_for(ctx.item_id) / 2)
        if crash_on is not None and ctx.item_id == crash_on:
            raise Crash(f"crash on {crash_on}")

    return steps_pipeline(hook)


def _event_ids(log: Any) -> list[tuple[str, int, str]]:
    events = raw_events(log, ["item_id", "item_seq", "event_id"])
    return sorted(zip(*(events[c].to_pylist() for c in ("item_id", "item_seq", "event_id"))))


def test_fanout_pipelines_run_threaded_with_the_sequential_events(tmp_path: Any) -> None:
    seq_log, par_log = open_log(tmp_path, "seq"), open_log(tmp_path, "par")
    seq_calls, par_calls = Calls(), Calls()
    seq = run_items(seq_log, make_items(N), _fanout_pipeline(seq_calls))
    par = run_items(par_log, make_items(N), _fanout_pipeline(par_calls), concurrency=4)
    assert par_calls.by_item == seq_calls.by_item and set(par_calls.by_item.values()) == {1}
    assert any("/fan:" in k for k in par_calls.by_item)  # the children really ran
    assert par_calls.max_now > 1
    assert sorted(par.processed) == sorted(seq.processed) and par.invocations == seq.invocations
    assert _event_ids(par_log) == _event_ids(seq_log)  # same events, sequence numbers and content
    assert results_fp(par_log) == results_fp(seq_log)


def test_restarted_fanout_roots_run_threaded_with_the_sequential_events(tmp_path: Any) -> None:
    # edited roots restart with history: their children are read from the log before submission
    logs = {}
    for name, concurrency in (("seq", 1), ("par", 4)):
        log = logs[name] = open_log(tmp_path, name)
        run_items(log, make_items(N), _fanout_pipeline(Calls()))
        edited = [dict(it, text=f"{it['text']}-edited") if it["id"] % 3 == 0 else it for it in make_items(N)]
        report = run_items(log, edited, _fanout_pipeline(Calls()), epoch=2, concurrency=concurrency)
        assert sorted(report.processed) == sorted(str(i) for i in range(0, N, 3))
    assert _event_ids(logs["par"]) == _event_ids(logs["seq"])
    assert results_fp(logs["par"]) == results_fp(logs["seq"])


def test_a_crash_in_a_fanout_child_keeps_acked_items_and_the_rest_replay(tmp_path: Any) -> None:
    clean_log, log = open_log(tmp_path, "clean"), open_log(tmp_path, "crashy")
    run_items(clean_log, make_items(N), _fanout_pipeline(Calls()))
    with pytest.raises(Crash, match="crash on 17/fan:1"):
        run_items(log, make_items(N), _fanout_pipeline(Calls(), crash_on="17/fan:1"), concurrency=4, reraise=(Crash,))
    done = {i for i, v in statuses(log).items() if v == "completed" and "/" not in i}
    assert "17" not in done
    resumed = Calls()
    report = run_items(log, make_items(N), _fanout_pipeline(resumed), concurrency=4, epoch=2)
    assert not done & {k.split("/")[0].split("@")[0] for k in resumed.by_item}  # acked roots never rerun
    assert sorted(report.skipped) == sorted(done)
    assert results_fp(log) == results_fp(clean_log)


def test_workers_never_read_the_log_for_a_restarted_fanout_root(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Children with blob-stored outputs are loaded by the main thread before their root is submitted."""
    blob = MapReduce(
        "fan",
        over=lambda item, ctx: [{"k": k} for k in range(3)],
        map=Step("leaf", lambda item, ctx: {"raw": bytes([item["k"]]) * 40_000}),
        reduce=lambda children, ctx: {"sizes": [len(c["raw"]) for c in children]},
    )

    def last(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        return {"n": len(ctx.fields["sizes"]), "text": item["text"]}

    pipeline = Sequence("top", [blob, Step("last", last)])

    readers = calling_threads(monkeypatch, "load_blob")
    logs = {}
    for name, concurrency in (("seq", 1), ("par", 4)):
        log = logs[name] = open_log(tmp_path, name)
        run_items(log, make_items(8), pipeline)
        readers.clear()
        # edited roots restart: their children's inputs did not change, so the done children are
        # reused and their blob-stored outputs loaded
        edited = [dict(it, text="edited") if it["id"] in (2, 5) else it for it in make_items(8)]
        report = run_items(log, edited, pipeline, epoch=2, concurrency=concurrency)
        assert sorted(report.processed) == ["2", "5"]
        assert readers and set(readers) == {threading.current_thread().name}
    assert _event_ids(logs["par"]) == _event_ids(logs["seq"])
    assert results_fp(logs["par"]) == results_fp(logs["seq"])


# --- mid-item progress under threads ---------------------------------------------------------------


def _three_steps(calls: Calls, crash_on: int | None = None, check: Any = None) -> Sequence:
    """Three steps per item; ``check(item_id, step)`` runs first in each (it may read the log)."""

    def step(name: str) -> Any:
        def fn(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
            if check is not None:
                check(ctx.item_id, name)
            calls.record(f"{ctx.item_id}@{name}")
            with calls:
                time.sleep(_sleep_for(ctx.item_id))
            if name == "c" and item["id"] == crash_on:
                raise Crash(f"crash on item {crash_on}")
            return {name: f"{item['text']}:{name}"}

        return Step(name, fn)

    return Sequence("abc", [step("a"), step("b"), step("c")])


def test_with_checkpoint_every_1_each_step_is_durable_before_the_next_one_runs(tmp_path: Any) -> None:
    log = open_log(tmp_path, "durable")
    seen: list[tuple[str, str]] = []
    wrong: list[str] = []

    def check(item_id: str, name: str) -> None:
        # what a crash now would leave: a fresh reader of the log, not the writer's own state
        done = {c.step for c in open_log(tmp_path, "durable").item_state(item_id).completed_steps}
        want = {"a": set(), "b": {"a"}, "c": {"a", "b"}}[name]
        seen.append((item_id, name))
        if done != want:
            wrong.append(f"{item_id} before {name}: {sorted(done)}")

    run_items(log, make_items(12), _three_steps(Calls(), check=check), concurrency=4, checkpoint_every=1)
    assert not wrong
    assert len(seen) == 36


def _commit_of(log: Any) -> dict[tuple[str, str], int]:
    """The commit (log version) of each item's STEP_COMPLETED per step and of its TERMINAL."""
    columns = ["item_id", "event_type", "step", "_row_created_at_version"]
    rows = log.table.dataset().to_table(columns=columns).to_pylist()
    return {
        (r["item_id"], r["step"] or "TERMINAL"): r["_row_created_at_version"]
        for r in rows
        if r["event_type"] in ("STEP_COMPLETED", "TERMINAL") and r["step"] != "abc"
    }


def test_the_time_bound_commits_finished_steps_of_running_items(tmp_path: Any) -> None:
    seq_log, par_log = open_log(tmp_path, "seq"), open_log(tmp_path, "par")
    run_items(seq_log, make_items(N), _three_steps(Calls()), checkpoint_interval=0)
    run_items(par_log, make_items(N), _three_steps(Calls()), concurrency=4, checkpoint_interval=0)
    commits = _commit_of(par_log)
    for i in range(N):
        # with a zero time bound every step boundary commits: each step lands before the item ends
        assert commits[(str(i), "a")] < commits[(str(i), "b")] < commits[(str(i), "TERMINAL")]
    assert _event_ids(par_log) == _event_ids(seq_log)  # the same events, however they were grouped
    assert results_fp(par_log) == results_fp(seq_log)


def test_fanout_items_handed_over_mid_item_have_the_sequential_events(tmp_path: Any) -> None:
    seq_log, par_log = open_log(tmp_path, "seq"), open_log(tmp_path, "par")
    run_items(seq_log, make_items(N), _fanout_pipeline(Calls()), checkpoint_interval=0)
    run_items(par_log, make_items(N), _fanout_pipeline(Calls()), concurrency=4, checkpoint_interval=0)
    assert _event_ids(par_log) == _event_ids(seq_log)
    assert results_fp(par_log) == results_fp(seq_log)


def test_after_a_crash_no_committed_step_of_a_running_item_runs_again(tmp_path: Any) -> None:
    clean_log, log = open_log(tmp_path, "clean"), open_log(tmp_path, "crashy")
    run_items(clean_log, make_items(N), _three_steps(Calls()))
    other_started_b = threading.Event()

    def check(item_id: str, name: str) -> None:
        if (item_id, name) == ("26", "b"):
            other_started_b.set()  # so item 26 is mid-item, its step a handed over, when 25 crashes
        if (item_id, name) == ("25", "c"):
            other_started_b.wait(10)

    with pytest.raises(Crash, match="crash on item 25"):
        run_items(
            log,
            make_items(N),
            _three_steps(Calls(), crash_on=25, check=check),
            concurrency=4,
            checkpoint_interval=0,
            reraise=(Crash,),
        )
    states = log.item_states([str(i) for i in range(N)])
    durable = {(iid, c.step) for iid, st in states.items() for c in st.completed_steps}
    assert states["26"].status.value == "running"
    assert ("26", "a") in durable  # another item's finished step, committed while it was still running
    resumed = Calls()
    run_items(log, make_items(N), _three_steps(resumed), concurrency=4, epoch=2)
    ran = {tuple(k.split("@")) for k in resumed.by_item}
    assert ("25", "c") in ran and ("26", "c") in ran
    assert not ran & durable  # a committed step never runs again
    assert results_fp(log) == results_fp(clean_log)


def test_a_commit_error_while_workers_wait_ends_the_run_and_releases_them(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_provider_datagen.core.store.writer import LogWriter
    from airflow_provider_datagen.exceptions import LogWriteError

    log = open_log(tmp_path, "broken")
    original = LogWriter.commit
    commits = []

    def commit(self: LogWriter, batch: Any, **kw: Any) -> int:
        commits.append(len(batch))
        if len(commits) == 3:  # the inbox, then mid-item progress: the second hand-over breaks
            raise LogWriteError("the disk is full")
        return original(self, batch, **kw)

    monkeypatch.setattr(LogWriter, "commit", commit)
    with pytest.raises(LogWriteError, match="the disk is full"):
        run_items(log, make_items(N), _three_steps(Calls()), concurrency=4, checkpoint_every=1)
    deadline = time.monotonic() + 10
    while any(t.name.startswith("datagen-item") for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not [t.name for t in threading.enumerate() if t.name.startswith("datagen-item")]


# --- fan-out children in parallel ---------------------------------------------------------------


def _chunked(calls: Calls, *, meet: threading.Barrier | None = None, bad: frozenset[str] = frozenset()) -> MapReduce:
    """A root split into six children; ``meet`` makes two children wait for each other."""

    def over(item: dict[str, Any], ctx: Any) -> list[dict[str, Any]]:
        return [{"part": i, "text": f"{item['text']}#{i}"} for i in range(6)]

    def piece(child: dict[str, Any], ctx: Any) -> dict[str, Any]:
        calls.record(ctx.item_id)
        with calls:
            if meet is not None and child["part"] < 2:
                meet.wait(timeout=20)  # raises BrokenBarrierError unless both run at once
            time.sleep(_sleep_for(ctx.item_id))
        if ctx.item_id in bad:
            raise ValueError(f"cannot handle {ctx.item_id}")
        return {"piece": child["text"].upper()}

    def reduce(children: list[dict[str, Any]], ctx: Any) -> dict[str, Any]:
        return {"joined": "|".join(c["piece"] for c in children)}

    return MapReduce("split", over=over, map=piece, reduce=reduce)


def test_the_children_of_one_root_run_at_the_same_time(tmp_path: Any) -> None:
    seq_log, par_log = open_log(tmp_path, "seq"), open_log(tmp_path, "par")
    run_items(seq_log, make_items(1), _chunked(Calls()))
    calls = Calls()
    report = run_items(par_log, make_items(1), _chunked(calls, meet=threading.Barrier(2)), concurrency=3)
    assert report.processed == ["0"] and not report.failed  # the two children met: they overlapped
    assert 2 <= calls.max_now <= 3
    assert _event_ids(par_log) == _event_ids(seq_log)
    assert results_fp(par_log) == results_fp(seq_log)
    assert par_log.item_state("0").fields["joined"] == seq_log.item_state("0").fields["joined"]


@pytest.mark.parametrize("concurrency", [2, 3])
def test_roots_and_children_together_stay_within_concurrency(tmp_path: Any, concurrency: int) -> None:
    calls = Calls()

    def prepare(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        # a root's own step, which may run while other roots' children run
        calls.record(ctx.item_id)
        with calls:
            time.sleep(0.002 + _sleep_for(ctx.item_id))
        return {"prepared": True}

    pipe = Sequence("work", [Step("prepare", prepare), _chunked(calls), Step("again", prepare)])
    run_items(open_log(tmp_path, "bound"), make_items(12), pipe, concurrency=concurrency)
    assert sum(calls.by_item.values()) == 12 * 2 + 12 * 6
    assert calls.max_now > 1  # roots' steps and children overlapped
    assert calls.max_now <= concurrency  # fails without the permits


@pytest.mark.parametrize(
    ("build", "n", "bad", "root"),
    [
        ("children", 6, frozenset({"3/split:1", "3/split:4"}), "3"),
        ("grandchildren", 3, frozenset({"1/outer:0/inner:2", "1/outer:2/inner:0"}), "1"),
    ],
)
def test_a_failing_child_fails_its_root_as_in_a_sequential_run_and_keeps_its_siblings_work(
    tmp_path: Any, build: str, n: int, bad: frozenset[str], root: str
) -> None:
    def pipe(calls: Calls, bad: frozenset[str] = frozenset()) -> MapReduce:
        return _chunked(calls, bad=bad) if build == "children" else _nested(calls, bad=bad)

    first, second = sorted(bad)  # in index order: the sequential loop meets ``first`` first
    seq_log, par_log = open_log(tmp_path, "seq"), open_log(tmp_path, "par")
    seq = run_items(seq_log, make_items(n), pipe(Calls(), bad))
    par = run_items(par_log, make_items(n), pipe(Calls(), bad), concurrency=4)
    assert par.failed == seq.failed == [root]
    (p,), (s,) = par_log.failures(first), seq_log.failures(first)
    assert (p.error_type, p.message) == (s.error_type, s.message) == ("ValueError", f"cannot handle {first}")
    assert not seq_log.failures(second)  # sequential never reached the second bad child
    # the children that finished beside the failure are kept: the rerun redoes only the failed ones
    rerun = Calls()
    run_items(par_log, make_items(n), pipe(rerun), concurrency=4, epoch=2)
    assert set(rerun.by_item) == set(bad)
    run_items(seq_log, make_items(n), pipe(Calls()), epoch=2)
    assert results_fp(par_log) == results_fp(seq_log)


def test_with_checkpoint_every_1_a_childs_steps_are_durable_before_its_next_step(tmp_path: Any) -> None:
    wrong: list[str] = []
    checked = Calls()

    def first(child: dict[str, Any], ctx: Any) -> dict[str, Any]:
        return {"first": child["part"]}

    def second(child: dict[str, Any], ctx: Any) -> dict[str, Any]:
        checked.record(ctx.item_id)
        done = {c.step for c in open_log(tmp_path, "kids").item_state(ctx.item_id).completed_steps}
        if "first" not in done:
            wrong.append(f"{ctx.item_id}: {sorted(done)}")
        return {"second": ctx.fields["first"] * 2}

    pipe = MapReduce(
        "split",
        over=lambda item, ctx: [{"part": i} for i in range(4)],
        map=Sequence("pair", [Step("first", first), Step("second", second)]),
    )
    run_items(open_log(tmp_path, "kids"), make_items(3), pipe, concurrency=3, checkpoint_every=1)
    assert len(checked.by_item) == 12
    assert not wrong


def _nested(calls: Calls, *, meet: threading.Barrier | None = None, bad: frozenset[str] = frozenset()) -> MapReduce:
    """A root split into three children, each split again into three grandchildren."""

    def leaf(grandchild: dict[str, Any], ctx: Any) -> dict[str, Any]:
        calls.record(ctx.item_id)
        with calls:
            if meet is not None and ctx.item_id.startswith("0/outer:1/") and grandchild["part"] < 2:
                meet.wait(timeout=20)  # raises BrokenBarrierError unless both run at once
            time.sleep(_sleep_for(ctx.item_id))
        if ctx.item_id in bad:
            raise ValueError(f"cannot handle {ctx.item_id}")
        return {"leaf": grandchild["text"].upper()}

    inner = MapReduce(
        "inner",
        over=lambda child, ctx: [{"part": i, "text": f"{child['text']}.{i}"} for i in range(3)],
        map=Step("leaf", leaf),
        reduce=lambda parts, ctx: {"joined": "+".join(p["leaf"] for p in parts)},
    )
    return MapReduce(
        "outer",
        over=lambda item, ctx: [{"text": f"{item['text']}#{i}"} for i in range(3)],
        map=inner,
        reduce=lambda parts, ctx: {"all": "|".join(p["joined"] for p in parts)},
    )


def test_the_grandchildren_of_one_child_run_at_the_same_time(tmp_path: Any) -> None:
    seq_log, par_log = open_log(tmp_path, "seq"), open_log(tmp_path, "par")
    run_items(seq_log, make_items(2), _nested(Calls()))
    calls = Calls()
    report = run_items(par_log, make_items(2), _nested(calls, meet=threading.Barrier(2)), concurrency=3)
    assert sorted(report.processed) == ["0", "1"] and not report.failed  # the two grandchildren met
    assert set(calls.by_item.values()) == {1} and len(calls.by_item) == 2 * 3 * 3
    assert 2 <= calls.max_now <= 3
    assert _event_ids(par_log) == _event_ids(seq_log)
    assert results_fp(par_log) == results_fp(seq_log)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("concurrency", [2, 3])
def test_nested_fanouts_never_wait_for_a_pool_their_own_parents_fill(tmp_path: Any, concurrency: int) -> None:
    # more waiting children than pool threads: the children nobody started run in the waiting thread
    seq_log, par_log = open_log(tmp_path, "seq"), open_log(tmp_path, "par")
    run_items(seq_log, make_items(8), _nested(Calls()))
    calls = Calls()
    report = run_items(par_log, make_items(8), _nested(calls), concurrency=concurrency)
    assert len(report.processed) == 8 and sum(calls.by_item.values()) == 8 * 9
    assert calls.max_now > 1  # the pieces overlapped
    assert calls.max_now <= concurrency
    assert _event_ids(par_log) == _event_ids(seq_log)


def test_no_fanout_child_starts_after_a_run_ending_error(tmp_path: Any) -> None:
    # root 1 ends the run while root 0 waits for its children: the waiting root must not go on
    # running its queued children itself once run_items has raised
    started: list[tuple[str, float]] = []
    first_child = threading.Event()

    def over(item: dict[str, Any], ctx: Any) -> list[dict[str, Any]]:
        if item["id"] == 1:
            first_child.wait(timeout=20)
            raise Crash("the orchestrator's timeout")
        return [{"part": i} for i in range(12)]

    def piece(child: dict[str, Any], ctx: Any) -> dict[str, Any]:
        started.append((ctx.item_id, time.monotonic()))
        first_child.set()
        time.sleep(0.05)
        return {"piece": child["part"]}

    pipe = MapReduce("split", over=over, map=piece)
    with pytest.raises(Crash):
        run_items(open_log(tmp_path, "ended"), make_items(2), pipe, concurrency=2, reraise=(Crash,))
    ended = time.monotonic()
    time.sleep(1.0)  # long enough for all twelve to run one after another, were they started
    late = [iid for iid, at in started if at > ended]
    assert started and len(late) <= 2, late  # at most what threads had already taken when it ended


def _looped(nested: bool) -> Loop:
    """A Loop running a fan-out three times: every child id gets three generations, each two steps long.

    ``nested``: each child runs a Loop over its own fan-out, so grandchildren get generations too.
    """

    def first(part: dict[str, Any], ctx: Any) -> dict[str, Any]:
        return {"first": part["part"] * 10 + part["gen"]}

    def second(part: dict[str, Any], ctx: Any) -> dict[str, Any]:
        return {"second": ctx.fields["first"] * 2}

    def split(name: str, body: Step) -> MapReduce:
        return MapReduce(
            name,
            over=lambda item, ctx: [{"part": i, "gen": ctx.iteration} for i in range(3)],
            map=body,
            reduce=lambda parts, ctx: {"sum": sum(p.get("second", p.get("sum", 0)) for p in parts)},
        )

    pair = Sequence("pair", [Step("first", first), Step("second", second)])
    body = Loop("inner_again", split("bits", pair), times=2) if nested else pair
    return Loop("again", split("split", body), times=3)


@pytest.mark.parametrize("nested", [False, True], ids=["children", "grandchildren"])
@pytest.mark.parametrize("every", [1, None], ids=["every-step", "time-bound"])
def test_a_loop_over_a_fanout_commits_each_generation_of_a_child_in_order(
    tmp_path: Any, nested: bool, every: int | None
) -> None:
    # children hand their steps over mid-item; the last generation's final events wait in the
    # looping item's buffer, and must land before the next generation's first ones
    kwargs: dict[str, Any] = {"checkpoint_every": every} if every else {"checkpoint_interval": 0.0}
    seq_log, par_log = open_log(tmp_path, "seq"), open_log(tmp_path, "par")
    run_items(seq_log, make_items(4), _looped(nested), **kwargs)
    run_items(par_log, make_items(4), _looped(nested), concurrency=3, **kwargs)
    assert _event_ids(par_log) == _event_ids(seq_log)  # the same numbering as the sequential run
    assert results_fp(par_log) == results_fp(seq_log)


# --- inbox replays and failed items run under concurrency too ------------------------------------------


def _two_steps(calls: Calls, barrier: threading.Barrier | None = None, fail_b: bool = False) -> Sequence:
    """Steps a then b; b waits at ``barrier`` (it only opens if that many items run b at once) or fails."""

    def a(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        calls.record(f"{ctx.item_id}@a")
        return {"a": f"{item['text']}:a"}

    def b(item: dict[str, Any], ctx: Any) -> None:
        calls.record(f"{ctx.item_id}@b")
        with calls:
            if barrier is not None:
                barrier.wait()  # BrokenBarrierError (a failed item) if the items ran one after another
            if fail_b:
                raise ValueError(f"rate limited on {ctx.item_id}")
        ctx.set("b", f"{ctx.fields['a']}:b")
        ctx.append("trail", ctx.idempotency_key("emit"))

    return Sequence("ab", [Step("a", a), Step("b", b)])


K = 6  # fewer than a pull: every item of the first run is in its one inbox commit


def _crashed_inbox(tmp_path: Any, name: str) -> Any:
    """A log whose K items are in the inbox (ITEM_CREATED, no TERMINAL, no FAILED): the run was killed."""

    def crash(item: dict[str, Any], ctx: Any) -> None:
        raise Crash("killed before any item finished")

    log = open_log(tmp_path, name)
    with pytest.raises(Crash):
        run_items(log, make_items(K), Step("ab", crash), reraise=(Crash,))
    assert set(statuses(log).values()) == {"running"} and all(not log.failures(str(i)) for i in range(K))
    return log


def test_inbox_replays_run_at_the_same_time(tmp_path: Any) -> None:
    """After a crash the K inbox items meet at a barrier: they only get there together if they run concurrently."""
    log = _crashed_inbox(tmp_path, "replays")
    calls = Calls()
    report = run_items(log, make_items(K), _two_steps(calls, threading.Barrier(K, timeout=10)), concurrency=K, epoch=2)
    assert report.failed == [] and sorted(report.replayed) == sorted(report.processed) == [str(i) for i in range(K)]
    assert calls.max_now == K
    sequential = _crashed_inbox(tmp_path, "replays-seq")
    run_items(sequential, make_items(K), _two_steps(Calls()), epoch=2)
    assert _event_ids(log) == _event_ids(sequential)
    assert results_fp(log) == results_fp(sequential)


def test_failed_items_rerun_at_the_same_time_from_their_last_completed_step(tmp_path: Any) -> None:
    """Items failed at step b rerun concurrently (a barrier for K) and resume at b: a is never run again."""
    logs = {}
    for name in ("par", "seq"):
        log = logs[name] = open_log(tmp_path, name)
        first = run_items(log, make_items(K), _two_steps(Calls(), fail_b=True), checkpoint_every=1)
        assert sorted(first.failed) == [str(i) for i in range(K)]
        assert all(st.completed_steps for st in log.item_states([str(i) for i in range(K)]).values())
    calls = Calls()
    barrier = threading.Barrier(K, timeout=10)
    report = run_items(logs["par"], make_items(K), _two_steps(calls, barrier), concurrency=K, epoch=2)
    assert report.failed == [] and sorted(report.processed) == [str(i) for i in range(K)]
    assert calls.by_item == Counter({f"{i}@b": 1 for i in range(K)})  # the rerun resumed at b
    assert calls.max_now == K
    assert all(st.failures == 1 for st in logs["par"].item_states([str(i) for i in range(K)]).values())
    run_items(logs["seq"], make_items(K), _two_steps(Calls()), epoch=2)
    assert _event_ids(logs["par"]) == _event_ids(logs["seq"])  # the same events as a sequential rerun
    assert results_fp(logs["par"]) == results_fp(logs["seq"])


def test_replayed_fanout_roots_run_threaded_with_the_sequential_events(tmp_path: Any) -> None:
    """A crash mid-fan-out leaves roots in the inbox with children in the log; a threaded replay of them
    (children read before submission, run in the child pool) writes a sequential replay's events."""
    logs = {}
    for name, concurrency in (("seq", 1), ("par", 4)):
        log = logs[name] = open_log(tmp_path, name)
        with pytest.raises(Crash, match="crash on 17/fan:1"):
            run_items(log, make_items(N), _fanout_pipeline(Calls(), crash_on="17/fan:1"), reraise=(Crash,))
        resumed = Calls()
        report = run_items(log, make_items(N), _fanout_pipeline(resumed), epoch=2, concurrency=concurrency)
        assert "17" in report.replayed and report.failed == []
        if concurrency > 1:
            assert resumed.max_now > 1
    assert _event_ids(logs["par"]) == _event_ids(logs["seq"])
    assert results_fp(logs["par"]) == results_fp(logs["seq"])


def _one_step(item: dict[str, Any], ctx: Any) -> dict[str, Any] | None:
    """A process function (the workers' short path) that sets, appends, filters, returns nothing or fails."""
    i = item["id"]
    time.sleep(_sleep_for(ctx.item_id))
    if i % 7 == 3:
        raise ValueError(f"cannot handle {i}")
    if i % 5 == 1:
        ctx.append("trail", ctx.idempotency_key("emit"))
    if i % 9 == 4:
        ctx.filter({"why": "nine"})
    if i % 11 == 2:
        return None
    return flat_output(item)


def test_a_process_function_run_threaded_writes_the_sequential_events(tmp_path: Any) -> None:
    seq_log, par_log = open_log(tmp_path, "seq"), open_log(tmp_path, "par")
    seq = run_items(seq_log, make_items(N), _one_step)
    par = run_items(par_log, make_items(N), _one_step, concurrency=4)
    assert par.invocations == seq.invocations == N
    assert sorted(par.processed) == sorted(seq.processed)
    assert sorted(par.failed) == sorted(seq.failed) == [str(i) for i in sorted(range(3, N, 7), key=str)]
    assert par.errors == seq.errors
    assert _event_ids(par_log) == _event_ids(seq_log)
    assert statuses(par_log) == statuses(seq_log)
    assert {"completed", "filtered", "running"} == set(statuses(par_log).values())
    assert results_fp(par_log) == results_fp(seq_log)
    # the rerun (threaded too) retries the failed items alone, on the general driver's replay path
    again = run_items(par_log, make_items(N), lambda item, ctx: flat_output(item), concurrency=4, epoch=2)
    assert sorted(again.replayed) == sorted(again.processed) == sorted(seq.failed)


def test_256_items_at_concurrency_256_are_all_in_flight_together(tmp_path: Any) -> None:
    """Two generations of 256 items meet at a barrier: it only opens if all 256 of each run at once."""
    n = 256
    barrier = threading.Barrier(n, timeout=60)
    calls = Calls()

    def process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        calls.record(ctx.item_id)
        with calls:
            barrier.wait()  # BrokenBarrierError (a failed item) if fewer than 256 were in flight
        return flat_output(item)

    log = open_log(tmp_path, "wide")
    report = run_items(log, make_items(2 * n), process, concurrency=n)
    assert report.failed == [] and len(report.processed) == 2 * n
    assert calls.max_now == n
    assert calls.by_item == Counter({str(i): 1 for i in range(2 * n)})
    sequential = open_log(tmp_path, "sequential")
    run_items(sequential, make_items(2 * n), lambda item, ctx: flat_output(item))
    assert results_fp(log) == results_fp(sequential)
    assert _event_ids(log) == _event_ids(sequential)


def test_no_queued_item_starts_after_a_failure_before_it_is_acknowledged(tmp_path: Any) -> None:
    """Items wait queued beside the running ones; a failure holds them until the main thread knows
    whether it ends the run, so fail_fast runs no more items than the ones already running."""
    concurrency = 4
    started = threading.Barrier(concurrency, timeout=30)
    acknowledged = threading.Event()  # set by the progress callback, after the failure's acknowledgement
    calls = Calls()

    def process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        calls.record(ctx.item_id)
        if item["id"] < concurrency:
            started.wait()  # the first items all run before item 0 fails
        if item["id"] == 0:
            raise ValueError("cannot handle 0")
        assert acknowledged.wait(timeout=30)
        return flat_output(item)

    log = open_log(tmp_path, "hold")
    with pytest.raises(ItemFailedError, match="cannot handle 0"):
        run_items(
            log,
            make_items(N),
            process,
            concurrency=concurrency,
            fail_fast=True,
            progress=lambda done, total: acknowledged.set(),
        )
    # item 0's thread did not take the next queued item: only the items running at the failure ran
    assert calls.by_item == Counter({str(i): 1 for i in range(concurrency)})
    st = statuses(log)
    assert {iid for iid, s in st.items() if s == "completed"} == {str(i) for i in range(1, concurrency)}
    assert len(log.failures("0")) == 1
    rerun = Calls()
    run_items(log, make_items(N), pipeline(rerun), concurrency=concurrency, epoch=2)
    assert set(rerun.by_item) == {"0"} | {str(i) for i in range(concurrency, N)}
