"""Deterministic export of results: the folded fields of completed items, never a log row.

The export is the output artifact and the log is its sidecar manifest, so no output contains
manifest rows (see docs/design.md, "Resume"). Its fingerprint digests content only (item ids and
canonical field JSON in id order), so "resumed == uninterrupted" is one string comparison whatever
the history. Result sets merge as a commutative monoid (union keyed by item id, the empty set as
identity), which is what licenses chunked, uncoordinated workers: their parts merge in any order.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from airflow_provider_datagen.core.events import BlobRef, canonical_json
from airflow_provider_datagen.core.ids import key_of
from airflow_provider_datagen.core.store.lance_io import write_results_dataset
from airflow_provider_datagen.exceptions import InvalidValueError

if TYPE_CHECKING:
    from airflow_provider_datagen.core.store.log import CheckpointLog

RESULT_SCHEMA = pa.schema(
    [
        pa.field("item_id", pa.string(), nullable=False),
        pa.field("key", pa.string(), nullable=False),
        pa.field("fields", pa.string(), nullable=False),
    ]
)

#: Results as data: item id -> canonical JSON of its folded fields.
Results = Mapping[str, str]


def _materialize_one(value: Any) -> Any:
    if isinstance(value, BlobRef):
        loaded = value.load()
        return {"$bytes_sha256": value.digest, "size": value.size} if isinstance(loaded, bytes) else loaded
    return value


def _materialize(value: Any) -> Any:
    # A folded field is a value or (FIELD_APPEND) a list of values; blob refs sit at one of those two
    # levels only, so never recurse into the values themselves: they may nest as deep as JSON allows.
    if isinstance(value, list):
        return [_materialize_one(v) for v in value]
    return _materialize_one(value)


def collect_results(log: CheckpointLog) -> dict[str, str]:
    """Completed root items -> canonical JSON of their folded fields (blob values loaded)."""
    out: dict[str, str] = {}
    for iid, st in log.completed_root_states().items():
        fields = {k: _materialize(v) for k, v in st.fields.items()}
        out[iid] = canonical_json(fields, what=f"fields of item {iid!r}")
    return out


def merge_results(*parts: Results) -> dict[str, str]:
    """Union of result sets; the same item with different content is a conflict, not a choice."""
    merged: dict[str, str] = {}
    for part in parts:
        for iid, text in part.items():
            prev = merged.get(iid)
            if prev is not None and prev != text:
                raise InvalidValueError(
                    f"item {iid!r} has different results in two parts being merged; processing must be "
                    "deterministic (the same item must always give the same fields)"
                )
            merged[iid] = text
    return merged


def results_fingerprint(results: Results) -> str:
    """Content digest of a result set: ids and canonical fields in id order."""
    h = hashlib.sha256()
    for iid in sorted(results):
        h.update(iid.encode("utf-8", "surrogatepass"))
        h.update(b"\x1f")
        h.update(results[iid].encode("utf-8", "surrogatepass"))
        h.update(b"\n")
    return h.hexdigest()


def results_table(results: Results) -> pa.Table:
    ids = sorted(results)
    return pa.table(
        {"item_id": ids, "key": [key_of(i) for i in ids], "fields": [results[i] for i in ids]},
        schema=RESULT_SCHEMA,
    )


def export_results(
    log: CheckpointLog, destination_uri: str, *, storage_options: dict[str, str] | None = None
) -> dict[str, Any]:
    """Write completed items' folded fields, ordered by item id, to a Lance dataset at the destination.

    Returns ``{"rows": int, "fingerprint": str}``; equal results give equal fingerprints.
    """
    results = collect_results(log)
    write_results_dataset(results_table(results), destination_uri, storage_options=storage_options)
    return {"rows": len(results), "fingerprint": results_fingerprint(results)}
