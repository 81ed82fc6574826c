"""The two read lenses of seed 000: the lifecycle fold (per item and vectorized) and the failure lens.

Folding is a pure function of the set of events, so it does not matter how often a batch was retried
(de-duplication by ``event_id``), how events of different items interleave, or in which order writers'
commits landed. Fencing is part of the fold: at one ``item_seq`` the event of the highest writer epoch
wins (ties broken by event id), and once an epoch has written for an item, events of lower epochs at
later sequences are stale and never change the folded state. Both are reported as violations.

The reference fold (:func:`fold_events`) is the readable definition; :func:`fold_table` computes the same
per-item summary for millions of events with numpy over Arrow columns, and a property test holds them
equal.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_datagen.core.events import Event, StepCoord
from airflow_provider_datagen.core.schema import EventType, ItemStatus

if TYPE_CHECKING:
    from collections.abc import Iterable

VIOLATION_CONFLICT = "conflict"
VIOLATION_STALE_EPOCH = "stale_epoch"
FENCING_ERROR_TYPE = "FencingViolation"

_MAX_31 = (1 << 31) - 1


@dataclass(frozen=True)
class Cursor:
    """Where an item's last checkpointed step ended, and under which processor version."""

    coord: StepCoord
    processor_version: str | None
    item_seq: int

    @property
    def step(self) -> str | None:
        return self.coord.step

    @property
    def iteration(self) -> int | None:
        return self.coord.iteration


@dataclass(frozen=True)
class Violation:
    """An event the fold refused: a second event at a taken sequence, or a stale epoch's late write."""

    item_id: str
    item_seq: int
    kind: str
    event_id: str
    event_type: str
    writer_id: str
    writer_epoch: int
    winner_event_id: str | None
    winner_epoch: int | None


@dataclass(frozen=True)
class FailureRecord:
    """One row of the failure lens: a FAILED event, or a fencing violation found by the fold."""

    item_id: str
    item_seq: int
    event_id: str
    error_type: str
    message: str
    traceback: str | None
    step: str | None
    coord: StepCoord
    writer_id: str
    epoch: int
    input_fingerprint: str | None = None
    dag_id: str | None = None
    run_id: str | None = None
    task_id: str | None = None
    map_index: int | None = None
    try_number: int | None = None
    created_at: Any = None


@dataclass
class ItemState:
    """The lifecycle lens of one item: the fold of its current generation of events."""

    item_id: str
    status: ItemStatus = ItemStatus.NEVER_STARTED
    fields: dict[str, Any] = field(default_factory=dict)
    field_modes: dict[str, str] = field(default_factory=dict)
    cursor: Cursor | None = None
    completed_steps: list[Cursor] = field(default_factory=list)
    open_frames: list[StepCoord] = field(default_factory=list)
    input_fingerprint: str | None = None
    processor_version: str | None = None
    created_seq: int | None = None
    terminal_seq: int | None = None
    filter_reason: Any = None
    last_seq: int = -1
    max_epoch: int = -1
    failures: int = 0
    violations: list[Violation] = field(default_factory=list)
    parent_item_id: str | None = None

    @property
    def is_done(self) -> bool:
        return self.status in (ItemStatus.COMPLETED, ItemStatus.FILTERED)


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


# --- vectorized fold ------------------------------------------------------------------------------

#: Columns of the per-item state table produced by both folds.
STATE_SCHEMA = pa.schema(
    [
        pa.field("item_id", pa.string()),
        pa.field("status", pa.string()),
        pa.field("input_fingerprint", pa.string()),
        pa.field("processor_version", pa.string()),
        pa.field("created_seq", pa.int64()),
        pa.field("last_seq", pa.int64()),
        pa.field("max_epoch", pa.int64()),
        pa.field("failures", pa.int64()),
        pa.field("violations", pa.int64()),
    ]
)

_TYPE_CODES = {t.value: i for i, t in enumerate(EventType)}
_CREATED = _TYPE_CODES[EventType.ITEM_CREATED.value]
_TERMINAL = _TYPE_CODES[EventType.TERMINAL.value]
_FAILED = _TYPE_CODES[EventType.FAILED.value]


def state_row(st: ItemState) -> dict[str, Any]:
    """The per-item summary row of :data:`STATE_SCHEMA` for a reference-folded state."""
    return {
        "item_id": st.item_id,
        "status": st.status.value,
        "input_fingerprint": st.input_fingerprint,
        "processor_version": st.processor_version,
        "created_seq": st.created_seq,
        "last_seq": st.last_seq,
        "max_epoch": st.max_epoch,
        "failures": st.failures,
        "violations": len(st.violations),
    }


