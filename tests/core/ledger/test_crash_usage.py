"""Usage totals after a SIGKILL and a resume: exact, with no acknowledged usage counted twice.

A worker (tests/_support/workers/crash.py --usage) records a fixed usage in every call and kills
itself at a chosen point; the resume runs in-process with the same recording. Whatever the kill
point, the log's usage (and the status dict's) equals an uninterrupted run's: an attempt whose
batch was lost is redone and counted once, one whose batch landed is never redone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from airflow_provider_datagen.core import run_items, status_of
from tests._support.engine import Recorder, build_pipeline, make_items, open_log, results_fp
from tests._support.workers.crash import USAGE
from tests.core.runner.test_crash_resume import Kill, Schedule, run_worker, worker_cmd

if TYPE_CHECKING:
    from pathlib import Path


class UsageRecorder(Recorder):
    def __call__(self, ctx: Any) -> None:
        ctx.record_usage(**USAGE)
        super().__call__(ctx)


def _run(log: Any, s: Schedule) -> None:
    run_items(
        log,
        make_items(s.n),
        build_pipeline(s.kind, UsageRecorder()),
        checkpoint_every=s.every,
        checkpoint_interval=3600,
    )


SCHEDULES = [
    Schedule("flat-commit", "flat", 12, 2, [Kill("commit", 3)]),
    Schedule("flat-before-commit", "flat", 12, 3, [Kill("before-commit", 2)]),
    Schedule("flat-group-invocation", "flat", 16, None, [Kill("invocation", 9)]),
    Schedule("flat-pull", "flat", 10, None, [Kill("pull", 1)]),
    Schedule("steps-every-step", "steps", 5, 1, [Kill("invocation", 7)]),
    Schedule("steps-twice", "steps", 5, 2, [Kill("commit", 2), Kill("invocation", 4)]),
]


@pytest.mark.parametrize("s", SCHEDULES, ids=str)
def test_usage_is_exact_after_sigkill_and_resume(tmp_path: Path, s: Schedule) -> None:
    baseline = open_log(tmp_path, "baseline")
    _run(baseline, s)
    for kill in s.kills:
        proc = run_worker([*worker_cmd(tmp_path, "crashed", s, kill), "--usage"])
        assert proc.returncode == -9, proc.stderr
    crashed = open_log(tmp_path, "crashed")
    _run(crashed, s)
    expected = baseline.usage()
    assert expected["calls"] > 0
    assert crashed.usage() == expected
    assert status_of(crashed)["usage"] == expected
    assert results_fp(crashed) == results_fp(baseline)
