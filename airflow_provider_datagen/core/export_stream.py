"""The export, streamed: completed items a batch at a time, their typed columns spilled, then conformed.

A column's type is inferred from all its values (see :mod:`~airflow_provider_datagen.core.export`),
but no batch may hold all items. So the first pass folds each batch of completed items (their events
from one streamed read of the log, :mod:`~airflow_provider_datagen.core.export_reads`), feeds the
fingerprint, builds the batch's typed field arrays (and, with ``include_input``, one per input key)
and spills them to a local Arrow IPC file; then each field's (and input key's) type is settled once:
the types of its batches unified when they differ only by nulls (``promote_options="default"``), else
JSON text. The second pass reads the spill back a batch at a time and conforms it to that schema.
Batches are in item-id order, so the fingerprint and the rows are those of the whole-table export.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import pyarrow as pa

from airflow_provider_datagen.core.events import canonical_source_json
from airflow_provider_datagen.core.export_columns import (
    JSON_FIELD_META,
    column_names,
    input_json_keys,
    typed_columns,
)
from airflow_provider_datagen.core.export_reads import log_batches
from airflow_provider_datagen.core.ids import key_of
from airflow_provider_datagen.core.schema import NON_BLOB_COLUMNS
from airflow_provider_datagen.core.store import rows as log_rows

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping

    from airflow_provider_datagen.core.events import Event
    from airflow_provider_datagen.core.fold import ItemState
    from airflow_provider_datagen.core.store.log import CheckpointLog

#: Completed items folded and spilled per batch: a batch's events and folds are what the export holds
#: in memory at a time (tens of MB of Arrow and Python objects at this size).
EXPORT_BATCH_ITEMS: Final = 10_000
_SKIPPED_COLUMNS: Final = ("error_traceback", "error_message")
#: Marks a spilled batch's column holding JSON text (its values had no one Arrow type in that batch).
_SPILLED_JSON: Final = {b"spilled": b"json"}
_ITEM_ID: Final = "\x00item_id"
#: The spilled column of input key ``k`` is ``_INPUT + k`` (a field's is its own name).
_INPUT: Final = "\x00input\x00"

#: A batch of the first pass: the items' folds and, with ``include_input``, their source dicts.
StateBatch = tuple["Mapping[str, ItemState]", "Mapping[str, Mapping[str, Any]] | None"]


def state_batches(log: CheckpointLog, ids: pa.Array, batch_items: int) -> Iterator[dict[str, ItemState]]:
    """Folds of the items ``ids`` (sorted, completed roots), ``batch_items`` at a time, in ``ids`` order.

    The log is read once (:func:`~airflow_provider_datagen.core.export_reads.log_batches`), not once per batch.
    """
    cols = [c for c in NON_BLOB_COLUMNS if c not in _SKIPPED_COLUMNS]
    tables = log_batches(log, ids, batch_items, cols)
    for start, table in zip(range(0, len(ids), batch_items), tables, strict=True):
        part = ids.slice(start, batch_items)
        for missing in _SKIPPED_COLUMNS:
            table = table.append_column(missing, pa.nulls(table.num_rows, pa.string()))
        grouped: dict[str, list[Event]] = {}
        for ev in log_rows.decode_events(log.uri, table):
            grouped.setdefault(ev.item_id, []).append(ev)
        del table
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
    inputs: dict[str, _Column] | None = None  # input key -> its batches (None: no input column)

    def discard(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def _typed(
    rows: list[Mapping[str, Any]], ids: list[str], what: str, columns: dict[str, _Column], prefix: str
) -> tuple[list[pa.Array], list[pa.Field]]:
    """The batch's typed columns of ``rows`` (recorded in ``columns``) and their spilled fields."""
    names, arrays, as_json = typed_columns(rows, ids, what)
    spilled = []
    for name, arr, is_json in zip(names, arrays, as_json, strict=True):
        col = columns.setdefault(name, _Column())
        col.as_json |= is_json
        if not is_json:
            col.types.append(arr.type)
        spilled.append(pa.field(prefix + name, arr.type, metadata=_SPILLED_JSON if is_json else None))
    return arrays, spilled


