"""Maintenance of a log: compaction, scalar indices, cleanup and the state and usage projections, under a lease.

Many small appends make many fragments, and an index does not cover fragments appended after it
was built, so one maintenance worker per experiment at a time compacts, refreshes the indices,
drops old versions and stores the state and usage projections; it never loses an event written concurrently
(see docs/design.md, "Mapping onto Lance"). A planner also stores its fold as the projection here,
under the same lease.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import TYPE_CHECKING, Any

from airflow_provider_datagen.core.store import lance_io, projection, usage_projection
from airflow_provider_datagen.core.store.lease import lease_for
from airflow_provider_datagen.core.store.paths import LEASE_FILE, LEASE_OBJECT, experiment_uri, is_local

if TYPE_CHECKING:
    import lance
    import pyarrow as pa

    from airflow_provider_datagen.core.store.table import LanceTable

logger = logging.getLogger(__name__)

INDEXED_COLUMNS = ("item_id", "root_item_id", "event_id")
#: Events a fold must cover beyond the state projection before a planner stores it as the new one.
PROJECTION_MIN_NEW_EVENTS = 1 << 20
#: Appends between two counts of a log's fragments (counting lists the manifest).
_AUTO_CHECK_EVERY = 32


class MaintenanceLease:
    """At most one maintenance worker per experiment, across hosts.

    A local root takes a non-blocking file lock (one host owns the files); an object-store root takes
    a timed lease object beside the log (:class:`~airflow_provider_datagen.core.store.lease.ObjectLease`),
    so maintenances on two hosts exclude each other too. Lance's optimistic commit stays the last
    arbiter: a compaction that still races one loses its commit, which :func:`maintain` reports as
    skipped. Nothing is lost either way.

    :param uri: the log's URI.
    :param storage_options: the log's storage options (object stores only).
    """

    def __init__(self, uri: str, storage_options: dict[str, str] | None = None) -> None:
        base = experiment_uri(uri)
        name = LEASE_FILE if is_local(uri) else LEASE_OBJECT
        self._lease = lease_for(f"{base}/{name}", storage_options)

    def acquire(self) -> bool:
        return self._lease.acquire()

    def release(self) -> None:
        self._lease.release()


def maintain(log: LanceTable, *, cleanup_older_than: dt.timedelta, target_rows_per_fragment: int) -> dict[str, Any]:
    """See :meth:`CheckpointLog.maintain`."""
    if log.dataset() is None:
        return {"skipped": True, "reason": "the log is empty"}
    lease = MaintenanceLease(log.uri, log.storage_options)
    if not lease.acquire():
        return {"skipped": True, "reason": "another maintenance worker holds the lease"}
    try:
        ds = log.dataset()
        if ds is None:
            return {"skipped": True, "reason": "the log is empty"}
        before = len(ds.get_fragments())
        try:
            ds.optimize.compact_files(target_rows_per_fragment=target_rows_per_fragment)
            ds = log.dataset()
            assert ds is not None
            present = {idx.field_names[0] for idx in ds.describe_indices() if idx.field_names}
            for col in INDEXED_COLUMNS:
                if col not in present:
                    ds.create_scalar_index(col, "BTREE")
            ds = log.dataset()
            assert ds is not None
            ds.optimize.optimize_indices()
            ds = log.dataset()
            assert ds is not None
            removed = ds.cleanup_old_versions(older_than=cleanup_older_than)
        except lance_io.LANCE_ERRORS as exc:
            if "conflict" in str(exc).lower() or "retryable" in str(exc).lower():
                return {"skipped": True, "reason": f"a concurrent maintenance committed first ({exc})"}
            raise log.translate(exc, "maintaining the log") from None
        ds = log.dataset()
        assert ds is not None
        projected = projection.write_projection(log, ds, cleanup_older_than)
        usage_rows = usage_projection.write_usage_projection(log, ds, cleanup_older_than)
        return {
            "skipped": False,
            "projected_items": projected,
            "projected_usage_rows": usage_rows,
            "fragments_before": before,
            "fragments_after": len(ds.get_fragments()),
            "version": int(ds.version),
            "removed_versions": int(getattr(removed, "old_versions", 0) or 0),
            "indices": sorted(INDEXED_COLUMNS),
        }
    finally:
        lease.release()


class AutoMaintenance:
    """When a log's appends call for a maintenance: once it has ``limit`` fragments or more."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.appends_since_check = 0

    def due(self, limit: int | None, ds: lance.LanceDataset | None) -> bool:
        """After an append to ``ds``: whether to maintain now (``limit`` None or 0: never)."""
        if not limit or ds is None:
            return False
        self.appends_since_check += 1
        # Counting fragments lists the manifest; once every 32 appends is plenty for a bound of hundreds.
        if self.appends_since_check < _AUTO_CHECK_EVERY:
            return False
        self.appends_since_check = 0
        fragments = len(ds.get_fragments())
        if fragments >= limit:
            logger.info("log %s has %d fragments: running maintenance", self.uri, fragments)
            return True
        return False


def refresh_projection(
    log: LanceTable,
    memo: projection.FoldMemo | None,
    *,
    min_new_events: int | None,
    cleanup_older_than: dt.timedelta,
) -> bool:
    """See :meth:`CheckpointLog.refresh_projection` (``memo``: the log object's last fold)."""
    ds = log.dataset()
    if ds is None:
        return False
    folded = projection.memo_base(memo, log, ds) if lance_io.row_versions(ds) else None
    if folded is None:
        return False
    table, version = folded
    new = projection_wanted(log, ds, version, min_new_events)
    return bool(new) and store_fold(log, table, version, new, cleanup_older_than)


def projection_wanted(log: LanceTable, ds: lance.LanceDataset, version: int, min_new_events: int | None = None) -> int:
    """How many events a fold at ``version`` covers beyond the stored projection; 0 when not worth storing.

    Worth storing: at least ``min_new_events`` (default :data:`PROJECTION_MIN_NEW_EVENTS`) of them.
    """
    if min_new_events is None:
        min_new_events = PROJECTION_MIN_NEW_EVENTS
    if not lance_io.row_versions(ds):
        return 0
    stored_version = projection.projection_version(log)
    if stored_version >= version:
        return 0
    try:
        new = ds.count_rows(
            filter=f"_row_created_at_version > {stored_version} AND _row_created_at_version <= {version}"
        )
    except lance_io.LANCE_ERRORS as exc:
        raise log.translate(exc, "reading the log") from None
    return int(new) if new >= min_new_events else 0


def store_fold(
    log: LanceTable,
    states: pa.Table | pa.RecordBatchReader,
    version: int,
    new: int,
    cleanup_older_than: dt.timedelta = dt.timedelta(hours=1),
) -> bool:
    """Store ``states``, the fold of the log at ``version`` (``new`` events past the projection), as the projection."""
    lease = MaintenanceLease(log.uri, log.storage_options)
    if not lease.acquire():  # a maintenance is writing a newer projection
        return False
    try:
        stored = projection.store_projection(log, states, version, cleanup_older_than)
    finally:
        lease.release()
    if stored:
        logger.info(
            "stored the fold of %s at version %d as its state projection (%d new events)", log.uri, version, new
        )
    return stored
