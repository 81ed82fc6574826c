"""The plan's rule: how each source item stands in the state table, and the class that makes it.

For each item (see docs/design.md, "Resume"): ``skip`` (completed or filtered for the same input fingerprint),
``replay`` (in the inbox: created, not terminal, same fingerprint and processor version), ``demoted``
(in the inbox but its cursor belongs to another processor version: restart from the first step),
``invalidated`` (the input changed since it was recorded), ``fresh`` (never started). The five sets
are disjoint and cover the source.

``redo_completed="other_version"`` also demotes done items (completed or filtered) whose generation
ran under another processor version, so a version bump regenerates them; the default ``"never"``
keeps them (see docs/design.md, Processor versions).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_datagen.core.schema import ItemStatus
from airflow_provider_datagen.core.status import version_counts
from airflow_provider_datagen.exceptions import bad_argument

if TYPE_CHECKING:
    from collections.abc import Callable

#: The values of ``redo_completed``: keep done items of another processor version, or redo them.
REDO_NEVER = "never"
REDO_OTHER_VERSION = "other_version"
REDO_COMPLETED = (REDO_NEVER, REDO_OTHER_VERSION)


def check_redo_completed(owner: object, value: Any) -> str:
    """``value`` if it is one of :data:`REDO_COMPLETED`, else the ConfigurationError naming both."""
    if not isinstance(value, str) or value not in REDO_COMPLETED:
        raise bad_argument(
            owner,
            "redo_completed",
            value,
            "is not one of 'never', 'other_version'",
            "pass 'never' to keep items completed under another processor version, or 'other_version' "
            "to regenerate them",
        )
    return value


@dataclass
class ResumePlan:
    """What a run must do for each source item; the lists keep source order and are disjoint."""

    skip: list[str] = field(default_factory=list)
    replay: list[str] = field(default_factory=list)
    fresh: list[str] = field(default_factory=list)
    invalidated: list[str] = field(default_factory=list)
    demoted: list[str] = field(default_factory=list)
    #: item id -> last sequence number in the log (for priming writers); absent means none.
    last_seq: dict[str, int] = field(default_factory=dict)
    #: replay items that have at least one FAILED event in their current generation.
    failed: list[str] = field(default_factory=list)
    #: skipped items done (completed or filtered) under another processor version, per version:
    #: what a version bump left behind with ``redo_completed="never"``.
    kept_other_version: dict[str, int] = field(default_factory=dict)
    log_version: int = 0
    #: how many items are skipped when ``skip`` does not list them (a streamed plan of a path source)
    skip_count: int | None = None

    @property
    def skipped(self) -> int:
        """How many items are skipped."""
        return len(self.skip) if self.skip_count is None else self.skip_count

    @property
    def pending(self) -> list[str]:
        """Items a run must invoke, in resume order: inbox first, then restarts, then new work."""
        return [*self.replay, *self.demoted, *self.invalidated, *self.fresh]

    @property
    def total(self) -> int:
        return self.skipped + len(self.pending)

    def as_dict(self) -> dict[str, Any]:
        return {
            "skip": self.skipped,
            "replay": len(self.replay),
            "fresh": len(self.fresh),
            "invalidated": len(self.invalidated),
            "demoted": len(self.demoted),
            "failed": len(self.failed),
            "log_version": self.log_version,
        }


#: Source items whose fingerprints are compared per round: bounds the transient string arrays.
FP_CHUNK = 1 << 16

CLS_FRESH, CLS_INVALIDATED, CLS_SKIP, CLS_DEMOTED, CLS_REPLAY = range(5)
#: The pending classes in resume order (see :attr:`ResumePlan.pending`).
PENDING_ORDER = (CLS_REPLAY, CLS_DEMOTED, CLS_INVALIDATED, CLS_FRESH)
#: The :class:`ResumePlan` list of each class.
CLASS_FIELDS = {
    CLS_SKIP: "skip",
    CLS_REPLAY: "replay",
    CLS_DEMOTED: "demoted",
    CLS_INVALIDATED: "invalidated",
    CLS_FRESH: "fresh",
}


def bools(arr: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """``arr`` as numpy bools, null as False."""
    return np.asarray(arr.fill_null(False).to_numpy(zero_copy_only=False), dtype=bool)


def ints(arr: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """``arr`` as numpy int64, null as 0."""
    return np.asarray(arr.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)


@dataclass
class StateMatch:
    """How each source item (by position) stands in the state table: the inputs of :func:`classes`."""

    found: np.ndarray  # has events
    pick: np.ndarray  # its row in the state table (0 when not found)
    started: np.ndarray  # found and not NEVER_STARTED
    running: np.ndarray  # its state is RUNNING
    same_fp: np.ndarray  # started with the same input fingerprint


def match_states(
    n: int, fingerprints: Callable[[np.ndarray], pa.Array], states: pa.Table, index: np.ndarray
) -> StateMatch:
    """Match ``n`` source items against ``states``; ``index`` is each one's state row (-1: none).

    ``fingerprints(rows)`` gives the input fingerprints of the items at positions ``rows`` (a
    string array): only started items are compared, a bounded number at a time.
    """
    found = index >= 0
    if states.num_rows == 0:
        none = np.zeros(n, dtype=bool)
        return StateMatch(none, np.zeros(n, np.int32), none, none, none)
    pick = np.where(found, index, 0).astype(np.int32 if states.num_rows < (1 << 31) else np.int64)
    status = states["status"]
    # Per state row (one per item of the log), then gathered by source position.
    started = found & bools(pc.not_equal(status, ItemStatus.NEVER_STARTED.value))[pick]
    running = bools(pc.equal(status, ItemStatus.RUNNING.value))[pick]
    same_fp = np.zeros(n, dtype=bool)
    state_fps = states["input_fingerprint"]
    for lo in range(0, n, FP_CHUNK):
        rows = np.flatnonzero(started[lo : lo + FP_CHUNK]) + lo
        if not len(rows):
            continue
        theirs = pc.take(state_fps, pa.array(pick[rows]))
        same_fp[rows] = bools(pc.equal(theirs, fingerprints(rows)))
    return StateMatch(found, pick, started, running, same_fp)


def classes(
    m: StateMatch, states: pa.Table, processor_version: str | None, redo_completed: str = REDO_NEVER
) -> tuple[np.ndarray, dict[str, int]]:
    """Each item's class (``CLS_*``) and the done items kept under other versions, per version."""
    kept: dict[str, int] = {}
    cls = np.full(len(m.found), CLS_FRESH, dtype=np.int8)
    if states.num_rows == 0:
        return cls, kept
    cls[m.started & ~m.same_fp] = CLS_INVALIDATED
    done = m.same_fp & ~m.running
    cls[done] = CLS_SKIP
    inbox = m.same_fp & m.running
    if processor_version is None:
        cls[inbox] = CLS_REPLAY
    else:
        same_pv = bools(pc.equal(states["processor_version"], processor_version))[m.pick]
        cls[inbox & ~same_pv] = CLS_DEMOTED
        cls[inbox & same_pv] = CLS_REPLAY
        other = done & ~same_pv
        if redo_completed == REDO_OTHER_VERSION:
            # a done item of another version restarts like a demoted cursor: a new generation, clean
            cls[other] = CLS_DEMOTED
        elif other.any():
            kept = version_counts(pc.take(states["processor_version"], pa.array(m.pick[other])))
    return cls, kept
