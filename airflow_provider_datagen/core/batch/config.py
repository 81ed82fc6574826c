"""A batch run's configuration: what :func:`~airflow_provider_datagen.core.batch.run_batch` (and the batch
operator) pass :class:`~airflow_provider_datagen.core.batch.BatchRun` besides the log, the items and the
step, checked once on construction, as ``RunConfig`` is for ``run_items``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_provider_datagen.core.planner import REDO_NEVER, REDO_OTHER_VERSION, check_redo_completed
from airflow_provider_datagen.exceptions import bad_argument

if TYPE_CHECKING:
    from airflow_provider_datagen.core.retry import RetryPolicy

_OWNER = "run_batch"


@dataclass(frozen=True)
class BatchConfig:
    """The keyword arguments of a batch run, checked: the first bad one is named, before anything is read.

    :param processor_version: recorded with every item (usually ``step.version``).
    :param writer_id: the writer of this run's events (the task instance's, under Airflow).
    :param epoch: the writer's fencing epoch (``log.next_epoch()``).
    :param key_field: the items' key, as ``run_items``'s.
    :param retry: ``attempts`` is how many times one item may be submitted per run (errored, expired and
        cancelled rows are resubmitted until then); ``None``: once, and a row that did not succeed fails
        its item (a rerun resubmits it).
    :param budget_usd: no submission once the experiment's recorded cost reaches it, and none holding
        more items than the rest covers at the mean cost of the items recorded so far.
    :param budget_tokens: the same for tokens.
    :param airflow: the task instance's coordinates stored in every event (the operator's), as ``run_items``'s.
    :param redo_completed: ``"never"`` keeps items completed (or filtered) under another processor version;
        ``"other_version"`` submits them again as a new generation, as ``run_items`` regenerates them.
    """

    processor_version: str
    writer_id: str
    epoch: int
    key_field: str = "id"
    retry: RetryPolicy | None = None
    budget_usd: float | None = None
    budget_tokens: int | None = None
    airflow: dict[str, Any] | None = None
    redo_completed: str = REDO_NEVER

    def __post_init__(self) -> None:
        check_redo_completed(_OWNER, self.redo_completed)
        for param, budget in (("budget_usd", self.budget_usd), ("budget_tokens", self.budget_tokens)):
            if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float)) or budget <= 0):
                raise bad_argument(_OWNER, param, budget, "is not a positive number", "e.g. 25.0, or None")
        if not isinstance(self.processor_version, str) or not self.processor_version:
            raise bad_argument(
                _OWNER, "processor_version", self.processor_version, "is not a non-empty string", "e.g. step.version"
            )

    @property
    def redo_other(self) -> bool:
        """Whether items completed under another processor version are submitted again."""
        return self.redo_completed == REDO_OTHER_VERSION

    @property
    def max_attempts(self) -> int:
        """Submissions of one item per run."""
        return self.retry.attempts if self.retry is not None else 1
