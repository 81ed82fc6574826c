"""Where an attempt's usage joins the log: the one helper every completion and failure path calls.

``ctx.record_usage`` only collects :class:`UsageRecord` objects on the context; the attempt's end
stages them into the row that ends it (STEP_COMPLETED or FAILED) through :func:`staged_entries`, which
also counts them in the run's tally when the run has a budget or a rate limit (``RunShared.usage``).
A path whose context recorded nothing never comes here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_provider_datagen.core.ledger.records import attempt_entries

if TYPE_CHECKING:
    from collections.abc import Sequence

    from airflow_provider_datagen.core.ledger.records import UsageRecord
    from airflow_provider_datagen.core.runner.shared import RunShared


def staged_entries(shared: RunShared, records: Sequence[UsageRecord]) -> list[dict[str, Any]]:
    """The stored entries of one attempt's records, counted in the run's tally if it keeps one."""
    meter = shared.usage
    if meter is not None:
        meter.add(records)
    return attempt_entries(records)


def requests_of(records: Sequence[UsageRecord] | None) -> int | None:
    """The requests an attempt counted through ``ctx.take_request_slot`` (None: not counted).

    Stored as the attempt's ``"requests"``; without it the ledger counts the records' ``calls``.
    """
    requests = getattr(records, "requests", 0)
    return requests or None


def completed_value(shared: RunShared, attempt: int, records: Sequence[UsageRecord]) -> dict[str, Any]:
    """The JSON value of a STEP_COMPLETED that ends an attempt which recorded usage or counted requests."""
    value: dict[str, Any] = {"attempt": attempt, "usage": staged_entries(shared, records)}
    requests = requests_of(records)
    if requests is not None:
        value["requests"] = requests
    return value
