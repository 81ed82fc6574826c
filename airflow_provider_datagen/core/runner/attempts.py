"""The retried call of a leaf step's function: ``run_items(retry=...)`` (see docs/adr/0008-in-place-retries.md).

Only runs with a retry policy come here (the interpreter binds its retried leaf at construction), so
a run without one does no work for it. Each attempt gets a fresh context numbered one more than the
last (``ctx.attempt``); an attempt whose error the policy retries becomes a transient FAILED row in
the interpreter's batch, then the call waits (in the calling thread: a worker's wait blocks no other
item) and runs again. Exhausted or not retryable, the last error raises, and the item fails as
without a policy. Nothing acknowledged is ever called again: a retry re-runs only this step, before
any of its events were staged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_provider_datagen.core.ledger.staging import staged_entries
from airflow_provider_datagen.core.retry import retry_after_of
from airflow_provider_datagen.core.runner.contract import is_contract_error
from airflow_provider_datagen.core.runner.signals import RunEnded

if TYPE_CHECKING:
    from tenacity import RetryCallState

    from airflow_provider_datagen.core.events import StepCoord
    from airflow_provider_datagen.core.runner.context import ItemContext, WorkItem
    from airflow_provider_datagen.core.runner.interpreter import Interpreter
    from airflow_provider_datagen.core.steps import Step


def _not_contract_error(exc: BaseException) -> bool:
    # the process breaking its contract is the same on every call: never retried
    return not is_contract_error(exc)


def call_with_retry(
    interp: Interpreter, item: WorkItem, step: Step, coord: StepCoord, calls: list[ItemContext] | None = None
) -> tuple[Any, ItemContext]:
    """Call ``step.fn`` for ``item`` under the run's retry policy.

    Returns the result and the context of the call that returned it; ``calls`` collects the context
    of every attempt (the last one's recorded usage goes with the item's FAILED row if it raises).
    """
    if calls is None:
        calls = []
    shared = interp.shared
    policy = shared.retry
    assert policy is not None  # only bound when the run has a policy
    handoff = shared.handoff
    hook = shared.before_attempt
    throttled = shared.on_throttled

    def before(_: RetryCallState) -> None:
        # The rate limiter's place (RunShared.before_attempt): every attempt, the first included.
        if hook is not None:
            hook()

    def failed_attempt(rs: RetryCallState) -> None:
        """A retried attempt: its transient FAILED row, made durable on the sequential cadence before the wait."""
        assert rs.outcome is not None
        exc = rs.outcome.exception()
        assert exc is not None
        # the usage this attempt recorded: money spent, stored with its transient row (taken off
        # the context, so nothing stages it twice)
        used = calls[-1]._usage if calls else None
        if used:
            calls[-1]._usage = None
        if throttled is not None:
            after = retry_after_of(exc)
            if after is not None:
                throttled(after)
        interp.batch.failed(
            item.item_id,
            error=exc,
            step=coord.step,
            step_kind=coord.step_kind,
            enclosing_step=coord.enclosing_step,
            iteration=coord.iteration,
            fanout_index=coord.fanout_index,
            attempt=item.attempt,
            transient=True,
            wait=rs.upcoming_sleep,
            usage=staged_entries(shared, used) if used else None,
        )
        if shared.policy.per_step or interp._flush_due():
            interp.flush()
        item.attempt += 1

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
    report = interp.report
    for attempt in retrying:
        with attempt:
            ctx = interp._ctx(item, coord)
            calls.append(ctx)
            report.invocations += 1
            result = step.fn(item.data, ctx)
    return result, ctx
