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
#: the entry counts summed, in the order of a :data:`Sums` list
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


#: per (writer_id, writer_epoch, model): [calls, input_tokens, output_tokens, unpriced_calls, nanos, failed nanos]
Sums = dict[tuple[str, int, str], list[int]]


def add_sums(into: Sums, more: Sums) -> Sums:
    """``into`` with ``more`` added (in place)."""
    for key, sums in more.items():
        have = into.get(key)
        if have is None:
            into[key] = list(sums)
        else:
            for i, v in enumerate(sums):
                have[i] += v
    return into


def usage_of_sums(sums: Sums, *, exclude_writer: tuple[str, int] | None = None) -> dict[str, Any]:
    """The usage dict of per-writer sums, without ``exclude_writer``'s."""
    out = empty_usage()
    by_model: dict[str, list[int]] = {}
    failed = 0
    for (writer, epoch, model), s in sums.items():
        if exclude_writer is not None and (writer, epoch) == exclude_writer:
            continue
        m = by_model.setdefault(model, [0, 0, 0, 0, 0])
        for i in range(5):
            m[i] += s[i]
        failed += s[5]
    total = [0, 0, 0, 0, 0]
    for model in sorted(by_model):
        m = by_model[model]
        out["by_model"][model] = {
            "calls": m[0],
            "input_tokens": m[1],
            "output_tokens": m[2],
            "cost_usd": m[4] / NANOS,
            "unpriced_calls": m[3],
        }
        total = [a + b for a, b in zip(total, m)]
    out.update(
        calls=total[0],
        input_tokens=total[1],
        output_tokens=total[2],
        unpriced_calls=total[3],
        cost_usd=total[4] / NANOS,
        failed_attempts_cost_usd=failed / NANOS,
    )
    return out


def spend_of_sums(sums: Sums, *, exclude_writer: tuple[str, int] | None = None) -> tuple[int, int]:
    """(nano-dollars, tokens) of per-writer sums without ``exclude_writer``'s: what a budget compares."""
    nanos = tokens = 0
    for (writer, epoch, _), s in sums.items():
        if exclude_writer is None or (writer, epoch) != exclude_writer:
            nanos += s[4]
            tokens += s[1] + s[2]
    return nanos, tokens


def usage_of_events(events: Iterable[Event], *, exclude_writer: tuple[str, int] | None = None) -> dict[str, Any]:
    """The usage dict of ``events`` (any order, any duplicates): the reference fold."""
    return usage_of_sums(sums_of_events(events), exclude_writer=exclude_writer)


def sums_of_events(events: Iterable[Event]) -> Sums:
    """Per-writer sums of ``events``' usage entries, one copy per event id."""
    sums: Sums = {}
    for ev in dedupe(events).values():
        if ev.event_type.value not in USAGE_TYPES:
            continue
        record = _payload(ev.value_json)
        if record is None:
            continue
        for e in record["usage"]:
            s = sums.setdefault((ev.writer_id, ev.writer_epoch, e["model"]), [0, 0, 0, 0, 0, 0])
            nanos = _nanos(e.get("cost_usd"))
            for i, key in enumerate(_COUNTS):
                s[i] += int(e.get(key) or 0)
            s[4] += nanos
            if ev.event_type is EventType.FAILED:
                s[5] += nanos
    return sums


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
    if "event_key" in table.column_names:  # equal ids have equal keys: distinct keys, no copy
        keys = np.sort(table["event_key"].to_numpy())
        if not (keys[1:] == keys[:-1]).any():
            return table
    encoded = pc.dictionary_encode(table["event_id"]).combine_chunks()
    if len(encoded.dictionary) == table.num_rows:  # the usual case: no copy, nothing to sort
        return table
    _, first = np.unique(encoded.indices.to_numpy(zero_copy_only=False), return_index=True)
    return table.take(pa.array(np.sort(first)))


def _json_lines(values: pa.ChunkedArray) -> bytes:
    """The values one per line (a null as ``{}``), from Arrow's buffers: no Python string per row."""
    parts = []
    for chunk in values.chunks:
        if len(chunk):
            lines = pc.binary_join_element_wise(pc.fill_null(chunk, "{}"), "", "\n")  # each value, then "\n"
            _, offsets, data = lines.buffers()
            width = np.int64 if pa.types.is_large_string(lines.type) else np.int32
            at = np.frombuffer(offsets, dtype=width)[lines.offset : lines.offset + len(lines) + 1]
            parts.append(memoryview(data)[int(at[0]) : int(at[-1])])
    return b"".join(parts)


