"""Pipelined group commit: the default run appends on a committer thread while the next items run.

The contract under test: batches are validated and sequenced before the caller goes on; at most one
append is in flight; reads of the log, the next commit and the end of ``run_items`` wait for it; an
append that fails surfaces as the run's error, poisons the writer, and a rerun completes to the same
results. Explicit ``checkpoint_every=N`` stays synchronous. Real Lance logs throughout.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

import pytest

from airflow_provider_datagen.core import CheckpointLog, run_items
from airflow_provider_datagen.core.store.batch import Batch
from airflow_provider_datagen.exceptions import InvalidEventError, LogWriteError
from tests._support.engine import flat_output, make_items, open_log, results_fp, statuses

if TYPE_CHECKING:
    from airflow_provider_datagen.core.store.writer import LogWriter

N = 30


def _process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
    return flat_output(item)


class AppendSpy:
    """Wraps ``CheckpointLog.append``: records the thread of each append and can hold or fail one."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.threads: list[str] = []
        self.hold: dict[int, threading.Event] = {}
        self.fail_at: int | None = None
        self.released_in_time: list[bool] = []
        self.slow = 0.0
        self.landed = 0
        original = CheckpointLog.append

        def append(log: CheckpointLog, table: Any) -> None:
            n = len(self.threads)
            self.threads.append(threading.current_thread().name)
            if n in self.hold:
                self.released_in_time.append(self.hold[n].wait(timeout=5))
            if n == self.fail_at:
                raise LogWriteError(f"appending a batch on {log.uri} failed: injected")
            if self.slow:
                time.sleep(self.slow)
            original(log, table)
            self.landed += 1

        monkeypatch.setattr(CheckpointLog, "append", append)


