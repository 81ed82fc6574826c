"""The item page's data: an item's trajectory, folded state, failures, fan-out children and versions.

Built from the item's subtree of events (one read of the log); everything returned is a plain
JSON-able dict so the HTML page and its ``/api`` twin show the same facts. Blob values are never
loaded here: they appear as references the page turns into download links.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from typing import TYPE_CHECKING, Any

from airflow_provider_datagen.core import BlobRef, EventType, ItemStatus, fold_events
from airflow_provider_datagen.core.events import decode_source_json, fingerprint_of
from airflow_provider_datagen.core.fold import failure_records
from airflow_provider_datagen.core.ids import parent_of, root_of
from airflow_provider_datagen.core.next_run import source_input
from airflow_provider_datagen.core.schema import STORED_STATUS_TRANSIENT
from airflow_provider_datagen.core.store.snapshots import snapshot_texts
from airflow_provider_datagen.core.store.source_ref import PATH
from airflow_provider_datagen.exceptions import NotFoundError
from airflow_provider_datagen.plugins.exchange_view import logged_exchanges

if TYPE_CHECKING:
    from airflow_provider_datagen.core import CheckpointLog, Event, FailureRecord
    from airflow_provider_datagen.core.store.source_ref import SourceRef

logger = logging.getLogger(__name__)

#: Fan-out children listed on an item's page; the rest is counted.
MAX_CHILDREN = 500
_VALUE_PREVIEW = 300
#: The item-level rule for the pages' "resolved" mark: once an item is completed or filtered, every
#: failure it recorded before (by an earlier attempt, or an earlier input version) is resolved.
RESOLVED_STATUSES = frozenset({ItemStatus.COMPLETED.value, ItemStatus.FILTERED.value})


def iso(value: Any) -> str | None:
    """A timestamp as ISO text (``None`` stays ``None``)."""
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        return value.isoformat()
    return str(value)


def _preview(value: Any) -> tuple[str, bool]:
    """Compact JSON text of a value and whether it was cut for the trajectory table."""
    text = json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
    if len(text) > _VALUE_PREVIEW:
        return text[:_VALUE_PREVIEW] + "…", True
    return text, False


def failure_dict(rec: FailureRecord, *, with_traceback: bool) -> dict[str, Any]:
    """One FAILED row of the failure lens as a dict (the traceback only where a page shows it)."""
    out = {
        "item_id": rec.item_id,
        "item_seq": rec.item_seq,
        "event_id": rec.event_id,
        "error_type": rec.error_type,
        "message": rec.message,
        "step": rec.step,
        "iteration": rec.coord.iteration,
        "fanout_index": rec.coord.fanout_index,
        "writer_id": rec.writer_id,
        "writer_epoch": rec.epoch,
        "input_fingerprint": rec.input_fingerprint,
        "dag_id": rec.dag_id,
        "run_id": rec.run_id,
        "task_id": rec.task_id,
        "map_index": rec.map_index,
        "try_number": rec.try_number,
        "created_at": iso(rec.created_at),
        "transient": rec.transient,
        "attempt": rec.attempt,
        "wait": rec.wait,
    }
    if with_traceback:
        out["traceback"] = rec.traceback
    return out


def attempt_facts(status: str | None, value_json: str | None) -> dict[str, Any]:
    """A FAILED row's retry facts from its stored columns: ``transient``, ``attempt`` and ``wait``.

    What :class:`~airflow_provider_datagen.core.FailureRecord` carries, for pages that scan FAILED rows
    without folding them (a row written without a retry policy has neither attempt nor wait).
    """
    record: Any = None
    if value_json:
        try:
            record = json.loads(value_json)
        except ValueError:
            record = None
    if not isinstance(record, dict):
        record = {}
    return {
        "transient": status == STORED_STATUS_TRANSIENT,
        "attempt": record.get("attempt"),
        "wait": record.get("wait"),
    }


def field_value(value: Any) -> Any:
    """A folded field value with blob references replaced by ``{"blob": {event_id, kind, size}}``."""
    if isinstance(value, BlobRef):
        return {"blob": {"event_id": value.event_id, "kind": value.kind, "size": value.size}}
    if isinstance(value, list) and any(isinstance(v, BlobRef) for v in value):
        return [field_value(v) for v in value]
    return value


def event_dict(ev: Event, rejected: str | None) -> dict[str, Any]:
    """One trajectory row: the event's coordinates, a value preview or blob reference, who wrote it."""
    value: Any = None
    blob = None
    cut = False
    if ev.value_kind is not None:
        if ev.value_json is not None:
            value, cut = _preview(json.loads(ev.value_json))
        else:
            blob = {"event_id": ev.event_id, "kind": ev.value_kind, "size": ev.value_size}
    c = ev.coord
    return {
        "event_id": ev.event_id,
        "item_seq": ev.item_seq,
        "event_type": ev.event_type.value,
        "status": ev.status,
        "step_kind": c.step_kind,
        "step": c.step,
        "enclosing_step": c.enclosing_step,
        "selector_step": c.selector_step,
        "iteration": c.iteration,
        "fanout_index": c.fanout_index,
        "field": ev.field,
        "value_preview": value,
        "value_cut": cut,
        "blob": blob,
        "input_fingerprint": ev.input_fingerprint,
        "processor_version": ev.processor_version,
        "writer_id": ev.writer_id,
        "writer_epoch": ev.writer_epoch,
        "error_type": ev.error_type,
        "error_message": ev.error_message,
        "dag_id": ev.dag_id,
        "run_id": ev.run_id,
        "task_id": ev.task_id,
        "map_index": ev.map_index,
        "try_number": ev.try_number,
        "created_at": iso(ev.created_at),
        "rejected": rejected,
    }


