"""What a failed item does to the run: a FAILED event and on, or the end of the run.

An item's own error fails that item (FAILED rows for it and, for a fan-out child, its root) and the
run goes on; ``fail_fast``, the ``reraise`` types, interrupts, anything outside ``Exception`` and
the process breaking its contract on consecutive items (contract.py) end the run once the
acknowledgements already staged are committed.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from airflow_provider_datagen.core.events import StepCoord
from airflow_provider_datagen.core.ledger.staging import requests_of, staged_entries
from airflow_provider_datagen.core.runner.contract import CONTRACT_STREAK, contract_abort, is_contract_error
from airflow_provider_datagen.core.runner.signals import StepFailure
from airflow_provider_datagen.exceptions import ItemFailedError, ProcessInterrupted

if TYPE_CHECKING:
    from airflow_provider_datagen.core.runner.commit import Committer
    from airflow_provider_datagen.core.runner.context import WorkItem

logger = logging.getLogger(__name__)


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
        step=where.step,
        step_kind=where.step_kind,
        enclosing_step=where.enclosing_step,
        iteration=where.iteration,
        fanout_index=where.fanout_index,
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
    report.errors[item.item_id] = f"{type(err).__name__}: {err}"
    logger.warning("item %s failed: %s: %s", item.item_id, type(err).__name__, err)
    if isinstance(err, (KeyboardInterrupt, SystemExit)):
        runner.flush()
        raise ProcessInterrupted(
            f"the process function raised {type(err).__name__} on item {item.item_id!r}; acknowledged "
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
    if shared.fail_fast:
        runner.flush()
        raise ItemFailedError(
            f"item {item.item_id!r} failed with {type(err).__name__}: {err} (fail_fast=True stopped the "
            "run; rerun to retry it)"
        ) from err
    runner.maybe_flush(boundary=True)
