"""The export, streamed: completed items a batch at a time, their typed columns spilled, then conformed.

A column's type is inferred from all its values (see :mod:`~airflow_provider_datagen.core.export`),
but no batch may hold all items. So the first pass folds each batch of completed items (read from the
log with an ``item_id`` filter), feeds the fingerprint, builds the batch's typed field arrays and
spills them to a local Arrow IPC file; then each field's type is settled once: the types of its
batches unified when they differ only by nulls (``promote_options="default"``), else JSON text. The
second pass reads the spill back a batch at a time and conforms it to that schema. Batches are in
item-id order, so the fingerprint and the rows are those of the whole-table export.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_datagen.core.events import canonical_source_json
from airflow_provider_datagen.core.export_columns import (
    JSON_FIELD_META,
    column_names,
    input_json_keys,
    input_struct,
    typed_columns,
)
from airflow_provider_datagen.core.ids import key_of
from airflow_provider_datagen.core.schema import NON_BLOB_COLUMNS
from airflow_provider_datagen.core.store import rows as log_rows

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping

    from airflow_provider_datagen.core.events import Event
    from airflow_provider_datagen.core.fold import ItemState
    from airflow_provider_datagen.core.store.log import CheckpointLog

#: Completed items folded and spilled per batch: a batch's events and folds are what the export holds
#: in memory at a time (tens of MB of Arrow and Python objects at this size; a scan of the log each).
EXPORT_BATCH_ITEMS: Final = 10_000
_SKIPPED_COLUMNS: Final = ("error_traceback", "error_message")
#: Marks a spilled batch's column holding JSON text (its values had no one Arrow type in that batch).
_SPILLED_JSON: Final = {b"spilled": b"json"}


def state_batches(log: CheckpointLog, ids: pa.Array, batch_items: int) -> Iterator[dict[str, ItemState]]:
    """Folds of the items ``ids`` (sorted, completed roots), ``batch_items`` at a time, in ``ids`` order."""
    cols = [c for c in NON_BLOB_COLUMNS if c not in _SKIPPED_COLUMNS]
    for start in range(0, len(ids), batch_items):
        part = ids.slice(start, batch_items)
        table = log.scan(cols, pc.field("item_id").isin(part))
        for missing in _SKIPPED_COLUMNS:
            table = table.append_column(missing, pa.nulls(table.num_rows, pa.string()))
        grouped: dict[str, list[Event]] = {}
        for ev in log_rows.decode_events(log.uri, table):
            grouped.setdefault(ev.item_id, []).append(ev)
        yield {iid: log_rows.fold_item(log.uri, iid, grouped.get(iid, []), log.load_blob) for iid in part.to_pylist()}


@dataclass
class _Column:
    """What the batches say of one field: its types (typed batches) and whether any batch was JSON text."""

    types: list[pa.DataType] = field(default_factory=list)
    as_json: bool = False


@dataclass
class Spilled:
    """The first pass's result: the digests, the row count, each field's batches, the spill files."""

    fingerprint: str
    inputs_digest: str
    rows: int
    columns: dict[str, _Column]
    paths: list[str]
    folder: str
    input_type: pa.DataType | None = None

    def discard(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def spill(
    batches: Iterator[Mapping[str, ItemState]],
    canonical: Callable[[Mapping[str, ItemState]], dict[str, str]],
    fields: Callable[[Mapping[str, ItemState]], dict[str, dict[str, Any]]],
    inputs: Mapping[str, Mapping[str, Any]] | None,
) -> Spilled:
    """Pass one: fingerprint (ids and canonical fields in id order) and typed field arrays, spilled."""
    digest, inputs_digest = hashlib.sha256(), hashlib.sha256()
    folder = tempfile.mkdtemp(prefix="datagen-export-")
    out = Spilled("", "", 0, {}, [], folder)
    try:
        for n, states in enumerate(batches):
            for iid, text in canonical(states).items():
                digest.update(iid.encode("utf-8", "surrogatepass") + b"\x1f" + text.encode("utf-8", "surrogatepass"))
                digest.update(b"\n")
                inputs_digest.update(f"{iid}\x1f{states[iid].input_fingerprint}\n".encode("utf-8", "surrogatepass"))
            ids = list(states)
            out.rows += len(ids)
            batch_fields = fields(states)
            names, arrays, as_json = typed_columns([batch_fields[i] for i in ids], ids, "field")
            for name, arr, is_json in zip(names, arrays, as_json, strict=True):
                col = out.columns.setdefault(name, _Column())
                col.as_json |= is_json
                if not is_json:
                    col.types.append(arr.type)
            data = [pa.array(ids, pa.string()), *arrays]
            spilled = [pa.field("\x00item_id", pa.string())]
            spilled += [
                pa.field(n, a.type, metadata=_SPILLED_JSON if j else None)
                for n, a, j in zip(names, arrays, as_json, strict=True)
            ]
            if inputs is not None:
                data.append(input_struct([inputs[i] for i in ids], ids))
                spilled.append(pa.field("\x00input", data[-1].type))
                out.input_type = data[-1].type
            table = pa.Table.from_arrays(data, schema=pa.schema(spilled))
            path = os.path.join(folder, f"{n:06d}.arrow")
            with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
                writer.write_table(table)
            out.paths.append(path)
    except BaseException:
        out.discard()
        raise
    out.fingerprint, out.inputs_digest = digest.hexdigest(), inputs_digest.hexdigest()
    return out


def _settled(col: _Column) -> pa.DataType | None:
    """The one type of a field's typed batches (nulls promoted), or None: JSON text."""
    if col.as_json:
        return None
    if not col.types:
        return pa.null()
    try:
        unified = pa.unify_schemas([pa.schema([("v", t)]) for t in col.types], promote_options="default")
    except (pa.ArrowException, TypeError, ValueError):
        return None
    settled = unified.field("v").type
    try:
        for t in col.types:
            pa.nulls(0, t).cast(settled)
    except (pa.ArrowException, NotImplementedError):
        return None
    return settled


