"""``run_items``: process every pending item of a source and record it in the log; touch nothing that is done.

A run first replays inbox items (from their rebuilt coordinates when the processor version
matches), then pulls restarted (demoted, edited) and fresh items into the inbox and drives them.
Acknowledged items are never invoked again (see docs/design.md, Resume).
"""

from __future__ import annotations

import dataclasses
import gc
import logging
from typing import TYPE_CHECKING, Any

from airflow_provider_datagen.core.ledger.budget import RunUsage
from airflow_provider_datagen.core.planner import REDO_NEVER, as_source, classify
from airflow_provider_datagen.core.ratelimit import open_limiter
from airflow_provider_datagen.core.response_session import (
    ResponseSession,
    activate,
    deactivate,
    uses_response_store,
)
from airflow_provider_datagen.core.runner.aio import LoopThread, run_async
from airflow_provider_datagen.core.runner.commit import chunks
from airflow_provider_datagen.core.runner.config import RUN_OPTIONS, RunConfig
from airflow_provider_datagen.core.runner.driver import Runner, run_sequential
from airflow_provider_datagen.core.runner.failures import DEFAULT_MAX_REPEATED_FAILURES
from airflow_provider_datagen.core.runner.interpreter import has_async, has_fanout
from airflow_provider_datagen.core.runner.jobs import RootJobs
from airflow_provider_datagen.core.runner.report import RunReport
from airflow_provider_datagen.core.runner.shared import DEFAULT_GROUP_SECONDS, RunShared
from airflow_provider_datagen.core.runner.threads import run_pulls_concurrently
from airflow_provider_datagen.core.steps import Step, as_pipeline

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator

    from airflow_provider_datagen.core.fold import ItemState
    from airflow_provider_datagen.core.ledger.budget import Budget
    from airflow_provider_datagen.core.planner import ResumePlan
    from airflow_provider_datagen.core.ratelimit import RateLimit
    from airflow_provider_datagen.core.retry import RetryPolicy
    from airflow_provider_datagen.core.sources import SourceItem
    from airflow_provider_datagen.core.store.log import CheckpointLog
    from airflow_provider_datagen.core.store.writer import LogWriter

logger = logging.getLogger(__name__)

#: inbox items are read back from the log this many at a time
_STATE_CHUNK = 1000


