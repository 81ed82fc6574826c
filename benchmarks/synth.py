"""Synthetic event logs in the real schema, written in a few large appends (fast to build)."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from airflow_provider_datagen.core.events import fingerprint_of
from airflow_provider_datagen.core.schema import EVENT_SCHEMA

if TYPE_CHECKING:
    from airflow_provider_datagen.core.store.log import CheckpointLog

#: Event types of a completed item (5 events) and of a running one (its first 3).
_DONE = ("ITEM_CREATED", "STEP_STARTED", "FIELD_SET", "STEP_COMPLETED", "TERMINAL")
_STATUS = {"ITEM_CREATED": "running", "TERMINAL": "completed"}


def source_items(n: int) -> list[dict[str, object]]:
    return [{"id": f"item-{i:07d}", "prompt": f"prompt {i}"} for i in range(n)]


def synth_events(
    items: list[dict[str, object]], done_fraction: float, seed: int = 0, *, first_row: int = 0
) -> pa.Table:
    """Events for ``items``: ``done_fraction`` of them completed (5 events), the rest running (3).

    ``first_row`` numbers the events after those of earlier calls (a log built a slice at a time).
    """
    rng = np.random.default_rng(seed)
    n = len(items)
    ids = np.array([str(it["id"]) for it in items], dtype=object)
    fps = np.array([fingerprint_of(it) for it in items], dtype=object)
    done = rng.random(n) < done_fraction
    per_item = np.where(done, 5, 3)
    total = int(per_item.sum())
    item_idx = np.repeat(np.arange(n), per_item)
    starts = np.cumsum(per_item) - per_item
    seq = np.arange(total) - np.repeat(starts, per_item)
    types = np.array(_DONE, dtype=object)[seq]
    status = np.array([_STATUS.get(t) for t in _DONE], dtype=object)[seq]
    item_col = pa.array(ids[item_idx], pa.string())
    seq_col = pa.array(seq, pa.int64())
    # Hex ids whose first 16 digits are the item index, as event_key_of() expects of real ids.
    row_no = np.arange(first_row, first_row + total, dtype=np.int64)
    event_id = pa.array(np.char.add(np.char.mod("%016x", row_no), np.char.mod("%016x", seq)).astype(object))
    now = dt.datetime.now(dt.UTC)
    cols = {
        "event_id": event_id,
        "event_key": pa.array(row_no, pa.int64()),
        "schema_version": pa.array(np.full(total, 2, np.int32)),
        "item_id": item_col,
        "root_item_id": item_col,
        "parent_item_id": pa.nulls(total, pa.string()),
        "item_seq": seq_col,
        "event_type": pa.array(types, pa.string()),
        "status": pa.array(status, pa.string()),
        "step_kind": pa.array(np.where(np.isin(seq, (1, 3)), "Step", None), pa.string()),
        "step": pa.array(np.where(np.isin(seq, (1, 2, 3)), "process", None), pa.string()),
        "field": pa.array(np.where(seq == 2, "answer", None), pa.string()),
        "value_kind": pa.array(np.where(seq == 2, "json", None), pa.string()),
        "value_json": pa.array(np.where(seq == 2, '"an answer of moderate length"', None), pa.string()),
        "input_fingerprint": pa.array(fps[item_idx], pa.string()),
        "processor_version": pa.array(np.full(total, "v1", dtype=object), pa.string()),
        "writer_id": pa.array(np.full(total, "bench", dtype=object), pa.string()),
        "writer_epoch": pa.array(np.ones(total, np.int64)),
        "created_at": pa.array(
            np.full(total, np.datetime64(now.replace(tzinfo=None), "us")), pa.timestamp("us", "UTC")
        ),
    }
    arrays = [cols[f.name] if f.name in cols else pa.nulls(total, f.type) for f in EVENT_SCHEMA]
    return pa.Table.from_arrays(arrays, schema=EVENT_SCHEMA)


def build_log(log: CheckpointLog, items: list[dict[str, object]], done_fraction: float, appends: int = 5) -> int:
    """Append synthetic events for ``items`` in ``appends`` commits; returns the number of events."""
    table = synth_events(items, done_fraction)
    step = -(-table.num_rows // appends)
    for start in range(0, table.num_rows, step):
        log.append(table.slice(start, step))
    return table.num_rows
