"""Resume planning: classify every source item against the folded log. Returns data, never acts.

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

import concurrent.futures
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_datagen.core.gil import short_gil_turns
from airflow_provider_datagen.core.schema import ItemStatus
from airflow_provider_datagen.core.sources import SourceItem, fingerprint_rows, prepare_items, row_ids
from airflow_provider_datagen.core.status import NO_VERSION, version_counts
from airflow_provider_datagen.exceptions import bad_argument

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from airflow_provider_datagen.core.store.log import CheckpointLog


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
_FP_CHUNK = 1 << 16

_CLS_FRESH, _CLS_INVALIDATED, _CLS_SKIP, _CLS_DEMOTED, _CLS_REPLAY = range(5)
#: The pending classes in resume order (see :attr:`ResumePlan.pending`).
PENDING_ORDER = (_CLS_REPLAY, _CLS_DEMOTED, _CLS_INVALIDATED, _CLS_FRESH)
CLS_SKIP = _CLS_SKIP
CLS_REPLAY = _CLS_REPLAY
CLS_DEMOTED = _CLS_DEMOTED
CLS_INVALIDATED = _CLS_INVALIDATED
CLS_FRESH = _CLS_FRESH


def _bools(arr: pa.ChunkedArray | pa.Array) -> np.ndarray:
    return np.asarray(arr.fill_null(False).to_numpy(zero_copy_only=False), dtype=bool)


def _ints(arr: pa.ChunkedArray | pa.Array) -> np.ndarray:
    return np.asarray(arr.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)


def classify(
    source: list[SourceItem],
    states: pa.Table,
    processor_version: str | None,
    log_version: int = 0,
    *,
    index: np.ndarray | None = None,
    redo_completed: str = REDO_NEVER,
) -> ResumePlan:
    """Classify prepared source items against a vectorized state table (pure; no I/O).

    ``index`` (each item's row in ``states``, -1 for none), when the caller has it, saves looking
    every id up again. ``redo_completed``: see :func:`plan_resume`.
    """
    check_redo_completed("classify", redo_completed)
    ids = [s.item_id for s in source]
    return _classify(_fingerprints_of(source), ids, states, processor_version, log_version, index, redo_completed)


def _fingerprints_of(source: list[SourceItem]) -> Callable[[np.ndarray], pa.Array]:
    return lambda rows: pa.array([source[i].fingerprint for i in rows.tolist()], pa.string())


def _fingerprints_in(fps: pa.Array) -> Callable[[np.ndarray], pa.Array]:
    return lambda rows: fps.take(pa.array(rows))


def _classify(
    fingerprints: Callable[[np.ndarray], pa.Array],
    ids: list[str],
    states: pa.Table,
    processor_version: str | None,
    log_version: int,
    index: np.ndarray | None,
    redo_completed: str = REDO_NEVER,
) -> ResumePlan:
    # Memory matters as much as time here (1M items must plan in well under 1 GiB with the source
    # itself): per-state predicates are computed once as numpy bools and gathered by index, so no row
    # of the state table is copied; fingerprints, the only wide comparison, are built and compared a
    # chunk at a time; and the lists handed back reuse the source's own id strings.
    plan = ResumePlan(log_version=log_version)
    n = len(ids)
    if not n:
        return plan
    if states.num_rows == 0:
        plan.fresh = list(ids)
        return plan
    if index is None:
        idx = pc.index_in(pa.array(ids, pa.string()), value_set=states["item_id"])
        index = np.asarray(idx.fill_null(-1).to_numpy(zero_copy_only=False))
        del idx
    masks = match_states(n, fingerprints, states, index)
    del index
    cls, plan.kept_other_version = classes(masks, states, processor_version, redo_completed)
    id_arr = np.array(ids, dtype=object)
    plan.fresh = id_arr[cls == _CLS_FRESH].tolist()
    plan.invalidated = id_arr[cls == _CLS_INVALIDATED].tolist()
    plan.skip = id_arr[cls == _CLS_SKIP].tolist()
    plan.demoted = id_arr[cls == _CLS_DEMOTED].tolist()
    replay = np.flatnonzero(cls == _CLS_REPLAY)
    plan.replay = id_arr[replay].tolist()
    # failures and last_seq are read for the few items that need them, not gathered for all
    pick = masks.pick
    failures = _ints(pc.take(states["failures"], pa.array(pick[replay])))
    plan.failed = id_arr[replay[failures > 0]].tolist()
    has_seq = np.flatnonzero(masks.found & (cls != _CLS_SKIP))
    last_seq = pc.take(states["last_seq"], pa.array(pick[has_seq])).to_pylist()
    plan.last_seq = dict(zip(id_arr[has_seq].tolist(), last_seq))
    return plan


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
    started = found & _bools(pc.not_equal(status, ItemStatus.NEVER_STARTED.value))[pick]
    running = _bools(pc.equal(status, ItemStatus.RUNNING.value))[pick]
    same_fp = np.zeros(n, dtype=bool)
    state_fps = states["input_fingerprint"]
    for lo in range(0, n, _FP_CHUNK):
        rows = np.flatnonzero(started[lo : lo + _FP_CHUNK]) + lo
        if not len(rows):
            continue
        theirs = pc.take(state_fps, pa.array(pick[rows]))
        same_fp[rows] = _bools(pc.equal(theirs, fingerprints(rows)))
    return StateMatch(found, pick, started, running, same_fp)


def classes(
    m: StateMatch, states: pa.Table, processor_version: str | None, redo_completed: str = REDO_NEVER
) -> tuple[np.ndarray, dict[str, int]]:
    """Each item's class (``CLS_*``) and the done items kept under other versions, per version."""
    kept: dict[str, int] = {}
    cls = np.full(len(m.found), _CLS_FRESH, dtype=np.int8)
    if states.num_rows == 0:
        return cls, kept
    cls[m.started & ~m.same_fp] = _CLS_INVALIDATED
    done = m.same_fp & ~m.running
    cls[done] = _CLS_SKIP
    inbox = m.same_fp & m.running
    if processor_version is None:
        cls[inbox] = _CLS_REPLAY
    else:
        same_pv = _bools(pc.equal(states["processor_version"], processor_version))[m.pick]
        cls[inbox & ~same_pv] = _CLS_DEMOTED
        cls[inbox & same_pv] = _CLS_REPLAY
        other = done & ~same_pv
        if redo_completed == REDO_OTHER_VERSION:
            # a done item of another version restarts like a demoted cursor: a new generation, clean
            cls[other] = _CLS_DEMOTED
        elif other.any():
            kept = version_counts(pc.take(states["processor_version"], pa.array(m.pick[other])))
    return cls, kept


def plan_resume(
    log: CheckpointLog,
    items: Iterable[Any],
    key_field: str = "id",
    processor_version: str | None = "v1",
    *,
    states: pa.Table | None = None,
    redo_completed: str = REDO_NEVER,
) -> ResumePlan:
    """Fold the log once (vectorized) and classify every source item.

    ``redo_completed``: ``"never"`` (the default) skips every done item of the same input, whatever
    processor version produced it; ``"other_version"`` makes items completed (or filtered: a filter
    decision is an output of the processor too) under another processor version pending again, in
    ``demoted``: their new generation starts clean, and the old one stays in the log's history.
    Any other value raises :class:`~airflow_provider_datagen.exceptions.ConfigurationError`.
    """
    check_redo_completed("plan_resume", redo_completed)
    if isinstance(items, (list, tuple)) and not (items and isinstance(items[0], SourceItem)):
        # raw dicts: ids and fingerprints straight from the rows, no item objects, when every row is
        # plain and the keys are unique; otherwise prepare_items builds the items or raises
        rows = list(items)
        keys = row_ids(rows, key_field)
        with (
            short_gil_turns(),
            concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="datagen-plan") as pool,
        ):
            ahead = _read_ahead(pool, log, keys) if keys is not None and states is None else None
            fast = None if keys is None else fingerprint_rows(rows, key_field, ids=keys)
            if fast is not None:
                ids, fps = fast
                index = None
                if ahead is None:
                    unique = len(set(ids)) == len(ids)
                else:
                    unique, states, index = ahead.result()
                if unique:
                    return _plan(log, ids, _fingerprints_in(fps), states, processor_version, redo_completed, index)
    source = as_source(items, key_field)
    ids = [s.item_id for s in source]
    return _plan(log, ids, _fingerprints_of(source), states, processor_version, redo_completed)


