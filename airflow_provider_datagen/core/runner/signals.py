"""Control-flow signals inside the runner, never raised to the user (user-facing errors live in exceptions.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_provider_datagen.core.error_text import error_message

if TYPE_CHECKING:
    from airflow_provider_datagen.core.events import StepCoord
    from airflow_provider_datagen.core.ledger.records import UsageRecord


class Filtered(Exception):
    """A step called ``ctx.filter``: unwinds the item's drive to finish it as ``filtered``."""

    def __init__(self, reason: Any) -> None:
        self.reason = reason


class StepFailure(Exception):
    """Carries the failing item and coordinates of a step's error up to the root item."""

    def __init__(
        self,
        item_id: str,
        coord: StepCoord,
        exc: BaseException,
        attempt: int | None = None,
        usage: list[UsageRecord] | None = None,
    ) -> None:
        super().__init__(error_message(exc))  # the user's error may break its own __str__
        self.item_id = item_id
        self.coord = coord
        self.__cause__ = exc
        #: with a retry policy: the item's attempt that failed last (its FAILED row records it)
        self.attempt = attempt
        #: the usage the failed attempt recorded (its FAILED row stores it): money spent all the same
        self.usage = usage


class RunEnded(BaseException):
    """Stops a worker's item when the main thread has ended the run (never an item failure)."""
