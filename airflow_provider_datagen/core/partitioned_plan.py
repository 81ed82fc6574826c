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
import math
import tempfile
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_datagen.core.fold import STATE_SCHEMA, fold_table
from airflow_provider_datagen.core.gil import short_gil_turns
from airflow_provider_datagen.core.plan.assemble import Part, assemble, part_of, source_counts
from airflow_provider_datagen.core.plan.rules import ResumePlan, classes, ints, match_states
from airflow_provider_datagen.core.source_scan import ScannedBatch, check_unique
from airflow_provider_datagen.core.spill import (
    GIVE_BACK_EVERY,
    Spill,
    bound_allocator,
    buckets_of,
    give_back_memory,
)
from airflow_provider_datagen.core.status import FAILED_SAMPLE, tally
from airflow_provider_datagen.core.store.projection import ProjectionUnreadable, rows_of

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator

    from airflow_provider_datagen.core.store.log import CheckpointLog
    from airflow_provider_datagen.core.store.projection import FoldStreams

__all__ = ["PathPlan", "bucket_count", "plan_partitioned", "take_head"]

#: Source rows above which a path source is planned in buckets (below it, in memory: faster).
PARTITION_ROWS = 1 << 19
#: Source rows and log events per bucket (the larger count decides how many buckets).
ITEMS_PER_BUCKET = 1 << 18
EVENTS_PER_BUCKET = 1 << 21
MAX_BUCKETS = 1024
#: The most removed items (log items the source no longer holds) a partitioned plan lists: the source
#: record holds them, and a source replaced whole would make the list the size of the log.
REMOVED_LISTED = 1 << 17


@dataclass
class PathPlan:
    """A path source's plan, its status and the pending rows (positions in pending order)."""

    plan: ResumePlan
    status: dict[str, Any]
    pending_pos: np.ndarray
    #: JSONL: each pending row's byte offset (aligned with ``pending_pos``)
    pending_offsets: np.ndarray | None
    #: the log's root items the source does not hold, sorted (None: more than :data:`REMOVED_LISTED`)
    removed_ids: tuple[str, ...] | None = None


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


# --- the source's spill ----------------------------------------------------------------------

_SOURCE_SCHEMA = pa.schema([("id", pa.string()), ("fp", pa.string()), ("pos", pa.int64()), ("off", pa.int64())])


def _spill_source(spill: Spill, batches: Iterable[ScannedBatch], k: int) -> tuple[int, bool]:
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
        if i % GIVE_BACK_EVERY == 0:
            give_back_memory()
    spill.close()
    return at, jsonl


# --- the plan ---------------------------------------------------------------------------------


@dataclass
class _Collected:
    """What the buckets hand on: pending rows per class, and the counts the status needs."""

    parts: list[Part] = field(default_factory=list)  # each bucket's pending rows (see core/plan/assemble.py)
    counts: dict[str, int] = field(default_factory=dict)
    by_version: dict[str, int] = field(default_factory=dict)
    failed_sample: list[str] = field(default_factory=list)
    #: per bucket, the log's root items no source row matched (None: too many to list)
    removed: list[pa.Array] | None = field(default_factory=list)
    removed_count: int = 0


@short_gil_turns()
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
            source = Spill(tmp, "source", k)
            n, jsonl = _spill_source(source, batches, k)
        except BaseException:
            stop.set()  # the log's pass ends at its next batch, before the directory goes
            raise
        states, folded = states_pass.result()
        give_back_memory()
        store = None if streams is None else streams.store
        stored = Spill(tmp, "fold", 1) if store is not None else None
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
        writing = None
        if stored is not None and store is not None:
            stored.close()
            if stored.writers[0] is not None:  # Lance writes the fold while this thread assembles the plan
                writing = pool.submit(_store_spilled, stored.paths[0], store)
        planned = _assemble(log, acc, n, jsonl)
        if writing is not None:
            writing.result()
    return planned


def _store_spilled(path: str, store: Callable[[pa.RecordBatchReader], Any]) -> None:
    """Stream the fold spilled at ``path`` into ``store`` (the fold cache's writer)."""
    with pa.OSFile(path) as fh:
        store(pa.ipc.open_stream(fh))


