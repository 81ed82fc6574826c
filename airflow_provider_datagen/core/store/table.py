"""LanceTable: the one object over a log's Lance dataset (open and validate, scan, append, fsync).

Everything of :mod:`.log` that touches the dataset itself lives here, behind public methods: which
dataset is at the URI and whether it is ours (schema version, identity, version mark), the scans
and streamed batches of one version with each row's schema version checked, the append (with its
retries on commit contention) made durable before it counts, and the translation of Lance's
errors into ours. The helpers beside it (:mod:`.projection`, :mod:`.tally`, :mod:`.usage_reads`,
:mod:`.maintenance`) read through this object; :class:`~.log.CheckpointLog` composes it with them,
and nothing here knows the log object (the model is pyeventsourcing's recorders).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import tenacity

from airflow_provider_datagen.core.schema import DATAGEN_SCHEMA_VERSION, EVENT_SCHEMA
from airflow_provider_datagen.core.store import identity, lance_io, rows, version_mark
from airflow_provider_datagen.core.store.paths import is_local, local_path
from airflow_provider_datagen.exceptions import (
    DatagenError,
    InvalidEventError,
    LogCorruptedError,
    NotALogError,
    SchemaVersionError,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    import lance

__all__ = ["LanceTable"]

logger = logging.getLogger(__name__)

#: Rows per batch of a streamed fold scan, and batches Lance decodes ahead: small enough that a
#: scan never holds much, large enough that per-batch Python stays a few percent of the fold.
_SCAN_BATCH_ROWS = 1 << 16
_SCAN_READAHEAD = 2


def sql_free_eq(column: str, value: str) -> pc.Expression:
    """``column == value`` as a pyarrow expression: it never needs SQL quoting, so any id is a safe filter."""
    return pc.field(column) == pa.scalar(value, pa.string())


class LanceTable:
    """The Lance dataset of one log at ``uri``, opened lazily and read at its latest version.

    :param durable: fsync what a commit wrote before it counts (local logs).
    :param settle: called before every read: the owner's pipelined append lands first (read your
        own writes); the table itself never appends in the background.
    :param on_forget: called when the dataset this object read is gone or another one is at the
        URI (deleted and created again): the owner drops what it remembers of the old one.
    """

    def __init__(
        self,
        uri: str,
        storage_options: dict[str, str] | None,
        *,
        durable: bool = True,
        settle: Callable[[], None] | None = None,
        on_forget: Callable[[], None] | None = None,
    ) -> None:
        self.uri = uri
        self.storage_options = storage_options
        self.durable = durable
        self._settle = settle
        self._on_forget = on_forget
        self._ds: lance.LanceDataset | None = None
        self._lock = threading.Lock()
        self._max_fragment_id = -1
        #: which dataset this object reads and how far (a recreated log, a rollback: see .identity)
        self._identity = identity.DatasetIdentity(uri)

    def __repr__(self) -> str:
        return f"LanceTable({self.uri!r})"

    # --- errors ---------------------------------------------------------------------------------

    def translate(self, exc: BaseException, action: str) -> Exception:
        """Lance's error ``exc`` while doing ``action`` as one of ours (see :func:`lance_io.translate`)."""
        return lance_io.translate(exc, self.uri, action)

    # --- opening and validation -------------------------------------------------------------------

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
            raise self.translate(exc, "opening the log") from None
        except OSError as exc:
            raise self.translate(exc, "opening the log") from None
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

    def dataset(self) -> lance.LanceDataset | None:
        """The dataset at its latest version, validated (None while nothing was committed).

        Opens it on first use; later calls check it is still the latest (one stat locally) and
        whether another dataset is at the URI now (see :meth:`_adopt`).
        """
        if self._settle is not None:
            self._settle()
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

    @property
    def opened(self) -> lance.LanceDataset | None:
        """The dataset as last read, without looking for a newer version (None: not opened yet)."""
        return self._ds

    def close(self) -> None:
        """Let go of the open dataset: the next read opens the URI again; what was seen of it stays."""
        self._ds = None

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
        if self._on_forget is not None:
            self._on_forget()

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
        """The identity of the dataset read last (None before any, or for a log older than identities)."""
        return self._identity.log_id

    def exists(self) -> bool:
        return self.dataset() is not None

    @property
    def version(self) -> int:
        """The latest version (0 for a log nothing was committed to)."""
        ds = self.dataset()
        return 0 if ds is None else int(ds.version)

    # --- scans ----------------------------------------------------------------------------------

    def scan(self, columns: Sequence[str], filter: pc.Expression | None = None) -> pa.Table:
        """:meth:`scan_at` the latest version; an empty table of those columns for an empty log."""
        ds = self.dataset()
        if ds is None:
            return EVENT_SCHEMA.empty_table().select(list(dict.fromkeys([*columns, "schema_version"])))
        return self.scan_at(ds, columns, filter)

    def scan_at(self, ds: lance.LanceDataset, columns: Sequence[str], filter: Any) -> pa.Table:
        """The rows of ``ds`` (one version) projected to ``columns``, each row's schema version checked."""
        cols = list(dict.fromkeys([*columns, "schema_version"]))
        try:
            table = ds.to_table(columns=cols, filter=filter)
        except lance_io.LANCE_ERRORS as exc:
            raise self.translate(exc, "reading the log") from None
        self._check_versions(table["schema_version"], table)
        return table

    def batches(
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
            raise self.translate(exc, "reading the log") from None
        while True:
            # only Lance's own calls are translated, never an error raised by the consumer at the yield
            try:
                batch = next(stream)
            except StopIteration:
                return
            except lance_io.LANCE_ERRORS as exc:
                raise self.translate(exc, "reading the log") from None
            if checked:
                self._check_versions(batch.column("schema_version"), batch)
            yield batch

    def load_blob(self, event_id: str) -> bytes:
        """The bytes of a blob-stored value; the only read that touches ``value_blob``."""
        ds = self.dataset()
        if ds is None:
            raise InvalidEventError(f"no event {event_id!r}: the log {self.uri} is empty")
        try:
            hit = ds.to_table(
                columns=["event_id", "value_kind", "value_size"],
                filter=sql_free_eq("event_id", event_id),
                with_row_id=True,
            )
            if hit.num_rows == 0:
                raise InvalidEventError(f"no event {event_id!r} in {self.uri}")
            if hit["value_kind"][0].as_py() is None or hit["value_size"][0].as_py() is None:
                raise InvalidEventError(f"event {event_id!r} carries no value")
            blobs = ds.take_blobs("value_blob", ids=[int(hit["_rowid"][0].as_py())])
        except (OSError, RuntimeError) as exc:
            raise self.translate(exc, f"loading blob {event_id}") from None
        blob = blobs[0]
        if blob is None:
            raise InvalidEventError(f"event {event_id!r} stores its value inline; read it from item_state()")
        with blob as f:
            return f.read()

    def stats(self) -> dict[str, Any]:
        """Version, fragment count, event count and on-disk size of the log."""
        ds = self.dataset()
        if ds is None:
            return {"version": 0, "fragments": 0, "events": 0, "size_bytes": 0}
        return {
            "version": int(ds.version),
            "fragments": len(ds.get_fragments()),
            "events": int(ds.count_rows()),
            "size_bytes": lance_io.local_size_bytes(self.uri),
        }

    # --- appends --------------------------------------------------------------------------------

    def append(self, table: pa.Table) -> bool:
        """Commit ``table`` (event rows) as one Lance append, durably; creates the dataset on the first.

        Returns whether it appended to an existing dataset (False: this append created it).
        """
        # No refresh before appending: Lance rebases an append onto whatever version is latest at
        # commit time (appends never conflict), so reading the newest manifest first is wasted I/O.
        ds = self._ds if self._ds is not None else self.dataset()
        try:
            if ds is None:
                self._create(table)
            else:
                self._ds = _append_with_retries(table, ds, self.storage_options)
                self._identity.note(self._ds)
            self.make_durable()
        except DatagenError:
            raise
        except lance_io.LANCE_ERRORS as exc:
            raise self.translate(exc, "appending a batch") from None
        return ds is not None

    def make_durable(self) -> None:
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
