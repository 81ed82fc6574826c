"""Engine figures for the note: run_items throughput by checkpoint_every, and plan_resume over 100k items.

    .venv/bin/python -m benchmarks.engine_measures [--quick] [--json]

1. Items/s through ``run_items`` with a no-op process (one leaf returning ``None``: the cost is the
   engine and the log, not the work) at ``checkpoint_every`` 1, 10, 100 and None (group commit), each
   on a fresh local log.
2. ``plan_resume`` over 100,000 source items of which 90% are completed in the log: the whole call
   (vectorized fold of the log + classification), and its two halves separately. The log is built with
   the rows a flat pipeline writes (ITEM_CREATED, FIELD_SET, STEP_COMPLETED, TERMINAL) in large batches;
   it is planned once unmaintained (a full vectorized fold) and once after ``maintain()``.

Timing is measured here, never asserted in tests.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from typing import Any

from airflow_provider_datagen.core import CheckpointLog, plan_resume, prepare_items, run_items
from airflow_provider_datagen.core.planner import classify

THROUGHPUT = [(1, 2_000), (10, 5_000), (100, 20_000), (None, 20_000)]
PLAN_ITEMS = 100_000
PLAN_DONE = 0.9


def noop(item: dict[str, Any], ctx: Any) -> None:
    return None


def items(n: int) -> list[dict[str, Any]]:
    return [{"id": i, "text": f"item-{i}"} for i in range(n)]


def measure_throughput(root: str, every: int | None, n: int) -> dict[str, Any]:
    log = CheckpointLog.open(root, pipeline="bench", experiment=f"tp-{every}-{n}")
    source = items(n)
    t0 = time.perf_counter()
    report = run_items(log, source, noop, checkpoint_every=every)
    dt = time.perf_counter() - t0
    return {
        "checkpoint_every": every,
        "items": n,
        "seconds": round(dt, 3),
        "items_per_s": round(n / dt, 1),
        "commits": report.commits,
        "ms_per_commit": round(1000 * dt / max(report.commits, 1), 2),
    }


def build_plan_log(root: str, n: int, done: float) -> tuple[CheckpointLog, list[dict[str, Any]], float]:
    log = CheckpointLog.open(root, pipeline="bench", experiment="plan", auto_maintain_fragments=None)
    source = items(n)
    prepared = prepare_items(source)
    n_done = int(n * done)
    writer = log.writer("bench", 1, processor_version="v1")
    t0 = time.perf_counter()
    chunk = 20_000
    for start in range(0, n_done, chunk):
        with writer.batch() as b:
            for s in prepared[start : min(start + chunk, n_done)]:
                writer.prime(s.item_id, last_seq=-1)
                b.item_created(s.item_id, input_fingerprint=s.fingerprint)
                b.field_set(s.item_id, "out", None, step="process")
                b.step_completed(s.item_id, step="process", step_kind="Step")
                b.terminal(s.item_id)
    return log, source, time.perf_counter() - t0


def _timed(fn: Any, repeats: int) -> float:
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
    return round(statistics.median(runs), 3)


def measure_plan(root: str, n: int, done: float, repeats: int) -> dict[str, Any]:
    log, source, build_s = build_plan_log(root, n, done)
    out: dict[str, Any] = {"items": n, "build_seconds": round(build_s, 2), "repeats": repeats}
    plan = plan_resume(log, source)
    out.update(done=len(plan.skip), fresh=len(plan.fresh), log_events=log.stats()["events"])
    prepared = prepare_items(source)
    # 1. An unmaintained log: states() folds the light columns of every event.
    out["plan_resume_seconds_full_fold"] = _timed(lambda: plan_resume(log, source), repeats)
    out["states_seconds_full_fold"] = _timed(log.states, repeats)
    # 2. After maintain(): states() reads the state projection maintenance writes.
    t0 = time.perf_counter()
    log.maintain()
    out["maintain_seconds"] = round(time.perf_counter() - t0, 2)
    out["plan_resume_seconds_maintained"] = _timed(lambda: plan_resume(log, source), repeats)
    out["states_seconds_maintained"] = _timed(log.states, repeats)
    states = log.states()
    out["classify_seconds"] = _timed(lambda: classify(prepared, states, "v1", 0), repeats)
    out["prepare_items_seconds"] = _timed(lambda: prepare_items(source), repeats)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--quick", action="store_true", help="a tenth of the sizes (a smoke run)")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--only", choices=["throughput", "plan"], default=None)
    args = p.parse_args(argv)
    scale = 10 if args.quick else 1
    out: dict[str, Any] = {
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "throughput": [],
    }
    with tempfile.TemporaryDirectory(prefix="datagen-bench-") as root:
        if args.only != "plan":
            for every, n in THROUGHPUT:
                out["throughput"].append(measure_throughput(root, every, max(n // scale, 10)))
        if args.only != "throughput":
            out["plan_resume"] = measure_plan(root, PLAN_ITEMS // scale, PLAN_DONE, args.repeats)
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"python {out['python']} on {out['machine']}, {out['cpus']} cpus")
    if out["throughput"]:
        print("run_items with a no-op process:")
        print(f"  {'checkpoint_every':>16} {'items':>7} {'seconds':>8} {'items/s':>9} {'commits':>8} {'ms/commit':>9}")
    for r in out["throughput"]:
        every = "None" if r["checkpoint_every"] is None else r["checkpoint_every"]
        print(
            f"  {every!s:>16} {r['items']:>7} {r['seconds']:>8} {r['items_per_s']:>9} "
            f"{r['commits']:>8} {r['ms_per_commit']:>9}"
        )
    pr = out.get("plan_resume")
    if pr is None:
        return 0
    print(f"plan_resume over {pr['items']} items, {pr['done']} done ({pr['log_events']} log events), medians:")
    print(f"  unmaintained log: {pr['plan_resume_seconds_full_fold']} s (states() {pr['states_seconds_full_fold']} s)")
    print(
        f"  after maintain(): {pr['plan_resume_seconds_maintained']} s (states() {pr['states_seconds_maintained']} s)"
    )
    print(f"  parts: prepare_items {pr['prepare_items_seconds']} s, classify {pr['classify_seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
