"""The usage lens: the usage entries of every attempt, summed (see docs/adr/0011-usage-ledger.md).

An attempt's usage is stored in the JSON value of the row that ends it: its STEP_COMPLETED, or its
FAILED row (status ``transient`` when it was retried in place, ``failed`` otherwise), as
``{"attempt": n, "usage": [entry, ...]}``. Every stored attempt counts, whatever became of its item
(money was spent): usage is not a lifecycle fold, so generations and fencing play no part, and the
only rule is one copy per ``event_id`` (a batch that landed twice is counted once). Costs are summed
as integer nano-dollars, so the two folds below agree exactly whatever the order of their sums.

- :func:`usage_of_events` is the readable definition over :class:`Event` objects;
- :func:`usage_of_table` is the same over Arrow columns for millions of rows (pyarrow's JSON reader
  and grouped sums, no Python per row); a property test holds the two equal.
"""

from __future__ import annotations

import io
import json
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from airflow_provider_datagen.core.fold.reference import dedupe
from airflow_provider_datagen.core.schema import STORED_STATUS_TRANSIENT, EventType

if TYPE_CHECKING:
    from collections.abc import Iterable

    from airflow_provider_datagen.core.events import Event

NANOS = 1_000_000_000
#: the columns :func:`usage_of_table` reads (of the rows :data:`USAGE_TYPES` with a value)
USAGE_COLUMNS = ("event_id", "event_type", "value_json", "writer_id", "writer_epoch")
#: the event types whose rows may carry an attempt's usage
USAGE_TYPES = (EventType.STEP_COMPLETED.value, EventType.FAILED.value)
_COUNTS = ("calls", "input_tokens", "output_tokens", "unpriced_calls")
_ENTRY = pa.struct(
    [
        ("model", pa.string()),
        ("calls", pa.int64()),
        ("input_tokens", pa.int64()),
        ("output_tokens", pa.int64()),
        ("cost_usd", pa.float64()),
        ("unpriced_calls", pa.int64()),
    ]
)
_PAYLOAD = pa.schema([("usage", pa.list_(_ENTRY))])


def empty_usage() -> dict[str, Any]:
    """The usage of a log without any."""
    return {
        "calls": 0,
        "input_tokens": 0,
        "output_tokens": 0,
        "cost_usd": 0.0,
        "unpriced_calls": 0,
        "by_model": {},
        "failed_attempts_cost_usd": 0.0,
    }


def _payload(value_json: str | None) -> dict[str, Any] | None:
    if not value_json:
        return None
    try:
        record = json.loads(value_json)
    except ValueError:
        return None
    return record if isinstance(record, dict) and isinstance(record.get("usage"), list) else None


def _nanos(cost: float | None) -> int:
    return 0 if cost is None else round(cost * NANOS)


def _result(by_model: dict[str, list[int]], failed_nanos: int) -> dict[str, Any]:
    """The usage dict of per-model sums ``[calls, input, output, unpriced, nanos]``."""
    out = empty_usage()
    total = [0, 0, 0, 0, 0]
    for model in sorted(by_model):
        sums = by_model[model]
        out["by_model"][model] = {
            "calls": sums[0],
            "input_tokens": sums[1],
            "output_tokens": sums[2],
            "cost_usd": sums[4] / NANOS,
            "unpriced_calls": sums[3],
        }
        total = [a + b for a, b in zip(total, sums)]
    out.update(
        calls=total[0],
        input_tokens=total[1],
        output_tokens=total[2],
        unpriced_calls=total[3],
        cost_usd=total[4] / NANOS,
        failed_attempts_cost_usd=failed_nanos / NANOS,
    )
    return out


def usage_of_events(events: Iterable[Event]) -> dict[str, Any]:
    """The usage dict of ``events`` (any order, any duplicates): the reference fold."""
    by_model: dict[str, list[int]] = {}
    failed = 0
    for ev in dedupe(events).values():
        if ev.event_type.value not in USAGE_TYPES:
            continue
        record = _payload(ev.value_json)
        if record is None:
            continue
        for e in record["usage"]:
            sums = by_model.setdefault(e["model"], [0, 0, 0, 0, 0])
            nanos = _nanos(e.get("cost_usd"))
            for i, key in enumerate(("calls", "input_tokens", "output_tokens", "unpriced_calls")):
                sums[i] += int(e.get(key) or 0)
            sums[4] += nanos
            if ev.event_type is EventType.FAILED:
                failed += nanos
    return _result(by_model, failed)


