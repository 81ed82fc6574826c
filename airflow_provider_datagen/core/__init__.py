"""The checkpoint library: the Lance event log, its folds and the resume engine. No Airflow import.

The names below are loaded on first use (PEP 562): importing one light submodule, such as
``core.retry`` when a DAG file is parsed, must not import Lance and pyarrow with the whole library
(every DAG parse and every task's start-up would pay for it; under load a DAG parse that imports them
can pass ``[core] dagbag_import_timeout``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_provider_datagen.core.batch import BatchReport, BatchRun, run_batch
    from airflow_provider_datagen.core.chunk_spec import ChunkSpec
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
    from airflow_provider_datagen.core.status import DatagenStatus
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
    from airflow_provider_datagen.core.store.responses import ResponseStore
    from airflow_provider_datagen.core.store.writer import LogWriter

#: public name -> the submodule that defines it
_EXPORTS = {
    "Batch": "airflow_provider_datagen.core.store.batch",
    "BatchReport": "airflow_provider_datagen.core.batch",
    "BatchRun": "airflow_provider_datagen.core.batch",
    "BlobRef": "airflow_provider_datagen.core.events",
    "Branch": "airflow_provider_datagen.core.steps",
    "CheckpointLog": "airflow_provider_datagen.core.store.log",
    "ChunkSpec": "airflow_provider_datagen.core.chunk_spec",
    "Conditional": "airflow_provider_datagen.core.steps",
    "Cursor": "airflow_provider_datagen.core.fold",
    "DATAGEN_SCHEMA_VERSION": "airflow_provider_datagen.core.schema",
    "DatagenStatus": "airflow_provider_datagen.core.status",
    "Event": "airflow_provider_datagen.core.events",
    "EventType": "airflow_provider_datagen.core.schema",
    "FailureRecord": "airflow_provider_datagen.core.fold",
    "ItemContext": "airflow_provider_datagen.core.runner",
    "ItemState": "airflow_provider_datagen.core.fold",
    "ItemStatus": "airflow_provider_datagen.core.schema",
    "LogWriter": "airflow_provider_datagen.core.store.writer",
    "Loop": "airflow_provider_datagen.core.steps",
    "MapReduce": "airflow_provider_datagen.core.steps",
    "RateLimit": "airflow_provider_datagen.core.ratelimit",
    "ResponseStore": "airflow_provider_datagen.core.store.responses",
    "ResumePlan": "airflow_provider_datagen.core.planner",
    "RetryPolicy": "airflow_provider_datagen.core.retry",
    "Router": "airflow_provider_datagen.core.steps",
    "RunReport": "airflow_provider_datagen.core.runner",
    "Sequence": "airflow_provider_datagen.core.steps",
    "SourceItem": "airflow_provider_datagen.core.sources",
    "Step": "airflow_provider_datagen.core.steps",
    "StepCoord": "airflow_provider_datagen.core.events",
    "StepKind": "airflow_provider_datagen.core.schema",
    "SubPipeline": "airflow_provider_datagen.core.steps",
    "Violation": "airflow_provider_datagen.core.fold",
    "canonical_json": "airflow_provider_datagen.core.events",
    "run_batch": "airflow_provider_datagen.core.batch",
    "child_item_id": "airflow_provider_datagen.core.ids",
    "export_results": "airflow_provider_datagen.core.export",
    "fingerprint_of": "airflow_provider_datagen.core.events",
    "fold_events": "airflow_provider_datagen.core.fold",
    "fold_table": "airflow_provider_datagen.core.fold",
    "key_of": "airflow_provider_datagen.core.ids",
    "load_source": "airflow_provider_datagen.core.sources",
    "merge_results": "airflow_provider_datagen.core.export",
    "plan_resume": "airflow_provider_datagen.core.planner",
    "prepare_items": "airflow_provider_datagen.core.sources",
    "read_source": "airflow_provider_datagen.core.sources",
    "results_fingerprint": "airflow_provider_datagen.core.export",
    "root_item_id": "airflow_provider_datagen.core.ids",
    "run_items": "airflow_provider_datagen.core.runner",
    "status_of": "airflow_provider_datagen.core.planner",
}

# issue 29: the in-memory Hugging Face dataset (``datasets`` is the optional extra [hf])
if TYPE_CHECKING:
    from airflow_provider_datagen.core.hf import to_hf_dataset
_EXPORTS["to_hf_dataset"] = "airflow_provider_datagen.core.hf"

__all__ = [
    "DATAGEN_SCHEMA_VERSION",
    "Batch",
    "BatchReport",
    "BatchRun",
    "BlobRef",
    "Branch",
    "CheckpointLog",
    "ChunkSpec",
    "Conditional",
    "Cursor",
    "DatagenStatus",
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
    "ResponseStore",
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
    "run_batch",
    "run_items",
    "status_of",
]
__all__ += ["to_hf_dataset"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
