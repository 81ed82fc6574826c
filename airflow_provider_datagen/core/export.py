"""Deterministic export of results: the folded fields of completed items, never a log row.

The export is the output artifact and the log is its sidecar manifest, so no output contains
manifest rows (see docs/design.md, "Resume"). Its fingerprint digests content only (item ids and
canonical field JSON in id order), so "resumed == uninterrupted" is one string comparison whatever
the history or the column layout. Result sets merge as a commutative monoid (union keyed by item id,
the empty set as identity), which is what licenses chunked, uncoordinated workers: their parts merge in
any order.

Layout: ``item_id``, ``key``, one column per field (sorted by name), then ``input`` when asked for.
A field's column has the Arrow type inferred from its values when that type holds every value exactly
(read back, the column gives the same canonical JSON); otherwise (values of different types, an int
among floats, dicts with different keys, ints beyond 64 bits, nesting deeper than
:data:`MAX_TYPE_DEPTH`) it holds each value's canonical JSON text, and its Arrow field carries
``datagen_encoding: json``. An item without the field, and a null value, read as null. A field named
like one of :data:`RESERVED_COLUMNS`, or whose name holds a ``.`` (Lance refuses dots in column
names), gets the column ``field_<name>`` (dots as ``_``; ``_2``, ``_3``... if that is taken too) and
its Arrow field carries ``datagen_field: <name>``. The dataset's schema metadata ``datagen_export``
records what was exported, so an unchanged export writes no new version.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_datagen.core.events import BlobRef, canonical_json, canonical_source_json
from airflow_provider_datagen.core.ids import key_of
from airflow_provider_datagen.core.source_scan import scan_batches
from airflow_provider_datagen.core.sources import load_source, source_path
from airflow_provider_datagen.core.store.lance_io import export_metadata, write_results_dataset
from airflow_provider_datagen.core.store.paths import list_experiments
from airflow_provider_datagen.core.store.source_ref import PATH, recorded_source
from airflow_provider_datagen.exceptions import (
    DatagenError,
    ExperimentNotFoundError,
    InvalidValueError,
    bad_argument,
)

if TYPE_CHECKING:
    from airflow_provider_datagen.core.fold import ItemState
    from airflow_provider_datagen.core.store.log import CheckpointLog

#: Columns the export writes itself; a field of one of these names is exported renamed.
RESERVED_COLUMNS: Final = ("item_id", "key", "input")
#: Deeper types than this are exported as JSON text: Lance refuses schemas nested ~64 levels deep.
MAX_TYPE_DEPTH: Final = 32
#: The schema metadata key recording what an export holds; :data:`EXPORT_FORMAT` versions its layout.
EXPORT_META_KEY: Final = "datagen_export"
EXPORT_FORMAT: Final = 2
_JSON_FIELD_META: Final = {"datagen_encoding": "json"}
_MISSING_FIX: Final = (
    "Nothing was exported. Check the pipeline and experiment names (the plan's and the generate task's) and "
    "the connection's root, or run the generation first"
)

#: Results as data: item id -> canonical JSON of its folded fields.
Results = Mapping[str, str]


def _materialize_one(value: Any) -> Any:
    if isinstance(value, BlobRef):
        loaded = value.load()
        return {"$bytes_sha256": value.digest, "size": value.size} if isinstance(loaded, bytes) else loaded
    return value


def _materialize(value: Any) -> Any:
    # A folded field is a value or (FIELD_APPEND) a list of values; blob refs sit at one of those two
    # levels only, so never recurse into the values themselves: they may nest as deep as JSON allows.
    if isinstance(value, list):
        return [_materialize_one(v) for v in value]
    return _materialize_one(value)


def _fields(states: Mapping[str, ItemState]) -> dict[str, dict[str, Any]]:
    return {iid: {k: _materialize(v) for k, v in st.fields.items()} for iid, st in states.items()}


def _canonical(fields: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    return {iid: canonical_json(f, what=f"fields of item {iid!r}") for iid, f in fields.items()}


def collect_results(log: CheckpointLog) -> dict[str, str]:
    """Completed root items -> canonical JSON of their folded fields (blob values loaded).

    The result set of one log, without writing an export: what :func:`merge_results` unions across
    logs (or shards of one experiment) and :func:`results_fingerprint` hashes.
    """
    return _canonical(_fields(log.completed_root_states()))


def merge_results(*parts: Results) -> dict[str, str]:
    """Union of result sets; the same item with different content is a conflict, not a choice."""
    merged: dict[str, str] = {}
    for part in parts:
        for iid, text in part.items():
            prev = merged.get(iid)
            if prev is not None and prev != text:
                raise InvalidValueError(
                    f"item {iid!r} has different results in two parts being merged; processing must be "
                    "deterministic (the same item must always give the same fields)"
                )
            merged[iid] = text
    return merged


def results_fingerprint(results: Results) -> str:
    """Content digest of a result set: ids and canonical fields in id order."""
    h = hashlib.sha256()
    for iid in sorted(results):
        h.update(iid.encode("utf-8", "surrogatepass"))
        h.update(b"\x1f")
        h.update(results[iid].encode("utf-8", "surrogatepass"))
        h.update(b"\n")
    return h.hexdigest()


def require_experiment(log: CheckpointLog, *, fix: str = _MISSING_FIX) -> None:
    """Raise :class:`ExperimentNotFoundError` unless the experiment has a log; ``fix`` (a sentence) ends it.

    Opening a log never creates it, so a misspelt name would otherwise read as an empty experiment.
    """
    if log.exists():
        return
    try:
        known = [r.experiment for r in list_experiments(log.root, log.storage_options) if r.pipeline == log.pipeline]
    except (OSError, ValueError, DatagenError):
        known = None  # an unlistable root: the message still names where the log was looked for
    if known:
        shown = ", ".join(repr(e) for e in known[:20]) + (f" and {len(known) - 20} more" if len(known) > 20 else "")
        seen = f" Experiments of pipeline {log.pipeline!r} under this root: {shown}."
    elif known is not None:
        seen = f" No experiment of pipeline {log.pipeline!r} exists under this root."
    else:
        seen = ""
    raise ExperimentNotFoundError(
        f"experiment {log.pipeline!r}/{log.experiment!r} does not exist: it has no log under root "
        f"{log.root!r} (looked for {log.uri}).{seen} {fix}."
    )


# --- typed columns --------------------------------------------------------------------------------


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


def _typed_columns(
    rows: list[Mapping[str, Any]], ids: list[str], what: str
) -> tuple[list[str], list[pa.Array], list[bool]]:
    names = sorted({k for r in rows for k in r})
    arrays, as_json = [], []
    for name in names:
        arr, is_json = _column([r.get(name) for r in rows], ids, f"{what} {name!r}")
        arrays.append(arr)
        as_json.append(is_json)
    return names, arrays, as_json


def results_table(
    fields: Mapping[str, Mapping[str, Any]], inputs: Mapping[str, Mapping[str, Any]] | None = None
) -> tuple[pa.Table, list[str], dict[str, str]]:
    """The export table of items' ``fields`` (and ``inputs``), by item id; its JSON columns and renames.

    JSON columns are named as columns (an input's key as ``input.<key>``); renames map field -> column.
    """
    ids = sorted(fields)
    names, arrays, as_json = _typed_columns([fields[i] for i in ids], ids, "field")
    columns = column_names(names)
    schema = [pa.field("item_id", pa.string(), nullable=False), pa.field("key", pa.string(), nullable=False)]
    data: list[pa.Array] = [pa.array(ids, pa.string()), pa.array([key_of(i) for i in ids], pa.string())]
    json_columns = []
    for name, arr, is_json in zip(names, arrays, as_json, strict=True):
        meta = dict(_JSON_FIELD_META) if is_json else {}
        if columns[name] != name:
            meta["datagen_field"] = name
        schema.append(pa.field(columns[name], arr.type, metadata=meta or None))
        data.append(arr)
        if is_json:
            json_columns.append(columns[name])
    if inputs is not None:
        keys, children, child_json = _typed_columns([inputs[i] for i in ids], ids, "input key")
        child_fields = [
            pa.field(k, a.type, metadata=dict(_JSON_FIELD_META) if j else None)
            for k, a, j in zip(keys, children, child_json, strict=True)
        ]
        struct = (
            pa.StructArray.from_arrays(children, fields=child_fields) if keys else pa.nulls(len(ids), pa.struct([]))
        )
        schema.append(pa.field("input", struct.type))
        data.append(struct)
        json_columns.extend(f"input.{k}" for k, j in zip(keys, child_json, strict=True) if j)
    table = pa.Table.from_arrays(data, schema=pa.schema(schema))
    return table, json_columns, {f: c for f, c in columns.items() if f != c}


# --- the export -----------------------------------------------------------------------------------


def _inputs(
    source: Any, key_field: str, states: Mapping[str, ItemState], storage_options: dict[str, str] | None
) -> dict[str, dict[str, Any]]:
    """The source inputs of the exported items, checked to be the ones they were generated from."""
    by_id = {s.item_id: s for s in load_source(source, key_field, storage_options=storage_options)}
    ids = sorted(states)
    missing = [i for i in ids if i not in by_id]
    if missing:
        raise bad_argument(
            "export_results",
            "source",
            source,
            f"lacks {len(missing)} of the exported items (e.g. key {key_of(missing[0])!r}, key_field={key_field!r})",
            "pass the source and key_field the experiment was planned with, or export without include_input",
        )
    edited = [i for i in ids if states[i].input_fingerprint != by_id[i].fingerprint]
    if edited:
        raise bad_argument(
            "export_results",
            "source",
            source,
            f"holds other inputs than {len(edited)} exported items were generated from (e.g. key "
            f"{key_of(edited[0])!r}, edited since)",
            "run the plan and generation again to regenerate them from these inputs, or pass the source they "
            "were generated from",
        )
    return {i: by_id[i].data for i in ids}


def _inputs_digest(states: Mapping[str, ItemState]) -> str:
    h = hashlib.sha256()
    for iid in sorted(states):
        h.update(f"{iid}\x1f{states[iid].input_fingerprint}\n".encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def _stored_marker(destination_uri: str, storage_options: dict[str, str] | None) -> dict[str, Any] | None:
    found = export_metadata(destination_uri, storage_options)
    if found is None:
        return None
    meta, rows = found
    try:
        marker = json.loads(meta[EXPORT_META_KEY])
    except (KeyError, ValueError):
        return None  # written by an older release or another tool: rewrite it
    if not isinstance(marker, dict) or marker.get("rows") != rows:
        return None  # rows were added or removed since: not what the marker describes
    return marker


def source_item_ids(source: Any, key_field: str, storage_options: dict[str, str] | None) -> pa.Array:
    """The item ids of a source (a list of dicts, or a path/URI read a batch at a time: ids, never rows)."""
    if isinstance(source, (list, tuple)):
        return pa.array([s.item_id for s in load_source(list(source), key_field)], pa.string())
    batches = [b.ids for b in scan_batches(source_path(source), key_field, storage_options)]
    return pa.concat_arrays(batches) if batches else pa.array([], pa.string())


def _left_out(
    log: CheckpointLog, ids: list[str], source: Any, key_field: str, include_removed: bool
) -> set[str] | None:
    """Which of the completed ``ids`` the source does not hold (None: keep every one).

    ``source`` given: that source's ids. Else the source the last plan recorded: the log's items it
    did not hold, as the plan listed them (no read of the source), or, for a plan that did not list
    them (a partitioned plan of a large path source), the recorded path's ids. No recorded source:
    every completed item, as before sources were recorded.
    """
    if include_removed:
        return None
    if source is None:
        ref = recorded_source(log.uri, log.storage_options)
        if ref is None:
            return None
        if ref.removed_ids is not None:
            return set(ref.removed_ids)
        if ref.kind != PATH or ref.uri_redacted:
            return None  # an older inline record, or a URI whose credentials were cut: as before
        source, key_field = ref.uri, ref.key_field
    held = source_item_ids(source, key_field, log.storage_options)
    done = pa.array(ids, pa.string())
    return set(pc.filter(done, pc.invert(pc.is_in(done, value_set=held))).to_pylist())


def export_results(
    log: CheckpointLog,
    destination_uri: str,
    *,
    storage_options: dict[str, str] | None = None,
    include_input: bool = False,
    source: Any = None,
    key_field: str = "id",
    include_removed: bool = False,
) -> dict[str, Any]:
    """Write completed items' folded fields, one typed column each, ordered by item id, to a Lance dataset.

    Only the items of the experiment's current source are exported: the one the last plan recorded,
    or ``source`` when given. A completed item whose row was deleted from the source is left out
    (counted in ``removed``); ``include_removed=True`` exports every completed item. An experiment
    whose plans recorded no source exports every completed item.

    :param include_input: add each item's source input as a struct column ``input``; the log keeps
        only input fingerprints, so ``source`` (and ``key_field``) must give the items they were
        generated from.
    :raises ExperimentNotFoundError: the experiment has no log (nothing is written).

    Returns ``{"rows", "fingerprint", "changed", "json_fields", "renamed_fields", "removed"}``: equal
    results give equal fingerprints; ``changed`` is False when the destination already held this very
    export (then nothing is written); ``json_fields`` lists the columns holding JSON text,
    ``renamed_fields`` maps a field to its column when they differ; ``removed`` is how many completed
    items were left out because the source no longer holds them.
    """
    if not isinstance(include_input, bool):
        raise bad_argument("export_results", "include_input", include_input, "is not a bool", "pass True or False")
    if not isinstance(include_removed, bool):
        raise bad_argument(
            "export_results",
            "include_removed",
            include_removed,
            "is not a bool",
            "pass True to export completed items the source no longer holds too, False for the source's only",
        )
    if include_input and source is None:
        raise bad_argument(
            "export_results",
            "include_input",
            include_input,
            "needs the items' inputs, and the log keeps only their fingerprints",
            "pass source= and key_field= as given to the plan, or include_input=False",
        )
    require_experiment(log)
    states = log.completed_root_states()
    gone = _left_out(log, list(states), source, key_field, include_removed)
    removed = 0
    if gone:
        kept = {i: st for i, st in states.items() if i not in gone}
        removed = len(states) - len(kept)
        states = kept
    fields = _fields(states)
    fingerprint = results_fingerprint(_canonical(fields))
    # the source is read as the plan read it: with the log's (the datagen connection's) storage options
    inputs = _inputs(source, key_field, states, log.storage_options) if include_input else None
    content = {
        "format": EXPORT_FORMAT,
        "fingerprint": fingerprint,
        "inputs": _inputs_digest(states) if include_input else None,
        "rows": len(fields),
    }
    stored = _stored_marker(destination_uri, storage_options)
    if stored is not None and all(stored.get(k) == v for k, v in content.items()):
        return {
            "rows": len(fields),
            "fingerprint": fingerprint,
            "changed": False,
            "json_fields": list(stored.get("json_fields", [])),
            "renamed_fields": dict(stored.get("renamed_fields", {})),
            "removed": removed,
        }
    table, json_fields, renamed = results_table(fields, inputs)
    marker = {**content, "json_fields": json_fields, "renamed_fields": renamed}
    table = table.replace_schema_metadata({EXPORT_META_KEY: canonical_json(marker)})
    write_results_dataset(table, destination_uri, storage_options=storage_options)
    return {
        "rows": len(fields),
        "fingerprint": fingerprint,
        "changed": True,
        "json_fields": json_fields,
        "renamed_fields": renamed,
        "removed": removed,
    }
