"""Streamed reads of a path source: ids and fingerprints a batch at a time, and a chunk's rows read back.

A plan needs each item's id and input fingerprint, never its values: the source is read in record
batches, each batch validated and fingerprinted and then dropped, so a plan's memory is its ids and
fingerprints (Arrow buffers, ~50 bytes an item) plus the fold, not the source's dicts. A chunk then
names its rows by position (ranges, plus byte offsets for JSONL), and a mapped task reads only those.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from airflow_provider_datagen.core import jsonl
from airflow_provider_datagen.core.ids import key_of
from airflow_provider_datagen.core.sources import SourceItem, fingerprint_batch, fingerprint_rows, prepare_items
from airflow_provider_datagen.core.store.lance_io import lance_source_batches, lance_source_count, lance_source_rows
from airflow_provider_datagen.core.store.paths import file_size, open_input_file
from airflow_provider_datagen.core.uri import has_scheme
from airflow_provider_datagen.exceptions import InvalidItemError

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

#: Rows per batch: ~10 MB of 100-byte rows as dicts at a time.
SCAN_BATCH = 1 << 16

JSONL, PARQUET, LANCE = "jsonl", "parquet", "lance"


def source_format(path: str) -> str:
    """The format of a path source by its suffix (``read_source`` has checked it is one of the three)."""
    lower = path.rstrip("/").lower()
    if lower.endswith((".jsonl", ".ndjson")):
        return JSONL
    if lower.endswith(".parquet"):
        return PARQUET
    if lower.endswith(".lance"):
        return LANCE
    raise InvalidItemError(f"source {path!r}: unknown format; use a .jsonl, .parquet or .lance path")


@dataclass
class ScannedSource:
    """Every item's id and input fingerprint in source order (and each JSONL row's byte offset)."""

    ids: pa.Array
    fingerprints: pa.Array
    offsets: np.ndarray | None  # JSONL only


class ScannedBatch(NamedTuple):
    """One batch of a scan: its items' ids and input fingerprints (and JSONL byte offsets)."""

    ids: pa.Array
    fingerprints: pa.Array
    offsets: np.ndarray | None  # JSONL only


def scan_batches(path: str, key_field: str, storage_options: dict[str, str] | None = None) -> Iterator[ScannedBatch]:
    """Validate and fingerprint a path source a batch at a time; errors are exactly ``load_source``'s.

    A bad row raises :func:`prepare_items`' error naming the item by its place in the whole source,
    as the unstreamed read would, without reading the source again (at 10M rows that read alone
    would not fit in memory). Keys are unique within each batch only: the caller checks the whole
    source (:func:`check_unique`).
    """
    start = 0
    for rows, offs, plain in _batches(path, storage_options):
        fast: tuple[Any, pa.Array] | None = None
        if isinstance(rows, pa.RecordBatch):
            fast = fingerprint_batch(rows, key_field) if plain else None
            if fast is None:
                rows = rows.to_pylist()
        if fast is None:
            fast = fingerprint_rows(rows, key_field, plain=plain)
        if fast is None:
            items = prepare_items(rows, key_field, start=start)
            fast = [s.item_id for s in items], pa.array([s.fingerprint for s in items], pa.string())
            del items
        start += len(rows)
        del rows
        ids = fast[0] if isinstance(fast[0], pa.Array) else pa.array(fast[0], pa.string())
        scanned = ScannedBatch(ids, fast[1], offs)
        del fast
        yield scanned


def scan_source(path: str, key_field: str, storage_options: dict[str, str] | None = None) -> ScannedSource:
    """Every item's id and fingerprint (see :func:`scan_batches`), keys checked unique over the whole source."""
    return gather(path, key_field, scan_batches(path, key_field, storage_options))


def gather(path: str, key_field: str, batches: Iterable[ScannedBatch]) -> ScannedSource:
    """The batches of a scan as one :class:`ScannedSource`; a key repeated in two raises ``load_source``'s error."""
    ids: list[pa.Array] = []
    fps: list[pa.Array] = []
    offsets: list[np.ndarray] = []
    for batch in batches:
        ids.append(batch.ids)
        fps.append(batch.fingerprints)
        if batch.offsets is not None:
            offsets.append(batch.offsets)
    all_ids = pa.concat_arrays(ids) if ids else pa.array([], pa.string())
    del ids
    # the batches' decoded buffers stay with the allocator otherwise (~90 MB at 1M rows), under the fold
    pa.default_memory_pool().release_unused()
    check_unique(path, key_field, all_ids)
    return ScannedSource(
        all_ids,
        pa.concat_arrays(fps) if fps else pa.array([], pa.string()),
        np.concatenate(offsets) if offsets else (np.zeros(0, np.int64) if source_format(path) == JSONL else None),
    )


