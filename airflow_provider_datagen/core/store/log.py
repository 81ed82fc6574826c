"""CheckpointLog: one append-only Lance dataset per experiment, the only durable source of truth.

A checkpoint batch is one Lance append (one commit); retried batches may land twice and the read
path de-duplicates them by ``event_id``; writers are told apart by ``writer_id``/``writer_epoch``;
blob bytes live in a blob-encoded ``value_blob`` column, located by ``event_id`` and fetched by stable
row id (see docs/design.md, "The event log" and "Where we differ from the original design"). This module opens and
validates the dataset, appends to it, and serves the reads and lenses; staging and numbering events
(:mod:`.batch`, :mod:`.writer`), the states cache (:mod:`.projection`), maintenance
(:mod:`.maintenance`), the usage ledger (:mod:`.ledger`) and raw Lance I/O (:mod:`.lance_io`) live
beside it. Past ~600 lines because :class:`CheckpointLog` is the public face of all of them: the
ledger and snapshot methods are one-line delegations kept here so users have one object to call.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import threading
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import tenacity

from airflow_provider_datagen.core.events import Event, canonical_source_json
from airflow_provider_datagen.core.fold import (
    STATE_SCHEMA,
    FailureRecord,
    ItemState,
    dedupe,
    failure_records,
)
from airflow_provider_datagen.core.ids import check_name
from airflow_provider_datagen.core.schema import (
    DATAGEN_SCHEMA_VERSION,
    DEFAULT_BLOB_THRESHOLD,
    EVENT_SCHEMA,
    NON_BLOB_COLUMNS,
    EventType,
    ItemStatus,
)
from airflow_provider_datagen.core.sources import snapshot_digest
from airflow_provider_datagen.core.status import summarize
from airflow_provider_datagen.core.store import (
    epochs,
    identity,
    lance_io,
    ledger,
    maintenance,
    projection,
    rows,
    tally,
    version_mark,
)
from airflow_provider_datagen.core.store.batch import check_item_id
from airflow_provider_datagen.core.store.paths import is_local, local_path, log_uri, projection_uri, snapshot_uri
from airflow_provider_datagen.core.store.writer import Committer, LogWriter
from airflow_provider_datagen.exceptions import (
    DatagenError,
    InvalidEventError,
    InvalidNameError,
    LogCorruptedError,
    NotALogError,
    SchemaVersionError,
)

if TYPE_CHECKING:
    import concurrent.futures
    from collections.abc import Callable, Iterable, Iterator, Sequence

    import lance
    import numpy as np

    from airflow_provider_datagen.core.sources import SourceItem

#: Rows per batch of a streamed fold scan, and batches Lance decodes ahead: small enough that a
#: scan never holds much, large enough that per-batch Python stays a few percent of the fold.
_SCAN_BATCH_ROWS = 1 << 16
_SCAN_READAHEAD = 2

__all__ = ["CheckpointLog"]

logger = logging.getLogger(__name__)


def _sql_free_eq(column: str, value: str) -> pc.Expression:
    # pyarrow expressions never need SQL quoting, so ids with quotes or newlines are safe filters.
    return pc.field(column) == pa.scalar(value, pa.string())


class CheckpointLog:
    """The event log of one experiment: ``<root>/datagen_checkpoints/<pipeline>/<experiment>/log.lance``.

    Opening is lazy: nothing is created until the first batch is committed, so reads of a new
    experiment see an empty log.
    """

    def __init__(
        self,
        root: str,
        pipeline: str,
        experiment: str,
        *,
        storage_options: dict[str, str] | None = None,
        blob_threshold: int = DEFAULT_BLOB_THRESHOLD,
        auto_maintain_fragments: int | None = 512,
        durable: bool = True,
        remember_fold: bool = True,
    ) -> None:
        self.root = root
        self.durable = durable
        self.remember_fold = remember_fold
        self._max_fragment_id = -1
        self.pipeline = pipeline
        self.experiment = experiment
        self.storage_options = dict(storage_options) if storage_options else None
        self.blob_threshold = blob_threshold
        self.auto_maintain_fragments = auto_maintain_fragments
        self.uri = log_uri(root, pipeline, experiment)
        self._ds: lance.LanceDataset | None = None
        self._lock = threading.Lock()
        #: the thread of pipelined appends (LogWriter.commit(wait=False)); None while none runs
        self._committer: Committer | None = None
        #: the last fold, see projection.memo_base
        self._memo: projection.FoldMemo | None = None
        #: the last usage read, see ledger.UsageMemo
        self._usage_memo: ledger.UsageMemo | None = None
        self._appends_since_check = 0
        self.projection_uri = projection_uri(self.uri)
        #: which dataset this object reads and how far (a recreated log, a rollback: see .identity)
        self._identity = identity.DatasetIdentity(self.uri)

    def __repr__(self) -> str:
        return f"CheckpointLog({self.uri!r})"

    @classmethod
    def open(
        cls,
        root: str | os.PathLike[str],
        *,
        pipeline: str,
        experiment: str,
        storage_options: dict[str, str] | None = None,
        blob_threshold: int = DEFAULT_BLOB_THRESHOLD,
        auto_maintain_fragments: int | None = 512,
        durable: bool = True,
        remember_fold: bool = True,
    ) -> CheckpointLog:
        """Open (lazily) the log of ``pipeline``/``experiment`` under ``root`` (a path or a URI).

        ``remember_fold`` keeps the last :meth:`states` in memory so the next one re-folds only what
        changed; a process that holds many logs open for long (the UI) turns it off.
        """
        check_name(pipeline, "pipeline")
        check_name(experiment, "experiment")
        root_s = os.fspath(root)
        if not isinstance(root_s, str) or not root_s or "\x00" in root_s:
            raise InvalidNameError(f"root {root!r} must be a non-empty path or URI")
        if is_local(root_s):
            root_s = os.path.abspath(local_path(root_s))
        lg = cls(
            root_s,
            pipeline,
            experiment,
            storage_options=storage_options,
            blob_threshold=blob_threshold,
            auto_maintain_fragments=auto_maintain_fragments,
            durable=durable,
            remember_fold=remember_fold,
        )
        lg._dataset()  # validates an existing dataset (schema version, is it ours) before any use
        return lg

    # --- dataset access and validation ----------------------------------------------------------

    def _translate(self, exc: BaseException, action: str) -> Exception:
        return lance_io.translate(exc, self.uri, action)

    def _open_dataset(self) -> lance.LanceDataset | None:
        if is_local(self.uri):
            path = local_path(self.uri)
            if not os.path.exists(path):
                return None
            if lance_io.being_created(path):
                return None
            if not lance_io.has_manifest(path) and lance_io.later_commit_records(path):
                raise LogCorruptedError(
                    f"{self.uri} holds data files and records of {len(lance_io.later_commit_records(path))} "
                    "commits but no _versions manifest: its version history was deleted or not copied. Nothing "
                    "was changed. Restore the dataset directory (with _versions) from a backup; run maintain() "
                    "after restoring."
                )
            if not lance_io.has_manifest(path):
                raise NotALogError(
                    f"{self.uri} exists but is not a Lance dataset (no _versions manifest); move it away "
                    "or choose another experiment name"
                )
        try:
            ds = lance_io.open_dataset(self.uri, self.storage_options)
        except ValueError as exc:
            if "was not found" in str(exc) and not is_local(self.uri):
                return None
            raise self._translate(exc, "opening the log") from None
        except OSError as exc:
            raise self._translate(exc, "opening the log") from None
        self._check_schema(ds)
        return ds

    def _check_schema(self, ds: lance.LanceDataset) -> None:
        meta = ds.schema.metadata or {}
        raw = meta.get(b"datagen_schema_version")
        if raw is None or "event_id" not in ds.schema.names:
            raise NotALogError(
                f"{self.uri} is a Lance dataset but not a datagen checkpoint log (no "
                "datagen_schema_version); point the experiment elsewhere"
            )
        self._check_version(int(raw))

    def _check_version(self, version: int, row: str | None = None) -> None:
        # a row of another version in a log whose metadata says this one is damage, or a newer writer
        damaged = (
            ""
            if row is None
            else f" ({row} holds it; if no newer release wrote to this log, that row is damaged: restore "
            "the log from a backup)"
        )
        if version > DATAGEN_SCHEMA_VERSION:
            raise SchemaVersionError(
                f"{self.uri} was written with datagen schema version {version}, newer than this code's "
                f"{DATAGEN_SCHEMA_VERSION}; upgrade airflow-provider-datagen to read it (it was not modified){damaged}"
            )
        if version < DATAGEN_SCHEMA_VERSION:
            raise SchemaVersionError(
                f"{self.uri} uses datagen schema version {version}; this code reads version "
                f"{DATAGEN_SCHEMA_VERSION} only. Migrate the log with a release that supports both.{damaged}"
            )

    def _check_versions(
        self, versions: pa.ChunkedArray | pa.Array, scanned: pa.Table | pa.RecordBatch | None = None
    ) -> None:
        """:meth:`_check_version` for the lowest and highest schema version in a scanned column.

        ``scanned`` (the rows scanned) lets the error name the first row of a refused version.
        """
        if len(versions):
            for v in {pc.max(versions).as_py(), pc.min(versions).as_py()}:
                if v != DATAGEN_SCHEMA_VERSION:
                    row = rows.row_name(scanned, int(pc.index(versions, v).as_py())) or self._row_of_version(int(v))
                    self._check_version(int(v), row)

    def _row_of_version(self, version: int) -> str | None:
        """A row holding schema ``version`` (for an error only: the scan that found it had no ids)."""
        ds = self._ds
        if ds is None:
            return None
        try:
            hit = ds.to_table(columns=["event_id", "item_id"], filter=f"schema_version = {version}", limit=1)
        except lance_io.LANCE_ERRORS:
            return None
        return rows.row_name(hit, 0) if hit.num_rows else None

    def _events(self, table: pa.Table) -> list[Event]:
        return rows.decode_events(self.uri, table)

    def _fold(self, item_id: str, events: list[Event], load_blob: Callable[[str], bytes] | None = None) -> ItemState:
        return rows.fold_item(self.uri, item_id, events, load_blob)

    def _dataset(self) -> lance.LanceDataset | None:
        self._wait_appends()  # read your own writes: a pipelined append lands first
        with self._lock:
            if self._ds is None:
                ds = self._open_dataset()
            elif lance_io.is_latest(self.uri, self._ds, self._identity.manifest_token):
                return self._ds
            else:
                ds = self._refreshed(self._ds)
            self._ds = None if ds is None else self._adopt(ds)
            if ds is None and self._identity.known:
                self._identity.forget()
                self._forget("its dataset is gone")
            return self._ds

    def _refreshed(self, ds: lance.LanceDataset) -> lance.LanceDataset | None:
        """The latest version at this URI: of ``ds``'s dataset, or of one written there since (or None)."""
        try:
            ds.checkout_latest()
            return ds
        except (OSError, ValueError):
            # The experiment may have been deleted (and created again): what is at the URI now is
            # read afresh (its own errors are translated there), and _adopt tells which it is.
            return self._open_dataset()

    def _adopt(self, ds: lance.LanceDataset) -> lance.LanceDataset:
        """Read ``ds`` from now on: another dataset at the URI resets every cache; an older version is damage."""
        log_id = lance_io.log_id(ds)
        if not self._identity.known or log_id != self._identity.log_id:
            # a first read of this dataset: only the version mark knows how far runs took it
            version_mark.check_mark(
                self.uri, self.storage_options, log_id, int(ds.version), refresh=lambda: _latest_version(ds)
            )
        if self._identity.adopt(ds):
            self._forget("another dataset is at its URI (deleted and created again)")
            self._check_schema(ds)
        return ds

    def _forget(self, why: str) -> None:
        """Drop every cache of the dataset this object read (its identity is the caller's to reset)."""
        logger.info("log %s: %s; reading it afresh", self.uri, why)
        self._max_fragment_id = -1
        self._memo = None
        self._usage_memo = None

    def check_recorded_version(self, what: str, uri: str, log_id: str | None, version: int) -> None:
        """Refuse a record (a projection, a cache) of this very log at a version the log no longer has.

        A version committed since this object's last read is not a rollback: the log is read again
        before refusing. Records of another dataset, or without an identity, are the caller's to ignore.
        """
        if not self._identity.ahead(log_id, version):
            return
        current = self.version
        if version > current:
            raise self._identity.behind_error(current, what, uri, version)

    @property
    def log_id(self) -> str | None:
        """The identity of the dataset this log read last (None before any, or for a log older than identities)."""
        return self._identity.log_id

    def exists(self) -> bool:
        return self._dataset() is not None

    @property
    def version(self) -> int:
        ds = self._dataset()
        return 0 if ds is None else int(ds.version)

    # --- scans ----------------------------------------------------------------------------------

    def _scan(self, columns: Sequence[str], filter: pc.Expression | None = None) -> pa.Table:
        ds = self._dataset()
        if ds is None:
            return EVENT_SCHEMA.empty_table().select(list(dict.fromkeys([*columns, "schema_version"])))
        return self._scan_ds(ds, columns, filter)

    def _scan_ds(self, ds: lance.LanceDataset, columns: Sequence[str], filter: Any) -> pa.Table:
        cols = list(dict.fromkeys([*columns, "schema_version"]))
        try:
            table = ds.to_table(columns=cols, filter=filter)
        except lance_io.LANCE_ERRORS as exc:
            raise self._translate(exc, "reading the log") from None
        self._check_versions(table["schema_version"], table)
        return table

    def _batches(
        self, ds: lance.LanceDataset, columns: Sequence[str], *, checked: bool = True
    ) -> Iterator[pa.RecordBatch]:
        """The rows of ``columns`` of one version, batch by batch, each batch's schema version checked.

        ``checked=False`` for a second stream of the same rows, whose versions the first one checks.
        """
        cols = list(dict.fromkeys([*columns, "schema_version"])) if checked else list(columns)
        try:
            stream = iter(
                ds.to_batches(
                    columns=cols, batch_size=_SCAN_BATCH_ROWS, batch_readahead=_SCAN_READAHEAD, fragment_readahead=1
                )
            )
        except lance_io.LANCE_ERRORS as exc:
            raise self._translate(exc, "reading the log") from None
        while True:
            # only Lance's own calls are translated, never an error raised by the consumer at the yield
            try:
                batch = next(stream)
            except StopIteration:
                return
            except lance_io.LANCE_ERRORS as exc:
                raise self._translate(exc, "reading the log") from None
            if checked:
                self._check_versions(batch.column("schema_version"), batch)
            yield batch

    # --- appends --------------------------------------------------------------------------------

    @property
    def _inflight(self) -> concurrent.futures.Future[None] | None:
        """The pipelined append in flight, if any."""
        return None if self._committer is None else self._committer.inflight

    def _append_pipelined(self, table: pa.Table, on_error: Callable[[BaseException], None]) -> None:
        """Start appending ``table`` on the committer thread, after the append before it has landed."""
        self._wait_appends()
        if self._committer is None:
            self._committer = Committer(self)
        self._committer.submit(table, on_error)

    def _wait_appends(self, *, close: bool = False) -> None:
        """Wait for the pipelined append in flight, if any, and raise its error here.

        The committer thread itself never waits (an automatic maintenance inside its append reads the
        log); ``close`` also ends the thread, so an idle log holds none.
        """
        committer = self._committer
        if committer is None or committer.on_thread():
            return
        try:
            committer.wait()
        finally:
            if close:
                committer.close()
                self._committer = None

    def _append(self, table: pa.Table) -> None:
        self._wait_appends()
        # No refresh before appending: Lance rebases an append onto whatever version is latest at
        # commit time (appends never conflict), so reading the newest manifest first is wasted I/O.
        ds = self._ds if self._ds is not None else self._dataset()
        try:
            if ds is None:
                self._create(table)
            else:
                self._ds = _append_with_retries(table, ds, self.storage_options)
                self._identity.note(self._ds)
            self._make_durable()
        except DatagenError:
            raise
        except lance_io.LANCE_ERRORS as exc:
            raise self._translate(exc, "appending a batch") from None
        if ds is not None:
            maintenance.maybe_auto_maintain(self)

    def _make_durable(self) -> None:
        """fsync what a commit wrote before it counts as acknowledged (local logs only)."""
        ds = self._ds
        if not self.durable or ds is None or not is_local(self.uri):
            return
        files, self._max_fragment_id = lance_io.committed_files(ds, self._max_fragment_id)
        lance_io.fsync_commit(local_path(self.uri), ds, files)

    def _create(self, table: pa.Table) -> None:
        """Create the dataset with ``table`` as its first commit (see :func:`lance_io.create_dataset`)."""
        ds = lance_io.create_dataset(
            table, self.uri, lance_io.with_log_id(EVENT_SCHEMA), self.storage_options, self._open_dataset
        )
        self._ds = self._adopt(ds)

    # --- writers --------------------------------------------------------------------------------

    def writer(
        self,
        writer_id: str,
        epoch: int,
        *,
        processor_version: str | None = None,
        airflow: dict[str, Any] | None = None,
    ) -> LogWriter:
        """A writer owning the items it writes at ``epoch``; a newer epoch fences older writers."""
        return LogWriter(self, writer_id, epoch, processor_version=processor_version, airflow=airflow)

    def next_epoch(self) -> int:
        """An epoch higher than any written so far and never handed to another caller.

        Every map task asks this first. Two callers never get the same epoch, across processes and
        hosts: the epoch is claimed from a counter beside the log (see :mod:`.epochs`), with the
        highest epoch in the log as its floor.
        """
        return epochs.claim_epoch(self.uri, self.storage_options, self.max_epoch() + 1)

    def mark_version(self) -> None:
        """Record beside the log the version it is at: a new reader refuses a lower one (:mod:`.version_mark`)."""
        if self.exists():
            version_mark.raise_mark(self.uri, self.storage_options, self.log_id, self.version)

    def max_epoch(self) -> int:
        """The highest ``writer_epoch`` in the log, 0 when empty (claimed epochs not yet written aside).

        A fold's ``max_epoch`` counts every row (losers and stale ones too), so when this object's
        last fold or the state projection covers the log up to some version, only the rows
        committed since are scanned, not the whole ``writer_epoch`` column.
        """
        ds = self._dataset()
        if ds is None:
            return 0
        version = int(ds.version)
        top, base = 0, None
        if lance_io.row_versions(ds):
            folded = projection.memo_base(self, ds) or projection.read_projection(self, version, ["max_epoch"])
            if folded is not None:
                top, base = projection.max_of(folded.states["max_epoch"]), folded.version
        if base != version:
            since = None if base is None else f"_row_created_at_version > {base}"
            top = max(top, projection.max_of(self._scan_ds(ds, ["writer_epoch"], since)["writer_epoch"]))
        return top

    # --- reads ----------------------------------------------------------------------------------

    def _dedupe_sorted(self, events: list[Event]) -> list[Event]:
        best = dedupe(events)
        return sorted(best.values(), key=lambda e: (e.item_id, e.item_seq, -e.writer_epoch, e.event_key))

    def events(self, item_id: str) -> list[Event]:
        """Every event of one item, ordered by ``item_seq``, de-duplicated by ``event_id``."""
        return self._dedupe_sorted(self._copies(item_id))

    def subtree(self, root_id: str) -> list[Event]:
        """Every event of a root item and its fan-out children (one filter on ``root_item_id``)."""
        return self._dedupe_sorted(self.subtree_copies(root_id))

    def subtree_copies(self, root_id: str) -> list[Event]:
        """Every stored row of a root item and its children, duplicates included (for folding)."""
        check_item_id(root_id)
        return self._events(self._scan(NON_BLOB_COLUMNS, _sql_free_eq("root_item_id", root_id)))

    def _copies(self, item_id: str) -> list[Event]:
        """Every stored row of one item, duplicates included: which epochs wrote a copy matters to fencing."""
        check_item_id(item_id)
        return self._events(self._scan(NON_BLOB_COLUMNS, _sql_free_eq("item_id", item_id)))

    def item_state(self, item_id: str) -> ItemState:
        """The lifecycle fold of one item (fields hold :class:`BlobRef` for blob-stored values)."""
        return self._fold(item_id, self._copies(item_id), self.load_blob)

    def item_states(self, item_ids: Iterable[str]) -> dict[str, ItemState]:
        """Lifecycle folds of many items with one query."""
        ids = list(dict.fromkeys(item_ids))
        if not ids:
            return {}
        for iid in ids:
            check_item_id(iid)
        table = self._scan(NON_BLOB_COLUMNS, pc.field("item_id").isin(pa.array(ids, pa.string())))
        grouped: dict[str, list[Event]] = {iid: [] for iid in ids}
        for ev in self._events(table):
            grouped.setdefault(ev.item_id, []).append(ev)
        return {iid: self._fold(iid, grouped[iid], self.load_blob) for iid in ids}

    def scan(self, columns: Sequence[str], filter: pc.Expression | None = None) -> pa.Table:
        """Rows of the log projected to ``columns`` (never ``value_blob``), optionally filtered.

        For readers such as the UI that need a filtered projection the lenses do not offer; the
        schema version is checked and Lance errors are translated as for every other read.
        """
        if "value_blob" in columns:
            raise InvalidEventError("scan() never reads value_blob; use load_blob(event_id) for blob bytes")
        return self._scan(columns, filter)

    def completed_root_states(self) -> dict[str, ItemState]:
        """Lifecycle folds of every completed root item, from one scan of the non-blob columns."""
        states = self.states()
        if states.num_rows == 0:
            return {}
        done = states.filter(
            pc.and_(
                pc.equal(states["status"], ItemStatus.COMPLETED.value),
                pc.equal(pc.count_substring(states["item_id"], "/"), 0),
            )
        )
        ids = done["item_id"]
        cols = [c for c in NON_BLOB_COLUMNS if c not in ("error_traceback", "error_message")]
        table = self._scan(cols)
        table = table.filter(pc.is_in(table["item_id"], value_set=ids))
        for missing in ("error_traceback", "error_message"):
            table = table.append_column(missing, pa.nulls(table.num_rows, pa.string()))
        grouped: dict[str, list[Event]] = {}
        for ev in self._events(table):
            grouped.setdefault(ev.item_id, []).append(ev)
        return {iid: self._fold(iid, evs, self.load_blob) for iid, evs in grouped.items()}

    def failures(self, item_id: str | None = None) -> list[FailureRecord]:
        """The failure lens: FAILED rows and fencing violations, of one item or of the whole log."""
        if item_id is not None:
            evs = self._copies(item_id)
            return failure_records(evs, self._fold(item_id, evs).violations)
        table = self._scan(NON_BLOB_COLUMNS, pc.field("event_type") == pa.scalar(EventType.FAILED.value))
        states = self.states()
        bad = states.filter(pc.greater(states["violations"], 0))["item_id"].to_pylist()
        violations = [v for iid in bad for v in self._fold(iid, self._copies(iid)).violations]
        return failure_records(self._events(table), violations)

    # --- states ---------------------------------------------------------------------------------

    def states(self) -> pa.Table:
        """Vectorized fold of every item: one row per item (see ``fold.STATE_SCHEMA``).

        Uses the state projection written by :meth:`maintain` when there is one: items with events
        newer than the projection's log version (``_row_created_at_version``) are re-folded from all
        their events; every other row is exact as stored. Without a usable projection it folds the
        light columns of the whole log.
        """
        return self._states(None)[0]

    def states_for(self, ids: pa.Array | Sequence[str]) -> tuple[pa.Table, np.ndarray]:
        """:meth:`states`, and for each of ``ids`` (unique) its row there, or -1 when it has no events.

        The planner's read. Without a usable projection the fold matches ``ids`` while it encodes
        the log's item ids (``fold.fold_batches``): one hashing pass over the ids instead of two.
        """
        table, index = self._states(ids)
        if index is None:
            index = projection.rows_of(table, projection.id_array(ids))
        return table, index

    def states_of(self, ids: pa.Array | Sequence[str]) -> pa.Table:
        """The rows of :meth:`states` for ``ids`` (unique) alone: a mapped task's read of its chunk.

        Its cost follows the items asked for, not the log (see ``projection.states_of``).
        """
        return projection.states_of(self, ids)

    def _states(self, ids: pa.Array | Sequence[str] | None) -> tuple[pa.Table, np.ndarray | None]:
        ds = self._dataset()
        if ds is None:
            return STATE_SCHEMA.empty_table(), None
        table, index = projection.states_at(self, ds, ids)
        if self.remember_fold:
            version = int(ds.version)
            self._memo = projection.FoldMemo(version, projection.version_token(self, version, ds), table)
        return table, index

    def fold_streams(self) -> projection.FoldStreams | None:
        """The states as streams of batches, for a plan too large to hold them; None for an empty log.

        A partitioned plan (see docs/adr/0019-partitioned-plan.md) splits them by item and folds or
        reads one part at a time, so it never holds every state (nor the memo: it sets none).
        """
        ds = self._dataset()
        if ds is None:
            return None
        version = int(ds.version)
        new = maintenance.projection_wanted(self, ds, version)

        def store(states: pa.RecordBatchReader) -> bool:
            return maintenance.store_fold(self, states, version, new)

        return projection.FoldStreams(
            version,
            int(ds.count_rows()),
            projection.state_batches(self, ds),
            lambda: projection.event_batches(self, ds),
            store if new else None,
        )

    def refresh_projection(
        self,
        *,
        min_new_events: int | None = None,
        cleanup_older_than: dt.timedelta = dt.timedelta(hours=1),
    ) -> bool:
        """Store this object's last fold as the state projection when it covers many more events.

        A planner has just folded the whole log; without a projection every mapped task would fold
        it again from scratch (seconds and most of a GiB at millions of events). Writing the fold it
        already has costs a fraction of one fold, and only when at least ``min_new_events`` events
        are covered by this fold but not by the projection (default
        :data:`~airflow_provider_datagen.core.store.maintenance.PROJECTION_MIN_NEW_EVENTS`). The
        fold's identity (see ``lance_io.version_token``) is what proves it is of this log. Returns
        whether it wrote.
        """
        return maintenance.refresh_projection(
            self, min_new_events=min_new_events, cleanup_older_than=cleanup_older_than
        )

    def _projection_version(self) -> int:
        """The log version the state projection folds; 0 when there is none it could be read as."""
        return projection.projection_version(self)

    def summary(self, states: pa.Table | None = None) -> dict[str, Any]:
        """The ``datagen_status`` dict of this log (see :func:`~airflow_provider_datagen.core.status.summarize`).

        Without ``states``, counted from the state projection and the items changed since when it can
        be (see :mod:`.tally`), else from :meth:`states`.
        """
        if states is None:
            counted = tally.summary(self)  # the projection's counts and the items changed since
            if counted is not None:
                return counted
            states = self.states()
        return summarize(
            states, pipeline=self.pipeline, experiment=self.experiment, log_version=self.version, usage=self.usage()
        )

    # --- the usage ledger (see ledger.py and docs/adr/0011-usage-ledger.md) ----------------------

    def usage(self) -> dict[str, Any]:
        """Calls, tokens and cost of every attempt ever recorded, by model; failed attempts' cost apart."""
        return ledger.usage(self)

    def item_usage(self, item_id: str) -> dict[str, Any]:
        """:meth:`usage` of one root item (and its fan-out children), plus its usage per attempt."""
        return ledger.item_usage(self, check_item_id(item_id))

    def usage_spend(self, *, exclude_writer: tuple[str, int] | None = None) -> tuple[int, int]:
        """(nano-dollars, tokens) spent, without what ``exclude_writer=(writer_id, epoch)`` wrote."""
        return ledger.spend(self, exclude_writer)

    def budget(self) -> dict[str, Any]:
        """``{"budget_usd", "budget_tokens"}``: what the last plan or map task set (None: no limit)."""
        return ledger.budget(self)

    def set_budget(self, budget_usd: float | None, budget_tokens: int | None) -> bool:
        """Record the experiment's budget (what :meth:`budget` and the UI read); False if unchanged."""
        return ledger.set_budget(self, budget_usd, budget_tokens)

    # --- blobs, stats, snapshots ------------------------------------------------------------------

    def load_blob(self, event_id: str) -> bytes:
        """The bytes of a blob-stored value; the only read that touches ``value_blob``."""
        ds = self._dataset()
        if ds is None:
            raise InvalidEventError(f"no event {event_id!r}: the log {self.uri} is empty")
        try:
            hit = ds.to_table(
                columns=["event_id", "value_kind", "value_size"],
                filter=_sql_free_eq("event_id", event_id),
                with_row_id=True,
            )
            if hit.num_rows == 0:
                raise InvalidEventError(f"no event {event_id!r} in {self.uri}")
            if hit["value_kind"][0].as_py() is None or hit["value_size"][0].as_py() is None:
                raise InvalidEventError(f"event {event_id!r} carries no value")
            blobs = ds.take_blobs("value_blob", ids=[int(hit["_rowid"][0].as_py())])
        except (OSError, RuntimeError) as exc:
            raise self._translate(exc, f"loading blob {event_id}") from None
        blob = blobs[0]
        if blob is None:
            raise InvalidEventError(f"event {event_id!r} stores its value inline; read it from item_state()")
        with blob as f:
            return f.read()

    def stats(self) -> dict[str, Any]:
        """Version, fragment count, event count and on-disk size of the log."""
        ds = self._dataset()
        if ds is None:
            return {"version": 0, "fragments": 0, "events": 0, "size_bytes": 0}
        return {
            "version": int(ds.version),
            "fragments": len(ds.get_fragments()),
            "events": int(ds.count_rows()),
            "size_bytes": lance_io.local_size_bytes(self.uri),
        }

    def write_source_snapshot(self, items: Sequence[SourceItem]) -> str:
        """Store an inline source once, content-addressed beside the log; returns its URI."""
        uri = snapshot_uri(self.uri, snapshot_digest(list(items)))

        def table() -> pa.Table:
            return pa.table(
                {
                    "item_id": [s.item_id for s in items],
                    # the text the fingerprint digests; chunk_items decodes it back to the same values
                    "item": [canonical_source_json(s.data, what=f"item {s.item_id!r}") for s in items],
                }
            )

        lance_io.write_source_snapshot(uri, table, self.storage_options, log_uri=self.uri)
        return uri

    # --- maintenance ----------------------------------------------------------------------------

    def maintain(
        self,
        *,
        cleanup_older_than: dt.timedelta = dt.timedelta(hours=1),
        target_rows_per_fragment: int = 1 << 20,
    ) -> dict[str, Any]:
        """Compact fragments, build or refresh scalar indices, drop old versions; safe beside writers.

        Compaction rewrites existing fragments only and commits optimistically, so appends that land
        meanwhile are kept; stable row ids keep blob references valid; cleanup keeps every version
        younger than ``cleanup_older_than`` so concurrent readers never lose the files they read. It
        also stores the state projection (see :mod:`.maintenance`).
        """
        return maintenance.maintain(
            self, cleanup_older_than=cleanup_older_than, target_rows_per_fragment=target_rows_per_fragment
        )


def _too_many_writers(exc: BaseException) -> bool:
    return isinstance(exc, lance_io.LANCE_ERRORS) and "Too many concurrent writers" in str(exc)


#: Lance gives up on an append after ~30 s of commit conflicts when many tasks append to an object
#: store at the same instant (20 map tasks starting together on S3); the append is tried again a few
#: times after a jittered wait. A failed commit landed nothing, and reads de-duplicate by event id.
_append_with_retries = tenacity.retry(
    retry=tenacity.retry_if_exception(_too_many_writers),
    stop=tenacity.stop_after_attempt(4),
    wait=tenacity.wait_random_exponential(multiplier=1.0, max=10.0),
    reraise=True,
)(lambda table, ds, storage_options: lance_io.append_table(table, ds, EVENT_SCHEMA, storage_options))


def _latest_version(ds: lance.LanceDataset) -> int:
    """``ds`` checked out at the latest version, which it stays at; its old version if it cannot be."""
    with contextlib.suppress(OSError, ValueError):  # deleted since it was opened: the caller refuses what it has
        ds.checkout_latest()
    return int(ds.version)
