"""The usage projection: the log's usage sums as of a version, stored by maintenance beside the log.

A cold ``log.usage()`` over the whole log parses the JSON of every usage row (seconds at millions of
events). :func:`write_usage_projection`, called by ``maintain()``, stores the sums instead, as
``usage.lance`` beside the log: one row per (writer_id, writer_epoch, model) with the sums of a
``fold.usage.Sums`` list and the sorted keys of the usage rows summed into it, plus the log version
they fold (schema metadata ``log_version``). A read then folds only the rows committed after that
version (``_row_created_at_version``), as the state projection does for ``states()``.

The keys are what keeps a copy from being counted twice: a batch retried after it landed appends
the same events again, after the projection's version. A later row whose key is among the
projection's is looked up by its full ``event_id`` at or before that version (the ``event_id``
index that maintenance builds), and dropped only when found there. So the result is exactly the
fold of the whole log, whatever the projection's age. Like ``state.lance`` it is disposable: any
doubt (missing, unreadable, another schema, a version ahead of the log, a log without row
versions) means folding the whole log. See docs/adr/0011-usage-ledger.md, "The usage projection".
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_datagen.core.fold.usage import (
    GROUP_COLUMNS,
    SUM_COLUMNS,
    USAGE_COLUMNS,
    USAGE_TYPES,
    Sums,
    add_sums,
    entries_of_table,
    sums_of_entries,
)
from airflow_provider_datagen.core.schema import DATAGEN_SCHEMA_VERSION, EVENT_SCHEMA
from airflow_provider_datagen.core.store import lance_io
from airflow_provider_datagen.core.store.paths import is_local, usage_projection_uri

if TYPE_CHECKING:
    import datetime as dt

    import lance

    from airflow_provider_datagen.core.store.table import LanceTable

logger = logging.getLogger(__name__)

USAGE_PROJECTION_SCHEMA = pa.schema(
    [
        pa.field("writer_id", pa.string()),
        pa.field("writer_epoch", pa.int64()),
        pa.field("model", pa.string()),
        *[pa.field(name, pa.int64()) for name in SUM_COLUMNS],
        pa.field("event_keys", pa.list_(pa.int64())),
    ]
)
#: the rows of the log that may carry usage (what ``fold.usage.usage_rows_mask`` then narrows)
USAGE_FILTER = f"event_type IN ({', '.join(repr(t) for t in USAGE_TYPES)}) AND value_kind IS NOT NULL"
_EMPTY_ROWS = EVENT_SCHEMA.empty_table().select([*USAGE_COLUMNS, "event_key"])
#: rows after a projection read whole (and narrowed in memory) rather than filtered by Lance
_TAIL_ROWS_READ_WHOLE = 200_000
#: the chunks a :class:`KeySet` gathers from reads before merging them into one
_MAX_ADDED_CHUNKS = 8
#: copies looked up by their ids (an IN list the event_id index answers); more: one scan of the ids
_MAX_LISTED_IDS = 1000


def sorted_unique(keys: np.ndarray) -> np.ndarray:
    """``keys`` sorted, each once (``np.unique`` is several times slower on a million int64)."""
    out = np.sort(np.asarray(keys, dtype=np.int64))
    if len(out) > 1:
        out = out[np.concatenate(([True], out[1:] != out[:-1]))]
    return out


class KeySet:
    """The event keys of the usage rows already summed: sorted chunks, searched without merging.

    The ``base`` chunks are a projection's (one per row); each read adds the keys of the rows it
    summed as one more chunk, merged once there are a few, so a budget's frequent re-reads never
    sort a million keys again.
    """

    __slots__ = ("added", "base")

    def __init__(self, base: tuple[np.ndarray, ...] = (), added: tuple[np.ndarray, ...] = ()) -> None:
        self.base = tuple(c for c in base if len(c))
        self.added = tuple(c for c in added if len(c))

    def __len__(self) -> int:
        return sum(len(c) for c in (*self.base, *self.added))

    def has(self, keys: np.ndarray) -> np.ndarray:
        """For each of ``keys``, whether it is in the set."""
        found = np.zeros(len(keys), dtype=bool)
        for chunk in (*self.base, *self.added):
            at = np.minimum(np.searchsorted(chunk, keys), len(chunk) - 1)
            found |= chunk[at] == keys
        return found

    def plus(self, keys: np.ndarray) -> KeySet:
        """This set and ``keys``."""
        added = (*self.added, sorted_unique(keys))
        if len(added) > _MAX_ADDED_CHUNKS:
            added = (sorted_unique(np.concatenate(added)),)
        return KeySet(self.base, added)


class UsageAt(NamedTuple):
    """The usage sums of a log up to ``version`` and the keys of the rows summed (None: not read)."""

    version: int
    sums: Sums
    keys: KeySet | None


# --- the stored projection --------------------------------------------------------------------------


class StoredUsage(NamedTuple):
    """The usage projection dataset and the log version it folds."""

    dataset: lance.LanceDataset
    log_version: int


def open_usage_projection(log: LanceTable) -> StoredUsage | None:
    """The usage projection and the log version it folds, when it is one this code can read."""
    uri = usage_projection_uri(log.uri)
    if is_local(uri) and not os.path.isdir(os.path.join(uri, "_versions")):
        return None
    try:
        pds = lance_io.open_dataset(uri, log.storage_options)
    except lance_io.LANCE_ERRORS as exc:
        if "not found" not in str(exc).lower():  # on an object store, absent is the usual case
            logger.warning("ignoring the usage projection of %s: %s", log.uri, str(exc)[:200])
        return None
    meta = pds.schema.metadata or {}
    if (
        int(meta.get(b"datagen_schema_version", b"0")) != DATAGEN_SCHEMA_VERSION
        or pds.schema.remove_metadata() != USAGE_PROJECTION_SCHEMA
    ):
        return None
    return StoredUsage(pds, int(meta.get(b"log_version", b"-1")))


def usable_projection(log: LanceTable, ds: lance.LanceDataset) -> StoredUsage | None:
    """The usage projection when it may serve the log at ``ds``'s version (the rows after it folded)."""
    if not lance_io.row_versions(ds):  # no row says when it was committed: no tail can be trusted
        return None
    stored = open_usage_projection(log)
    if stored is None or not 0 < stored.log_version <= int(ds.version):
        return None
    return stored


