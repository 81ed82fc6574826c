"""The log's usage reads (the usage lens over its rows) and the experiment's budget record.

Usage lives in the value of the STEP_COMPLETED and FAILED rows that end attempts (see
``core/fold/usage.py``); a read scans only those rows that carry a value, so a log without usage
costs one pass over two light columns. The budget a plan or map task set is a one-row Lance dataset
beside the log (``budget.lance``), overwritten when a task sets another: not an event, because a
budget is a setting of the experiment, not something that happened to an item, and the UI reads it
without folding anything. See docs/adr/0011-usage-ledger.md.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_datagen.core.fold.usage import (
    NANOS,
    USAGE_COLUMNS,
    USAGE_TYPES,
    attempts_of_events,
    usage_of_events,
    usage_of_table,
)
from airflow_provider_datagen.core.store import lance_io
from airflow_provider_datagen.core.store.paths import budget_uri

if TYPE_CHECKING:
    from airflow_provider_datagen.core.store.log import CheckpointLog

logger = logging.getLogger(__name__)

_USAGE_ROWS = pc.field("event_type").isin(pa.array(USAGE_TYPES)) & pc.field("value_kind").is_valid()
_BUDGET_SCHEMA = pa.schema(
    [
        ("budget_usd", pa.float64()),
        ("budget_tokens", pa.int64()),
        ("set_at", pa.timestamp("us", tz="UTC")),
    ]
)
NO_BUDGET = {"budget_usd": None, "budget_tokens": None}


def usage_rows(log: CheckpointLog) -> pa.Table:
    """The rows that may carry an attempt's usage, projected to what the usage fold reads."""
    return log.scan(list(USAGE_COLUMNS), _USAGE_ROWS)


def usage(log: CheckpointLog) -> dict[str, Any]:
    """``CheckpointLog.usage()``."""
    return usage_of_table(usage_rows(log))


def spend(log: CheckpointLog, exclude_writer: tuple[str, int] | None) -> tuple[int, int]:
    """(nano-dollars, tokens) the log holds, without what ``exclude_writer`` wrote at its epoch."""
    u = usage_of_table(usage_rows(log), exclude_writer=exclude_writer)
    return round(u["cost_usd"] * NANOS), u["input_tokens"] + u["output_tokens"]


def item_usage(log: CheckpointLog, item_id: str) -> dict[str, Any]:
    """``CheckpointLog.item_usage()``: a root item's usage (its fan-out children's included) by attempt."""
    events = log.subtree(item_id) if "/" not in item_id else log.events(item_id)
    out = usage_of_events(events)
    out["attempts"] = attempts_of_events(events)
    return out


def budget(log: CheckpointLog) -> dict[str, Any]:
    """``CheckpointLog.budget()``: the budget the last plan or map task set, or None for each part."""
    uri = budget_uri(log.uri)
    if not lance_io._dataset_exists(uri, log.storage_options):
        return dict(NO_BUDGET)
    try:
        row = lance_io.open_dataset(uri, log.storage_options).to_table().to_pylist()
    except lance_io.LANCE_ERRORS as exc:
        raise lance_io.translate(exc, uri, "reading the budget") from None
    if not row:
        return dict(NO_BUDGET)
    return {"budget_usd": row[-1]["budget_usd"], "budget_tokens": row[-1]["budget_tokens"]}


def set_budget(log: CheckpointLog, budget_usd: float | None, budget_tokens: int | None) -> bool:
    """Record the experiment's budget when it differs from the recorded one; returns whether it wrote.

    A task without a budget clears a recorded one (the UI must not show a limit nobody applies); one
    with the same budget writes nothing, so mapped tasks starting together rarely race, and when two
    do, both write the same row.
    """
    if budget(log) == {"budget_usd": budget_usd, "budget_tokens": budget_tokens}:
        return False
    table = pa.table(
        {
            "budget_usd": [budget_usd],
            "budget_tokens": [budget_tokens],
            "set_at": [dt.datetime.now(dt.UTC)],
        },
        schema=_BUDGET_SCHEMA,
    )
    uri = budget_uri(log.uri)
    try:
        lance_io.overwrite_dataset(table, uri, log.storage_options)
    except lance_io.LANCE_ERRORS as exc:
        raise lance_io.translate(exc, uri, "recording the budget") from None
    logger.info("experiment %s/%s: budget set to %s", log.pipeline, log.experiment, budget_usd or budget_tokens)
    return True
