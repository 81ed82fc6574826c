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

if TYPE_CHECKING:
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
)


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
            attempt["errors"].append({"error_type": r["error_type"], "message": (r["error_message"] or "")[:500]})
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
        "items": items[:MAX_TI_ITEMS],
    }


def current_status(states: pa.Table, item_ids: list[str]) -> dict[str, str]:
    """The lifecycle status of each of ``item_ids`` in a folded state table (absent ids are left out)."""
    if not item_ids or not states.num_rows:
        return {}
    hit = states.filter(pc.is_in(states["item_id"], pa.array(item_ids, pa.string())))
    return dict(zip(hit["item_id"].to_pylist(), hit["status"].to_pylist()))
