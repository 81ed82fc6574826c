"""Planning at size: fingerprint throughput, plan_resume at 200k/1M, the streamed plan's RSS curve, and
the export's time and peak RSS per format, with and without ``include_input`` (sizes up to 1M).

``python -m benchmarks.scale`` (``make bench-scale``; sizes with ``--sizes``, default 1M,3M,10M) builds
a Parquet source of ~100-byte prompt rows and a log 95% done (about 4.9 events an item) per size, once:
both are cached under ``benchmarks/.data/scale/`` (gitignored). Every plan runs in a fresh process, so
its peak RSS (``ru_maxrss``) is the plan's own. Figures go to ``benchmarks/scale_results.json``.
``--export-only`` measures only the export (``--compare DIR``: also the code of another checkout, each
export right after this code's, in the same run).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DATA = HERE / ".data" / "scale"
RESULTS = HERE / "scale_results.json"
SLICE = 500_000


def prompt_rows(lo: int, hi: int) -> list[dict[str, object]]:
    """~100-byte prompt rows (the canonical JSON of one is 100-110 bytes)."""
    return [
        {"id": f"item-{i:08d}", "prompt": f"Write a short story about topic number {i} in the style of a famous author"}
        for i in range(lo, hi)
    ]


def build(n: int) -> Path:
    """The source and the log of size ``n`` (built once, then reused)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from airflow_provider_datagen.core import CheckpointLog
    from benchmarks.synth import synth_events

    root = DATA / f"n{n}"
    if (root / "DONE").exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    log = CheckpointLog.open(root / "logs", pipeline="bench", experiment="scale", auto_maintain_fragments=None)
    t = time.perf_counter()
    events = 0
    writer = None
    for lo in range(0, n, SLICE):
        rows = prompt_rows(lo, min(n, lo + SLICE))
        table = pa.Table.from_pylist(rows)
        if writer is None:
            writer = pq.ParquetWriter(root / "source.parquet", table.schema)
        writer.write_table(table, row_group_size=100_000)
        ev = synth_events(rows, 0.95, seed=lo, first_row=events)
        log.append(ev)
        events += ev.num_rows
        print(
            f"    built {min(n, lo + SLICE)}/{n} items, {events} events ({time.perf_counter() - t:.0f} s)", flush=True
        )
    assert writer is not None
    writer.close()
    (root / "DONE").write_text(json.dumps({"items": n, "events": events, "build_s": time.perf_counter() - t}))
    return root


_CHILD = r"""
import json, os, sys, time
import psutil
root, n, what = sys.argv[1], int(sys.argv[2]), sys.argv[3]
from airflow_provider_datagen.core import CheckpointLog
log = CheckpointLog.open(os.path.join(root, "logs"), pipeline="bench", experiment="scale", auto_maintain_fragments=None)
source = os.path.join(root, "source.parquet")
before = psutil.Process().memory_info().rss
t = time.perf_counter()
cpu = time.process_time()
if what == "plan":
    from airflow_provider_datagen.core.chunks import plan_chunks
    result = plan_chunks(log, source, chunk_size=100, max_chunks=1024)
    out = {"pending": len(result.plan.pending), "chunks": len(result.chunks)}
elif what == "profile":
    import cProfile, io, pstats
    from airflow_provider_datagen.core.chunks import plan_chunks
    prof = cProfile.Profile()
    prof.enable()
    plan_chunks(log, source, chunk_size=100, max_chunks=1024)
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(14)
    out = {"profile": buf.getvalue()}
elif what.startswith("export-"):
    import shutil
    from airflow_provider_datagen.core import export_results
    fmt = what.rsplit("-", 1)[1]
    with_input = what.startswith("export-input-")
    dest = os.path.join(root, "export_" + what.split("-", 1)[1])
    shutil.rmtree(dest, ignore_errors=True)
    kw = {"include_input": True, "source": source} if with_input else {}
    result = export_results(log, dest, format=fmt, **kw)
    out = {"rows": result["rows"], "fingerprint": result["fingerprint"]}
    shutil.rmtree(dest, ignore_errors=True)
elif what == "states":
    out = {"states_rows": log.states().num_rows}
elif what == "scan":
    import pyarrow.parquet as pq
    rows = sum(b.num_rows for b in pq.ParquetFile(source).iter_batches(batch_size=1 << 16))
    out = {"rows": rows}
elif what == "light":
    from airflow_provider_datagen.core.schema import LIGHT_COLUMNS
    ds = log.table.dataset()
    out = {"rows": sum(b.num_rows for b in ds.to_batches(columns=list(LIGHT_COLUMNS), batch_size=1 << 16))}
out["s"] = time.perf_counter() - t
out["cpu_s"] = time.process_time() - cpu
out["rss_before_mb"] = before / 2**20
# VmHWM, not ru_maxrss: Linux keeps ru_maxrss across exec, so it would report the parent's peak
with open("/proc/self/status") as fh:
    out["peak_rss_mb"] = next(int(l.split()[1]) for l in fh if l.startswith("VmHWM:")) / 1024
print(json.dumps(out))
"""


