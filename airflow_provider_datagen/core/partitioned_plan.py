"""The plan of a large path source, one part of the items at a time (see docs/adr/0019-partitioned-plan.md).

Holding every item's id, fingerprint and state at once costs ~270 bytes an item with the fold
cache and ~130 bytes an event without it: 10M items and 50M events peaked at 3 and 6 GB. So past
:data:`PARTITION_ROWS` source rows the items are split by a hash of their id into buckets: one
streamed pass over the source writes each row's id, fingerprint and position to its bucket's spill
file, one streamed pass over the stored states (or, without them, over the log's light columns)
does the same by item id, and then each bucket is folded and classified on its own. Only the
pending positions (and what the plan reports about them) outlive a bucket. The buckets hold every
item's rows, so the plan, the status and the duplicate-key check are exactly the unpartitioned ones.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import math
import os
import tempfile
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_datagen.core.fold import STATE_SCHEMA, fold_table
from airflow_provider_datagen.core.planner import (
    CLS_DEMOTED,
    CLS_FRESH,
    CLS_INVALIDATED,
    CLS_REPLAY,
    CLS_SKIP,
    PENDING_ORDER,
    ResumePlan,
    StateMatch,
    _ints,
    classes,
    match_states,
)
from airflow_provider_datagen.core.schema import ItemStatus
from airflow_provider_datagen.core.source_scan import ScannedBatch, check_unique
from airflow_provider_datagen.core.status import FAILED_SAMPLE, summarize, version_counts
from airflow_provider_datagen.core.store.projection import ProjectionUnreadable, rows_of

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from airflow_provider_datagen.core.store.log import CheckpointLog
    from airflow_provider_datagen.core.store.projection import FoldStreams

#: Source rows above which a path source is planned in buckets (below it, in memory: faster).
PARTITION_ROWS = 1 << 19
#: Source rows and log events per bucket (the larger count decides how many buckets).
ITEMS_PER_BUCKET = 1 << 18
EVENTS_PER_BUCKET = 1 << 21
MAX_BUCKETS = 1024


@dataclass
class PathPlan:
    """A path source's plan, its status and the pending rows (positions in pending order)."""

    plan: ResumePlan
    status: dict[str, Any]
    pending_pos: np.ndarray
    #: JSONL: each pending row's byte offset (aligned with ``pending_pos``)
    pending_offsets: np.ndarray | None


def take_head(batches: Iterator[ScannedBatch], rows: int) -> tuple[list[ScannedBatch], bool]:
    """The first batches of a scan up to past ``rows`` rows, and whether more rows than that exist."""
    head: list[ScannedBatch] = []
    seen = 0
    for batch in batches:
        head.append(batch)
        seen += len(batch.ids)
        if seen > rows:
            return head, True
    return head, False


def bucket_count(source_rows: int, events: int) -> int:
    """How many buckets hold ``source_rows`` items and ``events`` events in parts of the sizes above."""
    want = max(source_rows / ITEMS_PER_BUCKET, events / EVENTS_PER_BUCKET, 2)
    return int(min(MAX_BUCKETS, 1 << math.ceil(math.log2(want))))


# --- the bucket of an id ---------------------------------------------------------------------

_P = 0x100000001B3  # the 64-bit FNV prime: odd, so invertible modulo 2**64
_P_INV = pow(_P, -1, 1 << 64)


_POWERS: dict[int, np.ndarray] = {}


def _powers(base: int, n: int) -> np.ndarray:
    """``base ** i`` modulo 2**64 for i in 0..n-1 (numpy's unsigned products wrap); a cached table grown by doubling."""
    table = _POWERS.get(base)
    if table is None or len(table) < n:
        size = 1 << max(16, (n - 1).bit_length())
        table = np.full(size, base, dtype=np.uint64)
        table[0] = 1
        with np.errstate(over="ignore"):
            table = np.cumprod(table, dtype=np.uint64)
        _POWERS[base] = table  # one assignment: another thread sees the old table or the new one
    return table[:n]


