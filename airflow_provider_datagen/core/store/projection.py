"""The states of a log: the fold memo, the disposable state projection, and the streamed cold fold.

:meth:`CheckpointLog.states` folds every item. Two caches spare it the whole log: the fold this
object made last (the *memo*), and the *state projection* ``state.lance`` that maintenance and
planners store beside the log. The functions here read through the log's :class:`~.table.LanceTable`;
the memo is the log object's, passed in. Both are the states at some log version; only the items with events
after that version are folded again. Both are disposable (see docs/design.md, "Lenses"): any doubt
about one (missing, unreadable, another schema, not provably of this log) means a full fold.
"""

from __future__ import annotations

import json
import logging
import os
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_datagen.core.fold import STATE_SCHEMA, fold_batches, fold_table
from airflow_provider_datagen.core.schema import DATAGEN_SCHEMA_VERSION, LIGHT_COLUMNS
from airflow_provider_datagen.core.status import Tally, tally
from airflow_provider_datagen.core.store import bucketed_fold, lance_io
from airflow_provider_datagen.core.store.paths import is_local, projection_uri
from airflow_provider_datagen.exceptions import LogCorruptedError, MisalignedStreamsError

if TYPE_CHECKING:
    import datetime as dt
    from collections.abc import Callable, Iterator, Sequence

    import lance

    from airflow_provider_datagen.core.store.table import LanceTable

logger = logging.getLogger(__name__)

#: The projection's metadata key holding the :class:`~airflow_provider_datagen.core.status.Tally` of its rows.
TALLY_KEY = "tally"
#: Failed ids the stored tally lists: a status stays exact until this many of them are no longer failed.
TALLY_FAILED_IDS = 1000
#: Above this many ids, :func:`states_of` takes their rows from the whole fold: at 1M items, 32,000
#: ids filtered cost 0.7-0.9 s, the fold 0.4 s from the projection and 2.3 s without one.
STATES_OF_MAX = 1 << 14


class Located(Protocol):
    """What the projection's own reads and writes need of a log: a :class:`~.table.LanceTable`, or the log over one."""

    uri: str
    storage_options: dict[str, str] | None

    @property
    def log_id(self) -> str | None: ...

    def check_recorded_version(self, what: str, uri: str, log_id: str | None, version: int) -> None: ...


class FoldMemo(NamedTuple):
    """The last fold of a log object: its version, that version's manifest identity, the states."""

    version: int
    token: tuple[Any, ...] | None
    states: pa.Table


class Folded(NamedTuple):
    """States folded at a log version (from the memo or the projection)."""

    states: pa.Table
    version: int


class StoredProjection(NamedTuple):
    """The projection dataset and the log version it folds."""

    dataset: lance.LanceDataset
    log_version: int


def version_token(log: LanceTable, version: int, ds: lance.LanceDataset) -> tuple[Any, ...] | None:
    """The identity of ``version`` of the log: a log deleted and written again reuses numbers."""
    return lance_io.version_token(log.uri, version, ds)


def memo_base(memo: FoldMemo | None, log: LanceTable, ds: lance.LanceDataset) -> Folded | None:
    """The states folded last (``memo``), when they are of this log at ``ds``'s version or before it.

    A map task folds the log to plan its chunk and again for its status after writing: the
    second fold then reads only the items the task touched, as with the projection.
    """
    if memo is None or memo.token is None or memo.version > int(ds.version):
        return None
    if memo.token != version_token(log, memo.version, ds):
        return None
    return Folded(memo.states, memo.version)