def run_items(
    log: CheckpointLog,
    items: Iterable[Any],
    process_or_pipeline: Any,
    *,
    key_field: str = "id",
    processor_version: str = "v1",
    writer_id: str = "w1",
    epoch: int = 1,
    checkpoint_every: int | None = None,
    fail_fast: bool = False,
    checkpoint_interval: float = DEFAULT_GROUP_SECONDS,
    airflow: dict[str, Any] | None = None,
    progress: Callable[[int, int], None] | None = None,
    reraise: tuple[type[BaseException], ...] = (),
    concurrency: int = 1,
    redo_completed: str = REDO_NEVER,
    retry: RetryPolicy | None = None,
    rate_limit: RateLimit | None = None,
    rate_limit_storage: str | None = None,
    budget_usd: float | None = None,
    budget_tokens: int | None = None,
    max_repeated_failures: int | None = DEFAULT_MAX_REPEATED_FAILURES,
) -> RunReport:
    """Process every pending item of ``items`` and record it in ``log``; touch nothing that is done.

    ``checkpoint_every=N`` acknowledges N items per commit (``1`` also checkpoints every step
    boundary), and each commit lands before the next item starts. None (the default) is group commit:
    :data:`DEFAULT_GROUP_ITEMS` items or ``checkpoint_interval`` seconds, whichever comes first, with
    each append pipelined (the next items run while it is written; a crash meanwhile only means those
    acknowledgements are redone). Either way every commit has landed when this returns or raises.
    ``reraise`` lists exception types that must end the run instead of failing one item (an
    orchestrator's timeout, say).

    ``concurrency=N`` (N > 1) runs the per-item work of every item in N threads: inbox replays
    (items resuming from their recorded steps, failed items retried) first, then restarted and fresh
    items, so I/O-bound calls that release the GIL (model or HTTP calls) overlap; the user's code must
    then be thread-safe. Results are the same as with ``concurrency=1``: one thread still reads the
    log and does every write and commit, acknowledging items as they finish; a thread hands its
    item's finished steps to that thread on the sequential cadence (each step with
    ``checkpoint_every=1``, else the time bound), so a crash loses no more of a long item than without
    threads. Fan-out children, at any depth, run in a second pool of threads, each into its own buffer
    merged in index order; permits keep the threads running user code at ``concurrency`` (an item
    waiting for its children holds none and runs those not yet started).

    An ``async def`` process (or an object whose ``__call__`` is async) runs on an event loop in this
    thread instead, up to ``concurrency`` calls in flight, with the same results; this thread stays the
    only writer and acknowledges each item as its call returns, and the process's signal handlers (an
    orchestrator's SIGTERM) run between acknowledgements. Async steps of a pipeline of several steps
    are awaited on a loop thread of the run by the sync drivers above (docs/adr/0010-async-processes.md).

    An error raised by the user's code fails that item (a FAILED row; a rerun retries it) and the run
    goes on. The process breaking its contract (returning something other than a dict or None,
    invalid field names, values that are not JSON-serializable, in its return value or through
    ``ctx.set``/``ctx.append``) fails the item the same way, but on 3 consecutive items it ends the
    run with :class:`~airflow_provider_datagen.exceptions.ProcessContractError` naming the function,
    the item and the fix: those items keep their FAILED rows, items not yet invoked stay pending, and
    no more calls are paid for. "Consecutive" is in acknowledgement order: with ``concurrency=N``
    items are acknowledged as they finish (items finishing together in submission order), and the
    items already running when the run ends are acknowledged before it raises.

    ``rate_limit=RateLimit(...)`` takes a start from the budget shared by every process and thread
    naming the same ``key`` before each call of a leaf step (each attempt counts as one request), kept
    under the log's root on this host, or in ``rate_limit_storage`` (a Redis URI) across hosts; an
    error carrying a Retry-After (a 429), retried or not, puts the key in a cooldown every worker honours (see
    docs/adr/0009-shared-rate-limits.md).

    ``max_repeated_failures=N`` (default 5; None: never) stops a systemic failure early: when N items
    in a row (acknowledgement order, as above) fail, after their retries, with the same error type and
    message (a wrong connection id, an unreachable server), the chunk starts no new item, acknowledges
    the items in flight and raises :class:`~airflow_provider_datagen.exceptions.RepeatedFailureError`
    naming the error and the count; the failed items keep their FAILED rows and the rest stays
    pending (``never_started``). Errors whose messages differ per item never stop it.

    ``retry=RetryPolicy(...)`` retries a leaf step's transient errors in place: up to ``attempts``
    calls per item in this run, waiting with exponential backoff (at least an error's Retry-After)
    in the calling thread. Each retried attempt is a FAILED row marked transient (the failure lens
    shows it; the item is not failed for it) and the next call sees ``ctx.attempt`` one higher; only
    when the attempts run out (or the error is not one of ``retry_on``) does the item fail as above.
    Selectors, fan-out callables and ``reduce`` are not retried (see
    :class:`~airflow_provider_datagen.core.RetryPolicy` and docs/adr/0008-in-place-retries.md).

    ``budget_usd=`` / ``budget_tokens=`` (positive, or None: no limit) stop the run on the usage
    ledger: once what the log holds (every writer's recorded usage) plus what this run recorded
    reaches either, no new item starts; items already started finish, nothing is marked failed, and
    the report says ``stopped_by_budget``. The rest stays pending for a run with a higher budget
    (see docs/adr/0011-usage-ledger.md for the bound on overshoot).

    ``redo_completed="other_version"`` regenerates items completed (or filtered) under another
    processor version; ``"never"`` (the default) keeps them (see :func:`~airflow_provider_datagen.core.plan_resume`).
    """
    # the keyword arguments, bundled and checked once (config.py); tests keep this signature and
    # RunConfig's fields the same names
    arguments = locals()
    config = RunConfig(**{name: arguments[name] for name in RUN_OPTIONS})
    return run_configured(log, items, process_or_pipeline, config)


