"""The root items a run drives, in order: inbox replays, then restarted and fresh items, pull by pull.

One stream for the sequential, thread and async drivers (driver.py, threads.py, aio.py). A pull
commits its items' ITEM_CREATED rows before any of them is handed out (the durable inbox), so the
stream remembers which of the current pull's items it has not handed out yet: a clean stop (a
repeated failure, ``fail_fast``, a broken contract) releases those, and the queued items no driver
started, instead of leaving them ``running`` (:meth:`Committer.release`, docs/adr/0021).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from airflow_provider_datagen.core.runner.commit import MIN_PULL, pulls

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from airflow_provider_datagen.core.fold import ItemState
    from airflow_provider_datagen.core.planner import ResumePlan
    from airflow_provider_datagen.core.runner.commit import Committer
    from airflow_provider_datagen.core.sources import SourceItem
    from airflow_provider_datagen.core.store.writer import LogWriter


class RootJob(NamedTuple):
    """A root item to drive: its source item and how :meth:`Runner.run_root` would take it."""

    src: SourceItem
    #: the folded state of an inbox replay (resumed from its recorded cursor), else None
    state: ItemState | None
    replayed: bool
    #: a restarted root with events in the log (its fan-out children are read before it runs)
    history: bool
    #: pulled lazily (a budget may stop the run): its ITEM_CREATED is staged by whoever starts it
    create: bool = False

    @property
    def pulled(self) -> bool:
        """Its ITEM_CREATED was committed by this run's pull: a stop that never starts it releases it."""
        return self.state is None and not self.create


class RootJobs:
    """The inbox replays, then the restarted and fresh items, each pull committed as it is reached.

    Consumed as items start, by the sequential, thread and async drivers alike: the first pull
    happens once the last replay started, the next once the previous pull's items all started (no
    idle tail), and each pull's inbox commit precedes its items. ``interval`` is the time bound the
    pulls adapt to (None: the commit policy's when the pulls begin).
    """

    def __init__(
        self,
        runner: Committer,
        writer: LogWriter,
        replays: Iterable[tuple[SourceItem, ItemState]],
        restart: list[str],
        by_id: dict[str, SourceItem],
        plan: ResumePlan,
        *,
        interval: float | None = None,
    ) -> None:
        self._pull: list[str] = []  # the current pull's ids, committed as ITEM_CREATED
        self._out = 0  # how many of them were handed out
        self._jobs = self._stream(runner, writer, replays, restart, by_id, plan, interval)

    def __iter__(self) -> Iterator[RootJob]:
        return self

    def __next__(self) -> RootJob:
        return next(self._jobs)

    def pulled_unstarted(self) -> list[str]:
        """The current pull's items not handed out yet: their ITEM_CREATED is in the log, nothing else."""
        return self._pull[self._out :]

    def _stream(
        self,
        runner: Committer,
        writer: LogWriter,
        replays: Iterable[tuple[SourceItem, ItemState]],
        restart: list[str],
        by_id: dict[str, SourceItem],
        plan: ResumePlan,
        interval: float | None,
    ) -> Iterator[RootJob]:
        shared = runner.shared
        replayed_restarts = set(plan.demoted)
        cap = max(shared.policy.group, MIN_PULL)
        # a budget may stop the run before any item: each one's ITEM_CREATED is staged as it starts
        lazy = shared.stop_pulling is not None
        for src, state in replays:
            yield RootJob(src, state, True, False)
        if shared.policy.pipelined and not lazy:
            runner.ack_bound = cap + 1  # as run_items' sequential path: each pull's acks commit with the next
        if interval is None:
            interval = shared.policy.interval
        last_seq = plan.last_seq
        for chunk in pulls(restart, cap, interval, runner.pull_limit):
            writer.prime_new(chunk, last_seq)  # ids built and validated by prepare_items
            if not lazy:
                runner.pull([(by_id[iid], None) for iid in chunk])
                self._pull, self._out = chunk, 0
            for iid in chunk:
                if not lazy:
                    self._out += 1
                yield RootJob(by_id[iid], None, iid in replayed_restarts, iid in last_seq, lazy)
        self._pull, self._out = [], 0
