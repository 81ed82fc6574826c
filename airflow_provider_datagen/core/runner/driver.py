"""The main thread's runner: drives root items and acknowledges each with its TERMINAL.

:meth:`Runner.run_root` is the general driver; :meth:`Runner.run_fresh_leaf` is its short path for
a fresh item of a one-step pipeline (a process function), which is most items of most runs.
"""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow_provider_datagen.core.fold import fold_events
from airflow_provider_datagen.core.runner.attempts import call_step
from airflow_provider_datagen.core.runner.commit import Committer
from airflow_provider_datagen.core.runner.context import NO_FIELDS, ItemContext, WorkItem
from airflow_provider_datagen.core.runner.failures import CHUNK_STOPS, on_failure
from airflow_provider_datagen.core.runner.interpreter import COMPLETED, guarded
from airflow_provider_datagen.core.runner.signals import StepFailure
from airflow_provider_datagen.core.schema import EventType, ItemStatus
from airflow_provider_datagen.core.steps import Step

if TYPE_CHECKING:
    from collections.abc import Callable

    from airflow_provider_datagen.core.events import StepCoord
    from airflow_provider_datagen.core.fold import ItemState
    from airflow_provider_datagen.core.runner.jobs import RootJobs
    from airflow_provider_datagen.core.sources import SourceItem
    from airflow_provider_datagen.core.store.log import CheckpointLog

_TERMINAL = EventType.TERMINAL.value


