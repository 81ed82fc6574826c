"""``run_items(concurrency=N)``: items driven in worker threads, the main thread the only writer.

Workers only drive an item into a private buffer; the main thread merges a finished item's buffer
into its batch and acknowledges it exactly as :meth:`Runner.run_root` does. A worker hands over its
item's finished steps mid-item when a sequential run would commit them, so a crash loses no more
of a long item than it would without threads. Fan-out children run in a second pool, each into its
own buffer merged in index order; permits keep the threads running user code at ``concurrency``.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING, Any, NamedTuple

from airflow_provider_datagen.core.runner.commit import MIN_PULL, pulls
from airflow_provider_datagen.core.runner.context import WorkItem, loaded_fields
from airflow_provider_datagen.core.runner.failures import on_failure
from airflow_provider_datagen.core.runner.interpreter import ChildJob, Interpreter
from airflow_provider_datagen.core.runner.report import RunReport
from airflow_provider_datagen.core.runner.shared import FlushRequest
from airflow_provider_datagen.core.runner.signals import RunEnded
from airflow_provider_datagen.core.schema import ItemStatus
from airflow_provider_datagen.exceptions import ItemFailedError, ProcessContractError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator

    from airflow_provider_datagen.core.fold import ItemState
    from airflow_provider_datagen.core.planner import ResumePlan
    from airflow_provider_datagen.core.runner.driver import Runner
    from airflow_provider_datagen.core.runner.shared import RunShared
    from airflow_provider_datagen.core.sources import SourceItem
    from airflow_provider_datagen.core.steps import Step
    from airflow_provider_datagen.core.store.writer import LogWriter

#: what ``ItemWorker.work`` returns: the item's (status, filter reason), or the exception it raised
ItemOutcome = tuple[tuple[str, Any] | None, BaseException | None]
#: what ``ItemWorker.work_child`` returns: the child's fields, or the exception it raised
ChildOutcome = tuple[dict[str, Any] | None, BaseException | None]


class RootJob(NamedTuple):
    """A root item for :func:`run_concurrent`: its source item and how :meth:`Runner.run_root` would take it."""

    src: SourceItem
    #: the folded state of an inbox replay (resumed from its recorded cursor), else None
    state: ItemState | None
    replayed: bool
    #: a restarted root with events in the log (its fan-out children are read before it runs)
    history: bool


class ItemWorker(Interpreter):
    """One item's driver on a worker thread: the run's shared state, its own batch, report and step count.

    The writer's item table is read here, and a fan-out primes its new children into it: a single
    key set, for ids no other item uses, whose events stay in this worker's buffer until the main
    thread merges and commits them (the main thread's commits replace values, never remove keys). A
    restarted root's existing children were looked up by the main thread before the item was
    submitted. Completed steps are handed to the main thread to commit on the sequential cadence
    (:meth:`flush`).
    """

    def __init__(self, shared: RunShared, known_children: set[str] | None = None) -> None:
        # known children are per root, as run_root clears them per root
        super().__init__(shared, RunReport(), known_children)

    def work(self, item: WorkItem) -> ItemOutcome:
        """Drive the item; the outcome or the exception, for the main thread to acknowledge."""
        permits = self.shared.permits
        if permits is not None:
            permits.acquire()
        try:
            return self._drive(item, self.shared.pipeline, None, None, None), None
        except BaseException as exc:
            return None, exc
        finally:
            if permits is not None:
                permits.release()

    def work_child(self, child: WorkItem, body: Step, path: str, created: dict[str, Any] | None) -> ChildOutcome:
        """Drive one fan-out child into this worker's buffer: its fields, or the exception."""
        assert self.shared.permits is not None
        with self.shared.permits:
            try:
                if created is not None:
                    self.batch.item_created(child.item_id, **created)
                status, reason = self._drive(child, body, path, None, None)
                self.batch.terminal(child.item_id, status=status, reason=reason)
                return dict(child.fields), None
            except BaseException as exc:
                return None, exc

    def _flush_due(self) -> bool:
        """At a step boundary, on the sequential run's cadence: ``checkpoint_every=1`` or the time bound.

        A fan-out child's worker hands over its own events too; what is left of them joins its
        root's buffer once the children are done.
        """
        shared = self.shared
        return bool(self.batch.events) and (
            (shared.policy.per_step and self.steps > 0)
            or time.monotonic() - shared.last_flush >= shared.policy.interval
        )

    def flush(self) -> None:
        """Hand the item's completed steps to the main thread, the only writer, and wait until it committed them.

        As in a sequential run, a long item's finished steps then survive a crash; the rest of the
        item goes on into a fresh buffer. If the run has ended meanwhile, the item stops here.
        """
        request = FlushRequest(self.batch)
        if not self.shared.handoff.post(request):
            raise RunEnded("the run ended before this item's progress could be committed")
        request.done.wait()
        if request.error is not None:
            raise RunEnded("the run ended while committing this item's progress") from request.error
        self.batch = self.new_batch()
        self.steps = 0

    def _children_in_pool(self) -> bool:
        return self.shared.child_pool is not None

    def _run_children(self, jobs: list[ChildJob], path: str, fields: list[dict[str, Any]]) -> None:
        """Run an item's fan-out children in the child pool; merge their buffers in index order.

        Each child gets its own worker and buffer, so the events are those of the sequential loop
        (every item numbers its own events). The waiting item gives its permit back, so the threads
        running user code stay at ``concurrency``, and runs the children no pool thread has started
        itself: a child waiting for its own children must never wait for a pool that such waiting
        children fill, so nested fan-outs run in parallel at any depth without a pool per depth. When
        children fail, the first in index order is raised, as the sequential loop would raise it; the
        buffers of every child are kept, so work that finished beside a failure is not redone on the
        rerun.
        """
        shared = self.shared
        pool, permits = shared.child_pool, shared.permits
        assert pool is not None and permits is not None
        ids = {job.child.item_id for job in jobs}
        if self.batch.touches_subtrees(ids):
            # A Loop runs this fan-out again: the last generation of these children (and theirs)
            # ended in this buffer. It must be committed before the new generation hands anything
            # over, or the two generations' events of one child id would be numbered out of order.
            self.flush()
        running = []
        for idx, child, body, created in jobs:
            # ids of one root: disjoint keys, GIL-atomic adds
            worker = ItemWorker(shared, self._known_children)
            job = (child, body, path, created)
            running.append((idx, worker, job, pool.submit(worker.work_child, *job)))
        permits.release()
        try:
            inline = {}
            # from the back: the pool's threads take the queue from the front
            for idx, worker, job, future in reversed(running):
                if future.cancel():  # also true when the run ended and its pools cancelled the queue
                    if shared.handoff.closed:  # never start user code after the run has ended
                        inline[idx] = (None, RunEnded("the run ended before this fan-out child started"))
                    else:
                        inline[idx] = worker.work_child(*job)
            outcomes = [
                (idx, worker, inline[idx] if idx in inline else future.result()) for idx, worker, _, future in running
            ]
        finally:
            permits.acquire()
        first: BaseException | None = None
        for idx, worker, (child_fields, exc) in outcomes:
            self.batch.extend(worker.batch)
            self.report.invocations += worker.report.invocations
            self.steps += worker.steps
            if exc is not None:
                first = first or exc
            else:
                assert child_fields is not None
                fields[idx] = child_fields
        if first is not None:
            raise first


def run_concurrent(
    runner: Runner,
    pool: ThreadPoolExecutor,
    concurrency: int,
    jobs: Iterable[RootJob],
    tick: Callable[[], None],
) -> None:
    """:meth:`Runner.run_root` for ``jobs``, up to ``concurrency`` at a time.

    Workers only drive an item into a private buffer; the runner's (main) thread stays the only
    writer: it merges a finished item's buffer into its batch and acknowledges it exactly as
    :meth:`Runner.run_root` does, then flushes, reports progress and submits the next item. A worker
    hands over its item's finished steps mid-item when a sequential run would commit them (its own
    ``flush``), and this thread commits them before anything else. An item that never finished has
    only its ITEM_CREATED and the steps handed over in the log, so it resumes from there next run.
    """
    shared = runner.shared
    todo: Iterator[RootJob] = iter(jobs)
    inflight: dict[Future[ItemOutcome], tuple[ItemWorker, WorkItem]] = {}
    order: dict[str, int] = {}
    stopped: ItemFailedError | ProcessContractError | None = None
    waiting = False
    handoff = shared.handoff

    def woken(_: Any) -> None:
        handoff.wake.set()

    try:
        while True:
            while stopped is None and len(inflight) < concurrency:
                if shared.stop_pulling is not None and shared.stop_pulling():
                    break  # a budget is reached: start nothing new, finish what runs
                job = next(todo, None)
                if job is None:
                    break
                src, state, replayed, history = job
                # A restarted or replayed root's children are read here, in the thread that owns the
                # log, as run_root reads them; a worker only primes the ids of children it creates.
                children = (
                    runner.children_states(src.item_id)
                    if shared.has_fanout and (history or (state is not None and state.status is ItemStatus.RUNNING))
                    else {}
                )
                if children:  # their blob-stored values too: a worker never reads the log
                    children = {cid: replace(st, fields=loaded_fields(st.fields)) for cid, st in children.items()}
                # a replayed root's recorded fields are loaded here too (WorkItem.start reads its blobs)
                item = WorkItem.start(src.item_id, src.key, src.data, src.fingerprint, state, children)
                if replayed:
                    runner.report.replayed.append(src.item_id)
                worker = ItemWorker(shared)
                order[item.item_id] = len(order)
                future = pool.submit(worker.work, item)
                inflight[future] = (worker, item)
                future.add_done_callback(woken)
            if not inflight:
                break
            waiting = True
            while True:
                handoff.wake.clear()
                # requests first: a worker posts one and waits, so its item cannot finish before it
                requests = handoff.take()
                done = [f for f in inflight if f.done()]
                if requests or done:
                    break
                handoff.wake.wait()
            waiting = False
            if requests:
                serve(runner, requests)
            # several can finish together: acknowledge them in submission order, not set order
            for fut in sorted(done, key=lambda f: order[inflight[f][1].item_id]):
                worker, item = inflight.pop(fut)
                outcome, exc = fut.result()  # work() returns every exception of the item's own
                runner.batch.extend(worker.batch)
                runner.report.invocations += worker.report.invocations
                runner.steps += worker.steps
                if exc is None:
                    assert outcome is not None
                    runner.acknowledge(item.item_id, outcome[0], outcome[1])
                else:
                    try:
                        on_failure(runner, item, exc)
                    except (ItemFailedError, ProcessContractError) as err:
                        # fail_fast, or the process broke its contract once too often: submit nothing
                        # more (pull nothing more), but acknowledge what is already running (its work
                        # is paid for) before raising the first such error, as sequential does
                        if stopped is None:
                            stopped = err
                tick()
    except BaseException as exc:
        # A run-ending error (a reraise type, an interrupt, a fencing error): items still in flight
        # are not acknowledged (they replay next run); their threads finish into buffers nobody reads
        # (the caller shuts the pool down without waiting), and a worker waiting for its progress
        # to be committed is told the run ended.
        for request in handoff.close():
            request.error = exc
            request.done.set()
        if waiting:
            # it arrived between items (an orchestrator's timeout lands in the main thread): the
            # batch holds whole acknowledgements only, so keep them, as run_root's handler does
            runner.flush()
        raise
    handoff.close()
    if stopped is not None:
        runner.flush()
        raise stopped


def serve(runner: Runner, requests: list[FlushRequest]) -> None:
    """Commit workers' mid-item progress (with any acknowledgements waiting), then let them go on."""
    try:
        for request in requests:
            runner.batch.extend(request.batch)
        runner.flush()
    except BaseException as exc:
        for request in requests:
            request.error = exc
        raise
    finally:
        for request in requests:
            request.done.set()


def run_pulls_concurrently(
    runner: Runner,
    writer: LogWriter,
    replays: Iterable[tuple[SourceItem, ItemState]],
    restart: list[str],
    by_id: dict[str, SourceItem],
    plan: ResumePlan,
    concurrency: int,
    tick: Callable[[], None],
) -> None:
    """``run_items`` with ``concurrency > 1``: the inbox replays, then the same pulls, all run by one thread pool.

    ``replays`` yields each inbox item to resume with its state (read and primed into the writer on
    this thread as it is consumed); the restarted and fresh items follow without a drain between.
    """
    shared = runner.shared
    replayed_restarts = set(plan.demoted)
    cap = max(shared.policy.group, MIN_PULL)

    def jobs() -> Iterator[RootJob]:
        # Consumed as threads free up: the first pull happens once the last replay is submitted, the
        # next pull once the previous pull's items are all submitted, while the last ones still run
        # (no idle tail), and each pull's inbox commit still precedes its own items' work.
        for src, state in replays:
            yield RootJob(src, state, True, False)
        if shared.policy.pipelined:
            runner.ack_bound = cap + 1  # as run_items' sequential path: each pull's acks commit with the next
        for chunk in pulls(restart, cap, shared.policy.interval):
            writer.prime_new(chunk, plan.last_seq)  # ids built and validated by prepare_items
            runner.pull([(by_id[iid], None) for iid in chunk])
            for iid in chunk:
                yield RootJob(by_id[iid], None, iid in replayed_restarts, iid in plan.last_seq)

    pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="datagen-item")
    if shared.has_fanout:
        # a second pool: children queued behind roots that wait for them would never run
        shared.child_pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="datagen-child")
        shared.permits = threading.Semaphore(concurrency)
    pools = [p for p in (pool, shared.child_pool) if p is not None]
    # The child pool and permits stay in the shared state after the run: a worker still finishing
    # when the run ended must find the pool it started with (shut down), never a sequential fallback.
    try:
        run_concurrent(runner, pool, concurrency, jobs(), tick)
    except BaseException:
        # in-flight items are not acknowledged (they replay next run); their threads end on their own
        for p in pools:
            p.shutdown(wait=False, cancel_futures=True)
        raise
    for p in pools:
        p.shutdown(wait=True)
