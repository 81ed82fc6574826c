"""The task-instance tab's data: what one task instance (every try) wrote, item by item.

Which experiment a task instance belongs to is recorded only on its events (the Airflow coordinates
every row carries), so the tab is a filtered scan of a few light columns per experiment, grouped by
item and try. Never values or tracebacks: those are on the item page.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_datagen.core import EventType
from airflow_provider_datagen.core.chunks import chunk_label
from airflow_provider_datagen.core.ids import root_of
from airflow_provider_datagen.plugins.item_view import attempt_facts

if TYPE_CHECKING:
    from collections.abc import Iterable

    from airflow_provider_datagen.core import CheckpointLog

#: Items listed per experiment on the tab; the rest is counted.
MAX_TI_ITEMS = 2000

# Columns of the task-instance scan: what each attempt did, never values or tracebacks.
_TI_COLUMNS = (
    "event_id",
    "item_id",
    "item_seq",
    "event_type",
    "status",
    "step",
    "field",
    "try_number",
    "map_index",
    "writer_id",
    "writer_epoch",
    "error_type",
    "error_message",
    "created_at",
    # a FAILED row's retry facts (transient, attempt, wait): never values
    "status",
    "value_json",
)
# The Airflow coordinates of a task instance, as event columns.
_TI_KEY_COLUMNS = ("dag_id", "run_id", "task_id", "map_index")


class TaskInstanceKey(NamedTuple):
    """The Airflow coordinates of one task instance (all its tries)."""

    dag_id: str
    run_id: str
    task_id: str
    map_index: int


def scan_task_instance(event_log: CheckpointLog, ti: TaskInstanceKey) -> dict[str, Any]:
    """The events ``ti`` wrote to ``event_log``, summarized by :func:`summarize_ti_events`."""
    flt = (
        (pc.field("dag_id") == pa.scalar(ti.dag_id, pa.string()))
        & (pc.field("run_id") == pa.scalar(ti.run_id, pa.string()))
        & (pc.field("task_id") == pa.scalar(ti.task_id, pa.string()))
    )
    # An unmapped task is map index -1; writers outside a mapped task may leave the column null.
    mflt = pc.field("map_index") == pa.scalar(ti.map_index, pa.int64())
    if ti.map_index == -1:
        mflt = mflt | pc.field("map_index").is_null()
    table = event_log.scan(list(_TI_COLUMNS), flt & mflt)
    return summarize_ti_events(event_log.pipeline, event_log.experiment, table)


def key_range(rows: Iterable[tuple[str, Any]]) -> str:
    """A chunk's label from the ``(item_id, created_at)`` rows its task wrote: its key range.

    The map operator labels a map index by its chunk's key range (``core.chunks.chunk_label``), but a
    task killed before it finished may never have had that label stored in Airflow; the items its
    events name give the same range, ordered by when each was first written (the chunk's order).
    """
    first: dict[str, Any] = {}
    for item_id, created_at in rows:
        root = root_of(item_id)
        if root not in first or (created_at is not None and (first[root] is None or created_at < first[root])):
            first[root] = created_at
    # stable: roots first written at the same time keep the order the log holds them in
    ordered = sorted(first, key=lambda root: (first[root] is None, first[root] or 0))
    return chunk_label(ordered)


def key_ranges(event_log: CheckpointLog, tis: Iterable[TaskInstanceKey]) -> dict[TaskInstanceKey, str]:
    """The key range (:func:`key_range`) of each of ``tis`` (mapped task instances) in ``event_log``."""
    wanted = {ti for ti in tis if ti.map_index is not None and ti.map_index >= 0}
    if not wanted:
        return {}
    flt = None
    for column in _TI_KEY_COLUMNS:
        values = sorted({getattr(ti, column) for ti in wanted})
        part = pc.field(column).isin(values)
        flt = part if flt is None else flt & part
    table = event_log.scan(["item_id", "created_at", *_TI_KEY_COLUMNS], flt)
    if not table.num_rows:
        return {}
    roots = pc.list_element(pc.split_pattern(table["item_id"], "/", max_splits=1), 0)
    table = table.append_column("root", roots).drop_columns(["item_id"])
    # one row per (task instance, root item), in the order the groups first appear (the log's order)
    firsts = table.group_by([*_TI_KEY_COLUMNS, "root"], use_threads=False).aggregate([("created_at", "min")])
    per_ti: dict[TaskInstanceKey, list[tuple[str, Any]]] = {}
    for r in firsts.to_pylist():
        ti = TaskInstanceKey(r["dag_id"], r["run_id"], r["task_id"], r["map_index"])
        if ti in wanted:
            per_ti.setdefault(ti, []).append((r["root"], r["created_at_min"]))
    return {ti: key_range(rows) for ti, rows in per_ti.items()}


def _new_attempt(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "try_number": row["try_number"],
        "events": 0,
        "by_type": {},
        "steps_completed": [],
        "fields": [],
        "terminal": None,
        "errors": [],
        "writer_id": row["writer_id"],
        "writer_epoch": row["writer_epoch"],
        "first_seq": row["item_seq"],
        "last_seq": row["item_seq"],
    }


def summarize_ti_events(pipeline: str, experiment: str, table: pa.Table) -> dict[str, Any]:
    """Group a task instance's events by item and try: counts by type, terminal status, failures."""
    rows = table.to_pylist()
    label = key_range((r["item_id"], r["created_at"]) for r in rows) if rows else None
    seen: set[str] = set()
    per_item: dict[str, dict[int | None, dict[str, Any]]] = {}
    tries: set[int | None] = set()
    for r in sorted(rows, key=lambda r: (r["item_id"], r["try_number"] or 0, r["item_seq"])):
        if r["event_id"] in seen:  # a retried batch landed twice: the fold counts it once, so do we
            continue
        seen.add(r["event_id"])
        tries.add(r["try_number"])
        attempts = per_item.setdefault(r["item_id"], {})
        attempt = attempts.get(r["try_number"])
        if attempt is None:
            attempt = attempts[r["try_number"]] = _new_attempt(r)
        attempt["events"] += 1
        et = r["event_type"]
        attempt["by_type"][et] = attempt["by_type"].get(et, 0) + 1
        attempt["last_seq"] = max(attempt["last_seq"], r["item_seq"])
        attempt["first_seq"] = min(attempt["first_seq"], r["item_seq"])
        if et == EventType.STEP_COMPLETED.value and r["step"]:
            attempt["steps_completed"].append(r["step"])
        elif et in (EventType.FIELD_SET.value, EventType.FIELD_APPEND.value) and r["field"]:
            if r["field"] not in attempt["fields"]:
                attempt["fields"].append(r["field"])
        elif et == EventType.TERMINAL.value:
            attempt["terminal"] = r["status"]
        elif et == EventType.FAILED.value:
            # A transient row is an attempt the retry policy retried in place: not a failure of the try.
            attempt["errors"].append(
                {"error_type": r["error_type"], "message": (r["error_message"] or "")[:500]}
                | attempt_facts(r["status"], r["value_json"])
            )
    items = [
        {"item_id": iid, "attempts": [per_item[iid][t] for t in sorted(per_item[iid], key=lambda t: t or 0)]}
        for iid in sorted(per_item)
    ]
    return {
        "pipeline": pipeline,
        "experiment": experiment,
        "tries": sorted(tries, key=lambda t: t or 0),
        "events_total": len(seen),
        "items_total": len(items),
        "label": label,
        "items": items[:MAX_TI_ITEMS],
    }


def current_status(states: pa.Table, item_ids: list[str]) -> dict[str, str]:
    """The lifecycle status of each of ``item_ids`` in a folded state table (absent ids are left out)."""
    if not item_ids or not states.num_rows:
        return {}
    hit = states.filter(pc.is_in(states["item_id"], pa.array(item_ids, pa.string())))
    return dict(zip(hit["item_id"].to_pylist(), hit["status"].to_pylist()))
