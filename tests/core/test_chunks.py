"""Chunk descriptors and the inline-source snapshot: mapped tasks get the very items that were planned."""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_datagen.core import CheckpointLog
from airflow_provider_datagen.core.chunks import chunk_items, plan_chunks
from airflow_provider_datagen.core.events import canonical_source_json
from airflow_provider_datagen.core.sources import prepare_items
from airflow_provider_datagen.core.store.lance_io import read_lance_table

if TYPE_CHECKING:
    from pathlib import Path

    import pytest

UTC = dt.UTC
PARIS_WINTER = dt.timezone(dt.timedelta(hours=1))

#: The keys of a chunk descriptor: names and ids, never an item's values.
DESCRIPTOR_KEYS = {
    "pipeline",
    "experiment",
    "processor_version",
    "redo_completed",
    "source",
    "snapshot",
    "key_field",
    "item_ids",
    "label",
    "index",
    "plan_log_version",
}


def typed_items() -> list[dict[str, Any]]:
    return [
        {
            "id": f"k{n}",
            "at": dt.datetime(2024, 1, 1, n, 30, 0, 7, tzinfo=UTC),
            "local": dt.datetime(2024, 1, 1, n, tzinfo=PARIS_WINTER),
            "naive": dt.datetime(2024, 6, 1, 8, n),
            "day": dt.date(2024, 2, 1 + n),
            "clock": dt.time(n, 15),
            "price": Decimal(f"{n}.10"),
            "raw": bytes([n, 255]),
            "nested": {"when": [dt.date(2024, 3, 1 + n)], "$ref": "kept"},
        }
        for n in range(5)
    ]


def _chunk_items(chunk: dict[str, Any]) -> list[Any]:
    return chunk_items(chunk, pipeline="p", experiment=chunk["experiment"], processor_version="v1")


def _exactly(value: Any) -> Any:
    """Each value's type and exact text, which equality does not compare (a Decimal's scale, an offset)."""
    if isinstance(value, dict):
        return sorted((k, _exactly(v)) for k, v in value.items())
    if isinstance(value, list):
        return [_exactly(v) for v in value]
    text = value.isoformat() if isinstance(value, (dt.date, dt.time)) else repr(value)
    return (type(value).__name__, text)


def test_an_inline_snapshot_gives_the_mapped_tasks_the_same_values(tmp_path: Path) -> None:
    items = typed_items()
    log = CheckpointLog.open(tmp_path, pipeline="p", experiment="inline")
    planned = plan_chunks(log, items, chunk_size=2)
    chunks = planned.chunks
    assert [c["item_ids"] for c in chunks] == [["k0", "k1"], ["k2", "k3"], ["k4"]]
    assert planned.plan.pending == ["k0", "k1", "k2", "k3", "k4"]
    snapshot = read_lance_table(chunks[0]["source"])  # the snapshot stores each item's canonical text
    assert snapshot["item"].to_pylist() == [canonical_source_json(i) for i in items]
    got = [s for c in chunks for s in _chunk_items(c)]
    assert [s.data for s in got] == items
    assert [_exactly(s.data) for s in got] == [_exactly(i) for i in items]  # a datetime stays a datetime
    assert [s.fingerprint for s in got] == [s.fingerprint for s in prepare_items(items)]


def test_chunk_descriptors_carry_ids_never_payloads(tmp_path: Path) -> None:
    items = typed_items()
    path = tmp_path / "items.parquet"
    pq.write_table(pa.Table.from_pylist(items), path)
    for name, source in (("inline", items), ("parquet", str(path))):
        log = CheckpointLog.open(tmp_path / "root", pipeline="p", experiment=name)
        chunks = plan_chunks(log, source, chunk_size=3).chunks
        # a path source's chunks also name their rows (ranges of positions), so a task reads only those
        keys = DESCRIPTOR_KEYS if name == "inline" else DESCRIPTOR_KEYS | {"rows"}
        assert [set(c) for c in chunks] == [keys] * 2
        if name == "parquet":
            assert [c["rows"] for c in chunks] == [[[0, 3]], [[3, 5]]]
        text = json.dumps(chunks)  # plain JSON for the XCom, no value of any item in it
        for value in ("2024-0", "T00:30", "0.10", "kept", "$ref", "AP8=", "nested", "tagged:"):
            assert value not in text, (name, value)
        assert [s.data for c in chunks for s in _chunk_items(c)] == items


def test_an_inline_plan_encodes_each_item_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fingerprint's canonical text is the snapshot's: planning an inline source encodes each item once."""
    from airflow_provider_datagen.core import events, sources
    from airflow_provider_datagen.core.store import log as log_module

    items = [*typed_items(), *({"id": f"plain{n}", "text": f"t{n}"} for n in range(20))]
    encoded: Counter[str] = Counter()
    depth = [0]  # the tagged form is encoded inside canonical_source_json: one encoding of the item

    def counting(module: Any, name: str, *, none_is_no_text: bool) -> None:
        real = getattr(module, name)

        def wrapper(value: Any, *args: Any, **kwargs: Any) -> Any:
            depth[0] += 1
            try:
                out = real(value, *args, **kwargs)
            finally:
                depth[0] -= 1
            if depth[0] == 0 and isinstance(value, dict) and "id" in value and not (none_is_no_text and out is None):
                encoded[value["id"]] += 1
            return out

        monkeypatch.setattr(module, name, wrapper)

    counting(events, "orjson_canonical", none_is_no_text=True)
    counting(sources, "orjson_canonical", none_is_no_text=True)
    counting(events, "canonical_source_json", none_is_no_text=False)
    counting(log_module, "canonical_source_json", none_is_no_text=False)
    log = CheckpointLog.open(tmp_path, pipeline="p", experiment="once")
    planned = plan_chunks(log, items, chunk_size=10)
    assert planned.plan.pending == [i["id"] for i in items]
    assert encoded == Counter({i["id"]: 1 for i in items})
    snapshot = read_lance_table(planned.chunks[0]["source"])
    monkeypatch.undo()
    assert snapshot["item"].to_pylist() == [canonical_source_json(i) for i in items]
