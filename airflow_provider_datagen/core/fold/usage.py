"""The usage lens: the usage entries of every attempt, summed (see docs/adr/0011-usage-ledger.md).

An attempt's usage is stored in the JSON value of the row that ends it: its STEP_COMPLETED, or its
FAILED row (status ``transient`` when it was retried in place, ``failed`` otherwise), as
``{"attempt": n, "usage": [entry, ...]}``. Every stored attempt counts, whatever became of its item
(money was spent): usage is not a lifecycle fold, so generations and fencing play no part, and the
only rule is one copy per ``event_id`` (a batch that landed twice is counted once). Costs are summed
as integer nano-dollars, so the two folds below agree exactly whatever the order of their sums.

Requests: an attempt that counted its model requests (``ctx.take_request_slot``) stores
``"requests": k`` beside its entries (also with no entry, e.g. every request failed); an attempt
without it (an older log, a process that takes no slot per request) counts its entries' ``calls``.
In the sums, each entry's calls count as requests, and an attempt's ``k`` minus its entries' calls
is summed under the model :data:`REQUESTS_MODEL` (no model is named so), which has nothing else.

Values are bounded when read: a count above :data:`MAX_COUNT` or a cost above :data:`MAX_USD` in one
entry (only an older version let such a value in: ``ctx.record_usage`` refuses them) is read as
that bound, and every sum saturates at :data:`SATURATED`, so a hostile value never makes a read
overflow int64 (``ArrowInvalid``) or wrap the spend negative.

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

#: USD are summed as integer nano-dollars: sums are exact and independent of order (the budget too)
NANOS = 1_000_000_000
#: the most one stored entry's count (tokens, calls, requests) is read as
MAX_COUNT = 10**15
#: the most one stored entry's cost (USD) is read as: 10**18 nano-dollars still fit in int64
MAX_USD = 10**9
#: every sum is clamped to +-this (int64 holds twice as much: adding two saturated sums still fits)
SATURATED = 2**62
#: the group of an attempt's requests beyond its entries' calls (a model name is never empty)
REQUESTS_MODEL = ""
#: the groups of reused answers (entries ``"reused": True``) are their model's name after this prefix:
#: their calls are reused calls, their nano-dollars what was saved; they count in no total or spend
REUSED_PREFIX = "\x00reused:"
#: the columns :func:`usage_of_table` reads (of the rows :data:`USAGE_TYPES` with a value)
USAGE_COLUMNS = ("event_id", "event_type", "value_json", "writer_id", "writer_epoch")
#: the event types whose rows may carry an attempt's usage
USAGE_TYPES = (EventType.STEP_COMPLETED.value, EventType.FAILED.value)
#: the entry counts summed, in the order of a :data:`Sums` list
_COUNTS = ("calls", "input_tokens", "output_tokens", "unpriced_calls")
# Counts are read as float64 (exact up to 2**53, above MAX_COUNT) and then bounded: an int64 schema
# would refuse an older version's 2**64 with ArrowInvalid.
_ENTRY = pa.struct(
    [
        ("model", pa.string()),
        ("calls", pa.float64()),
        ("input_tokens", pa.float64()),
        ("output_tokens", pa.float64()),
        ("cost_usd", pa.float64()),
        ("unpriced_calls", pa.float64()),
        ("reused", pa.bool_()),
        ("saved_usd", pa.float64()),
    ]
)
_PAYLOAD = pa.schema([("usage", pa.list_(_ENTRY)), ("requests", pa.float64())])


def empty_usage() -> dict[str, Any]:
    """The usage of a log without any."""
    return {
        "calls": 0,
        "input_tokens": 0,
        "output_tokens": 0,
        "cost_usd": 0.0,
        "unpriced_calls": 0,
        "requests": 0,
        "by_model": {},
        "failed_attempts_cost_usd": 0.0,
        "reused_calls": 0,
        "saved_usd": 0.0,
    }


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _payload(value_json: str | None) -> dict[str, Any] | None:
    """An attempt's stored record: a JSON object with a ``usage`` list or a ``requests`` count."""
    if not value_json:
        return None
    try:
        record = json.loads(value_json)
    except ValueError:
        return None
    if not isinstance(record, dict):
        return None
    has_usage = isinstance(record.get("usage"), list)
    if not has_usage and not _is_number(record.get("requests")):
        return None
    return record if has_usage else {**record, "usage": []}


