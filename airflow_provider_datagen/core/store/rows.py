"""Rows of the log read back: a row that cannot be decoded is a typed error naming it and the fix.

A damaged row (a bit flip, a foreign tool, a hand edit) surfaced as a bare ``ValueError`` from deep in
the decoder; here it becomes a :class:`LogCorruptedError` naming the log, the event and item, and
what to do. Rows of another schema version are refused by the log itself (``LanceTable._check_version``); this
module only names the row that holds one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_provider_datagen.core.events import events_from_table
from airflow_provider_datagen.core.fold import fold_events
from airflow_provider_datagen.exceptions import DatagenError, LogCorruptedError

if TYPE_CHECKING:
    from collections.abc import Callable

    import pyarrow as pa

    from airflow_provider_datagen.core.events import Event
    from airflow_provider_datagen.core.fold import ItemState

#: What the decoder raises on a value it cannot read (an unknown enum value, damaged JSON).
_DECODE_ERRORS = (ValueError, TypeError, KeyError)


def row_name(rows: pa.Table | pa.RecordBatch | None, i: int) -> str | None:
    """``event <id> of item <id>`` for row ``i`` of scanned ``rows``, when they hold those columns."""
    if rows is None or "event_id" not in rows.column_names or "item_id" not in rows.column_names:
        return None
    return f"event {rows.column('event_id')[i].as_py()!r} of item {rows.column('item_id')[i].as_py()!r}"


def damaged(uri: str, what: str, exc: BaseException) -> LogCorruptedError:
    return LogCorruptedError(
        f"{uri}: {what} cannot be read ({type(exc).__name__}: {str(exc)[:200]}). Nothing was changed. "
        "Restore the log from a backup, or check out a version from before that row was committed "
        "(lance restore); run maintain() after restoring."
    )


def decode_events(uri: str, table: pa.Table) -> list[Event]:
    """``events_from_table``; a row it cannot decode (an unknown event type) is an error naming it."""
    try:
        return events_from_table(table)
    except DatagenError:
        raise
    except _DECODE_ERRORS as exc:
        for i in range(table.num_rows):  # only on failure: find the row
            try:
                events_from_table(table.slice(i, 1))
            except _DECODE_ERRORS:
                raise damaged(uri, row_name(table, i) or f"row {i}", exc) from None
        raise damaged(uri, "a row", exc) from None


def fold_item(
    uri: str, item_id: str, events: list[Event], load_blob: Callable[[str], bytes] | None = None
) -> ItemState:
    """``fold_events``; a value it cannot decode (a damaged ``value_json``) is an error naming the item."""
    try:
        return fold_events(item_id, events, load_blob)
    except DatagenError:
        raise
    except _DECODE_ERRORS as exc:
        raise damaged(uri, f"an event of item {item_id!r}", exc) from None
