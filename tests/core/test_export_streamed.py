"""The streamed export: one read of the log and one of the source, whatever the batch size, and the same
content (columns, types, rows, fingerprint) as the whole-table export, with ``include_input`` too."""

from __future__ import annotations

import datetime as dt
import json
from typing import TYPE_CHECKING, Any

import lance
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_datagen.core import export as export_module
from airflow_provider_datagen.core import export_reads, export_results, run_items
from airflow_provider_datagen.core.export import export_table, exported_states, items_inputs
from airflow_provider_datagen.core.export_files import read_files_export
from airflow_provider_datagen.core.export_reads import IdPositions
from airflow_provider_datagen.core.store import log_takes
from airflow_provider_datagen.core.store.table import LanceTable
from airflow_provider_datagen.exceptions import ConfigurationError, InvalidItemError
from tests._support.engine import open_log, raw_events

if TYPE_CHECKING:
    from pathlib import Path

    from airflow_provider_datagen.core import CheckpointLog

WHEN = dt.datetime(2026, 1, 2, 3, 4, 5)


def _items() -> list[dict[str, Any]]:
    """Inputs whose keys change type from batch to batch (in batches of 2): the whole-table rule must hold."""
    items: list[dict[str, Any]] = []
    for i in range(7):
        item: dict[str, Any] = {"id": f"k{i}", "text": f"prompt {i}", "n": i, "at": WHEN + dt.timedelta(hours=i)}
        item["late"] = None if i < 3 else i  # nulls in the first batches, ints later: int64
        item["mixed"] = i if i < 4 else f"s{i}"  # ints, then strings: JSON text
        item["tags"] = [] if i < 2 else [f"t{i}"]  # list<null> first, list<string> later
        if i == 6:
            item["only_last"] = {"deep": [i]}  # a key of the last batch only
        items.append(item)
    return list(reversed(items))  # the source in another order than the ids


def _generate(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
    n = item["n"]
    return {"answer": item["text"].upper(), "image": bytes([n]) * (n + 1), "score": n / 3, "odd": n if n % 2 else None}


def _log(tmp_path: Path, items: list[dict[str, Any]]) -> CheckpointLog:
    log = open_log(tmp_path, "s")
    run_items(log, items, _generate)
    return log


def _source(tmp_path: Path, kind: str) -> tuple[Any, list[dict[str, Any]]]:
    """The items as a list, a JSONL file (times as text) or a Parquet file (without the keys it cannot
    type), and the rows the source gives (what the items are generated from)."""
    items = _items()
    if kind == "list":
        return items, items
    if kind == "jsonl":
        rows = [{**i, "at": i["at"].isoformat()} for i in items]
        path = tmp_path / "items.jsonl"
        path.write_text("".join(json.dumps(r) + "\n\n" for r in rows))
        return str(path), rows
    rows = [{k: v for k, v in i.items() if k not in ("mixed", "only_last")} for i in items]
    path = tmp_path / "items.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=3)
    return str(path), rows


def _read(dest: Path, fmt: str) -> pa.Table:
    if fmt == "lance":
        return lance.dataset(str(dest)).to_table(blob_handling="all_binary")
    if fmt == "parquet":
        return read_files_export(str(dest))
    rows = [json.loads(line) for p in sorted(dest.glob("part-*.jsonl")) for line in p.read_text().splitlines()]
    return pa.table({"rows": [json.dumps(r, sort_keys=True) for r in rows]})


@pytest.mark.parametrize("kind", ["list", "jsonl", "parquet"])
@pytest.mark.parametrize("fmt", ["lance", "parquet", "jsonl"])
def test_an_include_input_export_in_small_batches_equals_the_export_in_one_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str, kind: str
) -> None:
    source, rows = _source(tmp_path, kind)
    log = _log(tmp_path, rows)
    one = export_results(log, str(tmp_path / "one"), format=fmt, include_input=True, source=source)
    monkeypatch.setattr(export_module, "EXPORT_BATCH_ITEMS", 2)  # batches of 2, 2, 2 and 1 items
    monkeypatch.setattr(export_reads, "SCAN_BATCH", 3)  # the source read 3 rows at a time
    monkeypatch.setattr(export_reads, "HELD_BYTES", 1)  # every read batch written to the spills at once
    small = export_results(log, str(tmp_path / "small"), format=fmt, include_input=True, source=source)
    assert small == one and one["rows"] == 7
    assert small["fingerprint"] == export_results(log, str(tmp_path / "bare"), format=fmt)["fingerprint"]
    streamed, whole = _read(tmp_path / "small", fmt), _read(tmp_path / "one", fmt)
    assert streamed.schema == whole.schema and streamed.to_pylist() == whole.to_pylist()
    if kind == "list":
        assert one["json_fields"] == ["input.mixed"]
    if fmt == "parquet":
        # the whole-table builder (what to_hf_dataset and the unstreamed export used) gives the same table
        states, _ = exported_states(log, source, "id", False)
        inputs = items_inputs(source, "id", states, log)
        table, json_fields, _ = export_table(states, inputs, include_blobs=True, fmt=fmt)
        assert streamed.schema.remove_metadata() == table.schema and streamed.to_pylist() == table.to_pylist()
        assert json_fields == one["json_fields"]


