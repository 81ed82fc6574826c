"""A reply that arrived is never asked again after a SIGKILL, on either engine: the response store keeps
it (written behind, every 0.1 s), though its item was not yet acknowledged (group commit: 2 s)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests._support import openai_server

if TYPE_CHECKING:
    from tests._support.openai_server import Request

REPO = Path(__file__).resolve().parents[2]
N = 300
#: the contract: a reply sent more than this long before the kill is never asked again
MARGIN = 0.2


@pytest.mark.parametrize(("engine", "kill_after"), [("sdk", 40), ("sdk", 120), ("pydantic-ai", 60)])
def test_a_reply_that_arrived_before_a_sigkill_is_not_requested_again(
    tmp_path: Path, engine: str, kill_after: int
) -> None:
    answered: dict[str, float] = {}
    lock = threading.Lock()

    def slow(request: Request) -> None:
        time.sleep(0.02)  # a model's latency: the run is mid-way for a while
        with lock:
            answered.setdefault(request.text, time.monotonic())  # answered right after this returns

    server = openai_server.start(on_arrival=slow)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "tests._support.workers.responses", "--root", str(tmp_path)]
    cmd += ["--experiment", "e", "--n-items", str(N), "--base-url", server.base_url, "--engine", engine]
    try:
        worker = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 120
        while len(answered) < kill_after and worker.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(0.3)
        killed_at = time.monotonic()
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
        assert worker.returncode == -signal.SIGKILL, worker.stderr.read() if worker.stderr else ""
        with lock:
            before = {text for text, at in answered.items() if at < killed_at - MARGIN}
        assert len(before) >= kill_after
        seen = len(server.requests)
        rerun = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
        assert rerun.returncode == 0, rerun.stderr[-2000:]
        asked_again = [r.text for r in server.requests[seen:] if r.text in before]
        assert asked_again == []
        # and every prompt was answered once in all
        assert {r.text for r in server.requests} == {f"Repeat word {k}" for k in range(N)}
    finally:
        server.stop()


# workers killed by signal, each a fresh interpreter: `make test` runs these, `make unit` leaves them out
pytestmark = pytest.mark.slow