def _children(item_id: str, subtree: list[Event]) -> tuple[list[dict[str, Any]], int]:
    prefix = item_id + "/"
    by_child: dict[str, list[Event]] = {}
    for ev in subtree:
        if ev.item_id.startswith(prefix):
            by_child.setdefault(ev.item_id, []).append(ev)
    children = []
    for cid in sorted(by_child)[:MAX_CHILDREN]:
        cst = fold_events(cid, by_child[cid])
        children.append(
            {
                "item_id": cid,
                "depth": cid.count("/") - item_id.count("/"),
                "status": cst.status.value,
                "failures": cst.failures,
                "last_seq": cst.last_seq,
            }
        )
    return children, len(by_child)


def item_input(
    event_log: CheckpointLog,
    item_id: str,
    fingerprint: str | None,
    source: SourceRef | None = None,
    storage_options: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The item's input as generated: a stored or recorded source row whose fingerprint is the item's.

    The log keeps only input fingerprints (as ``export_results(include_input=True)`` says). A plan over
    an inline source stores that source beside the log; a plan over a path source records the path
    (``core/store/source_ref.py``), and the one row is read back from there by its key. A row is shown
    only if it digests to the item's current fingerprint, so an edited source never passes for the
    input the fields were generated from; ``message`` says why nothing is shown when a source was
    recorded (the item is gone from it, its row changed, or the source cannot be read).
    """
    none: dict[str, Any] = {"found": False, "value": None, "from": None, "message": None}
    if fingerprint is None or parent_of(item_id) is not None:
        return none
    for text in snapshot_texts(event_log.uri, item_id, event_log.storage_options, source):
        data = decode_source_json(text)
        if fingerprint_of(data) == fingerprint:
            return {"found": True, "value": _jsonable(data), "from": "source snapshot", "message": None}
    if source is None or source.kind != PATH:
        return none
    try:
        got = source_input(source, item_id, fingerprint, storage_options)
    except Exception as exc:  # gone, no credentials, a changed schema: the page still shows
        logger.warning("item page: the recorded source %s cannot be read: %s", source.uri, exc)
        return {
            **none,
            "message": f"the source {source.uri} cannot be read now ({type(exc).__name__}: {str(exc)[:300]})",
        }
    if got["found"]:
        return {"found": True, "value": _jsonable(got["value"]), "from": f"source {source.uri}", "message": None}
    if got["problem"] == "gone":
        return {**none, "message": f"the source {source.uri} no longer holds this item (its key is gone)"}
    return {
        **none,
        "message": f"the item's row in {source.uri} has changed since (it now digests to {got['fingerprint']}): "
        "a rerun regenerates it",
    }


def _jsonable(data: Any) -> Any:
    # JSON-able for the API twin (a tagged source may hold datetimes, Decimals, bytes)
    return json.loads(json.dumps(data, default=str))


def item_data(
    event_log: CheckpointLog,
    version: int,
    item_id: str,
    source: SourceRef | None = None,
    storage_options: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Everything the item page shows, from one read of the item's root subtree (and the item's source row)."""
    pipeline, experiment = event_log.pipeline, event_log.experiment
    subtree = event_log.subtree(root_of(item_id))
    mine = [ev for ev in subtree if ev.item_id == item_id]
    if not mine:
        raise NotFoundError(
            f"no item {item_id!r} in {pipeline}/{experiment}: the log has no event for it "
            "(item ids are the escaped source keys; search the experiment page by substring)"
        )
    state = fold_events(item_id, mine, event_log.load_blob)
    rejected = {v.event_id: v.kind for v in state.violations}
    children, children_total = _children(item_id, subtree)
    versions = [
        {
            "item_seq": ev.item_seq,
            "event_id": ev.event_id,
            "input_fingerprint": ev.input_fingerprint,
            "processor_version": ev.processor_version,
            "current": ev.item_seq == state.created_seq,
            "writer_id": ev.writer_id,
            "writer_epoch": ev.writer_epoch,
            "dag_id": ev.dag_id,
            "run_id": ev.run_id,
            "task_id": ev.task_id,
            "map_index": ev.map_index,
            "try_number": ev.try_number,
            "created_at": iso(ev.created_at),
        }
        for ev in mine
        if ev.event_type is EventType.ITEM_CREATED
    ]
    cursor = state.cursor
    return {
        "pipeline": pipeline,
        "experiment": experiment,
        "log_version": version,
        "item_id": item_id,
        "root_item_id": root_of(item_id),
        "parent_item_id": parent_of(item_id),
        "state": {
            "status": state.status.value,
            "input_fingerprint": state.input_fingerprint,
            "processor_version": state.processor_version,
            "cursor": None
            if cursor is None
            else {
                "step": cursor.step,
                "iteration": cursor.iteration,
                "processor_version": cursor.processor_version,
                "item_seq": cursor.item_seq,
            },
            "open_frames": [
                {"step": f.step, "enclosing_step": f.enclosing_step, "iteration": f.iteration}
                for f in state.open_frames
            ],
            "created_seq": state.created_seq,
            "terminal_seq": state.terminal_seq,
            "filter_reason": state.filter_reason,
            "last_seq": state.last_seq,
            "max_epoch": state.max_epoch,
            "failures": state.failures,
            "violations": len(state.violations),
        },
        "input": item_input(event_log, item_id, state.input_fingerprint, source, storage_options),
        "fields": {name: field_value(value) for name, value in state.fields.items()},
        "failures": [
            {**failure_dict(r, with_traceback=True), "resolved": state.status.value in RESOLVED_STATUSES}
            for r in failure_records(mine, state.violations)
        ],
        "children": children,
        "children_total": children_total,
        "input_versions": versions,
        "events": [event_dict(ev, rejected.get(ev.event_id)) for ev in mine],
        # the requests its attempts made, by key: the reader looks them up in the response store
        "logged_exchanges": logged_exchanges(mine),
    }
