"""The main thread's commit policy: the inbox pull, group commit (every N items or T seconds), and flushing.

Pulling a group of items commits their ITEM_CREATED rows before any of them is processed (the
inbox); an item's field deltas, STEP_COMPLETED and TERMINAL are acknowledged together later. Group
commit bounds what a crash costs: only unacknowledged work is redone (see docs/design.md, Resume).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from airflow_provider_datagen.core.runner.failures import FailureStreak
from airflow_provider_datagen.core.runner.interpreter import Interpreter

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from airflow_provider_datagen.core.fold import ItemState
    from airflow_provider_datagen.core.runner.report import RunReport
    from airflow_provider_datagen.core.runner.shared import RunShared
    from airflow_provider_datagen.core.sources import SourceItem

logger = logging.getLogger(__name__)

#: Inbox pulls are at least this large, so per-item acks cost about one commit per item.
MIN_PULL = 64


class Committer(Interpreter):
    """An interpreter whose checkpoints are commits to the log: the main thread's, the only writer."""

    def __init__(self, shared: RunShared, report: RunReport) -> None:
        super().__init__(shared, report)
        #: acknowledgements (finished or failed items) in ``batch``
        self.acked = 0
        #: the count bound on acknowledgements: in pipelined pulls a pull holds at most ``group``
        #: items and commits the previous pull's acknowledgements with its inbox, so the pull is the
        #: count bound there and only the time bound flushes inside it
        self.ack_bound = shared.policy.group
        #: consecutive items that broke the process's contract (see contract.py)
        self.contract = FailureStreak()
        #: consecutive items that failed with the same error (``max_repeated_failures``, failures.py)
        self.repeats = FailureStreak()

    def flush(self) -> None:
        if len(self.batch):
            before = self.shared.before_commit
            if before is not None:
                before()  # the replies these acknowledgements used are stored first
            n = self.shared.writer.commit(self.batch, wait=not self.shared.policy.pipelined)
            self.report.commits += 1
            self.report.events += n
        self.batch = self.new_batch()
        self.acked = 0
        self.steps = 0
        self.shared.last_flush = time.monotonic()

    def maybe_flush(self, *, boundary: bool = False) -> None:
        if not self.batch.events:
            return
        shared = self.shared
        if (
            self.acked >= self.ack_bound
            or (boundary and shared.policy.per_step and self.steps)
            or time.monotonic() - shared.last_flush >= shared.policy.interval
        ):
            self.flush()

    def flush_due(self) -> bool:
        """:meth:`maybe_flush` at a step boundary, as a test: the per-item hot paths call it twice."""
        if not self.batch.events:
            return False
        shared = self.shared
        return (
            self.acked >= self.ack_bound
            or (shared.policy.per_step and self.steps > 0)
            or time.monotonic() - shared.last_flush >= shared.policy.interval
        )

    def pull_limit(self) -> int | None:
        """The most items the next pull may hold so that a stop for repeated failures ends at its last one.

        While items in a row are failing with the same error, ``max_repeated_failures`` minus that
        streak more such failures stop the chunk: a pull no larger leaves no item pulled (ITEM_CREATED,
        read as running) that never starts. None: no streak, no cap.
        """
        most = self.shared.max_repeated_failures
        if most is None:
            return None
        report = self.report
        streak = self.repeats.current(len(report.processed) + len(report.failed))
        return max(most - streak, 1) if streak else None

    def pull(self, items: list[tuple[SourceItem, ItemState | None]]) -> None:
        """The inbox: one commit of ITEM_CREATED rows before any of these items is processed."""
        if not items:
            return
        ids, fps = [src.item_id for src, _ in items], [src.fingerprint for src, _ in items]
        pv = self.shared.processor_version
        if self.shared.policy.pipelined:
            # The previous pull's acknowledgements ride in the same commit: one append per pull, and
            # the inbox never waits behind an acknowledgement still being written.
            self.batch.items_created(ids, fps, pv)
            self.flush()
            return
        self.flush()
        inbox = self.new_batch()
        inbox.items_created(ids, fps, pv)
        self.report.events += self.shared.writer.commit(inbox)
        self.report.commits += 1

    def release(self, item_ids: list[str]) -> None:
        """Stage the release of items this run pulled but a clean stop never started (jobs.py).

        Each one's generation holds only its ITEM_CREATED; a TERMINAL row with status
        ``never_started`` closes it, so the item reads ``never_started`` (not ``running``) and the
        next run pulls it as a fresh item, under a new ITEM_CREATED (docs/adr/0021).
        """
        for iid in item_ids:
            self.batch.released(iid)
        if item_ids:
            logger.info("released %d pulled items that the stop left unstarted (never_started)", len(item_ids))


def chunks(seq: list[str], n: int) -> Iterable[list[str]]:
    for i in range(0, len(seq), n):
        yield seq[i : i + n]


def pulls(
    seq: list[str], cap: int, interval: float, limit: Callable[[], int | None] | None = None
) -> Iterable[list[str]]:
    """Inbox groups that adapt to the item rate: start small, double while a group takes under half
    the checkpoint interval, halve when one takes longer than it.

    Fast processes get few, large pull commits; slow ones never mark thousands of items as in flight
    (running) long before they are processed, so the inbox a crash leaves stays small. ``limit()``,
    asked before each group, caps that group (None: no cap): the items a stop could leave pulled but
    never started (:meth:`Committer.pull_limit`).
    """
    size = min(MIN_PULL, cap)
    i = 0
    while i < len(seq):
        started = time.monotonic()
        most = limit() if limit is not None else None
        take = size if most is None else max(1, min(size, most))
        yield seq[i : i + take]
        i += take
        took = time.monotonic() - started
        if took < interval / 2:
            size = min(cap, size * 2)
        elif took > interval:
            size = max(min(MIN_PULL, cap), size // 2)
