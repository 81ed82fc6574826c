"""Chunk descriptors: how a plan hands pending work to mapped workers without shipping payloads.

A chunk names its source and item ids, never the items themselves, so XComs stay small. An inline
source (a list in the DAG file) is snapshotted once, content-addressed, next to the log, so every
mapped worker reads exactly the items that were planned.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_datagen.core import partitioned_plan
from airflow_provider_datagen.core.chunk_spec import FORMAT_KEY, ChunkSpec
from airflow_provider_datagen.core.events import decode_source_json
from airflow_provider_datagen.core.ids import key_of, root_item_id
from airflow_provider_datagen.core.plan.assemble import assemble, part_of, source_counts
from airflow_provider_datagen.core.planner import (
    REDO_NEVER,
    ResumePlan,
    check_redo_completed,
    classes,
    classify_with_status,
    match_states,
)
from airflow_provider_datagen.core.source_scan import (
    ScannedSource,
    gather,
    items_at,
    row_count,
    row_ranges,
    scan_batches,
    source_format,
)
from airflow_provider_datagen.core.sources import SourceItem, load_source, prepare_items, read_source, source_path
from airflow_provider_datagen.core.store.lance_io import read_lance_table
from airflow_provider_datagen.core.store.source_ref import INLINE, PATH, SourceRef, record_source, strip_credentials
from airflow_provider_datagen.core.uri import has_scheme
from airflow_provider_datagen.exceptions import ConfigurationError, InvalidItemError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from airflow_provider_datagen.core.store.log import CheckpointLog

_LABEL_KEY = 40


@dataclass
class PlannedChunks:
    """The outcome of planning: the plan, the chunks and the status dict."""

    plan: ResumePlan
    specs: list[ChunkSpec]
    chunk_size: int
    status: dict[str, Any]
    #: the log's root items the source does not hold (None: not listed, a partitioned plan's)
    removed_ids: tuple[str, ...] | None = None

    @property
    def chunks(self) -> list[dict[str, Any]]:
        """The chunks as the descriptor dicts ``plan_chunks`` gave before :class:`ChunkSpec` (XComs without the format).

        Kept for the callers of this module's API; a task's payload is ``spec.to_xcom()``.
        """
        return [{k: v for k, v in s.to_xcom().items() if k != FORMAT_KEY} for s in self.specs]


def _short(key: str) -> str:
    return key if len(key) <= _LABEL_KEY else key[: _LABEL_KEY - 1] + "…"


def chunk_label(item_ids: list[str]) -> str:
    """A human label for a chunk: its first and last key and its size."""
    if not item_ids:
        return "(empty)"
    first, last = _short(key_of(item_ids[0])), _short(key_of(item_ids[-1]))
    return f"{first} ({len(item_ids)} item)" if len(item_ids) == 1 else f"{first} … {last} ({len(item_ids)} items)"


def plan_chunks(
    log: CheckpointLog,
    source: Any,
    *,
    key_field: str = "id",
    chunk_size: int = 100,
    processor_version: str = "v1",
    max_chunks: int = 1024,
    redo_completed: str = REDO_NEVER,
    record: bool = True,
) -> PlannedChunks:
    """Fold the log once, classify the source and cut the pending items into chunk descriptors.

    Each :class:`ChunkSpec` carries ``redo_completed`` (see :func:`~airflow_provider_datagen.core.planner.plan_resume`),
    so the mapped tasks redo what the plan asked. With ``record`` (the default) the source is
    recorded beside the log, also when nothing is pending: counts and exports follow it (see
    :mod:`.store.source_ref`); ``DatagenPlanOperator`` records it itself, with its connection's names.
    """
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ConfigurationError(f"chunk_size must be a positive int, got {chunk_size!r}")
    check_redo_completed("plan_chunks", redo_completed)
    if not isinstance(source, (list, tuple)):
        planned = _plan_path_chunks(log, source, key_field, chunk_size, processor_version, max_chunks, redo_completed)
    else:
        planned = _plan_list_chunks(log, source, key_field, chunk_size, processor_version, max_chunks, redo_completed)
    if record:
        version, redo = processor_version, redo_completed
        record_plan_source(log, source, planned, key_field=key_field, processor_version=version, redo_completed=redo)
    return planned


# --- the record of what a plan read (core/next_run.py reads it back) -----------------------------------

#: The format a recorded inline source has: its snapshot beside the log.
SNAPSHOT = "snapshot"


def plan_source_ref(
    log: CheckpointLog,
    source: Any,
    *,
    key_field: str,
    processor_version: str,
    redo_completed: str,
    log_version: int,
    items: int,
    snapshot: str | None = None,
    conn_id: str | None = None,
    storage_option_names: Sequence[str] = (),
) -> SourceRef:
    """The record of what a plan read. An inline source is snapshotted here unless ``snapshot`` names its snapshot.

    (The plan writes the snapshot only when something is pending; the record needs it either way,
    and the snapshot is content-addressed, so an existing one is not written again.)
    """
    if isinstance(source, (list, tuple)):
        kind, fmt = INLINE, SNAPSHOT
        if snapshot is None:
            texts: list[bytes] = []
            snapshot = log.write_source_snapshot(load_source(list(source), key_field, texts=texts), texts)
        uri = snapshot
        redacted = False
    else:
        kind = PATH
        path = source_path(source)
        fmt = source_format(path)
        uri, redacted = strip_credentials(path)
    return SourceRef(
        kind=kind,
        uri=uri,
        format=fmt,
        key_field=key_field,
        conn_id=conn_id,
        storage_option_names=tuple(sorted(storage_option_names)),
        uri_redacted=redacted,
        log_version=int(log_version),
        processor_version=processor_version,
        redo_completed=redo_completed,
        items=int(items),
        recorded_at=dt.datetime.now(dt.UTC),
    )


def record_plan_source(
    log: CheckpointLog,
    source: Any,
    planned: PlannedChunks,
    *,
    key_field: str,
    processor_version: str,
    redo_completed: str,
    conn_id: str | None = None,
    storage_option_names: Sequence[str] = (),
) -> SourceRef:
    """Record beside the log the source a plan read (``planned``: :func:`~.chunks.plan_chunks`); returns the record."""
    # the first spec only: encoding every chunk's ids (planned.chunks) to read one field would copy them all
    first = planned.specs[0] if planned.specs else None
    ref = plan_source_ref(
        log,
        source,
        key_field=key_field,
        processor_version=processor_version,
        redo_completed=redo_completed,
        log_version=planned.plan.log_version,
        items=planned.plan.total,
        snapshot=first.source if first is not None and first.snapshot else None,
        conn_id=conn_id,
        storage_option_names=storage_option_names,
    )
    if planned.removed_ids is not None:  # what counts and exports leave out (see store/source_ref.py)
        ref = dataclasses.replace(ref, removed_ids=planned.removed_ids)
    record_source(log, ref)
    return ref


def _plan_list_chunks(
    log: CheckpointLog,
    source: list[Any] | tuple[Any, ...],
    key_field: str,
    chunk_size: int,
    processor_version: str,
    max_chunks: int,
    redo_completed: str,
) -> PlannedChunks:
    """The plan of an inline source: its items snapshotted beside the log when any is pending."""
    # each item's canonical text, kept from its fingerprint for the snapshot: every item is encoded once
    texts: list[bytes] = []
    items = load_source(source, key_field, texts=texts)
    states = log.states()
    # the mapped tasks read the log next: with the fold stored, they read it and the events since
    log.refresh_projection()
    # one match of the items to the states: the plan's classes and the status's counts are both read from it
    plan, status = classify_with_status(log, items, states, processor_version, redo_completed=redo_completed)
    pending = plan.pending
    size = _size(len(pending), chunk_size, max_chunks)
    ref = log.write_source_snapshot(items, texts) if pending else ""
    chunks = [
        _descriptor(
            log,
            plan,
            processor_version=processor_version,
            redo_completed=redo_completed,
            source=ref,
            snapshot=True,
            key_field=key_field,
            ids=pending[start : start + size],
            index=index,
        )
        for index, start in enumerate(range(0, len(pending), size))
    ]
    removed = _not_in(states["item_id"], pa.array([i.item_id for i in items], pa.string()))
    return PlannedChunks(plan, chunks, size, status, removed)


def _not_in(log_ids: pa.Array | pa.ChunkedArray, source_ids: pa.Array | pa.ChunkedArray) -> tuple[str, ...]:
    """The root ids among ``log_ids`` that ``source_ids`` does not hold, sorted: the source's removed items."""
    if not len(log_ids):
        return ()
    roots = pc.filter(log_ids, pc.equal(pc.count_substring(log_ids, "/"), 0))
    gone = pc.filter(roots, pc.invert(pc.is_in(roots, value_set=source_ids)))
    return tuple(sorted(gone.to_pylist()))


