"""``core/next_run.py`` and ``core/store/source_ref.py``: what the next run would do over a recorded source;
one item's row.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_datagen.core import CheckpointLog, run_items
from airflow_provider_datagen.core.chunks import plan_chunks, record_plan_source
from airflow_provider_datagen.core.ids import root_item_id
from airflow_provider_datagen.core.next_run import rerun_counts, source_input, source_item
from airflow_provider_datagen.core.store.source_ref import recorded_source, strip_credentials
from airflow_provider_datagen.exceptions import InvalidItemError

if TYPE_CHECKING:
    from pathlib import Path


def _ok(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
    return {"n": len(item["text"])}


def _record(lg: CheckpointLog, source: Any, version: str = "v1", redo: str = "never") -> Any:
    planned = plan_chunks(lg, source, key_field="id", processor_version=version, redo_completed=redo)
    return record_plan_source(lg, source, planned, key_field="id", processor_version=version, redo_completed=redo)


@pytest.mark.parametrize(
    ("uri", "kept", "redacted"),
    [
        ("/data/items.jsonl", "/data/items.jsonl", False),
        ("s3://bucket/items.parquet", "s3://bucket/items.parquet", False),
        ("s3://AKIA:top-secret@bucket/items.parquet", "s3://bucket/items.parquet", True),
        ("s3://bucket/items.parquet?access_key=AKIA&secret_key=top-secret", "s3://bucket/items.parquet", True),
    ],
)
def test_credentials_in_a_uri_are_never_recorded(uri: str, kept: str, redacted: bool) -> None:
    assert strip_credentials(uri) == (kept, redacted)


def test_a_redacted_uri_is_refused_with_the_reason(tmp_path: Path) -> None:
    lg = CheckpointLog.open(str(tmp_path), pipeline="p", experiment="redacted")
    source = tmp_path / "items.jsonl"
    source.write_text('{"id": "a", "text": "x"}\n')
    ref = _record(lg, str(source))
    from dataclasses import replace

    with pytest.raises(InvalidItemError, match="credentials in its URI, which are not recorded"):
        rerun_counts(replace(ref, uri_redacted=True), lg.states(), lg.version)


def test_redo_other_version_demotes_done_items(tmp_path: Path) -> None:
    lg = CheckpointLog.open(str(tmp_path), pipeline="p", experiment="redo")
    items = [{"id": f"k{i}", "text": "t" * i} for i in range(4)]
    run_items(lg, items, _ok, processor_version="v1")
    kept = rerun_counts(_record(lg, items, "v2"), lg.states(), lg.version)
    assert (kept.skip, kept.demoted, kept.kept_other_version) == (4, 0, {"v1": 4})
    redo = rerun_counts(_record(lg, items, "v2", "other_version"), lg.states(), lg.version)
    assert (redo.skip, redo.demoted, redo.kept_other_version) == (0, 4, {})
    assert recorded_source(lg.uri).redo_completed == "other_version"  # type: ignore[union-attr]


# keys the JSONL reader cannot find by their bytes in the line (escaped by the writer, or quoted)
ODD_KEYS = ["caf\u00e9", 'say "hi"', "back\\slash", "a/b:c%d", "tab\there"]


@pytest.mark.parametrize("ensure_ascii", [True, False])
def test_jsonl_rows_are_found_whatever_the_key_looks_like(tmp_path: Path, ensure_ascii: bool) -> None:
    rows = [{"id": key, "text": f"row {n}"} for n, key in enumerate(ODD_KEYS)] + [{"id": "plain", "text": "p"}]
    path = tmp_path / "odd.jsonl"
    # json.dumps escapes non-ASCII as \\uXXXX by default; orjson writes UTF-8
    path.write_text("".join(json.dumps(r, ensure_ascii=ensure_ascii) + "\n" for r in rows), encoding="utf-8")
    lg = CheckpointLog.open(str(tmp_path), pipeline="p", experiment=f"odd{int(ensure_ascii)}")
    ref = _record(lg, str(path))
    for row in rows:
        assert source_item(ref, root_item_id(row["id"])) == row
    assert source_item(ref, "missing") is None


def test_an_int_key_and_its_digits_are_one_id_but_never_a_padded_string(tmp_path: Path) -> None:
    lg = CheckpointLog.open(str(tmp_path), pipeline="p", experiment="ints")
    path = tmp_path / "ints.parquet"
    pq.write_table(pa.Table.from_pylist([{"id": i, "text": str(i)} for i in range(20)]), path, row_group_size=6)
    ref = _record(lg, str(path))
    assert source_item(ref, "13") == {"id": 13, "text": "13"}  # in the third row group
    assert source_item(ref, "013") is None and source_item(ref, "x") is None


def test_source_input_checks_the_fingerprint(tmp_path: Path) -> None:
    lg = CheckpointLog.open(str(tmp_path), pipeline="p", experiment="fp")
    path = tmp_path / "fp.jsonl"
    path.write_bytes(orjson.dumps({"id": "a", "text": "one"}) + b"\n")
    ref = _record(lg, str(path))
    run_items(lg, [{"id": "a", "text": "one"}], _ok)
    fp = lg.item_state("a").input_fingerprint
    assert source_input(ref, "a", fp, None) == {"found": True, "value": {"id": "a", "text": "one"}, "problem": None}
    path.write_bytes(orjson.dumps({"id": "a", "text": "two"}) + b"\n")
    changed = source_input(ref, "a", fp, None)
    assert (changed["found"], changed["problem"]) == (False, "changed") and changed["fingerprint"] != fp
