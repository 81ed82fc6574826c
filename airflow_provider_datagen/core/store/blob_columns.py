"""The response store's replies and requests read from where Lance wrote them: a memory copy a row.

``reply_json`` and ``request_json`` are Lance blob columns (``lance-encoding:blob``; in the store's
file version 2.1 every blob is written inline in its fragment's data file, and a read of the column
gives each row's ``(position, size)`` there). Lance's own take of a variable-width column costs
~6-8 us a random row (10,000 of 1M ~330-byte replies: ~65 ms, more than a whole lookup's budget),
whatever the encoding; so on a local disk the index keeps, per blob column, each row's data file,
position and size (read with the keys, ~20 bytes an entry), and a lookup slices the values out of the
data files mapped in memory (docs/adr/0033-blob-columns-read-in-place.md). Lance never changes a file
once written, and a mapped file outlives its deletion by a compaction's cleanup, so a snapshot of the
locations reads what it located. On an object store, and for a row whose fragment has more than one
data file, Lance's planned blob reader (``read_blobs``) reads them.
"""

from __future__ import annotations

import mmap
import os
import threading
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

if TYPE_CHECKING:
    from collections.abc import Sequence

#: the field metadata that makes a column a blob column
BLOB_METADATA = {"lance-encoding:blob": "true"}
#: the store's blob columns (UTF-8 JSON text as bytes)
BLOB_COLUMNS = ("reply_json", "request_json")
#: ``file`` of a row whose value this index cannot slice (Lance reads it)
UNMAPPED = -1
#: ``size`` of a null value
NULL = -1

#: a snapshot of one column's locations: (the locations, file, position, size by row offset)
View = tuple["BlobLocations", np.ndarray, np.ndarray, np.ndarray]


def is_blob(schema: pa.Schema, column: str) -> bool:
    """Whether ``column`` of a store's schema is a blob column (a store made before they were: a string)."""
    return bool(pa.types.is_large_binary(schema.field(column).type))


class BlobLocations:
    """One blob column's value locations by row offset: the data file (a number), position and size.

    Copied on write, as the keys are: a lookup's snapshot (:meth:`view`) is never changed by a later
    :meth:`extend`. The mapped files are shared by every snapshot (only ever added to).

    :param column: the blob column.
    :param data_dir: the store's ``data/`` directory on a local disk.
    """

    def __init__(self, column: str, data_dir: str) -> None:
        self.column = column
        self._data_dir = data_dir
        self._paths: list[str] = []
        # grown by doubling, written only past ``_rows``: a view (a slice up to ``_rows``) never changes,
        # and an append costs its own rows, not a copy of the whole index (a flush a few hundred in 1M)
        self._file = np.empty(0, np.int32)
        self._position = np.empty(0, np.int64)
        self._size = np.empty(0, np.int64)
        self._rows = 0
        self._maps: dict[int, mmap.mmap] = {}
        self._lock = threading.Lock()

    def view(self) -> View:
        n = self._rows
        return self, self._file[:n], self._position[:n], self._size[:n]

    def extend(self, parts: Sequence[tuple[str | None, pa.ChunkedArray | pa.Array]]) -> None:
        """Append fragments' rows: each its data file (None: not one file) and the column's descriptions
        (``struct<position, size>``, as a read of the fragment gives them)."""
        files, positions, sizes = [], [], []
        for path, described in parts:
            column = described.combine_chunks() if isinstance(described, pa.ChunkedArray) else described
            if path is None:
                number = UNMAPPED
            else:
                number = len(self._paths)
                self._paths.append(path)
            files.append(np.full(len(column), number, np.int32))
            # a null value's description is null (its fields too): position 0, size NULL
            positions.append(column.field("position").fill_null(0).to_numpy().astype(np.int64))
            size = column.field("size").fill_null(0).to_numpy().astype(np.int64)
            if column.null_count:
                size = np.where(column.is_null().to_numpy(zero_copy_only=False), NULL, size)
            sizes.append(size)
        if not files:
            return
        added = (np.concatenate(files), np.concatenate(positions), np.concatenate(sizes))
        start, end = self._rows, self._rows + len(added[0])
        if end > len(self._file):
            capacity = max(end, 2 * len(self._file), 1024)
            grown = []
            for old in (self._file, self._position, self._size):
                new = np.empty(capacity, old.dtype)
                new[:start] = old[:start]
                grown.append(new)
            self._file, self._position, self._size = grown
        self._file[start:end], self._position[start:end], self._size[start:end] = added
        self._rows = end

    def _map(self, number: int) -> mmap.mmap:
        mapped = self._maps.get(number)
        if mapped is None:
            with self._lock:
                mapped = self._maps.get(number)
                if mapped is None:
                    fd = os.open(os.path.join(self._data_dir, self._paths[number]), os.O_RDONLY)
                    try:
                        mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
                    finally:
                        os.close(fd)
                    self._maps[number] = mapped
        return mapped


def read_located(view: View, offsets: np.ndarray, ds: Any) -> list[str | None]:
    """The column's values at ``offsets`` (row offsets in ``ds``, which the view locates), in order.

    :raises OSError: a data file could not be read; ValueError: one is shorter than its values (the
        caller translates both).
    """
    locations, file_of, position, size = view
    files, starts, sizes = file_of[offsets], position[offsets], size[offsets]
    out: list[str | None] = [None] * len(offsets)
    order = np.argsort(files, kind="stable")  # each file's rows together: one mapped file per run of them
    numbers, firsts = np.unique(files[order], return_index=True)
    bounds = [*firsts.tolist(), len(order)]
    for number, lo, hi in zip(numbers.tolist(), bounds, bounds[1:]):
        if number == UNMAPPED:
            continue
        rows = order[lo:hi]
        mapped = locations._map(number)
        begin, length = starts[rows], sizes[rows]
        if len(rows) and int((begin + length).max()) > len(mapped):  # never a shortened value
            raise ValueError(f"the data file {locations._paths[number]} ends before the values it holds: corrupt")
        if (length == NULL).any():  # null values stay None
            keep = length != NULL
            rows, begin, length = rows[keep], begin[keep], length[keep]
        for at, a, b in zip(rows.tolist(), begin.tolist(), (begin + length).tolist()):
            out[at] = mapped[a:b].decode()
    unmapped = np.flatnonzero(files == UNMAPPED)
    if len(unmapped):
        for at, read in zip(unmapped.tolist(), read_by_lance(ds, offsets[unmapped], locations.column)):
            out[at] = read
    return out


def read_by_lance(ds: Any, offsets: np.ndarray, column: str) -> list[str | None]:
    """The blob ``column``'s values at ``offsets`` read by Lance (an object store's, an unmapped fragment's)."""
    if not len(offsets):
        return []
    read = ds.read_blobs(column, indices=pa.array(offsets, pa.uint64()), preserve_order=True)
    return [None if blob is None else bytes(blob).decode() for _, blob in read]
