"""``make bench``: the provider's figures beside baselines measured in the same run.

Prints a table and writes ``benchmarks/results.json``. Sections (``--only`` picks some):

* ``throughput``: no-op items/s through ``run_items`` at several ``checkpoint_every``, against two kinds
  of baseline. The write-only floor: the same marker rows written to a SQLite sidecar (WAL, one
  transaction per batch, ``synchronous=FULL``), to a JSONL sidecar (fsync per batch), and raw Lance
  appends of the same rows (the floor). The hand-rolled peer (``sqlite_loop``): the checkpoint loop a
  user replacing the provider would write over the same items, with the same SQLite sidecar: read what
  is done, then per item its id, input fingerprint, the no-op call and its marker rows, committed at
  the same boundaries as ours. And the required-work floor: only the hashing and columns any writer of
  this log format must compute for the same items and events, checked to give the ids ours wrote.
* ``plan``: ``plan_resume`` over N source items / ~5N events, 95 % done, against a scan of the light
  columns (the floor) and a naive per-item Python fold (measured on a sample, scaled), plus peak RSS
  of planning in a fresh process.
* ``reads``: ``item_state`` and the UI's item query before and after ``maintain()``, and after 10,000
  small commits against a freshly written log.
* ``airflow``: 1,000 items as 10 chunks through ``DatagenMapOperator`` against 1,000 native mapped task
  instances doing the same fake work, and the rerun with 99 % done (``dag.test()``). Then under the real
  scheduler (a stack on 127.0.0.1, LocalExecutor, ``parallelism=8``): 10,000 items x 50 ms through the
  plan and ``chunk_size="auto"`` chunks at ``concurrency=64``, the run again with nothing pending, and
  native mapping over 1,000 items in the same stack (``benchmarks.airflow_level.bench_scheduler``).
* ``fanout``: a few roots split into many children each (5 ms of I/O-like waiting per child) through
  ``run_items`` with ``concurrency=8``, against the same run with ``concurrency=1``; with fewer roots
  than threads, only running children in parallel fills the threads. And one root split into a few
  sections split into many pieces: only running the grandchildren in parallel beats the section count.
* ``concurrency``: efficiency (rate / ideal) of sync threads against an async process at several
  concurrencies and latencies, and the retry path's cost when nothing fails (benchmarks/concurrency.py).
* ``ledger``: ``log.usage()`` at N items / ~5N events before and after ``maintain()`` beside ``states()``,
  and a budget's overshoot with 4 concurrent processes (see benchmarks/ledger.py).
* ``batch``: the per-item cost of recording 100k batch results against ``run_items`` writing the same
  fields and usage (see benchmarks/batch_results.py).
* ``model_step``: the model step (``run_items`` with an SDK process, ``llm_process`` per engine) against a
  raw ``AsyncOpenAI`` loop over a local OpenAI-compatible server at 100 ms, 256 and 64 in flight, with
  and without 429s (see benchmarks/model_step.py).
* ``responses``: the response store: a lookup of 10,000 keys in 1M entries, opening it, a durable append,
  and ``llm_process`` at 256 in flight with the store on and off (see benchmarks/responses.py).
* ``chunk``: what one mapped task pays besides its items (its chunk's states, the closing status) at
  100k and 1M items, before and after it stopped reading the whole log (see benchmarks/chunk_overhead.py).

Every figure is a median over repeats; ratios compare figures of this run only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from benchmarks.batch_results import bench_batch_results
from benchmarks.chunk_overhead import bench_chunk_overhead
from benchmarks.concurrency import bench_concurrency
from benchmarks.fakes import LATENCY_ENV
from benchmarks.ledger import bench_ledger
from benchmarks.model_step import bench_model_step
from benchmarks.responses import bench_responses

if TYPE_CHECKING:
    from collections.abc import Callable

RESULTS = Path(__file__).with_name("results.json")


def median_time(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _noop(item: dict[str, Any], ctx: Any) -> None:
    return None


# --- 1. checkpoint throughput ---------------------------------------------------------------------


def _markers(commits: list[pa.Table]) -> list[list[tuple[str, int, str, str]]]:
    """Per commit, the marker rows a sidecar manifest would hold for the same events."""
    cols = ("item_id", "item_seq", "event_type", "input_fingerprint")
    return [list(zip(*(t[c].to_pylist() for c in cols))) for t in commits]


def sqlite_sidecar(tmp: Path, batches: list[list[tuple[str, int, str, str]]]) -> None:
    """The same markers in a SQLite manifest: WAL, synchronous=FULL, one transaction per commit."""
    db = sqlite3.connect(tmp / f"manifest-{time.monotonic_ns()}.db", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE markers (item_id TEXT, seq INTEGER, type TEXT, fp TEXT, PRIMARY KEY (item_id, seq))")
    for batch in batches:
        db.execute("BEGIN")
        db.executemany("INSERT INTO markers VALUES (?, ?, ?, ?)", batch)
        db.execute("COMMIT")
    db.close()


def loop_plan(
    batches: list[list[tuple[str, int, str, str]]],
) -> tuple[dict[str, list[tuple[int, str]]], list[int]]:
    """What :func:`sqlite_loop` needs to write what ours wrote, taken from our commits' marker rows.

    Per item id, the (sequence, type) of its marker rows; and the number of items each of our commits
    finished (its ``TERMINAL`` rows), commits finishing none left out: the loop's transaction sizes.
    """
    shapes: dict[str, list[tuple[int, str]]] = {}
    groups = []
    for batch in batches:
        for iid, seq, event_type, _ in batch:
            shapes.setdefault(iid, []).append((seq, event_type))
        finished = sum(1 for row in batch if row[2] == "TERMINAL")
        if finished:
            groups.append(finished)
    for shape in shapes.values():
        shape.sort()
    return shapes, groups


def sqlite_loop(
    tmp: Path,
    items: list[dict[str, Any]],
    shapes: dict[str, list[tuple[int, str]]],
    groups: list[int],
    key_field: str = "id",
) -> Path:
    """The hand-rolled peer: a user's own checkpoint loop over a SQLite sidecar, doing what ours does per item.

    Unlike the write-only floor (:func:`sqlite_sidecar`, rows prepared in advance), this is the loop a
    user replacing the provider would write: open the sidecar (WAL, ``synchronous=FULL``, the same
    table), read which items are done (with the fingerprint they were done with; none at the start) to
    skip them, then per item compute its id (:func:`root_item_id`) and input fingerprint
    (:func:`fingerprint_of`), call the same no-op function and insert, as it finishes, the same marker
    rows our log holds for it (``shapes``, see :func:`loop_plan`). One transaction per group of items,
    the groups as ours (``groups``): each ends with the last item whose ``TERMINAL`` row is in one of
    our commits, so the default ``checkpoint_every`` gets the same ramp of group sizes. Returns the
    sidecar's path.
    """
    from airflow_provider_datagen.core.events import fingerprint_of
    from airflow_provider_datagen.core.ids import root_item_id

    path = tmp / f"loop-{time.monotonic_ns()}.db"
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute(
        "CREATE TABLE IF NOT EXISTS markers (item_id TEXT, seq INTEGER, type TEXT, fp TEXT, PRIMARY KEY (item_id, seq))"
    )
    done = dict(db.execute("SELECT item_id, fp FROM markers WHERE type = 'TERMINAL'").fetchall())
    insert = "INSERT INTO markers VALUES (?, ?, ?, ?)"
    group = iter(groups)
    size = next(group, 0)
    since = 0
    for item in items:
        iid = root_item_id(item[key_field])
        fp = fingerprint_of(item)
        if done.get(iid) == fp:
            continue
        _noop(item, None)
        if since == 0:
            db.execute("BEGIN")
        db.executemany(insert, [(iid, seq, event_type, fp) for seq, event_type in shapes[iid]])
        since += 1
        if since == size:
            db.execute("COMMIT")
            since, size = 0, next(group, 0)
    if since:
        db.execute("COMMIT")
    db.close()
    return path


def _same_markers(path: Path, batches: list[list[tuple[str, int, str, str]]]) -> bool:
    """Whether a sidecar holds exactly the marker rows of ``batches``."""
    db = sqlite3.connect(path)
    try:
        rows = db.execute("SELECT item_id, seq, type, fp FROM markers").fetchall()
    finally:
        db.close()
    return sorted(rows) == sorted(row for batch in batches for row in batch)


def jsonl_sidecar(tmp: Path, batches: list[list[tuple[str, int, str, str]]]) -> None:
    """The same markers appended to a JSONL manifest, fsync per commit."""
    with open(tmp / f"manifest-{time.monotonic_ns()}.jsonl", "a", encoding="utf-8") as fh:
        for batch in batches:
            fh.write("".join(json.dumps({"item_id": a, "seq": b, "type": c, "fp": d}) + "\n" for a, b, c, d in batch))
            fh.flush()
            os.fsync(fh.fileno())


def raw_lance(tmp: Path, commits: list[pa.Table]) -> None:
    """The floor: the very rows run_items wrote, in the very same commits, with the same fsyncs."""
    import lance

    from airflow_provider_datagen.core.schema import EVENT_SCHEMA

    uri = str(tmp / f"raw-{time.monotonic_ns()}.lance")
    ds = None
    max_frag = -1
    for table in commits:
        if ds is None:
            ds = lance.write_dataset(table, uri, schema=EVENT_SCHEMA, enable_stable_row_ids=True)
        else:
            ds = lance.write_dataset(table, ds, mode="append")
        paths = []
        for frag in ds.get_fragments():
            if frag.fragment_id > max_frag:
                paths += [os.path.join(uri, "data", f.path) for f in frag.data_files()]
                max_frag = frag.fragment_id
        paths += [os.path.join(uri, "_versions", f"{(1 << 64) - 1 - ds.version}.manifest")]
        paths += [os.path.join(uri, "data"), os.path.join(uri, "_versions")]
        for path in paths:
            fd = os.open(path, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)


def required_work(items: list[dict[str, Any]], commits: list[pa.Table]) -> Callable[[], None]:
    """The least pure-Python work any writer of this log's format does for these items, as a function.

    Running it recomputes, per source item, its id and input fingerprint, and per event of
    ``commits``, its 128-bit id (the BLAKE2b of the event's identity text) and key, then builds the
    Arrow columns that vary per row: no runner, no validation, no user call, no write. Each row's
    coordinate text is prepared outside, as our writer prepares it once per event shape. The first run
    checks that the ids it computes are the ids ours wrote, so this is the real work, not an estimate.
    Parity with the write-only SQLite sidecar, whose rows come prepared, is out of reach for any pure
    Python writer slower than this.
    """
    import gc
    import hashlib

    import numpy as np

    from airflow_provider_datagen.core.events import ID_DIGEST_SIZE, ID_SEP, event_ids_of, fingerprint_of
    from airflow_provider_datagen.core.ids import root_item_id

    rows = pa.concat_tables(commits)
    sep = ID_SEP
    sequenced = ("ITEM_CREATED", "STEP_COMPLETED")
    coords = ("status", "step_kind", "step", "enclosing_step", "selector_step", "iteration", "fanout_index")
    cols = {c: rows[c].to_pylist() for c in ("item_id", "item_seq", "event_type", "processor_version", *coords)}

    def part(value: Any) -> str:
        return "" if value is None else str(value)

    tails = []
    for i, event_type in enumerate(cols["event_type"]):
        pv = cols["processor_version"][i] if event_type in sequenced else None
        tail = sep + sep.join(part(v) for v in (pv, *(cols[c][i] for c in coords))) + sep * 4
        tails.append((f"{sep}{event_type}{sep}", tail))
    position = {root_item_id(it["id"]): n for n, it in enumerate(items)}
    events = [(position[iid], seq, *tails[i]) for i, (iid, seq) in enumerate(zip(cols["item_id"], cols["item_seq"]))]
    expected = rows["event_id"]
    checked = False

    def run() -> None:
        nonlocal checked
        gc.freeze()  # as run_items does: the collector then walks only what this allocates
        try:
            table = work()
        finally:
            gc.unfreeze()
        if not checked:
            if not table["event_id"].equals(expected):
                raise AssertionError("the required-work floor did not compute the event ids ours wrote")
            checked = True

    def work() -> pa.Table:
        ids = [root_item_id(it["id"]) for it in items]
        fps = [fingerprint_of(it) for it in items]
        new_hash = hashlib.blake2b(digest_size=ID_DIGEST_SIZE).copy
        digests = []
        for n, seq, head, tail in events:
            h = new_hash()
            h.update(f"{ids[n]}{sep}{seq}{head}{fps[n]}{tail}".encode())
            digests.append(h.digest())
        event_ids, keys = event_ids_of(b"".join(digests))
        return pa.table(
            {
                "event_id": event_ids,
                "event_key": keys,
                "item_id": pa.array([ids[e[0]] for e in events], pa.string()),
                "item_seq": np.fromiter((e[1] for e in events), np.int64, len(events)),
                "input_fingerprint": pa.array([fps[e[0]] for e in events], pa.string()),
            }
        )

    return run


def _commits_of(log: Any) -> list[pa.Table]:
    """The rows of each commit of a log, in commit order (grouped by ``_row_created_at_version``)."""
    import pyarrow.compute as pc

    from airflow_provider_datagen.core.schema import EVENT_SCHEMA, NON_BLOB_COLUMNS

    ds = log.table.dataset()
    light = ds.to_table(columns=[*NON_BLOB_COLUMNS, "_row_created_at_version"])
    light = light.append_column(EVENT_SCHEMA.field("value_blob"), pa.nulls(light.num_rows, pa.large_binary()))
    versions = light["_row_created_at_version"]
    table = light.select(EVENT_SCHEMA.names).cast(EVENT_SCHEMA)
    out = []
    for v in sorted(set(versions.to_pylist())):
        out.append(table.filter(pc.equal(versions, v)))
    return out


def _throughput_case(tmp: Path, ce: int | None, n: int, repeats: int) -> dict[str, Any]:
    from airflow_provider_datagen.core import CheckpointLog, run_items

    items = [{"id": f"item-{i:07d}", "v": i} for i in range(n)]
    logs: list[Any] = []

    def ours() -> None:
        log = CheckpointLog.open(tmp / f"ours-{time.monotonic_ns()}", pipeline="b", experiment="e")
        run_items(log, items, _noop, checkpoint_every=ce)
        logs.append(log)

    t_ours = median_time(ours, repeats)
    commits = _commits_of(logs[-1])
    batches = _markers(commits)
    t_sqlite = median_time(lambda: sqlite_sidecar(tmp, batches), repeats)
    shapes, groups = loop_plan(batches)
    loops: list[Path] = []
    t_loop = median_time(lambda: loops.append(sqlite_loop(tmp, items, shapes, groups)), repeats)
    if not _same_markers(loops[-1], batches):
        raise AssertionError("the hand-rolled SQLite loop did not write the marker rows ours did")
    t_jsonl = median_time(lambda: jsonl_sidecar(tmp, batches), repeats)
    t_raw = median_time(lambda: raw_lance(tmp, commits), repeats)
    t_floor = median_time(required_work(items, commits), repeats)
    return {
        "checkpoint_every": "default" if ce is None else ce,
        "items": n,
        "commits": len(commits),
        "ours_items_per_s": n / t_ours,
        "sqlite_items_per_s": n / t_sqlite,
        "jsonl_items_per_s": n / t_jsonl,
        "raw_lance_items_per_s": n / t_raw,
        "sqlite_loop_items_per_s": n / t_loop,
        "required_work_items_per_s": n / t_floor,
        "ours_vs_sqlite": t_sqlite / t_ours,
        "ours_vs_sqlite_loop": t_loop / t_ours,
        "ours_time_vs_raw_lance": t_ours / t_raw,
    }


def bench_throughput(tmp: Path, quick: bool) -> list[dict[str, Any]]:
    out = []
    settings = [(1, 300 if quick else 1000), (10, 2000 if quick else 5000), (100, 5000 if quick else 20000)]
    settings.append((None, 5000 if quick else 50000))
    repeats = 5
    for ce, n in settings:
        row = _throughput_case(tmp, ce, n, repeats)
        out.append(row)
        print(
            f"  checkpoint_every={row['checkpoint_every']!s:>7} n={n:>6}: ours {row['ours_items_per_s']:>9.0f}/s | "
            f"sqlite {row['sqlite_items_per_s']:>9.0f}/s | jsonl {row['jsonl_items_per_s']:>9.0f}/s | "
            f"raw lance {row['raw_lance_items_per_s']:>9.0f}/s | ours/sqlite {row['ours_vs_sqlite']:.2f}x | "
            f"time ours/raw {row['ours_time_vs_raw_lance']:.2f}x | "
            f"sqlite loop {row['sqlite_loop_items_per_s']:>9.0f}/s | "
            f"ours/sqlite loop {row['ours_vs_sqlite_loop']:.2f}x | "
            f"required work alone {row['required_work_items_per_s']:>9.0f}/s",
            flush=True,
        )
    return out


# --- 2. resume planning -----------------------------------------------------------------------------

_PLAN_CHILD = r"""
import json, sys, time
from airflow_provider_datagen.core import CheckpointLog, plan_resume, prepare_items
from benchmarks.synth import source_items

def status(key):
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key):
                return int(line.split()[1]) / 1024