def _size(pending: int, chunk_size: int, max_chunks: int) -> int:
    if pending and math.ceil(pending / chunk_size) > max_chunks:
        return math.ceil(pending / max_chunks)
    return chunk_size


def _descriptor(
    log: CheckpointLog,
    plan: ResumePlan,
    *,
    processor_version: str,
    redo_completed: str,
    source: str,
    snapshot: bool,
    key_field: str,
    ids: list[str],
    index: int,
    rows: list[list[int]] | None = None,
) -> ChunkSpec:
    """The :class:`ChunkSpec` of the pending ``ids`` at ``index`` of ``log``'s ``plan``."""
    return ChunkSpec(
        pipeline=log.pipeline,
        experiment=log.experiment,
        processor_version=processor_version,
        redo_completed=redo_completed,
        source=source,
        snapshot=snapshot,
        key_field=key_field,
        item_ids=tuple(ids),
        label=chunk_label(ids),
        index=index,
        plan_log_version=plan.log_version,
        rows=None if rows is None else tuple(tuple(r) for r in rows),
    )


def _plan_path_chunks(
    log: CheckpointLog,
    source: Any,
    key_field: str,
    chunk_size: int,
    processor_version: str,
    max_chunks: int,
    redo_completed: str,
) -> PlannedChunks:
    """The streamed plan of a path source: ids and fingerprints only, chunks naming their rows.

    The source is read a batch at a time (see :mod:`.source_scan`); the plan lists the pending ids
    (a chunk's ids, and which rows hold them, are all a mapped task needs) but not the skipped ones,
    which it counts: at 10M items those lists alone would be most of a GiB. Past
    ``partitioned_plan.PARTITION_ROWS`` rows it is planned a bucket of items at a time
    (:mod:`.partitioned_plan`), so its memory does not grow with the source or the log.
    """
    path = source_path(source)  # the checks (absolute, existing, a known format) read_source makes
    ref = path if has_scheme(path) else os.path.abspath(path)
    # the log was opened with the datagen connection's storage options: the source is read with them too
    options = log.storage_options
    batches = scan_batches(ref, key_field, options)
    head, more = partitioned_plan.take_head(batches, partitioned_plan.PARTITION_ROWS)
    if more:
        rows = row_count(ref, head, options)
        planned = partitioned_plan.plan_partitioned(
            log, ref, key_field, itertools.chain(head, batches), processor_version, redo_completed, source_rows=rows
        )
        removed = planned.removed_ids  # each bucket's unmatched log items (None: too many to list)
    else:
        scanned = gather(ref, key_field, head)
        planned = _plan_in_memory(log, scanned, processor_version, redo_completed)
        # one column of the log, not its fold: what the log holds that the source no longer does
        held = pc.unique(log.scan(["item_id"])["item_id"]) if log.exists() else pa.array([], pa.string())
        removed = _not_in(held, scanned.ids)
        del scanned
    del head
    pending_pos, offsets, plan = planned.pending_pos, planned.pending_offsets, planned.plan
    size = _size(len(pending_pos), chunk_size, max_chunks)
    pending = plan.pending
    chunks = []
    for index, start in enumerate(range(0, len(pending_pos), size)):
        part = slice(start, start + size)
        chunks.append(
            _descriptor(
                log,
                plan,
                processor_version=processor_version,
                redo_completed=redo_completed,
                source=ref,
                snapshot=False,
                key_field=key_field,
                ids=pending[part],
                index=index,
                rows=row_ranges(pending_pos[part], None if offsets is None else offsets[part]),
            )
        )
    return PlannedChunks(plan, chunks, size, planned.status, removed)


