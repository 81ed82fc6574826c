"""The cold fold of a large log, one bucket of items at a time (see docs/adr/0019-partitioned-plan.md).

Without the memo or the projection, :func:`~.projection.fold_scan` folds every event at once: at
10M items and 49M events that peaked at 5.7 GB, for a result of 1.3 GB. Past
:data:`BUCKETED_EVENTS` events it instead streams the log's light columns once into spill files
by a hash of the item id (``core.spill``), then folds each bucket alone and keeps only its rows.
Every event of an item lands in one bucket, in log order, so each bucket's fold is exactly the
full fold's rows for its items; the rows come bucket by bucket rather than in first-event order.
"""

from __future__ import annotations

import math
import tempfile
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_datagen.core.fold import STATE_SCHEMA, fold_table
from airflow_provider_datagen.core.spill import GIVE_BACK_EVERY, Spill, bound_allocator, buckets_of, give_back_memory

if TYPE_CHECKING:
    from collections.abc import Iterable

#: Log events above which a cold fold goes bucket by bucket. Below it the fold at once is faster (half
#: the CPU) and its peak, ~165 bytes an event (921 MB at 4.9M events, 2,081 MB at 14.7M), stays under 1.5 GB.
BUCKETED_EVENTS = 1 << 23
#: Events per bucket (the count is a power of two): at 49M events 64 buckets peaked at 1,528 MB, 32 at 1,827 MB.
EVENTS_PER_BUCKET = 1 << 20
MAX_BUCKETS = 1024


def fold_buckets(events: int) -> int:
    """How many buckets fold ``events`` events in parts of about :data:`EVENTS_PER_BUCKET`."""
    want = max(events / EVENTS_PER_BUCKET, 2)
    return int(min(MAX_BUCKETS, 1 << math.ceil(math.log2(want))))


def fold_bucketed(batches: Iterable[pa.RecordBatch], events: int) -> pa.Table:
    """The fold of every event in ``batches`` (the log's light columns, in log order), a bucket at a time.

    Only the folded rows outlive a bucket; its events and their spill file are given back first.
    """
    bound_allocator()
    k = fold_buckets(events)
    parts: list[pa.Table] = []
    with tempfile.TemporaryDirectory(prefix="datagen-fold-") as tmp:
        spill = Spill(tmp, "events", k)
        for i, batch in enumerate(batches, 1):
            if "schema_version" in batch.schema.names:  # checked by the scan; the fold does not read it
                batch = batch.drop_columns(["schema_version"])
            spill.add(batch, buckets_of(batch.column("item_id"), k))
            if i % GIVE_BACK_EVERY == 0:
                give_back_memory()
        spill.close()
        give_back_memory()
        for b in range(k):
            table = spill.read(b)
            if table is None:
                continue
            folded = fold_table(table)
            del table
            if folded.num_rows:
                parts.append(folded)
            give_back_memory()
    if not parts:
        return STATE_SCHEMA.empty_table()
    return pa.concat_tables(parts)


def rows_in(states: pa.Table, ids: pa.Array) -> np.ndarray:
    """For each of ``ids``, its row in ``states`` (-1 when absent), hashing ``ids`` rather than the states.

    ``projection.rows_of`` hashes the states: at 10M rows a table of ~10M strings beside the fold,
    for a planner's source of a few hundred thousand ids. A repeated id gets the row of its first.
    """
    index = np.full(len(ids), -1, dtype=np.int64)
    if not len(ids) or not states.num_rows:
        return index
    at = np.asarray(pc.index_in(states["item_id"], value_set=ids).fill_null(-1).to_numpy(zero_copy_only=False))
    rows = np.flatnonzero(at >= 0)
    index[at[rows]] = rows
    first = np.asarray(pc.index_in(ids, value_set=ids).to_numpy(zero_copy_only=False), dtype=np.int64)
    return index[first]
