"""Latency of the datagen UI on a big experiment, before and after ``maintain()``.

Builds one experiment of 100k source items / 500k events written in many small commits (as mapped
tasks do: one fragment per acknowledged group), then times the pages through Airflow's own API server
app (``create_app()``, SimpleAuthManager, a real JWT), so auth and middleware are included:

* the experiment page (HTML: counts, failures, first page of items) and its JSON status;
* item-table queries: a status filter, an id search, a deep page;
* an item page (with its input looked up in a 100k-row source snapshot beside the log) and a
  task-instance tab;
* the experiments index.

The experiment page includes its spend, throughput and next-run panels; their parts (the Dag
attribution scan behind per-Dag access, the throughput scan) are also timed alone, cold. Usage comes
from the log's ledger when it has one (``log.usage()``); without it the spend panel shows none.

"cold" is the first request for a log version (fold of every light column, sort, stats, failure
lens); "warm" is a repeat (the fold is cached per log version). Run with::

    .venv/bin/python -m benchmarks.ui_latency [--items 100000] [--commits 400] [--repeat 5]

Timing is printed, never asserted.
"""

from __future__ import annotations

import argparse
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

EVENTS_PER_ITEM = 5


def _setup_airflow(home: Path, root: Path) -> None:
    for key in list(os.environ):
        if key.startswith(("AIRFLOW__", "AIRFLOW_CONN_")):
            del os.environ[key]
    os.environ.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
            "AIRFLOW__API_AUTH__JWT_SECRET": "datagen-benchmark-" + "k" * 46,
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
            "AIRFLOW_CONN_DATAGEN_DEFAULT": json.dumps({"conn_type": "datagen", "host": str(root)}),
        }
    )
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], check=True, capture_output=True)