def id_hash(ids: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A 64-bit hash of each string, from the Arrow buffers (no Python per string).

    ``sum(byte[j] * P**(j+1))`` over the string's bytes, from one running sum over the whole data
    buffer (each string's slice scaled back by ``P**-start``), then the splitmix64 finisher so
    every bit depends on every byte. Stable for a given string; only ever compared within one plan.
    """
    arr = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
    if not pa.types.is_large_string(arr.type):
        arr = arr.cast(pa.large_string())
    n = len(arr)
    if not n:
        return np.zeros(0, np.uint64)
    _, off_buf, data_buf = arr.buffers()
    offsets = np.frombuffer(off_buf, np.int64, count=n + 1, offset=arr.offset * 8)
    lo, hi = int(offsets[0]), int(offsets[-1])
    size = hi - lo
    starts = offsets[:-1] - lo
    with np.errstate(over="ignore"):
        if size:
            data = np.frombuffer(data_buf, np.uint8, count=size, offset=lo).astype(np.uint64)
            running = np.zeros(size + 1, np.uint64)
            np.cumsum(data * _powers(_P, size + 1)[1:], dtype=np.uint64, out=running[1:])
            h = (running[offsets[1:] - lo] - running[starts]) * _powers(_P_INV, size + 1)[starts]
        else:
            h = np.zeros(n, np.uint64)
        h += np.diff(offsets).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        h ^= h >> np.uint64(30)
        h *= np.uint64(0xBF58476D1CE4E5B9)
        h ^= h >> np.uint64(27)
        h *= np.uint64(0x94D049BB133111EB)
        h ^= h >> np.uint64(31)
    return h


def buckets_of(ids: pa.Array | pa.ChunkedArray, k: int) -> np.ndarray:
    """Each id's bucket in ``0..k-1``; an item's events are side by side, so runs are hashed once."""
    arr = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
    n = len(arr)
    if n < 2:
        return (id_hash(arr) % np.uint64(k)).astype(np.int64)
    same = np.asarray(pc.equal(arr.slice(1), arr.slice(0, n - 1)).fill_null(False).to_numpy(zero_copy_only=False))
    heads = np.flatnonzero(np.concatenate(([True], ~same)))
    if len(heads) == n:
        return (id_hash(arr) % np.uint64(k)).astype(np.int64)
    hashed = (id_hash(arr.take(pa.array(heads))) % np.uint64(k)).astype(np.int64)
    return np.repeat(hashed, np.diff(np.append(heads, n)))


# --- memory ---------------------------------------------------------------------------------


def _glibc() -> Any:
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None)
        if libc.malloc_trim and libc.mallopt:
            return libc
    return None


_LIBC = _glibc()
_M_MMAP_THRESHOLD = -3


def bound_allocator() -> None:
    """Make glibc map large blocks (from :data:`MMAP_THRESHOLD` up) and unmap them when freed.

    By default, once a large block is freed glibc raises that threshold (up to 32 MB) and serves
    such blocks from its heap, where freed pages stay resident: a bucket's numpy arrays then kept
    the process's peak at 910 MB for 1M items, ~530 MB with the threshold fixed (the rest of the
    process is unaffected but for a syscall per large block). A no-op off glibc.
    """
    if _LIBC is not None:
        _LIBC.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)


#: glibc's default mmap threshold; fixing it turns its growth off (see :func:`bound_allocator`).
MMAP_THRESHOLD = 128 * 1024


def give_back_memory() -> None:
    """Return the memory freed so far to the system (Arrow's allocator and glibc keep freed pages)."""
    pa.default_memory_pool().release_unused()
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


#: Scan batches between two :func:`give_back_memory` calls of the spill passes.
_GIVE_BACK_EVERY = 16


# --- spill files ----------------------------------------------------------------------------


class _Spill:
    """One Arrow IPC stream file per bucket in a temporary directory; rows keep their order in each.

    A bucket's rows are held until there are :data:`_SPILL_ROWS` of them and then written as one
    record batch: 64 buckets of one 64k-row scan batch are ~1k rows each, and a message per slice
    cost more than the data. Compressed with LZ4: an item's events repeat its id and sit side by
    side, so the light columns shrink ~3x for little CPU (and the spill is disk the plan borrows).
    """

    def __init__(self, directory: str, name: str, k: int) -> None:
        self.paths = [os.path.join(directory, f"{name}-{b}.arrow") for b in range(k)]
        self.writers: list[pa.ipc.RecordBatchStreamWriter | None] = [None] * k
        self.held: list[list[pa.RecordBatch]] = [[] for _ in range(k)]
        self.held_rows = np.zeros(k, np.int64)
        self.schema: pa.Schema | None = None

    def add(self, batch: pa.RecordBatch, buckets: np.ndarray) -> None:
        if not batch.num_rows:
            return
        if self.schema is None:
            self.schema = batch.schema
        counts = np.bincount(buckets, minlength=len(self.paths))
        one = len(self.paths) == 1
        grouped = batch if one else batch.take(pa.array(np.argsort(buckets, kind="stable")))
        at = 0
        for b in np.flatnonzero(counts).tolist():
            self.held[b].append(grouped.slice(at, int(counts[b])))
            self.held_rows[b] += int(counts[b])
            at += int(counts[b])
            if self.held_rows[b] >= _SPILL_ROWS:
                self._flush(b)

    def _flush(self, b: int) -> None:
        held = self.held[b]
        if not held:
            return
        writer = self.writers[b]
        if writer is None:
            assert self.schema is not None
            writer = self.writers[b] = pa.ipc.new_stream(self.paths[b], self.schema, options=_SPILL_OPTIONS)
        writer.write_batch(held[0] if len(held) == 1 else pa.concat_batches(held))
        self.held[b] = []
        self.held_rows[b] = 0

    def close(self) -> None:
        for b in range(len(self.writers)):
            self._flush(b)
            writer = self.writers[b]
            if writer is not None:
                writer.close()

    def read(self, b: int, schema: pa.Schema | None = None) -> pa.Table | None:
        """Bucket ``b``'s rows as one table (None when it has none and no ``schema`` is given)."""
        if self.writers[b] is None:
            return None if schema is None else schema.empty_table()
        with pa.OSFile(self.paths[b]) as fh:
            table = pa.ipc.open_stream(fh).read_all().combine_chunks()
        os.remove(self.paths[b])  # the disk a bucket used is given back as the plan goes
        return table


#: Rows a bucket holds before they are written (see :class:`_Spill`).
_SPILL_ROWS = 1 << 15
_SPILL_OPTIONS = pa.ipc.IpcWriteOptions(compression="lz4")


_SOURCE_SCHEMA = pa.schema([("id", pa.string()), ("fp", pa.string()), ("pos", pa.int64()), ("off", pa.int64())])


def _spill_source(spill: _Spill, batches: Iterable[ScannedBatch], k: int) -> tuple[int, bool]:
    """Write each source row's id, fingerprint, position (and JSONL offset) to its bucket; rows and JSONL-ness."""
    at = 0
    jsonl = False
    for i, batch in enumerate(batches, 1):
        n = len(batch.ids)
        jsonl = batch.offsets is not None
        offs = batch.offsets if jsonl else np.zeros(n, np.int64)
        rows = pa.record_batch(
            [batch.ids, batch.fingerprints, pa.array(np.arange(at, at + n, dtype=np.int64)), pa.array(offs)],
            schema=_SOURCE_SCHEMA,
        )
        spill.add(rows, buckets_of(batch.ids, k))
        at += n
        if i % _GIVE_BACK_EVERY == 0:
            give_back_memory()
    spill.close()
    return at, jsonl


# --- the plan ---------------------------------------------------------------------------------


@dataclass
class _Collected:
    """What the buckets hand on: pending rows per class, and the counts the status needs."""

    pos: dict[int, list[np.ndarray]] = field(default_factory=lambda: {c: [] for c in PENDING_ORDER})
    ids: dict[int, list[pa.Array]] = field(default_factory=lambda: {c: [] for c in PENDING_ORDER})
    offs: dict[int, list[np.ndarray]] = field(default_factory=lambda: {c: [] for c in PENDING_ORDER})
    last_seq: dict[int, list[np.ndarray]] = field(default_factory=lambda: {c: [] for c in PENDING_ORDER})
    failed: list[np.ndarray] = field(default_factory=list)  # per replay row (in pos order per bucket)
    skip: int = 0
    kept: dict[str, int] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    by_version: dict[str, int] = field(default_factory=dict)
    failed_sample: list[str] = field(default_factory=list)


def plan_partitioned(
    log: CheckpointLog,
    path: str,
    key_field: str,
    batches: Iterable[ScannedBatch],
    processor_version: str,
    redo_completed: str,
    *,
    source_rows: int,
) -> PathPlan:
    """The plan of a path source scanned as ``batches`` (see the module); ``source_rows`` sizes the buckets.

    The log's pass runs on a worker thread while this one fingerprints the source (Python, holding
    the GIL; Lance's decoding, Arrow's gathers and the IPC writes release it), and each bucket is
    read (and folded) there while the one before is classified here.
    """
    bound_allocator()
    streams = log.fold_streams()
    k = bucket_count(source_rows, 0 if streams is None else streams.event_count)
    stop = threading.Event()
    with (
        tempfile.TemporaryDirectory(prefix="datagen-plan-") as tmp,
        concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="datagen-plan") as pool,
    ):
        states_pass = pool.submit(_spill_states, tmp, streams, k, stop)
        try:
            source = _Spill(tmp, "source", k)
            n, jsonl = _spill_source(source, batches, k)
        except BaseException:
            stop.set()  # the log's pass ends at its next batch, before the directory goes
            raise
        states, folded = states_pass.result()
        give_back_memory()
        store = None if streams is None else streams.store
        stored = _Spill(tmp, "fold", 1) if store is not None else None
        acc = _Collected()

        def bucket(b: int) -> tuple[pa.Table, pa.Table]:
            table = states.read(b)
            if table is None:
                table = STATE_SCHEMA.empty_table()
            elif folded:
                table = fold_table(table)
            mine = source.read(b, _SOURCE_SCHEMA)
            assert mine is not None
            return mine, table

        ahead = pool.submit(bucket, 0)
        for b in range(k):
            mine, table = ahead.result()
            if b + 1 < k:
                ahead = pool.submit(bucket, b + 1)
            ids = mine.column("id")
            # each bucket names its own first repeat; with repeats in several buckets, the first
            # bucket's (an in-order read might have met another pair first)
            check_unique(
                path,
                key_field,
                ids.chunk(0) if ids.num_chunks else pa.array([], pa.string()),
                mine.column("pos").to_numpy(),
            )
            if stored is not None and table.num_rows:
                for part in table.to_batches():
                    stored.add(part, np.zeros(part.num_rows, np.int64))
            _classify_bucket(acc, mine, table, processor_version, redo_completed, jsonl, log)
            del mine, table, ids
            give_back_memory()
        if stored is not None and store is not None:
            stored.close()
            if stored.writers[0] is not None:
                with pa.OSFile(stored.paths[0]) as fh:
                    store(pa.ipc.open_stream(fh))
    return _assemble(log, acc, n, jsonl)


def _spill_states(tmp: str, streams: FoldStreams | None, k: int, stop: threading.Event) -> tuple[_Spill, bool]:
    """Every item's stored state (or, without them, every event) in its bucket; and whether they are events."""
    spill = _Spill(tmp, "states", k)
    if streams is None:
        spill.close()
        return spill, False
    if streams.states is not None:
        try:
            for i, batch in enumerate(streams.states, 1):
                if stop.is_set():
                    break
                spill.add(batch, buckets_of(batch.column("item_id"), k))
                if i % _GIVE_BACK_EVERY == 0:
                    give_back_memory()
            spill.close()
            return spill, False
        except ProjectionUnreadable:
            spill.close()
            spill = _Spill(tmp, "events", k)
    for i, batch in enumerate(streams.events(), 1):
        if stop.is_set():
            break
        batch = batch.drop_columns(["schema_version"])  # checked by the scan; the fold does not read it
        spill.add(batch, buckets_of(batch.column("item_id"), k))
        if i % _GIVE_BACK_EVERY == 0:
            give_back_memory()
    spill.close()
    return spill, True


def _classify_bucket(
    acc: _Collected,
    mine: pa.Table,
    states: pa.Table,
    processor_version: str,
    redo_completed: str,
    jsonl: bool,
    log: CheckpointLog,
) -> None:
    """Classify one bucket's source rows against its states; keep only what the plan hands on."""
    summary = summarize(states, pipeline=log.pipeline, experiment=log.experiment, log_version=0)
    for key in ("failed_items", "children", "fencing_violations"):
        acc.counts[key] = acc.counts.get(key, 0) + int(summary[key])
    acc.failed_sample = sorted([*acc.failed_sample, *summary["failed_item_ids"]])[:FAILED_SAMPLE]
    n = mine.num_rows
    if not n:
        return
    ids = mine.column("id").chunk(0)
    fps = mine.column("fp").chunk(0)
    pos = _ints(mine.column("pos"))
    offs = _ints(mine.column("off")) if jsonl else None
    index = rows_of(states, ids)
    match = match_states(n, lambda rows: fps.take(pa.array(rows)), states, index)
    del index
    cls, kept = classes(match, states, processor_version, redo_completed)
    for version, count in kept.items():
        acc.kept[version] = acc.kept.get(version, 0) + count
    acc.skip += int(np.count_nonzero(cls == CLS_SKIP))
    for c in PENDING_ORDER:
        rows = np.flatnonzero(cls == c)
        if not len(rows):
            continue
        acc.pos[c].append(pos[rows])
        acc.ids[c].append(ids.take(pa.array(rows)))
        if offs is not None:
            acc.offs[c].append(offs[rows])
        seq = np.full(len(rows), -1, np.int64)
        found = match.found[rows]
        if found.any() and states.num_rows:
            seq[found] = _ints(pc.take(states["last_seq"], pa.array(match.pick[rows[found]])))
        acc.last_seq[c].append(seq)
        if c == CLS_REPLAY:
            failures = _ints(pc.take(states["failures"], pa.array(match.pick[rows])))
            acc.failed.append(failures > 0)
    for key, value in status_counts(states, match).items():
        if key == "completed_by_version":
            for version, count in value.items():
                acc.by_version[version] = acc.by_version.get(version, 0) + count
        else:
            acc.counts[key] = acc.counts.get(key, 0) + value


def status_counts(states: pa.Table, match: StateMatch) -> dict[str, Any]:
    """The source's counts in the ``datagen_status`` dict (what :func:`~.planner.status_of` counts)."""
    cls, _ = classes(match, states, None)  # status_of's view: no version demotes anything
    done = np.flatnonzero(cls == CLS_SKIP)
    completed = filtered = 0
    by_version: dict[str, int] = {}
    if len(done):
        picked = pa.array(match.pick[done])
        st = pc.take(states["status"], picked)
        is_completed = pc.equal(st, ItemStatus.COMPLETED.value)
        completed = int(pc.sum(is_completed).as_py() or 0)
        filtered = int(pc.sum(pc.equal(st, ItemStatus.FILTERED.value)).as_py() or 0)
        versions = pc.filter(pc.take(states["processor_version"], picked), is_completed)
        by_version = version_counts(versions)
    return {
        "total": len(cls),
        "completed": completed,
        "completed_by_version": by_version,
        "filtered": filtered,
        "running": int(np.count_nonzero(cls == CLS_REPLAY) + np.count_nonzero(cls == CLS_DEMOTED)),
        "never_started": int(np.count_nonzero(cls == CLS_FRESH)),
        "invalidated": int(np.count_nonzero(cls == CLS_INVALIDATED)),
        "pending": int(np.count_nonzero(cls != CLS_SKIP)),
    }


def _assemble(log: CheckpointLog, acc: _Collected, n: int, jsonl: bool) -> PathPlan:
    """The buckets' pending rows merged into source order per class, and the plan and status of them all."""
    plan = ResumePlan(log_version=log.version, skip_count=acc.skip)
    plan.kept_other_version = dict(sorted(acc.kept.items()))
    positions, offsets, seqs = [], [], []
    for c in PENDING_ORDER:
        if not acc.pos[c]:
            positions.append(np.zeros(0, np.int64))
            offsets.append(np.zeros(0, np.int64))
            seqs.append(np.zeros(0, np.int64))
            continue
        pos = np.concatenate(acc.pos[c])
        order = np.argsort(pos, kind="stable")
        positions.append(pos[order])
        offsets.append(np.concatenate(acc.offs[c])[order] if jsonl else np.zeros(0, np.int64))
        seqs.append(np.concatenate(acc.last_seq[c])[order])
        ids = pa.concat_arrays(acc.ids[c]).take(pa.array(order)).to_pylist()
        if c == CLS_REPLAY:
            failed = np.concatenate(acc.failed)[order]
            plan.failed = [ids[i] for i in np.flatnonzero(failed).tolist()]
        setattr(plan, _NAMES[c], ids)
    pending_ids = plan.pending
    seq = np.concatenate(seqs)
    found = np.flatnonzero(seq >= 0)
    plan.last_seq = dict(zip([pending_ids[i] for i in found.tolist()], seq[found].tolist()))
    status = log.summary(STATE_SCHEMA.empty_table())
    status.update(acc.counts)
    status.update(
        total=n,
        completed_by_version=dict(sorted(acc.by_version.items())),
        failed_item_ids=acc.failed_sample,
    )
    for key in ("completed", "filtered", "running", "never_started", "invalidated", "pending"):
        status.setdefault(key, 0)
    return PathPlan(plan, status, np.concatenate(positions), np.concatenate(offsets) if jsonl else None)


_NAMES = {CLS_REPLAY: "replay", CLS_DEMOTED: "demoted", CLS_INVALIDATED: "invalidated", CLS_FRESH: "fresh"}
