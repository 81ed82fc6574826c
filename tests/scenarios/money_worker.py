"""The model step over a JSONL source, run by ``run_items`` in a process of its own, so a test can SIGKILL it.

    python -m tests.scenarios.money_worker --root DIR --experiment E --source FILE --conn-id ID \\
        [--budget-tokens N] [--concurrency 16]

The connection (``AIRFLOW_CONN_<ID>``) points at the test's local OpenAI-compatible server. The process
and retry policy are :func:`tests.scenarios.test_money_scenario.step` and ``POLICY``, so the parent's
in-process runs and this worker run exactly the same code. Prints the run's report as JSON.
"""

from __future__ import annotations

import argparse
import json


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--root", required=True)
    p.add_argument("--experiment", required=True)
    p.add_argument("--source", required=True)
    p.add_argument("--conn-id", required=True)
    p.add_argument("--budget-tokens", type=int, default=None)
    p.add_argument("--concurrency", type=int, default=16)
    args = p.parse_args()

    from tests.scenarios.test_money_scenario import run_once

    report = run_once(args.root, args.experiment, args.source, args.conn_id, args.budget_tokens, args.concurrency)
    print(json.dumps({"processed": len(report.processed), "stopped_by_budget": report.stopped_by_budget}))


if __name__ == "__main__":
    main()
