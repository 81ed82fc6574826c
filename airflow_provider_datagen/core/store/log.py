"""CheckpointLog: one append-only Lance dataset per experiment, the only durable source of truth.

A checkpoint batch is one Lance append (one commit); retried batches may land twice and the read
path de-duplicates them by ``event_id``; writers are told apart by ``writer_id``/``writer_epoch``;
blob bytes live in a blob-encoded ``value_blob`` column, located by ``event_id`` and fetched by stable
row id (see docs/design.md, "The event log" and "Where we differ from the original design").
:class:`CheckpointLog` is the public face of the store and composes its parts: the dataset itself
behind :class:`~.table.LanceTable` (open and validate, scan, append, fsync, error translation),
staging and numbering events (:mod:`.batch`, :mod:`.writer`), the states cache (:mod:`.projection`),
the status counts (:mod:`.tally`), maintenance (:mod:`.maintenance`) and the usage reads
(:mod:`.usage_reads`). Those take the table (or a small protocol this class satisfies), never this
class: nothing in the store imports it back. It keeps what this object remembers (the last fold and
usage read) and the thread of pipelined appends.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_datagen.core.events import Event, canonical_source_json
from airflow_provider_datagen.core.fold import (
    STATE_SCHEMA,
    FailureRecord,
    ItemState,
    dedupe,
    failure_records,
)
from airflow_provider_datagen.core.ids import check_name, parent_of
from airflow_provider_datagen.core.schema import (
    DEFAULT_BLOB_THRESHOLD,
    NON_BLOB_COLUMNS,
    EventType,
    ItemStatus,
)
from airflow_provider_datagen.core.sources import snapshot_digest
from airflow_provider_datagen.core.status import status_dict
from airflow_provider_datagen.core.status import tally as tally_of
from airflow_provider_datagen.core.store import (
    epochs,
    lance_io,
    maintenance,
    projection,
    rows,
    tally,
    usage_reads,
    version_mark,
)
from airflow_provider_datagen.core.store.batch import check_item_id
from airflow_provider_datagen.core.store.paths import is_local, local_path, log_uri, projection_uri, snapshot_uri
from airflow_provider_datagen.core.store.table import LanceTable, sql_free_eq
from airflow_provider_datagen.core.store.writer import Committer, LogWriter
from airflow_provider_datagen.exceptions import InvalidEventError, InvalidNameError

if TYPE_CHECKING:
    import concurrent.futures
    from collections.abc import Callable, Iterable, Sequence

    import numpy as np

    from airflow_provider_datagen.core.fold.usage import Sums
    from airflow_provider_datagen.core.sources import SourceItem

__all__ = ["CheckpointLog", "LogWriter"]

logger = logging.getLogger(__name__)


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
        self.pipeline = pipeline
        self.experiment = experiment
        self.storage_options = dict(storage_options) if storage_options else None
        self.blob_threshold = blob_threshold
        self.auto_maintain_fragments = auto_maintain_fragments
        self.uri = log_uri(root, pipeline, experiment)
        #: the Lance dataset: every read and append of the log goes through it
        self.table = LanceTable(
            self.uri, self.storage_options, durable=durable, settle=self._wait_appends, on_forget=self._forget
        )
        #: the thread of pipelined appends (LogWriter.commit(wait=False)); None while none runs
        self._committer: Committer | None = None
        #: the last fold, see projection.memo_base
        self._memo: projection.FoldMemo | None = None
        #: the last usage read, see usage_reads.UsageMemo
        self._usage_memo: usage_reads.UsageMemo | None = None
        self._auto_maintenance = maintenance.AutoMaintenance(self.uri)
        self.projection_uri = projection_uri(self.uri)

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
        lg.table.dataset()  # validates an existing dataset (schema version, is it ours) before any use
        return lg

    # --- the dataset (see .table) -----------------------------------------------------------------

    def _forget(self) -> None:
        """Drop what this object remembers of a dataset that is gone or was replaced at the URI."""
        self._memo = None
        self._usage_memo = None

    def _events(self, table: pa.Table) -> list[Event]:
        return rows.decode_events(self.uri, table)

    def _fold(self, item_id: str, events: list[Event], load_blob: Callable[[str], bytes] | None = None) -> ItemState:
        return rows.fold_item(self.uri, item_id, events, load_blob)

    def check_recorded_version(self, what: str, uri: str, log_id: str | None, version: int) -> None:
        """Refuse a record of this very log at a version it no longer has (see :class:`~.table.LanceTable`)."""
        self.table.check_recorded_version(what, uri, log_id, version)

    @property
    def log_id(self) -> str | None:
        """The identity of the dataset this log read last (None before any, or for a log older than identities)."""
        return self.table.log_id

    def exists(self) -> bool:
        return self.table.exists()

    @property
    def version(self) -> int:
        return self.table.version

    @property
    def usage_memo(self) -> usage_reads.UsageMemo | None:
        """The last usage sums this object remembers (None: none yet, or opened with ``remember_fold=False``)."""
        return self._usage_memo

    @property
    def fold_memo(self) -> projection.FoldMemo | None:
        """The last fold this object remembers (None: none yet, or opened with ``remember_fold=False``)."""
        return self._memo

    # --- appends --------------------------------------------------------------------------------

    @property
    def inflight(self) -> concurrent.futures.Future[None] | None:
        """The pipelined append in flight, if any."""
        return None if self._committer is None else self._committer.inflight

    @property
    def committer(self) -> Committer | None:
        """The thread of pipelined appends; None while none runs (an idle log holds none)."""
        return self._committer

    def append(self, table: pa.Table) -> None:
        """Commit ``table``, a batch's event rows as :class:`LogWriter` builds them, as one durable append.

        The writer's side of the log; write events through :meth:`writer`, never raw rows. Every path
        appends through this method (the writer, the committer thread), so tests and the crash workers
        wrap it, on the class or one object, to count, hold, fail or capture the appends.
        """
        self.wait_appends()
        appended = self.table.append(table)
        if appended and self._auto_maintenance.due(self.auto_maintain_fragments, self.table.opened):
            self.maintain()

    def append_pipelined(self, table: pa.Table, on_error: Callable[[BaseException], None]) -> None:
        """Start appending ``table`` on the committer thread, after the append before it has landed."""
        self.wait_appends()
        if self._committer is None:
            self._committer = Committer(self.append)
        self._committer.submit(table, on_error)

    def wait_appends(self, *, close: bool = False) -> None:
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

    _wait_appends = wait_appends  # the name the crash workers of the tests call

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
        ds = self.table.dataset()
        if ds is None:
            return 0
        version = int(ds.version)
        top, base = 0, None
        if lance_io.row_versions(ds):
            folded = projection.memo_base(self._memo, self.table, ds) or projection.read_projection(
                self.table, version, ["max_epoch"]
            )
            if folded is not None:
                top, base = projection.max_of(folded.states["max_epoch"]), folded.version
        if base != version:
            since = None if base is None else f"_row_created_at_version > {base}"
            top = max(top, projection.max_of(self.table.scan_at(ds, ["writer_epoch"], since)["writer_epoch"]))
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
        return self._events(self.table.scan(NON_BLOB_COLUMNS, sql_free_eq("root_item_id", root_id)))

    def _copies(self, item_id: str) -> list[Event]:
        """Every stored row of one item, duplicates included: which epochs wrote a copy matters to fencing."""
        check_item_id(item_id)
        return self._events(self.table.scan(NON_BLOB_COLUMNS, sql_free_eq("item_id", item_id)))

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
        table = self.table.scan(NON_BLOB_COLUMNS, pc.field("item_id").isin(pa.array(ids, pa.string())))
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
        return self.table.scan(columns, filter)

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
        table = self.table.scan(cols)
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
        table = self.table.scan(NON_BLOB_COLUMNS, pc.field("event_type") == pa.scalar(EventType.FAILED.value))
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
        wanted = projection.id_array(ids)
        states = projection.states_of(self.table, wanted)
        if states is None:  # many ids: their rows of the whole fold
            table, index = self.states_for(wanted)
            return table.take(pa.array(index[index >= 0]))
        return states

    def _states(self, ids: pa.Array | Sequence[str] | None) -> tuple[pa.Table, np.ndarray | None]:
        ds = self.table.dataset()
        if ds is None:
            return STATE_SCHEMA.empty_table(), None
        table, index = projection.states_at(self.table, ds, ids, self._memo)
        if self.remember_fold:
            version = int(ds.version)
            self._memo = projection.FoldMemo(version, projection.version_token(self.table, version, ds), table)
        return table, index

    def fold_streams(self) -> projection.FoldStreams | None:
        """The states as streams of batches, for a plan too large to hold them; None for an empty log.

        A partitioned plan (see docs/adr/0019-partitioned-plan.md) splits them by item and folds or
        reads one part at a time, so it never holds every state (nor the memo: it sets none).
        """
        ds = self.table.dataset()
        if ds is None:
            return None
        version = int(ds.version)
        new = maintenance.projection_wanted(self.table, ds, version)

        def store(states: pa.RecordBatchReader) -> bool:
            return maintenance.store_fold(self.table, states, version, new)

        return projection.FoldStreams(
            version,
            int(ds.count_rows()),
            projection.state_batches(self.table, ds, self._memo),
            lambda: projection.event_batches(self.table, ds),
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
            self.table, self._memo, min_new_events=min_new_events, cleanup_older_than=cleanup_older_than
        )

    def projection_version(self) -> int:
        """The log version the state projection folds; 0 when there is none it could be read as."""
        return projection.projection_version(self.table)

    def summary(self, states: pa.Table | None = None) -> dict[str, Any]:
        """The ``datagen_status`` dict of this log (see :func:`~airflow_provider_datagen.core.status.status_dict`).

        Without ``states``, counted from the state projection and the items changed since when it can
        be (see :mod:`.tally`), else from :meth:`states`.
        """
        if states is None:
            counted = tally.log_status(self)  # the projection's counts and the items changed since
            if counted is not None:
                return counted
            states = self.states()
        return status_dict(
            tally_of(states),
            pipeline=self.pipeline,
            experiment=self.experiment,
            log_version=self.version,
            usage=self.usage(),
        )

    # --- usage and budget (see usage_reads.py and docs/adr/0011-usage-ledger.md) ------------------

    def _usage_sums(self) -> Sums:
        summed, self._usage_memo = usage_reads.sums(self.table, self._usage_memo, remember=self.remember_fold)
        return summed

    def usage(self) -> dict[str, Any]:
        """Calls, tokens and cost of every attempt ever recorded, by model; failed attempts' cost apart."""
        return usage_reads.usage(self._usage_sums())

    def item_usage(self, item_id: str) -> dict[str, Any]:
        """:meth:`usage` of one root item (and its fan-out children), plus its usage per attempt."""
        item_id = check_item_id(item_id)
        return usage_reads.item_usage(self.subtree(item_id) if parent_of(item_id) is None else self.events(item_id))

    def usage_spend(self, *, exclude_writer: tuple[str, int] | None = None) -> tuple[int, int]:
        """(nano-dollars, tokens) spent, without what ``exclude_writer=(writer_id, epoch)`` wrote."""
        return usage_reads.spend(self._usage_sums(), exclude_writer)

    def budget(self) -> dict[str, Any]:
        """``{"budget_usd", "budget_tokens"}``: what the last plan or map task set (None: no limit)."""
        return usage_reads.budget(self.table)

    def set_budget(self, budget_usd: float | None, budget_tokens: int | None) -> bool:
        """Record the experiment's budget (what :meth:`budget` and the UI read); False if unchanged."""
        return usage_reads.set_budget(self.table, budget_usd, budget_tokens, f"{self.pipeline}/{self.experiment}")

    # --- blobs, stats, snapshots ------------------------------------------------------------------

    def load_blob(self, event_id: str) -> bytes:
        """The bytes of a blob-stored value; the only read that touches ``value_blob``."""
        return self.table.load_blob(event_id)

    def stats(self) -> dict[str, Any]:
        """Version, fragment count, event count and on-disk size of the log."""
        return self.table.stats()

    def write_source_snapshot(self, items: Sequence[SourceItem], texts: Sequence[bytes] | None = None) -> str:
        """Store an inline source once, content-addressed beside the log; returns its URI.

        ``texts``: the items' canonical texts (UTF-8) as ``prepare_items(texts=...)`` kept them while
        fingerprinting; without them each item is encoded again.
        """
        uri = snapshot_uri(self.uri, snapshot_digest(list(items)))

        def table() -> pa.Table:
            # the text the fingerprint digests; chunk_items decodes it back to the same values
            if texts is not None and len(texts) == len(items):
                item = pa.array(texts, pa.binary()).cast(pa.string())
            else:
                item = pa.array([canonical_source_json(s.data, what=f"item {s.item_id!r}") for s in items], pa.string())
            return pa.table({"item_id": pa.array([s.item_id for s in items], pa.string()), "item": item})

        lance_io.write_source_snapshot(uri, table, self.storage_options, log_uri=self.uri)
        return uri

    # --- batches (core/batch) ----------------------------------------------------------------------

    def cancel_batches(self, client: Any = None) -> list[str]:
        """Ask the provider to cancel the experiment's open batches; the batch ids asked.

        ``client``: a batch client (``llm_batch(...).client()``); without one, each provider's SDK reads
        its key from the environment. Rows already finished stay readable and are recorded by the next
        batch round; the rows that never ran come back cancelled, their items still pending.
        """
        from airflow_provider_datagen.core.batch.cancel import cancel_batches  # the SDKs load only here

        return cancel_batches(self, client)

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
            self.table, cleanup_older_than=cleanup_older_than, target_rows_per_fragment=target_rows_per_fragment
        )
