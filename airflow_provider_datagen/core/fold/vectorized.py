"""The vectorized fold: the lifecycle summary of millions of events with numpy over Arrow columns.

:func:`fold_table` (and its streamed form :func:`fold_batches`) computes, per item, the same summary
row as the reference fold (:func:`~airflow_provider_datagen.core.fold.reference.fold_events` through
:func:`~airflow_provider_datagen.core.fold.state.state_row`); a property test holds them equal. It is
the hot path of every plan and status read (see docs/design.md, Lenses and Resume): it adds no
per-row Python.
"""

from __future__ import annotations

import concurrent.futures
import threading
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_datagen.core.fold.state import STATE_SCHEMA
from airflow_provider_datagen.core.schema import STORED_STATUS_TRANSIENT, EventType, ItemStatus
from airflow_provider_datagen.exceptions import MisalignedStreamsError

if TYPE_CHECKING:
    from collections.abc import Iterable

_MAX_31 = (1 << 31) - 1


def _ints(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """A light integer column as int64 (one copy at most: ``astype`` would copy an int64 column again)."""
    return np.asarray(col.to_numpy(), dtype=np.int64)


def _mask(col: pa.ChunkedArray | pa.Array, value: str) -> np.ndarray:
    return np.asarray(pc.equal(col, value).fill_null(False).to_numpy(zero_copy_only=False), dtype=bool)


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
        failed = np.flatnonzero(_mask(etype, EventType.FAILED.value))
        if len(failed):
            # a transient FAILED row (an attempt retried in place) is not a failure of the item; FAILED
            # rows are rare, so their status is read for them alone
            transient = _mask(batch.column("status").take(pa.array(failed)), STORED_STATUS_TRANSIENT)
            kind[failed[~transient]] = _FAILED
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


class _Applied(NamedTuple):
    """The rows the fold applies, in (item, sequence) order, and what it reads of each item beside them."""

    rows: np.ndarray  # the applied rows (positions in scan order)
    seg: np.ndarray  # each item's first position in ``rows``
    codes: np.ndarray  # each item's code
    last_seq: np.ndarray
    max_epoch: np.ndarray
    violations: np.ndarray
    seq: np.ndarray  # every row's item_seq, in scan order
    row_kind: np.ndarray  # each applied row's type code
    created_rank: np.ndarray  # each row's place among the kept ITEM_CREATED strings
    terminal_rank: np.ndarray  # each row's place among the kept TERMINAL strings
    dictionary: pa.Array  # each code's item id


class _Generation(NamedTuple):
    """Per item, its current generation: from its last ITEM_CREATED to its first TERMINAL after it."""

    last_created: np.ndarray  # position of the last ITEM_CREATED, -1 without one
    has_created: np.ndarray
    first_term: np.ndarray  # position of the first TERMINAL after it, past the rows without one
    failures: np.ndarray  # FAILED rows (not transient) within the generation
    terminated: np.ndarray


def _fold(acc: _Compacted, ids: pa.Array | None) -> tuple[pa.Table, np.ndarray]:
    """The vectorized fold over compacted rows; returns the state table and each state row's item code."""
    if acc.rows == 0:
        return STATE_SCHEMA.empty_table(), np.zeros(0, np.int64)
    applied = _applied_rows(acc, ids)
    generation = _generations(applied.row_kind, applied.seg, len(applied.rows))
    return _state_table(acc, applied, generation), applied.codes


def _sort_keys(
    acc: _Compacted, k1: np.ndarray, epoch: np.ndarray
) -> tuple[bool, np.ndarray, np.ndarray, np.ndarray | None]:
    """Whether the rows are in key order already, their order by key (duplicates dropped), the sorted
    keys, and each sorted row's first writer's epoch (None when no row has a copy: then its own).
    """
    n = acc.rows
    # A log written item by item is often in order already: then no sort and no gathers.
    ordered = n < 2 or bool(np.all(k1[1:] > k1[:-1]))
    order = np.arange(n) if ordered else np.argsort(k1, kind="stable")
    sk = k1 if ordered else k1[order]
    s_first = None
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
    acc.ekey = []
    return ordered, order, sk, s_first


def _applied_rows(acc: _Compacted, ids: pa.Array | None) -> _Applied:
    """Sort the rows, fence out the stale ones, and reduce each item's sequence bounds and violations."""
    k1, dictionary = acc.keys(ids)
    seq = np.concatenate(acc.seq)
    acc.seq = []
    k1 |= seq
    kind = np.concatenate(acc.kind)
    acc.kind = []
    epoch = np.concatenate(acc.epoch)
    acc.epoch = []

    ordered, order, sk, s_first = _sort_keys(acc, k1, epoch)
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

    # The generation logic runs over the sparse rows that matter (ITEM_CREATED, TERMINAL, FAILED: a
    # fraction of the log) instead of full-length passes per type. Positions index the applied rows in
    # (item, sequence) order; an item's rows are seg[i] .. seg[i + 1] - 1.
    row_kind = kind[rows]
    # each row's place among the kept strings of its type (they were kept in scan order)
    created_rank = np.cumsum(kind == _CREATED, dtype=np.int32) - 1
    terminal_rank = np.cumsum(kind == _TERMINAL, dtype=np.int32) - 1
    del kind
    return _Applied(
        rows,
        seg,
        codes_of_items,
        last_seq,
        max_epoch,
        violations,
        seq,
        row_kind,
        created_rank,
        terminal_rank,
        dictionary,
    )


def _generations(row_kind: np.ndarray, seg: np.ndarray, nv: int) -> _Generation:
    """Each item's current generation over the applied rows (``nv`` of them, items starting at ``seg``)."""
    n_items = len(seg)

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
    terminated = has_created & (first_term < big)
    return _Generation(last_created, has_created, first_term, failures, terminated)


def _state_table(acc: _Compacted, applied: _Applied, gen: _Generation) -> pa.Table:
    """The state rows (:data:`STATE_SCHEMA`) of the applied rows and their generations."""
    rows, has_created = applied.rows, gen.has_created
    # The stored status of each item's first TERMINAL; the others are running or never started.
    status = pc.coalesce(
        _sparse_take(
            acc.terminal_status,
            applied.terminal_rank[rows[np.where(gen.terminated, gen.first_term, 0)]],
            gen.terminated,
        ),
        pc.if_else(pa.array(has_created), ItemStatus.RUNNING.value, ItemStatus.NEVER_STARTED.value).cast(pa.string()),
    )

    # A null index takes a null: items without ITEM_CREATED get no fingerprint in the same pass.
    created_rows = rows[np.where(has_created, gen.last_created, 0)]
    created_at = applied.created_rank[created_rows]
    fp = _sparse_take(acc.created_fp, created_at, has_created)
    pv = _sparse_take(acc.created_pv, created_at, has_created)
    cseq = pa.array(np.where(has_created, applied.seq[created_rows], 0).astype(np.int64), mask=~has_created)

    return pa.table(
        {
            "item_id": pc.take(applied.dictionary, pa.array(applied.codes)),
            "status": status,
            "input_fingerprint": fp,
            "processor_version": pv,
            "created_seq": cseq,
            "last_seq": pa.array(applied.last_seq, pa.int64()),
            "max_epoch": pa.array(applied.max_epoch.astype(np.int64), pa.int64()),
            "failures": pa.array(np.where(has_created, gen.failures, 0), pa.int64()),
            "violations": pa.array(applied.violations, pa.int64()),
        },
        schema=STATE_SCHEMA,
    )