def run_configured(log: CheckpointLog, items: Iterable[Any], process_or_pipeline: Any, config: RunConfig) -> RunReport:
    """:func:`run_items` with its arguments bundled and checked already (``config``)."""
    pipeline = as_pipeline(process_or_pipeline)
    source = as_source(items, config.key_field)
    writer = log.writer(
        config.writer_id, config.epoch, processor_version=config.processor_version, airflow=config.airflow
    )
    # this chunk's items alone: a mapped task never folds the whole log (there may be a thousand of them)
    states = log.states_of([s.item_id for s in source])
    plan = classify(source, states, config.processor_version, log.version, redo_completed=config.redo_completed)
    report = RunReport(skipped=list(plan.skip), plan=plan)
    wiring = _Wiring(log, writer, pipeline, config)
    runner = Runner(wiring.shared, report)
    by_id = {s.item_id: s for s in source}
    progress = _Progress(config.progress, len(plan.pending))
    # The profile of a no-op run showed a third of the time in generation-2 collections walking the
    # source items and plan already alive; frozen, the collector only looks at what the run allocates.
    gc.freeze()
    try:
        # 1. The inbox: items created and never acknowledged (failed ones too), resumed from their
        # coordinates; read from the log as they are taken.
        replays = _inbox(log, writer, plan.replay, by_id, report, progress.tick)
        # 2. Restarts (demoted cursors, edited inputs) and fresh items: pulled into the inbox first.
        restart = [*plan.demoted, *plan.invalidated, *plan.fresh]
        _drive(runner, wiring, (replays, restart, by_id, plan), config, progress.tick)
        runner.flush()
        writer.sync()  # every acknowledgement has landed before the report is returned
        log.mark_version()  # a new reader of a log rolled back behind this run refuses it
        meter = wiring.meter
        if meter is not None and meter.stopped is not None:
            report.stopped_by_budget = True
            logger.warning(
                "stopped by the budget (%s): %d items stay pending; raise budget_usd/budget_tokens and rerun",
                meter.stopped,
                progress.total - progress.done,
            )
    except BaseException:
        # Whatever ends the run (a timeout, fail_fast), a pipelined append in flight lands or fails
        # before we return: nothing may write to the log after run_items is gone.
        try:
            writer.sync()
        except Exception as exc:  # the run's own error is the one to raise
            logger.warning("a pipelined commit failed while the run was ending: %s", exc)
        raise
    finally:
        gc.unfreeze()
        wiring.close()
    return report


class _Progress:
    """The run's progress: items settled (processed, failed, skipped late) out of the plan's pending ones."""

    __slots__ = ("callback", "done", "total")

    def __init__(self, callback: Callable[[int, int], None] | None, total: int) -> None:
        self.callback = callback
        self.total = total
        self.done = 0

    def tick(self) -> None:
        self.done += 1
        if self.callback is not None:
            self.callback(self.done, self.total)


