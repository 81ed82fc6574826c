"""The two read lenses (see docs/design.md, Lenses): the lifecycle fold and the failure lens.

- :mod:`.state`: the value types (:class:`ItemState`, :class:`Cursor`, :class:`Violation`,
  :class:`FailureRecord`) and the per-item state table :data:`STATE_SCHEMA`.
- :mod:`.reference`: the per-item reference fold (:func:`fold_events`) and :func:`failure_records`,
  the readable definition.
- :mod:`.vectorized`: :func:`fold_table` / :func:`fold_batches`, the same per-item summary for
  millions of events with numpy over Arrow columns; a property test holds the two folds equal.
"""

from __future__ import annotations

from airflow_provider_datagen.core.fold.reference import dedupe, failure_records, fold_events
from airflow_provider_datagen.core.fold.state import (
    FENCING_ERROR_TYPE,
    STATE_SCHEMA,
    VIOLATION_CONFLICT,
    VIOLATION_STALE_EPOCH,
    Cursor,
    FailureRecord,
    ItemState,
    Violation,
    state_row,
)
from airflow_provider_datagen.core.fold.vectorized import (
    MisalignedStreamsError,
    fold_batches,
    fold_table,
)

# The vectorized fold's internals, reachable under the old name for the unit tests that probe them.
from airflow_provider_datagen.core.fold.vectorized import _Compacted as _Compacted
from airflow_provider_datagen.core.fold.vectorized import _fold as _fold

__all__ = [
    "FENCING_ERROR_TYPE",
    "STATE_SCHEMA",
    "VIOLATION_CONFLICT",
    "VIOLATION_STALE_EPOCH",
    "Cursor",
    "FailureRecord",
    "ItemState",
    "MisalignedStreamsError",
    "Violation",
    "dedupe",
    "failure_records",
    "fold_batches",
    "fold_events",
    "fold_table",
    "state_row",
]