def bounded_count(value: Any) -> int:
    """A stored count as the folds read it: whole, from 0 to :data:`MAX_COUNT`."""
    if not value:
        return 0
    return min(max(int(min(value, MAX_COUNT)), 0), MAX_COUNT)


def _nanos(cost: float | None) -> int:
    return 0 if cost is None else round(min(max(cost, 0.0), MAX_USD) * NANOS)


def _requests(record: dict[str, Any]) -> int | None:
    """The requests an attempt's record counted, bounded; None when it counted none (its calls count)."""
    requests = record.get("requests")
    return bounded_count(requests) if _is_number(requests) else None


def saturate(value: int) -> int:
    return min(max(value, -SATURATED), SATURATED)


#: per (writer_id, writer_epoch, model):
#: [calls, input_tokens, output_tokens, unpriced_calls, nanos, failed nanos, requests]
Sums = dict[tuple[str, int, str], list[int]]


def add_sums(into: Sums, more: Sums) -> Sums:
    """``into`` with ``more`` added (in place), each sum saturated."""
    for key, sums in more.items():
        have = into.get(key)
        if have is None:
            into[key] = list(sums)
        else:
            for i, v in enumerate(sums):
                have[i] = saturate(have[i] + v)
    return into


def usage_of_sums(sums: Sums, *, exclude_writer: tuple[str, int] | None = None) -> dict[str, Any]:
    """The usage dict of per-writer sums, without ``exclude_writer``'s."""
    out = empty_usage()
    by_model: dict[str, list[int]] = {}
    failed = requests = reused = saved = 0
    for (writer, epoch, model), s in sums.items():
        if exclude_writer is not None and (writer, epoch) == exclude_writer:
            continue
        requests += s[6]
        if model == REQUESTS_MODEL:  # requests only: no model's usage
            continue
        if model.startswith(REUSED_PREFIX):  # answers read from the response store: nothing spent
            reused, saved = saturate(reused + s[0]), saturate(saved + s[4])
            continue
        m = by_model.setdefault(model, [0, 0, 0, 0, 0])
        for i in range(5):
            m[i] += s[i]
        failed += s[5]
    total = [0, 0, 0, 0, 0]
    for model in sorted(by_model):
        m = [saturate(v) for v in by_model[model]]
        out["by_model"][model] = {
            "calls": m[0],
            "input_tokens": m[1],
            "output_tokens": m[2],
            "cost_usd": m[4] / NANOS,
            "unpriced_calls": m[3],
        }
        total = [saturate(a + b) for a, b in zip(total, m)]
    out.update(
        calls=total[0],
        input_tokens=total[1],
        output_tokens=total[2],
        unpriced_calls=total[3],
        requests=saturate(requests),
        cost_usd=total[4] / NANOS,
        failed_attempts_cost_usd=saturate(failed) / NANOS,
        reused_calls=reused,
        saved_usd=saved / NANOS,
    )
    return out