def _plan_in_memory(
    log: CheckpointLog, scanned: ScannedSource, processor_version: str, redo_completed: str
) -> partitioned_plan.PathPlan:
    """The plan of a scanned source against the whole state table (a source of a few million items at most)."""
    n = len(scanned.ids)
    states, rows_in_states = log.states_for(scanned.ids)
    log.refresh_projection()
    fps = scanned.fingerprints
    match = match_states(n, lambda rows: fps.take(pa.array(rows)), states, rows_in_states)
    del rows_in_states
    cls, kept = classes(match, states, processor_version, redo_completed)
    # the pending classes only are listed: the skipped ones are counted (9.5M of 10M items: 76 MB)
    part = part_of(cls, match, states, scanned.ids, kept=kept, offs=scanned.offsets)
    assembled = assemble([part], log_version=log.version)
    status = log.summary(states)
    status.update(source_counts(states, match))
    return partitioned_plan.PathPlan(assembled.plan, status, assembled.pending_pos, assembled.pending_offsets)


def _prepare_chunk_rows(rows: list[Any], key_field: str, ids: list[Any]) -> list[SourceItem]:
    """Validate and fingerprint only the rows of a path source that belong to the chunk.

    Every row's key is still checked (present, a valid id, unique), so a source edited after planning
    fails with the same message as before; only the expensive part, the canonical-JSON fingerprint,
    is skipped for the other chunks' rows (with 1,000 chunks of a 1M-row file, it was done 1,000 times).
    """
    wanted = set(ids)
    seen: set[str] = set()
    mine = []
    for row in rows:
        if not isinstance(row, Mapping) or key_field not in row:
            return prepare_items(rows, key_field)  # raises the error naming the bad row
        try:
            iid = root_item_id(row[key_field])
        except InvalidItemError:
            return prepare_items(rows, key_field)
        if iid in seen:
            return prepare_items(rows, key_field)
        seen.add(iid)
        if iid in wanted:
            mine.append(row)
    return prepare_items(mine, key_field)


