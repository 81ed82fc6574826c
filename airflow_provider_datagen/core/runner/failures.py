"""What a failed item does to the run: a FAILED event and on, or the end of the run.

An item's own error fails that item (FAILED rows for it and, for a fan-out child, its root) and the
run goes on; ``fail_fast``, the ``reraise`` types, interrupts, anything outside ``Exception``, the
process breaking its contract on consecutive items (contract.py) and ``max_repeated_failures`` items
in a row failing with the same error end the run once the acknowledgements already staged are
committed. The errors in :data:`CHUNK_STOPS` stop the chunk cleanly: the drivers start no new item,
acknowledge the items in flight, then raise the first of them. The user's error is formatted
through core/error_text.py everywhere here: its own ``__str__`` may raise.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

from airflow_provider_datagen.core.error_text import describe_error, error_message, error_type
from airflow_provider_datagen.core.events import StepCoord
from airflow_provider_datagen.core.ledger.staging import requests_of, staged_entries
from airflow_provider_datagen.core.runner.contract import CONTRACT_STREAK, contract_abort, is_contract_error
from airflow_provider_datagen.core.runner.signals import StepFailure
from airflow_provider_datagen.exceptions import (
    ItemFailedError,
    ProcessContractError,
    ProcessInterrupted,
    RepeatedFailureError,
)

if TYPE_CHECKING:
    from airflow_provider_datagen.core.runner.context import WorkItem
    from airflow_provider_datagen.core.runner.report import RunReport
    from airflow_provider_datagen.core.runner.shared import RunShared
    from airflow_provider_datagen.core.store.batch import Batch

logger = logging.getLogger(__name__)

#: the errors that stop a chunk cleanly: no new item starts, the items in flight are acknowledged
#: first (threads.py, aio.py), then the first of them is raised
CHUNK_STOPS = (ItemFailedError, ProcessContractError, RepeatedFailureError)
#: ``run_items(max_repeated_failures=...)``'s default
DEFAULT_MAX_REPEATED_FAILURES = 5


class FailureStreak:
    """Counts consecutive failures with the same key in acknowledgement order, with no work for items that pass.

    ``acks`` is how many items the run has acknowledged (finished or failed) before this one: when it
    is exactly one past the last counted failure's, nothing was acknowledged in between. Under
    ``concurrency`` items are acknowledged in completion order (items finishing together in
    submission order), so that is the order "consecutive" means there.
    """

    __slots__ = ("at", "count", "key")

    def __init__(self) -> None:
        self.count = 0
        self.at = -1
        self.key: object = None

    def add(self, acks: int, key: object = None) -> int:
        """Count a failure keyed ``key`` acknowledged after ``acks`` others; the length of the streak."""
        self.count = self.count + 1 if acks == self.at and key == self.key else 1
        self.at = acks + 1
        self.key = key
        return self.count

    def current(self, acks: int) -> int:
        """The streak's length if the next acknowledgement (after ``acks``) continues it, else 0."""
        return self.count if acks == self.at else 0


def repeated_abort(count: int, item_id: str, err: BaseException) -> RepeatedFailureError:
    """The error that ends a chunk whose last ``count`` items failed with the same error."""
    return RepeatedFailureError(
        f"{count} items in a row failed with the same error, {describe_error(err)} (the last item {item_id!r}, "
        "after its retries): a systemic failure (a wrong connection id, an unreachable server, a bad credential or "
        f"setting) fails every item, so the chunk stopped after {count} (max_repeated_failures={count}) so that no "
        "more calls are paid for; no new item started, and the items not yet processed stay pending. Fix the cause "
        "and rerun (clear the task): the failed items are retried and the rest runs. To go on past such failures, "
        "raise max_repeated_failures or pass None"
    )


class Committer(Protocol):
    """What a failure needs of the runner that commits it (:class:`.commit.Committer` is one).

    Typed here, not imported: the committer imports this module.
    """

    shared: RunShared
    report: RunReport
    batch: Batch
    acked: int
    contract: FailureStreak
    repeats: FailureStreak

    def flush(self) -> None: ...

    def maybe_flush(self, *, boundary: bool = False) -> None: ...


def on_failure(runner: Committer, item: WorkItem, exc: BaseException) -> None:
    """Record ``item``'s failure in ``runner``'s batch; raise if it ends the run."""
    err = exc.__cause__ if isinstance(exc, StepFailure) and exc.__cause__ is not None else exc
    shared = runner.shared
    if shared.reraise and isinstance(err, shared.reraise):
        # An orchestrator's timeout or kill must end the run, not fail one item and go on.
        runner.flush()
        raise err
    where = exc.coord if isinstance(exc, StepFailure) else StepCoord()
    failed_id = exc.item_id if isinstance(exc, StepFailure) else item.item_id
    attempt = exc.attempt if isinstance(exc, StepFailure) else None
    used = exc.usage if isinstance(exc, StepFailure) else None
    runner.batch.failed(
        failed_id,
        error=err,
        step=where,
        attempt=attempt if attempt is not None or not used else item.attempt,
        # the usage the failed attempt recorded: it counts (money was spent), shown apart
        usage=staged_entries(shared, used) if used else None,
        requests=requests_of(used),
    )
    if failed_id != item.item_id:
        # A child's failure also fails its root, so the root's failure lens tells the story.
        runner.batch.failed(item.item_id, error=err, step=where.step)
    runner.acked += 1  # a failed attempt leaves the group too: checkpoint_every counts it
    report = runner.report
    # the items acknowledged before this one: a contract error's streak is broken by any of them
    acks = len(report.processed) + len(report.failed)
    report.failed.append(item.item_id)
    described = report.errors[item.item_id] = describe_error(err)
    logger.warning("item %s failed: %s", item.item_id, described)
    if isinstance(err, (KeyboardInterrupt, SystemExit)):
        runner.flush()
        raise ProcessInterrupted(
            f"the process function raised {error_type(err)} on item {item.item_id!r}; acknowledged "
            "items were kept and the item stays pending for the next run"
        ) from err
    if not isinstance(err, Exception):
        # Anything else outside Exception (an orchestrator's task timeout, say) ends the run: it is
        # not the item's fault, and swallowing it would defeat the timeout.
        runner.flush()
        raise err
    if is_contract_error(err) and runner.contract.add(acks) >= CONTRACT_STREAK:
        runner.flush()
        raise contract_abort(shared.pipeline, where.step, failed_id, err) from err
    most = shared.max_repeated_failures
    if most is not None:
        # the same type and message: an error naming its item (a per-item message) never repeats
        key = (type(err), error_message(err))
        if runner.repeats.add(acks, key) >= most:
            runner.flush()
            raise repeated_abort(most, item.item_id, err) from err
    if shared.fail_fast:
        runner.flush()
        raise ItemFailedError(
            f"item {item.item_id!r} failed with {described} (fail_fast=True stopped the run; rerun to retry it)"
        ) from err
    runner.maybe_flush(boundary=True)
