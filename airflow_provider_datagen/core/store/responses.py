"""The response store's Lance dataset: ``<root>/datagen_responses/``, one entry per request key.

Every experiment under a root shares it (docs/guide/response-store.md, docs/adr/0027-response-store.md).
An entry is made by the first successful reply to a request (its key: :meth:`LLMRequest.key
<airflow_provider_datagen.llm.request.LLMRequest.key>`) and holds the reply (the answer, the provider's
raw JSON), its usage and cost as recorded, and when and by which pipeline/experiment it was made.

Lookups (:meth:`ResponseStore.get_many`) go through an index kept in memory: every key's ``key_hash``
(its first 8 bytes as an int64) sorted, and every key itself (~80 bytes an entry in all), read once per
opened store and extended by the fragments appended since (this process's and other writers'), so a
lookup of 10,000 keys is a binary search, a comparison of the whole keys in memory (a hash collision
is a miss) and one ``take`` of the rows found, without their ``key`` column, the replies sliced from
the data files where Lance wrote them, as the requests are
(:mod:`~airflow_provider_datagen.core.store.blob_columns`). Appends
are Lance commits (Lance rebases concurrent appends), the first one a race-safe create
(:func:`~airflow_provider_datagen.core.store.lance_io.create_dataset`), each fsynced on a local disk
as the log's are. Two writers that both missed one key may both append it: the earliest entry answers.
"""

from __future__ import annotations

import datetime as dt
import itertools
import os
import re
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from airflow_provider_datagen.core.store import lance_io
from airflow_provider_datagen.core.store.blob_columns import (
    BLOB_COLUMNS,
    BLOB_METADATA,
    BlobLocations,
    is_blob,
    read_by_lance,
    read_located,
)
from airflow_provider_datagen.core.store.paths import is_local, local_path
from airflow_provider_datagen.core.store.response_index import Keys, gather, hashes_of, key_words, merge
from airflow_provider_datagen.exceptions import DatagenError, ResponseStoreError

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from airflow_provider_datagen.core.store.blob_columns import View

#: the store's directory under a root, beside ``datagen_checkpoints``
RESPONSES_DIR = "datagen_responses"