def states_at(
    log: LanceTable, ds: lance.LanceDataset, ids: pa.Array | Sequence[str] | None, memo: FoldMemo | None
) -> tuple[pa.Table, np.ndarray | None]:
    """The states of the log at ``ds``'s version, from the memo or the projection plus the events since.

    With ``ids`` and a full fold, also the row of each of them (see ``fold.fold_batches``).
    """
    version = int(ds.version)
    base = (memo_base(memo, log, ds) or read_projection(log, version)) if lance_io.row_versions(ds) else None
    if base is not None:
        table, base_version = base
        if base_version == version:
            return table, None
        delta = log.scan_at(ds, ["item_id"], f"_row_created_at_version > {base_version}")
        touched = pc.unique(delta["item_id"])
        if len(touched) == 0:
            return table, None
        if len(touched) <= max(1000, table.num_rows // 4):
            events = log.scan_at(ds, LIGHT_COLUMNS, pc.field("item_id").isin(touched))
            kept = table.filter(pc.invert(pc.is_in(table["item_id"], value_set=touched)))
            return pa.concat_tables([kept, fold_table(events)]), None
    return fold_scan(log, ds, ids)


def states_of(log: LanceTable, ids: pa.Array | Sequence[str]) -> pa.Table | None:
    """The rows of ``CheckpointLog.states()`` for ``ids`` (unique) alone, a row for each that has events.

    The fold is per item, so folding every event of these items alone gives exactly their rows of
    the whole fold; the scan filters on ``item_id``, which maintenance indexes, so its cost follows
    the items asked for and the fragments appended since the last maintenance, not the whole log.
    For more than :data:`STATES_OF_MAX` ids the whole (streamed) fold costs less than holding all
    their events at once: then None, and the caller takes their rows from it. The filter is a
    pyarrow expression: any id is safe in it, and one never written has no row.
    """
    wanted = id_array(ids)
    ds = log.dataset()
    if ds is None or not len(wanted):
        return STATE_SCHEMA.empty_table()
    if len(wanted) > STATES_OF_MAX:
        return None
    # A run never writes into a log another schema version wrote rows to, whichever items they are
    # of: the rows of any other version are read (and refused) here, a pushdown on one int column
    # (10-25 ms at 5M events).
    log.scan_at(ds, ["schema_version"], f"schema_version != {DATAGEN_SCHEMA_VERSION}")
    return fold_table(log.scan_at(ds, LIGHT_COLUMNS, pc.field("item_id").isin(wanted)))


def fold_scan(
    log: LanceTable, ds: lance.LanceDataset, ids: pa.Array | Sequence[str] | None
) -> tuple[pa.Table, np.ndarray | None]:
    """Fold the whole log from streamed scans of its light columns (see ``fold.fold_batches``).

    Reading the columns whole held about 1.2 GB for 5M events; streams of batches reduced as
    they arrive hold their numbers and a fifth of their strings. The item ids are one stream
    and the other columns a second, of the same pinned version, so the ids are hashed while
    the wider columns are still read; Lance decodes ahead on its own threads.

    Past ``bucketed_fold.BUCKETED_EVENTS`` events even that holds too much (5.7 GB at 49M events):
    the log is folded a bucket of items at a time (:mod:`.bucketed_fold`), its rows bucket by bucket.
    """
    try:
        pinned = ds.checkout_version(int(ds.version))
        events = int(pinned.count_rows())
    except lance_io.LANCE_ERRORS as exc:
        raise log.translate(exc, "reading the log") from None
    if events > bucketed_fold.BUCKETED_EVENTS:
        table = bucketed_fold.fold_bucketed(log.batches(pinned, LIGHT_COLUMNS), events)
        return table, None if ids is None else rows_of(table, id_array(ids))
    other = [c for c in LIGHT_COLUMNS if c != "item_id"]
    wanted = None if ids is None else id_array(ids)
    try:
        return fold_batches(log.batches(pinned, ["item_id"], checked=False), wanted, other=log.batches(pinned, other))
    except MisalignedStreamsError:  # one pinned version cannot differ; never fold misaligned rows
        raise LogCorruptedError(f"reading {log.uri}: two scans of version {pinned.version} differ") from None


class FoldStreams(NamedTuple):
    """A log's states as streams, for a planner that partitions them (see ``CheckpointLog.fold_streams``)."""

    #: the log version they are the states at
    version: int
    #: how many events the log holds at ``version``
    event_count: int
    #: the stored states (memo or projection, plus the items folded since), or None: fold ``events``
    states: Iterator[pa.RecordBatch] | None
    #: the light columns of every event at ``version``, batch by batch: a full fold's input
    events: Callable[[], Iterator[pa.RecordBatch]]
    #: stores a full fold of ``events`` as the projection (returns whether it did); None: not worth it
    store: Callable[[pa.RecordBatchReader], bool] | None


class ProjectionUnreadable(Exception):
    """A stored projection failed while it was being streamed: the caller folds the log instead."""


#: Rows per batch when the states are streamed (see :func:`state_batches`).
_STATE_BATCH_ROWS = 1 << 16


def state_batches(log: LanceTable, ds: lance.LanceDataset, memo: FoldMemo | None) -> Iterator[pa.RecordBatch] | None:
    """:func:`states_at` as a stream of state batches, for a planner that cannot hold every state.

    The same states (the memo or the projection, minus the items with events since, plus those
    items folded again), a batch at a time; None when only a full fold gives them (then fold
    :func:`event_batches`). A projection that fails mid-stream raises :class:`ProjectionUnreadable`.
    """
    version = int(ds.version)
    if not lance_io.row_versions(ds):
        return None
    remembered = memo_base(memo, log, ds)
    if remembered is not None:
        base_version, rows = remembered.version, remembered.states.num_rows
        stored: Iterator[pa.RecordBatch] = iter(remembered.states.to_batches(max_chunksize=_STATE_BATCH_ROWS))
    else:
        projected = open_projection(log)
        if projected is None or not 0 < projected.log_version <= version:
            return None
        base_version = projected.log_version
        try:
            rows = projected.dataset.count_rows()
            stored = _projection_stream(projected.dataset)
        except lance_io.LANCE_ERRORS as exc:
            logger.warning("ignoring the state projection of %s: %s", log.uri, str(exc)[:200])
            return None
    if base_version == version:
        return stored
    delta = log.scan_at(ds, ["item_id"], f"_row_created_at_version > {base_version}")
    touched = pc.unique(delta["item_id"])
    del delta
    if len(touched) == 0:
        return stored
    if len(touched) > max(1000, rows // 4):
        return None
    events = log.scan_at(ds, LIGHT_COLUMNS, pc.field("item_id").isin(touched))
    refolded = fold_table(events)
    del events

    def merged() -> Iterator[pa.RecordBatch]:
        for batch in stored:
            yield batch.filter(pc.invert(pc.is_in(batch.column("item_id"), value_set=touched)))
        yield from refolded.to_batches(max_chunksize=_STATE_BATCH_ROWS)

    return merged()


def _projection_stream(dataset: lance.LanceDataset) -> Iterator[pa.RecordBatch]:
    stream = iter(dataset.to_batches(batch_size=_STATE_BATCH_ROWS))
    while True:
        try:
            batch = next(stream)
        except StopIteration:
            return
        except lance_io.LANCE_ERRORS as exc:
            raise ProjectionUnreadable(str(exc)[:200]) from None
        yield batch.replace_schema_metadata(None)


def event_batches(log: LanceTable, ds: lance.LanceDataset) -> Iterator[pa.RecordBatch]:
    """The light columns of every event of the log at ``ds``'s version, batch by batch (for a streamed fold)."""
    try:
        pinned = ds.checkout_version(int(ds.version))
    except lance_io.LANCE_ERRORS as exc:
        raise log.translate(exc, "reading the log") from None
    return log.batches(pinned, LIGHT_COLUMNS)


def open_projection(log: Located) -> StoredProjection | None:
    """The state projection and the log version it folds, when it is one this code can read."""
    uri = projection_uri(log.uri)
    if is_local(uri) and not os.path.isdir(os.path.join(uri, "_versions")):
        return None
    try:
        pds = lance_io.open_dataset(uri, log.storage_options)
    except lance_io.LANCE_ERRORS as exc:
        # on an object store there is no directory to look for first: absent is the usual case
        if "not found" not in str(exc).lower():
            logger.warning("ignoring the state projection of %s: %s", log.uri, str(exc)[:200])
        return None
    meta = pds.schema.metadata or {}
    if (
        int(meta.get(b"datagen_schema_version", b"0")) != DATAGEN_SCHEMA_VERSION
        or pds.schema.remove_metadata() != STATE_SCHEMA
    ):
        return None
    stored = StoredProjection(pds, int(meta.get(b"log_version", b"-1")))
    recorded_id = meta.get(b"log_id")
    if recorded_id is not None:  # a projection ahead of its own log: the log went back (raises)
        log.check_recorded_version(
            "the state projection", uri, recorded_id.decode("ascii", "replace"), stored.log_version
        )
    return stored


def read_projection(log: Located, log_version: int, columns: Sequence[str] | None = None) -> Folded | None:
    """The state projection (or its ``columns``) and the log version it folds; None when unusable.

    A projection of a version ahead of the log (a log deleted and written again) is unusable too.
    """
    stored = open_projection(log)
    if stored is None or not 0 < stored.log_version <= log_version:
        return None
    try:
        table = stored.dataset.to_table(columns=None if columns is None else list(columns))
    except lance_io.LANCE_ERRORS as exc:
        logger.warning("ignoring the state projection of %s: %s", log.uri, str(exc)[:200])
        return None
    return Folded(table.replace_schema_metadata(None), stored.log_version)


def projection_version(log: Located) -> int:
    """The log version the state projection folds; 0 when there is none it could be read as."""
    stored = open_projection(log)
    return 0 if stored is None else max(stored.log_version, 0)


def write_projection(log: LanceTable, ds: lance.LanceDataset, cleanup_older_than: dt.timedelta) -> int:
    """Fold the log at ``ds``'s version and store the result as the state projection; returns its rows."""
    table = fold_scan(log, ds, None)[0]
    store_projection(log, table, int(ds.version), cleanup_older_than)
    return table.num_rows


def store_projection(
    log: Located, table: pa.Table | pa.RecordBatchReader, version: int, cleanup_older_than: dt.timedelta
) -> bool:
    """Store ``table`` (or a stream of its batches), the fold of the log at ``version``, as the state projection.

    Each write is an overwrite, a new version of ``state.lance``; old versions are removed on the
    log's own retention, else every maintenance would leave a full copy behind. A reader that loses
    its version to the cleanup just folds the log (the projection is disposable).
    """
    meta = {"log_version": str(version), "datagen_schema_version": str(DATAGEN_SCHEMA_VERSION)}
    if log.log_id is not None:  # whose fold this is: a log gone back behind it is told from a new one
        meta["log_id"] = log.log_id
    counted: list[Tally] = []
    if isinstance(table, pa.RecordBatchReader):
        # a stream (a partitioned plan's fold) is tallied batch by batch as it is written (its batches
        # hold disjoint items), and the tally set on the written version's schema afterwards
        batches = table

        def tallied() -> Iterator[pa.RecordBatch]:
            total = Tally()
            for batch in batches:
                total = total.joined(tally(pa.Table.from_batches([batch]), keep=TALLY_FAILED_IDS), TALLY_FAILED_IDS)
                yield batch
            counted.append(total)

        table = pa.RecordBatchReader.from_batches(STATE_SCHEMA.with_metadata(meta), tallied())
    else:
        # the status counts of this table, so a status reads only the items changed since
        table = table.replace_schema_metadata({**meta, TALLY_KEY: tally_json(tally(table, keep=TALLY_FAILED_IDS))})
    try:
        written = lance_io.overwrite_dataset(table, projection_uri(log.uri), log.storage_options)
        if counted:  # a new version, the same rows: a reader of the one before finds no tally and counts
            written.replace_schema_metadata({**meta, TALLY_KEY: tally_json(counted[0])})
        written.cleanup_old_versions(older_than=cleanup_older_than)
    except lance_io.LANCE_ERRORS as exc:
        logger.warning("could not write the state projection of %s: %s", log.uri, str(exc)[:200])
        return False
    return True


def id_array(ids: pa.Array | Sequence[str]) -> pa.Array:
    return ids if isinstance(ids, pa.Array) else pa.array(ids, pa.string())


def rows_of(states: pa.Table, ids: pa.Array) -> np.ndarray:
    """For each of ``ids``, its row in ``states`` (-1 when absent), hashing the smaller of the two."""
    if states.num_rows == 0:
        return np.full(len(ids), -1, dtype=np.int64)
    if len(ids) < states.num_rows:  # a source smaller than the log's items: no hash of every state's id
        return bucketed_fold.rows_in(states, ids)
    found = pc.index_in(ids, value_set=states["item_id"]).fill_null(-1)
    return np.asarray(found.to_numpy(zero_copy_only=False), dtype=np.int64)


def max_of(col: pa.ChunkedArray | pa.Array) -> int:
    """The largest value of an integer column; 0 when it is empty."""
    top = pc.max(col).as_py() if len(col) else None
    return 0 if top is None else int(top)


def tally_json(t: Tally) -> str:
    """The tally as stored in the projection's metadata."""
    return json.dumps(
        {
            "roots": t.roots,
            "statuses": dict(t.statuses),
            "completed_by_version": dict(t.completed_by_version),
            "failed": t.failed,
            "failed_ids": list(t.failed_ids),
            "children": t.children,
            "violations": t.violations,
        },
        sort_keys=True,
    )


def stored_tally(stored: StoredProjection) -> Tally | None:
    """The tally stored with the projection; None when it has none (written before tallies) or it is unreadable."""
    raw = (stored.dataset.schema.metadata or {}).get(TALLY_KEY.encode())
    if raw is None:
        return None
    try:
        d = json.loads(raw)
        return Tally(
            roots=int(d["roots"]),
            statuses={str(k): int(v) for k, v in d["statuses"].items()},
            completed_by_version={str(k): int(v) for k, v in d["completed_by_version"].items()},
            failed=int(d["failed"]),
            failed_ids=tuple(str(i) for i in d["failed_ids"]),
            children=int(d["children"]),
            violations=int(d["violations"]),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        logger.warning("ignoring the stored tally of %s: %s", stored.dataset.uri, exc)
        return None