@dataclass(frozen=True)
class Layout:
    """The export's schema, settled after pass one, and the fields that became JSON text or were renamed."""

    schema: pa.Schema
    fields: list[tuple[str, pa.DataType | None]]  # field name, type (None: JSON text)
    json_fields: list[str]
    renamed: dict[str, str]


def layout(spilled: Spilled) -> Layout:
    """The schema every batch is conformed to (column names, types, field metadata) and its lists."""
    names = sorted(spilled.columns)
    columns = column_names(names)
    schema = [pa.field("item_id", pa.string(), nullable=False), pa.field("key", pa.string(), nullable=False)]
    plan, json_fields = [], []
    for name in names:
        settled = _settled(spilled.columns[name])
        meta = dict(JSON_FIELD_META) if settled is None else {}
        if columns[name] != name:
            meta["datagen_field"] = name
        schema.append(pa.field(columns[name], pa.string() if settled is None else settled, metadata=meta or None))
        plan.append((name, settled))
        if settled is None:
            json_fields.append(columns[name])
    if spilled.input_type is not None:
        schema.append(pa.field("input", spilled.input_type))
        json_fields.extend(input_json_keys(spilled.input_type))
    renamed = {f: c for f, c in columns.items() if f != c}
    return Layout(pa.schema(schema), plan, json_fields, renamed)


def _as_json(arr: pa.Array, ids: list[str], name: str) -> pa.Array:
    """A typed batch column as canonical JSON text (its values read back are the values it was built from)."""
    values = arr.to_pylist()
    text = [
        None if v is None else canonical_source_json(v, what=f"field {name!r} of item {i!r}")
        for i, v in zip(ids, values, strict=True)
    ]
    return pa.array(text, pa.string())


def conformed(spilled: Spilled, plan: Layout) -> Iterator[pa.Table]:
    """Pass two: each spilled batch in the settled layout (columns in schema order)."""
    for path in spilled.paths:
        with pa.memory_map(path) as source:
            batch = pa.ipc.open_file(source).read_all()
        ids = batch.column("\x00item_id")
        id_list = ids.to_pylist()
        data: list[Any] = [ids, pa.array([key_of(i) for i in id_list], pa.string())]
        for (name, settled), target in zip(plan.fields, plan.schema.types[2:], strict=False):
            present = name in batch.column_names
            arr = batch.column(name) if present else pa.nulls(batch.num_rows, target)
            if settled is None:
                is_text = not present or batch.schema.field(name).metadata == _SPILLED_JSON
                data.append(arr if is_text else _as_json(arr, id_list, name))
            else:
                data.append(arr if arr.type == settled else arr.cast(settled))
        if "\x00input" in batch.column_names:
            data.append(batch.column("\x00input"))
        yield pa.Table.from_arrays(data, schema=plan.schema)
