"""Export formats: Lance, Parquet and JSON Lines hold the same columns and fingerprint; bytes fields as
binary columns (base64 in JSONL); the unchanged-export rule in every format; bad input refused before
any write."""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
from typing import TYPE_CHECKING, Any

import lance
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_datagen.core import export as export_module
from airflow_provider_datagen.core import export_results, run_items
from airflow_provider_datagen.core.export_files import MANIFEST_NAME, read_files_export
from airflow_provider_datagen.exceptions import ConfigurationError
from tests._support.engine import open_log

if TYPE_CHECKING:
    from pathlib import Path

    from airflow_provider_datagen.core import CheckpointLog

WHEN = dt.datetime(2026, 1, 2, 3, 4, 5)
ITEMS = [{"id": str(i), "text": f"prompt {i}", "n": i, "at": WHEN + dt.timedelta(days=i)} for i in range(5)]


def _generate(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
    n = item["n"]
    return {
        "answer": item["text"].upper(),
        "tokens": n * 10,
        "score": n / 4,
        "ok": n % 2 == 0,
        "tags": [f"t{n}", "x"],
        "meta": {"len": len(item["text"]), "model": "fake"},
        "image": bytes([n]) * (n + 1),
        "mixed": n if n % 2 else f"n{n}",
    }


def _log(tmp_path: Path, experiment: str = "e") -> CheckpointLog:
    log = open_log(tmp_path, experiment)
    run_items(log, ITEMS, _generate)
    return log


def _export(log: CheckpointLog, dest: Path, fmt: str, **kw: Any) -> dict[str, Any]:
    return export_results(log, str(dest), format=fmt, include_input=True, source=ITEMS, **kw)


def _jsonl_rows(dest: Path) -> list[dict[str, Any]]:
    parts = sorted(p for p in os.listdir(dest) if p.endswith(".jsonl"))
    return [json.loads(line) for p in parts for line in (dest / p).read_text().splitlines()]


def test_each_format_holds_the_same_columns_and_fingerprint(tmp_path: Path) -> None:
    log = _log(tmp_path)
    results = {fmt: _export(log, tmp_path / fmt, fmt) for fmt in ("lance", "parquet", "jsonl")}
    assert len({r["fingerprint"] for r in results.values()}) == 1
    assert all(r["rows"] == 5 and r["changed"] and r["json_fields"] == ["mixed"] for r in results.values())
    assert results["jsonl"]["base64_fields"] == ["image"]
    assert results["lance"]["base64_fields"] == results["parquet"]["base64_fields"] == []

    lance_table = lance.dataset(str(tmp_path / "lance")).to_table(blob_handling="all_binary")
    parquet_table = read_files_export(str(tmp_path / "parquet"))
    assert parquet_table.schema.names == lance_table.schema.names
    assert parquet_table.schema.field("image").type == pa.large_binary()
    assert parquet_table.schema.field("input").type.field("at").type == pa.timestamp("us")
    assert parquet_table.to_pylist() == lance_table.to_pylist()
    row = parquet_table.to_pylist()[3]
    assert row["image"] == b"\x03" * 4 and row["tags"] == ["t3", "x"] and row["meta"] == {"len": 8, "model": "fake"}
    assert row["ok"] is False and row["score"] == 0.75 and row["tokens"] == 30 and row["mixed"] == "3"
    assert row["input"]["at"] == WHEN + dt.timedelta(days=3)

    # JSON Lines: the same rows, bytes as base64, times as ISO text
    lines = _jsonl_rows(tmp_path / "jsonl")
    assert [list(r) for r in lines] == [parquet_table.schema.names] * 5
    expected = parquet_table.to_pylist()
    for line, want in zip(lines, expected, strict=True):
        assert base64.b64decode(line["image"]) == want["image"]
        assert dt.datetime.fromisoformat(line["input"]["at"]) == want["input"]["at"]
        assert {k: v for k, v in line.items() if k not in ("image", "input")} == {
            k: v for k, v in want.items() if k not in ("image", "input")
        }


def test_the_lance_bytes_column_is_blob_encoded(tmp_path: Path) -> None:
    export_results(_log(tmp_path), str(tmp_path / "out.lance"))
    ds = lance.dataset(str(tmp_path / "out.lance"))
    assert ds.take_blobs("image", indices=[2])[0].read() == b"\x02" * 3
    # a scan that does not ask for the bytes never reads them
    assert ds.to_table(columns=["item_id", "answer"]).num_rows == 5


def test_include_blobs_false_keeps_the_digest_struct(tmp_path: Path) -> None:
    log = _log(tmp_path)
    with_bytes = export_results(log, str(tmp_path / "a"), format="parquet")
    digests = export_results(log, str(tmp_path / "b"), format="parquet", include_blobs=False)
    assert with_bytes["fingerprint"] == digests["fingerprint"]
    image = read_files_export(str(tmp_path / "b")).column("image").to_pylist()[1]
    assert set(image) == {"$bytes_sha256", "size"} and image["size"] == 2


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_an_unchanged_file_export_writes_nothing(tmp_path: Path, fmt: str) -> None:
    log = _log(tmp_path)
    dest = tmp_path / "out"
    first = export_results(log, str(dest), format=fmt)
    stamps = {p: os.stat(dest / p).st_mtime_ns for p in os.listdir(dest)}
    again = export_results(log, str(dest), format=fmt)
    assert first["changed"] and not again["changed"] and again["fingerprint"] == first["fingerprint"]
    assert {p: os.stat(dest / p).st_mtime_ns for p in os.listdir(dest)} == stamps
    # a part removed behind the export's back: the manifest no longer describes it, so it is written again
    part = next(p for p in os.listdir(dest) if p.startswith("part-"))
    os.remove(dest / part)
    assert export_results(log, str(dest), format=fmt)["changed"]
    assert (dest / part).exists()


def test_a_changed_export_replaces_its_parts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = _log(tmp_path)
    dest = tmp_path / "out"
    monkeypatch.setattr("airflow_provider_datagen.core.export_files.FILE_BYTES", 1)  # one row per part
    export_results(log, str(dest), format="parquet")
    assert sorted(p for p in os.listdir(dest) if p.endswith(".parquet")) == [f"part-{i:05d}.parquet" for i in range(5)]
    monkeypatch.setattr("airflow_provider_datagen.core.export_files.FILE_BYTES", 2**30)
    again = export_results(log, str(dest), format="parquet", include_blobs=False)
    assert again["changed"]
    assert sorted(os.listdir(dest)) == [MANIFEST_NAME, "part-00000.parquet"]  # no stale part, no temp file
    assert read_files_export(str(dest)).num_rows == 5


def test_parquet_row_groups_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("airflow_provider_datagen.core.export_files.ROW_GROUP_BYTES", 1)
    export_results(_log(tmp_path), str(tmp_path / "out"), format="parquet")
    meta = pq.ParquetFile(tmp_path / "out" / "part-00000.parquet").metadata
    assert meta.num_row_groups == 5 and meta.num_rows == 5


def test_an_unknown_format_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"format='csv' is not an export format; pass one of 'lance'"):
        export_results(_log(tmp_path), str(tmp_path / "out"), format="csv")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("first", "then"), [("lance", "parquet"), ("parquet", "lance"), ("jsonl", "parquet")])
