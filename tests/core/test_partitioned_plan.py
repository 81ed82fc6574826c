"""A large path source planned a bucket of items at a time: the same chunks, plan and status as in memory."""

from __future__ import annotations

import shutil
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_datagen.core import CheckpointLog
from airflow_provider_datagen.core import partitioned_plan as part_mod
from airflow_provider_datagen.core import source_scan as scan_mod
from airflow_provider_datagen.core import spill as spill_mod
from airflow_provider_datagen.core.chunks import chunk_items, plan_chunks
from airflow_provider_datagen.core.fold import fold_table
from airflow_provider_datagen.core.partitioned_plan import bucket_count
from airflow_provider_datagen.core.planner import plan_resume, status_of
from airflow_provider_datagen.core.schema import LIGHT_COLUMNS
from airflow_provider_datagen.core.spill import Spill, buckets_of, id_hash
from airflow_provider_datagen.core.status import tally
from airflow_provider_datagen.core.store import maintenance, projection
from airflow_provider_datagen.exceptions import InvalidItemError
from benchmarks.synth import synth_events
from tests.core.test_spill import SpyLibc
from tests.core.test_streamed_plan import planned_log, source_rows

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["planned_log"]  # the streamed plan's fixture: a log 95% done with every class of item


def reference_hash(text: str) -> int:
    """:func:`id_hash` of one string, byte by byte in Python."""
    mask = (1 << 64) - 1
    data = text.encode("utf-8")
    h = 0
    for j, byte in enumerate(data):
        h = (h + byte * pow(0x100000001B3, j + 1, 1 << 64)) & mask
    h = (h + len(data) * 0x9E3779B97F4A7C15) & mask
    h ^= h >> 30
    h = (h * 0xBF58476D1CE4E5B9) & mask
    h ^= h >> 27
    h = (h * 0x94D049BB133111EB) & mask
    return h ^ (h >> 31)


def test_the_id_hash_is_the_formula_for_any_slice_chunking_or_string_type() -> None:
    ids = ["", "a", "item-00000001", "é/ü:%", "x" * 300, "item-00000002", "a"]
    expected = [reference_hash(t) for t in ids]
    assert id_hash(pa.array(ids, pa.string())).tolist() == expected
    assert id_hash(pa.array(ids, pa.large_string())).tolist() == expected
    assert id_hash(pa.array(["pad", *ids], pa.string()).slice(1)).tolist() == expected
    assert id_hash(pa.chunked_array([ids[:3], ids[3:]], pa.string())).tolist() == expected
    # runs of one id (an item's events side by side) take the bucket of their id
    runs = ["b", "b", "b", "a", "c", "c", "b"]
    assert buckets_of(pa.array(runs), 7).tolist() == [reference_hash(t) % 7 for t in runs]


def test_the_buckets_of_many_ids_are_even() -> None:
    ids = pa.array([f"item-{i:08d}" for i in range(200_000)])
    counts = np.bincount(buckets_of(ids, 64), minlength=64)
    assert counts.min() > 0.9 * 200_000 / 64 and counts.max() < 1.1 * 200_000 / 64


@pytest.mark.parametrize("k", [2, 64, 300])
def test_a_spill_keeps_every_row_in_its_bucket_in_arrival_order(tmp_path: Path, k: int) -> None:
    # 300 buckets: the bucket numbers no longer fit a byte, and are sorted as two
    rng = np.random.default_rng(k)
    spill = Spill(str(tmp_path), "t", k)
    sent: list[list[int]] = [[] for _ in range(k)]
    at = 0
    for size in (1, 5_000, 70_000, 3):
        buckets = rng.integers(0, k, size)
        seq = np.arange(at, at + size)
        spill.add(pa.record_batch({"seq": pa.array(seq)}), buckets)
        for b, s in zip(buckets.tolist(), seq.tolist()):
            sent[b].append(s)
        at += size
    spill.close()
    got = [spill.read(b, pa.schema([("seq", pa.int64())])).column("seq").to_pylist() for b in range(k)]
    assert got == sent