def _entries(table: pa.Table) -> tuple[pa.StructArray, np.ndarray]:
    """Every stored entry of ``table``'s rows, and the row each came from."""
    data = _json_lines(table["value_json"])
    parsed = pa_json.read_json(
        io.BytesIO(data),
        read_options=pa_json.ReadOptions(block_size=max(1 << 20, len(data) // 8 + 1)),
        parse_options=pa_json.ParseOptions(explicit_schema=_PAYLOAD, unexpected_field_behavior="ignore"),
    )
    lists = parsed["usage"].combine_chunks()
    entries = pc.list_flatten(lists)
    parents = pc.list_parent_indices(lists).to_numpy(zero_copy_only=False)
    return entries, parents


def usage_rows_mask(table: pa.Table) -> pa.ChunkedArray | pa.Array:
    """Which rows of ``table`` may carry usage (a STEP_COMPLETED or FAILED row with a value)."""
    keep = pc.is_in(table["event_type"], value_set=pa.array(USAGE_TYPES))
    # Only JSON objects naming "usage" (as the reference fold reads them): other values of these rows
    # (a failure's record without usage, any other JSON) are not parsed at all. Null values give null,
    # which a filter drops.
    value = table["value_json"]
    return pc.and_(keep, pc.and_(pc.starts_with(value, "{"), pc.match_substring(value, '"usage"')))


#: the columns a usage projection groups by, and the sums of a :data:`Sums` list in order
GROUP_COLUMNS = ("writer_id", "writer_epoch", "model")
SUM_COLUMNS = (*_COUNTS, "nanos", "failed_nanos")
_ENTRIES = pa.schema(
    [
        ("writer_id", pa.string()),
        ("writer_epoch", pa.int64()),
        ("model", pa.string()),
        *[(name, pa.int64()) for name in SUM_COLUMNS],
        ("event_key", pa.int64()),
    ]
)


def entries_of_table(table: pa.Table) -> pa.Table:
    """One row per stored usage entry of ``table``'s rows (:data:`USAGE_COLUMNS`, any rows).

    Columns: :data:`GROUP_COLUMNS`, :data:`SUM_COLUMNS`, and ``event_key`` when ``table`` has it
    (the row each entry came from). One copy per ``event_id`` within ``table``; the entries are
    parsed by pyarrow's JSON reader, no Python per row.
    """
    if table.num_rows:
        mask = usage_rows_mask(table)
        if pc.all(mask, skip_nulls=False).as_py() is not True:  # copying a million rows to drop none costs a second
            table = table.filter(mask)
        table = _unique_rows(table)
    if table.num_rows == 0:  # no usage (the usual read after a projection): nothing to parse
        return (
            _ENTRIES.empty_table() if "event_key" in table.column_names else _ENTRIES.empty_table().drop(["event_key"])
        )
    entries, parents = _entries(table)
    cost = entries.field("cost_usd").fill_null(0.0).to_numpy(zero_copy_only=False)
    nanos = np.rint(cost * NANOS).astype(np.int64)
    failed_rows = pc.equal(table["event_type"], EventType.FAILED.value).to_numpy(zero_copy_only=False)
    parent_idx = pa.array(parents, pa.int64())
    columns = {
        "writer_id": table["writer_id"].take(parent_idx),
        "writer_epoch": table["writer_epoch"].take(parent_idx).cast(pa.int64()),
        "model": entries.field("model"),
        **{k: pc.fill_null(entries.field(k), 0) for k in _COUNTS},
        "nanos": pa.array(nanos, pa.int64()),
        "failed_nanos": pa.array(np.where(failed_rows[parents], nanos, 0), pa.int64()),
    }
    if "event_key" in table.column_names:
        columns["event_key"] = table["event_key"].take(parent_idx)
    return pa.table(columns)


def sums_of_entries(entries: pa.Table) -> Sums:
    """Per-writer sums of :func:`entries_of_table`'s rows (grouped aggregates)."""
    if entries.num_rows == 0:
        return {}
    grouped = entries.group_by(list(GROUP_COLUMNS)).aggregate([(k, "sum") for k in SUM_COLUMNS]).to_pydict()
    return {
        (w, int(e), m): [int(grouped[f"{k}_sum"][i]) for k in SUM_COLUMNS]
        for i, (w, e, m) in enumerate(zip(grouped["writer_id"], grouped["writer_epoch"], grouped["model"]))
    }


def sums_of_table(table: pa.Table) -> Sums:
    """Per-writer sums of the usage entries of ``table``'s rows (:data:`USAGE_COLUMNS`, any rows).

    One copy per ``event_id`` within ``table``; the entries are parsed by pyarrow's JSON reader and
    summed with grouped aggregates, no Python per row.
    """
    return sums_of_entries(entries_of_table(table))


def usage_of_table(table: pa.Table, *, exclude_writer: tuple[str, int] | None = None) -> dict[str, Any]:
    """The usage dict of rows of the log (:data:`USAGE_COLUMNS`, any rows): the vectorized fold.

    ``exclude_writer=(writer_id, epoch)`` leaves out the rows that writer wrote at that epoch.
    """
    return usage_of_sums(sums_of_table(table), exclude_writer=exclude_writer)
