"""The record of the source the experiment's last plan read: one row beside the log, overwritten by each plan.

The event log keeps input fingerprints, never the source, so only a plan task knows which items are
new (fresh) or edited. The UI's "next run" panel and item page need the same knowledge, so a plan
records what it read in ``source.lance`` beside the log (like the budget, a setting of the experiment
and not an event: the log stays schema 2 with its seven event types): for an inline source the URI of
its content-addressed snapshot, for a path source its path or URI, format and key field, and in both
cases the processor version, ``redo_completed`` and the log version the plan classified against.

Never a secret: the connection is recorded by its id and its storage options by their names; a URI's
user-info and query (where credentials can ride) are cut before it is written, and the record says so.
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit, urlunsplit

import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_datagen.core.store import lance_io
from airflow_provider_datagen.core.store.paths import is_local, local_path, source_ref_uri
from airflow_provider_datagen.core.uri import has_scheme
from airflow_provider_datagen.exceptions import InvalidItemError

if TYPE_CHECKING:
    import datetime as dt

logger = logging.getLogger(__name__)

#: ``SourceRef.kind``: an inline list stored as a snapshot beside the log, or a path/URI read in place.
INLINE, PATH = "inline", "path"

_SCHEMA = pa.schema(
    [
        ("kind", pa.string()),
        ("uri", pa.string()),
        ("format", pa.string()),
        ("key_field", pa.string()),
        ("conn_id", pa.string()),
        ("storage_option_names", pa.list_(pa.string())),
        ("uri_redacted", pa.bool_()),
        ("log_version", pa.int64()),
        ("processor_version", pa.string()),
        ("redo_completed", pa.string()),
        ("items", pa.int64()),
        ("recorded_at", pa.timestamp("us", tz="UTC")),
        ("removed_ids", pa.list_(pa.string())),
    ]
)


class Experiment(Protocol):
    """Where a source record goes: the experiment's log (``CheckpointLog`` is one)."""

    uri: str
    storage_options: dict[str, str] | None
    pipeline: str
    experiment: str


@dataclass(frozen=True)
class SourceRef:
    """What a plan read: enough to classify the source again, and to find one item's input in it."""

    kind: str  # INLINE or PATH
    uri: str  # the snapshot's URI (inline) or the source's path/URI, credentials cut
    format: str  # "snapshot", "jsonl", "parquet" or "lance"
    key_field: str
    conn_id: str | None  # the datagen connection the plan task used (its id, never its contents)
    storage_option_names: tuple[str, ...]  # the names of that connection's storage options
    uri_redacted: bool  # the source URI carried user-info or a query, which were not recorded
    log_version: int  # the log version the plan classified the source against
    processor_version: str
    redo_completed: str
    items: int  # source items the plan saw
    recorded_at: dt.datetime
    #: the log's root items the source no longer holds, as the plan saw them (None: not listed, an
    #: older record): counts and exports leave them out (see ``core/store/tally.py``, ``core/export.py``)
    removed_ids: tuple[str, ...] | None = None

    @property
    def token(self) -> tuple[Any, ...]:
        """What identifies this record (a cache key part): a new plan records a new one."""
        return (self.kind, self.uri, self.key_field, self.log_version, self.processor_version, self.redo_completed)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["storage_option_names"] = list(self.storage_option_names)
        del out["removed_ids"]  # may be long: the UI shows the status's "removed" count instead
        out["recorded_at"] = self.recorded_at.isoformat()
        return out


def strip_credentials(uri: str) -> tuple[str, bool]:
    """``uri`` without user-info and query (``s3://key:secret@b/x``, ``...?secret_key=``), and whether it had any."""
    if not has_scheme(uri):
        return uri, False
    parts = urlsplit(uri)
    if "@" not in parts.netloc and not parts.query:
        return uri, False
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, host, parts.path, "", "")), True


