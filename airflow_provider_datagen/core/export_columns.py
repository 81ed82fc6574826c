"""The export table: one typed column per field, or canonical JSON text when no Arrow type holds the values.

The layout rules are :mod:`airflow_provider_datagen.core.export`'s (its docstring states them); this
module builds the table, and widens binary columns to ``large_binary`` for every format.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import pyarrow as pa

from airflow_provider_datagen.core.events import canonical_json, canonical_source_json
from airflow_provider_datagen.core.ids import key_of
from airflow_provider_datagen.exceptions import InvalidValueError

if TYPE_CHECKING:
    from collections.abc import Mapping

#: Columns the export writes itself; a field of one of these names is exported renamed.
RESERVED_COLUMNS: Final = ("item_id", "key", "input")
#: Deeper types than this are exported as JSON text: Lance refuses schemas nested ~64 levels deep.
MAX_TYPE_DEPTH: Final = 32
#: The field metadata of a column (or an input key) holding canonical JSON text.
JSON_FIELD_META: Final = {"datagen_encoding": "json"}
#: Lance stores a column with this field metadata out of line, so a scan of the others skips the bytes.
LANCE_BLOB_META: Final = {b"lance-encoding:blob": b"true"}


def _too_deep(t: pa.DataType) -> bool:
    """Whether ``t`` nests deeper than :data:`MAX_TYPE_DEPTH` (looked at level by level, no recursion)."""
    level = [t]
    for _ in range(MAX_TYPE_DEPTH):
        level = [c.field(i).type for c in level for i in range(c.num_fields)]
        if not level:
            return False
    return True


def _same(a: Any, b: Any) -> bool:
    """Equal values of the same types, recursively (``1 == 1.0`` in Python; not here)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(map(_same, a, b))
    return bool(a == b)


def _round_trips(values: list[Any], arr: pa.Array | pa.ChunkedArray) -> bool:
    back = arr.to_pylist()
    try:
        return canonical_json(back) == canonical_json(values)
    except InvalidValueError:  # source values JSON has no form for (times, decimals, bytes)
        return _same(back, values)