class Runner(Committer):
    """Drives a run's root items on the main thread, the only thread that writes the log."""

    @property
    def log(self) -> CheckpointLog:
        """The event log this run writes to."""
        return self.shared.log

    def run_root(self, src: SourceItem, state: ItemState | None, replayed: bool, *, history: bool = False) -> None:
        children: dict[str, ItemState] = {}
        has_fanout = self.shared.has_fanout
        if has_fanout:
            self.known_children.clear()
        if has_fanout and (history or (state is not None and state.status is ItemStatus.RUNNING)):
            # A restarted root (demoted, edited) has children in the log too: their sequences must be
            # known before the new generation appends to them.
            children = self.children_states(src.item_id)
        item = WorkItem.start(src.item_id, src.key, src.data, src.fingerprint, state, children)
        if replayed:
            self.report.replayed.append(src.item_id)
        try:
            status, reason = self._drive(item, self.shared.pipeline, None, None, None)
        except BaseException as exc:
            on_failure(self, item, exc)
            return
        self.acknowledge(item.item_id, status, reason)

    def acknowledge(self, item_id: str, status: str, reason: Any) -> None:
        """Stage a finished root's TERMINAL: the acknowledgement its next commit makes durable."""
        self.batch.terminal(item_id, status=status, reason=reason)
        self.acked += 1
        self.report.processed.append(item_id)
        if self.flush_due():
            self.flush()

    def run_fresh_leaf(self, src: SourceItem, replayed: bool) -> None:
        """:meth:`run_root` for an item with no state when the pipeline is one step (a process function).

        The same events in the same order as the general driver, without its per-item frame sets and
        dispatch: the profile of a no-op run showed them costing more than the item's log writes.
        """
        step, coord, _, _ = self.leaf_site
        iid = src.item_id
        if replayed:
            self.report.replayed.append(iid)
        ctx = ItemContext(iid, src.key, src.fingerprint, 1, NO_FIELDS, coord, NO_FIELDS)
        self.report.invocations += 1
        try:
            result = step.fn(src.data, ctx)
        except BaseException as exc:
            self.fail_leaf(src, exc, ctx.record.end())
            return
        self.finish_leaf(src, ctx, result)

    def run_fresh_leaf_guarded(self, src: SourceItem, replayed: bool) -> None:
        """:meth:`run_fresh_leaf` with a retry policy or a rate limit: the call goes through attempts.py."""
        step, coord, _, _ = self.leaf_site
        if replayed:
            self.report.replayed.append(src.item_id)
        item = self.bare_item(src)
        calls: list[ItemContext] = []
        try:
            result, ctx = call_step(self, item, step, coord, calls)
        except BaseException as exc:
            # the last attempt's usage goes with its FAILED row (an earlier one's went with its transient row)
            self.fail_leaf(item, exc, calls[-1].record.end() if calls else None)
            return
        self.finish_leaf(item, ctx, result)

    def fail_leaf(self, item: SourceItem | WorkItem, exc: BaseException, usage: list[Any] | None = None) -> None:
        """Stage the failure of the one-step pipeline's call for ``item``: a FAILED row; raises when it ends the run.

        ``usage`` is what the failed attempt recorded through ``ctx.record_usage``: its row stores it.
        """
        work = item if isinstance(item, WorkItem) else self.bare_item(item)
        # with a policy the row records the attempt that failed last (docs/adr/0008-in-place-retries.md)
        attempt = work.attempt if self.shared.retry is not None else None
        on_failure(self, work, StepFailure(work.item_id, self.leaf_site[1], exc, attempt, usage))

    def finish_leaf(self, item: SourceItem | WorkItem, ctx: ItemContext, result: Any) -> None:
        """Stage a finished call of the one-step pipeline's step and acknowledge ``item``: the one place for it.

        Its field deltas, STEP_COMPLETED and TERMINAL (completed, or filtered by the step), then the
        acknowledgement and a commit when one is due; a result that breaks the contract fails the item
        instead. Every driver of a one-step pipeline ends an item's call here: the sequential short
        path, its guarded variant and the async driver (aio.py).
        """
        _, coord, shape, done = self.leaf_site
        iid = item.item_id
        try:
            sets = self.checked_sets(iid, self.shared.pipeline, result, ctx)
        except BaseException as exc:
            self.fail_leaf(item, exc, ctx.record.end())
            return
        try:
            self._stage_leaf(iid, coord, shape, done, ctx, sets)
        except BaseException as exc:
            on_failure(self, item if isinstance(item, WorkItem) else self.bare_item(item), exc)
            return
        self.acked += 1
        self.report.processed.append(iid)
        if self.flush_due():
            self.flush()

    @cached_property
    def leaf_site(self) -> tuple[Step, StepCoord, Any, Any]:
        """The one step, its coordinates, and the shapes of its STEP_COMPLETED and of TERMINAL(completed)."""
        pipeline = self.shared.pipeline
        site = self.step_site(pipeline, None, None, None)
        done = self.shared.writer.shape(_TERMINAL, status=COMPLETED)
        return pipeline, site.coord, site.shape, done

    @staticmethod
    def bare_item(src: SourceItem) -> WorkItem:
        return WorkItem(src.item_id, src.key, src.data, src.fingerprint, None, {})

    def children_states(self, root_id: str) -> dict[str, ItemState]:
        """The folded states of a root's fan-out children in the log, primed into the writer."""
        shared = self.shared
        events = shared.log.subtree_copies(root_id)  # fencing needs every copy's epoch
        by_item: dict[str, list[Any]] = {}
        for ev in events:
            if ev.item_id != root_id:
                by_item.setdefault(ev.item_id, []).append(ev)
        states = {iid: fold_events(iid, evs, shared.log.load_blob) for iid, evs in by_item.items()}
        for iid, st in states.items():
            shared.writer.prime(
                iid, last_seq=st.last_seq, input_fingerprint=st.input_fingerprint, field_modes=st.field_modes
            )
        return states


def run_sequential(runner: Runner, jobs: RootJobs, tick: Callable[[], None]) -> None:
    """Drive ``jobs`` (a :class:`RootJobs`) one at a time on this thread: ``run_items`` with ``concurrency=1``.

    A budget is checked before each new root item (before a pull, too: a stop pulls nothing more);
    a fresh or restarted item of a one-step pipeline takes the short path (:meth:`Runner.run_fresh_leaf`).
    """
    shared = runner.shared
    stop = shared.stop_pulling
    one_step = type(shared.pipeline) is Step
    # no frames, no fan-out: the driver's short path (guarded by a retry policy or a rate limit)
    run_leaf = runner.run_fresh_leaf if not guarded(shared) else runner.run_fresh_leaf_guarded
    try:
        while stop is None or not stop():
            job = next(jobs, None)
            if job is None:
                return
            src, state, replayed, history, create = job
            if create:
                # a budget may stop the run before any item: each one's ITEM_CREATED is staged as it starts
                runner.stage_created(src)
            if state is None and one_step:
                run_leaf(src, replayed)
            else:
                runner.run_root(src, state, replayed=replayed, history=history)
            tick()
    except CHUNK_STOPS:
        # a clean stop (its failure is committed): the rest of the pull never starts, so it leaves the inbox
        runner.release(jobs.pulled_unstarted())
        runner.flush()
        raise
