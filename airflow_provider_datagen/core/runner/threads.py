"""``run_items(concurrency=N)``: items driven in worker threads, the main thread the only writer.

Workers only drive an item into a private buffer; the main thread merges a finished item's buffer
into its batch and acknowledges it exactly as :meth:`Runner.run_root` does. A worker hands over its
item's finished steps mid-item when a sequential run would commit them, so a crash loses no more
of a long item than it would without threads. Fan-out children run in a second pool, each into its
own buffer merged in index order; permits keep the threads running user code at ``concurrency``.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING, Any, NamedTuple

from airflow_provider_datagen.core.runner.attempts import takes_request_slots
from airflow_provider_datagen.core.runner.context import NO_FIELDS, ItemContext, WorkItem, loaded_fields
from airflow_provider_datagen.core.runner.failures import CHUNK_STOPS, on_failure
from airflow_provider_datagen.core.runner.interpreter import ChildJob, Interpreter, guarded
from airflow_provider_datagen.core.runner.jobs import RootJob, RootJobs
from airflow_provider_datagen.core.runner.report import RunReport
from airflow_provider_datagen.core.runner.shared import FlushRequest
from airflow_provider_datagen.core.runner.signals import RunEnded, StepFailure
from airflow_provider_datagen.core.schema import ItemStatus
from airflow_provider_datagen.core.steps import Step

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator

    from airflow_provider_datagen.core.events import StepCoord
    from airflow_provider_datagen.core.fold import ItemState
    from airflow_provider_datagen.core.planner import ResumePlan
    from airflow_provider_datagen.core.runner.driver import Runner
    from airflow_provider_datagen.core.runner.shared import RunShared
    from airflow_provider_datagen.core.sources import SourceItem
    from airflow_provider_datagen.core.store.batch import Batch
    from airflow_provider_datagen.core.store.writer import LogWriter
    from airflow_provider_datagen.exceptions import DatagenError

#: what ``ItemWorker.work`` returns: the item's (status, filter reason), or the exception it raised
ItemOutcome = tuple[tuple[str, Any] | None, BaseException | None]
#: an :data:`ItemOutcome` whose TERMINAL the worker staged itself (:meth:`ItemWorker.work_fresh_leaf`)
STAGED = ("staged", None)
#: an :data:`ItemOutcome` of an item its worker did not start: the budget was reached (it stays pending)
NOT_STARTED = ("not started", None)
#: what ``ItemWorker.work_child`` returns: the child's fields, or the exception it raised
ChildOutcome = tuple[dict[str, Any] | None, BaseException | None]


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

    def work_fresh_leaf(self, src: SourceItem, leaf: tuple[Step, StepCoord, Any, Any]) -> ItemOutcome:
        """:meth:`Runner.run_fresh_leaf` on a worker: the same events, the TERMINAL staged here too.

        A fresh item of a one-step pipeline (a process function) with no retry, which is most items
        of most runs: the general driver's frame sets and dispatch are skipped, as sequentially.
        Returns :data:`STAGED` when its TERMINAL is in the buffer, else the exception for
        :func:`on_failure` (wrapped as the sequential path wraps it).
        """
        step, coord, shape, done = leaf
        iid = src.item_id
        ctx = ItemContext(iid, src.key, src.fingerprint, 1, NO_FIELDS, coord, NO_FIELDS)
        self.report.invocations += 1
        try:
            result = step.fn(src.data, ctx)
            sets = self.checked_sets(iid, step, result, ctx)
        except BaseException as exc:
            return None, StepFailure(iid, coord, exc, usage=ctx.record.end())
        try:
            self._stage_leaf(iid, coord, shape, done, ctx, sets)
        except BaseException as exc:
            return None, exc
        return STAGED, None

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

    def flush_due(self) -> bool:
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
            worker = ItemWorker(shared, self.known_children)
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


class Queued(NamedTuple):
    """A root item queued for :class:`RootWorkers`."""

    #: its place in submission order
    order: int
    #: the item to drive, or None for a fresh item on the short path
    item: WorkItem | None
    src: SourceItem
    #: the worker that starts it stages its ITEM_CREATED (a lazily pulled item)
    create: bool
    #: its ITEM_CREATED was committed by this run's pull (:attr:`RootJob.pulled`)
    pulled: bool = False


class Finished(NamedTuple):
    """A root item a worker finished (or failed), handed to the main thread to acknowledge."""

    #: its place in submission order: items finishing together are acknowledged in it
    order: int
    #: the item driven by :meth:`ItemWorker.work`, or None for :meth:`ItemWorker.work_fresh_leaf`
    item: WorkItem | None
    src: SourceItem
    batch: Batch
    invocations: int
    steps: int
    outcome: ItemOutcome


class RootWorkers:
    """Up to ``concurrency`` long-lived threads that take root items from one queue.

    A thread keeps one :class:`ItemWorker` for every item it drives and gives each finished item back
    through :meth:`Handoff.finish`, where the main thread takes all finished items per wake-up. The
    profile of a pool with a future, a callback and a worker object per item (and the main thread
    scanning every future per wake-up) showed that coordination costing more than the item itself at
    high concurrency. The threads run in ``pool`` (its shutdown is the caller's, as before).
    """

    def __init__(self, runner: Runner, pool: ThreadPoolExecutor, concurrency: int) -> None:
        shared = runner.shared
        self.shared = shared
        self.pool = pool
        self.concurrency = concurrency
        #: a one-step pipeline with no retry, rate limit or bridge: fresh items take the short path,
        #: as run_items' loop does (a guarded call goes through attempts.py on the general driver)
        self.leaf = runner.leaf_site if type(shared.pipeline) is Step and not guarded(shared) else None
        self.jobs: queue.SimpleQueue[Queued | None] = queue.SimpleQueue()
        self.threads = 0
        #: cleared while a failed item waits for its acknowledgement: a failure may end the run
        #: (fail_fast, a contract streak, a reraise type), and until the main thread knows, no thread
        #: starts a queued item; so no more items run after the one that ends the run than without
        #: the queue (a thread starts its next item only once its own failure is acknowledged)
        self.go = threading.Event()
        self.go.set()
        self._held = 0
        self._stopping = False
        self._lock = threading.Lock()

    def submit(
        self, index: int, item: WorkItem | None, src: SourceItem, create: bool = False, pulled: bool = False
    ) -> None:
        """Queue a root item: ``item`` to drive, or None for a fresh item on the short path.

        ``create``: the worker that starts it stages its ITEM_CREATED (a lazily pulled item);
        ``pulled``: this run's pull committed its ITEM_CREATED.
        """
        self.jobs.put(Queued(index, item, src, create, pulled))
        if self.threads < self.concurrency:  # started as items come: a small run starts few threads
            self.pool.submit(self._loop)
            self.threads += 1

    def unstarted(self) -> list[Queued]:
        """Take back the queued items no thread has started: they stay pending (a lazily pulled one never started)."""
        taken: list[Queued] = []
        while True:
            try:
                job = self.jobs.get_nowait()
            except queue.Empty:
                return taken
            if job is not None:
                taken.append(job)

    def stop(self) -> None:
        """Let every thread end once it is idle (after :meth:`unstarted` or with nothing queued)."""
        for _ in range(self.threads):
            self.jobs.put(None)
        with self._lock:
            self._stopping = True
            self.go.set()  # a thread held by a failure takes its end from the queue

    def hold(self) -> None:
        """A worker's item failed: no thread starts another until the main thread acknowledged it."""
        with self._lock:
            if self._stopping:  # an item running on after the end: its thread must take its end
                return
            self._held += 1
            self.go.clear()

    def release(self) -> None:
        """The main thread acknowledged a failed item and the run goes on."""
        with self._lock:
            self._held -= 1
            if not self._held:
                self.go.set()

    def _loop(self) -> None:
        shared = self.shared
        handoff = shared.handoff
        worker = ItemWorker(shared)
        report = worker.report
        get, fanout, leaf, go = self.jobs.get, shared.has_fanout, self.leaf, self.go
        stop = shared.stop_starting
        # A budget and a rate limit the runner takes for a one-step process: the slot is waited for
        # before the budget check, so an item whose thread waited while the budget was reached does
        # not start (the wait may be seconds; the check after it is what bounds the overshoot).
        prepay = (
            shared.before_attempt
            if stop is not None and type(shared.pipeline) is Step and not takes_request_slots(shared.pipeline)
            else None
        )
        while True:
            if not go.is_set():
                go.wait()
            job = get()
            if job is None or handoff.closed:  # never start user code after the run has ended
                return
            index, item, src, create, _ = job
            created = False
            try:
                if prepay is not None:
                    prepay()
                    worker.prepaid_slots = 1
                if stop is not None and stop():
                    # the budget was reached since the item was queued: checked here, in the thread that
                    # would start it, so no item starts after the run has seen it (the main thread's
                    # check before queueing is up to 2 * concurrency items earlier)
                    handoff.finish(Finished(index, item, src, worker.batch, 0, 0, (NOT_STARTED, None)))
                    continue
                if create:
                    worker.stage_created(src)
                    created = True
                if item is None:
                    assert leaf is not None
                    outcome = worker.work_fresh_leaf(src, leaf)
                else:
                    if fanout:  # known children are per root, as run_root clears them per root
                        worker.known_children = set()
                    outcome = worker.work(item)
            except BaseException as exc:
                # handed back whatever it is, the rate limit's wait and the budget check included: a
                # thread that died here would leave the main thread waiting for this item forever
                if create and not created:
                    worker.stage_created(src)  # its FAILED row belongs to a generation
                outcome = (None, exc)
            worker.prepaid_slots = 0  # an item acknowledged without a call leaves its slot unused
            batch, worker.batch = worker.batch, worker.new_batch()
            if outcome[1] is not None:
                self.hold()
            handoff.finish(Finished(index, item, src, batch, report.invocations, worker.steps, outcome))
            report.invocations = worker.steps = 0


class MainThread:
    """The main thread's side of :func:`run_concurrent`: it queues root items and settles finished ones.

    It is the run's only writer: it merges a finished item's buffer into the runner's batch and
    acknowledges it as :meth:`Runner.run_root` does. Its counters say when to queue more
    (``outstanding``: queued or running) and whether a budget or a clean stop ended the queueing.
    """

    def __init__(self, runner: Runner, workers: RootWorkers, tick: Callable[[], None]) -> None:
        self.runner = runner
        self.workers = workers
        self.tick = tick
        self.short = workers.leaf is not None
        self.outstanding = 0
        self.submitted = 0
        #: the first clean stop (fail_fast, a broken contract, a repeated error): raised at the end
        self.stopped: DatagenError | None = None
        self.budget_reached = False
        #: pulled items a clean stop never started (Committer.release)
        self.released: list[str] = []

    def fill(self, todo: Iterator[RootJob], bound: int) -> None:
        """Queue items until ``bound`` are queued or running, the jobs end, or a stop or budget says no more."""
        runner = self.runner
        stop_pulling = runner.shared.stop_pulling
        while self.stopped is None and not self.budget_reached and self.outstanding < bound:
            if stop_pulling is not None and stop_pulling():
                # a budget is reached: start nothing new (the queued items stay pending), finish what runs
                self.reach_budget()
                return
            job = next(todo, None)
            if job is None:
                return
            if job.replayed:
                runner.report.replayed.append(job.src.item_id)
            item = self.root_item(job) if job.state is not None or not self.short else None
            self.workers.submit(self.submitted, item, job.src, job.create, job.pulled)
            self.submitted += 1
            self.outstanding += 1

    def root_item(self, job: RootJob) -> WorkItem:
        """The item a worker drives, with what only the log's thread may read (children, blob values)."""
        runner, src, state = self.runner, job.src, job.state
        # A restarted or replayed root's children are read here, in the thread that owns the log, as
        # run_root reads them; a worker only primes the ids of children it creates.
        children = (
            runner.children_states(src.item_id)
            if runner.shared.has_fanout and (job.history or (state is not None and state.status is ItemStatus.RUNNING))
            else {}
        )
        if children:  # their blob-stored values too: a worker never reads the log
            children = {cid: replace(st, fields=loaded_fields(st.fields)) for cid, st in children.items()}
        # a replayed root's recorded fields are loaded here too (WorkItem.start reads its blobs)
        return WorkItem.start(src.item_id, src.key, src.data, src.fingerprint, state, children)

    def reach_budget(self) -> None:
        """The budget is reached: start nothing new; the queued items stay pending."""
        self.budget_reached = True
        self.outstanding -= _unqueue(self.runner.report, self.workers.unstarted())

    def settle(self, done: Finished) -> None:
        """Acknowledge one finished (or failed, or unstarted) item, as the sequential driver would."""
        runner = self.runner
        index, item, src, batch, invocations, steps, (outcome, exc) = done
        self.outstanding -= 1
        if outcome is NOT_STARTED:
            # its worker saw the budget reached: start nothing new, finish what runs
            _unqueue(runner.report, [Queued(index, item, src, False)])
            if not self.budget_reached:
                self.reach_budget()
            return
        runner.batch.extend(batch)
        runner.report.invocations += invocations
        runner.steps += steps
        if outcome is STAGED:
            # the short path's TERMINAL is in its buffer: acknowledged as run_fresh_leaf does
            runner.acked += 1
            runner.report.processed.append(src.item_id)
            if runner.flush_due():
                runner.flush()
        elif exc is None:
            assert outcome is not None
            runner.acknowledge(src.item_id, outcome[0], outcome[1])
        else:
            try:
                on_failure(runner, item or runner.bare_item(src), exc)
            except CHUNK_STOPS as err:
                # fail_fast, the contract broken once too often, the same error repeated: start
                # nothing more (pull nothing more), but acknowledge what is already running (its work
                # is paid for) before raising the first such error, as sequential does
                if self.stopped is None:
                    self.stopped = err
                    left = self.workers.unstarted()
                    self.outstanding -= _unqueue(runner.report, left)
                    self.released += [q.src.item_id for q in left if q.pulled]
            if self.stopped is None:
                self.workers.release()
        self.tick()


def run_concurrent(
    runner: Runner,
    pool: ThreadPoolExecutor,
    concurrency: int,
    jobs: RootJobs,
    tick: Callable[[], None],
) -> None:
    """:meth:`Runner.run_root` for ``jobs``, up to ``concurrency`` at a time.

    Workers only drive an item into a private buffer; the runner's (main) thread stays the only
    writer (:class:`MainThread`): it merges finished items' buffers into its batch and acknowledges
    them exactly as :meth:`Runner.run_root` does, then flushes, reports progress and queues the next
    items. Up to ``concurrency`` more items than run wait queued (their ITEM_CREATED is committed
    already), so a thread that finishes starts its next item without waiting for this thread to
    acknowledge. A worker hands over its item's finished steps mid-item when a sequential run would
    commit them (its own ``flush``), and this thread commits them before anything else. An item that
    never finished has only its ITEM_CREATED and the steps handed over in the log, so it resumes from
    there next run; one a clean stop never started is released.
    """
    todo: Iterator[RootJob] = iter(jobs)
    workers = RootWorkers(runner, pool, concurrency)
    main = MainThread(runner, workers, tick)
    bound = 2 * concurrency  # queued or running: a thread that finishes finds its next item queued
    waiting = False
    handoff = runner.shared.handoff
    try:
        while True:
            main.fill(todo, bound)
            if not main.outstanding:
                break
            waiting = True
            # requests first: a worker posts one and waits, so its item cannot finish before it
            requests, finished = handoff.take_all()
            waiting = False
            if requests:
                serve(runner, requests)
            if len(finished) > 1:
                # several can finish together: acknowledge them in submission order, not set order
                finished.sort(key=_submission_order)
            for done in finished:
                main.settle(done)
    except BaseException as exc:
        # A run-ending error (a reraise type, an interrupt, a fencing error): items still in flight
        # are not acknowledged (they replay next run); their threads finish into buffers nobody reads
        # (the caller shuts the pool down without waiting), and a worker waiting for its progress
        # to be committed is told the run ended. Queued items never start.
        for request in handoff.close():
            request.error = exc
            request.done.set()
        _unqueue(runner.report, workers.unstarted())
        workers.stop()
        if waiting:
            # it arrived between items (an orchestrator's timeout lands in the main thread): the
            # batch holds whole acknowledgements only, so keep them, as run_root's handler does
            runner.flush()
        raise
    handoff.close()
    workers.stop()
    if main.stopped is not None:
        runner.release([*main.released, *jobs.pulled_unstarted()])
        runner.flush()
        raise main.stopped


def _submission_order(finished: Finished) -> int:
    return finished.order


def _unqueue(report: RunReport, jobs: list[Queued]) -> int:
    """Forget queued items that will not start: a replayed one is not reported as replayed."""
    if jobs:
        gone = {job.src.item_id for job in jobs}
        report.replayed[:] = [iid for iid in report.replayed if iid not in gone]
    return len(jobs)


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
    pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="datagen-item")
    if shared.has_fanout:
        # a second pool: children queued behind roots that wait for them would never run
        shared.child_pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="datagen-child")
        shared.permits = threading.Semaphore(concurrency)
    pools = [p for p in (pool, shared.child_pool) if p is not None]
    # The child pool and permits stay in the shared state after the run: a worker still finishing
    # when the run ended must find the pool it started with (shut down), never a sequential fallback.
    try:
        run_concurrent(runner, pool, concurrency, RootJobs(runner, writer, replays, restart, by_id, plan), tick)
    except BaseException:
        # in-flight items are not acknowledged (they replay next run); their threads end on their own
        for p in pools:
            p.shutdown(wait=False, cancel_futures=True)
        raise
    for p in pools:
        p.shutdown(wait=True)
