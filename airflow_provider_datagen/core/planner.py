"""Resume planning: classify every source item against the folded log. Returns data, never acts.

The rule (the five classes ``skip``, ``replay``, ``demoted``, ``invalidated``, ``fresh``, and what
``redo_completed`` changes) lives in :mod:`.plan.rules`, and the plan is assembled from a
classification by :mod:`.plan.assemble`; this module reads a source and the log's states for them,
and keeps their names importable from here. See docs/design.md, "Resume" and "Processor versions".
"""

from __future__ import annotations

import concurrent.futures
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_datagen.core.gil import short_gil_turns
from airflow_provider_datagen.core.plan.assemble import assemble, part_of, source_counts
from airflow_provider_datagen.core.plan.rules import (
    CLS_DEMOTED,
    CLS_FRESH,
    CLS_INVALIDATED,
    CLS_REPLAY,
    CLS_SKIP,
    FP_CHUNK,
    PENDING_ORDER,
    REDO_COMPLETED,
    REDO_NEVER,
    REDO_OTHER_VERSION,
    ResumePlan,
    StateMatch,
    bools,
    check_redo_completed,
    classes,
    ints,
    match_states,
)
from airflow_provider_datagen.core.sources import SourceItem, fingerprint_rows, prepare_items, row_ids

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from airflow_provider_datagen.core.store.log import CheckpointLog

__all__ = [
    "CLS_DEMOTED",
    "CLS_FRESH",
    "CLS_INVALIDATED",
    "CLS_REPLAY",
    "CLS_SKIP",
    "PENDING_ORDER",
    "READ_AHEAD_ROWS",
    "REDO_COMPLETED",
    "REDO_NEVER",
    "REDO_OTHER_VERSION",
    "ResumePlan",
    "StateMatch",
    "as_source",
    "check_redo_completed",
    "classes",
    "classify",
    "classify_with_status",
    "match_states",
    "plan_resume",
    "status_of",
]

# The rule's old private names here, for code written against them (the rule lives in core/plan/).
_FP_CHUNK = FP_CHUNK
_bools, _ints = bools, ints
_CLS_FRESH, _CLS_INVALIDATED, _CLS_SKIP, _CLS_DEMOTED, _CLS_REPLAY = (
    CLS_FRESH,
    CLS_INVALIDATED,
    CLS_SKIP,
    CLS_DEMOTED,
    CLS_REPLAY,
)


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


def _match(
    fingerprints: Callable[[np.ndarray], pa.Array], ids: list[str], states: pa.Table, index: np.ndarray | None
) -> StateMatch:
    """How ``ids`` (with ``fingerprints``) match ``states``; ``index``: each id's state row, looked up when None."""
    if index is None and states.num_rows:
        idx = pc.index_in(pa.array(ids, pa.string()), value_set=states["item_id"])
        index = np.asarray(idx.fill_null(-1).to_numpy(zero_copy_only=False))
        del idx
    if index is None:
        index = np.full(len(ids), -1, np.int64)
    return match_states(len(ids), fingerprints, states, index)


def _classify(
    fingerprints: Callable[[np.ndarray], pa.Array],
    ids: list[str],
    states: pa.Table,
    processor_version: str | None,
    log_version: int,
    index: np.ndarray | None,
    redo_completed: str = REDO_NEVER,
    *,
    match: StateMatch | None = None,
) -> ResumePlan:
    # Memory matters as much as time here (1M items must plan in well under 1 GiB with the source
    # itself): per-state predicates are computed once as numpy bools and gathered by index, so no row
    # of the state table is copied; fingerprints, the only wide comparison, are built and compared a
    # chunk at a time; and the lists handed back reuse the source's own id strings.
    if not ids:
        return ResumePlan(log_version=log_version)
    if states.num_rows == 0:
        return ResumePlan(fresh=list(ids), log_version=log_version)
    if match is None:
        match = _match(fingerprints, ids, states, index)
    del index
    cls, kept = classes(match, states, processor_version, redo_completed)
    part = part_of(cls, match, states, np.array(ids, dtype=object), kept=kept, list_skip=True)
    return assemble([part], log_version=log_version, list_skip=True).plan


def classify_with_status(
    log: CheckpointLog,
    source: list[SourceItem],
    states: pa.Table,
    processor_version: str | None,
    *,
    redo_completed: str = REDO_NEVER,
) -> tuple[ResumePlan, dict[str, Any]]:
    """:func:`classify` at ``log.version`` and :func:`status_of` of ``source``, from one match of it to ``states``.

    The match (the id lookup and the fingerprint comparison) is the costly part of both; the
    classes of each view are a few numpy passes over it.
    """
    check_redo_completed("classify_with_status", redo_completed)
    ids = [s.item_id for s in source]
    match = _match(_fingerprints_of(source), ids, states, None)
    plan = _classify(
        _fingerprints_of(source), ids, states, processor_version, log.version, None, redo_completed, match=match
    )
    return plan, _source_status(log, log.summary(states), states, ids, match)


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
    source = as_source(items, key_field)
    ids = [s.item_id for s in source]
    return _source_status(log, log.summary(states), states, ids, _match(_fingerprints_of(source), ids, states, None))


def _source_status(
    log: CheckpointLog, summary: dict[str, Any], states: pa.Table, ids: list[str], match: StateMatch
) -> dict[str, Any]:
    """``summary`` (the log's) counted over the source ``ids``, as they ``match`` ``states``."""
    # Deferred: the store's tally imports the planner's neighbours (a cycle at import time).
    from airflow_provider_datagen.core.store.tally import finish

    logged = int(summary["total"])
    summary.update(source_counts(states, match))
    # the log's root items this source does not hold: counted apart, never pending
    held = pa.array(ids, pa.string()).filter(pa.array(match.found)) if match.found.any() else None
    roots = 0 if held is None else int(pc.sum(pc.equal(pc.count_substring(held, "/"), 0)).as_py() or 0)
    summary["removed"] = logged - roots
    return finish(log, summary, whole_log=False)
