"""The ``concurrency`` section of ``make bench``: calls in flight, threads against async, and the retry path's cost.

* Efficiency = rate / ideal, where ideal = n / (ceil(n / concurrency) * latency): every call takes the
  simulated latency (``time.sleep`` in a sync process run by ``concurrency`` threads, ``asyncio.sleep``
  in an async one on the event loop), so a perfect runner finishes a round of ``concurrency`` items per
  latency. Measured at concurrency 8, 64 and 256 and 10 ms and 200 ms of latency, for both, plus the
  async process at concurrency 256 and 50 ms (the issue's bar: >= 0.8).
* The retry path when nothing fails: no-op items/s with ``retry=RetryPolicy(...)`` against the same run
  without it (alternated, medians), and the default no-op throughput (no retry, no rate limit).

    python -m benchmarks.run --only concurrency [--quick]
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

CONCURRENCY = (8, 64, 256)
LATENCIES = (0.010, 0.200)
#: the issue's bar: an async process at concurrency 256 and 50 ms reaches this share of the ideal rate
BAR = (256, 0.050, 0.8)


def _items(n: int) -> list[dict[str, Any]]:
    return [{"id": f"i{k}"} for k in range(n)]


def _run(tmp: Path, process: Any, n: int, **kw: Any) -> tuple[float, float]:
    """Wall and CPU seconds (every thread of the process) of one ``run_items`` over n fresh items.

    Log open and plan are included. CPU time is the figure that survives a busy machine: it counts
    what the runner spends per item, not what other processes took from it.
    """
    from airflow_provider_datagen.core import CheckpointLog, run_items

    log = CheckpointLog.open(tmp / f"c-{time.monotonic_ns()}", pipeline="b", experiment="e")
    items = _items(n)
    t, c = time.perf_counter(), time.process_time()
    report = run_items(log, items, process, **kw)
    took, cpu = time.perf_counter() - t, time.process_time() - c
    if len(report.processed) != n:
        raise AssertionError(f"concurrency bench: {report.as_dict()}")
    return took, cpu


def efficiency(
    tmp: Path, kind: str, concurrency: int, latency: float, seconds: float, repeats: int = 1
) -> dict[str, Any]:
    """One efficiency figure: ``kind`` is "threads" (a sync process) or "async"."""
    rounds = max(4, round(seconds / latency))
    n = concurrency * rounds

    def sync_call(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        time.sleep(latency)
        return {"ok": 1}

    async def async_call(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        await asyncio.sleep(latency)
        return {"ok": 1}

    process = sync_call if kind == "threads" else async_call
    runs = sorted(_run(tmp, process, n, concurrency=concurrency) for _ in range(repeats))
    took, cpu = runs[len(runs) // 2]
    ideal = n / (math.ceil(n / concurrency) * latency)
    rate = n / took
    return {
        "kind": kind,
        "concurrency": concurrency,
        "latency_ms": latency * 1000,
        "items": n,
        "seconds": took,
        "items_per_s": rate,
        "ideal_items_per_s": ideal,
        "efficiency": rate / ideal,
        "cpu_us_per_item": cpu / n * 1e6,
    }


def retry_overhead(tmp: Path, n: int, repeats: int) -> dict[str, Any]:
    """No-op items/s without and with ``retry=`` (nothing fails), alternated in one run."""
    from airflow_provider_datagen.core import RetryPolicy

    def noop(item: dict[str, Any], ctx: Any) -> None:
        return None

    policy = RetryPolicy(attempts=3, retry_on=(TimeoutError,))
    plain: list[tuple[float, float]] = []
    retried: list[tuple[float, float]] = []
    for _ in range(repeats):
        plain.append(_run(tmp, noop, n))
        retried.append(_run(tmp, noop, n, retry=policy))
    p = n / statistics.median(w for w, _ in plain)
    r = n / statistics.median(w for w, _ in retried)
    p_cpu = statistics.median(c for _, c in plain) / n
    r_cpu = statistics.median(c for _, c in retried) / n
    return {
        "items": n,
        "noop_items_per_s": p,
        "noop_retry_items_per_s": r,
        "retry_ratio": r / p,
        "noop_cpu_us_per_item": p_cpu * 1e6,
        "noop_retry_cpu_us_per_item": r_cpu * 1e6,
        "retry_cost_cpu_us_per_item": (r_cpu - p_cpu) * 1e6,
    }


def bench_concurrency(tmp: Path, quick: bool) -> dict[str, Any]:
    seconds = 0.3 if quick else 3.0
    rows = []
    for latency in LATENCIES:
        for concurrency in CONCURRENCY:
            for kind in ("threads", "async"):
                row = efficiency(tmp, kind, concurrency, latency, seconds)
                rows.append(row)
                print(
                    f"  {kind:7s} concurrency={concurrency:3d} latency={latency * 1000:3.0f} ms: "
                    f"{row['items_per_s']:9,.0f} items/s of {row['ideal_items_per_s']:9,.0f} ideal -> "
                    f"efficiency {row['efficiency']:.2f} ({row['items']} items; "
                    f"{row['cpu_us_per_item']:.0f} us CPU per item)",
                    flush=True,
                )
    c, latency, bar = BAR
    headline = efficiency(tmp, "async", c, latency, seconds, repeats=3)
    print(
        f"  async concurrency={c} latency={latency * 1000:.0f} ms: efficiency {headline['efficiency']:.2f} "
        f"(bar {bar}; median of 3, {headline['items']} items)",
        flush=True,
    )
    overhead = retry_overhead(tmp, 5_000 if quick else 20_000, 3 if quick else 5)
    print(
        f"  no-op items/s: {overhead['noop_items_per_s']:,.0f} without retry | "
        f"{overhead['noop_retry_items_per_s']:,.0f} with retry= (nothing fails): {overhead['retry_ratio']:.2f}x; "
        f"CPU per item {overhead['noop_cpu_us_per_item']:.1f} us vs {overhead['noop_retry_cpu_us_per_item']:.1f} us",
        flush=True,
    )
    return {"efficiency": rows, "async_256_50ms": headline, "bar": bar, "retry": overhead}
