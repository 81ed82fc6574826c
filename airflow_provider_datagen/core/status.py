"""The ``datagen_status`` dict (its type, :class:`DatagenStatus`, and its counts' builder) and the "failed" predicate.

An item is *failed* when its lifecycle status is still ``running`` and it carries at least one FAILED
row: it started, an attempt failed, and no later attempt finished it. That is what a rerun retries.
FAILED rows never change the lifecycle status (see ``docs/design.md``, "Lenses"), so "failed" is a
view over two columns of the state table, not a status of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_datagen.core.fold.usage import empty_usage
from airflow_provider_datagen.core.schema import ItemStatus

if TYPE_CHECKING:
    from collections.abc import Mapping


class _SourceCounts(TypedDict, total=False):
    #: a plan over a source sets it (``status_of``, the path plans): items edited since they were done
    invalidated: int


class ItemCounts(_SourceCounts):
    """The item counts of a ``datagen_status``, over the log's root items or a source's (see :func:`item_counts`)."""

    total: int
    completed: int
    completed_by_version: dict[str, int]
    filtered: int
    running: int
    never_started: int
    pending: int


class DatagenStatus(ItemCounts):
    """The ``datagen_status`` dict: what ``CheckpointLog.summary()`` and ``status_of()`` give, the status XCom."""

    pipeline: str
    experiment: str
    failed_items: int
    failed_item_ids: list[str]
    children: int
    fencing_violations: int
    log_version: int
    usage: dict[str, Any]
    stopped_by_budget: bool
    removed: int
    #: items submitted to a provider's batch and not yet back (core/batch)
    in_batch: int


#: The keys of every ``datagen_status`` dict (``CheckpointLog.summary()``, ``status_of()``, the XCom),
#: in the order the dict lists them: :class:`DatagenStatus`'s required keys.
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
    "stopped_by_budget",
    "removed",
    "in_batch",
)
if frozenset(STATUS_KEYS) != DatagenStatus.__required_keys__:  # one list of keys, checked where both live
    raise AssertionError(f"STATUS_KEYS {STATUS_KEYS} differ from DatagenStatus's keys")

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


@dataclass(frozen=True)
class Tally:
    """The counts a ``datagen_status`` is made of, over the items of a state table.

    Every count is a sum over items, so the tally of a log can be updated by the items that changed
    (:meth:`replaced`) instead of recounted over all of them (see ``core/store/tally.py``).
    ``failed_ids`` holds the failed root ids in sorted order, all of them or the first ones only
    (then fewer than ``failed``).
    """

    roots: int = 0
    statuses: Mapping[str, int] = field(default_factory=dict)
    completed_by_version: Mapping[str, int] = field(default_factory=dict)
    failed: int = 0
    failed_ids: tuple[str, ...] = ()
    children: int = 0
    violations: int = 0

    def replaced(self, old: Tally, new: Tally) -> Tally | None:
        """This tally with some items' rows ``old`` replaced by ``new`` (both tallied with every failed id).

        None when the failed ids this tally kept no longer cover the first :data:`FAILED_SAMPLE` of
        the result: the caller reads them again.
        """
        gone = set(old.failed_ids)
        kept = [i for i in self.failed_ids if i not in gone]
        ids = sorted({*kept, *new.failed_ids})
        if len(self.failed_ids) < self.failed:
            # ids past the last one kept may be preceded by failed ids this tally never listed
            last = self.failed_ids[-1] if self.failed_ids else ""
            ids = [i for i in ids if i <= last]
            if len(ids) < FAILED_SAMPLE:
                return None
        return Tally(
            roots=self.roots - old.roots + new.roots,
            statuses=_plus(self.statuses, old.statuses, new.statuses),
            completed_by_version=_plus(self.completed_by_version, old.completed_by_version, new.completed_by_version),
            failed=self.failed - old.failed + new.failed,
            failed_ids=tuple(ids),
            children=self.children - old.children + new.children,
            violations=self.violations - old.violations + new.violations,
        )

    def joined(self, other: Tally, keep: int | None = FAILED_SAMPLE) -> Tally:
        """The tally of this tally's items and ``other``'s, listing the first ``keep`` failed ids.

        The two count disjoint items (a state table's batches). Each side lists its own first failed
        ids, so the first ``keep`` of both are among them.
        """
        ids = sorted({*self.failed_ids, *other.failed_ids})
        return Tally(
            roots=self.roots + other.roots,
            statuses=_plus(self.statuses, {}, other.statuses),
            completed_by_version=_plus(self.completed_by_version, {}, other.completed_by_version),
            failed=self.failed + other.failed,
            failed_ids=tuple(ids if keep is None else ids[:keep]),
            children=self.children + other.children,
            violations=self.violations + other.violations,
        )


def _plus(base: Mapping[str, int], minus: Mapping[str, int], plus: Mapping[str, int]) -> dict[str, int]:
    """``base - minus + plus`` per key, zeros dropped, keys sorted (as :func:`version_counts` orders them)."""
    out = dict(base)
    for key, n in minus.items():
        out[key] = out.get(key, 0) - n
    for key, n in plus.items():
        out[key] = out.get(key, 0) + n
    return {key: out[key] for key in sorted(out, key=str) if out[key]}


def tally(states: pa.Table, keep: int | None = FAILED_SAMPLE) -> Tally:
    """The :class:`Tally` of a state table, listing the first ``keep`` failed ids (None: all of them)."""
    if states.num_rows == 0:
        return Tally()
    is_root = pc.equal(pc.count_substring(states["item_id"], "/"), 0)
    roots = states
    # no copy of the table when every item is a root (the usual case: a copy is 100 MB per 1M items)
    if not pc.all(is_root).as_py():
        roots = states.filter(is_root)
    statuses: dict[str, int] = {}
    by_version: dict[str, int] = {}
    failed_ids: list[str] = []
    failed = 0
    if roots.num_rows:
        statuses = {e["values"]: int(e["counts"]) for e in pc.value_counts(roots["status"]).to_pylist()}
        if statuses.get(ItemStatus.COMPLETED.value):
            completed = pc.equal(roots["status"], ItemStatus.COMPLETED.value)
            by_version = version_counts(pc.filter(roots["processor_version"], completed))
        ids = pc.filter(roots["item_id"], failed_mask(roots))
        failed = len(ids)
        if failed:
            # Arrow orders strings by their UTF-8 bytes: the code point order sorted() gives
            ids = pc.take(ids, pc.array_sort_indices(ids))
            failed_ids = (ids if keep is None else ids[:keep]).to_pylist()
    return Tally(
        roots=roots.num_rows,
        statuses=statuses,
        completed_by_version=by_version,
        failed=failed,
        failed_ids=tuple(failed_ids),
        children=states.num_rows - roots.num_rows,
        violations=int(pc.sum(states["violations"]).as_py() or 0),
    )


def item_counts(
    *,
    total: int,
    completed: int,
    completed_by_version: dict[str, int],
    filtered: int,
    running: int,
    never_started: int,
    invalidated: int | None = None,
) -> ItemCounts:
    """The counts of a ``datagen_status``; ``pending`` is what a rerun touches: running, never started, invalidated.

    ``invalidated`` (items done on an input since edited) is counted by a plan over a source only:
    None leaves the key out, as a status over the log's items has it.
    """
    counts: ItemCounts = {
        "total": total,
        "completed": completed,
        "completed_by_version": completed_by_version,
        "filtered": filtered,
        "running": running,
        "never_started": never_started,
        "pending": running + never_started + (invalidated or 0),
    }
    if invalidated is not None:
        counts["invalidated"] = invalidated
    return counts


def status_dict(
    t: Tally, *, pipeline: str, experiment: str, log_version: int, usage: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The ``datagen_status`` dict of a :class:`Tally`: root items by lifecycle status, failures, children.

    Counts are over root items (children are counted apart); ``pending`` is what a rerun would touch:
    running (failed included) plus never started. ``completed_by_version`` splits ``completed`` by
    the processor version of each item's completing generation, e.g. ``{"v1": 480, "v2": 20}``.
    ``usage`` is the log's usage ledger (``CheckpointLog.usage()``: calls, tokens, cost by model).
    """
    counts = {s.value: int(t.statuses.get(s.value, 0)) for s in ItemStatus}
    values: DatagenStatus = {
        "pipeline": pipeline,
        "experiment": experiment,
        **item_counts(
            total=t.roots,
            completed=counts[ItemStatus.COMPLETED.value],
            completed_by_version=dict(t.completed_by_version),
            filtered=counts[ItemStatus.FILTERED.value],
            running=counts[ItemStatus.RUNNING.value],
            never_started=counts[ItemStatus.NEVER_STARTED.value],
        ),
        "failed_items": t.failed,
        "failed_item_ids": list(t.failed_ids[:FAILED_SAMPLE]),
        "children": t.children,
        "fencing_violations": t.violations,
        "log_version": log_version,
        "usage": dict(usage) if usage is not None else empty_usage(),
        # set by CheckpointLog.summary() (core/store/tally.py: finish), which reads the budget and the source
        "stopped_by_budget": False,
        "removed": 0,
        # set by finish() too: the items of the experiment's open batch submissions
        "in_batch": 0,
    }
    built = dict(values)
    return {key: built[key] for key in STATUS_KEYS}
