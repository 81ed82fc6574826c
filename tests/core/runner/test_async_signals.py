"""An orchestrator's SIGTERM during an async run: its handler's error ends the run, as with threads.

Airflow's task runner handles SIGTERM with a Python handler that raises. On the event loop such an
error raised inside a task would fail one item, and inside a plain callback asyncio would log and drop
it; the async driver runs the handler itself between acknowledgements. The run must end with the
handler's error, keep the acknowledged items, leave nothing running, restore the handler, and resume
to the uninterrupted result.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from typing import TYPE_CHECKING, Any

import pytest

from airflow_provider_datagen.core import ItemStatus, run_items
from tests._support import REPO
from tests._support.engine import flat_output, make_items, open_log, results_fp, statuses

if TYPE_CHECKING:
    from pathlib import Path

N = 600

_CHILD = textwrap.dedent(
    """
    import asyncio, json, signal, sys
    sys.path.insert(0, {repo!r})
    from airflow_provider_datagen.core import run_items
    from tests._support.engine import flat_output, make_items, open_log

    class Terminated(BaseException):
        pass

    def on_term(signum, frame):
        raise Terminated("the task received SIGTERM")

    signal.signal(signal.SIGTERM, on_term)
    calls = {{"started": 0, "running": 0}}

    async def process(item, ctx):
        calls["started"] += 1
        if calls["started"] == 60:
            open({marker!r}, "w").close()  # the parent sends SIGTERM now
        calls["running"] += 1
        try:
            await asyncio.sleep(0.02)
        finally:
            calls["running"] -= 1
        return flat_output(item)

    log = open_log({root!r}, "term")
    try:
        run_items(log, make_items({n}), process, concurrency=16, reraise=(Terminated,))
    except Terminated as exc:
        restored = signal.getsignal(signal.SIGTERM) is on_term
        print(json.dumps({{"raised": str(exc), "calls": calls, "handler_restored": restored}}))
        sys.exit(3)
    print(json.dumps({{"raised": None, "calls": calls}}))
    """
)


def test_sigterm_ends_an_async_run_through_the_handlers_error(tmp_path: Path) -> None:
    marker = str(tmp_path / "busy")
    code = _CHILD.format(repo=str(REPO), marker=marker, root=str(tmp_path), n=N)
    child = subprocess.Popen(
        [sys.executable, "-c", code], cwd=str(REPO), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 120
        while not os.path.exists(marker):
            assert child.poll() is None, child.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "the child never got busy"
            time.sleep(0.01)
        child.send_signal(signal.SIGTERM)
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()  # by its own PID
            child.wait()
    assert child.returncode == 3, err[-2000:]
    reply: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    assert reply["raised"] == "the task received SIGTERM"
    assert reply["handler_restored"] is True
    calls = reply["calls"]
    assert calls["started"] < N  # the run ended early, by the handler's error
    assert calls["running"] == 0  # the calls in flight were cancelled, none left running
    log = open_log(tmp_path, "term")
    done = {iid for iid, s in statuses(log).items() if s == ItemStatus.COMPLETED.value}
    assert 0 < len(done) < N and log.failures() == []  # acknowledgements kept, no item failed for it

    clean = open_log(tmp_path, "clean")
    run_items(clean, make_items(N), lambda item, ctx: flat_output(item))

    async def process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        return flat_output(item)

    report = run_items(log, make_items(N), process, concurrency=16, epoch=log.next_epoch())
    assert set(report.processed) == {str(i) for i in range(N)} - done
    assert results_fp(log) == results_fp(clean)


class Alarm(BaseException):
    """What an orchestrator's handler raises (outside Exception, as Airflow's timeout and termination)."""


def test_a_handler_runs_in_the_driver_not_in_the_item_that_was_running(tmp_path: Path) -> None:
    """Each call is busy on the CPU when the alarm fires: run inside that task, the handler's error would
    fail that item (a FAILED row naming Alarm); run by the driver, it ends the run and fails no item."""

    def on_alarm(signum: int, frame: Any) -> None:
        raise Alarm("time is up")

    async def busy(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        until = time.monotonic() + 0.003
        while time.monotonic() < until:  # user code holding the loop, as a parser or tokenizer would
            pass
        await asyncio.sleep(0)
        return flat_output(item)

    previous = signal.signal(signal.SIGALRM, on_alarm)
    log = open_log(tmp_path, "alarm")
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        with pytest.raises(Alarm, match="time is up"):
            run_items(log, make_items(5000), busy, concurrency=8)
        assert signal.getsignal(signal.SIGALRM) is on_alarm  # restored after the run
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert log.failures() == []
    done = [s for s in statuses(log).values() if s == ItemStatus.COMPLETED.value]
    assert 0 < len(done) < 5000
