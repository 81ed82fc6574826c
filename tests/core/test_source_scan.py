"""The plan's scan of a path source: formats, row ranges, duplicate keys and the rows a chunk reads back."""

from __future__ import annotations

import json
from itertools import pairwise
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_datagen.core.source_scan import (
    JSONL,
    LANCE,
    PARQUET,
    check_unique,
    read_rows,
    row_ranges,
    scan_source,
    source_format,
)
from airflow_provider_datagen.core.sources import prepare_items
from airflow_provider_datagen.core.store.lance_io import overwrite_dataset
from airflow_provider_datagen.exceptions import InvalidItemError

if TYPE_CHECKING:
    from pathlib import Path

ROWS = [{"id": f"k{i}", "n": i, "text": f"row {i}"} for i in range(12)]


@pytest.mark.parametrize(
    ("path", "kind"),
    [("/d/a.jsonl", JSONL), ("/d/a.NDJSON", JSONL), ("/d/a.parquet", PARQUET), ("s3://b/a.lance/", LANCE)],
)
def test_the_format_is_the_suffix(path: str, kind: str) -> None:
    assert source_format(path) == kind


def test_an_unknown_suffix_names_the_formats() -> None:
    with pytest.raises(InvalidItemError, match=r"unknown format; use a \.jsonl, \.parquet or \.lance path"):
        source_format("/d/a.csv")


@given(st.sets(st.integers(min_value=0, max_value=60), max_size=30))
def test_row_ranges_cover_exactly_the_positions(positions: set[int]) -> None:
    pos = np.array(sorted(positions, reverse=True), dtype=np.int64)  # any order in, sorted ranges out
    ranges = row_ranges(pos, None)
    covered = [p for start, stop in ranges for p in range(start, stop)]
    assert covered == sorted(positions)
    assert all(a[1] < b[0] for a, b in pairwise(ranges))  # disjoint, not even touching


def test_jsonl_ranges_carry_the_byte_offset_of_their_first_row() -> None:
    offsets = np.array([0, 10, 20, 30, 40], dtype=np.int64)
    assert row_ranges(np.array([4, 0, 1, 3]), offsets[[4, 0, 1, 3]]) == [[0, 2, 0], [3, 5, 30]]


def _write(tmp_path: Path, kind: str) -> str:
    if kind == JSONL:
        path = tmp_path / "s.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    elif kind == PARQUET:
        path = tmp_path / "s.parquet"
        pq.write_table(pa.Table.from_pylist(ROWS), path, row_group_size=5)
    else:
        path = tmp_path / "s.lance"
        overwrite_dataset(pa.Table.from_pylist(ROWS), str(path), None)
    return str(path)


@pytest.mark.parametrize("kind", [JSONL, PARQUET, LANCE])
def test_a_chunk_reads_back_the_rows_the_scan_fingerprinted(tmp_path: Path, kind: str) -> None:
    path = _write(tmp_path, kind)
    scanned = scan_source(path, "id")
    assert scanned.ids.to_pylist() == [r["id"] for r in ROWS]
    assert scanned.fingerprints.to_pylist() == [s.fingerprint for s in prepare_items(ROWS)]
    wanted = np.array([1, 2, 3, 7, 11], dtype=np.int64)
    offsets = None if scanned.offsets is None else scanned.offsets[wanted]
    assert read_rows(path, row_ranges(wanted, offsets)) == [ROWS[i] for i in wanted]


def test_a_repeated_key_names_the_first_pair_an_in_order_read_meets() -> None:
    ids = pa.array(["a", "b", "c", "b", "a", "d"])
    with pytest.raises(InvalidItemError, match=r"duplicate key 'b' \(items #1 and #3\)"):
        check_unique("/d/s.jsonl", "id", ids)
    # positions of a bucket: the pair is named by its places in the whole source
    with pytest.raises(InvalidItemError, match=r"duplicate key 'a' \(items #5 and #8\)"):
        check_unique("/d/s.jsonl", "id", pa.array(["a", "z", "a"]), np.array([5, 6, 8]))
    check_unique("/d/s.jsonl", "id", pa.array(["a", "b"]))  # unique: nothing raised
