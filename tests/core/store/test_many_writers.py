"""Eight writer processes, ``maintain()`` in a loop and a folding reader, all on one experiment at once.

Each writer runs ``run_items`` on its own items plus a few items every writer shares (deterministic, so
all writers write identical events for them), with its own ``checkpoint_every`` and epoch. Beside them
one process runs ``log.maintain()`` (compaction, index builds, cleanup) in a loop and another folds
``states()``/``item_state()``/``summary()`` in a loop. Afterwards:

- no event is lost: the distinct event ids of the log equal those of a single-writer run of the same
  work, and the physical row count equals the rows the writers appended (compaction drops nothing and
  invents nothing);
- no duplicate in the fold: one state row per item, every item completed, no fencing violation;
- the reader never saw an error, never saw the completed count go down, never saw a duplicate item row.
"""

from __future__ import annotations

import multiprocessing as mp
import random
import time
import traceback
from collections import Counter
from typing import TYPE_CHECKING, Any

import lance
import pytest

from airflow_provider_datagen.core import CheckpointLog, export_results, fingerprint_of, run_items

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

WRITERS = 8
OWN_ITEMS = 40
SHARED_ITEMS = 6
CHECKPOINT_EVERY = [1, 2, 3, 5, 1, 2, 10, None]
PIPELINE = "many"
EXPERIMENT = "e1"
JOIN_TIMEOUT = 240


