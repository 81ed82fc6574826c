"""Rows of one pinned version of the log by their position in it: what the streamed export reads.

The export folds its completed items a batch at a time. A scan filtered by ``item_id`` per batch read
the whole log each time (~100 scans at 1M items), and one scan of every non-blob column at once held
Lance's decoded pages of them all. Instead the export reads the ``item_id`` column once
(:meth:`~.table.LanceTable.batches`), finds each batch's rows by their offsets in that scan, and
takes only those rows of the wide columns (:func:`take_rows`), from the same version.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from airflow_provider_datagen.core.store import lance_io

if TYPE_CHECKING:
    from collections.abc import Sequence

    import lance
    import pyarrow as pa

    from airflow_provider_datagen.core.store.table import LanceTable


def pinned(table: LanceTable) -> lance.LanceDataset | None:
    """The log's latest version, held fixed: its scans and takes see the same rows at the same offsets."""
    ds = table.dataset()
    if ds is None:
        return None
    try:
        return ds.checkout_version(int(ds.version))
    except lance_io.LANCE_ERRORS as exc:
        raise table.translate(exc, "reading the log") from None


def take_rows(table: LanceTable, ds: lance.LanceDataset, offsets: np.ndarray, columns: Sequence[str]) -> pa.Table:
    """The rows at ``offsets`` (positions in a scan of ``ds``, ascending) of ``columns`` and ``schema_version``.

    In the order of ``offsets``. Their schema versions are not checked again: the scan of ``item_id``
    that found the offsets (:meth:`~.table.LanceTable.batches`, ``checked=True``) checked every row's.
    """
    cols = list(dict.fromkeys([*columns, "schema_version"]))
    try:
        taken = ds.take(np.asarray(offsets, np.int64), columns=cols)
    except lance_io.LANCE_ERRORS as exc:
        raise table.translate(exc, "reading the log") from None
    return taken