def check_unique(path: str, key_field: str, ids: pa.Array, positions: np.ndarray | None = None) -> None:
    """Raise ``load_source``'s duplicate key error (naming both items) when any of ``ids`` repeats.

    ``positions``: each id's place in the whole source (a bucket of a partitioned plan), else its
    index in ``ids``. Among repeated keys the error names the pair an in-order read meets first
    (the smallest second occurrence), built from the ids alone: no second read of the source.
    """
    dup = _duplicated(ids)
    if dup is None:
        return
    pos = np.arange(len(ids), dtype=np.int64) if positions is None else np.asarray(positions, dtype=np.int64)
    mask = pc.is_in(ids, value_set=dup).to_numpy(zero_copy_only=False)
    repeated = pa.table({"id": ids.filter(pa.array(mask)), "pos": pos[mask]})
    ranked = repeated.take(pc.sort_indices(repeated, sort_keys=[("id", "ascending"), ("pos", "ascending")]))
    ranked_ids = ranked.column("id").combine_chunks()
    ranked_pos = ranked.column("pos").to_numpy()
    # in (id, position) order: a row whose id equals the one before is a repeat; the first repeat of
    # each id is its second occurrence, named with the occurrence before it
    same = pc.equal(ranked_ids.slice(1), ranked_ids.slice(0, len(ranked_ids) - 1)).to_numpy(zero_copy_only=False)
    first_repeat = np.flatnonzero(same & ~np.concatenate(([False], same[:-1]))) + 1
    at = first_repeat[np.argmin(ranked_pos[first_repeat])]
    key = key_of(ranked_ids[at].as_py())
    raise InvalidItemError(
        f"duplicate key {key[:200]!r} (items #{ranked_pos[at - 1]} and #{ranked_pos[at]}); keys must be unique "
        "in one source: de-duplicate the source or choose another key_field"
    )


def row_count(path: str, head: list[ScannedBatch], storage_options: dict[str, str] | None = None) -> int:
    """How many rows a path source has: exact for Parquet and Lance, estimated for JSONL from ``head``.

    ``head``: its first scanned batches (a JSONL file's size over the bytes per row they took).
    """
    kind = source_format(path)
    if kind == PARQUET:
        return int(_parquet_file(path, storage_options).metadata.num_rows)
    if kind == LANCE:
        return lance_source_count(path, storage_options)
    rows = sum(len(b.ids) for b in head)
    offsets = [b.offsets for b in head if b.offsets is not None and len(b.offsets)]
    if rows < 2 or not offsets:
        return rows
    size = file_size(path, storage_options)
    return max(rows, int(size / max(1.0, float(offsets[-1][-1]) / (rows - 1))))


def _duplicated(ids: pa.Array, window: int = 1 << 20) -> pa.Array | None:
    """The ids that repeat (None when none does): the sorted order compared a window at a time.

    Not ``count_distinct``: its hash table costs ~100 bytes an id (1 GB at 10M), the sort's indices 8.
    """
    if len(ids) < 2:
        return None
    order = pc.sort_indices(ids)
    found: list[pa.Array] = []
    for lo in range(0, len(ids) - 1, window):
        run = ids.take(order.slice(lo, window + 1))
        same = pc.equal(run.slice(1), run.slice(0, len(run) - 1))
        if pc.any(same).as_py():
            found.append(pc.unique(run.slice(1).filter(same)))
    return pc.unique(pa.concat_arrays(found)) if found else None


def _batches(
    path: str, storage_options: dict[str, str] | None
) -> Iterator[tuple[list[Any] | pa.RecordBatch, np.ndarray | None, bool]]:
    """Each batch (rows, or an Arrow batch), its byte offsets (JSONL) and whether its schema makes every value plain."""
    kind = source_format(path)
    if kind == JSONL:
        for rows, offsets in _jsonl_batches(path, storage_options):
            yield rows, offsets, False
        return
    batches = (
        _parquet_file(path, storage_options).iter_batches(batch_size=SCAN_BATCH)
        if kind == PARQUET
        else lance_source_batches(path, storage_options, SCAN_BATCH)
    )
    for batch in batches:
        yield batch, None, all(_plain_type(f.type) for f in batch.schema)


