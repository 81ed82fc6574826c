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

import concurrent.futures
import json
import threading
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


def _ints(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """A light integer column as int64 (one copy at most: ``astype`` would copy an int64 column again)."""
    return np.asarray(col.to_numpy(), dtype=np.int64)


def _mask(col: pa.ChunkedArray | pa.Array, value: str) -> np.ndarray:
    return np.asarray(pc.equal(col, value).fill_null(False).to_numpy(zero_copy_only=False), dtype=bool)


class MisalignedStreamsError(ValueError):
    """The two streams of :func:`fold_batches` did not list the same number of rows."""


# Row types that steer the fold; every other event type only counts towards last_seq / max_epoch.
_CREATED, _TERMINAL, _FAILED = 1, 2, 3


class _Compacted:
    """The light columns of a stream of event batches, reduced batch by batch to what the fold needs.

    Holding whole string columns made a cold fold of 5M events peak at about 1.2 GB above the
    source. Per row the fold needs only numbers (an item code, sequence, epoch, event key and a
    type code); the strings it reads are the fingerprint and processor version of ``ITEM_CREATED``
    rows and the status of ``TERMINAL`` rows, a fifth of the log. So each batch is reduced to those
    as it arrives and dropped; item ids are kept only at run heads (an ack commit writes an item's
    events side by side) and hashed once, after the scan.
    """

    def __init__(self) -> None:
        self.rows = 0  # rows reduced by add_rest
        self.id_rows = 0  # rows reduced by add_ids
        self.head_ids: list[pa.Array] = []
        self.head_pos: list[np.ndarray] = []
        self.seq: list[np.ndarray] = []
        self.epoch: list[np.ndarray] = []
        self.ekey: list[np.ndarray] = []
        self.kind: list[np.ndarray] = []
        self.created_fp: list[pa.Array] = []
        self.created_pv: list[pa.Array] = []
        self.terminal_status: list[pa.Array] = []
        self.hashed: tuple[np.ndarray, np.ndarray, pa.Array] | None = None

    def add(self, batch: pa.RecordBatch | pa.Table) -> None:
        self.add_ids(batch)
        self.add_rest(batch)

    def add_ids(self, batch: pa.RecordBatch | pa.Table) -> None:
        n = batch.num_rows
        if n == 0:
            return
        ids = _flat(batch.column("item_id"))
        change = np.ones(n, dtype=bool)
        if n > 1:
            same = pc.equal(ids.slice(1), ids.slice(0, n - 1)).fill_null(False)
            change[1:] = ~np.asarray(same.to_numpy(zero_copy_only=False), dtype=bool)
        heads = np.flatnonzero(change)
        self.head_ids.append(ids if len(heads) == n else ids.take(pa.array(heads)))
        self.head_pos.append(heads + self.id_rows)
        self.id_rows += n

    def add_rest(self, batch: pa.RecordBatch | pa.Table) -> None:
        n = batch.num_rows
        if n == 0:
            return
        seq = _ints(batch.column("item_seq"))
        epoch = _ints(batch.column("writer_epoch"))
        if seq.min(initial=0) < 0 or seq.max(initial=0) > _MAX_31 or epoch.max(initial=0) > _MAX_31:
            raise ValueError("item_seq and writer_epoch must be within [0, 2**31)")
        self.seq.append(seq.astype(np.int32))
        self.epoch.append(epoch.astype(np.int32))
        # a copy: a view would keep the scan's whole decoded buffer alive (measured: 400 MB per 5M events)
        self.ekey.append(_ints(batch.column("event_key")).copy())
        etype = batch.column("event_type")
        created = _mask(etype, EventType.ITEM_CREATED.value)
        terminal = _mask(etype, EventType.TERMINAL.value)
        kind = np.zeros(n, dtype=np.int8)
        kind[created] = _CREATED
        kind[terminal] = _TERMINAL
        kind[_mask(etype, EventType.FAILED.value)] = _FAILED
        self.kind.append(kind)
        taken = pa.array(np.flatnonzero(created))
        self.created_fp.append(_flat(batch.column("input_fingerprint").take(taken)))
        self.created_pv.append(_flat(batch.column("processor_version").take(taken)))
        self.terminal_status.append(_flat(batch.column("status").take(pa.array(np.flatnonzero(terminal)))))
        self.rows += n

    def hash_ids(self, ids: pa.Array | None) -> None:
        """Give every run head an item code; with ``ids`` (unique ids, e.g. a source's), code ``i`` is ``ids[i]``.

        The fold's rows then line up with the source, and the planner's own id lookup disappears. Ids
        not in ``ids`` get codes from ``len(ids)`` on. Only run heads are hashed, once, after the scan
        of the ids (possibly while the other columns are still being reduced).
        """
        if not self.head_ids:
            empty = np.zeros(0, np.int64)
            self.hashed = (empty, empty, pa.array([], pa.string()) if ids is None else ids)
            return
        head_ids = pa.concat_arrays([a.cast(pa.string()) for a in self.head_ids])
        heads = np.concatenate(self.head_pos)
        self.head_ids, self.head_pos = [], []
        if ids is None:
            enc = pc.dictionary_encode(head_ids)
            head_codes = _ints(enc.indices)
            dictionary = enc.dictionary
        else:
            head_codes = _ints(pc.index_in(head_ids, value_set=ids).fill_null(-1))
            miss = head_codes < 0
            dictionary = ids
            if miss.any():
                enc = pc.dictionary_encode(head_ids.filter(pa.array(miss)))
                head_codes[miss] = len(ids) + _ints(enc.indices)
                dictionary = pa.concat_arrays([ids.cast(pa.string()), enc.dictionary.cast(pa.string())])
        self.hashed = (head_codes, heads, dictionary)

    def keys(self, ids: pa.Array | None) -> tuple[np.ndarray, pa.Array]:
        """Per row its item's code shifted left by 32 (the caller adds ``item_seq``); and each code's id."""
        if self.id_rows != self.rows:
            raise MisalignedStreamsError(f"item ids: {self.id_rows} rows, the other columns: {self.rows}")
        if self.hashed is None:
            self.hash_ids(ids)
        assert self.hashed is not None
        head_codes, heads, dictionary = self.hashed
        self.hashed = None
        head_codes <<= 32
        if len(heads) == self.rows:
            return head_codes, dictionary
        # the codes are shifted while still one per run: one full-length allocation
        return np.repeat(head_codes, np.diff(np.append(heads, self.rows))), dictionary


def _flat(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def fold_table(events: pa.Table) -> pa.Table:
    """Vectorized lifecycle fold: one row per item (:data:`STATE_SCHEMA`) from light event columns.

    Needs ``item_id``, ``item_seq``, ``event_type``, ``status``, ``input_fingerprint``,
    ``processor_version``, ``writer_epoch`` and ``event_key``; never the blob column. The common case
    (no duplicate sequences) costs one integer argsort; duplicates and conflicts take a lexsort.
    """
    return fold_batches(events.to_batches())[0]


def fold_batches(
    batches: Iterable[pa.RecordBatch | pa.Table],
    ids: pa.Array | None = None,
    *,
    other: Iterable[pa.RecordBatch | pa.Table] | None = None,
) -> tuple[pa.Table, np.ndarray | None]:
    """:func:`fold_table` over a stream of light-column batches, never holding the whole stream.

    Each batch is reduced to numbers as it arrives (:class:`_Compacted`), so a scan of millions of
    events costs a fraction of their columns' memory. With ``ids`` (unique), also each id's row in
    the result, or -1 when it has no events: the planner's form, which folds and matches the
    source's ids in one hashing pass.

    ``other``: the same rows' other columns as a second stream (then ``batches`` needs only
    ``item_id``). It is reduced on a worker thread, so hashing the ids (a third of the fold) runs
    while the wider columns are still being read; the two streams must list the same rows in order.
    """
    acc = _Compacted()
    if other is None:
        for batch in batches:
            acc.add(batch)
    else:
        stop = threading.Event()

        def reduce_other() -> None:
            for part in other:
                if stop.is_set():
                    return
                acc.add_rest(part)

        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="datagen-fold") as pool:
            rest = pool.submit(reduce_other)
            try:
                for batch in batches:
                    acc.add_ids(batch)
                acc.hash_ids(ids)
            except BaseException:
                stop.set()
                raise
            rest.result()
    table, codes = _fold(acc, ids)
    return table, None if ids is None else _index_of(codes, len(ids))


def _index_of(codes: np.ndarray, n: int) -> np.ndarray:
    index = np.full(n, -1, dtype=np.int64)
    mine = codes < n
    index[codes[mine]] = np.flatnonzero(mine)
    return index


def _sparse_take(values: list[pa.Array], idx: np.ndarray, present: np.ndarray) -> pa.Array:
    """``values`` (one list, in scan order) at ``idx`` where ``present``, null elsewhere."""
    if not present.any():
        return pa.nulls(len(idx), pa.string())
    flat = pa.concat_arrays([v.cast(pa.string()) for v in values])
    # masked slots still get an in-range index
    return pc.take(flat, pa.array(np.where(present, idx, 0), mask=~present))


def _fold(acc: _Compacted, ids: pa.Array | None) -> tuple[pa.Table, np.ndarray]:
    """The vectorized fold over compacted rows; returns the state table and each state row's item code."""
    n = acc.rows
    if n == 0:
        return STATE_SCHEMA.empty_table(), np.zeros(0, np.int64)
    k1, dictionary = acc.keys(ids)
    seq = np.concatenate(acc.seq)
    acc.seq = []
    k1 |= seq
    kind = np.concatenate(acc.kind)
    acc.kind = []
    epoch = np.concatenate(acc.epoch)
    acc.epoch = []

    # A log written item by item is often in order already: then no sort and no gathers.
    ordered = n < 2 or bool(np.all(k1[1:] > k1[:-1]))
    order = np.arange(n) if ordered else np.argsort(k1, kind="stable")
    sk = k1 if ordered else k1[order]
    if not ordered and bool(np.any(sk[1:] == sk[:-1])):
        # Rare path (retried batches, zombies, concurrent owners): drop exact duplicates keeping the
        # highest epoch, then order each sequence by (-epoch, event_key) so its first row wins.
        ekey = np.concatenate(acc.ekey)
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
        del ekey
    else:
        s_first = None
    acc.ekey = []
    del k1
    m = len(order)
    s_code = sk >> 32
    s_epoch = epoch if ordered else epoch[order]
    if s_first is None:
        s_first = s_epoch
    first_in_seq = np.ones(m, dtype=bool)
    first_in_seq[1:] = sk[1:] != sk[:-1]

    # Items are contiguous in sorted order; per-item reductions use segment starts.
    item_start = np.ones(m, dtype=bool)
    item_start[1:] = s_code[1:] != s_code[:-1]
    seg = np.flatnonzero(item_start)
    codes_of_items = s_code[seg]
    # last_seq / max_epoch count every distinct row, including losers and stale ones (an item's
    # code fills the high bits of its keys, so their maximum carries its highest sequence).
    last_seq = np.maximum.reduceat(sk, seg) & 0xFFFFFFFF
    del sk
    max_epoch = np.maximum.reduceat(s_epoch, seg)
    distinct_rows = np.diff(np.append(seg, m))

    # Fencing: the running max epoch per item over sequence order (code in the high bits keeps items
    # apart); a winner below it is stale.
    w = np.flatnonzero(first_in_seq)
    # an event raises the fence only to its first writer's epoch (copies claim nothing); a winner is valid
    # when its newest copy reaches the running fence (first <= newest, so the inclusive max works)
    if s_first is s_epoch and len(w) == m and bool(np.all((s_epoch[1:] >= s_epoch[:-1]) | item_start[1:])):
        # No copies and no epoch ever falls within an item (the usual log): nothing can be stale.
        valid = w
    else:
        w_code = s_code[w]
        fence = np.maximum.accumulate((w_code << 32) | s_first[w]) & 0xFFFFFFFF
        valid = w[s_epoch[w] >= fence]
    if len(valid) == m:
        violations = np.zeros(len(seg), dtype=np.int64)
    else:
        is_valid = np.zeros(m, dtype=np.int64)
        is_valid[valid] = 1
        violations = distinct_rows - np.add.reduceat(is_valid, seg)

    if len(valid) == m:
        rows = order  # every row applies (the usual log): no 5M-row gathers
    else:
        rows = order[valid]
        seg = np.searchsorted(valid, seg)  # each item's first row among the valid ones
    del order, s_code, s_epoch, s_first, first_in_seq
    n_items = len(seg)
    nv = len(rows)

    # The generation logic runs over the sparse rows that matter (ITEM_CREATED, TERMINAL, FAILED: a
    # fraction of the log) instead of full-length passes per type. Positions index the applied rows in
    # (item, sequence) order; an item's rows are seg[i] .. seg[i + 1] - 1.
    row_kind = kind[rows]
    # each row's place among the kept strings of its type (they were kept in scan order)
    created_rank = np.cumsum(kind == _CREATED, dtype=np.int32) - 1
    terminal_rank = np.cumsum(kind == _TERMINAL, dtype=np.int32) - 1
    del kind

    def where(value: int) -> tuple[np.ndarray, np.ndarray]:
        at = np.flatnonzero(row_kind == value)
        return at, np.searchsorted(seg, at, side="right") - 1

    # The current generation starts at the item's last ITEM_CREATED; it ends at its first TERMINAL.
    c_at, c_item = where(_CREATED)
    last = np.append(c_item[1:] != c_item[:-1], True) if len(c_item) else np.zeros(0, dtype=bool)
    last_created = np.full(n_items, -1, dtype=np.int64)
    last_created[c_item[last]] = c_at[last]
    has_created = last_created >= 0
    big = np.int64(nv + 1)
    t_at, t_item = where(_TERMINAL)
    keep = t_at > last_created[t_item]
    t_at, t_item = t_at[keep], t_item[keep]
    first = np.insert(t_item[1:] != t_item[:-1], 0, True) if len(t_item) else np.zeros(0, dtype=bool)
    first_term = np.full(n_items, big, dtype=np.int64)
    first_term[t_item[first]] = t_at[first]
    f_at, f_item = where(_FAILED)
    counted = (f_at > last_created[f_item]) & (f_at < first_term[f_item])
    failures = np.bincount(f_item[counted], minlength=n_items).astype(np.int64)
    del c_at, c_item, t_at, t_item, f_at, f_item

    terminated = has_created & (first_term < big)
    # The stored status of each item's first TERMINAL; the others are running or never started.
    status = pc.coalesce(
        _sparse_take(acc.terminal_status, terminal_rank[rows[np.where(terminated, first_term, 0)]], terminated),
        pc.if_else(pa.array(has_created), ItemStatus.RUNNING.value, ItemStatus.NEVER_STARTED.value).cast(pa.string()),
    )

    # A null index takes a null: items without ITEM_CREATED get no fingerprint in the same pass.
    created_rows = rows[np.where(has_created, last_created, 0)]
    created_at = created_rank[created_rows]
    fp = _sparse_take(acc.created_fp, created_at, has_created)
    pv = _sparse_take(acc.created_pv, created_at, has_created)
    cseq = pa.array(np.where(has_created, seq[created_rows], 0).astype(np.int64), mask=~has_created)

    table = pa.table(
        {
            "item_id": pc.take(dictionary, pa.array(codes_of_items)),
            "status": status,
            "input_fingerprint": fp,
            "processor_version": pv,
            "created_seq": cseq,
            "last_seq": pa.array(last_seq, pa.int64()),
            "max_epoch": pa.array(max_epoch.astype(np.int64), pa.int64()),
            "failures": pa.array(np.where(has_created, failures, 0), pa.int64()),
            "violations": pa.array(violations, pa.int64()),
        },
        schema=STATE_SCHEMA,
    )
    return table, codes_of_items