def _type_codes(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    enc = pc.dictionary_encode(col)
    if isinstance(enc, pa.ChunkedArray):
        enc = enc.combine_chunks()
    lookup = np.array([_TYPE_CODES.get(v, -1) for v in enc.dictionary.to_pylist()], dtype=np.int8)
    return lookup[enc.indices.to_numpy(zero_copy_only=False)] if len(lookup) else np.zeros(0, np.int8)


def fold_table(events: pa.Table) -> pa.Table:
    """Vectorized lifecycle fold: one row per item (:data:`STATE_SCHEMA`) from light event columns.

    Needs ``item_id``, ``item_seq``, ``event_type``, ``status``, ``input_fingerprint``,
    ``processor_version``, ``writer_epoch`` and ``event_key``; never the blob column. The common case
    (no duplicate sequences) costs one integer argsort; duplicates and conflicts take a lexsort.
    """
    n = events.num_rows
    if n == 0:
        return STATE_SCHEMA.empty_table()
    ids_enc = pc.dictionary_encode(events["item_id"]).combine_chunks()
    dictionary = ids_enc.dictionary
    code = ids_enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    seq = events["item_seq"].to_numpy().astype(np.int64)
    epoch = events["writer_epoch"].to_numpy().astype(np.int64)
    ekey = events["event_key"].to_numpy().astype(np.int64)
    etype = _type_codes(events["event_type"])
    if seq.min(initial=0) < 0 or seq.max(initial=0) > _MAX_31 or epoch.max(initial=0) > _MAX_31:
        raise ValueError("item_seq and writer_epoch must be within [0, 2**31)")

    k1 = (code << 32) | seq
    order = np.argsort(k1, kind="stable")
    sk = k1[order]
    if n > 1 and bool(np.any(sk[1:] == sk[:-1])):
        # Rare path (retried batches, zombies, concurrent owners): drop exact duplicates keeping the
        # highest epoch, then order each sequence by (-epoch, event_key) so its first row wins.
        o1 = np.lexsort((-epoch, ekey, k1))
        same = np.zeros(n, dtype=bool)
        same[1:] = (k1[o1][1:] == k1[o1][:-1]) & (ekey[o1][1:] == ekey[o1][:-1])
        keep = o1[~same]
        # copies sort by falling epoch, so each copy group's minimum is its first writer's epoch
        first = np.minimum.reduceat(epoch[o1], np.flatnonzero(~same))
        o2 = np.lexsort((ekey[keep], -epoch[keep], k1[keep]))
        order = keep[o2]
        s_first = first[o2]
        sk = k1[order]
    else:
        s_first = epoch[order]
    m = len(order)
    s_code = code[order]
    s_epoch = epoch[order]
    first_in_seq = np.ones(m, dtype=bool)
    first_in_seq[1:] = sk[1:] != sk[:-1]

    # Items are contiguous in sorted order; per-item reductions use segment starts.
    item_start = np.ones(m, dtype=bool)
    item_start[1:] = s_code[1:] != s_code[:-1]
    seg = np.flatnonzero(item_start)
    item_codes = s_code[seg]
    # last_seq / max_epoch count every distinct row, including losers and stale ones.
    last_seq = np.maximum.reduceat(seq[order], seg)
    max_epoch = np.maximum.reduceat(s_epoch, seg)
    distinct_rows = np.add.reduceat(np.ones(m, dtype=np.int64), seg)

    # Fencing: the running max epoch per item over sequence order (code in the high bits keeps items
    # apart); a winner below it is stale.
    w = np.flatnonzero(first_in_seq)
    w_code = s_code[w]
    w_epoch = s_epoch[w]
    # an event raises the fence only to its first writer's epoch (copies claim nothing); a winner is valid
    # when its newest copy reaches the running fence (first <= newest, so the inclusive max works)
    fence = np.maximum.accumulate((w_code << 32) | s_first[w]) & 0xFFFFFFFF
    valid = w[w_epoch >= fence]
    valid_per_item = np.bincount(np.searchsorted(seg, valid, side="right") - 1, minlength=len(seg))
    violations = distinct_rows - valid_per_item

    rows = order[valid]
    v_code = code[rows]
    v_type = etype[rows]
    nv = len(rows)
    pos = np.arange(nv, dtype=np.int64)
    v_start = np.ones(nv, dtype=bool)
    v_start[1:] = v_code[1:] != v_code[:-1]
    vseg = np.flatnonzero(v_start)
    seg_of = np.cumsum(v_start) - 1
    # The current generation starts at the item's last ITEM_CREATED.
    created_ff = np.maximum.accumulate(np.where(v_type == _CREATED, pos, -1))
    last_created = np.maximum.reduceat(created_ff, vseg) if nv else np.zeros(0, np.int64)
    has_created = last_created >= vseg
    in_gen = has_created[seg_of] & (pos >= last_created[seg_of])
    big = np.int64(nv + 1)
    term_pos = np.where(in_gen & (v_type == _TERMINAL), pos, big)
    first_term = np.minimum.reduceat(term_pos, vseg)
    before_term = pos < first_term[seg_of]
    failures = np.add.reduceat((in_gen & before_term & (v_type == _FAILED)).astype(np.int64), vseg)

    n_items = len(vseg)
    status = np.full(n_items, ItemStatus.NEVER_STARTED.value, dtype=object)
    status[has_created] = ItemStatus.RUNNING.value
    terminated = has_created & (first_term < big)
    stored_status = events["status"]
    if terminated.any():
        term_rows = rows[first_term[terminated]]
        status[terminated] = pc.take(stored_status, pa.array(term_rows)).to_numpy(zero_copy_only=False)

    created_rows = rows[np.where(has_created, last_created, 0)]
    take_idx = pa.array(created_rows)
    mask = pa.array(~has_created)
    fp = pc.if_else(mask, pa.scalar(None, pa.string()), pc.take(events["input_fingerprint"], take_idx))
    pv = pc.if_else(mask, pa.scalar(None, pa.string()), pc.take(events["processor_version"], take_idx))
    cseq = pa.array(np.where(has_created, seq[created_rows], 0), mask=~has_created)

    assert np.array_equal(v_code[vseg], item_codes)
    return pa.table(
        {
            "item_id": pc.take(dictionary, pa.array(item_codes)),
            "status": pa.array(status, pa.string()),
            "input_fingerprint": fp,
            "processor_version": pv,
            "created_seq": cseq,
            "last_seq": pa.array(last_seq, pa.int64()),
            "max_epoch": pa.array(max_epoch, pa.int64()),
            "failures": pa.array(np.where(has_created, failures, 0), pa.int64()),
            "violations": pa.array(violations, pa.int64()),
        },
        schema=STATE_SCHEMA,
    )
