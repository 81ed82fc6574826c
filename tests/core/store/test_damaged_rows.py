"""A damaged row of the log is a typed error naming the dataset, the row or item, and the fix (issue 24 point 13).

Rows are damaged by appending a copy of a real row with one column changed, through Lance directly,
as a bit flip, a foreign tool or a hand edit would leave it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import lance
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from airflow_provider_datagen.core.schema import EVENT_SCHEMA, NON_BLOB_COLUMNS
from airflow_provider_datagen.exceptions import LogCorruptedError, SchemaVersionError
from tests._support.engine import open_log

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from airflow_provider_datagen.core import CheckpointLog

DAMAGED_ID = "f" * 32


def _damaged_log(tmp_path: Path, column: str, value: Any) -> CheckpointLog:
    log = open_log(tmp_path, "damaged")
    with log.writer("w", log.next_epoch()).batch() as b:
        b.item_created("i1", input_fingerprint="fp")
        b.field_set("i1", "x", {"a": 1})
        b.terminal("i1")
    rows = lance.dataset(log.uri).to_table(columns=list(NON_BLOB_COLUMNS))
    row = rows.filter(pc.equal(rows["event_type"], "FIELD_SET"))
    row = row.set_column(row.schema.get_field_index(column), column, pa.array([value], row.schema.field(column).type))
    row = row.set_column(row.schema.get_field_index("event_id"), "event_id", pa.array([DAMAGED_ID]))
    row = row.append_column("value_blob", pa.nulls(1, EVENT_SCHEMA.field("value_blob").type))
    lance.write_dataset(row.select(EVENT_SCHEMA.names).cast(EVENT_SCHEMA), log.uri, schema=EVENT_SCHEMA, mode="append")
    return open_log(tmp_path, "damaged")


READS: dict[str, Callable[[CheckpointLog], Any]] = {
    "item_state": lambda lg: lg.item_state("i1"),
    "item_states": lambda lg: lg.item_states(["i1"]),
    "events": lambda lg: lg.events("i1"),
    "completed_root_states": lambda lg: lg.completed_root_states(),
}


@pytest.mark.parametrize("read", sorted(READS))
def test_an_unknown_event_type_names_the_row_and_the_fix(tmp_path: Path, read: str) -> None:
    log = _damaged_log(tmp_path, "event_type", "BOGUS")
    with pytest.raises(LogCorruptedError) as info:
        READS[read](log)
    message = str(info.value)
    assert log.uri in message
    assert f"event '{DAMAGED_ID}' of item 'i1' cannot be read" in message
    assert "'BOGUS' is not a valid EventType" in message and "Restore the log from a backup" in message


@pytest.mark.parametrize("read", ["item_state", "item_states", "completed_root_states"])
def test_a_damaged_value_json_names_the_item_and_the_fix(tmp_path: Path, read: str) -> None:
    log = _damaged_log(tmp_path, "value_json", "{not json")
    with pytest.raises(LogCorruptedError) as info:
        READS[read](log)
    message = str(info.value)
    assert log.uri in message and "an event of item 'i1' cannot be read (JSONDecodeError" in message
    assert "Restore the log from a backup" in message


@pytest.mark.parametrize("read", ["states", "summary", "item_state", "events"])
def test_a_row_of_an_unknown_schema_version_names_the_row(tmp_path: Path, read: str) -> None:
    log = _damaged_log(tmp_path, "schema_version", 99)
    with pytest.raises(SchemaVersionError) as info:
        getattr(log, read)() if read in ("states", "summary") else READS[read](log)
    message = str(info.value)
    assert log.uri in message and "schema version 99" in message and "upgrade airflow-provider-datagen" in message
    assert f"event '{DAMAGED_ID}' of item 'i1' holds it" in message and "restore the log from a backup" in message