class _Wiring:
    """The run's shared state and what it opened for the run: the limiter, the steps' event loop, the meter.

    Built before the first item (the limiter and the budget are wired into :class:`RunShared` here);
    :meth:`close` releases what was opened once the run has ended.
    """

    def __init__(self, log: CheckpointLog, writer: LogWriter, pipeline: Step, config: RunConfig) -> None:
        retry = config.retry
        self.shared = shared = RunShared(
            log=log,
            writer=writer,
            pipeline=pipeline,
            processor_version=config.processor_version,
            policy=config.commit_policy(),
            fail_fast=config.fail_fast,
            reraise=config.reraise,
            has_fanout=has_fanout(pipeline),
            retry=retry,
            max_repeated_failures=config.max_repeated_failures,
        )
        self.limiter = limiter = None
        if config.rate_limit is not None:
            # a cooldown never outlasts the longest wait the run's policy retries (issue 24: bounded cooldowns)
            ceiling = None if retry is None else retry.max_backoff
            self.limiter = limiter = open_limiter(
                config.rate_limit, root=str(log.root), storage_uri=config.rate_limit_storage, max_cooldown=ceiling
            )
            shared.before_attempt = limiter.acquire
            shared.before_attempt_async = limiter.acquire_async
            shared.on_throttled = limiter.cooldown
        # an async process (one step) runs on an event loop (aio.py); async steps of a larger pipeline are
        # awaited on a loop thread of the run by the sync drivers
        self.one_step = one_step = type(pipeline) is Step
        self.async_process = one_step and pipeline.is_async
        self.steps_loop = LoopThread() if not one_step and has_async(pipeline) else None
        if self.steps_loop is not None:
            shared.bridge = self.steps_loop.call
        self.responses = None
        if uses_response_store(pipeline):
            # opened before any item runs: a bad store fails the run before any request and any write
            self.responses = ResponseSession.for_log(log)
            shared.before_commit = self.responses.flush
            activate(self.responses)
        self.meter = None
        budget = config.budget
        if budget.is_set or limiter is not None:
            # the run's usage tally (a budget) and the charge of recorded usage to the rate limit
            self.meter = shared.usage = RunUsage(log, (config.writer_id, config.epoch), budget, limiter=limiter)
            if budget.is_set:
                self._wire_budget(log, budget, self.meter)

    def _wire_budget(self, log: CheckpointLog, budget: Budget, meter: RunUsage) -> None:
        shared = self.shared
        log.set_budget(budget.usd, budget.tokens)
        shared.stop_pulling = meter.stop_pulling
        shared.stop_starting = meter.seen_reached

        def near() -> None:
            # close to the budget: each acknowledgement is committed at once (a time bound of 0)
            shared.policy = dataclasses.replace(shared.policy, interval=0.0)

        meter.on_near = near

    def close(self) -> None:
        if self.steps_loop is not None:
            self.steps_loop.close()
        if self.limiter is not None:
            self.limiter.close()
        if self.responses is not None:
            deactivate(self.responses)
            try:
                # every acknowledged reply was flushed before its commit: what is left answered no acknowledged step
                self.responses.close()
            except Exception as exc:
                logger.warning("the replies of unacknowledged work were not stored: %s", exc)


def _drive(
    runner: Runner,
    wiring: _Wiring,
    work: tuple[Iterator[tuple[SourceItem, ItemState]], list[str], dict[str, SourceItem], ResumePlan],
    config: RunConfig,
    tick: Callable[[], None],
) -> None:
    """Run the replays, then the restarted and fresh items, with the driver the process and ``concurrency`` ask for."""
    replays, restart, by_id, plan = work
    writer = runner.shared.writer
    if wiring.async_process:
        run_async(runner, writer, replays, restart, by_id, plan, config.concurrency, tick)
    elif config.concurrency > 1 and (plan.replay or restart):
        # both phases in one pool: the replays first, then the pulls, with no drain between
        run_pulls_concurrently(runner, writer, replays, restart, by_id, plan, config.concurrency, tick)
    else:
        # the pulls adapt to the run's time bound as it started (a budget's last stretch shortens the
        # commit interval, not the pull size's clock)
        jobs = RootJobs(runner, writer, replays, restart, by_id, plan, interval=config.group_interval)
        run_sequential(runner, jobs, tick)


def _inbox(
    log: CheckpointLog,
    writer: LogWriter,
    replay: list[str],
    by_id: dict[str, SourceItem],
    report: RunReport,
    tick: Callable[[], None],
) -> Iterator[tuple[SourceItem, ItemState]]:
    """The inbox items to resume, with their folded states, each primed into the writer as it is taken.

    States are read :data:`_STATE_CHUNK` at a time as the run consumes them, in the thread that owns
    the log; an item another writer acknowledged after our plan is skipped.
    """
    for chunk in chunks(replay, _STATE_CHUNK):
        for iid, st in log.item_states(chunk).items():
            if st.is_done and st.input_fingerprint == by_id[iid].fingerprint:
                # another writer acknowledged it after our plan: acknowledged work is never redone
                report.skipped.append(iid)
                tick()
                continue
            writer.prime(iid, last_seq=st.last_seq, input_fingerprint=st.input_fingerprint, field_modes=st.field_modes)
            yield by_id[iid], st
