"""What the main thread's runner and its item workers share for one run: :class:`RunShared`.

The main thread is the only writer of the log; workers (see threads.py) drive items into their own
buffers and reach everything else through this one object, never through a copy of the runner.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Coroutine
    from concurrent.futures import ThreadPoolExecutor

    from airflow_provider_datagen.core.events import StepCoord
    from airflow_provider_datagen.core.ledger.budget import RunUsage
    from airflow_provider_datagen.core.retry import RetryPolicy
    from airflow_provider_datagen.core.steps import Step
    from airflow_provider_datagen.core.store.batch import Batch
    from airflow_provider_datagen.core.store.log import CheckpointLog
    from airflow_provider_datagen.core.store.writer import LogWriter

#: Group commit defaults when ``checkpoint_every`` is None: ack every N items or T seconds.
DEFAULT_GROUP_ITEMS = 4096
DEFAULT_GROUP_SECONDS = 2.0


@dataclass(frozen=True)
class CommitPolicy:
    """When acknowledgements are committed (see docs/design.md, Resume: group commit)."""

    #: the count bound: acknowledge this many items per commit
    group: int
    #: ``checkpoint_every=1``: every step boundary is a checkpoint too
    per_step: bool
    #: default group commit: the next items run while an append is written and fsynced (an
    #: unacknowledged item is redone after a crash either way); an explicit ``checkpoint_every=N``
    #: asks for a cadence, so each of its commits lands before the run goes on
    pipelined: bool
    #: the time bound, in seconds
    interval: float

    @classmethod
    def of(cls, checkpoint_every: int | None, checkpoint_interval: float) -> CommitPolicy:
        return cls(
            group=checkpoint_every or DEFAULT_GROUP_ITEMS,
            per_step=checkpoint_every == 1,
            pipelined=checkpoint_every is None,
            interval=checkpoint_interval,
        )


class StepSite(NamedTuple):
    """What the interpreter needs for one step at one place in the graph, the same for every item."""

    coord: StepCoord
    frame: Any
    #: the enclosing path children of this step are run under
    path: str
    #: the STEP_COMPLETED shape ``Batch.step_completed`` would build for these coordinates
    shape: Any


class FlushRequest:
    """One worker's buffer of completed steps, waiting for the main thread to commit it."""

    __slots__ = ("batch", "done", "error")

    def __init__(self, batch: Batch) -> None:
        self.batch = batch
        self.done = threading.Event()
        self.error: BaseException | None = None


class Handoff:
    """How workers hand mid-item progress and finished items to the main thread, and what wakes it.

    The main thread waits for either a finished item or a flush request; ``close`` refuses further
    requests and returns the unserved ones, so no worker waits for a thread that stopped serving.
    """

    def __init__(self) -> None:
        self.wake = threading.Event()
        #: set when the run has ended (:meth:`close`): a worker's backoff wait ends early on it
        self.ended = threading.Event()
        self._lock = threading.Lock()
        self._requests: list[FlushRequest] = []
        #: what workers hand back about finished items (threads.py), taken all at once per wake-up
        self._finished: list[Any] = []
        #: the main thread waits on ``wake`` for finished items (:meth:`take_all`): only then does
        #: :meth:`finish` set it, so a busy main thread costs the workers no wake-up per item
        self._sleeping = False
        self._closed = False

    def finish(self, entry: Any) -> None:
        """A worker's finished item, for the main thread to acknowledge."""
        with self._lock:
            self._finished.append(entry)
            if not self._sleeping:
                return
            self._sleeping = False
        self.wake.set()

    def take_all(self) -> tuple[list[FlushRequest], list[Any]]:
        """Wait for flush requests or finished items; all of them posted since the last call."""
        while True:
            with self._lock:
                requests, self._requests = self._requests, []
                finished, self._finished = self._finished, []
                if requests or finished:
                    self._sleeping = False
                    return requests, finished
                # cleared under the lock: a finish() after this sees _sleeping and sets it again
                self._sleeping = True
                self.wake.clear()
            self.wake.wait()

    def post(self, request: FlushRequest) -> bool:
        with self._lock:
            if self._closed:
                return False
            self._requests.append(request)
        self.wake.set()
        return True

    def take(self) -> list[FlushRequest]:
        with self._lock:
            taken, self._requests = self._requests, []
        return taken

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> list[FlushRequest]:
        with self._lock:
            self._closed = True
            taken, self._requests = self._requests, []
        self.ended.set()
        return taken