def child(root: Path, n: int, what: str, code: Path | None = None) -> dict[str, Any]:
    """``what`` measured in a fresh process; ``code``: a checkout whose package it imports instead of this one."""
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(root), str(n), what],
        capture_output=True,
        text=True,
        check=False,
        cwd=code,  # ``-c`` puts the working directory first on sys.path
    )
    if proc.returncode:
        raise RuntimeError(f"{what} at {n} failed:\n{proc.stderr[-3000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def drop_fold_cache(root: Path) -> None:
    """Delete the state projection (disposable by design): the next read folds the whole log."""
    from airflow_provider_datagen.core import CheckpointLog
    from airflow_provider_datagen.core.store.paths import projection_uri

    log = CheckpointLog.open(root / "logs", pipeline="bench", experiment="scale", auto_maintain_fragments=None)
    shutil.rmtree(projection_uri(log.uri), ignore_errors=True)


def bench_size(n: int, profile: bool) -> dict[str, Any]:
    root = build(n)
    meta = json.loads((root / "DONE").read_text())
    row: dict[str, Any] = {"items": n, "events": meta["events"], "build_s": meta["build_s"]}
    row["source_scan"] = child(root, n, "scan")
    row["light_scan"] = child(root, n, "light")
    drop_fold_cache(root)
    row["states_cold"] = child(root, n, "states")
    drop_fold_cache(root)
    row["plan_cold"] = child(root, n, "plan")  # writes the fold cache, as a plan task does
    row["plan_warm"] = child(root, n, "plan")
    row["states_warm"] = child(root, n, "states")
    if profile:
        row["profile_warm"] = child(root, n, "profile")["profile"]
    pc, pw, sc, ss, lg = (row[k] for k in ("plan_cold", "plan_warm", "states_cold", "source_scan", "light_scan"))
    print(
        f"  {n} items / {meta['events']} events: plan task cold {pc['s']:.1f} s (CPU {pc['cpu_s']:.1f} s), "
        f"peak RSS {pc['peak_rss_mb']:.0f} MB | with the fold cache {pw['s']:.1f} s (CPU {pw['cpu_s']:.1f} s), "
        f"{pw['peak_rss_mb']:.0f} MB | states() cold {sc['peak_rss_mb']:.0f} MB ({sc['s']:.1f} s), cached "
        f"{row['states_warm']['peak_rss_mb']:.0f} MB | baselines: streamed Arrow scan of the source "
        f"{ss['s']:.2f} s (CPU {ss['cpu_s']:.2f} s, {ss['peak_rss_mb']:.0f} MB), light-column scan of the log "
        f"{lg['s']:.2f} s (CPU {lg['cpu_s']:.2f} s, {lg['peak_rss_mb']:.0f} MB)",
        flush=True,
    )
    return row


#: Sizes whose export (each format) is measured; the issue's bound: 1M items under 1 GiB RSS.
EXPORT_MAX_ITEMS = 1_000_000


EXPORT_FORMATS = ("lance", "parquet", "jsonl")


def ensure_fold_cache(root: Path) -> None:
    """Store the fold cache if the log has none (a run's map tasks store it; the export reads it)."""
    from airflow_provider_datagen.core import CheckpointLog

    log = CheckpointLog.open(root / "logs", pipeline="bench", experiment="scale", auto_maintain_fragments=None)
    if not log.projection_version():
        log.maintain()


def _export_line(n: int, name: str, row: dict[str, Any]) -> str:
    return f"  export of {n} items ({name}): " + ", ".join(
        f"{what} {r['s']:.1f} s (CPU {r['cpu_s']:.1f} s), peak RSS {r['peak_rss_mb']:.0f} MB" for what, r in row.items()
    )


def bench_export(n: int, *, with_input: bool = True, compare: Path | None = None) -> dict[str, Any]:
    """Peak RSS and time of ``export_results`` of the size-``n`` log, per format (a child process each).

    ``with_input``: also each format with ``include_input=True`` (the Parquet source). ``compare``: a
    checkout of other code (``git worktree add``, ``git archive``) measured in the same run, each of
    its exports right after this code's, so the two see the same machine.
    """
    root = build(n)
    ensure_fold_cache(root)
    whats = [f"export-{fmt}" for fmt in EXPORT_FORMATS]
    if with_input:
        whats += [f"export-input-{fmt}" for fmt in EXPORT_FORMATS]
    row: dict[str, Any] = {}
    other: dict[str, Any] = {}
    for what in whats:
        key = what.removeprefix("export-")
        row[key] = child(root, n, what)
        if compare is not None:
            other[key] = child(root, n, what, compare)
            if other[key]["fingerprint"] != row[key]["fingerprint"]:
                raise RuntimeError(f"{what} at {n}: the compared code exported other content")
    print(_export_line(n, "this code", row), flush=True)
    if compare is not None:
        print(_export_line(n, f"code at {compare}", other), flush=True)
        row["compared"] = {"code": str(compare), **other}
    return row


def cpu_time(fn: Any, repeats: int) -> float:
    """Median CPU seconds of ``fn`` (this machine's 2 cores are shared: wall time measures the neighbours)."""
    times = []
    for _ in range(repeats):
        t = time.process_time()
        fn()
        times.append(time.process_time() - t)
    return sorted(times)[len(times) // 2]


def bench_fingerprints(n: int = 200_000) -> dict[str, Any]:
    """Fingerprints of ~100-byte prompt rows: the plan's paths against the stdlib encoder, same run, CPU time."""
    import pyarrow as pa

    from airflow_provider_datagen.core.events import _FAST
    from airflow_provider_datagen.core.sources import fingerprint_batch, fingerprint_rows, prepare_items

    rows = prompt_rows(0, n)
    table = pa.Table.from_pylist(rows)
    assert _FAST is not None
    sha = hashlib.sha256

    def stdlib() -> None:
        for r in rows:
            sha("".join(_FAST(r, 0)).encode("utf-8")).hexdigest()[:32]

    def batches() -> None:  # the streamed plan's work per batch: ids and fingerprints a column at a time
        for batch in table.to_batches(max_chunksize=1 << 16):
            assert fingerprint_batch(batch, "id") is not None

    def batch_rows() -> None:  # the same batches through a dict per row (the path before fingerprint_batch)
        for batch in table.to_batches(max_chunksize=1 << 16):
            fingerprint_rows(batch.to_pylist(), "id", plain=True)  # the schema is string columns

    base = cpu_time(stdlib, 3)
    fast = cpu_time(lambda: fingerprint_rows(rows, "id"), 3)
    arrow = cpu_time(batches, 3)
    arrow_rows = cpu_time(batch_rows, 3)
    prep = cpu_time(lambda: prepare_items(rows), 3)
    out = {
        "items": n,
        "stdlib_fingerprint_items_per_s": n / base,
        "fingerprint_rows_items_per_s": n / fast,
        "arrow_batches_items_per_s": n / arrow,
        "arrow_batches_row_path_items_per_s": n / arrow_rows,
        "prepare_items_per_s": n / prep,
    }
    print(
        f"  fingerprints of {n} ~100-byte rows (CPU time): raw dicts {n / fast:,.0f} items/s, from Arrow batches "
        f"{n / arrow:,.0f} items/s (a dict per row: {n / arrow_rows:,.0f}), prepare_items (SourceItems) "
        f"{n / prep:,.0f} items/s | baseline stdlib canonical JSON + sha256 alone {n / base:,.0f} items/s -> "
        f"{base / fast:.2f}x, {base / arrow:.2f}x",
        flush=True,
    )
    return out


def bench_plan_resume(sizes: tuple[int, ...] = (200_000, 1_000_000)) -> list[dict[str, Any]]:
    """plan_resume over raw dicts (built before the clock), 95% done, fold cache present."""
    import pyarrow.parquet as pq

    from airflow_provider_datagen.core import CheckpointLog, plan_resume
    from airflow_provider_datagen.core.schema import LIGHT_COLUMNS
    from benchmarks.run import median_time

    out = []
    for n in sizes:
        root = build(n)

        def opened(root: Path = root) -> CheckpointLog:
            return CheckpointLog.open(root / "logs", pipeline="bench", experiment="scale", auto_maintain_fragments=None)

        log = opened()
        if not log.projection_version():
            log.maintain()
        rows = prompt_rows(0, n)
        cpu = time.process_time()
        warm = median_time(lambda rows=rows: plan_resume(opened(), rows), 3)
        cpu = (time.process_time() - cpu) / 3
        ds = opened().table.dataset()
        light = median_time(
            lambda ds=ds: sum(b.num_rows for b in ds.to_batches(columns=list(LIGHT_COLUMNS), batch_size=1 << 16)), 3
        )
        path = root / "source.parquet"
        scan = median_time(
            lambda path=path: sum(b.num_rows for b in pq.ParquetFile(path).iter_batches(batch_size=1 << 16)), 3
        )
        row = {
            "items": n,
            "plan_resume_s": warm,
            "plan_resume_cpu_s": cpu,
            "light_scan_s": light,
            "source_scan_s": scan,
        }
        print(
            f"  plan_resume {n} raw dicts (95% done, fold cache, fingerprints included): {warm:.3f} s "
            f"(CPU {cpu:.3f} s) | baselines: "
            f"light-column scan of the log {light:.3f} s, streamed Arrow scan of the source {scan:.3f} s",
            flush=True,
        )
        out.append(row)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1000000,3000000,10000000")
    parser.add_argument("--skip-resume", action="store_true")
    parser.add_argument("--export-only", action="store_true", help="only the export's figures, per size up to 1M")
    parser.add_argument("--compare", type=Path, help="with --export-only: a checkout measured beside this code")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    t = time.perf_counter()
    results: dict[str, Any] = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    if args.export_only:
        for n in sizes:
            if n <= EXPORT_MAX_ITEMS:
                results.setdefault("export", {})[str(n)] = bench_export(n, compare=args.compare)
                RESULTS.write_text(json.dumps(results, indent=1, sort_keys=True))
        print(f"  the export's figures took {time.perf_counter() - t:.0f} s", flush=True)
        return
    results["fingerprints"] = bench_fingerprints()
    if not args.skip_resume:
        results["plan_resume"] = bench_plan_resume()
    curve = results.setdefault("curve", {})
    for n in sizes:
        curve[str(n)] = bench_size(n, profile=n == max(sizes))
        if n <= EXPORT_MAX_ITEMS:
            results.setdefault("export", {})[str(n)] = bench_export(n)
        RESULTS.write_text(json.dumps(results, indent=1, sort_keys=True))
    results["duration_s"] = time.perf_counter() - t
    RESULTS.write_text(json.dumps(results, indent=1, sort_keys=True))
    print(f"  bench-scale took {results['duration_s']:.0f} s", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