SCHEMA = pa.schema(
    [
        pa.field("key", pa.string(), nullable=False),
        pa.field("key_hash", pa.int64(), nullable=False),
        pa.field("created_at", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("pipeline", pa.string()),
        pa.field("experiment", pa.string()),
        #: the usage label (``"openai:gpt-4o-mini"``) the reply's tokens were recorded under
        pa.field("model", pa.string()),
        #: the request's canonical form (LLMRequest.canonical) as JSON: the request as sent
        pa.field("request_json", pa.large_binary(), metadata=BLOB_METADATA),
        #: the provider's reply, its raw JSON; both as UTF-8 in blob columns, read where they lie (blob_columns)
        pa.field("reply_json", pa.large_binary(), metadata=BLOB_METADATA),
        pa.field("input_tokens", pa.int64()),
        pa.field("output_tokens", pa.int64()),
        #: the cost recorded for the reply (None: unpriced)
        pa.field("cost_usd", pa.float64()),
    ]
)
#: the schema of a store made before the blob columns (still read and appended to), and of what
#: :meth:`ResponseStore.find` returns
STRING_SCHEMA = pa.schema([pa.field(f.name, pa.string()) if f.name in BLOB_COLUMNS else f for f in SCHEMA])
#: how long an object store's lookups go on with the manifest they read (other writers' entries wait that long)
REFRESH_SECONDS = 1.0
#: the columns a lookup reads: ResponseEntry's fields, in their order
_ENTRY_COLUMNS = [
    "key",
    "reply_json",
    "model",
    "input_tokens",
    "output_tokens",
    "cost_usd",
    "request_json",
    "pipeline",
    "experiment",
    "created_at",
]
#: an entry's provenance: who made it, and when (the UI's "reused from <pipeline>/<experiment>, <date>")
_PROVENANCE = ("pipeline", "experiment", "created_at")
_FIX = (
    "point the root at a directory whose datagen_responses/ is a response store, move the damaged "
    "directory away (a new store is made on the next reply), or pass reuse=False to the model step"
)


def responses_uri(root: str) -> str:
    """The URI of the response store under ``root`` (a path or an object-store URI)."""
    return f"{str(root).rstrip('/')}/{RESPONSES_DIR}"


def key_hash(key: str) -> int:
    """The ``key_hash`` of a key (64 hex digits): its first 8 bytes as a signed int64."""
    return int(np.array([int(key[:16], 16)], dtype=np.uint64).view(np.int64)[0])


@dataclass(frozen=True)
class ResponseEntry:
    """One stored reply.

    :param key: the request's key.
    :param reply_json: the provider's reply as received (raw JSON text).
    :param model: the usage label its tokens were recorded under (``"openai:gpt-4o-mini"``).
    :param input_tokens: the reply's input tokens.
    :param output_tokens: the reply's output tokens.
    :param cost_usd: its cost as recorded (None: unpriced).
    :param request_json: the request's canonical form as JSON.
    :param pipeline: the pipeline whose run made it.
    :param experiment: the experiment whose run made it.
    :param created_at: when it was made (None: now, when put).
    """

    key: str
    reply_json: str
    model: str
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None
    request_json: str | None = None
    pipeline: str | None = None
    experiment: str | None = None
    created_at: dt.datetime | None = None

    def describe(self) -> dict[str, Any]:
        """A JSON-able view (the UI's "reused from <pipeline>/<experiment>, <date>")."""
        made = self.created_at.isoformat() if self.created_at is not None else None
        return {"key": self.key, "pipeline": self.pipeline, "experiment": self.experiment, "created_at": made}


class ResponseStore:
    """The response store under a root (see the module); :meth:`open` it.

    Thread-safe: a task's event loop, its worker threads and its write-behind thread share one.
    """

    def __init__(self, uri: str, storage_options: dict[str, str] | None) -> None:
        self.uri = uri
        self.storage_options = dict(storage_options) if storage_options else None
        self._lock = threading.RLock()
        self._ds: Any = None
        #: the index: key hashes sorted, the row offset of each, each row's key (by row offset), and
        #: the fragments it covers
        self._hashes = np.empty(0, np.int64)
        self._offsets = np.empty(0, np.int64)
        self._keys = Keys()
        self._fragments: list[tuple[int, int, str]] = []  # (fragment id, live rows, data file) in dataset order
        self._rows = 0
        self._refreshed = 0.0
        #: the dataset's blob columns (a store made before them has none), and where each row's value of
        #: them is (a local store's; none on an object store)
        self._blobs: tuple[str, ...] = BLOB_COLUMNS
        self._located: dict[str, BlobLocations] = {}

    def __repr__(self) -> str:
        return f"ResponseStore({self.uri!r})"

    @classmethod
    def open(cls, root: str | os.PathLike[str], storage_options: dict[str, str] | None = None) -> ResponseStore:
        """The store at ``<root>/datagen_responses/`` (made by its first :meth:`put_many`).

        :param root: the root (a path or an object-store URI), the same as the logs'.
        :param storage_options: the object store's options (credentials, endpoint), as the log's.
        :raises ResponseStoreError: what is there is not a response store, is damaged, or cannot be
            reached; the message names the URI and the fix. Nothing is written.
        """
        root_s = os.fspath(root)
        if is_local(root_s):
            root_s = os.path.abspath(local_path(root_s))
        store = cls(responses_uri(root_s), storage_options)
        store.check()
        return store

    # --- reading ----------------------------------------------------------------------------------

    def check(self) -> None:
        """Read the store's manifest and schema now: :class:`ResponseStoreError` if it is not usable."""
        with self._lock:
            self._dataset(force=True)

    def _dataset(self, *, refresh: bool = False, force: bool = False) -> Any:
        """The dataset as it is now (None while there is none); the index follows it.

        A refresh of a local store is one stat when nothing was committed since (``is_latest``); an
        object store's is a manifest read at most every :data:`REFRESH_SECONDS` unless ``force``.
        """
        ds = self._ds
        if ds is not None and not force:
            if not refresh or lance_io.is_latest(self.uri, ds):
                return ds
            if not is_local(self.uri) and time.monotonic() - self._refreshed < REFRESH_SECONDS:
                return ds
        self._refreshed = time.monotonic()
        ds = self._open()
        if ds is not None:
            self._index(ds)
        self._ds = ds
        return ds

    def _open(self) -> Any:
        uri = self.uri
        if is_local(uri):
            path = local_path(uri)
            if not os.path.exists(path) or lance_io.being_created(path):
                return None
            if not os.path.isdir(path) or not lance_io.has_manifest(path):
                raise ResponseStoreError(f"the response store {uri} is not a Lance dataset; {_FIX}")
        try:
            ds = lance_io.open_dataset(uri, self.storage_options)
        except lance_io.LANCE_ERRORS as exc:
            low = str(exc).lower()
            if not is_local(uri) and "not found" in low and not any(s in low for s in lance_io.STORE_ACCESS_ERRORS):
                return None  # no store yet under this prefix
            raise self._error(exc, "opening") from None
        missing = {"key", "key_hash", "reply_json"} - set(ds.schema.names)
        if missing:
            raise ResponseStoreError(
                f"the response store {uri} is a Lance dataset without the columns {sorted(missing)}: not a "
                f"response store; {_FIX}"
            )
        return ds

    def _error(self, exc: BaseException, action: str) -> ResponseStoreError:
        translated = lance_io.translate(exc, self.uri, f"{action} the response store")
        return ResponseStoreError(f"{translated} (response store {self.uri}: {_FIX})")

    def _index(self, ds: Any) -> None:
        """Bring the index up to ``ds``: the new fragments' keys when only appends happened, else all.

        Known fragments are compared by id, live row count and data file: a compaction by :meth:`maintain`
        gives new ids, a deletion (this process's or another's, compacted or not) changes a count, a
        store made again in the same place has other files; each rebuilds the index, so the keys and row
        offsets it holds are always ``ds``'s.
        """
        fragments = ds.get_fragments()
        now = [(f.fragment_id, int(f.metadata.num_rows), f.metadata.files[0].path) for f in fragments]
        known, hashes, offsets, keys, rows = self._fragments, self._hashes, self._offsets, self._keys, self._rows
        blobs = tuple(c for c in BLOB_COLUMNS if c in ds.schema.names and is_blob(ds.schema, c))
        located = self._located
        if now[: len(known)] != known or blobs != self._blobs:  # compacted, deleted from, or another dataset
            known, hashes, offsets, keys, rows = [], np.empty(0, np.int64), np.empty(0, np.int64), Keys(), 0
            located = {}
        if is_local(self.uri) and not located:
            located = {c: BlobLocations(c, os.path.join(local_path(self.uri), "data")) for c in blobs}
        added, words, valid = [], [], []
        described: dict[str, list[tuple[str | None, pa.ChunkedArray]]] = {c: [] for c in located}
        try:
            for frag in fragments[len(known) :]:
                table = frag.to_table(columns=["key", "key_hash", *located])
                files = frag.metadata.files
                for column, parts in described.items():
                    parts.append((files[0].path if len(files) == 1 else None, table[column]))
                added.append(table["key_hash"].to_numpy())
                for chunk in table["key"].chunks:  # each Arrow chunk's buffer kept as it is
                    chunk_words, ok = key_words(chunk)
                    words.append(chunk_words)
                    valid.append(ok)
        except lance_io.LANCE_ERRORS as exc:  # nothing of the index changed
            raise self._error(exc, "reading") from None
        if added:
            new_hashes, ok_rows = np.concatenate(added), np.concatenate(valid)
            new_offsets = np.arange(rows, rows + len(new_hashes), dtype=np.int64)[ok_rows]
            hashes, offsets = merge(hashes, offsets, new_hashes[ok_rows], new_offsets)
            keys.extend(words)
            for column, parts in described.items():
                located[column].extend(parts)
            rows += len(new_hashes)
        self._hashes, self._offsets, self._keys, self._fragments, self._rows = hashes, offsets, keys, now, rows
        self._blobs, self._located = blobs, located

    def _locate(self, keys: list[str], refresh: bool) -> tuple[Any, np.ndarray, np.ndarray, dict[str, View]]:
        """``(dataset, positions in keys, row offsets, blob locations)`` of the stored ``keys`` (distinct),
        by offset (the locations: views of the index's by column, none where Lance reads the blobs).

        The whole key is compared in memory (a hash collision is a miss) and equal hashes are in
        dataset order, so the first match of a key is its earliest entry.
        """
        none = np.empty(0, np.int64)
        with self._lock:  # a snapshot of the index: the read that follows holds no lock (appends go on)
            ds = self._dataset(refresh=refresh)
            hashes, row_offsets, stored = self._hashes, self._offsets, self._keys.view()
            views = {column: located.view() for column, located in self._located.items()}
        if ds is None or not len(hashes):
            return ds, none, none, {}
        words, ok = key_words(pa.array(keys, pa.string()))
        wanted = hashes_of(words)
        todo = np.flatnonzero(ok)
        todo = todo[np.argsort(wanted[todo])]  # sorted needles: a faster search
        pos = np.zeros(len(keys), np.int64)
        pos[todo] = np.searchsorted(hashes, wanted[todo])
        offsets = np.full(len(keys), -1, np.int64)
        while len(todo):
            todo = todo[pos[todo] < len(hashes)]
            todo = todo[hashes[pos[todo]] == wanted[todo]]
            candidates = row_offsets[pos[todo]]
            same = (gather(stored, candidates) == words[todo]).all(axis=1)
            offsets[todo[same]] = candidates[same]
            todo = todo[~same]  # another key with the same hash: try the next entry of that hash
            pos[todo] += 1
        found = np.flatnonzero(offsets >= 0)
        found = found[np.argsort(offsets[found])]
        return ds, found, offsets[found], views

    def find(self, keys: Sequence[str], *, refresh: bool = True, columns: Sequence[str] | None = None) -> pa.Table:
        """The stored rows of ``keys`` as one Arrow table (one row per stored key, the earliest entry), in one read.

        :param keys: request keys (:meth:`LLMRequest.key`).
        :param refresh: first look for entries other writers made since the last lookup (a stat on a
            local disk, a manifest read at most every :data:`REFRESH_SECONDS` on an object store);
            False: only what this object has seen.
        :param columns: the columns to read (``key`` is always there, from the index); None: every
            column of an entry.
        """
        read = [c for c in (columns or _ENTRY_COLUMNS) if c != "key"]
        found_keys, table, blobs = self._read(keys, refresh, read)
        if table is None:
            return STRING_SCHEMA.empty_table().select(["key", *read])
        arrays = {"key": pa.array(found_keys, pa.string())}
        arrays.update((name, pa.array(values, pa.string())) for name, values in blobs.items())
        return pa.Table.from_arrays(
            [arrays[name] if name in arrays else table[name] for name in ["key", *read]], names=["key", *read]
        )

    def _read(
        self, keys: Sequence[str], refresh: bool, columns: list[str]
    ) -> tuple[list[str], pa.Table | None, dict[str, list[str | None]]]:
        """The stored ones of ``keys`` (distinct, in the store's order), their rows' ``columns`` but the
        blob ones (None: none found), and the blob ones asked for, as text by column."""
        if not keys:
            return [], None, {}
        distinct = list(dict.fromkeys(keys))
        ds, found, offsets, views = self._locate(distinct, refresh)
        if not len(found):
            return [], None, {}
        schema = ds.schema
        blobs = [c for c in columns if c in BLOB_COLUMNS and is_blob(schema, c)]
        take = [c for c in columns if c not in blobs]  # a store made before the blob columns: Lance takes them
        try:
            table = ds.take(offsets, columns=take) if take else pa.table({})
            texts = {c: table[c].to_pylist() for c in columns if c in BLOB_COLUMNS and c not in blobs}
            for column in blobs:
                view = views.get(column)
                texts[column] = read_located(view, offsets, ds) if view else read_by_lance(ds, offsets, column)
        except lance_io.LANCE_ERRORS as exc:  # a data file unreadable, or a value not UTF-8
            raise self._error(exc, "reading") from None
        return [distinct[i] for i in found.tolist()], table, texts

    def get_many(
        self, keys: Sequence[str], *, refresh: bool = True, request_json: bool = True, provenance: bool = True
    ) -> dict[str, ResponseEntry]:
        """The stored entries of ``keys`` (the keys not stored are absent), in one read (as :meth:`find`).

        :param keys: request keys (:meth:`LLMRequest.key`).
        :param refresh: see :meth:`find`.
        :param request_json: read each entry's request too; False: ``request_json`` is None (a
            lookup that only answers requests: the request is as large as the reply to read).
        :param provenance: read who made each entry and when; False: ``pipeline``, ``experiment`` and
            ``created_at`` are None (three columns fewer: ~15 ms per 10,000 at random in 1M).
        """
        skip = (set() if request_json else {"request_json"}) | (set() if provenance else set(_PROVENANCE))
        read = [c for c in _ENTRY_COLUMNS[1:] if c not in skip]
        found_keys, table, texts = self._read(keys, refresh, read)
        if table is None:
            return {}
        none = itertools.repeat(None)
        values = {name: table[name].to_pylist() for name in read if name != "created_at" and name not in texts}
        values.update(texts)
        rows = zip(
            found_keys,
            values["reply_json"],
            values["model"],
            values["input_tokens"],
            values["output_tokens"],
            values["cost_usd"],
            values.get("request_json", none),
            values.get("pipeline", none),
            values.get("experiment", none),
            _datetimes(table["created_at"]) if provenance else none,
        )
        # the fields set straight, as the dataclass's __init__ would (a third of the time of 10,000 calls of it)
        new, found = object.__new__, {}
        for row in rows:
            entry = new(ResponseEntry)
            f = entry.__dict__
            (
                f["key"],
                f["reply_json"],
                f["model"],
                f["input_tokens"],
                f["output_tokens"],
                f["cost_usd"],
                f["request_json"],
                f["pipeline"],
                f["experiment"],
                f["created_at"],
            ) = row
            found[row[0]] = entry
        return found

    def get(self, key: str) -> ResponseEntry | None:
        """The stored entry of one key, or None."""
        return self.get_many([key]).get(key)

    # --- writing ----------------------------------------------------------------------------------

    def put_many(self, entries: Iterable[ResponseEntry]) -> int:
        """Append ``entries`` in one commit, durable (fsynced on a local disk) when this returns.

        :returns: how many were appended.
        :raises ResponseStoreError: the write failed (nothing of it is stored).
        """
        table = _table(list(entries))
        if not table.num_rows:
            return 0
        with self._lock:
            ds = self._ds if self._ds is not None else self._dataset(force=True)
        # the write holds no lock: lookups go on from the index meanwhile (Lance rebases concurrent appends)
        try:
            if ds is None:
                ds = lance_io.create_dataset(table, self.uri, SCHEMA, self.storage_options, self._open)
            elif is_blob(ds.schema, "reply_json"):
                ds = lance_io.append_table(table, ds, SCHEMA, self.storage_options)
            else:  # a store made before the blob columns: appended to as it is
                ds = lance_io.append_table(table.cast(STRING_SCHEMA), ds, STRING_SCHEMA, self.storage_options)
            if is_local(self.uri):
                files, _ = lance_io.committed_files(ds, 0)
                lance_io.fsync_commit(local_path(self.uri), ds, files)
        except DatagenError:
            raise
        except lance_io.LANCE_ERRORS as exc:
            raise self._error(exc, "writing") from None
        with self._lock:
            if self._ds is None or int(ds.version) >= int(self._ds.version):
                self._index(ds)
                self._ds = ds
        return table.num_rows

    # --- housekeeping -----------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """``{"uri", "entries", "bytes", "versions", "fragments"}`` (``bytes`` is 0 on an object store)."""
        with self._lock:
            ds = self._dataset(refresh=True)
            if ds is None:
                return {"uri": self.uri, "entries": 0, "bytes": 0, "versions": 0, "fragments": 0}
            return {
                "uri": self.uri,
                "entries": int(ds.count_rows()),
                "bytes": lance_io.local_size_bytes(self.uri),
                "versions": len(ds.versions()),
                "fragments": len(self._fragments),
            }

    def compact(self, *, above_fragments: int = 0) -> bool:
        """Rewrite the store's small fragments into few (each write-behind flush adds one) when it has
        more than ``above_fragments``; safe beside other writers (Lance rebases their appends).

        :returns: whether it compacted.
        """
        with self._lock:
            ds = self._dataset(refresh=True)
            if ds is None or len(self._fragments) <= above_fragments:
                return False
        try:
            ds.optimize.compact_files()
        except lance_io.LANCE_ERRORS as exc:
            raise self._error(exc, "compacting") from None
        with self._lock:
            self._dataset(force=True)
        return True

    def maintain(self, older_than: dt.timedelta | None = None) -> dict[str, Any]:
        """Drop the entries made longer ago than ``older_than`` (None: none), compact, drop old versions.

        :param older_than: the age past which an entry is dropped (its request is then paid again).
        :returns: ``{"dropped", "entries", "bytes"}``.
        """
        if older_than is not None and (not isinstance(older_than, dt.timedelta) or older_than.total_seconds() < 0):
            raise ResponseStoreError(
                f"ResponseStore.maintain: older_than={older_than!r} is not a timedelta >= 0; "
                "give e.g. datetime.timedelta(days=90), or None"
            )
        with self._lock:
            ds = self._dataset(refresh=True)
            if ds is None:
                return {"dropped": 0, **self.stats()}
            before = int(ds.count_rows())
            try:
                if older_than is not None:
                    cutoff = dt.datetime.now(dt.UTC) - older_than
                    ds.delete(f"created_at < timestamp '{cutoff.strftime('%Y-%m-%d %H:%M:%S.%f')}'")
                    ds = lance_io.open_dataset(self.uri, self.storage_options)
                ds.optimize.compact_files(materialize_deletions_threshold=0.0)
                ds = lance_io.open_dataset(self.uri, self.storage_options)
                ds.cleanup_old_versions(older_than=dt.timedelta(hours=1))
            except lance_io.LANCE_ERRORS as exc:
                raise self._error(exc, "maintaining") from None
            self._ds = None
            self._dataset(refresh=True)
            after = int(ds.count_rows())
        return {"dropped": before - after, **self.stats()}


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_HEX = re.compile("[0-9a-fA-F]{16}")


def _datetimes(column: pa.ChunkedArray) -> list[dt.datetime]:
    """A ``timestamp[us, UTC]`` column as datetimes, each distinct value made once (a flush's entries
    share theirs): Arrow's ``to_pylist`` takes ~7 us a value with a time zone."""
    distinct, where = np.unique(column.cast(pa.int64()).to_numpy(), return_inverse=True)
    made = [_EPOCH + dt.timedelta(microseconds=us) for us in distinct.tolist()]
    return [made[i] for i in where.tolist()]


def _table(entries: list[ResponseEntry]) -> pa.Table:
    for e in entries:  # what a lookup can find: a key is 64 characters, its first 16 hex digits (key_hash)
        if not isinstance(e.key, str) or len(e.key) != 64 or not e.key.isascii() or not _HEX.fullmatch(e.key[:16]):
            raise ResponseStoreError(
                f"ResponseStore.put_many: the key {e.key!r} is not a request's key (64 ASCII characters, the first "
                "16 hex digits); give LLMRequest.key() of the request the reply answers"
            )
    now = dt.datetime.now(dt.UTC)
    return pa.table(
        {
            "key": [e.key for e in entries],
            "key_hash": [key_hash(e.key) for e in entries],
            "created_at": [e.created_at or now for e in entries],
            "pipeline": [e.pipeline for e in entries],
            "experiment": [e.experiment for e in entries],
            "model": [e.model for e in entries],
            "request_json": [None if e.request_json is None else e.request_json.encode() for e in entries],
            "reply_json": [e.reply_json.encode() for e in entries],
            "input_tokens": [int(e.input_tokens) for e in entries],
            "output_tokens": [int(e.output_tokens) for e in entries],
            "cost_usd": [e.cost_usd for e in entries],
        },
        schema=SCHEMA,
    )
