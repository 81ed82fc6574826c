"""Read side of the inline-source snapshots beside a log: an item's input as the plan stored it.

The log keeps only input fingerprints. A plan over an inline source (a list in the DAG file) stores
the whole source once, content-addressed, beside the log (:meth:`CheckpointLog.write_source_snapshot`),
and records which snapshot it read (:mod:`.source_ref`); the UI's item page reads an item's input back
from there. Sources read from a path are not copied: the record names the path, and
``core/next_run.py`` reads the one row back from it.
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_datagen.core.store.lance_io import LANCE_ERRORS, open_dataset
from airflow_provider_datagen.core.store.paths import SNAPSHOTS_DIR, experiment_uri, is_local
from airflow_provider_datagen.core.store.source_ref import INLINE

if TYPE_CHECKING:
    from airflow_provider_datagen.core.store.source_ref import SourceRef


def _texts(uri: str, item_id: str, storage_options: dict[str, str] | None) -> list[str]:
    table = open_dataset(uri, storage_options).to_table(
        columns=["item"], filter=pc.field("item_id") == pa.scalar(item_id, pa.string())
    )
    return table["item"].to_pylist()


def snapshot_texts(
    log_uri: str,
    item_id: str,
    storage_options: dict[str, str] | None = None,
    source: SourceRef | None = None,
) -> list[str]:
    """The canonical source texts stored for ``item_id`` in the snapshots beside ``log_uri``.

    First the snapshot the last plan recorded (``source``, when it is an inline one; on any root),
    then every snapshot, newest first (local roots only: an object store would need a listing per
    request). Empty when there is none.
    """
    texts: list[str] = []
    first = source.uri if source is not None and source.kind == INLINE else None
    if first is not None:
        # removed since, the other snapshots may still answer
        with contextlib.suppress(*LANCE_ERRORS):
            texts.extend(_texts(first, item_id, storage_options))
    if not is_local(log_uri):
        return texts
    folder = experiment_uri(log_uri).removeprefix("file://") + "/" + SNAPSHOTS_DIR
    try:
        entries = [e for e in os.scandir(folder) if e.name.endswith(".lance") and e.is_dir()]
    except OSError:
        return texts
    for entry in sorted(entries, key=lambda e: e.stat().st_mtime, reverse=True):
        if first is not None and os.path.abspath(entry.path) == os.path.abspath(first.removeprefix("file://")):
            continue
        try:
            texts.extend(_texts(entry.path, item_id, storage_options))
        except (OSError, ValueError):
            continue  # a snapshot being written, or not one of ours: the others still answer
    return texts
