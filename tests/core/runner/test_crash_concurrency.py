"""SIGKILL a worker running ``run_items(concurrency=4)``, resume, compare with a sequential clean run.

The threaded path acknowledges items in completion order from private per-item buffers; a kill can land
while several items are in flight, between an inbox pull and its acknowledgements, or inside a commit.
Whatever the moment, every item the log calls done must have its full output, acknowledged items must
never be invoked again, and the resumed export must equal an uninterrupted sequential run's.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from typing import TYPE_CHECKING, Any

import pytest

from airflow_provider_datagen.core import export_results, run_items
from airflow_provider_datagen.core.export import collect_results
from tests._support import REPO
from tests._support.engine import Recorder, build_pipeline, make_items, open_log
from tests.core.runner.test_crash_resume import Kill, Schedule, check_after_kill, run_worker, worker_cmd

if TYPE_CHECKING:
    from pathlib import Path

N = 30
KILLS = [
    (None, Kill("invocation", 7)),
    (5, Kill("invocation", 13)),
    (None, Kill("pull", 1)),
    (5, Kill("commit", 3)),
    (5, Kill("before-commit", 3)),
    (3, Kill("commit", 6)),
]


def clean_run(root: Path, every: int | None, kind: str = "flat") -> tuple[dict[str, str], str]:
    log = open_log(root, f"clean-{kind}-{every}")
    run_items(log, make_items(N), build_pipeline(kind, Recorder()), checkpoint_every=every)
    return collect_results(log), export_results(log, str(root / f"clean-{kind}-{every}.lance"))


def resume_and_compare(
    log: Any,
    every: int | None,
    concurrency: int,
    acked: set[str],
    expected: dict[str, str],
    clean_fp: str,
    export_to: Path,
    kind: str = "flat",
) -> Recorder:
    """Resume a killed log; acknowledged items are not invoked again and the result equals a clean run."""
    rec = Recorder()
    run_items(
        log,
        make_items(N),
        build_pipeline(kind, rec),
        checkpoint_every=every,
        epoch=log.next_epoch(),
        concurrency=concurrency,
    )
    assert not acked & {c.split("/")[0] for c in rec.calls}  # acknowledged work is never redone
    assert collect_results(log) == expected
    assert export_results(log, str(export_to)) == clean_fp
    return rec


@pytest.mark.parametrize("resume_concurrency", [1, 4])
@pytest.mark.parametrize(("every", "kill"), KILLS, ids=[f"every{e}-{k.mode}@{k.after}" for e, k in KILLS])
def test_a_killed_threaded_run_resumes_to_the_sequential_result(
    tmp_path: Path, every: int | None, kill: Kill, resume_concurrency: int
) -> None:
    expected, clean_fp = clean_run(tmp_path, every)
    s = Schedule("threads", "flat", N, every, [kill])
    proc = run_worker(worker_cmd(tmp_path, s.name, s, kill, concurrency=4))
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    log = open_log(tmp_path, s.name)
    acked = check_after_kill(log, expected, str(s))
    assert len(acked) < N  # the kill really interrupted the run
    rec = resume_and_compare(log, every, resume_concurrency, acked, expected, clean_fp, tmp_path / "resumed.lance")
    assert sorted(rec.calls) == sorted(str(i) for i in range(N) if str(i) not in acked)


# checkpoint_every=1: threads hand every finished step over to be committed, so kills land mid-item too.
# "steps": every driver and a MapReduce fan-out; "nested": a fan-out inside a fan-out (grandchildren);
# "looped": a Loop running a fan-out again (generations of one child id).
FANOUT_KILLS = [
    ("steps", None, Kill("invocation", 20)),
    ("steps", None, Kill("pull", 1)),
    ("steps", 4, Kill("commit", 3)),
    ("steps", 1, Kill("invocation", 20)),
    ("steps", 1, Kill("commit", 12)),
    ("nested", None, Kill("invocation", 150)),
    ("nested", 1, Kill("commit", 20)),
    ("nested", 1, Kill("invocation", 200)),
    ("looped", 1, Kill("commit", 15)),
    ("looped", 1, Kill("invocation", 100)),
]
#: `make test` runs every kill; `make unit`, the inner loop, leaves these out (it keeps a kill of each kind)
_SLOW_KILLS = {3, 4, 6, 7, 9}


@pytest.mark.parametrize(
    ("kind", "every", "kill"),
    [
        pytest.param(
            p, e, k, id=f"{p}-every{e}-{k.mode}@{k.after}", marks=[pytest.mark.slow] if i in _SLOW_KILLS else []
        )
        for i, (p, e, k) in enumerate(FANOUT_KILLS)
    ],
)
def test_a_killed_threaded_fanout_run_resumes_to_the_sequential_result(
    tmp_path: Path, kind: str, every: int | None, kill: Kill
) -> None:
    """The same with fan-out pipelines: children, and their own children, run in threads."""
    expected, clean_fp = clean_run(tmp_path, every, kind)
    s = Schedule(f"{kind}-threads", kind, N, every, [kill])
    proc = run_worker(worker_cmd(tmp_path, s.name, s, kill, concurrency=4))
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    log = open_log(tmp_path, s.name)
    acked = check_after_kill(log, expected, str(s))
    assert len(acked) < N
    resume_and_compare(log, every, 4, acked, expected, clean_fp, tmp_path / "resumed.lance", kind)


def test_a_parent_sigkills_a_threaded_worker_at_random_moments(tmp_path: Path) -> None:
    rng = random.Random(20261130)
    env = dict(os.environ, PYTHONPATH=str(REPO), RUST_LOG="error")
    for attempt in range(3):
        every = rng.choice([3, None])
        expected, clean_fp = clean_run(tmp_path / f"clean-{attempt}", every)
        s = Schedule(f"delay-{attempt}", "flat", N, every, [])
        proc = subprocess.Popen(
            worker_cmd(tmp_path, s.name, s, None, sleep_ms=15, concurrency=4),
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            log = open_log(tmp_path, s.name)
            deadline = time.monotonic() + 60
            while not log.exists() and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.02)  # the first commit (the pull), then a random moment of the threaded run
            time.sleep(rng.uniform(0.0, 0.1))
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.communicate(timeout=60)
        acked = check_after_kill(log, expected, str(s))
        resume_and_compare(log, every, 4, acked, expected, clean_fp, tmp_path / f"resumed-{attempt}.lance")
