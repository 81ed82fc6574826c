"""The experiment's batch submissions: an append-only Lance dataset beside the log (``batches.lance``).

A batch run (:mod:`airflow_provider_datagen.core.batch`) writes one row per step of a submission's life:

- ``intent``: before the provider is asked, the submission's unique ``submission_key``, its
  ``custom_ids`` and ``item_ids`` (a crash after this row and before ``submitted`` is re-attached by the
  key the batch carries in its metadata, or submitted again where the provider keeps none);
- ``submitted``: the provider accepted it, with its ``batch_id``;
- ``ended``: the provider ended it (its counts), so its results can be read;
- ``recorded``: every row's result is in the log (the submission is closed);
- ``cancelled`` / ``failed``: closed without results (``failed``: the provider refused the whole batch).

Rows are small and few (a handful per batch of up to 50,000 requests), so the fold is plain Python. Only
this module (with the rest of ``core/store``) touches Lance.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa

from airflow_provider_datagen.core.store import lance_io
from airflow_provider_datagen.core.store.paths import experiment_uri

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

BATCHES_DIR = "batches.lance"


class Located(Protocol):
    """Where the experiment's log is: all the submissions record needs of it (a ``CheckpointLog`` is one)."""

    uri: str
    storage_options: dict[str, str] | None


INTENT = "intent"
SUBMITTED = "submitted"
ENDED = "ended"
RECORDED = "recorded"
CANCELLED = "cancelled"
FAILED = "failed"
#: the kinds after which a submission is closed: nothing is polled or recorded for it again
CLOSED = frozenset({RECORDED, CANCELLED, FAILED})

SCHEMA = pa.schema(
    [
        pa.field("submission_key", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("provider", pa.string()),
        pa.field("batch_id", pa.string()),
        pa.field("custom_ids", pa.list_(pa.string())),
        pa.field("item_ids", pa.list_(pa.string())),
        pa.field("status", pa.string()),
        pa.field("counts_json", pa.string()),
        pa.field("writer_id", pa.string()),
        pa.field("writer_epoch", pa.int64()),
        pa.field("at", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)


def batches_uri(log_uri: str) -> str:
    """The URI of the experiment's batch submissions."""
    return f"{experiment_uri(log_uri)}/{BATCHES_DIR}"


@dataclass
class Submission:
    """One submission as its rows say now."""

    submission_key: str
    provider: str | None = None
    custom_ids: list[str] = field(default_factory=list)
    item_ids: list[str] = field(default_factory=list)
    batch_id: str | None = None
    #: the latest row's kind
    kind: str = INTENT
    #: the provider's latest status word and counts
    status: str | None = None
    counts: dict[str, int] = field(default_factory=dict)
    #: when the intent was written (epoch seconds): where a search for an orphaned batch starts
    intent_at: float = 0.0
    #: when the latest row was written
    updated_at: float = 0.0
    writer_id: str | None = None
    writer_epoch: int | None = None

    @property
    def is_open(self) -> bool:
        """Neither recorded nor cancelled nor failed: its rows may still come back."""
        return self.kind not in CLOSED

    def describe(self) -> dict[str, Any]:
        """The JSON-able view the UI and the run's report show."""
        return {
            "submission_key": self.submission_key,
            "batch_id": self.batch_id,
            "provider": self.provider,
            "state": self.kind,
            "status": self.status,
            "counts": dict(self.counts),
            "requests": len(self.custom_ids),
            "submitted_at": dt.datetime.fromtimestamp(self.intent_at, dt.UTC).isoformat() if self.intent_at else None,
            "updated_at": dt.datetime.fromtimestamp(self.updated_at, dt.UTC).isoformat() if self.updated_at else None,
        }


def _rows(rows: Sequence[dict[str, Any]]) -> pa.Table:
    now = dt.datetime.now(dt.UTC)
    columns: dict[str, list[Any]] = {name: [] for name in SCHEMA.names}
    for row in rows:
        for name in SCHEMA.names:
            columns[name].append(row.get(name, now if name == "at" else None))
    return pa.table(columns, schema=SCHEMA)


def append(log: Located, rows: Sequence[dict[str, Any]]) -> None:
    """Append ``rows`` (dicts of :data:`SCHEMA`'s columns; ``at`` defaults to now) in one commit."""
    if not rows:
        return
    uri = batches_uri(log.uri)
    table = _rows(rows)
    try:
        if lance_io.dataset_exists(uri, log.storage_options):
            lance_io.append_table(table, lance_io.open_dataset(uri, log.storage_options), SCHEMA, log.storage_options)
        else:
            lance_io.create_dataset(table, uri, SCHEMA, log.storage_options, lambda: _reopen(uri, log))
    except lance_io.LANCE_ERRORS as exc:
        raise lance_io.translate(exc, uri, "recording a batch submission") from None


def _reopen(uri: str, log: Located) -> Any:
    if not lance_io.dataset_exists(uri, log.storage_options):
        return None
    return lance_io.open_dataset(uri, log.storage_options)


def read(log: Located) -> dict[str, Submission]:
    """Every submission of the experiment by ``submission_key``, folded from its rows in write order."""
    uri = batches_uri(log.uri)
    if not lance_io.dataset_exists(uri, log.storage_options):
        return {}
    try:
        table = lance_io.open_dataset(uri, log.storage_options).to_table()
    except lance_io.LANCE_ERRORS as exc:
        raise lance_io.translate(exc, uri, "reading the batch submissions") from None
    return fold(table.to_pylist())


def fold(rows: Iterable[dict[str, Any]]) -> dict[str, Submission]:
    """The submissions ``rows`` describe; a closed submission stays closed whatever a late row says."""
    out: dict[str, Submission] = {}
    for row in sorted(rows, key=lambda r: r["at"]):
        key = row["submission_key"]
        sub = out.get(key)
        if sub is None:
            sub = out[key] = Submission(key)
        at = row["at"].timestamp()
        if row["kind"] == INTENT:
            sub.custom_ids = list(row["custom_ids"] or [])
            sub.item_ids = list(row["item_ids"] or [])
            sub.intent_at = at
        if row.get("provider"):
            sub.provider = row["provider"]
        if row.get("batch_id"):
            sub.batch_id = row["batch_id"]
        if row.get("status"):
            sub.status = row["status"]
        if row.get("counts_json"):
            sub.counts = json.loads(row["counts_json"])
        if row.get("writer_id"):
            sub.writer_id, sub.writer_epoch = row["writer_id"], row["writer_epoch"]
        if sub.kind not in CLOSED:
            sub.kind = row["kind"]
        sub.updated_at = at
    return out


def open_submissions(log: Located) -> list[Submission]:
    """The submissions still open, oldest first."""
    return sorted((s for s in read(log).values() if s.is_open), key=lambda s: s.intent_at)