def _spill_states(tmp: str, streams: FoldStreams | None, k: int, stop: threading.Event) -> tuple[Spill, bool]:
    """Every item's stored state (or, without them, every event) in its bucket; and whether they are events."""
    spill = Spill(tmp, "states", k)
    if streams is None:
        spill.close()
        return spill, False
    if streams.states is not None:
        try:
            for i, batch in enumerate(streams.states, 1):
                if stop.is_set():
                    break
                spill.add(batch, buckets_of(batch.column("item_id"), k))
                if i % GIVE_BACK_EVERY == 0:
                    give_back_memory()
            spill.close()
            return spill, False
        except ProjectionUnreadable:
            spill.close()
            spill = Spill(tmp, "events", k)
    for i, batch in enumerate(streams.events(), 1):
        if stop.is_set():
            break
        batch = batch.drop_columns(["schema_version"])  # checked by the scan; the fold does not read it
        spill.add(batch, buckets_of(batch.column("item_id"), k))
        if i % GIVE_BACK_EVERY == 0:
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
    counted = tally(states)
    for key, n in (
        ("failed_items", counted.failed),
        ("children", counted.children),
        ("fencing_violations", counted.violations),
    ):
        acc.counts[key] = acc.counts.get(key, 0) + n
    acc.failed_sample = sorted([*acc.failed_sample, *counted.failed_ids])[:FAILED_SAMPLE]
    n = mine.num_rows
    if not n:
        _collect_removed(acc, states, np.zeros(states.num_rows, bool))
        return
    ids = mine.column("id").chunk(0)
    fps = mine.column("fp").chunk(0)
    pos = ints(mine.column("pos"))
    offs = ints(mine.column("off")) if jsonl else None
    index = rows_of(states, ids)
    match = match_states(n, lambda rows: fps.take(pa.array(rows)), states, index)
    del index
    held = np.zeros(states.num_rows, bool)
    held[match.pick[match.found]] = True
    _collect_removed(acc, states, held)
    cls, kept = classes(match, states, processor_version, redo_completed)
    acc.parts.append(part_of(cls, match, states, ids, kept=kept, pos=pos, offs=offs))
    for key, value in source_counts(states, match).items():
        if key == "completed_by_version":
            for version, count in value.items():
                acc.by_version[version] = acc.by_version.get(version, 0) + count
        else:
            acc.counts[key] = acc.counts.get(key, 0) + value


def _collect_removed(acc: _Collected, states: pa.Table, held: np.ndarray) -> None:
    """Keep the bucket's root items that no source row matched (``held``): the source's removed items.

    An item's bucket is a function of its id, so an item the source still holds is matched in its own
    bucket. Past :data:`REMOVED_LISTED` ids the list is dropped (a replaced source), and counts and
    exports read the recorded path instead.
    """
    if acc.removed is None or not states.num_rows or held.all():
        return
    ids = states["item_id"].take(pa.array(np.flatnonzero(~held)))
    roots = pc.filter(ids, pc.equal(pc.count_substring(ids, "/"), 0))
    acc.removed_count += len(roots)
    if acc.removed_count > REMOVED_LISTED:
        acc.removed = None
        return
    acc.removed.append(roots.combine_chunks() if isinstance(roots, pa.ChunkedArray) else roots)


def _assemble(log: CheckpointLog, acc: _Collected, n: int, jsonl: bool) -> PathPlan:
    """The buckets' pending rows merged into source order per class, and the plan and status of them all."""
    assembled = assemble(acc.parts, log_version=log.version)
    acc.parts.clear()  # the lists of the plan are built: the buckets' arrays can go
    status = log.summary(STATE_SCHEMA.empty_table())
    status.update(acc.counts)
    status.update(
        total=n,
        completed_by_version=dict(sorted(acc.by_version.items())),
        failed_item_ids=acc.failed_sample,
    )
    for key in ("completed", "filtered", "running", "never_started", "invalidated", "pending"):
        status.setdefault(key, 0)
    removed = None
    if acc.removed is not None:
        removed = tuple(sorted(pa.concat_arrays(acc.removed).to_pylist())) if acc.removed else ()
    offsets = assembled.pending_offsets if jsonl else None
    return PathPlan(assembled.plan, status, assembled.pending_pos, offsets, removed_ids=removed)