def test_the_log_is_read_once_whatever_the_batch_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    items = _items()
    log = _log(tmp_path, items)
    reads: list[Any] = []
    batches, scan_at, take_rows = LanceTable.batches, LanceTable.scan_at, log_takes.take_rows

    def counted_batches(self: LanceTable, ds: Any, columns: Any, **kw: Any) -> Any:
        reads.append(("stream", tuple(columns), kw.get("checked", True)))
        return batches(self, ds, columns, **kw)

    def counted_scan(self: LanceTable, ds: Any, columns: Any, filter: Any) -> Any:
        reads.append(("scan", tuple(columns), filter is not None))
        return scan_at(self, ds, columns, filter)

    def counted_take(table: Any, ds: Any, offsets: Any, columns: Any) -> Any:
        reads.append(("take", len(offsets)))
        return take_rows(table, ds, offsets, columns)

    monkeypatch.setattr(LanceTable, "batches", counted_batches)
    monkeypatch.setattr(LanceTable, "scan_at", counted_scan)
    monkeypatch.setattr(log_takes, "take_rows", counted_take)
    monkeypatch.setattr(export_module, "EXPORT_BATCH_ITEMS", 2)
    reads.clear()
    export_results(log, str(tmp_path / "out"), format="parquet", include_input=True, source=items)
    # no read of the events' wide columns but the takes; the ids streamed once, checked; a take per batch
    assert not [r for r in reads if r[0] != "take" and "value_json" in r[1]]
    assert [r for r in reads if r[:2] == ("stream", ("item_id",)) and r[2]] == [("stream", ("item_id",), True)]
    takes = [r[1] for r in reads if r[0] == "take"]
    assert len(takes) == 4 and sum(takes) == raw_events(log).num_rows  # every event is a completed item's


def test_ids_found_by_hash_equal_ids_found_by_a_hash_table(monkeypatch: pytest.MonkeyPatch) -> None:
    names = [*sorted(f"id-{i}" for i in range(50)), "zé"]
    ids = pa.array(names, pa.string())
    query = pa.array(["id-3", "nope", "zé", None, "id-49", "id-3", ""], pa.large_string())
    want = [names.index("id-3"), -1, 50, -1, names.index("id-49"), names.index("id-3"), -1]
    assert IdPositions(ids)(query).tolist() == want
    # every id hashing alike: the lookup takes pc.index_in, with the same answers
    monkeypatch.setattr(export_reads, "id_hash", lambda a: np.zeros(len(a), np.uint64))
    colliding = IdPositions(ids)
    assert not colliding.exact_hashes and colliding(query).tolist() == want
    assert IdPositions(pa.array([], pa.string()))(query).tolist() == [-1] * 7


def test_an_export_whose_ids_share_a_hash_is_the_same_export(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    items = _items()
    log = _log(tmp_path, items)
    first = export_results(log, str(tmp_path / "a"), format="parquet", include_input=True, source=items)
    monkeypatch.setattr(export_reads, "id_hash", lambda a: np.zeros(len(a), np.uint64))
    monkeypatch.setattr(export_module, "EXPORT_BATCH_ITEMS", 3)
    again = export_results(log, str(tmp_path / "b"), format="parquet", include_input=True, source=items)
    assert again == first
    assert read_files_export(str(tmp_path / "b")).to_pylist() == read_files_export(str(tmp_path / "a")).to_pylist()


def test_source_errors_count_every_batch_and_come_before_any_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    items = _items()
    log = _log(tmp_path, items)
    dest = tmp_path / "out"
    monkeypatch.setattr(export_module, "EXPORT_BATCH_ITEMS", 2)
    monkeypatch.setattr(export_reads, "SCAN_BATCH", 2)
    edited = [dict(i, text="edited") if i["id"] in ("k1", "k5") else i for i in items]  # in two batches
    with pytest.raises(ConfigurationError, match=r"other inputs than 2 exported items .*\(e\.g\. key 'k1', edited"):
        export_results(log, str(dest), include_input=True, source=edited)
    lacking = [i for i in items if i["id"] not in ("k2", "k6")]
    with pytest.raises(ConfigurationError, match=r"lacks 2 of the exported items \(e\.g\. key 'k2', key_field='id'\)"):
        export_results(log, str(dest), include_input=True, source=lacking, include_removed=True)
    repeated = [*items, dict(items[0])]  # the repeat is in another read batch than the first
    with pytest.raises(InvalidItemError, match=r"duplicate key 'k6' \(items #0 and #7\)"):
        export_results(log, str(dest), include_input=True, source=repeated)
    assert not dest.exists()


@pytest.mark.parametrize("fmt", ["lance", "parquet", "jsonl"])
def test_an_include_input_export_of_no_item_has_no_input_column(tmp_path: Path, fmt: str) -> None:
    items = _items()
    log = _log(tmp_path, items)
    # the source holds none of the completed items: nothing to export, and no input keys to type
    result = export_results(
        log, str(tmp_path / "out"), format=fmt, include_input=True, source=[{"id": "other", "text": "t", "n": 0}]
    )
    assert result["rows"] == 0 and result["removed"] == 7 and result["changed"]
    if fmt != "jsonl":  # (Parquet refused the struct without children this column used to be)
        assert _read(tmp_path / "out", fmt).schema.names == ["item_id", "key"]