def test_a_destination_of_another_format_is_refused(tmp_path: Path, first: str, then: str) -> None:
    log = _log(tmp_path)
    dest = tmp_path / "out"
    export_results(log, str(dest), format=first)
    before = sorted(os.listdir(dest))
    with pytest.raises(ConfigurationError, match=rf"holds a {first} export, not a {then} one; pass format='{first}'"):
        export_results(log, str(dest), format=then)
    assert sorted(os.listdir(dest)) == before


def test_a_folder_of_other_files_is_refused_for_a_file_export(tmp_path: Path) -> None:
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "notes.txt").write_text("mine")
    with pytest.raises(ConfigurationError, match=r"holds files that are no datagen export.*new or empty folder"):
        export_results(_log(tmp_path), str(dest), format="parquet")
    assert os.listdir(dest) == ["notes.txt"]


def test_a_bytes_value_parquet_cannot_hold_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = _log(tmp_path)
    monkeypatch.setattr(export_module, "PARQUET_MAX_VALUE_BYTES", 4)
    with pytest.raises(ConfigurationError, match=r"field 'image' of item '4': 5 bytes.*format='lance'.*include_blobs"):
        export_results(log, str(tmp_path / "out"), format="parquet")
    assert not (tmp_path / "out").exists()
    assert export_results(log, str(tmp_path / "out"), format="parquet", include_blobs=False)["changed"]


def _varied(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
    n = item["n"]
    out: dict[str, Any] = {
        "late_str": n if n < 3 else f"s{n}",  # ints in the first batches, strings later: JSON text
        "sparse": None if n < 2 else n,  # all null in the first batch: promoted to int64
        "items": [] if n < 2 else [n],  # list<null> first, list<int64> later
    }
    if n == 4:
        out["only_last"] = {"k": n}  # a field of one batch only
    return out


@pytest.mark.parametrize("fmt", ["lance", "parquet", "jsonl"])
def test_a_batched_export_equals_the_whole_table_export(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str
) -> None:
    log = open_log(tmp_path, "v")
    run_items(log, ITEMS, _varied)
    whole = export_results(log, str(tmp_path / "whole"), format=fmt)
    monkeypatch.setattr(export_module, "EXPORT_BATCH_ITEMS", 2)  # batches of 2, 2 and 1 items
    batched = export_results(log, str(tmp_path / "batched"), format=fmt)
    assert batched == whole
    assert whole["json_fields"] == ["late_str"] and whole["rows"] == 5

    def read(dest: Path) -> list[dict[str, Any]]:
        if fmt == "lance":
            return list(lance.dataset(str(dest)).to_table().to_pylist())
        if fmt == "parquet":
            return list(read_files_export(str(dest)).to_pylist())
        return _jsonl_rows(dest)

    rows = read(tmp_path / "batched")
    assert rows == read(tmp_path / "whole")
    assert [r["late_str"] for r in rows] == ["0", "1", "2", '"s3"', '"s4"']
    assert [r["sparse"] for r in rows] == [None, None, 2, 3, 4]
    assert [r["items"] for r in rows] == [[], [], [2], [3], [4]]
    assert [r["only_last"] for r in rows] == [None] * 4 + [{"k": 4}]
    if fmt == "parquet":
        schema = read_files_export(str(tmp_path / "batched")).schema
        assert schema.field("sparse").type == pa.int64() and schema.field("items").type == pa.list_(pa.int64())