@dataclass(eq=False)
class RunShared:
    """The run's configuration, caches and coordination, referenced by the runner and every worker.

    Caches are safe under the GIL: ``sites``/``names`` and the writer's shape caches only ever get a
    key set to an equal value (or cleared).
    """

    log: CheckpointLog
    writer: LogWriter
    pipeline: Step
    processor_version: str
    policy: CommitPolicy
    fail_fast: bool
    #: exception types that end the run instead of failing one item
    reraise: tuple[type[BaseException], ...]
    has_fanout: bool
    #: when the main thread last committed: a worker hands its progress over on the same time bound
    last_flush: float = field(default_factory=time.monotonic)
    #: (id(step), enclosing, iteration, selector) -> its StepSite
    sites: dict[tuple[int, str | None, int | None, str | None], StepSite] = field(default_factory=dict)
    #: id(step) -> the names of the step and its descendants
    names: dict[int, set[str]] = field(default_factory=dict)
    #: with concurrency: how workers hand their items' progress to the main thread
    handoff: Handoff = field(default_factory=Handoff)
    #: with concurrency and a fan-out: the pool a root's children run in, and the permits that keep
    #: the threads running user code at ``concurrency`` (a root waiting for its children holds none)
    child_pool: ThreadPoolExecutor | None = None
    permits: threading.Semaphore | None = None
    #: ``run_items(retry=...)``: leaf step calls are retried in place (attempts.py); None: no retry
    retry: RetryPolicy | None = None
    #: with a budget or a rate limit: the run's usage tally and charge (core/ledger); None: usage
    #: recorded through ctx is only staged with its attempt
    usage: RunUsage | None = None
    #: THE place a rate limiter's ``acquire()`` goes: called before every attempt of a leaf step call,
    #: the first included (attempts.py). None by default: a run without a limiter or a policy keeps the
    #: unguarded path, which does nothing of this per item.
    before_attempt: Callable[[], Any] | None = None
    #: the same for an async step's attempt, awaited on the event loop (the limiter's non-blocking acquire)
    before_attempt_async: Callable[[], Awaitable[Any]] | None = None
    #: with a rate limit: called with the wait an error asked for (Retry-After, a 429), retried or not,
    #: so every worker on the limit's key cools down
    on_throttled: Callable[[float], Any] | None = None
    #: a pipeline of several steps with async ones: runs an async step's coroutine on the run's event
    #: loop thread and returns its result (aio.py, ``LoopThread``); None: no async step, or a one-step
    #: async process (the async driver awaits it itself)
    bridge: Callable[[Coroutine[Any, Any, Any]], Any] | None = None
    #: a budget's check before a new root item starts (None: no check; see the usage ledger); it may
    #: read the log, so only the main thread calls it
    stop_pulling: Callable[[], bool] | None = None
    #: the same check without a log read, for the worker thread about to start an item: the budget as
    #: the run last saw it (``RunUsage.seen_reached``), so no item starts after that (threads.py)
    stop_starting: Callable[[], bool] | None = None
    #: this many items in a row failing with the same error stop the chunk (failures.py); None: never
    max_repeated_failures: int | None = None
    #: called by the main thread before each commit that acknowledges work (commit.py): the response
    #: store's write-behind flush, so a reply is stored before its item's step is acknowledged; None: none
    before_commit: Callable[[], Any] | None = None