def _plain_type(kind: pa.DataType) -> bool:
    """Whether every value of an Arrow type is a str, an int of 64 bits at most, a bool or None."""
    return bool(
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_integer(kind)
        or pa.types.is_boolean(kind)
        or pa.types.is_null(kind)
    )


def _parquet_file(path: str, storage_options: dict[str, str] | None) -> pq.ParquetFile:
    if not has_scheme(path):
        return pq.ParquetFile(path)  # Arrow's own local file: no Python file object in the reads
    return pq.ParquetFile(open_input_file(path, storage_options))


def _jsonl_batches(path: str, storage_options: dict[str, str] | None) -> Iterator[tuple[list[Any], np.ndarray]]:
    rows: list[Any] = []
    offs: list[int] = []
    at = 0
    with open_input_file(path, storage_options) as fh:
        for n, line in enumerate(jsonl.lines(fh), 1):
            if line.strip():
                rows.append(jsonl.source_row(line, path, n))
                offs.append(at)
                if len(rows) >= SCAN_BATCH:
                    yield rows, np.array(offs, np.int64)
                    rows, offs = [], []
            at += len(line)
    if rows:
        yield rows, np.array(offs, np.int64)


def row_ranges(positions: np.ndarray, offsets: np.ndarray | None) -> list[list[int]]:
    """Positions as sorted ``[start, stop]`` ranges (``[start, stop, byte offset]`` for JSONL).

    ``offsets``: the byte offset of each of ``positions`` (the same length, in the same order).
    """
    order = np.argsort(positions, kind="stable")
    pos = positions[order]
    if not len(pos):
        return []
    breaks = np.flatnonzero(np.diff(pos) != 1) + 1
    first = np.concatenate(([0], breaks))
    starts = pos[first]
    stops = pos[np.concatenate((breaks - 1, [len(pos) - 1]))] + 1
    if offsets is None:
        return [[int(a), int(b)] for a, b in zip(starts, stops)]
    at = offsets[order][first]
    return [[int(a), int(b), int(o)] for a, b, o in zip(starts, stops, at)]


def read_rows(path: str, ranges: list[list[int]], storage_options: dict[str, str] | None = None) -> list[Any]:
    """The rows of a path source in these ranges (see :func:`row_ranges`), in position order."""
    kind = source_format(path)
    if not has_scheme(path) and not os.path.exists(path):
        raise InvalidItemError(f"source {path!r} does not exist; check the path")
    if kind == JSONL:
        out: list[Any] = []
        with open_input_file(path, storage_options) as fh:
            for start, stop, offset in ranges:
                fh.seek(offset)
                want = stop - start
                for line in jsonl.lines(fh):
                    if line.strip():
                        out.append(jsonl.source_row(line, path, 0))
                        want -= 1
                        if not want:
                            break
        return out
    positions = (
        np.concatenate([np.arange(r[0], r[1], dtype=np.int64) for r in ranges]) if ranges else np.zeros(0, np.int64)
    )
    if kind == LANCE:
        return lance_source_rows(path, positions.tolist(), storage_options).to_pylist()
    pf = _parquet_file(path, storage_options)
    sizes = np.array([pf.metadata.row_group(g).num_rows for g in range(pf.metadata.num_row_groups)], np.int64)
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1])) if len(sizes) else np.zeros(0, np.int64)
    group_of = np.searchsorted(starts, positions, side="right") - 1
    out = []
    for g in np.unique(group_of):
        local = positions[group_of == g] - starts[g]
        if len(local) and (local.max() >= sizes[g]):
            raise InvalidItemError(
                f"source {path!r} has fewer rows than planned; the source changed: rerun the plan task"
            )
        out.extend(pf.read_row_group(int(g)).take(pa.array(local)).to_pylist())
    return out


def items_at(
    path: str, ranges: list[list[int]], key_field: str, storage_options: dict[str, str] | None
) -> list[SourceItem]:
    """The validated items in these ranges of a path source."""
    return prepare_items(read_rows(path, ranges, storage_options), key_field)
