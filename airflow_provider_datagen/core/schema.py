"""Schema version 2 of the checkpoint log: event types, item statuses, step kinds and the Arrow schema.

The log is the only durable source of truth (see docs/design.md, The event log), so its schema is the
contract between every writer and reader that will ever touch an experiment. Readers refuse rows of a
schema version they do not know instead of guessing.
"""

from __future__ import annotations

import enum

import pyarrow as pa

DATAGEN_SCHEMA_VERSION = 2

#: JSON values whose canonical encoding is larger than this go to ``value_blob`` (read lazily).
DEFAULT_BLOB_THRESHOLD = 16 * 1024


class EventType(str, enum.Enum):
    """The seven immutable event types (see docs/design.md, The event log)."""

    ITEM_CREATED = "ITEM_CREATED"
    STEP_STARTED = "STEP_STARTED"
    FIELD_SET = "FIELD_SET"
    FIELD_APPEND = "FIELD_APPEND"
    STEP_COMPLETED = "STEP_COMPLETED"
    FAILED = "FAILED"
    TERMINAL = "TERMINAL"

    def __str__(self) -> str:
        return self.value


class ItemStatus(str, enum.Enum):
    """Lifecycle status of an item; FAILED is deliberately absent (it belongs to the failure lens)."""

    NEVER_STARTED = "never_started"
    RUNNING = "running"
    COMPLETED = "completed"
    FILTERED = "filtered"

    def __str__(self) -> str:
        return self.value


#: Values of the stored ``status`` column: running (ITEM_CREATED), terminal ones, failed (FAILED rows).
TERMINAL_STATUSES = frozenset({ItemStatus.COMPLETED.value, ItemStatus.FILTERED.value})
STORED_STATUS_FAILED = "failed"
#: The stored status of a FAILED row whose attempt was retried in place (see docs/adr/0008): the fold
#: keeps it out of ``failures`` (the item is not failed while attempts remain), the failure lens shows it.
STORED_STATUS_TRANSIENT = "transient"


class StepKind(str, enum.Enum):
    """Step kinds: drivers, fan-outs and selectors emit different rows (see docs/design.md, The event log)."""

    SEQUENCE = "Sequence"
    LOOP = "Loop"
    MAP_REDUCE = "MapReduce"
    BRANCH = "Branch"
    SUB_PIPELINE = "SubPipeline"
    CONDITIONAL = "Conditional"
    ROUTER = "Router"
    STEP = "Step"

    def __str__(self) -> str:
        return self.value


FANOUT_KINDS = frozenset({StepKind.MAP_REDUCE, StepKind.BRANCH, StepKind.SUB_PIPELINE})

VALUE_KIND_JSON = "json"
VALUE_KIND_BYTES = "bytes"

_BLOB_META = {b"lance-encoding:blob": b"true"}
#: Hex digests are incompressible: Lance's default string compression spent about a third of a
#: commit's encoding CPU on them for under 20 % of the log's size. A writer hint only: Lance records
#: the encoding per page, so logs written either way read alike.
_RAW_META = {b"lance-encoding:compression": b"none"}

#: Columns a fold may read: everything but the blob bytes, the traceback and forensic coordinates.
LIGHT_COLUMNS = (
    "event_key",
    "schema_version",
    "item_id",
    "item_seq",
    "event_type",
    "status",
    "input_fingerprint",
    "processor_version",
    "writer_epoch",
)

EVENT_SCHEMA = pa.schema(
    [
        pa.field("event_id", pa.string(), nullable=False, metadata=_RAW_META),
        pa.field("event_key", pa.int64(), nullable=False),
        pa.field("schema_version", pa.int32(), nullable=False),
        pa.field("item_id", pa.string(), nullable=False),
        pa.field("root_item_id", pa.string(), nullable=False),
        pa.field("parent_item_id", pa.string()),
        pa.field("item_seq", pa.int64(), nullable=False),
        pa.field("event_type", pa.string(), nullable=False),
        pa.field("status", pa.string()),
        pa.field("step_kind", pa.string()),
        pa.field("step", pa.string()),
        pa.field("enclosing_step", pa.string()),
        pa.field("selector_step", pa.string()),
        pa.field("iteration", pa.int64()),
        pa.field("fanout_index", pa.int64()),
        pa.field("field", pa.string()),
        pa.field("value_kind", pa.string()),
        pa.field("value_json", pa.string()),
        pa.field("value_size", pa.int64()),
        pa.field("value_digest", pa.string()),
        pa.field("value_blob", pa.large_binary(), metadata=_BLOB_META),
        pa.field("input_fingerprint", pa.string(), metadata=_RAW_META),
        pa.field("processor_version", pa.string()),
        pa.field("writer_id", pa.string(), nullable=False),
        pa.field("writer_epoch", pa.int64(), nullable=False),
        pa.field("error_type", pa.string()),
        pa.field("error_message", pa.string()),
        pa.field("error_traceback", pa.string()),
        pa.field("dag_id", pa.string()),
        pa.field("run_id", pa.string()),
        pa.field("task_id", pa.string()),
        pa.field("map_index", pa.int64()),
        pa.field("try_number", pa.int64()),
        pa.field("created_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ],
    metadata={b"datagen_schema_version": str(DATAGEN_SCHEMA_VERSION).encode()},
)

#: Every column except the blob bytes: what trajectory and forensic reads project.
NON_BLOB_COLUMNS = tuple(f.name for f in EVENT_SCHEMA if f.name != "value_blob")
