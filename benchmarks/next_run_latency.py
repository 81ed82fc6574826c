"""What the next-run panel and the item page's input cost on a big path source, against same-run baselines.

Writes a source of N items (``{"id", "text"}`` rows, ~100 bytes) as JSONL, Parquet and Lance, runs 95%
of them to completion with ``run_items`` (a no-op process), records each source as a plan task does,
then times, cold (a fresh ``Reader``: empty caches) and per format:

* the experiment page's data (``Reader.status``: fold, counts, failures, panels) with the recorded
  source, against the same call on the same log with no record (the log-only panel), interleaved:
  the difference is what classifying the source adds;
* the parts alone: ``scan_source`` (the streamed read and fingerprinting a plan does) and
  ``rerun_counts`` (that scan plus the planner's match over the fold);
* the item page's data (``Reader.item``) for an item near the end of the source, with and without
  the record (with it, the item's row is read back by key).

Run with ``.venv/bin/python -m benchmarks.next_run_latency [--items 100000] [--repeat 3]``. Timing is
printed, never asserted.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


def _ms(fn: Any, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times)


def _sources(directory: Path, rows: list[dict[str, Any]]) -> dict[str, str]:
    import lance
    import orjson
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(rows)
    out = {"jsonl": str(directory / "src.jsonl"), "parquet": str(directory / "src.parquet")}
    Path(out["jsonl"]).write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    pq.write_table(table, out["parquet"])
    out["lance"] = str(directory / "src.lance")
    lance.write_dataset(table, out["lance"])
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--items", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="datagen-next-run-bench-"))
    try:
        return _run(args.items, args.repeat, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _run(n: int, repeat: int, tmp: Path) -> dict[str, Any]:
    from airflow_provider_datagen.core import CheckpointLog, run_items
    from airflow_provider_datagen.core.chunks import plan_chunks, record_plan_source
    from airflow_provider_datagen.core.next_run import rerun_counts
    from airflow_provider_datagen.core.source_scan import scan_source
    from airflow_provider_datagen.core.store.source_ref import recorded_source
    from airflow_provider_datagen.plugins.data import Reader

    rows = [
        {"id": f"item-{i:07d}", "text": f"a prompt of about one hundred bytes, number {i:07d}, padded"}
        for i in range(n)
    ]
    paths = _sources(tmp, rows)
    root = tmp / "root"
    lg = CheckpointLog.open(str(root), pipeline="bench", experiment="next")
    t = time.perf_counter()
    run_items(lg, rows[: n * 95 // 100], lambda item, ctx: None)
    took = time.perf_counter() - t
    print(f"{n:,} items, {n * 95 // 100:,} completed by run_items in {took:.1f} s; log version {lg.version}")
    item = rows[n - n // 10]["id"]  # completed, near the end of the source (the JSONL scan's worst side)
    figures: dict[str, Any] = {"items": n}

    def status() -> Any:
        return Reader(str(root)).status("bench", "next")

    def item_page() -> Any:
        return Reader(str(root)).item("bench", "next", item)

    status(), item_page()  # imports and first-use costs out of the figures
    real_source_of = Reader.source_of

    def paired(fn: Any) -> tuple[float, float]:
        """Median ms of ``fn`` with the record and without it (the baseline), interleaved."""
        with_ref, without = [], []
        for _ in range(repeat):
            with_ref.append(_ms(fn, 1))
            Reader.source_of = lambda self, event_log: None  # type: ignore[method-assign]
            try:
                without.append(_ms(fn, 1))
            finally:
                Reader.source_of = real_source_of  # type: ignore[method-assign]
        return statistics.median(with_ref), statistics.median(without)

    heads = ("page data", "no record", "scan_source", "rerun_counts", "item data", "no record")
    print(f"\n  {'format':8s} " + " ".join(f"{h:>12s}" for h in heads))
    for fmt, path in paths.items():
        planned = plan_chunks(lg, path, key_field="id", processor_version="v1")
        record_plan_source(lg, path, planned, key_field="id", processor_version="v1", redo_completed="never")
        ref = recorded_source(lg.uri)
        assert ref is not None
        states = lg.states()
        counts = rerun_counts(ref, states, lg.version)
        assert (counts.skip, counts.fresh) == (n * 95 // 100, n - n * 95 // 100), counts
        got = item_page()
        assert got["input"]["found"], got["input"]
        page, page_base = paired(status)
        scan = _ms(lambda path=path: scan_source(path, "id"), repeat)
        classify = _ms(lambda ref=ref, states=states: rerun_counts(ref, states, lg.version), repeat)
        one, one_base = paired(item_page)
        figures[fmt] = {
            "page_data_ms": page,
            "page_data_baseline_ms": page_base,
            "scan_source_ms": scan,
            "rerun_counts_ms": classify,
            "item_data_ms": one,
            "item_data_baseline_ms": one_base,
        }
        shown = (page, page_base, scan, classify, one, one_base)
        print(f"  {fmt:8s} " + " ".join(f"{v:12.1f}" for v in shown))
    return figures


if __name__ == "__main__":
    main()
