"""A run's budget (``budget_usd``/``budget_tokens``) and its own usage tally: :class:`RunUsage`.

Spend is what the log holds from every other writer plus everything this run has recorded, committed
or not: the log's part is re-read at most every :data:`REFRESH_SECONDS` (each read is one filtered
scan of the usage rows), this run's part is counted as its attempts stage their usage, so no usage
is ever counted twice or missed by the commit lag of this run. When spend reaches the budget the run
starts no new root item; items already started finish. The bound on overshoot is in
docs/adr/0011-usage-ledger.md.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from airflow_provider_datagen.core.fold.usage import NANOS
from airflow_provider_datagen.exceptions import bad_argument

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from airflow_provider_datagen.core.ledger.records import UsageRecord

logger = logging.getLogger(__name__)


class SpendSource(Protocol):
    """What a budget reads of the event log (``CheckpointLog`` is one): typed here so the money
    domain does not import the store."""

    def usage_spend(self, *, exclude_writer: tuple[str, int] | None = None) -> tuple[int, int]: ...


#: how often (seconds) a run re-reads the other writers' spend from the log while it has a budget
REFRESH_SECONDS = 0.5
#: a run with a budget commits at least this often (seconds), so other tasks see its spend soon
COMMIT_SECONDS = 0.5
#: past this share of the budget a run re-reads the log before each item and commits each item
NEAR = 0.8
#: a read of the log's spend waits at least this many times as long as the last one took
READ_SHARE = 10


def to_nanos(usd: float | None) -> int:
    return 0 if usd is None else round(usd * NANOS)


def check_budget(owner: object, param: str, value: Any) -> float | int | None:
    """``budget_usd`` (a positive number) or ``budget_tokens`` (a positive int), or None: no budget."""
    if value is None:
        return None
    if param == "budget_tokens":
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise bad_argument(owner, param, value, "is not a positive int", "give the most tokens to spend, or None")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise bad_argument(owner, param, value, "is not a positive number", "give the most USD to spend, or None")
    return float(value)


class Budget(NamedTuple):
    """The most a run may spend: USD and/or tokens (input + output); None is no limit."""

    usd: float | None = None
    tokens: int | None = None

    @classmethod
    def of(cls, owner: object, budget_usd: Any, budget_tokens: Any) -> Budget:
        usd = check_budget(owner, "budget_usd", budget_usd)
        tokens = check_budget(owner, "budget_tokens", budget_tokens)
        return cls(usd, None if tokens is None else int(tokens))

    @property
    def is_set(self) -> bool:
        return self.usd is not None or self.tokens is not None

    def as_dict(self) -> dict[str, Any]:
        return {"budget_usd": self.usd, "budget_tokens": self.tokens}

    def share(self, cost_nanos: int, tokens: int) -> float:
        """How much of this budget spend of ``cost_nanos`` and ``tokens`` is (1.0: all of it)."""
        parts = [0.0]
        if self.usd is not None:
            parts.append(cost_nanos / max(to_nanos(self.usd), 1))
        if self.tokens is not None:
            parts.append(tokens / self.tokens)
        return max(parts)

    def reached(self, cost_nanos: int, tokens: int) -> str | None:
        """Why spend of ``cost_nanos`` and ``tokens`` has reached this budget, or None."""
        if self.usd is not None and cost_nanos >= to_nanos(self.usd):
            return f"spent ${cost_nanos / NANOS:.6f} of a budget_usd of ${self.usd:.6f}"
        if self.tokens is not None and tokens >= self.tokens:
            return f"spent {tokens} tokens of a budget_tokens of {self.tokens}"
        return None


def budget_reached(log: SpendSource, budget: Budget) -> str | None:
    """Why what ``log`` holds has reached ``budget``, or None (always None without a budget)."""
    return budget.reached(*log.usage_spend()) if budget.is_set else None


class RunUsage:
    """One run's usage: its tally, its budget check before each new root item, its rate limit's charge.

    Only runs with a budget or a token rate limit build one; without it no attempt does any work for
    usage beyond staging what ``ctx.record_usage`` recorded.
    """

    def __init__(
        self,
        log: SpendSource,
        writer: tuple[str, int],
        budget: Budget,
        *,
        limiter: Any = None,
        refresh_seconds: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.log = log
        self.writer = writer
        self.budget = budget
        self._limiter = limiter
        self._charges_tokens = limiter is not None and bool(limiter.rate_limit.tokens_per_minute)
        # read at construction, not bound at definition: a test or a bench sets the module's value
        self.refresh_seconds = REFRESH_SECONDS if refresh_seconds is None else refresh_seconds
        self._clock = clock
        self._lock = threading.Lock()
        #: this run's own recorded usage (every attempt's, committed or not)
        self.cost_nanos = 0
        self.tokens = 0
        #: the other writers' spend in the log at the last read, and when that was
        self._others = (0, 0)
        self._read_at: float | None = None
        self._next_read = 0.0
        #: what this writer id and epoch had already written before this run (a library caller may
        #: run twice as one writer): counted with the others, since this run's tally lacks it
        self._before: tuple[int, int] | None = None
        #: why the budget stopped the run, once it has
        self.stopped: str | None = None
        #: called once when spend passes :data:`NEAR` of the budget (run_items: commit every item)
        self.on_near: Callable[[], None] | None = None
        self._near = False

    # --- the tally: called where an attempt's usage is staged ------------------------------------

    def add(self, records: Iterable[UsageRecord]) -> None:
        cost = tokens = 0
        for r in records:
            if r.reused:  # answered from the response store: nothing was spent
                continue
            cost += to_nanos(r.cost_usd)
            tokens += r.tokens
        with self._lock:
            self.cost_nanos += cost
            self.tokens += tokens

    # --- the rate limit: called by ctx.record_usage as usage becomes known ------------------------

    @property
    def charges(self) -> bool:
        """Whether ``ctx.record_usage`` must call :meth:`charge` (a rate limit is set)."""
        return self._limiter is not None

    def charge(self, record: UsageRecord, *, extra_requests: bool = True) -> None:
        """Charge a record's tokens to the token window and, with ``extra_requests``, its calls beyond the first.

        ``tokens_per_minute`` is charged per request, as its usage becomes known. For a process the
        runner takes one slot for before each attempt, the other calls (``calls=N``) were made
        already, so they are charged without waiting (an async process's event loop never blocks
        here) and the limiter's next start pays what did not fit. A process that takes a slot per
        request itself (``ctx.take_request_slot``) passes ``extra_requests=False``: its calls were
        all taken as slots when they were sent.
        """
        limiter = self._limiter
        if limiter is None:
            return
        if self._charges_tokens and record.tokens:
            limiter.charge_tokens(record.tokens)
        if extra_requests and record.calls > 1:
            limiter.charge_requests(record.calls - 1)

    # --- the budget: RunShared.stop_pulling -------------------------------------------------------

    def spend(self) -> tuple[int, int]:
        """Spend as this run sees it: (nano-dollars, tokens), the log's other writers' part re-read when due."""
        now = self._clock()
        if self._read_at is None or now >= self._next_read:
            others = self.log.usage_spend(exclude_writer=self.writer)
            if self._before is None:
                total = self.log.usage_spend()
                self._before = (total[0] - others[0], total[1] - others[1])
            self._others = (others[0] + self._before[0], others[1] + self._before[1])
            self._read_at = now
            # A read of a large log takes a while: the main thread, which commits, spends at most a
            # tenth of its time on it (refresh_seconds=0 reads before every item, whatever it costs).
            took = self._clock() - now
            self._next_read = now + (max(self.refresh_seconds, READ_SHARE * took) if self.refresh_seconds else 0.0)
        with self._lock:
            return self._others[0] + self.cost_nanos, self._others[1] + self.tokens

    def seen_reached(self) -> bool:
        """:meth:`stop_pulling` without reading the log: the budget as this run last saw it.

        For the worker thread about to start an item (only the main thread reads the log): this run's
        own usage is counted as soon as each attempt staged it, the other writers' as last read.
        """
        if self.stopped is not None:
            return True
        if not self.budget.is_set:
            return False
        with self._lock:
            spent = self._others[0] + self.cost_nanos, self._others[1] + self.tokens
        why = self.budget.reached(*spent)
        if why is None:
            return False
        with self._lock:
            first = self.stopped is None
            if first:
                self.stopped = why
        if first:
            logger.warning("budget reached (%s): no new item starts; items in flight finish", why)
        return True

    def stop_pulling(self) -> bool:
        """Whether the budget is reached: no new root item may start (checked before each one)."""
        if self.stopped is not None:
            return True
        if not self.budget.is_set:
            return False
        spent = self.spend()
        if not self._near and self.budget.share(*spent) >= NEAR:
            # the last stretch: every item's spend is shared at once and read before the next one
            self._near = True
            self.refresh_seconds = 0.0
            if self.on_near is not None:
                self.on_near()
        why = self.budget.reached(*spent)
        if why is not None:
            self.stopped = why
            logger.warning("budget reached (%s): no new item starts; items in flight finish", why)
            return True
        return False
