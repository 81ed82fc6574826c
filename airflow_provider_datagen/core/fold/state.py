"""The value types of the folds: an item's lifecycle state, its cursor, violations and failure records.

Both folds (see docs/design.md, Lenses) produce these: the reference fold an :class:`ItemState` per item,
the vectorized fold one row of :data:`STATE_SCHEMA` per item; :func:`state_row` maps the first onto the
second, which is how a property test holds the two equal.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from airflow_provider_datagen.core.schema import ItemStatus

if TYPE_CHECKING:
    from airflow_provider_datagen.core.events import StepCoord

VIOLATION_CONFLICT = "conflict"
VIOLATION_STALE_EPOCH = "stale_epoch"
FENCING_ERROR_TYPE = "FencingViolation"


@dataclass(frozen=True)
class Cursor:
    """Where an item's last checkpointed step ended, and under which processor version."""

    coord: StepCoord
    processor_version: str | None
    item_seq: int

    @property
    def step(self) -> str | None:
        return self.coord.step

    @property
    def iteration(self) -> int | None:
        return self.coord.iteration


@dataclass(frozen=True)
class Violation:
    """An event the fold refused: a second event at a taken sequence, or a stale epoch's late write."""

    item_id: str
    item_seq: int
    kind: str
    event_id: str
    event_type: str
    writer_id: str
    writer_epoch: int
    winner_event_id: str | None
    winner_epoch: int | None


@dataclass(frozen=True)
class FailureRecord:
    """One row of the failure lens: a FAILED event, or a fencing violation found by the fold."""

    item_id: str
    item_seq: int
    event_id: str
    error_type: str
    message: str
    traceback: str | None
    step: str | None
    coord: StepCoord
    writer_id: str
    epoch: int
    input_fingerprint: str | None = None
    dag_id: str | None = None
    run_id: str | None = None
    task_id: str | None = None
    map_index: int | None = None
    try_number: int | None = None
    created_at: Any = None
    #: the attempt was retried in place (a retry policy): not a failure of the item
    transient: bool = False
    #: which call of the process this was in its item's generation (with a retry policy), else None
    attempt: int | None = None
    #: for a transient row: the seconds waited before the next attempt
    wait: float | None = None


@dataclass
class ItemState:
    """The lifecycle lens of one item: the fold of its current generation of events."""

    item_id: str
    status: ItemStatus = ItemStatus.NEVER_STARTED
    fields: dict[str, Any] = field(default_factory=dict)
    field_modes: dict[str, str] = field(default_factory=dict)
    cursor: Cursor | None = None
    completed_steps: list[Cursor] = field(default_factory=list)
    open_frames: list[StepCoord] = field(default_factory=list)
    input_fingerprint: str | None = None
    processor_version: str | None = None
    created_seq: int | None = None
    terminal_seq: int | None = None
    filter_reason: Any = None
    last_seq: int = -1
    max_epoch: int = -1
    #: FAILED rows of the current generation that failed the item (attempts exhausted, or no retry)
    failures: int = 0
    #: transient FAILED rows of the current generation (attempts retried in place, see retry.py)
    retries: int = 0
    violations: list[Violation] = field(default_factory=list)
    parent_item_id: str | None = None

    @property
    def is_done(self) -> bool:
        return self.status in (ItemStatus.COMPLETED, ItemStatus.FILTERED)


#: Columns of the per-item state table produced by both folds.
STATE_SCHEMA = pa.schema(
    [
        pa.field("item_id", pa.string()),
        pa.field("status", pa.string()),
        pa.field("input_fingerprint", pa.string()),
        pa.field("processor_version", pa.string()),
        pa.field("created_seq", pa.int64()),
        pa.field("last_seq", pa.int64()),
        pa.field("max_epoch", pa.int64()),
        pa.field("failures", pa.int64()),
        pa.field("violations", pa.int64()),
    ]
)


def state_row(st: ItemState) -> dict[str, Any]:
    """The per-item summary row of :data:`STATE_SCHEMA` for a reference-folded state."""
    return {
        "item_id": st.item_id,
        "status": st.status.value,
        "input_fingerprint": st.input_fingerprint,
        "processor_version": st.processor_version,
        "created_seq": st.created_seq,
        "last_seq": st.last_seq,
        "max_epoch": st.max_epoch,
        "failures": st.failures,
        "violations": len(st.violations),
    }