def spend_of_sums(sums: Sums, *, exclude_writer: tuple[str, int] | None = None) -> tuple[int, int]:
    """(nano-dollars, tokens) of per-writer sums without ``exclude_writer``'s: what a budget compares."""
    nanos = tokens = 0
    for (writer, epoch, model), s in sums.items():
        if model.startswith(REUSED_PREFIX):
            continue
        if exclude_writer is None or (writer, epoch) != exclude_writer:
            nanos += s[4]
            tokens += s[1] + s[2]
    return saturate(nanos), saturate(tokens)


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
        calls = 0
        for e in record["usage"]:
            if e.get("reused") is True:  # no request: its calls are reused calls, its saving its nanos
                r = sums.setdefault((ev.writer_id, ev.writer_epoch, REUSED_PREFIX + e["model"]), [0] * 7)
                for i, key in enumerate(_COUNTS):
                    r[i] += bounded_count(e.get(key))
                r[4] += _nanos(e.get("saved_usd"))
                continue
            s = sums.setdefault((ev.writer_id, ev.writer_epoch, e["model"]), [0] * 7)
            nanos = _nanos(e.get("cost_usd"))
            for i, key in enumerate(_COUNTS):
                s[i] += bounded_count(e.get(key))
            s[4] += nanos
            if ev.event_type is EventType.FAILED:
                s[5] += nanos
            n = bounded_count(e.get("calls"))
            s[6] += n
            calls += n
        requests = _requests(record)
        if requests is not None:  # the attempt counted its requests: they replace its calls
            sums.setdefault((ev.writer_id, ev.writer_epoch, REQUESTS_MODEL), [0] * 7)[6] += requests - calls
    return {k: [saturate(v) for v in s] for k, s in sums.items()}


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
        entries = record["usage"]
        requests = _requests(record)
        if requests is None:
            requests = sum(bounded_count(e.get("calls")) for e in entries)
        # the attempt's requests (all its models') on each of its rows; one row without a model when
        # it sent requests but recorded no usage (every request failed)
        for e in entries or [{"model": None}]:
            cost = e.get("cost_usd")
            rows.append(
                {
                    "attempt": record.get("attempt"),
                    "step": ev.step,
                    "status": status,
                    "model": e["model"],
                    "input_tokens": bounded_count(e.get("input_tokens")),
                    "output_tokens": bounded_count(e.get("output_tokens")),
                    "cost_usd": None if cost is None else min(max(cost, 0.0), MAX_USD),
                    "calls": bounded_count(e.get("calls")),
                    "unpriced_calls": bounded_count(e.get("unpriced_calls")),
                    "requests": requests,
                    "item_id": ev.item_id,
                    **_batch_of(record),
                    **_reused_of(e),
                }
            )
    return rows


def _reused_of(entry: dict[str, Any]) -> dict[str, Any]:
    """``{"reused": True, "saved_usd"}`` of an entry of answers read from the response store, else ``{}``."""
    if entry.get("reused") is not True:
        return {}
    saved = entry.get("saved_usd")
    return {"reused": True, "saved_usd": None if saved is None else min(max(saved, 0.0), MAX_USD)}


def _batch_of(record: dict[str, Any]) -> dict[str, Any]:
    """``{"batch": True, "batch_id", "custom_id"}`` of an attempt that was a row of a provider's batch, else ``{}``."""
    if record.get("batch") is not True:
        return {}
    return {"batch": True, "batch_id": record.get("batch_id"), "custom_id": record.get("custom_id")}


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


