"""Crash schedules: ``run_items`` SIGKILLed at Hypothesis-chosen points, then resumed, equals the baseline.

Each schedule is one to three attempts of a 30- or 70-item run (a flat process, a step pipeline, or an
async process with eight calls in flight whose every fifth item is retried in place), each attempt
killed with SIGKILL at a point drawn by Hypothesis: a user-function call, right after an inbox pull
commit (before its acks), right before or after a commit, inside a Lance append (the server kills the
child a random 0-20 ms after the append starts), inside ``maintain()``, or at a random wall-clock time.
A clean resume then runs in a fresh process. For every schedule:

- the export fingerprint equals the uninterrupted baseline's (``export_results``);
- the resume invoked exactly the items that were not acknowledged before it (nothing acked is redone);
- every item is completed, nothing stays pending, no fencing violation appears.

Processes come from two warm servers (:mod:`tests._support.workers.schedule`) that fork a child per
attempt, so 200+ schedules fit in a couple of minutes on two cores. ``DATAGEN_CRASH_SEED=<int>`` draws
a different set of schedules (the default is derandomized, so CI runs are reproducible);
``DATAGEN_CRASH_BATCHES`` scales the run (batches of 20 schedules, 10 by default).
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from tests._support import REPO
from tests._support.profiles import examples

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

CHECKPOINT_EVERY = [1, 3, 10, None]
MODES = ["invocation", "pull", "commit", "before_commit", "in_commit", "in_maintain", "wall"]
BATCH = 20
BATCHES = int(os.environ.get("DATAGEN_CRASH_BATCHES", "10"))
SEED = os.environ.get("DATAGEN_CRASH_SEED")
SERVERS = max(2, min(4, os.cpu_count() or 2))


class ScheduleServer:
    """One warm schedule server (``workers/schedule.py``): a JSON request per line in, a JSON reply per line out."""

    def __init__(self) -> None:
        env = dict(os.environ, LANCE_LOG="error", PYTHONPATH=str(REPO))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests._support.workers.schedule"],
            cwd=REPO,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert self.proc.stdout is not None and self.proc.stdin is not None
        ready = self.proc.stdout.readline()
        assert json.loads(ready) == {"ready": True}, f"schedule server did not start: {ready!r}"

    def run(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"schedule server {self.proc.pid} died (exit {self.proc.poll()})")
        return json.loads(line)

    def stop(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()  # by our own PID
                self.proc.wait()


class Pool:
    def __init__(self, n: int) -> None:
        self.servers = [ScheduleServer() for _ in range(n)]
        self.free: queue.Queue[ScheduleServer] = queue.Queue()
        for s in self.servers:
            self.free.put(s)
        self.executor = ThreadPoolExecutor(max_workers=n)

    def _one(self, request: dict[str, Any]) -> dict[str, Any]:
        server = self.free.get()
        try:
            return server.run(request)
        finally:
            self.free.put(server)

    def run_all(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return list(self.executor.map(self._one, requests))

    def stop(self) -> None:
        self.executor.shutdown()
        for s in self.servers:
            s.stop()


@pytest.fixture(scope="module")
def pool() -> Iterator[Pool]:
    p = Pool(SERVERS)
    try:
        yield p
    finally:
        p.stop()


# --- schedules -----------------------------------------------------------------------------------------


def _estimated(kind: str, n: int, ce: int | None) -> tuple[int, int]:
    """Rough (commits, invocations) of one uninterrupted run, to scale the drawn kill points."""
    invocations = round(n * {"flat": 1, "async": 1.2}.get(kind, 7))  # async: every fifth item retried once
    per_item = 1 + (n if kind in ("flat", "async") else invocations)
    commits = per_item if ce == 1 else 1 + -(-n // (ce or 512)) + (n > 64)
    return commits, invocations


@st.composite
def crash_attempt(draw: st.DrawFn, kind: str, n: int) -> dict[str, Any]:
    mode = draw(st.sampled_from(MODES))
    ce = draw(st.sampled_from(CHECKPOINT_EVERY))
    commits, invocations = _estimated(kind, n, ce)
    frac = draw(st.floats(0.0, 1.15))
    scale = {"invocation": invocations, "pull": 1 + (n > 64), "wall": 1}.get(mode, commits)
    k = max(1, round(frac * scale))
    if mode == "wall":
        delay_us = draw(st.integers(0, 700_000))
    elif mode == "in_maintain":
        delay_us = draw(st.integers(0, 80_000))
    else:
        # sub-millisecond up to tens of milliseconds after the append started
        delay_us = draw(st.one_of(st.integers(0, 1_000), st.integers(1_000, 20_000)))
    return {"mode": mode, "checkpoint_every": ce, "k": k, "delay_us": delay_us}


@st.composite
def schedule(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(["flat", "flat", "flat", "steps", "async"]))
    n = draw(st.sampled_from([30, 30, 30, 30, 70]))
    crashes = draw(st.lists(crash_attempt(kind, n), min_size=1, max_size=3))
    return {
        "kind": kind,
        "n_items": n,
        "crashes": crashes,
        "resume_checkpoint_every": draw(st.sampled_from(CHECKPOINT_EVERY)),
    }


def _every_mode_once() -> list[dict[str, Any]]:
    """An explicit batch: every kill mode with every checkpoint_every, early and late kill points."""
    out = []
    for i, mode in enumerate(MODES):
        for j, ce in enumerate(CHECKPOINT_EVERY):
            commits, invocations = _estimated("flat", 30, ce)
            k = {"invocation": 1 + (7 * i + 11 * j) % invocations, "pull": 1}.get(mode, 1 + (i + j) % commits)
            delay = {"wall": 40_000 * (j + 1), "in_maintain": 5_000 * j}.get(mode, 200 * (j + 1) * (i + 1))
            out.append(
                {
                    "kind": ["steps", "async", "flat"][(i + j) % 3],
                    "n_items": 30,
                    "crashes": [{"mode": mode, "checkpoint_every": ce, "k": k, "delay_us": delay}],
                    "resume_checkpoint_every": CHECKPOINT_EVERY[(j + 1) % 4],
                }
            )
    return out


# --- checks --------------------------------------------------------------------------------------------


def _problems(sched: dict[str, Any], reply: dict[str, Any], baseline: dict[tuple[str, int], str]) -> list[str]:
    if "server_error" in reply:
        return [f"server error: {reply['server_error']}"]
    bad = [
        f"attempt {i} failed instead of dying: {a['error']}" for i, a in enumerate(reply["attempts"]) if "error" in a
    ]
    resume = reply["resume"]
    if not resume.get("ok"):
        return [*bad, f"the resume raised: {resume.get('error')}"]
    r = resume["value"]
    n = sched["n_items"]
    everything = {str(i) for i in range(n)}
    expected = baseline[(sched["kind"], n)]
    if r["fingerprint"] != expected:
        bad.append(f"export fingerprint {r['fingerprint'][:16]} != baseline {expected[:16]} ({r['rows']} rows)")
    if r["rows"] != n or r["completed"] != n or r["pending"] or r["pending_after"]:
        bad.append(f"not all done: rows={r['rows']} completed={r['completed']} pending={r['pending']}")
    redo = everything - set(r["done_before"])
    if set(r["processed"]) != redo or len(r["processed"]) != len(redo):
        bad.append(
            f"the resume processed {len(r['processed'])} items but {len(redo)} were unacknowledged "
            f"(extra {sorted(set(r['processed']) - redo)[:5]}, missing {sorted(redo - set(r['processed']))[:5]})"
        )
    if set(r["skipped"]) != set(r["done_before"]):
        bad.append("the resume skipped a different set than the acknowledged items")
    if sched["kind"] == "flat" and r["invocations"] != len(redo):
        bad.append(f"{r['invocations']} invocations for {len(redo)} unacknowledged items")
    if r["failed"]:
        bad.append(f"items failed in the resume: {r['errors']}")
    if r["fencing_violations"]:
        bad.append(f"{r['fencing_violations']} fencing violations")
    return bad


def test_crash_schedules_resume_to_the_uninterrupted_export(
    pool: Pool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    started = time.monotonic()
    root = tmp_path / "logs"
    root.mkdir()
    counter = {"n": 0}
    lock = threading.Lock()

    def request(sched: dict[str, Any]) -> dict[str, Any]:
        with lock:
            counter["n"] += 1
            sid = counter["n"]
        return {
            **sched,
            "id": sid,
            "root": str(root),
            "experiment": f"s{sid}",
            "export": str(tmp_path / f"out{sid}.lance"),
        }

    kinds = [("flat", 30), ("steps", 30), ("flat", 70), ("steps", 70), ("async", 30), ("async", 70)]
    base_replies = pool.run_all(
        [request({"kind": k, "n_items": n, "crashes": [], "resume_checkpoint_every": None}) for k, n in kinds]
    )
    baseline: dict[tuple[str, int], str] = {}
    for (k, n), reply in zip(kinds, base_replies):
        assert reply["resume"]["ok"], reply
        value = reply["resume"]["value"]
        calls = {"flat": n, "async": n + len(range(0, n, 5))}.get(k, n * 7)  # async: every fifth item twice
        assert value["rows"] == n and value["invocations"] == calls
        baseline[(k, n)] = value["fingerprint"]
    # the async process computes the flat one's output: the same export
    assert baseline[("async", 30)] == baseline[("flat", 30)] and baseline[("async", 70)] == baseline[("flat", 70)]

    stats = {"tried": 0, "passed": 0, "attempts": 0, "killed": 0, "orphan_schedules": 0, "modes": {}}
    failures: list[str] = []

    phases = [Phase.explicit, Phase.generate]  # a failing schedule is printed whole; no slow shrinking
    derandomize = SEED is None

    @settings(
        max_examples=examples(BATCHES),
        deadline=None,
        database=None,
        derandomize=derandomize,
        phases=phases,
        suppress_health_check=list(HealthCheck),
    )
    @example(batch=_every_mode_once())
    @given(batch=st.lists(schedule(), min_size=BATCH, max_size=BATCH))
    def run_batch(batch: list[dict[str, Any]]) -> None:
        requests = [request(s) for s in batch]
        replies = pool.run_all(requests)
        for req, reply in zip(requests, replies):
            stats["tried"] += 1
            for a in reply.get("attempts", []):
                stats["attempts"] += 1
                stats["killed"] += a["killed"]
                m = stats["modes"].setdefault(a["mode"], [0, 0])
                m[0] += 1
                m[1] += a["killed"]
            if reply.get("resume", {}).get("ok") and reply["resume"]["value"]["orphan_data_files"]:
                stats["orphan_schedules"] += 1
            problems = _problems(req, reply, baseline)
            if problems:
                shown = {k: req[k] for k in req if k != "root"}
                failures.append(json.dumps({"schedule": shown, "problems": problems}))
            else:
                stats["passed"] += 1

    if SEED is not None:
        run_batch = hypothesis_seed(int(SEED))(run_batch)
    run_batch()

    elapsed = time.monotonic() - started
    modes = ", ".join(f"{m} {k}/{n}" for m, (n, k) in sorted(stats["modes"].items()))
    with capsys.disabled():
        sys.stdout.write(
            f"\ncrash schedules: {stats['tried']} tried, {stats['passed']} passed in {elapsed:.0f}s "
            f"({stats['attempts']} attempts, {stats['killed']} killed by SIGKILL; killed/attempts by mode: "
            f"{modes}; {stats['orphan_schedules']} schedules left unreferenced data files of a torn commit)\n"
        )
    assert not failures, f"{len(failures)} of {stats['tried']} schedules failed:\n" + "\n".join(failures[:10])
    assert stats["tried"] >= BATCH * BATCHES
    # the harness really kills: most attempts die, and every kill mode landed at least once
    assert stats["killed"] >= stats["attempts"] // 2
    assert all(killed for _, killed in stats["modes"].values()), stats["modes"]
