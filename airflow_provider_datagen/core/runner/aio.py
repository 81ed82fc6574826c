"""Async processes: ``run_items`` with an ``async def`` process on an event loop (see docs/adr/0010-async-processes.md).

A one-step pipeline whose function is async runs on an event loop in the calling thread, up to
``concurrency`` calls in flight: one worker coroutine per slot awaits an item's call (with its
retries), acknowledges the item through the same :meth:`Runner.finish_leaf` as the sequential path as
soon as the call returns, and starts the next item in the same step of the loop, so no slot (and no
connection) waits for another coroutine to wake. That thread stays the only writer of the log: the
pulls, acknowledgements and commits are synchronous between two awaits, so the batch holds whole
acknowledgements at every await, and items are acknowledged in the order their calls return. A commit
stalls the loop only while a previous pipelined append is still being written. A signal handler of the
process (an orchestrator's SIGTERM) runs in the driver coroutine, between acknowledgements, so its error
ends the run exactly where the thread driver's would.

A pipeline of several steps with async ones keeps the sync drivers: each async step's coroutine runs
on a :class:`LoopThread` of the run, which the calling thread waits for (``RunShared.bridge``).
"""

from __future__ import annotations

import asyncio
import inspect
import signal
import threading
from collections import deque
from typing import TYPE_CHECKING, Any

from airflow_provider_datagen.core.runner.attempts import call_step_async, takes_request_slots
from airflow_provider_datagen.core.runner.context import NO_FIELDS, ItemContext, WorkItem
from airflow_provider_datagen.core.runner.failures import CHUNK_STOPS
from airflow_provider_datagen.core.runner.interpreter import COMPLETED, guarded
from airflow_provider_datagen.core.runner.jobs import RootJob, RootJobs
from airflow_provider_datagen.core.runner.signals import RunEnded

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine, Iterable

    from airflow_provider_datagen.core.fold import ItemState
    from airflow_provider_datagen.core.planner import ResumePlan
    from airflow_provider_datagen.core.runner.driver import Runner
    from airflow_provider_datagen.core.sources import SourceItem
    from airflow_provider_datagen.core.store.writer import LogWriter
    from airflow_provider_datagen.exceptions import DatagenError

#: signals whose Python handler (an orchestrator's: it raises) is run by the driver, not inside a task
_HANDLED = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGALRM") if hasattr(signal, name))


