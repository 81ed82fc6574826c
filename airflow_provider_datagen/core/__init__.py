"""The checkpoint library: the Lance event log, its folds and the resume engine. No Airflow import."""

from __future__ import annotations

from airflow_provider_datagen.core.events import BlobRef, Event, StepCoord, canonical_json, fingerprint_of
from airflow_provider_datagen.core.export import export_results, merge_results, results_fingerprint
from airflow_provider_datagen.core.fold import (
    Cursor,
    FailureRecord,
    ItemState,
    Violation,
    fold_events,
    fold_table,
)
from airflow_provider_datagen.core.ids import child_item_id, key_of, root_item_id
from airflow_provider_datagen.core.planner import ResumePlan, plan_resume, status_of
from airflow_provider_datagen.core.ratelimit import RateLimit
from airflow_provider_datagen.core.retry import RetryPolicy
from airflow_provider_datagen.core.runner import ItemContext, RunReport, run_items
from airflow_provider_datagen.core.schema import DATAGEN_SCHEMA_VERSION, EventType, ItemStatus, StepKind
from airflow_provider_datagen.core.sources import SourceItem, load_source, prepare_items, read_source
from airflow_provider_datagen.core.steps import (
    Branch,
    Conditional,
    Loop,
    MapReduce,
    Router,
    Sequence,
    Step,
    SubPipeline,
)
from airflow_provider_datagen.core.store.batch import Batch
from airflow_provider_datagen.core.store.log import CheckpointLog
from airflow_provider_datagen.core.store.writer import LogWriter

__all__ = [
    "DATAGEN_SCHEMA_VERSION",
    "Batch",
    "BlobRef",
    "Branch",
    "CheckpointLog",
    "Conditional",
    "Cursor",
    "Event",
    "EventType",
    "FailureRecord",
    "ItemContext",
    "ItemState",
    "ItemStatus",
    "LogWriter",
    "Loop",
    "MapReduce",
    "RateLimit",
    "ResumePlan",
    "RetryPolicy",
    "Router",
    "RunReport",
    "Sequence",
    "SourceItem",
    "Step",
    "StepCoord",
    "StepKind",
    "SubPipeline",
    "Violation",
    "canonical_json",
    "child_item_id",
    "export_results",
    "fingerprint_of",
    "fold_events",
    "fold_table",
    "key_of",
    "load_source",
    "merge_results",
    "plan_resume",
    "prepare_items",
    "read_source",
    "results_fingerprint",
    "root_item_id",
    "run_items",
    "status_of",
]