def snapshot_items(
    uri: str, key_field: str, storage_options: dict[str, str] | None = None, ids: list[Any] | None = None
) -> list[SourceItem]:
    """The items of an inline source's snapshot at ``uri`` (only those of ``ids`` when given, str ids)."""
    table = read_lance_table(uri, storage_options)
    if ids is not None and table.num_rows > len(ids) and all(isinstance(i, str) for i in ids):
        table = table.filter(pc.is_in(table["item_id"], value_set=pa.array(ids, pa.string())))
    return prepare_items((decode_source_json(t) for t in table["item"].to_pylist()), key_field)


def chunk_items(
    chunk: Mapping[str, Any] | ChunkSpec,
    *,
    pipeline: str,
    experiment: str,
    processor_version: str | None,
    storage_options: dict[str, str] | None = None,
) -> list[SourceItem]:
    """The source items of a chunk (its XCom dict or spec), in the chunk's order; checks it belongs to this task.

    ``processor_version`` None: the task takes the plan's (see :meth:`ChunkSpec.check_task`).
    """
    spec = ChunkSpec.from_xcom(chunk)
    spec.check_task(pipeline=pipeline, experiment=experiment, processor_version=processor_version)
    ids = list(spec.item_ids)
    if spec.snapshot:
        # The snapshot holds the whole planned source; decode and fingerprint only this chunk's rows
        # (the planner validated the rest), so N chunks cost one source's worth of work, not N.
        items = snapshot_items(spec.source, spec.key_field, storage_options, ids)
    elif spec.rows is not None:
        # a streamed plan's chunk names its rows: read those, not the source (the plan validated it all)
        items = items_at(spec.source, [list(r) for r in spec.rows], spec.key_field, storage_options)
    else:
        rows = list(read_source(spec.source, storage_options=storage_options))
        items = _prepare_chunk_rows(rows, spec.key_field, ids)
    by_id = {s.item_id: s for s in items}
    missing = [i for i in ids if i not in by_id]
    if missing:
        raise InvalidItemError(
            f"{len(missing)} planned item(s) are no longer in source {spec.source!r} (e.g. {missing[0]!r}); "
            "the source changed after planning: rerun the plan task"
        )
    return [by_id[i] for i in ids]