def record_source(log: Experiment, ref: SourceRef) -> None:
    """Record ``ref`` as the experiment's source (overwriting the previous record)."""
    row = ref.as_dict()
    row["recorded_at"] = ref.recorded_at
    row["removed_ids"] = None if ref.removed_ids is None else list(ref.removed_ids)
    table = pa.Table.from_pylist([row], schema=_SCHEMA)
    uri = source_ref_uri(log.uri)
    # two plans of one experiment at once: the later write wins; a lost race is retried
    lance_io.overwrite_setting(table, uri, log.storage_options, "recording the plan's source")
    logger.debug("experiment %s/%s: recorded source %s (%s)", log.pipeline, log.experiment, ref.uri, ref.format)


def recorded_source(log_uri: str, storage_options: dict[str, str] | None = None) -> SourceRef | None:
    """The source the last plan recorded beside the log at ``log_uri``; None when none did (older logs)."""
    uri = source_ref_uri(log_uri)
    if not lance_io.dataset_exists(uri, storage_options):
        return None
    try:
        rows = lance_io.open_dataset(uri, storage_options).to_table().to_pylist()
    except lance_io.LANCE_ERRORS as exc:
        raise lance_io.translate(exc, uri, "reading the plan's source record") from None
    if not rows:
        return None
    row = rows[-1]
    return SourceRef(
        kind=row["kind"],
        uri=row["uri"],
        format=row["format"],
        key_field=row["key_field"],
        conn_id=row["conn_id"],
        storage_option_names=tuple(row["storage_option_names"] or ()),
        uri_redacted=bool(row["uri_redacted"]),
        log_version=int(row["log_version"]),
        processor_version=row["processor_version"],
        redo_completed=row["redo_completed"],
        items=int(row["items"]),
        recorded_at=row["recorded_at"],
        removed_ids=None if row.get("removed_ids") is None else tuple(row["removed_ids"]),
    )


def source_stamp(uri: str) -> tuple[Any, ...] | None:
    """A cheap stamp of a local source's content (size and modification times), for cache keys.

    A local file edited in place changes its stamp, so the UI classifies it again; None for an
    object-store URI (a stat there is a request; the log version and the record key those caches).
    """
    if not is_local(uri):
        return None
    path = local_path(uri)
    try:
        st = os.stat(path)
        if os.path.isdir(path):  # a Lance dataset: a new version adds a manifest under _versions
            versions = os.stat(os.path.join(path, "_versions"))
            return (st.st_mtime_ns, versions.st_mtime_ns)
        return (st.st_mtime_ns, st.st_size)
    except OSError:
        return ("missing",)


def open_lance_source(uri: str, storage_options: dict[str, str] | None) -> Any:
    """Open a Lance source with these storage options; an :class:`InvalidItemError` saying why it cannot be."""
    try:
        return lance_io.open_dataset(uri, storage_options)
    except lance_io.LANCE_ERRORS as exc:
        raise InvalidItemError(f"source {uri!r} is not a readable Lance dataset: {str(exc)[:300]}") from None


def lance_rows_by_key(
    uri: str, key_field: str, key: str, storage_options: dict[str, str] | None, limit: int = 2
) -> list[dict[str, Any]]:
    """The rows of a Lance source whose ``key_field`` is ``key`` (an int column compared as its int)."""
    ds = open_lance_source(uri, storage_options)
    field = ds.schema.field(key_field)  # KeyError when the column is gone
    value = _key_value(field.type, key)
    if value is None:
        return []
    table = ds.to_table(filter=pc.field(key_field) == value, limit=limit)
    return table.to_pylist()


def _key_value(kind: pa.DataType, key: str) -> pa.Scalar | None:
    """``key`` as a scalar of the key column's type, or None when no value of that type has this id."""
    if pa.types.is_integer(kind):
        try:
            number = int(key)
        except ValueError:
            return None
        if str(number) != key:
            return None  # "007" is a string key: no int column value has that id
        return pa.scalar(number, kind)
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return pa.scalar(key, kind)
    return None