class AsyncDriver:
    """Drives a one-step async process's root items on an event loop; the loop's thread writes the log.

    One worker coroutine per slot (up to ``concurrency``): it awaits an item's call, acknowledges the
    item as soon as the call returns and starts the next one at once, in the same step of the loop
    (no slot waits for the driver to wake). Everything between two awaits is synchronous on the
    loop's thread, so the log keeps one writer, the batch holds whole acknowledgements at every await
    and items are acknowledged in the order their calls return. The driver coroutine opens the slots,
    runs signal handlers between acknowledgements and raises what ends the run.
    """

    def __init__(self, runner: Runner, concurrency: int, tick: Callable[[], None]) -> None:
        self.runner = runner
        self.concurrency = concurrency
        self.tick = tick
        #: a commit that failed inside a task (a retry's transient row before its wait): ends the run
        self.fatal: BaseException | None = None
        self._wake: asyncio.Event | None = None
        self._signals: deque[int] = deque()
        #: what a worker raised outside its item's call (a pull, a commit, a reraise type), and
        #: whether it arrived between acknowledgements (while waiting for a rate-limit slot)
        self._error: tuple[BaseException, bool] | None = None
        #: the driver is ending the run: no worker acknowledges or starts anything more
        self._ending = False
        #: the first clean stop (fail_fast, a broken contract, a repeated error): raised at the end
        self._stopped: DatagenError | None = None
        #: no new item starts: the jobs ran out or a budget was reached
        self._exhausted = False

    def flush_from_task(self) -> None:
        """Commit from inside a task (same thread); a failure ends the run in the driver, not the item."""
        try:
            self.runner.flush()
        except BaseException as exc:
            if self.fatal is None:
                self.fatal = exc
            self._wake_driver()
            raise RunEnded("the run ended while committing this item's progress") from exc

    async def run(self, jobs: RootJobs) -> None:
        """Open up to ``concurrency`` slots; each worker acknowledges its items in the order their calls return."""
        runner = self.runner
        loop = asyncio.get_running_loop()
        wake = self._wake = asyncio.Event()
        workers: set[asyncio.Future[None]] = set()
        clean = False  # the batch holds whole acknowledgements only (the driver is between two of them)

        def exited(task: asyncio.Future[None]) -> None:
            workers.discard(task)
            exc = None if task.cancelled() else task.exception()
            # a worker catches what its items raise; KeyboardInterrupt and SystemExit left the loop already
            if exc is not None and not isinstance(exc, (KeyboardInterrupt, SystemExit)) and self._error is None:
                self._error = (exc, False)
            wake.set()

        originals = self._intercept_signals(loop)
        try:
            while True:
                if self._error is not None:
                    raise self._error[0]
                if self.fatal is not None:
                    raise self.fatal
                if self._signals:
                    clean = True
                    sig = self._signals.popleft()
                    handler = originals.get(sig)
                    if callable(handler):
                        handler(sig, inspect.currentframe())  # an orchestrator's handler raises: the run ends
                    clean = False
                    continue
                while len(workers) < self.concurrency and self._stopped is None and not self._exhausted:
                    worker = asyncio.ensure_future(self._work(jobs))
                    workers.add(worker)
                    worker.add_done_callback(exited)
                if not workers:
                    break
                wake.clear()
                clean = True
                await wake.wait()
                clean = False
        except BaseException:
            # A run-ending error (a reraise type, a signal's, a failed commit): items in flight are not
            # acknowledged (they replay next run) and are cancelled, so no user code runs after us.
            self._ending = True
            for running in workers:
                running.cancel()
            if self.fatal is None and (clean if self._error is None else self._error[1]):
                runner.flush()  # it arrived between acknowledgements: keep them, as run_root's handler does
            raise
        finally:
            self._restore_signals(loop, originals)
        if self._stopped is not None:
            runner.release(jobs.pulled_unstarted())  # a clean stop: the rest of the pull never starts
            runner.flush()
            raise self._stopped

    def _ended(self) -> bool:
        return self._ending or self._error is not None or self.fatal is not None

    def _wake_driver(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def _work(self, jobs: RootJobs) -> None:
        """One slot: start an item, await its call, acknowledge it, start the next; return when no more may start."""
        while True:
            try:
                call = await self._take(jobs)
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # a pull, its commit, a rate limit's storage: the run ends
                self._fail_run(exc, clean=False)
                return
            if call is None:
                return
            item, ctx, awaitable = call
            failure: BaseException | None = None
            result: Any = None
            try:
                result = await awaitable
            except (KeyboardInterrupt, SystemExit):
                raise  # they leave the loop at once, as from a task of their own (ADR 0010)
            except BaseException as exc:  # a CancelledError the call raised itself fails the item
                if self._ended() or _being_cancelled():
                    raise
                failure = exc
            if self._ended():
                return  # the run ends: this item is not acknowledged (it replays next run)
            if isinstance(failure, RunEnded):
                assert self.fatal is not None
                return
            try:
                self._settle(item, ctx, result, failure)
            except CHUNK_STOPS as err:
                # fail_fast, the contract broken once too often, a repeated error: start nothing more, but
                # acknowledge what is already running (its work is paid for), as threads do
                if self._stopped is None:
                    self._stopped = err
                self._wake_driver()
            except BaseException as exc:
                self._fail_run(exc, clean=False)
                return
            self.tick()

    def _fail_run(self, exc: BaseException, *, clean: bool) -> None:
        if self._error is None:
            self._error = (exc, clean)
        self._wake_driver()

    async def _take(self, jobs: RootJobs) -> tuple[SourceItem | WorkItem, ItemContext | list[ItemContext], Any] | None:
        """The next item's call, started (None: none may start now; the driver decides what follows)."""
        runner = self.runner
        shared = runner.shared
        stop_pulling = shared.stop_pulling
        step = runner.leaf_site[0]
        # A budget and a rate limit the runner takes: an item's slot is awaited before its budget
        # check, so an item that waited while the budget was reached does not start (threads.py too).
        prepay = shared.before_attempt_async if stop_pulling is not None and not takes_request_slots(step) else None
        while not (self._ended() or self._stopped is not None or self._exhausted or self._signals):
            if prepay is not None:
                try:
                    await prepay()
                except asyncio.CancelledError:
                    raise
                except BaseException as exc:  # between acknowledgements: the driver keeps them
                    self._fail_run(exc, clean=True)
                    return None
                if self._ended() or self._stopped is not None:
                    return None
            if stop_pulling is not None and stop_pulling():
                self._exhausted = True  # a budget ran out: items in flight finish, no new one starts
                return None
            job = next(jobs, None)
            if job is None:
                self._exhausted = True
                return None
            if prepay is not None:  # the item's call takes this slot (call_step_async)
                runner.prepaid_slots += 1
            call = self._start(job)
            if call is not None:
                return call
        return None

    def _start(self, job: RootJob) -> tuple[SourceItem | WorkItem, ItemContext | list[ItemContext], Any] | None:
        """Stage what starts ``job`` and make its call (None: acknowledged or failed without one)."""
        runner = self.runner
        report = runner.report
        step, coord, _, _ = runner.leaf_site
        plain = not guarded(runner.shared)
        src, state, replayed, _, create = job
        iid = src.item_id
        if replayed:
            report.replayed.append(iid)
        if create:
            runner.stage_created(src)  # a lazily pulled item: created as it starts
        item: SourceItem | WorkItem
        # the plain call's context, or the guarded call's contexts, one per attempt (the last one's
        # recorded usage goes with the item's FAILED row)
        ctx: ItemContext | list[ItemContext] = []
        if state is None:
            item = src if plain else runner.bare_item(src)
        else:
            # an inbox replay: the attempt numbers go on from the log (and a call that completed before
            # a crash, whose TERMINAL was lost, is only acknowledged, as the general driver would)
            item = WorkItem.start(iid, src.key, src.data, src.fingerprint, state, {})
            if runner.step_site(runner.shared.pipeline, None, None, None).frame in item.completed:
                runner.acknowledge(iid, COMPLETED, None)
                self.tick()
                return None
        try:
            if plain:
                if isinstance(item, WorkItem):
                    ctx = ItemContext(iid, item.key, item.fingerprint, item.attempt, item.fields, coord, item.modes)
                else:
                    ctx = ItemContext(iid, src.key, src.fingerprint, 1, NO_FIELDS, coord, NO_FIELDS)
                report.invocations += 1
                awaitable = step.fn(src.data, ctx)
            else:
                assert isinstance(item, WorkItem)
                assert isinstance(ctx, list)
                awaitable = call_step_async(runner, item, runner.shared.pipeline, coord, self.flush_from_task, ctx)
            if not asyncio.iscoroutine(awaitable):
                awaitable = asyncio.ensure_future(awaitable)  # another awaitable, or an error saying it is none
        except BaseException as exc:  # the call itself raised, or gave no awaitable
            runner.fail_leaf(item, exc, _usage_of(ctx))
            self.tick()
            return None
        return item, ctx, awaitable

    def _settle(
        self,
        item: SourceItem | WorkItem,
        ctx: ItemContext | list[ItemContext],
        result: Any,
        failure: BaseException | None,
    ) -> None:
        """Acknowledge an item whose call ended: its result through finish_leaf, or its failure."""
        runner = self.runner
        if failure is not None:
            runner.fail_leaf(item, failure, _usage_of(ctx))
            return
        if isinstance(ctx, list):  # the guarded call returns the context of the attempt that returned
            result, ctx = result
        assert isinstance(ctx, ItemContext)
        runner.finish_leaf(item, ctx, result)

    def _intercept_signals(self, loop: asyncio.AbstractEventLoop) -> dict[int, Any]:
        """Run the process's Python signal handlers in the driver, not wherever the loop happens to be.

        A handler raising inside a task would fail that one item, and inside a plain callback asyncio
        would log and drop its error: an orchestrator's SIGTERM must end the run, as it does with
        threads. Only handlers that are Python callables are taken over (the default and ignore
        dispositions are left alone); the originals are restored when the driver ends.
        """
        originals: dict[int, Any] = {}
        if threading.current_thread() is not threading.main_thread():
            return originals
        for sig in _HANDLED:
            handler = signal.getsignal(sig)
            if callable(handler):
                originals[sig] = handler
                loop.add_signal_handler(sig, self._on_signal, sig)
        return originals

    def _on_signal(self, sig: int) -> None:
        self._signals.append(sig)
        self._wake_driver()

    @staticmethod
    def _restore_signals(loop: asyncio.AbstractEventLoop, originals: dict[int, Any]) -> None:
        for sig, handler in originals.items():
            loop.remove_signal_handler(sig)
            signal.signal(sig, handler)


def run_async(
    runner: Runner,
    writer: LogWriter,
    replays: Iterable[tuple[SourceItem, ItemState]],
    restart: list[str],
    by_id: dict[str, SourceItem],
    plan: ResumePlan,
    concurrency: int,
    tick: Callable[[], None],
) -> None:
    """``run_items`` for a one-step async process: every item through :class:`AsyncDriver` on a new event loop."""
    driver = AsyncDriver(runner, concurrency, tick)
    run_coroutine(driver.run(RootJobs(runner, writer, replays, restart, by_id, plan)))


def run_coroutine(main: Coroutine[Any, Any, None]) -> None:
    """Run ``main`` on a new event loop in this thread; what is left of its tasks is cancelled after.

    Called from inside a running loop (a notebook), the loop runs in a helper thread instead, which
    is then the only writer while this thread waits.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        outcome: list[BaseException] = []

        def target() -> None:
            try:
                run_coroutine(main)
            except BaseException as exc:
                outcome.append(exc)

        helper = threading.Thread(target=target, name="datagen-loop")
        helper.start()
        helper.join()
        if outcome:
            raise outcome[0]
        return
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(main)
    finally:
        try:
            _cancel_all(loop)
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            loop.close()


def _cancel_all(loop: asyncio.AbstractEventLoop) -> None:
    tasks = asyncio.all_tasks(loop)
    if not tasks:
        return
    for task in tasks:
        task.cancel()
    loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))


class LoopThread:
    """An event loop in a thread of its own, for the async steps of a pipeline run by the sync drivers.

    :meth:`call` runs one step's coroutine on it and waits in the calling thread (the main thread, or
    an item's worker with ``concurrency``), so calls from many workers overlap on the one loop.
    """

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name="datagen-steps-loop", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def call(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Await ``coro`` on the loop and return its result (or raise its error) here."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # a signal or the end of the run in this thread: the step stops too
            raise

    def close(self) -> None:
        """Cancel what still runs on the loop, stop it and join its thread."""

        async def _shutdown() -> None:
            current = asyncio.current_task()
            rest = [t for t in asyncio.all_tasks() if t is not current]
            for t in rest:
                t.cancel()
            await asyncio.gather(*rest, return_exceptions=True)
            await self.loop.shutdown_asyncgens()

        if self.loop.is_running():
            asyncio.run_coroutine_threadsafe(_shutdown(), self.loop).result()
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


def _being_cancelled() -> bool:
    """Whether the running task (a worker) is being cancelled, rather than its call raising CancelledError."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _usage_of(ctx: ItemContext | list[ItemContext]) -> list[Any] | None:
    """The usage the last attempt recorded through ``ctx.record_usage`` (None: nothing, or no call)."""
    if isinstance(ctx, list):
        return ctx[-1].record.end() if ctx else None
    return ctx.record.end()
