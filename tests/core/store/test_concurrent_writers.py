"""Four writer processes append to one log at once: nothing is lost, nothing is counted twice.

The workers are real processes (``spawn``), each with its own CheckpointLog handle, so every commit
goes through Lance's optimistic concurrency exactly as mapped Airflow tasks would.
"""

from __future__ import annotations

import multiprocessing as mp
import traceback
from collections import Counter
from typing import TYPE_CHECKING, Any

import lance
import pytest

from airflow_provider_datagen.core import CheckpointLog, ItemStatus

if TYPE_CHECKING:
    from pathlib import Path

    import pyarrow as pa

WORKERS = 4
OWN_ITEMS = 30
GROUP = 5
SHARED_ITEMS = 3
TIMEOUT = 120


def _recording(lg: CheckpointLog, written: list[str]) -> None:
    """Remember the event ids of every batch this process committed."""
    append = lg.append

    def record(table: pa.Table) -> None:
        append(table)
        written.extend(table["event_id"].to_pylist())

    lg.append = record  # type: ignore[method-assign]


def _workload(root: str, worker: int, barrier: Any, results: Any) -> None:
    try:
        lg = CheckpointLog.open(root, pipeline="conc", experiment="e1")
        written: list[str] = []
        _recording(lg, written)
        w = lg.writer(f"writer-{worker}", 1, processor_version="v1")
        barrier.wait(TIMEOUT)  # everybody starts on a log that does not exist yet
        items = [f"w{worker}-{k}" for k in range(OWN_ITEMS)]
        for g in range(0, OWN_ITEMS, GROUP):
            group = items[g : g + GROUP]
            with w.batch() as b:  # pull: the group enters the inbox in one commit
                for item in group:
                    b.item_created(item, input_fingerprint=f"fp-{item}")
                    b.step_started(item, step="gen")
            with w.batch() as b:  # acknowledge: deltas, cursor and terminal in one commit
                for item in group:
                    b.field_set(item, "answer", {"by": worker, "item": item})
                    b.field_append(item, "votes", 1)
                    b.field_append(item, "votes", 2)
                    b.step_completed(item, step="gen")
                    b.terminal(item, status="completed")
        # every worker also redoes the same deterministic batch for the shared items, as a retried
        # attempt would: same ids, so the fold must count each event once
        retry = lg.writer(f"retry-{worker}", 1, processor_version="v1")
        shared = [f"shared-{k}" for k in range(SHARED_ITEMS)]
        for item in shared:
            retry.prime(item, last_seq=-1)
        with retry.batch() as b:
            for item in shared:
                b.item_created(item, input_fingerprint="fp-shared")
                b.field_set(item, "answer", {"shared": item})
                b.step_completed(item, step="gen")
                b.terminal(item, status="completed")
        results.put((worker, "ok", written, w.commits + retry.commits))
    except BaseException:
        results.put((worker, "error", traceback.format_exc(), 0))


def _creation_race(root: str, worker: int, barrier: Any, results: Any) -> None:
    try:
        out = []
        for exp in range(5):
            lg = CheckpointLog.open(root, pipeline="race", experiment=f"e{exp}")
            w = lg.writer(f"writer-{worker}", 1)
            w.prime(f"item-{worker}", last_seq=-1)
            barrier.wait(TIMEOUT)
            with w.batch() as b:
                b.item_created(f"item-{worker}", input_fingerprint="f")
                b.field_set(f"item-{worker}", "raw", f"bytes of {worker}".encode())
                b.terminal(f"item-{worker}")
            out.append(exp)
        results.put((worker, "ok", out, 0))
    except BaseException:
        results.put((worker, "error", traceback.format_exc(), 0))


def _run(target: Any, root: Path) -> list[tuple[int, str, Any, int]]:
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(WORKERS)
    results = ctx.Queue()
    procs = [ctx.Process(target=target, args=(str(root), i, barrier, results)) for i in range(WORKERS)]
    for p in procs:
        p.start()
    try:
        out = [results.get(timeout=TIMEOUT) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=TIMEOUT)
            if p.is_alive():
                p.kill()
    errors = [r[2] for r in out if r[1] != "ok"]
    assert not errors, "\n".join(errors)
    assert all(p.exitcode == 0 for p in procs)
    return sorted(out)