def _write(root: Path, items: int, commits: int) -> tuple[Any, float]:
    from airflow_provider_datagen.core import CheckpointLog

    # No auto-maintenance: the "before" figures are for a log that was never compacted.
    lg = CheckpointLog.open(str(root), pipeline="bench", experiment="big", auto_maintain_fragments=None)
    per_commit = max(1, items // commits)
    started = time.perf_counter()
    for c in range(commits):
        lo, hi = c * per_commit, items if c == commits - 1 else (c + 1) * per_commit
        chunk = c % 20
        w = lg.writer(
            f"bench/run1/map/{chunk}",
            1,
            processor_version="v1",
            airflow={"dag_id": "bench", "run_id": "run1", "task_id": "map", "map_index": chunk, "try_number": 1},
        )
        with w.batch() as b:
            for i in range(lo, hi):
                iid = f"item-{i:06d}"
                b.item_created(iid, input_fingerprint=f"fp{i}")
                b.step_started(iid, step="gen")
                b.field_set(iid, "answer", {"n": i, "text": f"answer {i}"})
                b.step_completed(iid, step="gen")
                # Five events per item whatever its fate, so items x 5 == events.
                if i % 100 == 7:  # 1% fail at the second step and stay pending
                    b.failed(iid, error=f"model timeout on {iid}", step="check")
                elif i % 10 == 3:  # 9% are mid-way through the second step
                    b.step_started(iid, step="check")
                else:
                    b.terminal(iid, status="filtered" if i % 20 == 1 else "completed")
    return lg, time.perf_counter() - started


def _time(client: Any, url: str, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        r = client.get(url)
        out.append(time.perf_counter() - t)
        assert r.status_code == 200, (url, r.status_code, r.text[:300])
    return out


def _measure(client: Any, repeat: int, items: int) -> dict[str, dict[str, float]]:
    from airflow_provider_datagen.plugins.data import reset_reader

    exp = "/datagen/experiments/bench/big"
    api = "/datagen/api/experiments/bench/big"
    urls = {
        "experiment page (HTML)": exp,
        "status JSON": api,
        "items: status=failed": f"{api}/items?status=failed&limit=50",
        "items: search 'item-0999'": f"{api}/items?q=item-0999&limit=50",
        "items: page at offset 90000": f"{exp}?offset=90000&limit=50",
        "item page": f"{exp}/item?id=item-{min(12345, items - 1):06d}",
        "task-instance tab": "/datagen/ti/bench/run1/map/7",
        "experiments index": "/datagen/",
    }
    results: dict[str, dict[str, float]] = {}
    for name, url in urls.items():
        colds = []
        for _ in range(max(1, repeat // 2)):
            reset_reader()  # empty caches: what the first request after a new commit pays
            colds.append(_time(client, url, 1)[0])
        warm = _time(client, url, repeat)
        results[name] = {"cold_ms": 1000 * statistics.median(colds), "warm_ms": 1000 * statistics.median(warm)}
    results["experiment page, panels precomputed (baseline)"] = _baseline(client, exp, repeat)
    return results


def _baseline(client: Any, url: str, repeat: int) -> dict[str, float]:
    """The experiment page with its spend/throughput/next-run panels served from a constant: the
    same-run baseline that the panels' cold cost is read against."""
    from airflow_provider_datagen.plugins import data
    from airflow_provider_datagen.plugins.data import reset_reader

    panels = data.current_reader().insights("bench", "big")
    original = data.Reader.insights
    data.Reader.insights = lambda self, *a, **k: panels  # type: ignore[method-assign]
    try:
        colds = []
        for _ in range(max(1, repeat // 2)):
            reset_reader()
            colds.append(_time(client, url, 1)[0])
        warm = _time(client, url, repeat)
    finally:
        data.Reader.insights = original  # type: ignore[method-assign]
    return {"cold_ms": 1000 * statistics.median(colds), "warm_ms": 1000 * statistics.median(warm)}


def _components(lg: Any, root: Path, repeat: int) -> dict[str, float]:
    """Cold milliseconds of the experiment page's new parts, each alone (median of ``repeat``)."""
    from airflow_provider_datagen.plugins.data import Reader, usage_of
    from airflow_provider_datagen.plugins.insights import throughput

    def cold(fn: Any) -> float:
        times = []
        for _ in range(repeat):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return 1000 * statistics.median(times)

    return {
        "dag attribution (dag_id scan)": cold(lambda: Reader(str(root)).writers("bench", "big")),
        "throughput (TERMINAL/FAILED scan)": cold(lambda: throughput(lg)),
        "usage (log.usage())": cold(lambda: usage_of(lg)),
    }


def _print(title: str, results: dict[str, dict[str, float]]) -> None:
    print(f"\n{title}")
    print(f"  {'request':48s} {'cold ms':>9s} {'warm ms':>9s}")
    for name, r in results.items():
        print(f"  {name:48s} {r['cold_ms']:9.1f} {r['warm_ms']:9.1f}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--items", type=int, default=100_000)
    ap.add_argument("--commits", type=int, default=400)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", type=Path, help="also write the figures to this file")
    ap.add_argument("--keep", action="store_true", help="keep the generated log and Airflow home")
    args = ap.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="datagen-ui-bench-"))
    try:
        return _run(args, tmp)
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def _run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    home, root = tmp / "airflow_home", tmp / "root"
    home.mkdir()
    _setup_airflow(home, root)

    lg, write_s = _write(root, args.items, args.commits)
    from airflow_provider_datagen.core.sources import prepare_items

    # an inline source as a plan stores it: the item page looks the item's input up there
    lg.write_source_snapshot(prepare_items(({"id": f"item-{i:06d}", "n": i} for i in range(args.items)), "id"))
    stats = lg.stats()
    print(
        f"wrote {args.items:,} items / {stats['events']:,} events in {args.commits} commits "
        f"({write_s:.1f} s): {stats['fragments']} fragments, {stats['size_bytes'] / 2**20:.1f} MiB"
    )

    from airflow.api_fastapi.app import create_app, get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from fastapi.testclient import TestClient

    app = create_app()
    client = TestClient(app)
    client.cookies.set("_token", get_auth_manager().generate_jwt(SimpleAuthManagerUser(username="admin", role="admin")))

    t = time.perf_counter()
    states = lg.states()
    fold_s = time.perf_counter() - t
    t = time.perf_counter()
    failures = lg.failures()
    failures_s = time.perf_counter() - t
    print(
        f"log.states(): {states.num_rows:,} items in {fold_s * 1000:.0f} ms; "
        f"log.failures(): {len(failures):,} rows in {failures_s * 1000:.0f} ms"
    )

    before = _measure(client, args.repeat, args.items)
    _print(f"before maintain() ({stats['fragments']} fragments)", before)
    parts_before = _components(lg, root, max(1, args.repeat // 2))
    for name, ms in parts_before.items():
        print(f"  part: {name:34s} {ms:9.1f} ms cold")

    t = time.perf_counter()
    report = lg.maintain()
    maintain_s = time.perf_counter() - t
    after_stats = lg.stats()
    print(
        f"\nmaintain(): {maintain_s:.1f} s, {report.get('fragments_before')} -> {report.get('fragments_after')} "
        "fragments"
    )
    t = time.perf_counter()
    lg.states()
    fold_after_s = time.perf_counter() - t
    print(f"log.states() after maintain: {fold_after_s * 1000:.0f} ms")
    after = _measure(client, args.repeat, args.items)
    _print(f"after maintain() ({after_stats['fragments']} fragments)", after)
    parts_after = _components(lg, root, max(1, args.repeat // 2))
    for name, ms in parts_after.items():
        print(f"  part: {name:34s} {ms:9.1f} ms cold")

    figures = {
        "items": args.items,
        "events": stats["events"],
        "commits": args.commits,
        "fragments_before": stats["fragments"],
        "fragments_after": after_stats["fragments"],
        "fold_ms_before": fold_s * 1000,
        "fold_ms_after": fold_after_s * 1000,
        "failures_ms_before": failures_s * 1000,
        "before": before,
        "after": after,
        "parts_before": parts_before,
        "parts_after": parts_after,
    }
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return figures


if __name__ == "__main__":
    main()
