"""The reference fold: one item's events folded in plain Python, and the failure lens.

This is the readable definition of the lifecycle lens (see docs/design.md, Lenses). Folding is a pure
function of the set of events, so it does not matter how often a batch was retried (de-duplication by
``event_id``), how events of different items interleave, or in which order writers' commits landed.
Fencing is part of the fold: at one ``item_seq`` the event of the highest writer epoch wins (ties broken
by event id), and once an epoch has written for an item, events of lower epochs at later sequences are
stale and never change the folded state. Both are reported as violations. Only the current generation
of an item counts (see docs/design.md, Input versions and Processor versions).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from airflow_provider_datagen.core.events import Event, StepCoord
from airflow_provider_datagen.core.fold.state import (
    FENCING_ERROR_TYPE,
    VIOLATION_CONFLICT,
    VIOLATION_STALE_EPOCH,
    Cursor,
    FailureRecord,
    ItemState,
    Violation,
)
from airflow_provider_datagen.core.schema import STORED_STATUS_TRANSIENT, EventType, ItemStatus

if TYPE_CHECKING:
    from collections.abc import Iterable


def _copy_rank(ev: Event) -> tuple[int, str]:
    """Which copy of a retried event the read path keeps: the highest epoch, then the writer id.

    Copies share everything the fold reads; ranking them totally (not "first seen") keeps the
    violations and failure records a function of the set of events, whatever the scan order.
    """
    return (ev.writer_epoch, ev.writer_id)


def dedupe(events: Iterable[Event]) -> dict[str, Event]:
    """One copy per ``event_id``: the one of highest :func:`_copy_rank`."""
    by_id: dict[str, Event] = {}
    for ev in events:
        seen = by_id.get(ev.event_id)
        if seen is None or _copy_rank(ev) > _copy_rank(seen):
            by_id[ev.event_id] = ev
    return by_id


def _winners(events: Iterable[Event]) -> tuple[list[Event], list[Violation], int, int]:
    """De-duplicate, resolve conflicts per sequence and apply epoch fencing; returns applied events."""
    events = list(events)
    by_id = dedupe(events)
    # The first (lowest) epoch that wrote each event: an identical copy written later by a newer epoch
    # (a re-pull on a stale plan, a redone tail) claims nothing, so it never raises the fence.
    first_epoch: dict[str, int] = {}
    for ev in events:
        first_epoch[ev.event_id] = min(first_epoch.get(ev.event_id, ev.writer_epoch), ev.writer_epoch)
    ordered = sorted(by_id.values(), key=lambda e: (e.item_seq, -e.writer_epoch, e.event_key))
    applied: list[Event] = []
    violations: list[Violation] = []
    fence = -1
    last_seq = -1
    max_epoch = -1
    i = 0
    while i < len(ordered):
        winner = ordered[i]
        j = i + 1
        while j < len(ordered) and ordered[j].item_seq == winner.item_seq:
            j += 1
        group = ordered[i:j]
        last_seq = max(last_seq, winner.item_seq)
        max_epoch = max(max_epoch, *(e.writer_epoch for e in group))
        stale = winner.writer_epoch < fence
        for ev in group if stale else group[1:]:
            violations.append(
                Violation(
                    item_id=ev.item_id,
                    item_seq=ev.item_seq,
                    kind=VIOLATION_STALE_EPOCH if stale else VIOLATION_CONFLICT,
                    event_id=ev.event_id,
                    event_type=str(ev.event_type),
                    writer_id=ev.writer_id,
                    writer_epoch=ev.writer_epoch,
                    winner_event_id=None if stale else winner.event_id,
                    winner_epoch=fence if stale else winner.writer_epoch,
                )
            )
        if not stale:
            fence = max(fence, first_epoch[winner.event_id])
            applied.append(winner)
        i = j
    return applied, violations, last_seq, max_epoch


def fold_events(item_id: str, events: Iterable[Event], loader: Any = None) -> ItemState:
    """Fold one item's events (any order, any duplicates) into its lifecycle state.

    Only the current generation counts: an ITEM_CREATED (a new input fingerprint or a restart under a
    new processor version) starts the item afresh, so stale fields never leak into a new attempt.
    FAILED rows count failures but leave the status alone; nothing after a TERMINAL changes the item
    until the next ITEM_CREATED.
    """
    applied, violations, last_seq, max_epoch = _winners(ev for ev in events if ev.item_id == item_id)
    st = ItemState(item_id=item_id, last_seq=last_seq, max_epoch=max_epoch, violations=violations)
    open_frames: dict[tuple[Any, ...], StepCoord] = {}
    for ev in applied:
        et = ev.event_type
        if et is EventType.ITEM_CREATED:
            st.status = ItemStatus.RUNNING
            st.fields, st.field_modes = {}, {}
            st.cursor, st.completed_steps = None, []
            open_frames = {}
            st.input_fingerprint = ev.input_fingerprint
            st.processor_version = ev.processor_version
            st.created_seq = ev.item_seq
            st.terminal_seq = None
            st.filter_reason = None
            st.failures = 0
            st.retries = 0
            st.parent_item_id = ev.parent_item_id
            continue
        if st.status is not ItemStatus.RUNNING:
            continue
        if et is EventType.STEP_STARTED:
            open_frames[ev.coord.frame_key] = ev.coord
        elif et is EventType.STEP_COMPLETED:
            open_frames.pop(ev.coord.frame_key, None)
            st.cursor = Cursor(ev.coord, ev.processor_version, ev.item_seq)
            st.completed_steps.append(st.cursor)
        elif et is EventType.FIELD_SET:
            assert ev.field is not None
            st.fields[ev.field] = ev.value(loader)
            st.field_modes[ev.field] = "set"
        elif et is EventType.FIELD_APPEND:
            assert ev.field is not None
            if st.field_modes.get(ev.field) == "append":
                st.fields[ev.field].append(ev.value(loader))
            else:
                st.fields[ev.field] = [ev.value(loader)]
                st.field_modes[ev.field] = "append"
        elif et is EventType.FAILED:
            if ev.status == STORED_STATUS_TRANSIENT:
                st.retries += 1
            else:
                st.failures += 1
        elif et is EventType.TERMINAL:
            st.status = ItemStatus(ev.status)
            st.terminal_seq = ev.item_seq
            st.filter_reason = json.loads(ev.value_json) if ev.value_json else None
    st.open_frames = list(open_frames.values())
    return st


def failure_records(events: Iterable[Event], violations: Iterable[Violation] = ()) -> list[FailureRecord]:
    """The failure lens: FAILED rows (de-duplicated, in sequence order) plus fencing violations."""
    out: list[FailureRecord] = []
    violations = list(violations)
    # A FAILED row the fold refused (stale epoch, lost conflict) is reported once: as the violation.
    refused = {v.event_id for v in violations}
    failed = dedupe(ev for ev in events if ev.event_type is EventType.FAILED and ev.event_id not in refused).values()
    for ev in sorted(failed, key=lambda e: (e.item_id, e.item_seq, -e.writer_epoch, e.event_key)):
        attempt = _attempt_record(ev)
        out.append(
            FailureRecord(
                item_id=ev.item_id,
                item_seq=ev.item_seq,
                event_id=ev.event_id,
                error_type=ev.error_type or "Exception",
                message=ev.error_message or "",
                traceback=ev.error_traceback,
                step=ev.coord.step,
                coord=ev.coord,
                writer_id=ev.writer_id,
                epoch=ev.writer_epoch,
                input_fingerprint=ev.input_fingerprint,
                dag_id=ev.dag_id,
                run_id=ev.run_id,
                task_id=ev.task_id,
                map_index=ev.map_index,
                try_number=ev.try_number,
                created_at=ev.created_at,
                transient=ev.status == STORED_STATUS_TRANSIENT,
                attempt=attempt.get("attempt"),
                wait=attempt.get("wait"),
            )
        )
    for v in violations:
        if v.kind == VIOLATION_CONFLICT:
            msg = (
                f"writer {v.writer_id!r} (epoch {v.writer_epoch}) wrote a different {v.event_type} at "
                f"item_seq {v.item_seq}, already taken by event {v.winner_event_id} "
                f"(epoch {v.winner_epoch}); it was ignored. Two owners wrote this item at once: "
                "give each attempt a new epoch."
            )
        else:
            msg = (
                f"writer {v.writer_id!r} wrote {v.event_type} at item_seq {v.item_seq} with stale epoch "
                f"{v.writer_epoch} after epoch {v.winner_epoch} took ownership; it was ignored (a zombie "
                "attempt kept running after its successor started)."
            )
        out.append(
            FailureRecord(
                item_id=v.item_id,
                item_seq=v.item_seq,
                event_id=v.event_id,
                error_type=FENCING_ERROR_TYPE,
                message=msg,
                traceback=None,
                step=None,
                coord=StepCoord(),
                writer_id=v.writer_id,
                epoch=v.writer_epoch,
            )
        )
    return out


def _attempt_record(ev: Event) -> dict[str, Any]:
    """The ``{"attempt", "transient", "wait"}`` a FAILED row of a retry policy carries, else ``{}``."""
    if not ev.value_json:
        return {}
    try:
        record = json.loads(ev.value_json)
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}