def _entries(table: pa.Table) -> tuple[pa.StructArray, np.ndarray, np.ndarray]:
    """Every stored entry of ``table``'s rows, the row each came from, and each row's requests (NaN: none)."""
    data = _json_lines(table["value_json"])
    parsed = pa_json.read_json(
        io.BytesIO(data),
        read_options=pa_json.ReadOptions(block_size=max(1 << 20, len(data) // 8 + 1)),
        parse_options=pa_json.ParseOptions(explicit_schema=_PAYLOAD, unexpected_field_behavior="ignore"),
    )
    lists = parsed["usage"].combine_chunks()
    entries = pc.list_flatten(lists)
    parents = pc.list_parent_indices(lists).to_numpy(zero_copy_only=False)
    requests = parsed["requests"].combine_chunks().to_numpy(zero_copy_only=False).astype(np.float64)
    return entries, parents, requests


def usage_rows_mask(table: pa.Table) -> pa.ChunkedArray | pa.Array:
    """Which rows of ``table`` may carry usage (a STEP_COMPLETED or FAILED row with a value)."""
    keep = pc.is_in(table["event_type"], value_set=pa.array(USAGE_TYPES))
    # Only JSON objects naming "usage" (as the reference fold reads them): other values of these rows
    # (a failure's record without usage, any other JSON) are not parsed at all. Null values give null,
    # which a filter drops.
    value = table["value_json"]
    named = pc.or_(pc.match_substring(value, '"usage"'), pc.match_substring(value, '"requests"'))
    return pc.and_(keep, pc.and_(pc.starts_with(value, "{"), named))


#: the columns a usage projection groups by, and the sums of a :data:`Sums` list in order
GROUP_COLUMNS = ("writer_id", "writer_epoch", "model")
SUM_COLUMNS = (*_COUNTS, "nanos", "failed_nanos", "requests")
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
    entries, parents, row_requests = _entries(table)
    # entries of reused answers: grouped under REUSED_PREFIX + model, their saving as their nanos, no request
    reused = entries.field("reused").fill_null(False).to_numpy(zero_copy_only=False).astype(bool)
    cost = entries.field("cost_usd").fill_null(0.0).to_numpy(zero_copy_only=False)
    if reused.any():
        saved = entries.field("saved_usd").fill_null(0.0).to_numpy(zero_copy_only=False)
        cost = np.where(reused, saved, cost)
    nanos = np.rint(np.clip(cost, 0.0, MAX_USD) * NANOS).astype(np.int64)
    failed_rows = pc.equal(table["event_type"], EventType.FAILED.value).to_numpy(zero_copy_only=False)
    counts = {k: _bounded(entries.field(k)) for k in _COUNTS}
    sent_calls = np.where(reused, 0, counts["calls"])
    # an attempt that counted its requests: one more entry (REQUESTS_MODEL) with its requests beyond
    # its entries' calls, as the reference fold sums them
    counted = np.flatnonzero(~np.isnan(row_requests))
    row_calls = np.zeros(table.num_rows, np.int64)
    np.add.at(row_calls, parents, sent_calls)
    extra = _bounded_values(row_requests[counted]) - row_calls[counted]
    rows = np.concatenate([parents, counted]).astype(np.int64)
    zeros = np.zeros(len(counted), np.int64)
    parent_idx = pa.array(rows, pa.int64())
    models = entries.field("model").cast(pa.string())
    if reused.any():
        models = pc.if_else(pa.array(reused), pc.binary_join_element_wise(REUSED_PREFIX, models, ""), models)
    columns = {
        "writer_id": table["writer_id"].take(parent_idx),
        "writer_epoch": table["writer_epoch"].take(parent_idx).cast(pa.int64()),
        "model": pa.concat_arrays([models, pa.array([REQUESTS_MODEL] * len(counted), pa.string())]),
        **{k: pa.array(np.concatenate([v, zeros]), pa.int64()) for k, v in counts.items()},
        "nanos": pa.array(np.concatenate([nanos, zeros]), pa.int64()),
        "failed_nanos": pa.array(
            np.concatenate([np.where(failed_rows[parents] & ~reused, nanos, 0), zeros]), pa.int64()
        ),
        "requests": pa.array(np.concatenate([sent_calls, extra]), pa.int64()),
    }
    if "event_key" in table.column_names:
        columns["event_key"] = table["event_key"].take(parent_idx)
    return pa.table(columns)


def _bounded_values(values: np.ndarray) -> np.ndarray:
    """:func:`bounded_count` of float64 values (NaN: absent, 0)."""
    return np.clip(np.trunc(np.nan_to_num(values, nan=0.0)), 0, MAX_COUNT).astype(np.int64)


def _bounded(column: pa.Array) -> np.ndarray:
    return _bounded_values(column.to_numpy(zero_copy_only=False).astype(np.float64))


def sums_of_entries(entries: pa.Table) -> Sums:
    """Per-writer sums of :func:`entries_of_table`'s rows (grouped aggregates)."""
    if entries.num_rows == 0:
        return {}
    n = entries.num_rows
    # int64 sums wrap only when n times the largest value could pass SATURATED (a hostile older
    # log): then float sums tell which groups saturate (int64 arithmetic is exact modulo 2**64)
    risky = [k for k in SUM_COLUMNS if (pc.max(pc.abs(entries[k])).as_py() or 0) * n >= SATURATED]
    table = entries.select([*GROUP_COLUMNS, *SUM_COLUMNS])
    for k in risky:
        table = table.append_column(f"{k}_f", entries[k].cast(pa.float64(), safe=False))
    aggs = [(k, "sum") for k in SUM_COLUMNS] + [(f"{k}_f", "sum") for k in risky]
    grouped = table.group_by(list(GROUP_COLUMNS)).aggregate(aggs).to_pydict()

    def value(k: str, i: int) -> int:
        exact = int(grouped[f"{k}_sum"][i])
        if k in risky:
            approx = grouped[f"{k}_f_sum"][i]
            if abs(approx) > SATURATED:
                return SATURATED if approx > 0 else -SATURATED
        return saturate(exact)

    return {
        (w, int(e), m): [value(k, i) for k in SUM_COLUMNS]
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
