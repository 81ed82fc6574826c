"""The ``datagen_status`` of a log from the state projection and the items changed since, not its whole fold.

Every mapped task pushes the status of the whole experiment when it ends. Recounting it from the
states of every item costs the fold of the whole log (or the whole projection read and counted) in
every task: at 1M items, most of a second per chunk, a thousand times over. The counts are sums
over items, so the projection stores its own :class:`~airflow_provider_datagen.core.status.Tally`
and a status takes it, subtracts the projection rows of the items with events since, and adds
those items folded again from their events: the cost follows the events written since the
projection, not the size of the log. Exact by construction; where it cannot be (no projection, one
written before tallies, too many items changed), :meth:`CheckpointLog.summary` folds as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_datagen.core.fold import STATE_SCHEMA, fold_table
from airflow_provider_datagen.core.ledger.budget import Budget
from airflow_provider_datagen.core.schema import LIGHT_COLUMNS, ItemStatus
from airflow_provider_datagen.core.status import Tally, item_counts, status_dict, tally
from airflow_provider_datagen.core.store import batches, lance_io, projection
from airflow_provider_datagen.core.store.source_ref import SourceRef, recorded_source

if TYPE_CHECKING:
    from collections.abc import Sequence

    import lance

    from airflow_provider_datagen.core.store.table import LanceTable

#: The projection columns a tally counts.
_COLUMNS = ["item_id", "status", "processor_version", "failures", "violations"]


class LogReads(Protocol):
    """What a status reads of the log: :class:`~.log.CheckpointLog` is one (typed here, not imported back)."""

    table: LanceTable
    uri: str
    storage_options: dict[str, str] | None
    pipeline: str
    experiment: str

    @property
    def version(self) -> int: ...

    def states(self) -> pa.Table: ...

    def states_of(self, ids: pa.Array | Sequence[str]) -> pa.Table: ...

    def usage(self) -> dict[str, Any]: ...

    def usage_spend(self, *, exclude_writer: tuple[str, int] | None = None) -> tuple[int, int]: ...

    def budget(self) -> dict[str, Any]: ...


def log_status(log: LogReads) -> dict[str, Any] | None:
    """:meth:`CheckpointLog.summary` from :func:`stored_tally`, or from a fold of the log when it cannot be.

    Either way counted over the recorded source and with ``stopped_by_budget`` (see :func:`finish`).
    """
    ds = log.table.dataset()
    counted = None if ds is None else stored_tally(log.table, ds)
    if ds is None or counted is None:
        status = status_dict(
            tally(log.states()),
            pipeline=log.pipeline,
            experiment=log.experiment,
            log_version=log.version,
            usage=log.usage(),
        )
    else:
        status = status_dict(
            counted, pipeline=log.pipeline, experiment=log.experiment, log_version=int(ds.version), usage=log.usage()
        )
    return finish(log, status, whole_log=True)


def finish(log: LogReads, status: dict[str, Any], *, whole_log: bool) -> dict[str, Any]:
    """``status`` (a tally of the log's items) counted over the recorded source, with ``stopped_by_budget``.

    ``whole_log``: the status counts every item of the log (not a subset of its states), so the
    source view applies: see :func:`over_source`. An experiment with no recorded source, or one
    recorded before the plan listed the items it left out, keeps the log's counts.
    """
    if whole_log:
        ref = recorded_source(log.uri, log.storage_options)
        if ref is not None and ref.removed_ids is not None:
            over_source(log, status, ref)
    status["stopped_by_budget"] = budget_stop(log, int(status["pending"])) is not None
    status["in_batch"] = in_batch(log)
    return status


def in_batch(log: batches.Located) -> int:
    """Items of the experiment's open batch submissions whose batch has not ended: submitted to a provider
    and not yet back (an ended batch still open waits only for its rows to be recorded, some of them
    perhaps already are: by a run of another chunk after the plan's chunking changed)."""
    return len({iid for sub in batches.open_submissions(log) if sub.kind != batches.ENDED for iid in sub.item_ids})


def budget_stop(log: LogReads, pending: int) -> str | None:
    """Why the experiment stopped at its budget (spend and budget) with ``pending`` items left, or None."""
    recorded = log.budget()
    budget = Budget(recorded.get("budget_usd"), recorded.get("budget_tokens"))
    if pending <= 0 or not budget.is_set:
        return None
    return budget.reached(*log.usage_spend())


def over_source(log: LogReads, status: dict[str, Any], ref: SourceRef) -> None:
    """Count ``status`` over ``ref``'s items: the log's items it left out are ``removed``, apart.

    ``total`` is the source's items; those the log never saw are ``never_started`` (a budget stop
    leaves items no task pulled). The plan lists the log's root items not in the source
    (``ref.removed_ids``), so this reads their states only, never the source.
    """
    gone = tally(log.states_of(list(ref.removed_ids or ())), keep=None)
    counts = {s.value: int(gone.statuses.get(s.value, 0)) for s in ItemStatus}
    in_source = int(status["total"]) - gone.roots
    by_version = dict(status["completed_by_version"])
    for version, n in gone.completed_by_version.items():
        by_version[version] = by_version.get(version, 0) - n
    completed = status["completed"] - counts[ItemStatus.COMPLETED.value]
    filtered = status["filtered"] - counts[ItemStatus.FILTERED.value]
    running = status["running"] - counts[ItemStatus.RUNNING.value]
    never_started = status["never_started"] + max(0, ref.items - in_source) - counts[ItemStatus.NEVER_STARTED.value]
    status.update(
        item_counts(
            total=completed + filtered + running + never_started,
            completed=completed,
            completed_by_version={v: n for v, n in by_version.items() if n > 0},
            filtered=filtered,
            running=running,
            never_started=never_started,
        )
    )
    status["failed_items"] -= gone.failed
    left_out = set(gone.failed_ids)
    status["failed_item_ids"] = [i for i in status["failed_item_ids"] if i not in left_out]
    status["removed"] = gone.roots


def stored_tally(log: LanceTable, ds: lance.LanceDataset) -> Tally | None:
    """The tally of the log at ``ds``'s version from the stored projection and the events since.

    None when there is no projection with a tally that covers a version up to ``ds``'s, or when
    more than half the items it holds have changed since (then one fold of the log costs less, and
    the caller stores it as the new projection).
    """
    if not lance_io.row_versions(ds):
        return None
    stored = projection.open_projection(log)
    version = int(ds.version)
    if stored is None or not 0 < stored.log_version <= version:
        return None
    base = projection.stored_tally(stored)
    if base is None or stored.log_version == version:
        return base
    # Light columns of the rows since: the items first seen after the projection are folded from
    # them alone; only the items it already held need their earlier events too.
    since = log.scan_at(ds, LIGHT_COLUMNS, f"_row_created_at_version > {stored.log_version}")
    touched = pc.unique(since["item_id"])
    if len(touched) == 0:
        return base
    if len(touched) > max(1000, (base.roots + base.children) // 2):
        return None
    old = _projection_rows(stored, touched)
    if old is None:
        return None  # the projection is disposable: a version cleaned up under us means a fold
    held = old["item_id"]
    if len(held):
        fresh = since.filter(pc.invert(pc.is_in(since["item_id"], value_set=held)))
        since = pa.concat_tables([fresh, log.scan_at(ds, LIGHT_COLUMNS, pc.field("item_id").isin(held))])
    before, after = tally(old, keep=None), tally(fold_table(since), keep=None)
    changed = base.replaced(before, after)
    if changed is not None:
        return changed
    # the failed ids the projection kept were cleared: list the rest of them from the projection
    is_failed = (pc.field("status") == pa.scalar(ItemStatus.RUNNING.value)) & (pc.field("failures") > 0)
    try:
        failed = stored.dataset.to_table(columns=["item_id"], filter=is_failed)["item_id"]
    except lance_io.LANCE_ERRORS:
        return None
    full = Tally(
        roots=base.roots,
        statuses=base.statuses,
        completed_by_version=base.completed_by_version,
        failed=base.failed,
        failed_ids=tuple(sorted(i for i in failed.to_pylist() if "/" not in i)),
        children=base.children,
        violations=base.violations,
    )
    return full.replaced(before, after)


def _projection_rows(stored: projection.StoredProjection, ids: pa.Array) -> pa.Table | None:
    """The projection's rows (:data:`_COLUMNS`) of those of ``ids`` it holds; None when it cannot be read.

    Matched here, not in a Lance filter: Lance tests a list of thousands of ids against every row
    (200 ms for 10,000 ids over 100,000 rows), a hash set of them costs a few milliseconds.
    """
    try:
        held = stored.dataset.to_table(columns=["item_id"])["item_id"]
        rows = pc.indices_nonzero(pc.is_in(held, value_set=ids))
        if not len(rows):
            return STATE_SCHEMA.empty_table().select(_COLUMNS)
        return stored.dataset.take(rows, columns=_COLUMNS)
    except lance_io.LANCE_ERRORS:
        return None
