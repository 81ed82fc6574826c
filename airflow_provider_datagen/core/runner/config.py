"""A run's configuration: ``run_items``'s keyword arguments, checked once, as one frozen value.

``run_items`` bundles its arguments into a :class:`RunConfig` before it reads the log; anything else
that starts a run (the map operator) can build and check the same value with itself as the owner
named in the errors, so a bad argument is refused in one place with one message.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from airflow_provider_datagen.core.ledger import budget as budget_module
from airflow_provider_datagen.core.ledger.budget import Budget
from airflow_provider_datagen.core.planner import REDO_NEVER, check_redo_completed
from airflow_provider_datagen.core.ratelimit import RateLimit
from airflow_provider_datagen.core.retry import RetryPolicy
from airflow_provider_datagen.core.runner.failures import DEFAULT_MAX_REPEATED_FAILURES
from airflow_provider_datagen.core.runner.shared import DEFAULT_GROUP_SECONDS, CommitPolicy
from airflow_provider_datagen.exceptions import bad_argument

if TYPE_CHECKING:
    from collections.abc import Callable


@dataclass(frozen=True, eq=False)
class RunConfig:
    """Everything ``run_items`` takes besides the log, the items and the process, checked on construction.

    The fields are ``run_items``'s keyword arguments with the same names, defaults and meaning (see
    :func:`~airflow_provider_datagen.core.run_items`); ``rate_limit`` is stored coerced (its dict form
    becomes a :class:`RateLimit`) and :attr:`budget` holds the checked budget. ``owner`` is who the
    errors name: ``"run_items"``, or the operator that starts the run.
    """

    key_field: str = "id"
    processor_version: str = "v1"
    writer_id: str = "w1"
    epoch: int = 1
    checkpoint_every: int | None = None
    fail_fast: bool = False
    checkpoint_interval: float = DEFAULT_GROUP_SECONDS
    airflow: dict[str, Any] | None = None
    progress: Callable[[int, int], None] | None = None
    reraise: tuple[type[BaseException], ...] = ()
    concurrency: int = 1
    redo_completed: str = REDO_NEVER
    retry: RetryPolicy | None = None
    rate_limit: RateLimit | None = None
    rate_limit_storage: str | None = None
    budget_usd: float | None = None
    budget_tokens: int | None = None
    max_repeated_failures: int | None = DEFAULT_MAX_REPEATED_FAILURES
    owner: object = field(default="run_items", repr=False)
    #: the checked budget (``budget_usd``/``budget_tokens``), set on construction
    budget: Budget = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # the checks in the order run_items always made them: the first bad argument is the one named
        _check_checkpoint_every(self.owner, self.checkpoint_every)
        if not isinstance(self.processor_version, str) or not self.processor_version:
            raise bad_argument(
                self.owner, "processor_version", self.processor_version, "is not a non-empty string", "pass e.g. 'v1'"
            )
        concurrency = self.concurrency
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise bad_argument(
                self.owner, "concurrency", concurrency, "is not an int >= 1", "pass 1 to run items one at a time"
            )
        _check_max_repeated_failures(self.owner, self.max_repeated_failures)
        check_redo_completed(self.owner, self.redo_completed)
        if self.retry is not None and not isinstance(self.retry, RetryPolicy):
            raise bad_argument(
                self.owner,
                "retry",
                self.retry,
                "is not a RetryPolicy",
                "pass RetryPolicy(...) (or RetryPolicy.from_dict(d))",
            )
        # frozen: the derived values are set once, here
        object.__setattr__(self, "rate_limit", RateLimit.coerce(self.rate_limit, owner=self.owner))
        object.__setattr__(self, "budget", Budget.of(self.owner, self.budget_usd, self.budget_tokens))

    @property
    def group_interval(self) -> float:
        """The time bound of group commit: ``checkpoint_interval``, shortened under a budget.

        Other tasks see this run's spend only once it is committed: with a budget that lag is kept short.
        """
        if self.budget.is_set:
            return min(self.checkpoint_interval, budget_module.COMMIT_SECONDS)
        return self.checkpoint_interval

    def commit_policy(self) -> CommitPolicy:
        """When this run's acknowledgements are committed."""
        return CommitPolicy.of(self.checkpoint_every, self.group_interval)


#: ``run_items``'s keyword arguments: the fields a caller gives (``owner`` and the derived ``budget`` aside)
RUN_OPTIONS: tuple[str, ...] = tuple(f.name for f in fields(RunConfig) if f.init and f.name != "owner")


def _check_checkpoint_every(owner: object, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise bad_argument(
            owner, "checkpoint_every", value, "is not a positive int", "pass None for the default group commit"
        )


def _check_max_repeated_failures(owner: object, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise bad_argument(
            owner,
            "max_repeated_failures",
            value,
            "is not an int >= 1 or None",
            "pass e.g. 5 (stop after 5 items in a row fail with the same error) or None to never stop for it",
        )
