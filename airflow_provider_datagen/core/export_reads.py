"""The export's reads: the log and the source each read once, their rows sorted out by export batch.

The export works in batches of completed items in item-id order (:mod:`.export_stream`). Reading a
batch's events with an ``item_id`` filter scanned the whole log per batch (~100 scans at 1M items),
and ``include_input`` read the whole source into memory. Instead each is streamed once, and every
row finds its item's position among the exported ids (sorted) with :class:`IdPositions`; rows of
other items are dropped, the rest belong to the batch ``position // batch_items``. The log's ``item_id``
column alone is streamed, and each batch then takes its rows by their offsets (:func:`log_batches`,
see ADR 0032); the source's rows go to a :class:`BatchSpill` (:func:`source_batches`). Either way a
batch comes back with only its own rows, in the order they were read (an item's events in log order).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Final, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from airflow_provider_datagen.core import jsonl
from airflow_provider_datagen.core.ids import key_of
from airflow_provider_datagen.core.schema import EVENT_SCHEMA
from airflow_provider_datagen.core.source_scan import JSONL, PARQUET, SCAN_BATCH, check_unique, source_format
from airflow_provider_datagen.core.sources import prepare_items, source_path
from airflow_provider_datagen.core.spill import GIVE_BACK_EVERY, give_back_memory, id_hash
from airflow_provider_datagen.core.store import log_takes
from airflow_provider_datagen.core.store.lance_io import lance_source_batches
from airflow_provider_datagen.core.store.paths import open_input_file
from airflow_provider_datagen.core.uri import has_scheme
from airflow_provider_datagen.exceptions import bad_argument

if TYPE_CHECKING:
    from collections.abc import Iterator

    from airflow_provider_datagen.core.store.log import CheckpointLog

#: Spilled rows held before they are written, one record batch per export batch they hold rows of.
HELD_BYTES: Final = 16 * 1024 * 1024
_SPILL_OPTIONS: Final = pa.ipc.IpcWriteOptions(compression="lz4")
_POSITION: Final = "\x00position"
_FINGERPRINT: Final = "\x00fingerprint"
_ROW: Final = "\x00row"  # a JSONL line, or a list source's index
_LINE: Final = "\x00line"
#: Ids hashed at a time (see :class:`IdPositions`).
_HASHED: Final = 1 << 16


class IdPositions:
    """Each id's position in ``ids`` (sorted, unique) or -1, for many batches of ids.

    ``pc.index_in`` builds its hash table of ``ids`` on every call (0.12 s at 1M ids for a 64k-row
    batch, most of a scan's time); this hashes ``ids`` once (``spill.id_hash``) and finds each id's
    hash by binary search, then compares the strings, so an answer is exact. Should two of ``ids``
    share a hash, every batch takes ``pc.index_in`` instead.
    """

    def __init__(self, ids: pa.Array) -> None:
        self.ids = ids
        # a slice at a time: id_hash's temporaries (and its cached power tables) scale with the bytes hashed
        hashes = np.concatenate(
            [np.zeros(0, np.uint64)] + [id_hash(ids.slice(at, _HASHED)) for at in range(0, len(ids), _HASHED)]
        )
        self.order = np.argsort(hashes, kind="stable")
        self.hashes = hashes[self.order]
        self.exact_hashes = not bool(np.any(self.hashes[1:] == self.hashes[:-1]))

    def __call__(self, query: pa.Array) -> np.ndarray:
        if query.type != self.ids.type:
            query = query.cast(self.ids.type)
        if not len(self.ids):
            return np.full(len(query), -1, np.int64)
        if not self.exact_hashes:
            found = pc.index_in(query, value_set=self.ids)
            return np.asarray(found.fill_null(-1).to_numpy(zero_copy_only=False), np.int64)
        wanted = np.concatenate(
            [np.zeros(0, np.uint64)] + [id_hash(query.slice(at, _HASHED)) for at in range(0, len(query), _HASHED)]
        )
        at = np.minimum(np.searchsorted(self.hashes, wanted), len(self.hashes) - 1)
        hit = np.flatnonzero(self.hashes[at] == wanted)
        out = np.full(len(query), -1, np.int64)
        if len(hit):
            pos = self.order[at[hit]]
            same = pc.equal(query.take(pa.array(hit)), self.ids.take(pa.array(pos)))
            keep = np.asarray(same.to_numpy(zero_copy_only=False), bool)
            out[hit[keep]] = pos[keep]
        return out


class BatchSpill:
    """Rows in one local Arrow IPC file (LZ4), each under its export batch; read back a batch at a time.

    Each added batch of rows is grouped by export batch at once; the groups are held until
    :data:`HELD_BYTES` and then written, one record batch per export batch, whose numbers are kept
    per export batch: one open file however many batches there are, and reading a batch reads only
    its record batches.
    """

    def __init__(self, folder: str, name: str, batches: int) -> None:
        self.path = os.path.join(folder, f"{name}.arrow")
        self.index: list[list[int]] = [[] for _ in range(batches)]
        self._held: list[list[pa.RecordBatch]] = [[] for _ in range(batches)]
        self._held_bytes = 0
        self._added = 0
        self._written = 0
        self._writer: pa.ipc.RecordBatchFileWriter | None = None
        self._reader: pa.ipc.RecordBatchFileReader | None = None
        self._file: pa.NativeFile | None = None

    def add(self, rows: pa.RecordBatch, batch_of: np.ndarray) -> None:
        """Spill ``rows``, row ``i`` under export batch ``batch_of[i]`` (in the order they are added)."""
        if not rows.num_rows:
            return
        if self._writer is None:
            self._writer = pa.ipc.new_file(self.path, rows.schema, options=_SPILL_OPTIONS)
        grouped = rows.take(pa.array(np.argsort(batch_of, kind="stable")))
        counts = np.bincount(batch_of, minlength=len(self.index))
        at = 0
        for b in np.flatnonzero(counts).tolist():
            self._held[b].append(grouped.slice(at, int(counts[b])))
            at += int(counts[b])
        self._held_bytes += grouped.nbytes
        self._added += 1
        if self._held_bytes >= HELD_BYTES:
            self._flush()
        if self._added % GIVE_BACK_EVERY == 0:
            give_back_memory()  # the scan's and the groups' freed buffers stay with the allocators otherwise

    def _flush(self) -> None:
        assert self._writer is not None or not self._held_bytes
        for b, held in enumerate(self._held):
            if held:
                assert self._writer is not None
                self._writer.write_batch(held[0] if len(held) == 1 else pa.concat_batches(held))
                self._held[b] = []
                self.index[b].append(self._written)
                self._written += 1
        self._held_bytes = 0

    def close(self) -> None:
        """Write what is held; after this only :meth:`read`."""
        self._flush()
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def read(self, b: int) -> pa.Table | None:
        """Batch ``b``'s rows in the order they were added (None: no row)."""
        if not self.index[b]:
            return None
        if self._reader is None:
            self._file = pa.OSFile(self.path)  # read into memory, not mapped: no page stays resident
            self._reader = pa.ipc.open_file(self._file)
        table = pa.Table.from_batches([self._reader.get_batch(i) for i in self.index[b]])
        self.index[b] = []
        return table

    def discard(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._file is not None:
            self._file.close()
            self._file = None
        self._reader = None
        if os.path.exists(self.path):
            os.remove(self.path)


def batch_count(items: int, batch_items: int) -> int:
    return -(-items // batch_items)


def log_batches(log: CheckpointLog, ids: pa.Array, batch_items: int, columns: list[str]) -> Iterator[pa.Table]:
    """The log's rows (``columns``, plus ``schema_version``) of each batch of ``ids`` (sorted), batch by batch.

    One streamed scan of the ``item_id`` column finds every batch's rows (their offsets in the scan,
    ~12 bytes an event); each batch then takes its rows of ``columns``, in log order, from the same
    version (:mod:`~airflow_provider_datagen.core.store.log_takes`).
    """
    count = batch_count(len(ids), batch_items)
    empty = EVENT_SCHEMA.empty_table().select(list(dict.fromkeys([*columns, "schema_version"])))
    ds = log_takes.pinned(log.table) if count else None
    if ds is None:
        yield from (empty for _ in range(count))
        return
    lookup = IdPositions(ids)
    offsets, batch_of = [], []
    at = 0
    for batch in log.table.batches(ds, ["item_id"]):
        pos = lookup(batch.column("item_id"))
        keep = np.flatnonzero(pos >= 0)
        offsets.append(keep + at)
        batch_of.append((pos[keep] // batch_items).astype(np.int32))
        at += batch.num_rows
    del lookup
    every = np.concatenate([np.zeros(0, np.int64), *offsets])
    which = np.concatenate([np.zeros(0, np.int32), *batch_of])
    del offsets, batch_of
    order = np.argsort(which, kind="stable")  # by batch, each batch's rows in log order
    every, counts = every[order], np.bincount(which, minlength=count)
    del order, which
    give_back_memory()
    start = 0
    for b in range(count):
        n = int(counts[b])
        yield log_takes.take_rows(log.table, ds, every[start : start + n], columns) if n else empty
        start += n


class SourceRow(NamedTuple):
    """One exported item's source row: its input fingerprint and its dict (as ``load_source`` gives it)."""

    fingerprint: str
    data: dict[str, Any]


def _arrow_batches(path: str, storage_options: dict[str, str] | None) -> Iterator[pa.RecordBatch]:
    if source_format(path) == PARQUET:
        pf = pq.ParquetFile(path if not has_scheme(path) else open_input_file(path, storage_options))
        yield from pf.iter_batches(batch_size=SCAN_BATCH)
    else:
        yield from lance_source_batches(path, storage_options, SCAN_BATCH)


def _plain(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Dictionary columns decoded: an IPC file cannot hold a dictionary that changes between batches."""
    if not any(pa.types.is_dictionary(f.type) for f in batch.schema):
        return batch
    columns = [c.dictionary_decode() if pa.types.is_dictionary(c.type) else c for c in batch.columns]
    return pa.RecordBatch.from_arrays(columns, names=batch.schema.names)


def _jsonl_batches(path: str, storage_options: dict[str, str] | None) -> Iterator[tuple[list[Any], list[bytes]]]:
    """The rows of a JSONL source a batch at a time, and each row's line (read as ``read_source`` reads them)."""
    rows: list[Any] = []
    lines: list[bytes] = []
    with open_input_file(path, storage_options) as fh:
        for n, line in enumerate(jsonl.lines(fh), 1):
            if line.strip():
                rows.append(jsonl.source_row(line, path, n))
                lines.append(line)
                if len(rows) >= SCAN_BATCH:
                    yield rows, lines
                    rows, lines = [], []
    if rows:
        yield rows, lines


def _source_parts(
    source: Any, storage_options: dict[str, str] | None
) -> tuple[str | None, Iterator[tuple[list[Any], pa.RecordBatch]]]:
    """A source's rows a batch at a time, each with what to spill to read the row back (the path, or None)."""
    if isinstance(source, (list, tuple)):
        rows = list(source)

        def listed() -> Iterator[tuple[list[Any], pa.RecordBatch]]:
            for start in range(0, len(rows), SCAN_BATCH):
                part = rows[start : start + SCAN_BATCH]
                at = pa.array(np.arange(start, start + len(part), dtype=np.int64))
                yield part, pa.RecordBatch.from_arrays([at], names=[_ROW])

        return None, listed()
    path = source_path(source)
    if source_format(path) == JSONL:

        def lined() -> Iterator[tuple[list[Any], pa.RecordBatch]]:
            for part, lines in _jsonl_batches(path, storage_options):
                yield part, pa.RecordBatch.from_arrays([pa.array(lines, pa.large_binary())], names=[_LINE])

        return path, lined()

    def tabled() -> Iterator[tuple[list[Any], pa.RecordBatch]]:
        for batch in _arrow_batches(path, storage_options):
            yield batch.to_pylist(), _plain(batch)

    return path, tabled()


def source_batches(
    source: Any, key_field: str, ids: pa.Array, batch_items: int, storage_options: dict[str, str] | None, folder: str
) -> Iterator[dict[str, SourceRow]]:
    """The source rows of each batch of ``ids`` (sorted), batch by batch, from one streamed read of the source.

    The rows are validated as ``load_source`` validates them. Before the first batch: a source that
    lacks any of ``ids`` is refused (naming how many and the first), as is a key it repeats.
    """
    count = batch_count(len(ids), batch_items)
    spill = BatchSpill(folder, "inputs", count)
    try:
        lookup = IdPositions(ids)
        found = np.zeros(len(ids), bool)
        seen: list[pa.Array] = []
        path, parts = _source_parts(source, storage_options)
        start = 0
        for rows, payload in parts:
            items = prepare_items(rows, key_field, start=start)
            start += len(rows)
            item_ids = pa.array([s.item_id for s in items], pa.string())
            seen.append(item_ids)
            pos = lookup(item_ids)
            keep = np.flatnonzero(pos >= 0)
            found[pos[keep]] = True
            fps = pa.array([items[i].fingerprint for i in keep.tolist()], pa.string())
            kept = payload.take(pa.array(keep))
            kept = kept.append_column(_POSITION, pa.array(pos[keep])).append_column(_FINGERPRINT, fps)
            spill.add(kept, pos[keep] // batch_items)
            del items, rows
        spill.close()
        if seen:
            check_unique(path or "source", key_field, pa.concat_arrays(seen))
        del seen
        _check_found(source, key_field, ids, found)
        for b in range(count):
            table = spill.read(b)
            yield {} if table is None else _rows_of(table, ids, source, path)
    finally:
        spill.discard()


def _check_found(source: Any, key_field: str, ids: pa.Array, found: np.ndarray) -> None:
    missing = np.flatnonzero(~found)
    if len(missing):
        raise bad_argument(
            "export_results",
            "source",
            source,
            f"lacks {len(missing)} of the exported items (e.g. key {key_of(ids[int(missing[0])].as_py())!r}, "
            f"key_field={key_field!r})",
            "pass the source and key_field the experiment was planned with, or export without include_input",
        )


def _rows_of(table: pa.Table, ids: pa.Array, source: Any, path: str | None) -> dict[str, SourceRow]:
    """A batch's spilled rows as item id -> :class:`SourceRow`."""
    item_ids = ids.take(table.column(_POSITION)).to_pylist()
    fps = table.column(_FINGERPRINT).to_pylist()
    if _ROW in table.column_names:  # a list source: the row is the caller's dict, read by its index
        rows = [source[i] for i in table.column(_ROW).to_pylist()]
    elif _LINE in table.column_names:
        assert path is not None
        rows = [jsonl.source_row(line, path, 0) for line in table.column(_LINE).to_pylist()]
    else:
        rows = table.drop_columns([_POSITION, _FINGERPRINT]).to_pylist()
    # a SourceItem's dict: the row copied (another mapping becomes a dict), as load_source hands it out
    return {iid: SourceRow(fp, dict(row)) for iid, fp, row in zip(item_ids, fps, rows, strict=True)}