def items_of(writer: int) -> list[dict[str, Any]]:
    own = [{"id": f"w{writer}-{k}", "n": k * 31 + writer} for k in range(OWN_ITEMS)]
    shared = [{"id": f"shared-{k}", "n": 1000 + k} for k in range(SHARED_ITEMS)]
    # the shared items sit at different positions in each writer's source
    return (
        shared[writer % SHARED_ITEMS :]
        + own[: OWN_ITEMS // 2]
        + shared[: writer % SHARED_ITEMS]
        + own[OWN_ITEMS // 2 :]
    )


def process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
    ctx.append("trail", item["n"] % 7)
    ctx.append("trail", item["n"] % 11)
    return {"square": item["n"] * item["n"], "text": f"item {ctx.key}", "nested": {"k": [item["n"], ctx.key]}}


def _writer(root: str, writer: int, barrier: Any, results: Any) -> None:
    out: dict[str, Any] = {"role": f"writer-{writer}", "errors": [], "rows": 0, "commits": 0}
    try:
        lg = CheckpointLog.open(root, pipeline=PIPELINE, experiment=EXPERIMENT)
        append = lg.append

        def counted(table: Any) -> None:
            append(table)
            out["rows"] += table.num_rows
            out["commits"] += 1

        lg.append = counted  # type: ignore[method-assign]
        barrier.wait(JOIN_TIMEOUT)
        report = run_items(
            lg,
            items_of(writer),
            process,
            checkpoint_every=CHECKPOINT_EVERY[writer],
            checkpoint_interval=0.05,
            writer_id=f"writer-{writer}",
            epoch=writer + 1,
        )
        out["processed"] = len(report.processed)
        out["failed"] = report.errors
    except BaseException:
        out["errors"].append(traceback.format_exc())
    results.put(out)


def _maintainer(root: str, barrier: Any, stop: Any, results: Any) -> None:
    out: dict[str, Any] = {"role": "maintainer", "errors": [], "runs": 0, "compacted": 0, "skipped": 0}
    try:
        lg = CheckpointLog.open(root, pipeline=PIPELINE, experiment=EXPERIMENT)
        barrier.wait(JOIN_TIMEOUT)
        while not stop.is_set():
            try:
                res = lg.maintain()
            except BaseException:
                out["errors"].append(traceback.format_exc())
                time.sleep(0.05)
                continue
            out["runs"] += 1
            if res.get("skipped"):
                out["skipped"] += 1
                time.sleep(0.02)
            elif res["fragments_before"] > res["fragments_after"]:
                out["compacted"] += 1
    except BaseException:
        out["errors"].append(traceback.format_exc())
    results.put(out)


def _reader(root: str, barrier: Any, stop: Any, results: Any) -> None:
    out: dict[str, Any] = {"role": "reader", "errors": [], "reads": 0, "max_completed": 0}
    rng = random.Random(7)
    try:
        lg = CheckpointLog.open(root, pipeline=PIPELINE, experiment=EXPERIMENT)
        barrier.wait(JOIN_TIMEOUT)
        last_completed = 0
        while not stop.is_set():
            try:
                states = lg.states()
                ids = states["item_id"].to_pylist()
                dup = [i for i, c in Counter(ids).items() if c > 1]
                if dup:
                    out["errors"].append(f"duplicate item rows in states(): {dup[:5]}")
                completed = states["status"].to_pylist().count("completed")
                if completed < last_completed:
                    out["errors"].append(f"the completed count went down from {last_completed} to {completed}")
                last_completed = max(last_completed, completed)
                if ids:
                    iid = rng.choice(ids)
                    st = lg.item_state(iid)
                    if st.status.value == "completed" and st.fields.get("text") != f"item {iid}":
                        out["errors"].append(f"item {iid} completed with fields {st.fields}")
                lg.summary(states)
                out["reads"] += 1
            except BaseException:
                out["errors"].append(traceback.format_exc())
        out["max_completed"] = last_completed
    except BaseException:
        out["errors"].append(traceback.format_exc())
    results.put(out)


def _distinct_event_ids(lg: CheckpointLog) -> set[str]:
    return set(lance.dataset(lg.uri).to_table(columns=["event_id"])["event_id"].to_pylist())


def test_eight_writers_with_maintenance_and_a_reader(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    started = time.monotonic()
    root = str(tmp_path / "root")
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(WRITERS + 2)
    stop = ctx.Event()
    results = ctx.Queue()
    writers = [ctx.Process(target=_writer, args=(root, w, barrier, results)) for w in range(WRITERS)]
    helpers = [
        ctx.Process(target=_maintainer, args=(root, barrier, stop, results)),
        ctx.Process(target=_reader, args=(root, barrier, stop, results)),
    ]
    for p in [*writers, *helpers]:
        p.start()
    reports: list[dict[str, Any]] = []
    try:
        for _ in writers:
            reports.append(results.get(timeout=JOIN_TIMEOUT))
        # let maintenance and the reader see the finished log too, then stop them
        time.sleep(0.5)
        stop.set()
        for _ in helpers:
            reports.append(results.get(timeout=JOIN_TIMEOUT))
    finally:
        stop.set()
        for p in [*writers, *helpers]:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()  # our own child, by its PID
    by_role = {r["role"]: r for r in reports}
    for role, rep in sorted(by_role.items()):
        assert not rep["errors"], f"{role} saw errors:\n" + "\n".join(rep["errors"][:3])
    assert all(p.exitcode == 0 for p in writers), [p.exitcode for p in writers]
    for w in range(WRITERS):
        rep = by_role[f"writer-{w}"]
        assert not rep["failed"], rep["failed"]
        assert rep["processed"] >= OWN_ITEMS, rep  # its own items at least; shared ones maybe by others
    maint, reader = by_role["maintainer"], by_role["reader"]
    assert maint["runs"] - maint["skipped"] >= 1, maint
    assert reader["reads"] >= 3, reader

    lg = CheckpointLog.open(root, pipeline=PIPELINE, experiment=EXPERIMENT)
    total = WRITERS * OWN_ITEMS + SHARED_ITEMS
    states = lg.states()
    ids = states["item_id"].to_pylist()
    assert len(ids) == len(set(ids)) == total
    assert set(states["status"].to_pylist()) == {"completed"}
    summary = lg.summary(states)
    assert summary["completed"] == total and summary["pending"] == 0
    assert summary["fencing_violations"] == 0
    assert lg.failures() == []

    # No event lost, none invented: a single-writer run of the same work writes the same distinct ids.
    baseline = CheckpointLog.open(root, pipeline=PIPELINE, experiment="baseline")
    seen: set[str] = set()
    for w in range(WRITERS):
        fresh = [it for it in items_of(w) if it["id"] not in seen]
        seen.update(it["id"] for it in fresh)
        run_items(baseline, fresh, process, checkpoint_every=7, writer_id="solo", epoch=1)
    expected_ids = _distinct_event_ids(baseline)
    got_ids = _distinct_event_ids(lg)
    assert got_ids == expected_ids, (len(got_ids - expected_ids), len(expected_ids - got_ids))
    appended = sum(by_role[f"writer-{w}"]["rows"] for w in range(WRITERS))
    assert lance.dataset(lg.uri).count_rows() == appended
    # shared items were written by several writers, identically: still one folded item each
    for k in range(SHARED_ITEMS):
        st = lg.item_state(f"shared-{k}")
        n = 1000 + k
        assert st.fields == {
            "trail": [n % 7, n % 11],
            "square": n * n,
            "text": f"item shared-{k}",
            "nested": {"k": [n, f"shared-{k}"]},
        }
    a = export_results(lg, str(tmp_path / "a.lance"))
    b = export_results(baseline, str(tmp_path / "b.lance"))
    assert a == b and a["rows"] == total
    # one more maintenance pass on the quiet log changes nothing that a reader can see
    lg.maintain()
    assert _distinct_event_ids(lg) == expected_ids
    assert export_results(lg, str(tmp_path / "c.lance")) == a
    elapsed = time.monotonic() - started
    with capsys.disabled():
        print(
            f"\nmany writers: {WRITERS} writers x {OWN_ITEMS} own items + {SHARED_ITEMS} shared, {appended} rows in "
            f"{sum(by_role[f'writer-{w}']['commits'] for w in range(WRITERS))} commits, {maint['runs']} maintenance "
            f"runs ({maint['compacted']} compacted), {reader['reads']} folds by the reader, {elapsed:.0f}s"
        )


@pytest.mark.parametrize("late_epoch", [2, 4], ids=["late-replayer-lower-epoch", "late-replayer-higher-epoch"])
def test_an_item_completed_by_another_writer_after_the_plan_is_not_replayed(tmp_path: Path, late_epoch: int) -> None:
    """Writer B plans (x is in the inbox), writer C completes x, then B reaches x: B must skip it.

    Two mapped tasks or two DAG runs on one experiment do this whenever their plans overlap. Replaying
    the completed item invokes the user function a second time and appends a second trajectory after
    the TERMINAL; with B's epoch below C's the failure lens reports those rows as fencing violations
    ("a zombie attempt kept running") although no zombie exists.
    """
    items = [{"id": "x", "n": 1}, {"id": "y", "n": 2}]
    calls: list[str] = []

    def counting(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        calls.append(ctx.item_id)
        return process(item, ctx)

    a = CheckpointLog.open(tmp_path, pipeline="p", experiment="e")
    w = a.writer("A", 1, processor_version="v1")
    with w.batch() as b:  # attempt A pulled x and y and died before acknowledging them
        for it in items:
            b.item_created(str(it["id"]), input_fingerprint=fingerprint_of(it))
    b_log = CheckpointLog.open(tmp_path, pipeline="p", experiment="e")
    c_log = CheckpointLog.open(tmp_path, pipeline="p", experiment="e")
    original = b_log.item_states

    def c_finishes_x_first(ids: Any) -> Any:
        run_items(c_log, items[:1], counting, writer_id="C", epoch=3)
        return original(ids)

    b_log.item_states = c_finishes_x_first  # type: ignore[method-assign]
    report = run_items(b_log, items, counting, writer_id="B", epoch=late_epoch)
    assert sorted(calls) == ["x", "y"], f"x was invoked {calls.count('x')} times"
    assert "x" not in report.processed
    summary = a.summary()
    assert summary["completed"] == 2
    assert summary["fencing_violations"] == 0
    assert a.failures() == []
    assert {e.writer_id for e in a.events("x")[1:]} == {"C"}  # one trajectory after A's pull: C's


class _Died(BaseException):
    """Stands for a writer process dying right after its pull commit."""


@pytest.mark.parametrize("b_dies_after_its_pull", [False, True], ids=["b-acks", "b-dies-after-pull"])
def test_an_acknowledged_item_never_looks_pending_again(tmp_path: Path, b_dies_after_its_pull: bool) -> None:
    """Writer B planned while x was fresh; A completed x; B then pulls x with a newer epoch.

    B's ITEM_CREATED is an identical copy of A's (same event id), yet the fold lets the newer epoch's copy
    fence A's later events: x reads as running again until B acknowledges it, and for good if B dies in
    between, so the next run redoes acknowledged work. Readers and sensors see the completed count drop.
    """
    from airflow_provider_datagen.core.runner.driver import Runner as _Runner

    items = [{"id": "x", "n": 1}]
    calls: list[str] = []
    seen_by_reader: list[str] = []
    reader = CheckpointLog.open(tmp_path, pipeline="p", experiment="e")

    def counting(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        calls.append(ctx.item_id)
        return process(item, ctx)

    def b_process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        seen_by_reader.append(reader.item_state("x").status.value)  # between B's pull and B's ack
        seen_by_reader.append(str(reader.summary()["completed"]))
        return counting(item, ctx)

    a = CheckpointLog.open(tmp_path, pipeline="p", experiment="e")
    b = CheckpointLog.open(tmp_path, pipeline="p", experiment="e")
    stale_plan = b.states()  # B plans first: x is fresh
    run_items(a, items, counting, writer_id="A", epoch=1)
    assert reader.item_state("x").status.value == "completed"
    b.states_of = lambda ids: stale_plan  # type: ignore[method-assign]  # run_items reads its chunk's states
    original_pull = _Runner.pull

    def pull_then_die(self: Any, its: Any) -> None:
        original_pull(self, its)
        raise _Died

    try:
        if b_dies_after_its_pull:
            _Runner.pull = pull_then_die  # type: ignore[method-assign]
            with pytest.raises(_Died):
                run_items(b, items, b_process, writer_id="B", epoch=2)
        else:
            run_items(b, items, b_process, writer_id="B", epoch=2)
            assert seen_by_reader == ["completed", "1"], "x looked pending while B re-processed it"
    finally:
        _Runner.pull = original_pull  # type: ignore[method-assign]
    assert reader.item_state("x").status.value == "completed"
    assert reader.summary()["completed"] == 1
    calls.clear()
    report = run_items(reader, items, counting, writer_id="C", epoch=3)
    assert calls == [] and report.skipped == ["x"], "an acknowledged item was processed again"