def test_the_bucket_count_follows_the_larger_of_items_and_events() -> None:
    assert bucket_count(10_000_000, 49_000_000) == 64
    assert bucket_count(2_000_000, 100_000_000) == 64
    assert bucket_count(10, 10) == 2
    assert bucket_count(10**12, 0) == part_mod.MAX_BUCKETS


#: The bucket counts of the partitioned plans made in a test (see the ``partitioned`` fixture).
BUCKETS: list[int] = []


@pytest.fixture
def partitioned(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plan every source of more than 1,000 rows in 32 or more buckets (the module's sizes are for millions)."""
    monkeypatch.setattr(part_mod, "PARTITION_ROWS", 1000)
    monkeypatch.setattr(part_mod, "ITEMS_PER_BUCKET", 600)
    monkeypatch.setattr(part_mod, "EVENTS_PER_BUCKET", 4000)
    real = part_mod.bucket_count
    BUCKETS.clear()

    def recorded(source_rows: int, events: int) -> int:
        BUCKETS.append(real(source_rows, events))
        return BUCKETS[-1]

    monkeypatch.setattr(part_mod, "bucket_count", recorded)


def copied(log: CheckpointLog, tmp_path: Path) -> CheckpointLog:
    """A copy of ``log`` under ``tmp_path`` (the module's log stays as the other tests expect it)."""
    root = log.uri.split("/datagen_checkpoints/")[0]
    shutil.copytree(root, tmp_path / "root")
    return CheckpointLog.open(tmp_path / "root", pipeline="p", experiment="e", auto_maintain_fragments=None)


def assert_same_plan(log: CheckpointLog, source: list[dict[str, Any]], path: str, **kwargs: Any) -> None:
    """The partitioned plan of ``path`` against the in-memory one and the plan of the dicts themselves."""
    oracle = plan_resume(log, source, processor_version=kwargs.get("processor_version", "v1"), **_redo(kwargs))
    BUCKETS.clear()
    result = plan_chunks(log, path, **kwargs)
    assert len(BUCKETS) == 1 and BUCKETS[0] >= 32  # planned in buckets
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(part_mod, "PARTITION_ROWS", 1 << 40)
        memory = plan_chunks(log, path, **kwargs)
    assert len(BUCKETS) == 1  # the in-memory plan did not partition
    assert result.chunks == memory.chunks
    assert result.status == memory.status == status_of(log, source)
    assert [i for c in result.chunks for i in c["item_ids"]] == oracle.pending
    for name in ("replay", "demoted", "invalidated", "fresh", "failed", "last_seq", "kept_other_version"):
        assert getattr(result.plan, name) == getattr(oracle, name), name
    assert result.plan.skip_count == len(oracle.skip)
    assert result.plan.as_dict() == memory.plan.as_dict() == oracle.as_dict()


def _redo(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {"redo_completed": kwargs["redo_completed"]} if "redo_completed" in kwargs else {}


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "lance"])
def test_a_partitioned_plan_without_the_fold_cache_is_the_in_memory_plan(
    planned_log: Any, partitioned: None, fmt: str
) -> None:
    log, source, paths = planned_log
    assert log.projection_version() == 0  # cold: every bucket folds its own events
    assert_same_plan(log, source, paths[fmt], chunk_size=250)
    result = plan_chunks(log, paths[fmt], chunk_size=250)
    by_id = {r["id"]: r for r in source}
    for chunk in result.chunks[:: max(1, len(result.chunks) // 6)]:
        items = chunk_items(chunk, pipeline="p", experiment="e", processor_version="v1")
        assert [s.item_id for s in items] == chunk["item_ids"]
        assert [s.data for s in items] == [by_id[i] for i in chunk["item_ids"]]


def test_a_partitioned_plan_with_the_fold_cache_and_events_since_is_the_in_memory_plan(
    planned_log: Any, partitioned: None, tmp_path: Path
) -> None:
    log0, source, paths = planned_log
    log = copied(log0, tmp_path)
    log.maintain()
    assert log.projection_version() == log.version  # cached: buckets of stored states
    assert_same_plan(log, source, paths["parquet"], chunk_size=300)
    assert_same_plan(log, source, paths["jsonl"], processor_version="v0", redo_completed="other_version", max_chunks=7)
    # events after the projection: those items are folded again, the rest read as stored
    later = synth_events(source[:40], 0.5, seed=11, first_row=10**7)
    log.append(later.slice(0, later.num_rows - 1))
    assert 0 < log.projection_version() < log.version
    assert_same_plan(log, source, paths["lance"], chunk_size=200)


def test_a_cold_partitioned_plan_stores_its_fold_as_the_projection(
    planned_log: Any, partitioned: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log0, source, paths = planned_log
    log = copied(log0, tmp_path)
    monkeypatch.setattr(maintenance, "PROJECTION_MIN_NEW_EVENTS", 1)
    plan_chunks(log, paths["parquet"])
    assert log.projection_version() == log.version
    fresh = CheckpointLog.open(tmp_path / "root", pipeline="p", experiment="e", remember_fold=False)
    stored = fresh.states().sort_by("item_id")
    assert stored.num_rows > len(source) * 0.9
    full = fold_table(fresh.table.scan(LIGHT_COLUMNS)).sort_by("item_id")
    assert stored.equals(full)
    # the status counts stored with it (set once the stream is written) are the full fold's
    written = projection.open_projection(fresh)
    assert written is not None
    assert projection.stored_tally(written) == tally(full, keep=projection.TALLY_FAILED_IDS)


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_a_key_repeated_in_another_bucket_batch_fails_naming_both_items(
    tmp_path: Path, partitioned: None, monkeypatch: pytest.MonkeyPatch, fmt: str
) -> None:
    monkeypatch.setattr(scan_mod, "SCAN_BATCH", 500)
    rows = source_rows(3000)
    rows[2900]["id"] = rows[7]["id"]
    path = tmp_path / f"dup.{fmt}"
    if fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        import json

        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    log = CheckpointLog.open(tmp_path / "root", pipeline="p", experiment="e")
    with pytest.raises(InvalidItemError, match=r"duplicate key 'item-000007' \(items #7 and #2900\)"):
        plan_chunks(log, str(path))
    assert BUCKETS == [8]  # found within the bucket both rows hash to


def test_a_partitioned_plan_of_an_empty_log_is_every_item_fresh(tmp_path: Path, partitioned: None) -> None:
    rows = source_rows(2500)
    path = tmp_path / "src.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=700)
    log = CheckpointLog.open(tmp_path / "root", pipeline="p", experiment="e")
    result = plan_chunks(log, str(path), chunk_size=1000)
    assert BUCKETS == [8]
    assert result.plan.fresh == [r["id"] for r in rows]
    assert [c["rows"] for c in result.chunks] == [[[0, 1000]], [[1000, 2000]], [[2000, 2500]]]
    assert result.status == status_of(log, rows)


def test_the_plan_shortens_gil_turns_only_while_it_runs_even_when_it_fails(
    tmp_path: Path, partitioned: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    seen: list[float] = []
    classify = part_mod._classify_bucket

    def spy(*args: Any, **kwargs: Any) -> None:
        seen.append(sys.getswitchinterval())
        classify(*args, **kwargs)

    monkeypatch.setattr(part_mod, "_classify_bucket", spy)
    before = sys.getswitchinterval()
    rows = source_rows(2500)
    path = tmp_path / "src.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=700)
    log = CheckpointLog.open(tmp_path / "root", pipeline="p", experiment="e")
    plan_chunks(log, str(path), chunk_size=1000)
    assert seen and all(turn == pytest.approx(min(before, 1e-4)) for turn in seen)  # stored in microseconds
    assert sys.getswitchinterval() == pytest.approx(before)

    def boom(*args: Any, **kwargs: Any) -> None:
        raise InvalidItemError("a bucket failed")

    monkeypatch.setattr(part_mod, "_classify_bucket", boom)
    with pytest.raises(InvalidItemError, match="a bucket failed"):
        plan_chunks(log, str(path), chunk_size=1000)
    assert sys.getswitchinterval() == pytest.approx(before)


@pytest.mark.parametrize("interval", [0.005, 0.000123, 0.000015])  # the last two read back a hair short
def test_a_partitioned_plan_leaves_the_switch_interval_and_the_allocator_as_it_found_them(
    tmp_path: Path, partitioned: None, monkeypatch: pytest.MonkeyPatch, interval: float
) -> None:
    import sys

    libc = SpyLibc()
    monkeypatch.setattr(spill_mod, "_LIBC", libc)
    monkeypatch.delenv(spill_mod.TUNE_ALLOCATOR_ENV, raising=False)
    rows = source_rows(2500)
    path = tmp_path / "src.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=700)
    log = CheckpointLog.open(tmp_path / "root", pipeline="p", experiment="e")
    previous = sys.getswitchinterval()
    sys.setswitchinterval(interval)
    try:
        before = sys.getswitchinterval()
        for _ in range(3):  # a microsecond lost per plan would show
            plan_chunks(log, str(path), chunk_size=1000)
            assert sys.getswitchinterval() == before
        assert BUCKETS == [8, 8, 8]
        assert libc.mallopt_calls == [] and libc.trims > 0
        monkeypatch.setenv(spill_mod.TUNE_ALLOCATOR_ENV, "1")  # the worker opts in: the one change it asked for
        plan_chunks(log, str(path), chunk_size=1000)
        assert libc.mallopt_calls == [(-3, spill_mod.MMAP_THRESHOLD)]
        assert sys.getswitchinterval() == before
    finally:
        sys.setswitchinterval(previous)


def test_a_partitioned_plan_lists_the_removed_items_as_the_in_memory_plan_does(
    tmp_path: Path, partitioned: None
) -> None:
    """Results follow the source for a large path source too (issue 24, point 6).

    Before, a partitioned plan listed no removed items: the counts stayed over the log, so a deleted
    row stayed in ``log.summary()`` (and the status) after the plan.
    """
    import json

    from airflow_provider_datagen.core import export_results, run_items

    rows = [{"id": f"{i:05d}", "text": f"prompt {i}"} for i in range(3000)]
    log = CheckpointLog.open(tmp_path / "root", pipeline="p", experiment="e", auto_maintain_fragments=None)
    run_items(log, rows, lambda item, ctx: {"answer": item["text"].upper()})
    gone = {"00007", "01234", "02999"}
    kept = [r for r in rows if r["id"] not in gone]
    path = tmp_path / "source.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in kept))
    BUCKETS.clear()
    result = plan_chunks(log, str(path))
    assert len(BUCKETS) == 1 and BUCKETS[0] >= 2  # planned in buckets
    assert result.removed_ids == tuple(sorted(gone))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(part_mod, "PARTITION_ROWS", 1 << 40)
        memory = plan_chunks(log, str(path))
    assert memory.removed_ids == result.removed_ids
    assert result.status == memory.status
    summary = log.summary()
    assert (summary["total"], summary["completed"], summary["removed"]) == (2997, 2997, 3)
    out = export_results(log, str(tmp_path / "out.lance"))
    assert (out["rows"], out["removed"]) == (2997, 3)


def test_a_partitioned_plan_past_the_listing_bound_lists_none(
    tmp_path: Path, partitioned: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from airflow_provider_datagen.core import run_items

    rows = [{"id": f"{i:05d}", "text": f"prompt {i}"} for i in range(1200)]
    log = CheckpointLog.open(tmp_path / "root", pipeline="p", experiment="e", auto_maintain_fragments=None)
    run_items(log, rows[:200], lambda item, ctx: {"answer": item["text"]})
    path = tmp_path / "source.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows[100:]))  # 100 done items removed
    monkeypatch.setattr(part_mod, "REMOVED_LISTED", 99)
    assert plan_chunks(log, str(path)).removed_ids is None
    monkeypatch.setattr(part_mod, "REMOVED_LISTED", 100)
    assert plan_chunks(log, str(path)).removed_ids == tuple(r["id"] for r in rows[:100])