def load(log: LanceTable, stored: StoredUsage, *, keys: bool) -> UsageAt | None:
    """The sums (and with ``keys``, the keys) of ``stored``; None when it cannot be read."""
    table = _read(log, stored, [*GROUP_COLUMNS, *SUM_COLUMNS] + (["event_keys"] if keys else []))
    if table is None:
        return None
    return UsageAt(stored.log_version, _sums_of(table), KeySet(tuple(_key_chunks(table))) if keys else None)


def _read(log: LanceTable, stored: StoredUsage, columns: list[str]) -> pa.Table | None:
    try:
        return stored.dataset.to_table(columns=columns)
    except lance_io.LANCE_ERRORS as exc:  # e.g. its version removed by a maintenance meanwhile
        logger.warning("ignoring the usage projection of %s: %s", log.uri, str(exc)[:200])
        return None


def _groups(table: pa.Table) -> list[tuple[str, int, str]]:
    return list(zip(table["writer_id"].to_pylist(), table["writer_epoch"].to_pylist(), table["model"].to_pylist()))


def _sums_of(table: pa.Table) -> Sums:
    columns = [table[name].to_pylist() for name in SUM_COLUMNS]
    return {group: [int(col[i]) for col in columns] for i, group in enumerate(_groups(table))}


def _key_chunks(table: pa.Table, column: str = "event_keys") -> list[np.ndarray]:
    """Each row's list of keys, as numpy slices of one array (``offsets`` index ``values`` as sliced)."""
    lists = table[column].combine_chunks()
    values = lists.values.to_numpy(zero_copy_only=False)
    offsets = lists.offsets.to_numpy(zero_copy_only=False)
    return [values[offsets[i] : offsets[i + 1]] for i in range(len(lists))]


def write_usage_projection(log: LanceTable, ds: lance.LanceDataset, cleanup_older_than: dt.timedelta) -> int:
    """Store the usage sums of the log at ``ds``'s version as its usage projection; returns its rows.

    From the stored projection plus the rows committed since when it is usable, else from the whole
    log. ``ds`` is one version: rows a concurrent writer commits meanwhile are after it, and a read
    folds them as the projection's tail.
    """
    version = int(ds.version)
    stored = usable_projection(log, ds)
    table = None if stored is None else _read(log, stored, list(USAGE_PROJECTION_SCHEMA.names))
    base, stored_keys = None, {}
    if stored is not None and table is not None:
        if stored.log_version == version:
            return table.num_rows
        stored_keys = dict(zip(_groups(table), _key_chunks(table)))
        base = UsageAt(stored.log_version, _sums_of(table), KeySet(tuple(stored_keys.values())))
    rows = without_copies(log, ds, rows_after(log, ds, None if base is None else base.version), base)
    entries = entries_of_table(rows)
    sums = sums_of_entries(entries)
    keys = _keys_by_group(entries)
    if base is not None:
        sums = add_sums({k: list(v) for k, v in base.sums.items()}, sums)
        for group, chunk in stored_keys.items():
            new = keys.get(group)
            keys[group] = chunk if new is None else sorted_unique(np.concatenate([chunk, new]))
    groups = sorted(sums)
    out = pa.table(
        {
            "writer_id": pa.array([g[0] for g in groups], pa.string()),
            "writer_epoch": pa.array([g[1] for g in groups], pa.int64()),
            "model": pa.array([g[2] for g in groups], pa.string()),
            **{name: pa.array([sums[g][i] for g in groups], pa.int64()) for i, name in enumerate(SUM_COLUMNS)},
            "event_keys": _list_array([keys[g] for g in groups]),
        },
        schema=USAGE_PROJECTION_SCHEMA,
    ).replace_schema_metadata({"log_version": str(version), "datagen_schema_version": str(DATAGEN_SCHEMA_VERSION)})
    uri = usage_projection_uri(log.uri)
    try:
        written = lance_io.overwrite_dataset(out, uri, log.storage_options)
        written.cleanup_old_versions(older_than=cleanup_older_than)
    except lance_io.LANCE_ERRORS as exc:
        logger.warning("could not write the usage projection of %s: %s", log.uri, str(exc)[:200])
    return out.num_rows


