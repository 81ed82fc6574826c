"""The log's usage reads (the usage lens over its rows) and the experiment's budget record.

Usage lives in the value of the STEP_COMPLETED and FAILED rows that end attempts (see
``core/fold/usage.py``); a read scans only those rows that carry a value, so a log without usage
costs one pass over two light columns. The sums are remembered by the log object (unless it was
opened with ``remember_fold=False``), so the next read scans only the rows committed since: a run's
budget re-reads the log's spend often. A fresh object starts from the usage projection that
``maintain()`` stores (``usage_projection.py``) and scans only the rows committed after it. The
budget a plan or map task set is a one-row Lance dataset beside the log (``budget.lance``),
overwritten when a task sets another: not an event, because a budget is a setting of the experiment,
not something that happened to an item, and the UI reads it without folding anything. See
docs/adr/0011-usage-ledger.md.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from airflow_provider_datagen.core.fold.usage import (
    Sums,
    add_sums,
    attempts_of_events,
    entries_of_table,
    spend_of_sums,
    sums_of_entries,
    usage_of_events,
    usage_of_sums,
)
from airflow_provider_datagen.core.store import lance_io, usage_projection
from airflow_provider_datagen.core.store.paths import budget_uri
from airflow_provider_datagen.core.store.usage_projection import KeySet, UsageAt

if TYPE_CHECKING:
    import lance

    from airflow_provider_datagen.core.events import Event
    from airflow_provider_datagen.core.store.table import LanceTable

logger = logging.getLogger(__name__)

_BUDGET_SCHEMA = pa.schema(
    [
        ("budget_usd", pa.float64()),
        ("budget_tokens", pa.int64()),
        ("set_at", pa.timestamp("us", tz="UTC")),
    ]
)
NO_BUDGET = {"budget_usd": None, "budget_tokens": None}


@dataclass(frozen=True)
class UsageMemo:
    """The usage sums of a log up to a version, kept by the log object so the next read folds only what is new.

    ``keys`` are the event keys of the usage rows already summed: a copy of one of them landing
    later (a batch retried after it landed) is not summed again (see ``usage_projection.without_copies``).
    """

    version: int
    token: Any
    sums: Sums
    keys: KeySet


def _memo_base(memo: UsageMemo | None, log: LanceTable, ds: lance.LanceDataset) -> UsageAt | None:
    if (
        memo is None
        or memo.token is None
        or memo.version > int(ds.version)
        or not lance_io.row_versions(ds)
        or memo.token != lance_io.version_token(log.uri, memo.version, ds)
    ):
        return None
    return UsageAt(memo.version, memo.sums, memo.keys)


def sums(log: LanceTable, memo: UsageMemo | None, *, remember: bool) -> tuple[Sums, UsageMemo | None]:
    """The log's usage sums per writer, and the memo to keep (``memo`` itself unless ``remember``).

    From ``memo`` (the log object's last read), else the usage projection, plus the rows committed
    since; the whole log when neither is usable.
    """
    ds = log.dataset()
    if ds is None:
        return {}, memo
    version = int(ds.version)
    base = _memo_base(memo, log, ds)
    if base is not None and base.version == version:
        return base.sums, memo
    if base is None and (stored := usage_projection.usable_projection(log, ds)) is not None:
        rows = usage_projection.rows_after(log, ds, stored.log_version)
        # the keys only matter for copies among the rows after it, or for a memo to keep
        base = usage_projection.load(log, stored, keys=remember or rows.num_rows > 0)
        if base is None:
            rows = usage_projection.rows_after(log, ds, None)
    else:
        rows = usage_projection.rows_after(log, ds, None if base is None else base.version)
    entries = entries_of_table(usage_projection.without_copies(log, ds, rows, base))
    summed = sums_of_entries(entries)
    if base is not None:
        summed = add_sums({k: list(v) for k, v in base.sums.items()}, summed)
    if remember:
        known = base.keys if base is not None and base.keys is not None else KeySet()
        token = lance_io.version_token(log.uri, version, ds)
        memo = UsageMemo(version, token, summed, known.plus(entries["event_key"].to_numpy()))
    return summed, memo


def usage(summed: Sums) -> dict[str, Any]:
    """``CheckpointLog.usage()`` of ``summed``."""
    return usage_of_sums(summed)


def spend(summed: Sums, exclude_writer: tuple[str, int] | None) -> tuple[int, int]:
    """(nano-dollars, tokens) in ``summed``, without what ``exclude_writer`` wrote at its epoch."""
    return spend_of_sums(summed, exclude_writer=exclude_writer)


def item_usage(events: list[Event]) -> dict[str, Any]:
    """``CheckpointLog.item_usage()`` of an item's ``events`` (a root's fan-out children's included), by attempt."""
    out = usage_of_events(events)
    out["attempts"] = attempts_of_events(events)
    return out


def budget(log: LanceTable) -> dict[str, Any]:
    """``CheckpointLog.budget()``: the budget the last plan or map task set, or None for each part."""
    uri = budget_uri(log.uri)
    if not lance_io.dataset_exists(uri, log.storage_options):
        return dict(NO_BUDGET)
    try:
        row = lance_io.open_dataset(uri, log.storage_options).to_table().to_pylist()
    except lance_io.LANCE_ERRORS as exc:
        raise lance_io.translate(exc, uri, "reading the budget") from None
    if not row:
        return dict(NO_BUDGET)
    return {"budget_usd": row[-1]["budget_usd"], "budget_tokens": row[-1]["budget_tokens"]}


def set_budget(log: LanceTable, budget_usd: float | None, budget_tokens: int | None, experiment: str) -> bool:
    """Record the experiment's budget when it differs from the recorded one; returns whether it wrote.

    A task without a budget clears a recorded one (the UI must not show a limit nobody applies); one
    with the same budget writes nothing, so mapped tasks starting together rarely race, and when two
    do, both write the same row.
    """
    wanted = {"budget_usd": budget_usd, "budget_tokens": budget_tokens}
    if budget(log) == wanted:
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
    # mapped tasks starting together race to record the same budget: a lost race that left ours
    # recorded is done; another budget recorded meanwhile is overwritten again
    if not lance_io.overwrite_setting(
        table, uri, log.storage_options, "recording the budget", settled=lambda: budget(log) == wanted
    ):
        return False
    logger.info("experiment %s: budget set to %s", experiment, budget_usd or budget_tokens)
    return True