root, n = sys.argv[1], int(sys.argv[2])
items = prepare_items(source_items(n))
before = status("VmRSS")
load_peak = status("VmHWM")
# Reset the peak-RSS mark (Linux clear_refs 5) so VmHWM then gives the peak while planning; the
# whole-process peak is the larger of the two marks.
with open("/proc/self/clear_refs", "w") as fh:
    fh.write("5")
log = CheckpointLog.open(root, pipeline="bench", experiment="plan")
t = time.perf_counter()
plan = plan_resume(log, items)
dt = time.perf_counter() - t
peak = status("VmHWM")
print(json.dumps({"plan_s": dt, "rss_before_mb": before, "load_peak_mb": load_peak, "peak_rss_mb": peak,
                  "whole_process_peak_mb": max(load_peak, peak), "plan_delta_mb": peak - before,
                  "skip": len(plan.skip), "pending": len(plan.pending)}))
"""


def _plan_child(root: Path, n: int) -> dict[str, Any]:
    """Load the source, prepare it and plan in a fresh process; its RSS figures (see _PLAN_CHILD)."""
    child = subprocess.run(
        [sys.executable, "-c", _PLAN_CHILD, str(root), str(n)], capture_output=True, text=True, check=True
    )
    return dict(json.loads(child.stdout.strip().splitlines()[-1]))


def bench_plan(tmp: Path, quick: bool) -> dict[str, Any]:
    from airflow_provider_datagen.core import CheckpointLog, plan_resume, prepare_items
    from airflow_provider_datagen.core.fold import fold_events
    from airflow_provider_datagen.core.schema import LIGHT_COLUMNS
    from benchmarks.synth import build_log, source_items

    n = 100_000 if quick else 1_000_000
    root = tmp / "plan"
    log = CheckpointLog.open(root, pipeline="bench", experiment="plan", auto_maintain_fragments=None)
    raw_items = source_items(n)
    t = time.perf_counter()
    events = build_log(log, raw_items, 0.95)
    build_s = time.perf_counter() - t
    t = time.perf_counter()
    items = prepare_items(raw_items)
    prepare_s = time.perf_counter() - t
    ds = log.table.dataset()
    floor = median_time(lambda: ds.to_table(columns=list(LIGHT_COLUMNS)), 3)
    # the same columns read batch by batch and dropped, as the streamed cold fold reads them: no
    # 500 MB table to allocate, so a lower and steadier floor than the table scan on this machine
    streamed = median_time(
        lambda: sum(b.num_rows for b in ds.to_batches(columns=list(LIGHT_COLUMNS), batch_size=1 << 16)), 3
    )

    def opened() -> CheckpointLog:
        # a fresh object per plan, as a new task process has: a log object remembers its last fold
        return CheckpointLog.open(root, pipeline="bench", experiment="plan", auto_maintain_fragments=None)

    # no cache is written by planning, so every cold plan folds the whole log: a median like the floor's
    cold = median_time(lambda: plan_resume(opened(), items), 3)
    # the same object planning again after its own fold (nothing written since): the memo
    again = opened()
    plan_resume(again, items)
    replan = median_time(lambda: plan_resume(again, items), 3)
    # the same measure in a fresh process before maintain(): planning without the fold cache
    mem_cold = _plan_child(root, n)
    t = time.perf_counter()
    log.maintain()
    maintain_s = time.perf_counter() - t
    warm = median_time(lambda: plan_resume(opened(), items), 3)
    # The naive peer: one per-item query and Python fold per item, measured on a sample and scaled.
    sample = [s.item_id for s in items[: min(300, n)]]
    t = time.perf_counter()
    for iid in sample:
        fold_events(iid, log.events(iid))
    naive = (time.perf_counter() - t) / len(sample) * n
    mem = _plan_child(root, n)
    row = {
        "items": n,
        "events": events,
        "build_s": build_s,
        "prepare_items_s": prepare_s,
        "light_scan_floor_s": floor,
        "plan_cold_full_fold_s": cold,
        "replan_same_object_s": replan,
        "maintain_s": maintain_s,
        "plan_s": warm,
        "plan_vs_floor": warm / floor,
        "cold_plan_vs_floor": cold / floor,
        "streamed_scan_floor_s": streamed,
        "plan_vs_streamed_floor": warm / streamed,
        "cold_plan_vs_streamed_floor": cold / streamed,
        "naive_fold_s_scaled": naive,
        "speedup_vs_naive": naive / warm,
        "peak_rss_mb_fresh_process": mem["whole_process_peak_mb"],
        "rss_before_plan_mb": mem["rss_before_mb"],
        "plan_rss_delta_mb": mem["plan_delta_mb"],
        "plan_s_fresh_process": mem["plan_s"],
        "cold_peak_rss_mb_fresh_process": mem_cold["whole_process_peak_mb"],
        "cold_plan_rss_delta_mb": mem_cold["plan_delta_mb"],
        "cold_plan_s_fresh_process": mem_cold["plan_s"],
    }
    print(
        f"  plan_resume {n} items / {events} events (95% done): {warm:.3f} s with the state projection "
        f"({cold:.3f} s cold, full fold) | light-column scan floor {floor:.3f} s -> {warm / floor:.2f}x "
        f"(cold {cold / floor:.2f}x); streamed scan of the same columns {streamed:.3f} s -> {warm / streamed:.2f}x "
        f"(cold {cold / streamed:.2f}x) | naive per-item fold ~{naive:.0f} s -> {naive / warm:.0f}x faster | "
        f"peak RSS {mem['whole_process_peak_mb']:.0f} MB (fresh process: source {mem['rss_before_mb']:.0f} MB "
        f"loaded and prepared, planning +{mem['plan_delta_mb']:.0f} MB; without the fold cache "
        f"{mem_cold['whole_process_peak_mb']:.0f} MB, +{mem_cold['plan_delta_mb']:.0f} MB) | "
        f"preparing the source (fingerprints) {prepare_s:.2f} s | planning again on the same log object "
        f"{replan:.3f} s",
        flush=True,
    )
    return row


# --- 3. point reads --------------------------------------------------------------------------------


def bench_reads(tmp: Path, quick: bool) -> dict[str, Any]:
    from airflow_provider_datagen.core import CheckpointLog
    from benchmarks.synth import build_log, source_items

    n = 100_000 if quick else 1_000_000
    log = CheckpointLog.open(tmp / "reads", pipeline="bench", experiment="reads", auto_maintain_fragments=None)
    items = source_items(n)
    events = build_log(log, items, 1.0, appends=20)
    probe = [str(items[i]["id"]) for i in range(0, n, max(1, n // 50))]

    def point() -> float:
        ts = []
        for iid in probe:
            t = time.perf_counter()
            log.item_state(iid)
            ts.append(time.perf_counter() - t)
        return statistics.median(ts)

    def ui_item() -> float:
        ts = []
        for iid in probe:
            t = time.perf_counter()
            log.subtree(iid)
            log.failures(iid)
            ts.append(time.perf_counter() - t)
        return statistics.median(ts)

    before, ui_before = point(), ui_item()
    log.maintain()
    after, ui_after = point(), ui_item()

    small = 2000 if quick else 10_000
    fresh = CheckpointLog.open(tmp / "fresh", pipeline="bench", experiment="fresh", auto_maintain_fragments=None)
    frag = CheckpointLog.open(tmp / "frag", pipeline="bench", experiment="frag", auto_maintain_fragments=None)
    its = source_items(small)
    # Primed as run_items primes from its plan: a new item needs no lookup, so each commit is an append.
    w = frag.writer("w", 1)
    t_build = time.perf_counter()
    for it in its:
        w.prime(str(it["id"]), last_seq=-1)
        with w.batch() as b:
            b.item_created(str(it["id"]), input_fingerprint="f")
            b.terminal(str(it["id"]))
    build_small_s = time.perf_counter() - t_build
    w2 = fresh.writer("w", 1)
    with w2.batch() as b:
        for it in its:
            w2.prime(str(it["id"]), last_seq=-1)
            b.item_created(str(it["id"]), input_fingerprint="f")
            b.terminal(str(it["id"]))
    fresh.maintain()
    sample = [str(its[i]["id"]) for i in range(0, small, max(1, small // 50))]

    def reads(lg: CheckpointLog, sample: list[str] = sample) -> float:
        ts = []
        for iid in sample:
            t = time.perf_counter()
            lg.item_state(iid)
            ts.append(time.perf_counter() - t)
        return statistics.median(ts)

    # Five probes: unindexed over 10,000 fragments, one read takes seconds.
    frag_ms = reads(frag, sample[::10])
    frag.maintain()
    # Interleaved rounds, so load on the machine hits both logs alike; the median round is reported.
    rounds = [(reads(fresh), reads(frag)) for _ in range(5)]
    fresh_ms = statistics.median(r[0] for r in rounds)
    frag_after_ms = statistics.median(r[1] for r in rounds)
    row = {
        "events": events,
        "item_state_ms_before_maintain": before * 1e3,
        "item_state_ms_after_maintain": after * 1e3,
        "ui_item_query_ms_before": ui_before * 1e3,
        "ui_item_query_ms_after": ui_after * 1e3,
        "small_commits": small,
        "small_commits_build_s": build_small_s,
        "item_state_ms_fresh_log": fresh_ms * 1e3,
        "item_state_ms_after_small_commits": frag_ms * 1e3,
        "item_state_ms_after_small_commits_and_maintain": frag_after_ms * 1e3,
        "fragmented_vs_fresh": frag_ms / fresh_ms,
        "maintained_vs_fresh": frag_after_ms / fresh_ms,
    }
    print(
        f"  item_state at {events} events: {before * 1e3:.1f} ms before maintain(), {after * 1e3:.1f} ms after | "
        f"UI item query {ui_before * 1e3:.1f} -> {ui_after * 1e3:.1f} ms | after {small} small commits "
        f"{frag_ms * 1e3:.1f} ms vs fresh {fresh_ms * 1e3:.1f} ms ({frag_ms / fresh_ms:.1f}x), after maintain "
        f"{frag_after_ms * 1e3:.1f} ms ({frag_after_ms / fresh_ms:.2f}x)",
        flush=True,
    )
    return row


# --- 4. Airflow level -------------------------------------------------------------------------------

_CHECKOUT = Path(__file__).resolve().parents[1]


def bench_airflow(tmp: Path, quick: bool) -> dict[str, Any]:
    """``dag.test()`` at two sizes of per-item fake work: 5 ms (TI overhead dominates) and 50 ms (a fast
    model call); then the real scheduler (:func:`bench_airflow_scheduler`)."""
    rows: list[dict[str, Any]] = []
    for latency in ("0.005", "0.05"):
        home = tmp / f"airflow_home_{latency}"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW__", "AIRFLOW_CONN_"))}
        env.update(
            {
                "AIRFLOW_HOME": str(home),
                "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
                "AIRFLOW__CORE__KILLED_TASK_CLEANUP_TIME": "5",
                LATENCY_ENV: latency,
                # The child and its DAG files import benchmarks.fakes from the checkout.
                "PYTHONPATH": os.pathsep.join(p for p in (str(_CHECKOUT), os.environ.get("PYTHONPATH")) if p),
            }
        )
        (home / "dags").mkdir(parents=True)
        subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=env, check=True, capture_output=True)
        n = 200 if quick else 1000
        out = subprocess.run(
            [sys.executable, "-m", "benchmarks.airflow_level", str(n)],
            env=env,
            cwd=_CHECKOUT,
            capture_output=True,
            text=True,
            check=False,
        )
        if out.returncode != 0:
            raise RuntimeError(f"airflow benchmark failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
        row = {"fake_work_s": float(latency), **json.loads(out.stdout.strip().splitlines()[-1])}
        rows.append(row)
        start = row["airflow_startup_s"]
        row["ratio_if_both_paid_startup"] = (row["native_s"] + start) / (row["chunked_s"] + start)
        print(
            f"  {n} items, {float(latency) * 1000:.0f} ms fake work each: chunked ({row['chunks']} map indexes) "
            f"{row['chunked_s']:.1f} s vs native mapped ({n} task instances) {row['native_s']:.1f} s -> "
            f"{row['native_s'] / row['chunked_s']:.1f}x | rerun with {row['done_fraction'] * 100:.0f}% done "
            f"{row['rerun_s']:.1f} s = {row['rerun_s'] / row['first_s'] * 100:.0f}% of the first run | "
            f"Airflow's one-time dag.test() start-up {row['airflow_startup_s']:.1f} s, paid by a warm-up DAG "
            f"(were both to pay it: {row['ratio_if_both_paid_startup']:.1f}x) | with concurrency="
            f"{row['concurrency']} per chunk {row['concurrent_s']:.1f} s -> "
            f"{row['native_s'] / row['concurrent_s']:.1f}x",
            flush=True,
        )
    return {"dag_test": rows, "scheduler": bench_airflow_scheduler(tmp, quick)}


def bench_airflow_scheduler(tmp: Path, quick: bool) -> dict[str, Any]:
    from benchmarks.airflow_level import bench_scheduler

    partial = os.environ.get("DATAGEN_BENCH_NATIVE_PARTIAL_AFTER")
    row = bench_scheduler(tmp, quick, native_partial_after=float(partial) if partial else None)
    c, r, legacy, native = row["chunked"], row["rerun_nothing_pending"], row["legacy_1k_10_chunks_c8"], row["native"]
    print(
        f"  real scheduler, parallelism {row['parallelism']}: {row['items']} items x 50 ms in {row['chunks']} chunks "
        f"(chunk_size='auto', concurrency={row['concurrency']}) {c['wall_s']:.1f} s (plan task "
        f"{c.get('first_task_s', 0):.1f} s, mapped wave {c.get('mapped_wave_s', 0):.1f} s) | nothing pending "
        f"{r['wall_s']:.1f} s | before: 1,000 items in 10 chunks at concurrency=8 {legacy['wall_s']:.1f} s | native "
        f"mapping {row['native_items']} items {native['wall_s']:.1f} s"
        f"{' (extrapolated from the finished ones)' if native.get('partial') else ''} -> "
        f"{row['native_vs_chunked_per_item']:.0f}x "
        f"per item ({row['items']} items natively would take ~{row['native_at_chunked_size_s']:.0f} s)",
        flush=True,
    )
    return row


# --- 5. fan-out under threads -------------------------------------------------------------------


def bench_fanout(tmp: Path, quick: bool) -> dict[str, Any]:
    from airflow_provider_datagen.core import CheckpointLog, MapReduce, run_items

    roots, children, wait_s = (2, 16, 0.005) if quick else (4, 64, 0.005)

    def over(item: dict[str, Any], ctx: Any) -> list[dict[str, Any]]:
        return [{"part": i} for i in range(children)]

    def piece(child: dict[str, Any], ctx: Any) -> dict[str, Any]:
        time.sleep(wait_s)  # a model or HTTP call: the GIL is released while waiting
        return {"piece": child["part"]}

    def reduce(parts: list[dict[str, Any]], ctx: Any) -> dict[str, Any]:
        return {"total": sum(p["piece"] for p in parts)}

    pipeline = MapReduce("split", over=over, map=piece, reduce=reduce)

    def timed(pipe: Any, n_roots: int, concurrency: int) -> float:
        items = [{"id": f"doc-{i}"} for i in range(n_roots)]

        def run() -> None:
            log = CheckpointLog.open(tmp / f"fan-{time.monotonic_ns()}", pipeline="b", experiment="e")
            report = run_items(log, items, pipe, concurrency=concurrency)
            if len(report.processed) != n_roots:
                raise AssertionError(f"fan-out bench: {report.as_dict()}")

        return median_time(run, 3)

    sequential = timed(pipeline, roots, 1)
    threaded = timed(pipeline, roots, 8)
    work = roots * children * wait_s
    row: dict[str, Any] = {
        "roots": roots,
        "children_per_root": children,
        "wait_per_child_s": wait_s,
        "sequential_s": sequential,
        "concurrency_8_s": threaded,
        "speedup": sequential / threaded,
        "roots_only_bound": float(min(roots, 8)),
        "waiting_s": work,
    }
    print(
        f"  {roots} roots x {children} children, {wait_s * 1000:.0f} ms each ({work:.2f} s of waiting): "
        f"concurrency=1 {sequential:.2f} s | concurrency=8 {threaded:.2f} s -> {sequential / threaded:.1f}x "
        f"(threads over roots alone could give at most {min(roots, 8)}x)",
        flush=True,
    )
    # Nested: one root split into a few sections, each split into many pieces. Threads over the
    # sections alone could give at most as many times as there are sections.
    sections, pieces = (2, 8) if quick else (4, 16)
    nested = MapReduce(
        "sections",
        over=lambda item, ctx: [{"section": i} for i in range(sections)],
        map=MapReduce("pieces", over=lambda sec, ctx: [{"part": i} for i in range(pieces)], map=piece, reduce=reduce),
    )
    n_seq, n_thr = timed(nested, 1, 1), timed(nested, 1, 8)
    row["nested"] = {
        "sections": sections,
        "pieces_per_section": pieces,
        "sequential_s": n_seq,
        "concurrency_8_s": n_thr,
        "speedup": n_seq / n_thr,
        "sections_only_bound": float(min(sections, 8)),
    }
    print(
        f"  1 root x {sections} sections x {pieces} pieces, {wait_s * 1000:.0f} ms each: concurrency=1 {n_seq:.2f} s | "
        f"concurrency=8 {n_thr:.2f} s -> {n_seq / n_thr:.1f}x (threads over sections alone: at most "
        f"{min(sections, 8)}x)",
        flush=True,
    )
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run")
    parser.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run)")
    all_sections = [
        "throughput",
        "plan",
        "reads",
        "airflow",
        "fanout",
        "concurrency",
        "ledger",
        "chunk",
        "batch",
        "model_step",
        "responses",
    ]
    parser.add_argument("--only", nargs="*", choices=all_sections)
    args = parser.parse_args(argv)
    sections = args.only or all_sections
    tmp = Path(tempfile.mkdtemp(prefix="datagen-bench-"))
    results: dict[str, Any] = {"machine": {"cpus": os.cpu_count()}, "quick": args.quick}
    if RESULTS.exists():
        with contextlib.suppress(ValueError):
            results = {**json.loads(RESULTS.read_text()), **results}
    try:
        for name in sections:
            print(f"== {name}", flush=True)
            t = time.perf_counter()
            fn = {
                "throughput": bench_throughput,
                "plan": bench_plan,
                "reads": bench_reads,
                "airflow": bench_airflow,
                "fanout": bench_fanout,
                "concurrency": bench_concurrency,
                "ledger": bench_ledger,
                "chunk": bench_chunk_overhead,
                "batch": bench_batch_results,
                "model_step": bench_model_step,
                "responses": bench_responses,
            }
            results[name] = fn[name](tmp, args.quick)
            print(f"   ({time.perf_counter() - t:.0f} s)", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    results["peak_rss_mb_bench_process"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    RESULTS.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"results written to {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