#: Raw rows from which :func:`plan_resume` reads the stored states on a second thread while it fingerprints.
READ_AHEAD_ROWS = 1 << 15


def _read_ahead(
    pool: concurrent.futures.Executor, log: CheckpointLog, ids: list[str]
) -> concurrent.futures.Future[tuple[bool, pa.Table, np.ndarray]] | None:
    """Start reading the states of ``ids`` (a raw source's :func:`~.sources.row_ids`) on the second thread.

    The read (Lance's scan and Arrow's id match, which release the GIL) then runs beside the
    fingerprinting (Python, holding it): at 1M items they were 0.4 and 1.1 s one after the other.
    It also says whether the ids are unique, counted by Arrow (``set()`` took 0.1 s of the main
    thread). The caller uses the read only if the fingerprinting takes these rows; otherwise it takes
    the path it would have taken anyway, and an error of the read is that path's to meet.
    """
    if len(ids) < READ_AHEAD_ROWS:
        return None

    def read() -> tuple[bool, pa.Table, np.ndarray]:
        array = pa.array(ids, pa.string())
        unique = pc.count_distinct(array).as_py() == len(array)
        return (unique, *log.states_for(array))

    return pool.submit(read)


def _plan(
    log: CheckpointLog,
    ids: list[str],
    fingerprints: Callable[[np.ndarray], pa.Array],
    states: pa.Table | None,
    processor_version: str | None,
    redo_completed: str,
    index: np.ndarray | None = None,
) -> ResumePlan:
    """Classify ``ids`` against ``states`` (read from the log when not given); ``index``: each id's state row."""
    if states is None:
        states, index = log.states_for(ids)
    return _classify(fingerprints, ids, states, processor_version, log.version, index, redo_completed)


