"""A path source planned a batch at a time: its chunks are exactly the pending items, in every format."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from airflow_provider_datagen.core import CheckpointLog
from airflow_provider_datagen.core import planner as planner_mod
from airflow_provider_datagen.core import source_scan as scan_mod
from airflow_provider_datagen.core.chunks import chunk_items, plan_chunks
from airflow_provider_datagen.core.events import fingerprint_of
from airflow_provider_datagen.core.planner import plan_resume, status_of
from airflow_provider_datagen.core.source_scan import scan_source
from airflow_provider_datagen.core.sources import load_source
from airflow_provider_datagen.exceptions import InvalidItemError
from benchmarks.synth import synth_events

if TYPE_CHECKING:
    from pathlib import Path

N = 20_000


def source_rows(n: int) -> list[dict[str, Any]]:
    return [{"id": f"item-{i:06d}", "prompt": f'Write about topic {i}\n"quoted" é', "n": i} for i in range(n)]


def write_formats(tmp_path: Path, rows: list[dict[str, Any]]) -> dict[str, str]:
    table = pa.Table.from_pylist(rows)
    paths = {
        "parquet": str(tmp_path / "src.parquet"),
        "jsonl": str(tmp_path / "src.jsonl"),
        "lance": str(tmp_path / "src.lance"),
    }
    pq.write_table(table, paths["parquet"], row_group_size=3000)  # several row groups: a chunk reads only its own
    with open(paths["jsonl"], "w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")
            if r["n"] % 1000 == 0:
                fh.write("\n")  # blank lines are not rows: positions and byte offsets skip them
    lance.write_dataset(table, paths["lance"], max_rows_per_file=7000)
    return paths


@pytest.fixture(scope="module")
def planned_log(tmp_path_factory: pytest.TempPathFactory) -> tuple[CheckpointLog, list[dict[str, Any]], dict[str, str]]:
    """A log 95% done over N items, with failed and other-version cursors; a source with edits and new items."""
    tmp = tmp_path_factory.mktemp("streamed")
    rows = source_rows(N)
    events = synth_events(rows, 0.95, seed=3)
    running = np.unique(
        np.asarray(events.filter(pc.equal(events["event_type"], "FIELD_SET"))["item_id"].to_pylist(), dtype=object)
    )
    done = set(events.filter(pc.equal(events["event_type"], "TERMINAL"))["item_id"].to_pylist())
    running = [i for i in running.tolist() if i not in done]
    failed = set(running[::7])
    other_version = set(running[1::5])
    seq = events["item_seq"].to_numpy()
    ids = np.asarray(events["item_id"].to_pylist(), dtype=object)
    is_failed = np.isin(ids, list(failed)) & (seq == 2)
    types = np.where(is_failed, "FAILED", np.asarray(events["event_type"].to_pylist(), dtype=object))
    fields = np.where(is_failed, None, np.asarray(events["field"].to_pylist(), dtype=object))
    versions = np.where(np.isin(ids, list(other_version)), "v0", "v1")
    events = events.set_column(events.schema.get_field_index("event_type"), "event_type", pa.array(types, pa.string()))
    events = events.set_column(events.schema.get_field_index("field"), "field", pa.array(fields, pa.string()))
    events = events.set_column(
        events.schema.get_field_index("processor_version"), "processor_version", pa.array(versions, pa.string())
    )
    log = CheckpointLog.open(tmp / "root", pipeline="p", experiment="e", auto_maintain_fragments=None)
    for start in range(0, events.num_rows, 40_000):
        log.append(events.slice(start, 40_000))
    # the source as the plan sees it: some done items edited, new items, a reordering
    source = [dict(r) for r in rows]
    for r in source[::97]:
        r["prompt"] += " (edited)"
    source += source_rows(N + 300)[N:]
    source = source[5000:] + source[:5000]
    return log, source, write_formats(tmp, source)


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "lance"])
def test_the_chunks_of_a_streamed_plan_are_exactly_the_pending_items(planned_log: Any, fmt: str) -> None:
    log, source, paths = planned_log
    oracle = plan_resume(log, source, processor_version="v1")
    assert oracle.failed and oracle.demoted and oracle.invalidated and oracle.fresh and oracle.replay  # every class
    result = plan_chunks(log, paths[fmt], chunk_size=250, processor_version="v1")
    plan = result.plan
    assert [i for c in result.chunks for i in c["item_ids"]] == oracle.pending
    for name in ("replay", "demoted", "invalidated", "fresh", "failed", "last_seq", "kept_other_version"):
        assert getattr(plan, name) == getattr(oracle, name), name
    assert plan.skip == [] and plan.skip_count == len(oracle.skip)
    assert plan.as_dict() == oracle.as_dict()
    assert result.status == status_of(log, source)
    by_id = {r["id"]: r for r in source}
    for chunk in result.chunks:
        assert sum(r[1] - r[0] for r in chunk["rows"]) == len(chunk["item_ids"])
        items = chunk_items(chunk, pipeline="p", experiment="e", processor_version="v1")
        assert [s.item_id for s in items] == chunk["item_ids"]
        assert [s.data for s in items] == [by_id[i] for i in chunk["item_ids"]]
        assert [s.fingerprint for s in items] == [fingerprint_of(by_id[i]) for i in chunk["item_ids"]]


def test_redo_other_version_and_the_chunk_limit_match_the_unstreamed_plan(planned_log: Any) -> None:
    log, source, paths = planned_log
    oracle = plan_resume(log, source, processor_version="v0", redo_completed="other_version")
    result = plan_chunks(log, paths["parquet"], processor_version="v0", redo_completed="other_version", max_chunks=7)
    assert len(result.chunks) == 7
    assert [i for c in result.chunks for i in c["item_ids"]] == oracle.pending
    assert result.plan.as_dict() == oracle.as_dict()


def test_every_format_gives_every_item_the_same_fingerprint(planned_log: Any) -> None:
    _, source, paths = planned_log
    expected = [fingerprint_of(r) for r in source]
    for fmt, path in paths.items():
        scanned = scan_source(path, "id")
        assert scanned.ids.to_pylist() == [r["id"] for r in source], fmt
        assert scanned.fingerprints.to_pylist() == expected, fmt


def test_a_source_read_in_many_batches_plans_like_one(planned_log: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    log, source, paths = planned_log
    monkeypatch.setattr(scan_mod, "SCAN_BATCH", 999)
    oracle = plan_resume(log, source)
    for path in paths.values():
        assert [i for c in plan_chunks(log, path).chunks for i in c["item_ids"]] == oracle.pending


def test_a_key_repeated_in_another_batch_fails_naming_both_items(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scan_mod, "SCAN_BATCH", 10)
    rows = source_rows(30)
    rows[25]["id"] = rows[3]["id"]
    path = tmp_path / "dup.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    log = CheckpointLog.open(tmp_path / "root", pipeline="p", experiment="e")
    with pytest.raises(InvalidItemError, match=r"duplicate key 'item-000003' \(items #3 and #25\)"):
        plan_chunks(log, str(path))


@pytest.mark.parametrize(
    "repeats",
    [
        [(3, 25)],
        [(20, 28), (1, 22)],  # two repeated keys: the in-order read meets #22 first
        [(5, 9), (5, 17), (2, 29)],  # a key three times: named by its first two
        [(14, 15)],  # in one batch
    ],
)
@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_duplicate_keys_fail_with_the_unstreamed_reads_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, repeats: list[tuple[int, int]], fmt: str
) -> None:
    """Found from the ids alone (no second read of the source), yet the very error ``load_source`` raises."""
    monkeypatch.setattr(scan_mod, "SCAN_BATCH", 10)
    rows = source_rows(30)
    for first, again in repeats:
        rows[again]["id"] = rows[first]["id"]
    path = tmp_path / f"dups.{fmt}"
    if fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    with pytest.raises(InvalidItemError) as expected:
        load_source(rows, "id")
    log = CheckpointLog.open(tmp_path / "root", pipeline="p", experiment="e")
    with pytest.raises(InvalidItemError) as got:
        plan_chunks(log, str(path))
    assert str(got.value) == str(expected.value)


def test_a_bad_row_in_a_later_batch_is_named_by_its_place_in_the_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scan_mod, "SCAN_BATCH", 10)
    path = tmp_path / "bad.jsonl"
    lines = [json.dumps(r) for r in source_rows(30)]
    lines[23] = json.dumps({"prompt": "no key"})
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    log = CheckpointLog.open(tmp_path / "root", pipeline="p", experiment="e")
    with pytest.raises(InvalidItemError, match=r"item #23 has no key field 'id'"):
        plan_chunks(log, str(path))


def test_a_source_shortened_after_planning_fails_the_chunk_with_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "src.parquet"
    pq.write_table(pa.Table.from_pylist(source_rows(50)), path)
    log = CheckpointLog.open(tmp_path / "root", pipeline="p", experiment="e")
    chunks = plan_chunks(log, str(path), chunk_size=20).chunks
    pq.write_table(pa.Table.from_pylist(source_rows(30)), path)
    with pytest.raises(InvalidItemError, match="rerun the plan task"):
        chunk_items(chunks[2], pipeline="p", experiment="e", processor_version="v1")


def test_a_states_read_beside_the_fingerprinting_plans_every_class_alike(
    planned_log: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    log, source, _ = planned_log
    expected = plan_resume(log, source, processor_version="v1")
    assert len(source) < planner_mod.READ_AHEAD_ROWS  # the plan above read its states after the fingerprints
    monkeypatch.setattr(planner_mod, "READ_AHEAD_ROWS", 1000)
    assert plan_resume(log, source, processor_version="v1") == expected
    assert plan_resume(log, source, processor_version="v0", redo_completed="other_version") == plan_resume(
        log, source, processor_version="v0", redo_completed="other_version", states=log.states()
    )