def test_default_group_commit_appends_on_the_committer_thread(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    spy = AppendSpy(monkeypatch)
    log = open_log(tmp_path, "pipelined")
    run_items(log, make_items(N), _process)
    assert spy.threads and all(t.startswith("datagen-commit") for t in spy.threads), spy.threads
    assert log.inflight is None and log.committer is None  # nothing in flight, no thread left
    assert set(statuses(log).values()) == {"completed"}


@pytest.mark.parametrize("every", [1, 5])
def test_an_explicit_checkpoint_cadence_commits_synchronously(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, every: int
) -> None:
    spy = AppendSpy(monkeypatch)
    log = open_log(tmp_path, f"sync-{every}")
    run_items(log, make_items(N), _process, checkpoint_every=every)
    assert spy.threads and set(spy.threads) == {threading.current_thread().name}


def test_items_run_while_their_inbox_commit_is_in_flight(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # The first append (the first inbox pull) waits until the first item's process has started; a
    # synchronous commit would wait the full timeout, because that item cannot start before it lands.
    spy = AppendSpy(monkeypatch)
    started = threading.Event()
    spy.hold[0] = started

    def process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        started.set()
        return flat_output(item)

    log = open_log(tmp_path, "overlap")
    run_items(log, make_items(N), process)
    assert spy.released_in_time == [True]
    assert set(statuses(log).values()) == {"completed"}


def _log_with_item(root: Any, name: str) -> tuple[CheckpointLog, LogWriter]:
    """A log holding item ``a`` (created, synchronously) and the writer that created it."""
    log = open_log(root, name)
    w = log.writer("w1", 1)
    w.prime("a", last_seq=-1)
    with w.batch() as b:
        b.item_created("a", input_fingerprint="f")
    return log, w


def test_a_read_waits_for_the_append_in_flight(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    spy = AppendSpy(monkeypatch)
    release = threading.Event()
    spy.hold[1] = release
    log, w = _log_with_item(tmp_path, "read-your-writes")
    b2 = Batch(w)
    b2.terminal("a")
    w.commit(b2, wait=False)
    assert log.inflight is not None
    threading.Timer(0.2, release.set).start()
    assert log.item_state("a").status.value == "completed"  # waited for the pipelined TERMINAL
    assert spy.released_in_time == [True]
    w.sync()
    assert log.committer is None


def test_a_failed_pipelined_append_poisons_the_writer(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    spy = AppendSpy(monkeypatch)
    spy.fail_at = 1
    log, w = _log_with_item(tmp_path, "poisoned")
    b2 = Batch(w)
    b2.field_set("a", "x", 1)
    w.commit(b2, wait=False)  # validated and staged here; the append fails on the committer thread
    with pytest.raises(LogWriteError, match="injected"):
        w.sync()
    b3 = Batch(w)
    b3.terminal("a")
    with pytest.raises(LogWriteError, match="lost a pipelined append"):
        w.commit(b3)
    st = log.item_state("a")
    assert st.status.value == "running" and st.last_seq == 0 and not st.fields  # nothing after the loss landed
    # a new writer picks up from what the log really holds
    w2 = log.writer("w1", 1)
    with w2.batch() as b4:
        b4.terminal("a")
    assert log.item_state("a").status.value == "completed"


def test_validation_errors_still_raise_before_any_write(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    spy = AppendSpy(monkeypatch)
    log, w = _log_with_item(tmp_path, "invalid")
    with w.batch() as b:
        b.field_set("a", "x", 1)
    bad = Batch(w)
    bad.field_append("a", "x", 2)  # a set field cannot take an append
    with pytest.raises(InvalidEventError):
        w.commit(bad, wait=False)
    assert len(spy.threads) == 2 and log.inflight is None
    ok = Batch(w)
    ok.terminal("a")
    w.commit(ok, wait=False)
    w.sync()
    assert log.item_state("a").status.value == "completed"


def test_a_failed_append_fails_the_run_and_the_rerun_equals_a_clean_run(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    items = make_items(N)
    clean = open_log(tmp_path, "clean")
    run_items(clean, items, _process)
    spy = AppendSpy(monkeypatch)
    spy.fail_at = 2  # pull 1, its ack (or the next pull), then the failure
    log = open_log(tmp_path, "failing")
    with pytest.raises(LogWriteError, match="injected"):
        run_items(log, items, _process, checkpoint_interval=0.0)
    assert log.inflight is None
    landed = sum(v == "completed" for v in statuses(log).values())
    assert landed < N
    monkeypatch.undo()
    calls: list[str] = []

    def recording(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        calls.append(ctx.item_id)
        return flat_output(item)

    report = run_items(log, items, recording, epoch=log.next_epoch())
    assert len(report.skipped) == landed and len(calls) == N - landed
    assert results_fp(log) == results_fp(clean)


class Stop(BaseException):
    """An orchestrator's timeout, raised from inside a process function."""


def test_a_run_ended_by_reraise_leaves_no_append_in_flight(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    spy = AppendSpy(monkeypatch)
    spy.slow = 0.05  # every append is slow, so one is still being written when the run ends
    seen: list[str] = []

    def process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        seen.append(ctx.item_id)
        if len(seen) == 20:
            assert log.inflight is not None and not log.inflight.done()
            raise Stop
        return flat_output(item)

    log = open_log(tmp_path, "reraise")
    with pytest.raises(Stop):
        run_items(log, make_items(N), process, checkpoint_interval=0.0, reraise=(Stop,))
    assert log.inflight is None and log.committer is None
    assert spy.landed == len(spy.threads)  # the append in flight finished before run_items raised
    done = {i for i, v in statuses(log).items() if v == "completed"}
    assert done == set(seen[:19])  # interval 0: every finished item was acknowledged, and landed


def test_auto_maintenance_inside_a_pipelined_append_does_not_deadlock(tmp_path: Any) -> None:
    # every item its own commit (interval 0): over 32 appends, so the fragment check runs, and the
    # maintenance it starts reads the log from the committer thread itself
    log = CheckpointLog.open(tmp_path, pipeline="p", experiment="auto", auto_maintain_fragments=4)
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(run_items(log, make_items(40), _process, checkpoint_interval=0.0))
        except BaseException as exc:
            outcome.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(120)
    assert not t.is_alive(), "run_items hung: the committer waited for itself"
    assert len(outcome) == 1 and not isinstance(outcome[0], BaseException), outcome
    assert outcome[0].commits > 32
    assert len(log.table.dataset().get_fragments()) < outcome[0].commits  # maintenance compacted
    assert set(statuses(log).values()) == {"completed"}