def as_source(items: Iterable[Any], key_field: str) -> list[SourceItem]:
    """Prepared source items as given, or validated from raw dicts."""
    if isinstance(items, list) and items and all(isinstance(i, SourceItem) for i in items[:1]):
        return items
    return prepare_items(items, key_field)


def status_of(
    log: CheckpointLog,
    items: Iterable[Any] | None = None,
    key_field: str = "id",
    *,
    states: pa.Table | None = None,
) -> dict[str, Any]:
    """The ``datagen_status`` dict; with a source, its never-started and edited items count as pending.

    Without a source or ``states`` it is :meth:`CheckpointLog.summary`, counted from the state
    projection and the items changed since when the log has one, not from a fold of the whole log.
    """
    # Deferred: the store's tally imports the planner's neighbours (a cycle at import time).
    from airflow_provider_datagen.core.store.tally import finish

    if items is None:
        return log.summary() if states is None else finish(log, log.summary(states), whole_log=False)
    if states is None:
        states = log.states()
    summary = log.summary(states)
    source = as_source(items, key_field)
    plan = classify(source, states, None, summary["log_version"])
    done = set(plan.skip)
    ids = pa.array([s.item_id for s in source], pa.string())
    sub = states.filter(pc.is_in(states["item_id"], value_set=ids)) if len(states) else states
    completed = filtered = 0
    by_version: dict[str, int] = {}
    if len(sub):
        rows = zip(sub["item_id"].to_pylist(), sub["status"].to_pylist(), sub["processor_version"].to_pylist())
        for iid, st, pv in rows:
            if iid in done:
                if st == ItemStatus.COMPLETED.value:
                    completed += 1
                    version = NO_VERSION if pv is None else pv
                    by_version[version] = by_version.get(version, 0) + 1
                filtered += st == ItemStatus.FILTERED.value
    running = len(plan.replay) + len(plan.demoted)
    never = len(plan.fresh)
    summary.update(
        total=len(source),
        completed=completed,
        completed_by_version=dict(sorted(by_version.items())),
        filtered=filtered,
        running=running,
        never_started=never,
        invalidated=len(plan.invalidated),
        pending=len(plan.pending),
        # the log's root items this source does not hold: counted apart, never pending
        removed=int(summary["total"]) - int(pc.sum(pc.equal(pc.count_substring(sub["item_id"], "/"), 0)).as_py() or 0)
        if len(sub)
        else int(summary["total"]),
    )
    return finish(log, summary, whole_log=False)
