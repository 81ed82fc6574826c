"""SIGKILL a ``run_batch`` worker process (tests/core/batch/worker.py) and resume: nothing is paid twice.

The fake batch server lives in this process while the worker, a process of its own, is killed: inside
``batches.create`` (the server holds the create after registering the batch, ``create_delay``) and
right after a commit of result rows. The resumed run must end with one batch per chunk at the server,
every row asked once, and a ledger equal to an uninterrupted run's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

import pytest

from airflow_provider_datagen.core.batch.run import EXPERIMENT_KEY
from airflow_provider_datagen.core.export import collect_results
from airflow_provider_datagen.core.store import batches
from dev.batch_server import FakeBatchServer, serving
from tests._support import REPO
from tests.core.batch.helpers import anthropic_step, bases, make_items, open_experiment, openai_step, run

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from airflow_provider_datagen.core import CheckpointLog

N, CHUNK = 30, 10


@pytest.fixture
def fake() -> Iterator[FakeBatchServer]:
    with serving(complete_after_polls=2, shuffle_results=True) as server:
        yield server


def _worker(root: Path, experiment: str, fake: FakeBatchServer, *flags: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "tests.core.batch.worker", "--root", str(root), "--experiment", experiment]
    base_url = fake.anthropic_base_url if "anthropic" in flags else fake.base_url
    cmd += ["--base-url", base_url, "--n-items", str(N), "--max-requests", str(CHUNK), *flags]
    env = dict(os.environ, PYTHONPATH=str(REPO), RUST_LOG="error")
    return subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


def _of(fake: FakeBatchServer, log: CheckpointLog) -> list[Any]:
    """The server's batches of ``log``'s experiment (its metadata names it)."""
    name = f"{log.pipeline}/{log.experiment}"
    return [b for b in fake.batches if b.metadata.get(EXPERIMENT_KEY) == name]


def _kill_inside_create(fake: FakeBatchServer, root: Path, *flags: str) -> None:
    """Start a worker on experiment "killed" and SIGKILL it while the server holds its first create."""
    fake.create_delay = 120.0  # ended by the kill (and the server's stop), never waited out
    before = fake.creates
    worker = _worker(root, "killed", fake, *flags)
    try:
        deadline = time.monotonic() + 120
        while fake.creates == before:
            assert worker.poll() is None, worker.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the worker never reached the batch create call"
            time.sleep(0.02)
    finally:
        os.kill(worker.pid, signal.SIGKILL)  # by its own PID, also when the wait failed
    assert worker.wait(timeout=60) == -signal.SIGKILL
    fake.create_delay = 0.0


def _baseline(fake: FakeBatchServer, root: Path) -> CheckpointLog:
    log = open_experiment(root, "baseline")
    report = run(log, make_items(N), openai_step(fake.base_url, max_requests_per_batch=CHUNK))
    assert len(report.processed) == N and len(_of(fake, log)) == N // CHUNK
    return log


def _check_exact(fake: FakeBatchServer, log: CheckpointLog, baseline: CheckpointLog) -> None:
    mine = _of(fake, log)
    assert [b.row_count for b in mine] == [CHUNK] * (N // CHUNK)  # one batch per chunk
    asked = [cid.rsplit("-", 1)[0] for b in mine for cid in b.custom_ids]
    assert sorted(asked) == sorted(bases(make_items(N)).values())  # every row asked once
    assert log.usage() == baseline.usage()  # an exact ledger: nothing counted twice, nothing missing
    assert collect_results(log) == collect_results(baseline)
    assert log.summary()["completed"] == N and batches.open_submissions(log) == []


def test_a_worker_killed_inside_batches_create_is_reattached_and_pays_once(
    fake: FakeBatchServer, tmp_path: Path
) -> None:
    baseline = _baseline(fake, tmp_path)
    _kill_inside_create(fake, tmp_path)
    log = open_experiment(tmp_path, "killed")
    (sub,) = batches.open_submissions(log)  # the provider has it, the log does not know its id
    assert (sub.kind, sub.batch_id, len(sub.custom_ids)) == (batches.INTENT, None, CHUNK)
    assert len(_of(fake, log)) == 1

    report = run(log, make_items(N), openai_step(fake.base_url, max_requests_per_batch=CHUNK))
    assert len(report.processed) == N and report.failed == []
    assert report.batches == [b.id for b in _of(fake, log)]  # the first re-attached, two submitted
    _check_exact(fake, log, baseline)


def test_a_worker_killed_while_recording_results_records_the_rest_once(fake: FakeBatchServer, tmp_path: Path) -> None:
    baseline = _baseline(fake, tmp_path)
    # commits of 4 rows: the first chunk takes 3 (4, 4, 2); the kill lands after the second of the next
    worker = _worker(tmp_path, "killed", fake, "--record-commit-items", "4", "--kill-after-record-commits", "5")
    _, err = worker.communicate(timeout=300)
    assert worker.returncode == -signal.SIGKILL, err[-3000:]
    log = open_experiment(tmp_path, "killed")
    assert log.summary()["completed"] == CHUNK + 8
    kinds = sorted(s.kind for s in batches.read(log).values())
    assert kinds == [batches.ENDED, batches.ENDED, batches.RECORDED]
    assert len(_of(fake, log)) == N // CHUNK

    report = run(log, make_items(N), openai_step(fake.base_url, max_requests_per_batch=CHUNK))
    assert len(report.processed) == N - CHUNK - 8 and len(report.skipped) == CHUNK + 8
    assert report.batches == [b.id for b in _of(fake, log)][1:]  # re-read, none submitted
    _check_exact(fake, log, baseline)


def test_an_anthropic_worker_killed_inside_create_submits_again_and_records_each_item_once(
    fake: FakeBatchServer, tmp_path: Path
) -> None:
    # Anthropic's batches carry no metadata: the batch whose create was cut off cannot be found again, so
    # it is submitted again (the orphan runs and is paid for at the provider: the README and the guide say
    # so), and the log still records each item once, from the batch it knows.
    baseline = open_experiment(tmp_path, "baseline")
    run(baseline, make_items(N), anthropic_step(fake.anthropic_base_url, max_requests_per_batch=CHUNK))
    first = fake.creates
    _kill_inside_create(fake, tmp_path, "--provider", "anthropic")
    log = open_experiment(tmp_path, "killed")
    (sub,) = batches.open_submissions(log)
    assert (sub.kind, sub.batch_id) == (batches.INTENT, None)
    orphan = fake.batches[-1]

    report = run(log, make_items(N), anthropic_step(fake.anthropic_base_url, max_requests_per_batch=CHUNK))
    assert len(report.processed) == N and report.failed == []
    mine = fake.batches[first:]
    assert len(mine) == N // CHUNK + 1 and orphan.id not in report.batches  # the orphan, never polled
    assert sorted(orphan.custom_ids) == sorted(mine[1].custom_ids)  # submitted again, the same rows
    assert log.usage() == baseline.usage()  # the orphan's rows are not in the ledger: recorded once
    assert collect_results(log) == collect_results(baseline)
    assert log.summary()["completed"] == N and batches.open_submissions(log) == []


# workers killed by signal, each a fresh interpreter: `make test` runs these, `make unit` leaves them out
pytestmark = pytest.mark.slow
