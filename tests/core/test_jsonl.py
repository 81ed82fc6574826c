"""One JSON Lines reader: the whole-source read, the plan's scan and its row reads see the same rows."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

import numpy as np
import pytest

from airflow_provider_datagen.core import jsonl
from airflow_provider_datagen.core.source_scan import read_rows, row_ranges, scan_source
from airflow_provider_datagen.core.sources import prepare_items, read_source
from airflow_provider_datagen.exceptions import InvalidItemError

if TYPE_CHECKING:
    from pathlib import Path

# CRLF endings, a blank line, a \u escape, a 70-bit int (orjson reads it as a float, in every reader alike), no
# final newline
TEXT = (
    b'{"id": "a", "x": 1}\r\n\n{"id": "b", "x": "\\u00e9"}\n'
    b'{"id": "c", "x": 1180591620717411303424}\n{"id": "d", "s": "\xc3\xa9"}'
)


def _same(rows: list[dict]) -> list[tuple]:
    return [tuple((k, type(v).__name__, v) for k, v in r.items()) for r in rows]


def test_every_reader_sees_the_same_rows(tmp_path: Path) -> None:
    path = tmp_path / "items.jsonl"
    path.write_bytes(TEXT)
    whole = list(read_source(str(path)))
    assert _same(whole) == _same(
        [{"id": "a", "x": 1}, {"id": "b", "x": "é"}, {"id": "c", "x": float(2**70)}, {"id": "d", "s": "é"}]
    )
    scanned = scan_source(str(path), "id")
    assert scanned.ids.to_pylist() == ["a", "b", "c", "d"]
    assert scanned.fingerprints.to_pylist() == [s.fingerprint for s in prepare_items(whole)]
    ranges = row_ranges(np.arange(len(whole)), scanned.offsets)
    assert _same(read_rows(str(path), ranges)) == _same(whole)


def test_lines_split_an_arrow_file_as_a_python_file() -> None:
    import pyarrow as pa

    assert list(jsonl.lines(pa.BufferReader(TEXT))) == list(jsonl.lines(io.BytesIO(TEXT)))


def test_a_line_that_is_not_json_is_named_by_path_and_number(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'{"id": "a"}\n{"id": \n')
    with pytest.raises(InvalidItemError, match=r"bad\.jsonl' line 2 is not JSON"):
        list(read_source(str(path)))
    with pytest.raises(InvalidItemError, match=r"bad\.jsonl' line 2 is not JSON"):
        scan_source(str(path), "id")
