"""The response store's in-memory index: every key's hash sorted with its row offset, and every key itself
(64 characters as 8 words), so that a lookup is a binary search and a comparison of whole keys in memory.

Pure numpy and Arrow (no Lance): :mod:`~airflow_provider_datagen.core.store.responses` builds it from the
fragments it reads.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


class Keys:
    """The stored keys (64 characters as 8 words) by row offset: the key buffers as Lance read them (no
    copy), an append's small ones joined to the last part so that many small appends make few parts.

    Copied on write: a lookup's snapshot (:meth:`view`) is never changed by a later append.
    """

    def __init__(self) -> None:
        self._parts: list[np.ndarray] = []
        self._starts = np.zeros(1, np.int64)  # each part's first row offset, then the row count

    def view(self) -> tuple[list[np.ndarray], np.ndarray]:
        return self._parts, self._starts

    def extend(self, chunks: list[np.ndarray]) -> None:
        parts, sizes = list(self._parts), list(np.diff(self._starts))
        for chunk in chunks:
            if parts and len(parts[-1]) < SMALL_PART and len(chunk) < SMALL_PART:
                parts[-1] = np.concatenate([parts[-1], chunk])
                sizes[-1] += len(chunk)
            else:
                parts.append(chunk)
                sizes.append(len(chunk))
        self._parts, self._starts = parts, np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])


#: parts of fewer keys than this are joined (a write-behind flush appends a few hundred)
SMALL_PART = 4096


def gather(view: tuple[list[np.ndarray], np.ndarray], offsets: np.ndarray) -> np.ndarray:
    """The stored keys at ``offsets`` (row offsets) of a :class:`Keys` view."""
    parts, starts = view
    if len(parts) == 1:
        return parts[0][offsets]
    out = np.empty((len(offsets), 8), np.uint64)
    which = np.searchsorted(starts, offsets, side="right") - 1
    order = np.argsort(which, kind="stable")
    bounds = np.searchsorted(which[order], np.arange(len(parts) + 1))
    for part in np.flatnonzero(np.diff(bounds)).tolist():
        rows = order[bounds[part] : bounds[part + 1]]
        out[rows] = parts[part][offsets[rows] - starts[part]]
    return out


def key_words(keys: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """``(words, ok)`` of Arrow string keys: each key's 64 characters as 8 words (a view of the Arrow
    buffer where it can), and whether it has 64 characters (the others are never found).
    """
    arr = keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys
    arr = arr.cast(pa.string()) if arr.type != pa.string() else arr
    ok_arrow = pc.fill_null(pc.equal(pc.binary_length(arr), 64), False)
    ok = ok_arrow.to_numpy(zero_copy_only=False)
    if not ok.all():
        arr = pc.if_else(ok_arrow, arr, pa.scalar("\0" * 64))
    if not len(arr):
        return np.zeros((0, 8), np.uint64), ok
    _, offsets_buf, data_buf = arr.buffers()
    start = int(np.frombuffer(offsets_buf, np.int32, 1, arr.offset * 4)[0])
    return np.frombuffer(data_buf, np.uint64, 8 * len(arr), start).reshape(-1, 8), ok


def hashes_of(words: np.ndarray) -> np.ndarray:
    """The :func:`~airflow_provider_datagen.core.store.responses.key_hash` of keys as words: their first 16
    characters read as hex (what is not hex gives some number, and such a key then matches no stored one,
    the whole key being compared)."""
    head = words[:, :2].copy().view(np.uint8)  # (n, 16) characters
    nibbles = (head & 15) + 9 * (head >> 6)  # '0'-'9', 'a'-'f', 'A'-'F' to 0-15
    packed = np.ascontiguousarray((nibbles[:, 0::2] << 4) | nibbles[:, 1::2])
    return packed.view(">u8").ravel().astype(np.uint64).view(np.int64)


def merge(
    hashes: np.ndarray, offsets: np.ndarray, more: np.ndarray, more_offsets: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The index ``(hashes, offsets)`` with rows appended after it: sorted by hash, equal hashes by offset."""
    order = np.argsort(more)
    more, more_offsets = more[order], more_offsets[order]
    equal = np.flatnonzero(more[1:] == more[:-1])
    if len(equal):  # equal hashes (a key stored twice, or a collision) in dataset order: the earliest first
        run = np.union1d(equal, equal + 1)
        more_offsets[run] = more_offsets[run][np.lexsort((more_offsets[run], more[run]))]
    if not len(hashes):
        return more, more_offsets
    at = np.searchsorted(hashes, more, side="right")  # after the equal hashes already there: they are earlier
    return np.insert(hashes, at, more), np.insert(offsets, at, more_offsets)