def attempts_of_events(events: Iterable[Event]) -> list[dict[str, Any]]:
    """One row per model per stored attempt with usage, in the log's order: an item's usage by attempt."""
    rows = []
    for ev in sorted(dedupe(events).values(), key=lambda e: (e.item_id, e.item_seq, e.event_key)):
        if ev.event_type.value not in USAGE_TYPES:
            continue
        record = _payload(ev.value_json)
        if record is None:
            continue
        if ev.event_type is EventType.STEP_COMPLETED:
            status = "completed"
        else:
            status = "transient" if ev.status == STORED_STATUS_TRANSIENT else "failed"
        for e in record["usage"]:
            rows.append(
                {
                    "attempt": record.get("attempt"),
                    "step": ev.step,
                    "status": status,
                    "model": e["model"],
                    "input_tokens": int(e.get("input_tokens") or 0),
                    "output_tokens": int(e.get("output_tokens") or 0),
                    "cost_usd": e.get("cost_usd"),
                    "calls": int(e.get("calls") or 0),
                    "unpriced_calls": int(e.get("unpriced_calls") or 0),
                    "item_id": ev.item_id,
                }
            )
    return rows


def _unique_rows(table: pa.Table) -> pa.Table:
    """One row per ``event_id`` (copies of a retried batch are identical in what this fold reads)."""
    if table.num_rows < 2:
        return table
    codes = pc.dictionary_encode(table["event_id"]).combine_chunks().indices.to_numpy(zero_copy_only=False)
    _, first = np.unique(codes, return_index=True)
    if len(first) == table.num_rows:
        return table
    return table.take(pa.array(np.sort(first)))


def _entries(table: pa.Table) -> tuple[pa.StructArray, np.ndarray]:
    """Every stored entry of ``table``'s rows, and the row each came from."""
    texts = [t for t in table["value_json"].to_pylist()]
    data = "\n".join(t or "{}" for t in texts).encode("utf-8")
    parsed = pa_json.read_json(
        io.BytesIO(data),
        read_options=pa_json.ReadOptions(block_size=max(1 << 20, len(data) + 1), use_threads=False),
        parse_options=pa_json.ParseOptions(explicit_schema=_PAYLOAD, unexpected_field_behavior="ignore"),
    )
    lists = parsed["usage"].combine_chunks()
    entries = pc.list_flatten(lists)
    parents = pc.list_parent_indices(lists).to_numpy(zero_copy_only=False)
    return entries, parents


def usage_of_table(table: pa.Table, *, exclude_writer: tuple[str, int] | None = None) -> dict[str, Any]:
    """The usage dict of rows of the log (:data:`USAGE_COLUMNS`, any rows): the vectorized fold.

    ``exclude_writer=(writer_id, epoch)`` leaves out the rows that writer wrote at that epoch (a
    run's budget counts its own usage itself).
    """
    if table.num_rows:
        keep = pc.is_in(table["event_type"], value_set=pa.array(USAGE_TYPES))
        keep = pc.and_(keep, pc.is_valid(table["value_json"]))
        if exclude_writer is not None:
            mine = pc.and_(
                pc.equal(table["writer_id"], exclude_writer[0]), pc.equal(table["writer_epoch"], exclude_writer[1])
            )
            keep = pc.and_(keep, pc.invert(mine))
        table = _unique_rows(table.filter(keep))
    if table.num_rows == 0:
        return empty_usage()
    entries, parents = _entries(table)
    if len(entries) == 0:
        return empty_usage()
    cost = entries.field("cost_usd").fill_null(0.0).to_numpy(zero_copy_only=False)
    nanos = np.rint(cost * NANOS).astype(np.int64)
    failed_rows = pc.equal(table["event_type"], EventType.FAILED.value).to_numpy(zero_copy_only=False)
    failed = int(nanos[failed_rows[parents]].sum()) if len(nanos) else 0
    flat = pa.table(
        {
            "model": entries.field("model"),
            **{k: pc.fill_null(entries.field(k), 0) for k in _COUNTS},
            "nanos": pa.array(nanos),
        }
    )
    grouped = flat.group_by("model").aggregate([(k, "sum") for k in (*_COUNTS, "nanos")]).to_pydict()
    by_model = {
        m: [int(grouped[f"{k}_sum"][i]) for k in ("calls", "input_tokens", "output_tokens", "unpriced_calls", "nanos")]
        for i, m in enumerate(grouped["model"])
    }
    return _result(by_model, failed)


def spend_of_usage(usage: dict[str, Any]) -> tuple[int, int]:
    """(nano-dollars, tokens) of a usage dict: what a budget compares."""
    return round(usage["cost_usd"] * NANOS), int(usage["input_tokens"]) + int(usage["output_tokens"])
