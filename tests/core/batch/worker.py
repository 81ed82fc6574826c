"""A ``run_batch`` worker for the SIGKILL tests (tests/core/batch/test_crash.py); the house crash pattern.

    python -m tests.core.batch.worker --root DIR --experiment E --base-url URL --n-items 30 \\
        --max-requests 10 [--record-commit-items 4 --kill-after-record-commits 5] [--provider anthropic]

Without ``--kill-after-record-commits`` it runs to the end and prints its report as JSON (or is
SIGKILLed by the test, inside ``batches.create``, while the server holds the create). With it, it
kills itself with SIGKILL right after the K-th commit of result rows has landed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from typing import Any


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--root", required=True)
    p.add_argument("--experiment", required=True)
    p.add_argument("--base-url", required=True)
    p.add_argument("--n-items", type=int, required=True)
    p.add_argument("--max-requests", type=int, default=None)
    p.add_argument("--record-commit-items", type=int, default=None)
    p.add_argument("--kill-after-record-commits", type=int, default=0)
    p.add_argument("--provider", choices=["openai", "anthropic"], default="openai")
    args = p.parse_args(argv)

    from airflow_provider_datagen.core.batch import record as batch_record
    from airflow_provider_datagen.core.batch import run as batch_run
    from tests.core.batch.helpers import anthropic_step, make_items, open_experiment, openai_step, run

    if args.record_commit_items:
        batch_record.RECORD_COMMIT_ITEMS = args.record_commit_items
    if args.kill_after_record_commits:
        original = batch_run.BatchRun._commit_rows
        commits = [0]

        def commit_then_die(self: Any, sub: Any, rows: Any) -> None:
            original(self, sub, rows)
            commits[0] += 1
            if commits[0] >= args.kill_after_record_commits:
                self.log.wait_appends()  # the commit has landed
                sys.stdout.flush()
                os.kill(os.getpid(), signal.SIGKILL)

        batch_run.BatchRun._commit_rows = commit_then_die  # type: ignore[method-assign]

    log = open_experiment(args.root, args.experiment)
    make_step = anthropic_step if args.provider == "anthropic" else openai_step
    step = make_step(args.base_url, max_requests_per_batch=args.max_requests)
    report = run(log, make_items(args.n_items), step, writer_id="worker")
    print(json.dumps(report.as_dict()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
