"""The ``datagen_status`` dict and the "failed" predicate: one home for both.

An item is *failed* when its lifecycle status is still ``running`` and it carries at least one FAILED
row: it started, an attempt failed, and no later attempt finished it. That is what a rerun retries.
FAILED rows never change the lifecycle status (see ``docs/design.md``, "Lenses"), so "failed" is a
view over two columns of the state table, not a status of its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_datagen.core.fold.usage import empty_usage
from airflow_provider_datagen.core.schema import ItemStatus

if TYPE_CHECKING:
    from collections.abc import Mapping

#: The keys of every ``datagen_status`` dict (``CheckpointLog.summary()``, ``status_of()``, the XCom).
STATUS_KEYS = (
    "pipeline",
    "experiment",
    "total",
    "completed",
    "completed_by_version",
    "filtered",
    "running",
    "never_started",
    "failed_items",
    "failed_item_ids",
    "pending",
    "children",
    "fencing_violations",
    "log_version",
    "usage",
)

#: How many failed item ids a status dict samples (the count is always exact).
FAILED_SAMPLE = 20

#: The status shown for a failed item (a view, never written to the log).
FAILED = "failed"

#: The ``completed_by_version`` key of items whose generation recorded no processor version.
NO_VERSION = "(none)"


def is_failed(status: str | None, failures: int | None) -> bool:
    """Whether one item, given its lifecycle status and FAILED-row count, is failed."""
    return status == ItemStatus.RUNNING.value and bool(failures)


def failed_mask(states: pa.Table) -> pa.ChunkedArray | pa.Array:
    """The same predicate over a state table (columns ``status`` and ``failures``)."""
    if states.num_rows == 0:
        return pa.array([], pa.bool_())
    return pc.and_(pc.equal(states["status"], ItemStatus.RUNNING.value), pc.greater(states["failures"], 0))


def display_status(row: Mapping[str, Any]) -> str:
    """The status a page shows for a state row: ``failed`` when :func:`is_failed`, else the lifecycle."""
    status = str(row["status"])
    return FAILED if is_failed(status, row.get("failures")) else status


def version_counts(versions: pa.ChunkedArray | pa.Array) -> dict[str, int]:
    """How many of ``versions`` (one per item) are each processor version, ordered by version."""
    if not len(versions):
        return {}
    counts = pc.value_counts(pc.fill_null(versions, NO_VERSION)).to_pylist()
    return {str(e["values"]): int(e["counts"]) for e in sorted(counts, key=lambda e: str(e["values"]))}


def summarize(
    states: pa.Table, *, pipeline: str, experiment: str, log_version: int, usage: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The ``datagen_status`` dict of a state table: root items by lifecycle status, failures, children.

    Counts are over root items (children are counted apart); ``pending`` is what a rerun would touch:
    running (failed included) plus never started. ``completed_by_version`` splits ``completed`` by
    the processor version of each item's completing generation, e.g. ``{"v1": 480, "v2": 20}``.
    ``usage`` is the log's usage ledger (``CheckpointLog.usage()``: calls, tokens, cost by model).
    """
    roots = states
    if states.num_rows:
        is_root = pc.equal(pc.count_substring(states["item_id"], "/"), 0)
        # no copy of the table when every item is a root (the usual case: a copy is 100 MB per 1M items)
        if not pc.all(is_root).as_py():
            roots = states.filter(is_root)
    counts = {s.value: 0 for s in ItemStatus}
    if roots.num_rows:
        for entry in pc.value_counts(roots["status"]).to_pylist():
            counts[entry["values"]] = int(entry["counts"])
    failed = roots.filter(failed_mask(roots)) if roots.num_rows else roots
    by_version: dict[str, int] = {}
    if counts[ItemStatus.COMPLETED.value]:
        completed = pc.equal(roots["status"], ItemStatus.COMPLETED.value)
        by_version = version_counts(pc.filter(roots["processor_version"], completed))
    values = {
        "pipeline": pipeline,
        "experiment": experiment,
        "total": roots.num_rows,
        "completed": counts[ItemStatus.COMPLETED.value],
        "completed_by_version": by_version,
        "filtered": counts[ItemStatus.FILTERED.value],
        "running": counts[ItemStatus.RUNNING.value],
        "never_started": counts[ItemStatus.NEVER_STARTED.value],
        "failed_items": failed.num_rows,
        "failed_item_ids": sorted(failed["item_id"].to_pylist())[:FAILED_SAMPLE] if failed.num_rows else [],
        "pending": counts[ItemStatus.RUNNING.value] + counts[ItemStatus.NEVER_STARTED.value],
        "children": states.num_rows - roots.num_rows,
        "fencing_violations": int(pc.sum(states["violations"]).as_py() or 0) if states.num_rows else 0,
        "log_version": log_version,
        "usage": dict(usage) if usage is not None else empty_usage(),
    }
    return {key: values[key] for key in STATUS_KEYS}
