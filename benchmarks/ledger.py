"""The usage ledger's figures: ``log.usage()`` at scale, and a budget's overshoot with concurrent tasks.

* ``usage()`` over N items / ~5N events (every completed item's STEP_COMPLETED carries a usage
  record, 5 % of items also a failed attempt's), before and after ``maintain()``, beside ``states()``
  of the same log in the same run (the fold every plan pays: the baseline of the ratio).
* Overshoot: 4 processes (each what a mapped task does: ``run_items`` over its own chunk as its own
  writer and epoch) share one ``budget_usd``; each item costs the same, so the overshoot is counted in
  items. Measured with the defaults (the log re-read every second, group commit) and with the tight
  setting the bound is stated for (re-read before each item, ``checkpoint_every=1``).

Run alone: ``python -m benchmarks.ledger [--quick]``; ``python -m benchmarks.run --only ledger``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

REPO = Path(__file__).resolve().parent.parent
#: each overshoot item's cost (the caller's), and its simulated model latency
ITEM_COST = 0.01
ITEM_SECONDS = 0.1


def _usage_log(log: Any, n: int) -> int:
    """A synthetic log of ``n`` completed items whose STEP_COMPLETED rows carry usage; returns events."""
    from airflow_provider_datagen.core.events import canonical_json
    from airflow_provider_datagen.core.schema import EVENT_SCHEMA
    from benchmarks.synth import source_items, synth_events

    table = synth_events(source_items(n), 1.0)
    done = pc.equal(table["event_type"], "STEP_COMPLETED").to_numpy(zero_copy_only=False)
    rows = np.flatnonzero(done)
    payload = canonical_json(
        {
            "attempt": 1,
            "usage": [
                {
                    "model": "openai:gpt-5-mini",
                    "calls": 1,
                    "input_tokens": 812,
                    "output_tokens": 240,
                    "cost_usd": 0.000683,
                    "unpriced_calls": 0,
                }
            ],
        }
    )
    value_json = table["value_json"].to_numpy(zero_copy_only=False).astype(object)
    value_kind = table["value_kind"].to_numpy(zero_copy_only=False).astype(object)
    value_json[rows] = payload
    value_kind[rows] = "json"
    # 5 % of items also failed an attempt first: their FAILED row carries that attempt's usage
    failed_rows = rows[::20]
    table = table.set_column(
        table.schema.get_field_index("value_json"), "value_json", pa.array(value_json, pa.string())
    )
    table = table.set_column(
        table.schema.get_field_index("value_kind"), "value_kind", pa.array(value_kind, pa.string())
    )
    failed = table.take(pa.array(failed_rows))
    failed = failed.set_column(
        failed.schema.get_field_index("event_type"), "event_type", pa.array(["FAILED"] * len(failed_rows), pa.string())
    )
    failed = failed.set_column(
        failed.schema.get_field_index("event_id"),
        "event_id",
        pc.binary_join_element_wise(failed["event_id"], pa.scalar("f"), ""),
    )
    full = pa.concat_tables([table.cast(EVENT_SCHEMA), failed.cast(EVENT_SCHEMA)])
    step = -(-full.num_rows // 20)
    for start in range(0, full.num_rows, step):
        log.append(full.slice(start, step))
    return full.num_rows


def _paid(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
    ctx.record_usage(model="bench:paid", input_tokens=100, output_tokens=10, cost_usd=ITEM_COST)
    return {"v": 1}


def _median(fn: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _cold(root: Path, experiment: str, call: str, repeats: int = 3) -> float:
    """Median seconds of one ``call`` in a fresh process each time (no fold or usage memo, no import cost)."""
    times = []
    env = dict(os.environ, PYTHONPATH=str(REPO), RUST_LOG="error")
    for _ in range(repeats):
        cmd = [sys.executable, "-m", "benchmarks.ledger", "--cold", call, "--root", str(root)]
        cmd += ["--experiment", experiment]
        out = subprocess.run(cmd, cwd=REPO, env=env, check=True, capture_output=True)
        times.append(float(out.stdout.decode().strip().splitlines()[-1]))
    return statistics.median(times)


def _cold_worker(args: argparse.Namespace) -> int:
    from airflow_provider_datagen.core import CheckpointLog

    log = CheckpointLog.open(args.root, pipeline="bench", experiment=args.experiment, auto_maintain_fragments=None)
    name, _, arg = args.cold.partition(":")
    fn = {"usage": log.usage, "states": log.states, "summary": log.summary}.get(name)
    t = time.perf_counter()
    fn() if fn is not None else log.item_usage(arg)
    print(time.perf_counter() - t)
    return 0


def bench_usage(tmp: Path, quick: bool) -> dict[str, Any]:
    from airflow_provider_datagen.core import CheckpointLog, run_items
    from airflow_provider_datagen.core.store import usage_projection
    from airflow_provider_datagen.core.store.paths import usage_projection_uri

    n = 100_000 if quick else 1_000_000
    root = tmp / "ledger"
    log = CheckpointLog.open(
        root, pipeline="bench", experiment="usage", auto_maintain_fragments=None, remember_fold=False
    )
    events = _usage_log(log, n)
    usage = log.usage()
    assert usage["calls"] == n + len(range(0, n, 20)), usage["calls"]
    row: dict[str, Any] = {"items": n, "events": events, "calls": usage["calls"], "load_before": os.getloadavg()}
    # before maintain(): no projection, so every read folds every usage row (the old cold read)
    row["usage_s_before_maintain"] = _median(log.usage, 3)
    row["states_s_before_maintain"] = _median(log.states, 3)
    t = time.perf_counter()
    report = log.maintain()
    row["maintain_s"] = time.perf_counter() - t
    row["projected_usage_rows"] = report["projected_usage_rows"]
    # what maintain() pays for the projection when none is stored yet (the whole log's usage rows)
    ds = log.table.dataset()
    shutil.rmtree(usage_projection_uri(log.uri))
    t = time.perf_counter()
    usage_projection.write_usage_projection(log.table, ds, dt.timedelta(hours=1))
    row["usage_projection_write_s_from_scratch"] = time.perf_counter() - t
    assert log.usage() == usage
    # after maintain(), each read in a fresh process (no memo): the projection plus an empty tail
    row["usage_s_after_maintain_cold_process"] = _cold(root, "usage", "usage")
    row["states_s_after_maintain_cold_process"] = _cold(root, "usage", "states")
    row["summary_s_after_maintain_cold_process"] = _cold(root, "usage", "summary")
    row["item_usage_s_after_maintain_cold_process"] = _cold(root, "usage", "item_usage:item-0000500")
    row["usage_s_after_maintain_same_process"] = _median(log.usage, 3)
    # 100 more items after the projection: their rows are the tail a read folds
    warm = CheckpointLog.open(root, pipeline="bench", experiment="usage", auto_maintain_fragments=None)
    warm.usage()
    run_items(warm, [{"id": f"new-{k}"} for k in range(100)], _paid, epoch=2)
    row["usage_s_after_maintain_and_100_items_cold_process"] = _cold(root, "usage", "usage")
    row["states_s_after_maintain_and_100_items_cold_process"] = _cold(root, "usage", "states")
    assert CheckpointLog.open(root, pipeline="bench", experiment="usage").usage()["calls"] == usage["calls"] + 100
    # a log object that remembers its last read (a run's budget re-reads the spend often): after a
    # run of 100 more items, the read folds only their rows
    times = []
    for r in range(3):
        run_items(warm, [{"id": f"new-{r}-{k}"} for k in range(100)], _paid, epoch=3 + r)
        t = time.perf_counter()
        warm.usage()
        times.append(time.perf_counter() - t)
    row["usage_s_after_100_more_items_remembered"] = statistics.median(times)
    row["load_after"] = os.getloadavg()
    r = {k: v for k, v in row.items() if isinstance(v, float)}
    print(
        f"   usage() at {n} items / {events} events: {r['usage_s_before_maintain']:.2f} s before maintain() "
        f"(states() {r['states_s_before_maintain']:.2f} s); after maintain() in a fresh process "
        f"{r['usage_s_after_maintain_cold_process']:.3f} s "
        f"(states() {r['states_s_after_maintain_cold_process']:.2f} s, "
        f"summary() {r['summary_s_after_maintain_cold_process']:.2f} s); after 100 more items "
        f"{r['usage_s_after_maintain_and_100_items_cold_process']:.3f} s "
        f"(states() {r['states_s_after_maintain_and_100_items_cold_process']:.2f} s); remembered, after 100 more "
        f"items: {r['usage_s_after_100_more_items_remembered'] * 1000:.0f} ms; maintain() {r['maintain_s']:.1f} s "
        f"(its usage projection from scratch {r['usage_projection_write_s_from_scratch']:.1f} s)",
        flush=True,
    )
    return row


def bench_no_usage(tmp: Path, quick: bool) -> dict[str, Any]:
    """``summary()`` of a log that never recorded usage, beside ``states()``: what the usage part adds."""
    from airflow_provider_datagen.core import CheckpointLog
    from benchmarks.synth import source_items, synth_events

    n = 100_000 if quick else 1_000_000
    root = tmp / "no-usage"
    log = CheckpointLog.open(root, pipeline="bench", experiment="plain", auto_maintain_fragments=None)
    table = synth_events(source_items(n), 1.0)
    step = -(-table.num_rows // 20)
    for start in range(0, table.num_rows, step):
        log.append(table.slice(start, step))
    row: dict[str, Any] = {"items": n, "events": table.num_rows, "load_before": os.getloadavg()}
    row["states_s_before_maintain_cold_process"] = _cold(root, "plain", "states")
    row["summary_s_before_maintain_cold_process"] = _cold(root, "plain", "summary")
    row["usage_s_before_maintain_cold_process"] = _cold(root, "plain", "usage")
    log.maintain()
    row["states_s_after_maintain_cold_process"] = _cold(root, "plain", "states")
    row["summary_s_after_maintain_cold_process"] = _cold(root, "plain", "summary")
    row["usage_s_after_maintain_cold_process"] = _cold(root, "plain", "usage")
    row["load_after"] = os.getloadavg()
    r = {k: v for k, v in row.items() if isinstance(v, float)}
    print(
        f"   no usage, {n} items / {table.num_rows} events, fresh processes: before maintain() states() "
        f"{r['states_s_before_maintain_cold_process']:.2f} s, "
        f"summary() {r['summary_s_before_maintain_cold_process']:.2f} s, "
        f"usage() {r['usage_s_before_maintain_cold_process']:.2f} s; after: states() "
        f"{r['states_s_after_maintain_cold_process']:.2f} s, "
        f"summary() {r['summary_s_after_maintain_cold_process']:.2f} s, "
        f"usage() {r['usage_s_after_maintain_cold_process']:.3f} s",
        flush=True,
    )
    return row


# --- overshoot: 4 processes sharing a budget -------------------------------------------------------


def _worker(args: argparse.Namespace) -> int:
    from airflow_provider_datagen.core import CheckpointLog, run_items
    from airflow_provider_datagen.core.ledger import budget as budget_module

    if args.refresh is not None:
        budget_module.REFRESH_SECONDS = args.refresh

    def paid(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        time.sleep(ITEM_SECONDS)
        ctx.record_usage(model="bench:paid", input_tokens=100, output_tokens=10, cost_usd=ITEM_COST)
        return {"v": item["v"]}

    log = CheckpointLog.open(args.root, pipeline="bench", experiment="overshoot")
    items = [{"id": f"t{args.task}-{k:04d}", "v": k} for k in range(args.items)]
    while time.time() < args.start_at:  # start together
        time.sleep(0.001)
    report = run_items(
        log,
        items,
        paid,
        writer_id=f"task{args.task}",
        epoch=args.task + 1,
        concurrency=args.concurrency,
        checkpoint_every=args.every,
        budget_usd=args.budget,
    )
    print(json.dumps({"processed": len(report.processed), "stopped": report.stopped_by_budget}))
    return 0


def _overshoot(tmp: Path, name: str, *, refresh: float | None, every: int | None, concurrency: int) -> dict[str, Any]:
    from airflow_provider_datagen.core import CheckpointLog

    tasks, budget, per_task = 4, 10.0, 400  # 1,000 items' worth of budget, 1,600 asked for
    root = tmp / f"overshoot-{name}"
    start_at = time.time() + 3.0
    env = dict(os.environ, PYTHONPATH=str(REPO), RUST_LOG="error")
    procs = []
    for k in range(tasks):
        cmd = [sys.executable, "-m", "benchmarks.ledger", "--worker", "--root", str(root), "--task", str(k)]
        cmd += ["--items", str(per_task), "--budget", str(budget), "--start-at", str(start_at)]
        cmd += ["--concurrency", str(concurrency)]
        if refresh is not None:
            cmd += ["--refresh", str(refresh)]
        if every is not None:
            cmd += ["--every", str(every)]
        procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, text=True))
    outs = [json.loads(p.communicate(timeout=600)[0].strip().splitlines()[-1]) for p in procs]
    spent = CheckpointLog.open(root, pipeline="bench", experiment="overshoot").usage()["cost_usd"]
    over_items = round((spent - budget) / ITEM_COST)
    bound = tasks * (concurrency + 1)
    row = {
        "setting": name,
        "tasks": tasks,
        "concurrency": concurrency,
        "budget_items": round(budget / ITEM_COST),
        "spent_items": round(spent / ITEM_COST),
        "overshoot_items": over_items,
        "bound_items_tight_setting": bound,
        "stopped_tasks": sum(o["stopped"] for o in outs),
    }
    print(
        f"   overshoot, 4 processes, {name}: spent {row['spent_items']} items' worth of a {row['budget_items']}-item "
        f"budget (+{over_items}; the tight setting's bound is {bound})",
        flush=True,
    )
    return row


def bench_overshoot(tmp: Path, quick: bool) -> list[dict[str, Any]]:
    return [
        _overshoot(tmp, "tight (refresh 0 s, checkpoint_every=1)", refresh=0.0, every=1, concurrency=4),
        _overshoot(tmp, "defaults (0.5 s; per item past 80 %)", refresh=None, every=None, concurrency=4),
    ]


def bench_ledger(tmp: Path, quick: bool) -> dict[str, Any]:
    return {
        "usage": bench_usage(tmp, quick),
        "no_usage": bench_no_usage(tmp, quick),
        "overshoot": bench_overshoot(tmp, quick),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.ledger")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--only", choices=["usage", "no_usage", "overshoot"])
    p.add_argument("--cold", help=argparse.SUPPRESS)
    p.add_argument("--experiment", help=argparse.SUPPRESS)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--root")
    p.add_argument("--task", type=int, default=0)
    p.add_argument("--items", type=int, default=100)
    p.add_argument("--budget", type=float, default=1.0)
    p.add_argument("--start-at", type=float, default=0.0)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--refresh", type=float, default=None)
    p.add_argument("--every", type=int, default=None)
    args = p.parse_args(argv)
    if args.worker:
        return _worker(args)
    if args.cold:
        return _cold_worker(args)
    tmp = Path(tempfile.mkdtemp(prefix="datagen-ledger-"))
    try:
        if args.only == "usage":
            out: Any = bench_usage(tmp, args.quick)
        elif args.only == "no_usage":
            out = bench_no_usage(tmp, args.quick)
        elif args.only == "overshoot":
            out = bench_overshoot(tmp, args.quick)
        else:
            out = bench_ledger(tmp, args.quick)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