def test_four_writers_append_at_once(tmp_path: Path) -> None:
    out = _run(_workload, tmp_path)
    lg = CheckpointLog.open(tmp_path, pipeline="conc", experiment="e1")
    rows = lance.dataset(lg.uri).to_table(columns=["event_id", "item_id"])
    stored = Counter(rows["event_id"].to_pylist())
    written = Counter(eid for _, _, ids, _ in out for eid in ids)

    # nothing lost, nothing invented: every acknowledged event is stored, once per commit of it
    assert stored == written
    own_events = OWN_ITEMS * 7
    shared_events = SHARED_ITEMS * 4
    assert len(stored) == WORKERS * own_events + shared_events
    assert sum(stored.values()) == WORKERS * (own_events + shared_events)
    assert {n for eid, n in stored.items() if n != 1} <= {WORKERS}  # only the shared retries repeat
    # every commit is one version; no commit was lost or merged
    assert lg.version == sum(commits for *_, commits in out)

    # the fold counts each event once and sees every item completed
    states = lg.states()
    assert states.num_rows == WORKERS * OWN_ITEMS + SHARED_ITEMS
    assert set(states["status"].to_pylist()) == {ItemStatus.COMPLETED.value}
    assert set(states["violations"].to_pylist()) == {0}
    summary = lg.summary()
    assert summary["completed"] == summary["total"] == WORKERS * OWN_ITEMS + SHARED_ITEMS
    assert summary["fencing_violations"] == 0
    for worker in range(WORKERS):
        for k in (0, OWN_ITEMS - 1):
            item = f"w{worker}-{k}"
            st = lg.item_state(item)
            assert st.fields == {"answer": {"by": worker, "item": item}, "votes": [1, 2]}
            assert [e.item_seq for e in lg.events(item)] == list(range(7))
            assert {e.writer_id for e in lg.events(item)} == {f"writer-{worker}"}
    for k in range(SHARED_ITEMS):
        st = lg.item_state(f"shared-{k}")
        assert st.status is ItemStatus.COMPLETED
        assert st.violations == []
        assert st.fields == {"answer": {"shared": f"shared-{k}"}}
        assert len(lg.events(f"shared-{k}")) == 4


def test_four_writers_racing_to_create_the_log(tmp_path: Path) -> None:
    _run(_creation_race, tmp_path)
    for exp in range(5):
        lg = CheckpointLog.open(tmp_path, pipeline="race", experiment=f"e{exp}")
        # all four first batches survived: none replaced another's dataset
        assert lg.version == WORKERS, f"experiment e{exp}"
        assert lg.stats()["events"] == WORKERS * 3
        states = lg.states()
        assert sorted(states["item_id"].to_pylist()) == [f"item-{i}" for i in range(WORKERS)]
        assert set(states["status"].to_pylist()) == {"completed"}
        # row ids stay unique and blobs are reachable whichever writer created the dataset
        rowids = lance.dataset(lg.uri).to_table(columns=["event_id"], with_row_id=True)["_rowid"].to_pylist()
        assert len(set(rowids)) == len(rowids)
        for i in range(WORKERS):
            assert lg.item_state(f"item-{i}").fields["raw"].load() == f"bytes of {i}".encode()


@pytest.mark.parametrize(
    "layout",
    [
        pytest.param([], id="empty-directory"),
        pytest.param(["data/"], id="data-directory"),
        pytest.param(["data/0001.lance"], id="data-file"),
        pytest.param(["data/0001.lance", "_transactions/0-x.txn"], id="transaction"),
        pytest.param(["data/0001.lance", "_transactions/0-x.txn", "_versions/.tmp_1"], id="manifest-in-flight"),
    ],
)
def test_a_creation_in_flight_reads_as_an_empty_log(tmp_path: Path, layout: list[str]) -> None:
    # what a reader may list while another process creates the log (or after a creator crashed
    # before its first commit): an empty log, never "not a dataset"; the next writer creates it there
    lg = CheckpointLog.open(tmp_path, pipeline="race", experiment="r", blob_threshold=16)
    path = tmp_path / "datagen_checkpoints" / "race" / "r" / "log.lance"
    path.mkdir(parents=True)
    for entry in layout:
        target = path / entry
        if entry.endswith("/"):
            target.mkdir(parents=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(b"")
    reader = CheckpointLog.open(tmp_path, pipeline="race", experiment="r")
    assert not reader.exists()
    assert reader.states().num_rows == 0
    assert reader.maintain()["skipped"] is True
    with lg.writer("w", 1).batch() as b:
        b.item_created("5", input_fingerprint="f")
        b.field_set("5", "doc", {"text": "x" * 100})
    assert reader.exists()
    assert reader.item_state("5").fields["doc"].load() == {"text": "x" * 100}
