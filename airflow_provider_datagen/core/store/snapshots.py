"""Read side of the inline-source snapshots beside a log: an item's input as the plan stored it.

The log keeps only input fingerprints. A plan over an inline source (a list in the DAG file) stores
the whole source once, content-addressed, beside the log (:meth:`CheckpointLog.write_source_snapshot`);
the UI's item page reads an item's input back from there. Sources read from a path are not copied,
so their inputs are not knowable from the experiment's directory.
"""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_datagen.core.store.lance_io import open_dataset
from airflow_provider_datagen.core.store.paths import SNAPSHOTS_DIR, experiment_uri, is_local


def snapshot_texts(log_uri: str, item_id: str, storage_options: dict[str, str] | None = None) -> list[str]:
    """The canonical source texts stored for ``item_id`` in the snapshots beside ``log_uri``, newest first.

    Local roots only (an object store would need a listing per request); empty when there is none.
    """
    if not is_local(log_uri):
        return []
    folder = experiment_uri(log_uri).removeprefix("file://") + "/" + SNAPSHOTS_DIR
    try:
        entries = [e for e in os.scandir(folder) if e.name.endswith(".lance") and e.is_dir()]
    except OSError:
        return []
    texts = []
    for entry in sorted(entries, key=lambda e: e.stat().st_mtime, reverse=True):
        try:
            table = open_dataset(entry.path, storage_options).to_table(
                columns=["item"], filter=pc.field("item_id") == pa.scalar(item_id, pa.string())
            )
        except (OSError, ValueError):
            continue  # a snapshot being written, or not one of ours: the others still answer
        texts.extend(table["item"].to_pylist())
    return texts
