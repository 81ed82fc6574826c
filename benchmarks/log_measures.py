"""Measures of the checkpoint log (issue 2): append rate, vectorized fold time, item_state latency.

Run with ``.venv/bin/python -m benchmarks.log_measures [--events 1000000] [--keep DIR]``. Everything is
written to a fresh temporary directory (removed at the end unless ``--keep`` is given). Timing is
measured here, never asserted in tests.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import tempfile
import time
from typing import TYPE_CHECKING, Any

from airflow_provider_datagen.core import CheckpointLog, fold_table
from airflow_provider_datagen.core.schema import LIGHT_COLUMNS

if TYPE_CHECKING:
    from collections.abc import Callable


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def append_single_event_commits(root: str, commits: int) -> float:
    """Events/s when every commit carries one event (the worst case for a log: one fragment each)."""
    lg = CheckpointLog.open(root, pipeline="bench", experiment="single", auto_maintain_fragments=None)
    w = lg.writer("w1", 1)
    w.prime("item", last_seq=-1)
    with w.batch() as b:
        b.item_created("item", input_fingerprint="f")
    t0 = time.perf_counter()
    for i in range(commits):
        with w.batch() as b:
            b.field_append("item", "votes", i)
    return commits / (time.perf_counter() - t0)


def append_big_commits(root: str, commits: int, per_commit: int) -> float:
    """Events/s with ``per_commit`` events per commit (group commit): one event per item."""
    lg = CheckpointLog.open(root, pipeline="bench", experiment="batched", auto_maintain_fragments=None)
    w = lg.writer("w1", 1)
    t0 = time.perf_counter()
    for c in range(commits):
        with w.batch() as b:
            for i in range(per_commit):
                item = f"{c}-{i}"
                w.prime(item, last_seq=-1)
                b.item_created(item, input_fingerprint="f")
    return commits * per_commit / (time.perf_counter() - t0)


def write_big_log(lg: CheckpointLog, events: int, per_item: int = 5, batch_events: int = 100_000) -> float:
    """Write ``events`` events for ``events // per_item`` items in batches; returns seconds spent."""
    items = events // per_item
    per_batch = batch_events // per_item
    w = lg.writer("w1", 1, processor_version="v1")
    t0 = time.perf_counter()
    for start in range(0, items, per_batch):
        with w.batch() as b:
            for n in range(start, min(start + per_batch, items)):
                item = str(n)
                w.prime(item, last_seq=-1)
                b.item_created(item, input_fingerprint="f")
                b.step_started(item, step="gen")
                b.field_set(item, "answer", n)
                b.step_completed(item, step="gen")
                if n % 10 == 9:
                    b.failed(item, error="retry me", step="gen")  # stays running
                else:
                    b.terminal(item, status="completed")
    return time.perf_counter() - t0


def item_state_latency(lg: CheckpointLog, ids: list[str]) -> float:
    samples = []
    for item in ids:
        t0 = time.perf_counter()
        st = lg.item_state(item)
        samples.append(time.perf_counter() - t0)
        assert st.status.value in ("completed", "running"), st
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000, help="events in the big log (default 1M)")
    parser.add_argument("--single-commits", type=int, default=300)
    parser.add_argument("--small-appends", type=int, default=300, help="1-event commits before maintain()")
    parser.add_argument("--keep", help="write here and keep the data instead of a temporary directory")
    args = parser.parse_args()

    root = args.keep or tempfile.mkdtemp(prefix="datagen-bench-")
    os.makedirs(root, exist_ok=True)
    rows: list[tuple[str, str]] = []
    try:
        rate1 = append_single_event_commits(root, args.single_commits)
        rows.append((f"append, 1 event per commit ({args.single_commits} commits)", f"{rate1:,.0f} events/s"))
        rate1000 = append_big_commits(root, 20, 1000)
        rows.append(("append, 1000 events per commit (20 commits)", f"{rate1000:,.0f} events/s"))

        lg = CheckpointLog.open(root, pipeline="bench", experiment="big", auto_maintain_fragments=None)
        n_items = args.events // 5
        write_s = write_big_log(lg, args.events)
        rows.append((f"write {args.events:,} events / {n_items:,} items (100k-event commits)", f"{write_s:.1f} s"))
        scan_s, table = _timed(lambda: lg.table.scan(LIGHT_COLUMNS))
        fold_s, states = _timed(lambda: fold_table(table))
        assert states.num_rows == n_items and table.num_rows == args.events
        rows.append((f"scan light columns, {table.num_rows:,} rows", f"{scan_s:.2f} s"))
        rows.append((f"fold_table, {table.num_rows:,} events -> {states.num_rows:,} items", f"{fold_s:.2f} s"))
        states_s, _ = _timed(lg.states)
        rows.append(("log.states() (scan + fold)", f"{states_s:.2f} s"))

        # many small appends, as unmaintained workers leave them: one fragment each, no index yet
        w = lg.writer("w2", 2)
        for i in range(args.small_appends):
            with w.batch() as b:
                item = f"late-{i}"
                w.prime(item, last_seq=-1)
                b.item_created(item, input_fingerprint="f")
        fragments = lg.stats()["fragments"]
        ids = [str(n) for n in random.Random(7).sample(range(n_items), 50)]
        before = item_state_latency(lg, ids)
        rows.append((f"item_state median of 50, {fragments} fragments, no index", f"{before * 1000:.1f} ms"))
        maintain_s, report = _timed(lg.maintain)
        rows.append(
            (
                f"maintain(): {report['fragments_before']} -> {report['fragments_after']} fragments, indices",
                f"{maintain_s:.1f} s",
            )
        )
        after = item_state_latency(lg, ids)
        rows.append(("item_state median of 50 after maintain()", f"{after * 1000:.1f} ms"))
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)

    width = max(len(k) for k, _ in rows)
    print(f"checkpoint log measures ({os.cpu_count()} CPUs)")
    for k, v in rows:
        print(f"  {k:<{width}}  {v:>16}")


if __name__ == "__main__":
    main()