def _single(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    # pa.array answers a ChunkedArray when strings or bytes overflow 32-bit offsets (over 2 GiB).
    if isinstance(arr, pa.Array):
        return arr
    if arr.type == pa.string():
        arr = arr.cast(pa.large_string())
    elif arr.type == pa.binary():
        arr = arr.cast(pa.large_binary())
    return arr.combine_chunks()


def _column(values: list[Any], ids: list[str], what: str) -> tuple[pa.Array, bool]:
    """The typed column of ``values``, or their canonical JSON text; True when it is JSON text."""
    try:
        arr: pa.Array | pa.ChunkedArray | None = pa.array(values)
    except (pa.ArrowException, OverflowError, TypeError, ValueError):
        arr = None  # no one Arrow type for these values
    if arr is not None and not _too_deep(arr.type) and _round_trips(values, arr):
        return _single(arr), False
    # canonical_source_json is canonical_json for JSON types; an input value JSON has no form for (a
    # datetime, a Decimal, bytes) takes the tagged text of source values (decode_source_json reads it)
    text = [
        None if v is None else canonical_source_json(v, what=f"{what} of item {i!r}")
        for i, v in zip(ids, values, strict=True)
    ]
    return _single(pa.array(text, pa.string())), True


def column_names(field_names: list[str]) -> dict[str, str]:
    """Field name -> column name (see the module's docstring for the rule); deterministic."""
    taken = set(RESERVED_COLUMNS) | {f for f in field_names if f not in RESERVED_COLUMNS and "." not in f}
    out: dict[str, str] = {}
    for name in sorted(field_names):
        if name in taken and name not in RESERVED_COLUMNS:
            out[name] = name
            continue
        base = ("field_" + name if name in RESERVED_COLUMNS else name).replace(".", "_")
        column, n = base, 2
        while column in taken:
            column, n = f"{base}_{n}", n + 1
        taken.add(column)
        out[name] = column
    return out


def typed_columns(
    rows: list[Mapping[str, Any]], ids: list[str], what: str
) -> tuple[list[str], list[pa.Array], list[bool]]:
    names = sorted({k for r in rows for k in r})
    arrays, as_json = [], []
    for name in names:
        arr, is_json = _column([r.get(name) for r in rows], ids, f"{what} {name!r}")
        arrays.append(arr)
        as_json.append(is_json)
    return names, arrays, as_json


def input_struct(inputs: list[Mapping[str, Any]], ids: list[str]) -> pa.StructArray:
    """The ``input`` column: one child per input key, typed as a field's column is (or JSON text)."""
    keys, children, child_json = typed_columns(inputs, ids, "input key")
    child_fields = [
        pa.field(k, a.type, metadata=dict(JSON_FIELD_META) if j else None)
        for k, a, j in zip(keys, children, child_json, strict=True)
    ]
    if not keys:
        return pa.nulls(len(ids), pa.struct([]))
    return pa.StructArray.from_arrays(children, fields=child_fields)


def input_json_keys(struct_type: pa.DataType) -> list[str]:
    """``input.<key>`` of the input keys holding JSON text."""
    meta = {k.encode(): v.encode() for k, v in JSON_FIELD_META.items()}
    return [f"input.{f.name}" for f in struct_type if f.metadata == meta]


def results_table(
    fields: Mapping[str, Mapping[str, Any]], inputs: Mapping[str, Mapping[str, Any]] | None = None
) -> tuple[pa.Table, list[str], dict[str, str]]:
    """The export table of items' ``fields`` (and ``inputs``), by item id; its JSON columns and renames.

    JSON columns are named as columns (an input's key as ``input.<key>``); renames map field -> column.
    """
    ids = sorted(fields)
    names, arrays, as_json = typed_columns([fields[i] for i in ids], ids, "field")
    columns = column_names(names)
    schema = [pa.field("item_id", pa.string(), nullable=False), pa.field("key", pa.string(), nullable=False)]
    data: list[pa.Array] = [pa.array(ids, pa.string()), pa.array([key_of(i) for i in ids], pa.string())]
    json_columns = []
    for name, arr, is_json in zip(names, arrays, as_json, strict=True):
        meta = dict(JSON_FIELD_META) if is_json else {}
        if columns[name] != name:
            meta["datagen_field"] = name
        schema.append(pa.field(columns[name], arr.type, metadata=meta or None))
        data.append(arr)
        if is_json:
            json_columns.append(columns[name])
    if inputs is not None:
        struct = input_struct([inputs[i] for i in ids], ids)
        schema.append(pa.field("input", struct.type))
        data.append(struct)
        json_columns.extend(input_json_keys(struct.type))
    table = pa.Table.from_arrays(data, schema=pa.schema(schema))
    return table, json_columns, {f: c for f, c in columns.items() if f != c}


def binary_columns(table: pa.Table) -> list[str]:
    return [f.name for f in table.schema if pa.types.is_large_binary(f.type) or pa.types.is_binary(f.type)]


def wide_binary(table: pa.Table, fmt: str) -> pa.Table:
    """Binary columns as ``large_binary`` (Lance: blob-encoded, so a scan does not read the bytes)."""
    for i, f in enumerate(table.schema):
        t = f.type
        if pa.types.is_binary(t) or pa.types.is_large_binary(t):
            meta = dict(f.metadata or {})
            if fmt == "lance":
                meta.update(LANCE_BLOB_META)
            wide = pa.field(f.name, pa.large_binary(), f.nullable, meta or None)
            table = table.set_column(i, wide, table.column(i).cast(pa.large_binary()))
        elif pa.types.is_list(t) and pa.types.is_binary(t.value_type):
            wide = pa.field(f.name, pa.list_(pa.large_binary()), f.nullable, f.metadata)
            table = table.set_column(i, wide, table.column(i).cast(wide.type))
    return table