def spill(
    batches: Iterator[StateBatch],
    canonical: Callable[[Mapping[str, ItemState]], dict[str, str]],
    fields: Callable[[Mapping[str, ItemState]], dict[str, dict[str, Any]]],
) -> Spilled:
    """Pass one: fingerprint (ids and canonical fields in id order) and typed field (and input key) arrays, spilled."""
    digest, inputs_digest = hashlib.sha256(), hashlib.sha256()
    folder = tempfile.mkdtemp(prefix="datagen-export-")
    out = Spilled("", "", 0, {}, [], folder)
    try:
        for n, (states, inputs) in enumerate(batches):
            for iid, text in canonical(states).items():
                digest.update(iid.encode("utf-8", "surrogatepass") + b"\x1f" + text.encode("utf-8", "surrogatepass"))
                digest.update(b"\n")
                inputs_digest.update(f"{iid}\x1f{states[iid].input_fingerprint}\n".encode("utf-8", "surrogatepass"))
            ids = list(states)
            out.rows += len(ids)
            batch_fields = fields(states)
            arrays, spilled = _typed([batch_fields[i] for i in ids], ids, "field", out.columns, "")
            data = [pa.array(ids, pa.string()), *arrays]
            spilled.insert(0, pa.field(_ITEM_ID, pa.string()))
            if inputs is not None:
                out.inputs = {} if out.inputs is None else out.inputs
                arrays, fields_of_inputs = _typed([inputs[i] for i in ids], ids, "input key", out.inputs, _INPUT)
                data += arrays
                spilled += fields_of_inputs
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
    inputs: list[tuple[str, pa.DataType | None]] | None = None  # input key, type (None: no input column)


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
    inputs = None
    if spilled.inputs is not None:
        # the input struct's children as export_columns.input_struct types them over the whole source
        inputs = [(key, _settled(spilled.inputs[key])) for key in sorted(spilled.inputs)]
        struct = pa.struct(keys_fields(inputs))
        schema.append(pa.field("input", struct))
        json_fields.extend(input_json_keys(struct))
    renamed = {f: c for f, c in columns.items() if f != c}
    return Layout(pa.schema(schema), plan, json_fields, renamed, inputs)


def _as_json(arr: pa.Array, ids: list[str], name: str) -> pa.Array:
    """A typed batch column as canonical JSON text (its values read back are the values it was built from)."""
    values = arr.to_pylist()
    text = [
        None if v is None else canonical_source_json(v, what=f"field {name!r} of item {i!r}")
        for i, v in zip(ids, values, strict=True)
    ]
    return pa.array(text, pa.string())


def _conform(batch: pa.Table, column: str, settled: pa.DataType | None, id_list: list[str], name: str) -> Any:
    """A spilled column in its settled type: cast, or as JSON text; nulls when the batch had none of it."""
    target = pa.string() if settled is None else settled
    if column not in batch.column_names:
        return pa.nulls(batch.num_rows, target)
    arr = batch.column(column)
    if settled is None:
        return arr if batch.schema.field(column).metadata == _SPILLED_JSON else _as_json(arr, id_list, name)
    return arr if arr.type == settled else arr.cast(settled)


def _input_column(batch: pa.Table, keys: list[tuple[str, pa.DataType | None]], id_list: list[str]) -> pa.Array:
    child_fields = keys_fields(keys)
    if not keys:
        return pa.nulls(batch.num_rows, pa.struct([]))  # no input had a key: null structs, as input_struct gives
    children = [_conform(batch, _INPUT + k, t, id_list, k) for k, t in keys]
    children = [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in children]
    return pa.StructArray.from_arrays(children, fields=child_fields)


def keys_fields(keys: list[tuple[str, pa.DataType | None]]) -> list[pa.Field]:
    """The input struct's child fields: a key's settled type, or JSON text with its field metadata."""
    return [pa.field(k, pa.string(), metadata=dict(JSON_FIELD_META)) if t is None else pa.field(k, t) for k, t in keys]


def conformed(spilled: Spilled, plan: Layout) -> Iterator[pa.Table]:
    """Pass two: each spilled batch in the settled layout (columns in schema order)."""
    for path in spilled.paths:
        with pa.memory_map(path) as source:
            batch = pa.ipc.open_file(source).read_all()
        ids = batch.column(_ITEM_ID)
        id_list = ids.to_pylist()
        data: list[Any] = [ids, pa.array([key_of(i) for i in id_list], pa.string())]
        data += [_conform(batch, name, settled, id_list, name) for name, settled in plan.fields]
        if plan.inputs is not None:
            data.append(_input_column(batch, plan.inputs, id_list))
        yield pa.Table.from_arrays(data, schema=plan.schema)
