"""Chunk descriptors: how a plan hands pending work to mapped workers without shipping payloads.

A chunk names its source and item ids, never the items themselves, so XComs stay small. An inline
source (a list in the DAG file) is snapshotted once, content-addressed, next to the log, so every
mapped worker reads exactly the items that were planned.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_datagen.core.events import decode_source_json
from airflow_provider_datagen.core.ids import key_of, root_item_id
from airflow_provider_datagen.core.planner import REDO_NEVER, ResumePlan, check_redo_completed, classify, status_of
from airflow_provider_datagen.core.sources import SourceItem, load_source, prepare_items, read_source
from airflow_provider_datagen.core.store.lance_io import read_lance_table
from airflow_provider_datagen.exceptions import ConfigurationError, InvalidItemError

if TYPE_CHECKING:
    from airflow_provider_datagen.core.store.log import CheckpointLog

_LABEL_KEY = 40


@dataclass
class PlannedChunks:
    """The outcome of planning: the plan, the chunk descriptors and the status dict."""

    plan: ResumePlan
    chunks: list[dict[str, Any]]
    chunk_size: int
    status: dict[str, Any]


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
) -> PlannedChunks:
    """Fold the log once, classify the source and cut the pending items into chunk descriptors.

    Each descriptor carries ``redo_completed`` (see :func:`~airflow_provider_datagen.core.planner.plan_resume`),
    so the mapped tasks redo what the plan asked.
    """
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ConfigurationError(f"chunk_size must be a positive int, got {chunk_size!r}")
    check_redo_completed("plan_chunks", redo_completed)
    items = load_source(source, key_field)
    states = log.states()
    # the mapped tasks read the log next: with the fold stored, they read it and the events since
    log.refresh_projection()
    plan = classify(items, states, processor_version, log.version, redo_completed=redo_completed)
    status = status_of(log, items, key_field, states=states)
    pending = plan.pending
    size = chunk_size
    if pending and math.ceil(len(pending) / size) > max_chunks:
        size = math.ceil(len(pending) / max_chunks)
    if isinstance(source, (list, tuple)):
        ref = log.write_source_snapshot(items) if pending else ""
        snapshot = True
    else:
        path = os.fspath(source)
        ref = path if "://" in path else os.path.abspath(path)
        snapshot = False
    chunks = []
    for index, start in enumerate(range(0, len(pending), size)):
        ids = pending[start : start + size]
        chunks.append(
            {
                "pipeline": log.pipeline,
                "experiment": log.experiment,
                "processor_version": processor_version,
                "redo_completed": redo_completed,
                "source": ref,
                "snapshot": snapshot,
                "key_field": key_field,
                "item_ids": ids,
                "label": chunk_label(ids),
                "index": index,
                "plan_log_version": plan.log_version,
            }
        )
    return PlannedChunks(plan, chunks, size, status)


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


def chunk_items(
    chunk: dict[str, Any],
    *,
    pipeline: str,
    experiment: str,
    processor_version: str,
    storage_options: dict[str, str] | None = None,
) -> list[SourceItem]:
    """The source items of a chunk, in the chunk's order; checks the chunk belongs to this task."""
    for param, mine in (("pipeline", pipeline), ("experiment", experiment), ("processor_version", processor_version)):
        theirs = chunk.get(param)
        if theirs != mine:
            raise ConfigurationError(
                f"{param} mismatch: the plan produced chunks for {param}={theirs!r} but this task has "
                f"{param}={mine!r}; give DatagenPlanOperator and DatagenMapOperator the same {param}"
            )
    ids = chunk.get("item_ids")
    if not isinstance(ids, list):
        raise ConfigurationError("chunk has no item_ids list; pass expand_kwargs(plan.output) unchanged")
    key_field = str(chunk.get("key_field", "id"))
    if chunk.get("snapshot"):
        table = read_lance_table(str(chunk["source"]), storage_options)
        # The snapshot holds the whole planned source; decode and fingerprint only this chunk's rows
        # (the planner validated the rest), so N chunks cost one source's worth of work, not N.
        if table.num_rows > len(ids) and all(isinstance(i, str) for i in ids):
            table = table.filter(pc.is_in(table["item_id"], value_set=pa.array(ids, pa.string())))
        items = prepare_items((decode_source_json(t) for t in table["item"].to_pylist()), key_field)
    else:
        items = _prepare_chunk_rows(list(read_source(chunk["source"])), key_field, ids)
    by_id = {s.item_id: s for s in items}
    missing = [i for i in ids if i not in by_id]
    if missing:
        raise InvalidItemError(
            f"{len(missing)} planned item(s) are no longer in source {chunk.get('source')!r} (e.g. {missing[0]!r}); "
            "the source changed after planning: rerun the plan task"
        )
    return [by_id[i] for i in ids]
