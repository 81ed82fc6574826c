"""SIGKILL a worker running an async process (``concurrency=64`` on the event loop), resume, compare.

The async driver acknowledges items in completion order with up to 64 calls in flight; a kill can land
mid-run, between an inbox pull and its acknowledgements, inside a commit, or during a retry's backoff
wait (every fifth item fails its first attempt with a transient error). Whatever the moment, every item
the log calls done has its full output, acknowledged items are never invoked again, and the resumed
export equals an uninterrupted run's.
"""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING, Any

import pytest

from airflow_provider_datagen.core import ItemStatus, RetryPolicy, export_results, run_items
from airflow_provider_datagen.core.export import collect_results
from tests._support.engine import Recorder, as_async, build_pipeline, open_log, statuses, transient_first_attempts
from tests.core.runner.test_crash_resume import Kill, Schedule, check_after_kill, run_worker, worker_cmd

if TYPE_CHECKING:
    from pathlib import Path

N = 150
CONCURRENCY = 64


def _pipeline(rec: Recorder, transient: bool) -> Any:
    process = build_pipeline("flat", rec)
    return as_async(transient_first_attempts(process) if transient else process, 0.002)


def _policy(transient: bool) -> RetryPolicy | None:
    return RetryPolicy(attempts=3, retry_on=(TimeoutError,), sleep=lambda s: None) if transient else None


def _run(log: Any, rec: Recorder, transient: bool, every: int | None, **kw: Any) -> Any:
    from tests._support.engine import make_items

    return run_items(
        log,
        make_items(N),
        _pipeline(rec, transient),
        checkpoint_every=every,
        concurrency=CONCURRENCY,
        retry=_policy(transient),
        **kw,
    )


KILLS = [
    (None, False, Kill("invocation", 70)),
    (None, False, Kill("pull", 2)),
    (None, False, Kill("commit", 2)),
    (10, False, Kill("commit", 6)),
    (10, False, Kill("before-commit", 4)),
    (1, False, Kill("invocation", 100)),
    # during a backoff wait of the async retry path
    (None, True, Kill("backoff", 1)),
    (1, True, Kill("backoff", 5)),
    (10, True, Kill("backoff", 12)),
]


@pytest.mark.parametrize(
    ("every", "transient", "kill"),
    KILLS,
    ids=[f"every{e}-{'transient-' if t else ''}{k.mode}@{k.after}" for e, t, k in KILLS],
)
def test_a_killed_async_run_resumes_to_the_uninterrupted_result(
    tmp_path: Path, every: int | None, transient: bool, kill: Kill
) -> None:
    clean = open_log(tmp_path, "clean")
    _run(clean, Recorder(), transient, every)
    expected, clean_fp = collect_results(clean), export_results(clean, str(tmp_path / "clean.lance"))

    s = Schedule("async", "flat", N, every, [kill])
    extra: dict[str, Any] = {"concurrency": CONCURRENCY, "sleep_ms": 2}
    cmd = worker_cmd(tmp_path, s.name, s, kill, **extra) + ["--async-process"] + (["--transient"] if transient else [])
    proc = run_worker(cmd)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    log = open_log(tmp_path, s.name)
    acked = check_after_kill(log, expected, str(s))
    assert len(acked) < N  # the kill really interrupted the run
    if kill.mode == "backoff" and every == 1:
        # checkpoint_every=1 commits a transient row before its wait: the kill left it in the log
        assert any(r.transient for r in log.failures())

    rec = Recorder()
    report = _run(log, rec, transient, every, epoch=log.next_epoch())
    assert report.failed == []
    assert not acked & set(rec.calls)  # acknowledged work is never redone
    assert sorted(set(rec.calls)) == sorted(str(i) for i in range(N) if str(i) not in acked)
    assert collect_results(log) == expected
    assert export_results(log, str(tmp_path / "resumed.lance")) == clean_fp
    assert set(statuses(log).values()) == {ItemStatus.COMPLETED.value}


# workers killed by signal, each a fresh interpreter: `make test` runs these, `make unit` leaves them out
pytestmark = pytest.mark.slow
