"""Items split by a hash of their id into buckets spilled to disk (see docs/adr/0019-partitioned-plan.md).

A partitioned plan and a bucketed cold fold (``store.bucketed_fold``) both spill rows to one
Arrow IPC file per bucket of item ids and then work one bucket at a time: every row of an item
lands in one bucket and keeps its order, so a bucket's fold is exactly the full fold's rows for
its items. Only pyarrow and numpy here (``core.store`` is the one package importing Lance).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_datagen.exceptions import ConfigurationError

# --- the bucket of an id ---------------------------------------------------------------------

_P = 0x100000001B3  # the 64-bit FNV prime: odd, so invertible modulo 2**64
_P_INV = pow(_P, -1, 1 << 64)


_POWERS: dict[int, np.ndarray] = {}


def _powers(base: int, n: int) -> np.ndarray:
    """``base ** i`` modulo 2**64 for i in 0..n-1 (numpy's unsigned products wrap); a cached table grown by doubling."""
    table = _POWERS.get(base)
    if table is None or len(table) < n:
        size = 1 << max(16, (n - 1).bit_length())
        table = np.full(size, base, dtype=np.uint64)
        table[0] = 1
        with np.errstate(over="ignore"):
            table = np.cumprod(table, dtype=np.uint64)
        _POWERS[base] = table  # one assignment: another thread sees the old table or the new one
    return table[:n]


def id_hash(ids: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A 64-bit hash of each string, from the Arrow buffers (no Python per string).

    ``sum(byte[j] * P**(j+1))`` over the string's bytes, from one running sum over the whole data
    buffer (each string's slice scaled back by ``P**-start``), then the splitmix64 finisher so
    every bit depends on every byte. Stable for a given string; only ever compared within one plan or one fold.
    """
    arr = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
    if not pa.types.is_large_string(arr.type):
        arr = arr.cast(pa.large_string())
    n = len(arr)
    if not n:
        return np.zeros(0, np.uint64)
    _, off_buf, data_buf = arr.buffers()
    offsets = np.frombuffer(off_buf, np.int64, count=n + 1, offset=arr.offset * 8)
    lo, hi = int(offsets[0]), int(offsets[-1])
    size = hi - lo
    starts = offsets[:-1] - lo
    with np.errstate(over="ignore"):
        if size:
            data = np.frombuffer(data_buf, np.uint8, count=size, offset=lo).astype(np.uint64)
            running = np.zeros(size + 1, np.uint64)
            np.cumsum(data * _powers(_P, size + 1)[1:], dtype=np.uint64, out=running[1:])
            h = (running[offsets[1:] - lo] - running[starts]) * _powers(_P_INV, size + 1)[starts]
        else:
            h = np.zeros(n, np.uint64)
        h += np.diff(offsets).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        h ^= h >> np.uint64(30)
        h *= np.uint64(0xBF58476D1CE4E5B9)
        h ^= h >> np.uint64(27)
        h *= np.uint64(0x94D049BB133111EB)
        h ^= h >> np.uint64(31)
    return h


def buckets_of(ids: pa.Array | pa.ChunkedArray, k: int) -> np.ndarray:
    """Each id's bucket in ``0..k-1``; an item's events are side by side, so runs are hashed once."""
    arr = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
    n = len(arr)
    if n < 2:
        return (id_hash(arr) % np.uint64(k)).astype(np.int64)
    same = np.asarray(pc.equal(arr.slice(1), arr.slice(0, n - 1)).fill_null(False).to_numpy(zero_copy_only=False))
    heads = np.flatnonzero(np.concatenate(([True], ~same)))
    if len(heads) == n:
        return (id_hash(arr) % np.uint64(k)).astype(np.int64)
    hashed = (id_hash(arr.take(pa.array(heads))) % np.uint64(k)).astype(np.int64)
    return np.repeat(hashed, np.diff(np.append(heads, n)))


# --- memory ---------------------------------------------------------------------------------


def _glibc() -> Any:
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None)
        if libc.malloc_trim and libc.mallopt:
            return libc
    return None


_LIBC = _glibc()
_M_MMAP_THRESHOLD = -3

#: The environment variable that opts a worker into :func:`bound_allocator` (``1``/``true``/``yes``/``on``).
TUNE_ALLOCATOR_ENV = "DATAGEN_TUNE_ALLOCATOR"
_YES = frozenset({"1", "true", "yes", "on"})
_NO = frozenset({"", "0", "false", "no", "off"})


def allocator_tuning_wanted() -> bool:
    """Whether :data:`TUNE_ALLOCATOR_ENV` opts this process into :func:`bound_allocator` (off when unset).

    Read at each call, not at import, so a worker can set it before its first plan.
    """
    value = os.environ.get(TUNE_ALLOCATOR_ENV, "").strip().lower()
    if value in _YES:
        return True
    if value in _NO:
        return False
    raise ConfigurationError(
        f"{TUNE_ALLOCATOR_ENV}={os.environ[TUNE_ALLOCATOR_ENV]!r} is neither on nor off: "
        f"set it to one of {sorted(_YES)} to fix glibc's mmap threshold, or unset it"
    )


def bound_allocator() -> None:
    """Make glibc map blocks from :data:`MMAP_THRESHOLD` up, only if the worker opted in (see below).

    Opt in with ``DATAGEN_TUNE_ALLOCATOR=1`` (:data:`TUNE_ALLOCATOR_ENV`) in the worker's environment;
    unset, this does nothing. It is off by default because it cannot be undone: setting
    ``M_MMAP_THRESHOLD`` also turns off glibc's dynamic threshold (and its dynamic trim threshold) for
    the rest of the process (``man mallopt``), and glibc has no getter to put back what was there, so
    it would outlive the plan and change every allocation of the user's worker. Opting in (or, with
    no provider code at all, starting the worker with glibc's own
    ``GLIBC_TUNABLES=glibc.malloc.mmap_threshold=16777216``) is a choice about the whole process.

    What it buys: by default, once a large block is freed glibc raises that threshold (up to 32 MB)
    and serves such blocks from its heap, where freed pages stay resident. Fixing it at 16 MB maps
    (and unmaps when freed) the arrays of a bucket but not those of a scan batch: at glibc's 128 KB
    every scan batch's arrays were mapped and unmapped, and the kernel zeroing their pages was a
    third of a cold 10M plan's time (ADR 0019). Measured against glibc's dynamic threshold the fixed
    one changes little (ADR 0019's addendum: 10M cold 34-37 s and 1,236-1,301 MB fixed, 36-39 s and
    1,229-1,240 MB dynamic; ``benchmarks.scale``'s 1M plan task, six runs each, medians: cold 829
    against 838 MB and 4.9 against 5.0 s CPU, with the fold cache 558 against 546 MB and 2.2 against
    2.4 s CPU); :func:`give_back_memory` after each bucket does most of the work either way. A no-op
    off glibc.
    """
    if _LIBC is not None and allocator_tuning_wanted():
        _LIBC.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)


#: Blocks glibc maps (and unmaps when freed) from this size up once opted in (see
#: :func:`bound_allocator`): the arrays of a bucket, not those of a scan batch.
MMAP_THRESHOLD = 16 * 1024 * 1024


def give_back_memory() -> None:
    """Return the memory freed so far to the system (Arrow's allocator and glibc keep freed pages)."""
    pa.default_memory_pool().release_unused()
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


#: Scan batches between two :func:`give_back_memory` calls of a spill pass.
GIVE_BACK_EVERY = 16


# --- spill files ----------------------------------------------------------------------------


class Spill:
    """One Arrow IPC stream file per bucket in a temporary directory; rows keep their order in each.

    A bucket's rows are held until there are :data:`_SPILL_ROWS` of them and then written as one
    record batch: 64 buckets of one 64k-row scan batch are ~1k rows each, and a message per slice
    cost more than the data. Compressed with LZ4: an item's events repeat its id and sit side by
    side, so the light columns shrink ~3x for little CPU (and the spill is disk the plan borrows).
    """

    def __init__(self, directory: str, name: str, k: int) -> None:
        self.paths = [os.path.join(directory, f"{name}-{b}.arrow") for b in range(k)]
        self.writers: list[pa.ipc.RecordBatchStreamWriter | None] = [None] * k
        self.held: list[list[pa.RecordBatch]] = [[] for _ in range(k)]
        self.held_rows = np.zeros(k, np.int64)
        self.schema: pa.Schema | None = None

    def add(self, batch: pa.RecordBatch, buckets: np.ndarray) -> None:
        if not batch.num_rows:
            return
        if self.schema is None:
            self.schema = batch.schema
        counts = np.bincount(buckets, minlength=len(self.paths))
        one = len(self.paths) == 1
        # a stable sort of one byte (two past 256 buckets) is numpy's radix sort: half an int64 sort's time
        narrow = buckets.astype(np.uint8 if len(self.paths) <= 256 else np.uint16)
        grouped = batch if one else batch.take(pa.array(np.argsort(narrow, kind="stable")))
        at = 0
        for b in np.flatnonzero(counts).tolist():
            self.held[b].append(grouped.slice(at, int(counts[b])))
            self.held_rows[b] += int(counts[b])
            at += int(counts[b])
            if self.held_rows[b] >= _SPILL_ROWS:
                self._flush(b)

    def _flush(self, b: int) -> None:
        held = self.held[b]
        if not held:
            return
        writer = self.writers[b]
        if writer is None:
            assert self.schema is not None
            writer = self.writers[b] = pa.ipc.new_stream(self.paths[b], self.schema, options=_SPILL_OPTIONS)
        writer.write_batch(held[0] if len(held) == 1 else pa.concat_batches(held))
        self.held[b] = []
        self.held_rows[b] = 0

    def close(self) -> None:
        for b in range(len(self.writers)):
            self._flush(b)
            writer = self.writers[b]
            if writer is not None:
                writer.close()

    def read(self, b: int, schema: pa.Schema | None = None) -> pa.Table | None:
        """Bucket ``b``'s rows as one table (None when it has none and no ``schema`` is given)."""
        if self.writers[b] is None:
            return None if schema is None else schema.empty_table()
        with pa.OSFile(self.paths[b]) as fh:
            table = pa.ipc.open_stream(fh).read_all().combine_chunks()
        os.remove(self.paths[b])  # the disk a bucket used is given back as the plan goes
        return table


#: Rows a bucket holds before they are written (see :class:`Spill`).
_SPILL_ROWS = 1 << 15
_SPILL_OPTIONS = pa.ipc.IpcWriteOptions(compression="lz4")