def _keys_by_group(entries: pa.Table) -> dict[tuple[str, int, str], np.ndarray]:
    """The sorted keys of the rows with an entry of each (writer_id, writer_epoch, model)."""
    if entries.num_rows == 0:
        return {}
    grouped = entries.group_by(list(GROUP_COLUMNS)).aggregate([("event_key", "list")])
    return {
        group: sorted_unique(chunk) for group, chunk in zip(_groups(grouped), _key_chunks(grouped, "event_key_list"))
    }


def _list_array(chunks: list[np.ndarray]) -> pa.ListArray:
    offsets = np.zeros(len(chunks) + 1, dtype=np.int32)
    offsets[1:] = np.cumsum([len(c) for c in chunks])
    values = np.concatenate(chunks) if chunks else np.zeros(0, np.int64)
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(values, pa.int64()))


# --- the rows after a base ------------------------------------------------------------------------


def rows_after(log: LanceTable, ds: lance.LanceDataset, version: int | None) -> pa.Table:
    """The rows of the log at ``ds`` that may carry usage, committed after ``version`` (all when None)."""
    columns = [*USAGE_COLUMNS, "event_key"]
    if version is None:
        return log.scan_at(ds, columns, USAGE_FILTER)
    if version >= int(ds.version):  # nothing committed after it: no scan
        return _EMPTY_ROWS
    since = f"_row_created_at_version > {version}"
    # Lance answers a filter on the row version alone from its metadata, without reading the rows
    # before it; ANDed with the other predicates it evaluates them on every row (10x slower at 5M).
    # So a short tail is read whole and narrowed here; a long one (rarely maintained) is filtered there.
    try:
        tail = ds.count_rows(filter=since)
    except lance_io.LANCE_ERRORS as exc:
        raise log.translate(exc, "reading the log") from None
    if tail > _TAIL_ROWS_READ_WHOLE:
        return log.scan_at(ds, columns, f"{since} AND {USAGE_FILTER}")
    rows = log.scan_at(ds, [*columns, "value_kind"], since)
    keep = pc.and_(pc.is_in(rows["event_type"], value_set=pa.array(USAGE_TYPES)), pc.is_valid(rows["value_kind"]))
    return rows.filter(keep).select(columns)


def without_copies(log: LanceTable, ds: lance.LanceDataset, rows: pa.Table, base: UsageAt | None) -> pa.Table:
    """``rows`` (committed after ``base.version``) without the copies of rows ``base`` summed.

    A row whose key is in ``base.keys`` is a copy when its full ``event_id`` is in the log at or
    before ``base.version`` (a key is 64 bits of the id: two events may share one).
    """
    if base is None or rows.num_rows == 0:
        return rows
    assert base.keys is not None, "the keys of the base are needed to recognise copies"
    if not len(base.keys):
        return rows
    known = base.keys.has(rows["event_key"].to_numpy())
    if not known.any():
        return rows
    ids = pc.unique(rows.filter(pa.array(known))["event_id"])
    at_or_before = f"_row_created_at_version <= {base.version}"
    if len(ids) <= _MAX_LISTED_IDS:  # a few: the event_id index finds them
        listed = ", ".join("'" + i.replace("'", "''") + "'" for i in ids.to_pylist())
        before = log.scan_at(ds, ["event_id"], f"event_id IN ({listed}) AND {at_or_before}")
    else:  # a large batch landed again: one scan of the ids of the usage rows
        before = log.scan_at(ds, ["event_id"], f"{USAGE_FILTER} AND {at_or_before}")
    copies = pc.is_in(rows["event_id"], value_set=pc.unique(before["event_id"]))
    return rows.filter(pc.invert(copies))
