"""The checkpoint library: the Lance event log, its folds and the resume engine. No Airflow import."""

from __future__ import annotations

from airflow_provider_datagen.core.events import BlobRef, Event, StepCoord, canonical_json, fingerprint_of
from airflow_provider_datagen.core.fold import (
    Cursor,
    FailureRecord,
    ItemState,
    Violation,
    fold_events,
    fold_table,
)
from airflow_provider_datagen.core.ids import child_item_id, key_of, root_item_id
from airflow_provider_datagen.core.log import Batch, CheckpointLog, LogWriter
from airflow_provider_datagen.core.schema import DATAGEN_SCHEMA_VERSION, EventType, ItemStatus, StepKind

__all__ = [
    "DATAGEN_SCHEMA_VERSION",
    "Batch",
    "BlobRef",
    "CheckpointLog",
    "Cursor",
    "Event",
    "EventType",
    "FailureRecord",
    "ItemState",
    "ItemStatus",
    "LogWriter",
    "StepCoord",
    "StepKind",
    "Violation",
    "canonical_json",
    "child_item_id",
    "fingerprint_of",
    "fold_events",
    "fold_table",
    "key_of",
    "root_item_id",
]
