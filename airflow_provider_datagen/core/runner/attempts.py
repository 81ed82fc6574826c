"""The guarded call of a leaf step's function: a rate limit, a retry policy, or an async step in a sync driver.

Only runs with one of them come here (the interpreter binds its guarded leaf at construction, the
one-step driver picks its guarded variant), so a run without any does no work for it. The first
attempt is a plain call: the rate limit's hook (``RunShared.before_attempt``; none for a process
that takes a slot per request itself, see :func:`takes_request_slots`), the call, and the
cooldown of an error carrying a Retry-After (``RunShared.on_throttled``, retried or not). Only a
failure the policy retries is handed to tenacity, which decides the waits and when to stop (see
docs/adr/0008-in-place-retries.md); each retried attempt becomes a transient FAILED row in the
interpreter's batch, then the call waits (in the calling thread, or on the event loop for an async
process: a wait blocks no other item) and runs again with a fresh context numbered one more
(``ctx.attempt``). Exhausted or not retryable, the last error raises, and the item fails as without
a policy. Nothing acknowledged is ever called again: a retry re-runs only this step, before any of its
events were staged.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import TYPE_CHECKING, Any, Protocol

from tenacity import DoAttempt, DoSleep

from airflow_provider_datagen.core.ledger.staging import requests_of, staged_entries
from airflow_provider_datagen.core.retry import failed_first, retry_after_of
from airflow_provider_datagen.core.runner.contract import is_contract_error
from airflow_provider_datagen.core.runner.signals import RunEnded

if TYPE_CHECKING:
    from collections.abc import Callable

    from tenacity import RetryCallState

    from airflow_provider_datagen.core.events import StepCoord
    from airflow_provider_datagen.core.retry import RetryPolicy
    from airflow_provider_datagen.core.runner.context import ItemContext, WorkItem
    from airflow_provider_datagen.core.runner.report import RunReport
    from airflow_provider_datagen.core.runner.shared import RunShared
    from airflow_provider_datagen.core.steps import Step
    from airflow_provider_datagen.core.store.batch import Batch


class Interpreter(Protocol):
    """What a call needs of the interpreter driving its item (:class:`.interpreter.Interpreter` is one).

    Typed here, not imported: the interpreter imports this module.
    """

    shared: RunShared
    report: RunReport
    batch: Batch
    prepaid_slots: int

    def new_context(self, item: WorkItem, coord: StepCoord) -> ItemContext: ...

    def flush_due(self) -> bool: ...

    def flush(self) -> None: ...


def _not_contract_error(exc: BaseException) -> bool:
    # the process breaking its contract is the same on every call: never retried
    return not is_contract_error(exc)


def _retried(policy: RetryPolicy | None, exc: BaseException) -> bool:
    """Whether ``exc`` of a first attempt goes to tenacity (the rest of the decisions are tenacity's)."""
    return policy is not None and policy.attempts > 1 and not is_contract_error(exc) and policy.retryable(exc)


def takes_request_slots(step: Step) -> bool:
    """Whether ``step``'s process takes a rate-limit slot per request itself (``takes_request_slots = True``).

    The model step sends several requests per call (validation retries, tool calls): it takes a slot
    for each as it sends it (``ctx.take_request_slot``), so the runner takes none before the attempt.
    """
    return getattr(step.fn, "takes_request_slots", False) is True


def _new_ctx(interp: Interpreter, item: WorkItem, coord: StepCoord, own_slots: bool) -> ItemContext:
    ctx = interp.new_context(item, coord)
    if own_slots:
        shared = interp.shared
        ctx.record.own_slots = True
        ctx.record.acquire = shared.before_attempt
        ctx.record.acquire_async = shared.before_attempt_async
    return ctx


def _throttle(shared: RunShared, exc: BaseException | None) -> None:
    """A failed attempt asked for a wait (a 429's Retry-After): the rate limit's key cools down for everyone."""
    throttled = shared.on_throttled
    if throttled is not None and exc is not None:
        after = retry_after_of(exc)
        if after is not None:
            throttled(after)


def _call(shared: RunShared, step: Step, item: WorkItem, ctx: ItemContext) -> Any:
    result = step.fn(item.data, ctx)
    if step.is_async:  # an async step in a sync driver: awaited on the run's event loop thread
        assert shared.bridge is not None
        result = shared.bridge(result)
    return result


def call_step(
    interp: Interpreter, item: WorkItem, step: Step, coord: StepCoord, calls: list[ItemContext] | None = None
) -> tuple[Any, ItemContext]:
    """Call ``step.fn`` for ``item``: the rate limit's hook, the call, and the retry policy on a failure.

    Returns the result and the context of the call that returned it; ``calls`` collects the context
    of every attempt (the last one's recorded usage goes with the item's FAILED row if it raises).
    """
    if calls is None:
        calls = []
    shared = interp.shared
    own = takes_request_slots(step)
    hook = None if own else shared.before_attempt
    if hook is not None:
        if interp.prepaid_slots:  # its thread took the slot before the budget check (threads.py)
            interp.prepaid_slots -= 1
        else:
            hook()
    ctx = _new_ctx(interp, item, coord, own)
    calls.append(ctx)
    interp.report.invocations += 1
    try:
        return _call(shared, step, item, ctx), ctx
    except BaseException as exc:
        _throttle(shared, exc)
        if not _retried(shared.retry, exc):
            raise
        first = exc
    return _retry(interp, item, step, coord, first, calls)


def _stage_transient(
    interp: Interpreter, item: WorkItem, coord: StepCoord, rs: RetryCallState, calls: list[ItemContext]
) -> None:
    """A retried attempt's transient FAILED row; the next call sees ``ctx.attempt`` one higher.

    The usage the attempt recorded is money spent: it is stored with this row, and taken off the
    attempt's context so nothing stages it twice.
    """
    assert rs.outcome is not None
    exc = rs.outcome.exception()
    assert exc is not None
    used = calls[-1].record.end() if calls else None
    if used:
        calls[-1].record.usage = None
    interp.batch.failed(
        item.item_id,
        error=exc,
        step=coord,
        attempt=item.attempt,
        transient=True,
        wait=rs.upcoming_sleep,
        usage=staged_entries(interp.shared, used) if used else None,
        requests=requests_of(used),
    )
    item.attempt += 1


def _retry(
    interp: Interpreter,
    item: WorkItem,
    step: Step,
    coord: StepCoord,
    first: BaseException,
    calls: list[ItemContext],
) -> tuple[Any, ItemContext]:
    """The attempts after a first one that failed with ``first``, driven by tenacity's ``Retrying``."""
    shared = interp.shared
    policy = shared.retry
    assert policy is not None
    handoff = shared.handoff
    own = takes_request_slots(step)
    hook = None if own else shared.before_attempt

    def before(_: RetryCallState) -> None:
        if hook is not None:  # the rate limit's place: every attempt (the first had it before the call)
            hook()

    def failed_attempt(rs: RetryCallState) -> None:
        _stage_transient(interp, item, coord, rs, calls)
        # made durable on the sequential cadence before the wait
        if shared.policy.per_step or interp.flush_due():
            interp.flush()

    def sleep(seconds: float) -> None:
        if policy.sleep is not None:
            policy.sleep(seconds)
        elif seconds > 0:
            # Event.wait, not time.sleep: a worker's wait ends when the run ends (an orchestrator's
            # signal still interrupts the main thread's wait, as it would a sleep).
            handoff.ended.wait(seconds)
        if handoff.closed:
            raise RunEnded("the run ended during a retry's backoff wait")  # never call user code after

    retrying = policy.retrying(sleep=sleep, before=before, before_sleep=failed_attempt, retry_also=_not_contract_error)
    rs = failed_first(retrying, first)
    report = interp.report
    while True:
        do = retrying.iter(rs)
        if isinstance(do, DoAttempt):
            ctx = _new_ctx(interp, item, coord, own)
            calls.append(ctx)
            report.invocations += 1
            try:
                rs.set_result((_call(shared, step, item, ctx), ctx))
            except BaseException as exc:
                _throttle(shared, exc)
                rs.set_exception((type(exc), exc, exc.__traceback__))
        elif isinstance(do, DoSleep):
            rs.prepare_for_next_attempt()
            retrying.sleep(do)
        else:
            return do


# --- async ----------------------------------------------------------------------------------------------


async def call_step_async(
    interp: Interpreter,
    item: WorkItem,
    step: Step,
    coord: StepCoord,
    flush: Callable[[], None],
    calls: list[ItemContext] | None = None,
) -> tuple[Any, ItemContext]:
    """:func:`call_step` for an async step on the event loop (aio.py); ``flush`` commits before a wait.

    The rate limit's hook is awaited (the limiter's non-blocking acquire) and the waits are
    ``asyncio.sleep`` (tenacity's ``AsyncRetrying``): a wait holds this item's place among the
    ``concurrency`` in flight but blocks no other item, and ends (cancelled) when the run ends.
    """
    if calls is None:
        calls = []
    shared = interp.shared
    own = takes_request_slots(step)
    hook = None if own else shared.before_attempt_async
    if hook is not None:
        if interp.prepaid_slots:  # the driver took the slot before the budget check (aio.py)
            interp.prepaid_slots -= 1
        else:
            await hook()
    ctx = _new_ctx(interp, item, coord, own)
    calls.append(ctx)
    interp.report.invocations += 1
    try:
        return await step.fn(item.data, ctx), ctx
    except BaseException as exc:
        _throttle(shared, exc)
        if not _retried(shared.retry, exc):
            raise
        first = exc
    return await _retry_async(interp, item, step, coord, first, flush, calls)


async def _retry_async(
    interp: Interpreter,
    item: WorkItem,
    step: Step,
    coord: StepCoord,
    first: BaseException,
    flush: Callable[[], None],
    calls: list[ItemContext],
) -> tuple[Any, ItemContext]:
    shared = interp.shared
    policy = shared.retry
    assert policy is not None
    own = takes_request_slots(step)
    hook = None if own else shared.before_attempt_async

    async def before(_: RetryCallState) -> None:
        if hook is not None:
            await hook()

    def failed_attempt(rs: RetryCallState) -> None:
        _stage_transient(interp, item, coord, rs, calls)
        if shared.policy.per_step or interp.flush_due():
            flush()

    async def sleep(seconds: float) -> None:
        if policy.sleep is not None:
            waited = policy.sleep(seconds)
            if inspect.isawaitable(waited):
                await waited
            else:
                await asyncio.sleep(0)
        elif seconds > 0:
            await asyncio.sleep(seconds)  # cancelled when the run ends: no user code is called after

    retrying = policy.async_retrying(
        sleep=sleep, before=before, before_sleep=failed_attempt, retry_also=_not_contract_error
    )
    rs = failed_first(retrying, first)
    report = interp.report
    while True:
        do = await retrying.iter(rs)
        if isinstance(do, DoAttempt):
            ctx = _new_ctx(interp, item, coord, own)
            calls.append(ctx)
            report.invocations += 1
            try:
                rs.set_result((await step.fn(item.data, ctx), ctx))
            except BaseException as exc:
                _throttle(shared, exc)
                rs.set_exception((type(exc), exc, exc.__traceback__))
        elif isinstance(do, DoSleep):
            rs.prepare_for_next_attempt()
            await retrying.sleep(do)  # type: ignore[misc]
        else:
            return do
