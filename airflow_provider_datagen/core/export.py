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
among floats, dicts with different keys, ints beyond 64 bits, nesting deeper than ``MAX_TYPE_DEPTH``)
it holds each value's canonical JSON text, and its Arrow field carries ``datagen_encoding: json``.
An item without the field, and a null value, read as null. A ``bytes`` value is its bytes in a
``large_binary`` column (``include_blobs=False``: a ``{"$bytes_sha256", "size"}`` struct; the
fingerprint digests that struct either way). A field named ``item_id``, ``key`` or ``input``, or
whose name holds a ``.`` (Lance refuses dots in column names), gets the column ``field_<name>``
(dots as ``_``; ``_2``, ``_3``... if that is taken too) and its Arrow field carries
``datagen_field: <name>``. The dataset's schema metadata ``datagen_export`` records what was
exported (a Parquet or JSONL export keeps it in its manifest), so an unchanged export writes no
new version. The table is built in :mod:`~airflow_provider_datagen.core.export_columns`,
part files are written by :mod:`~airflow_provider_datagen.core.export_files`.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final

import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_datagen.core.events import BlobRef, canonical_json
from airflow_provider_datagen.core.export_columns import (
    binary_columns,
    results_table,
    wide_binary,
)
from airflow_provider_datagen.core.export_files import (
    PARQUET_MAX_VALUE_BYTES,
    destination_kind,
    files_marker,
    write_files_export,
)
from airflow_provider_datagen.core.export_reads import source_batches
from airflow_provider_datagen.core.export_spec import FILE_FORMATS, FORMATS
from airflow_provider_datagen.core.export_stream import (
    EXPORT_BATCH_ITEMS,
    Spilled,
    StateBatch,
    conformed,
    layout,
    spill,
    state_batches,
)
from airflow_provider_datagen.core.ids import key_of
from airflow_provider_datagen.core.schema import VALUE_KIND_BYTES, ItemStatus
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

#: The schema metadata key recording what an export holds; :data:`EXPORT_FORMAT` versions its layout.
EXPORT_META_KEY: Final = "datagen_export"
EXPORT_FORMAT: Final = 2
_MISSING_FIX: Final = (
    "Nothing was exported. Check the pipeline and experiment names (the plan's and the generate task's) and "
    "the connection's root, or run the generation first"
)

#: Results as data: item id -> canonical JSON of its folded fields.
Results = Mapping[str, str]


def _materialize_one(value: Any, blobs: bool) -> Any:
    if isinstance(value, BlobRef):
        if value.kind == VALUE_KIND_BYTES:
            # the digest stands for the bytes in the fingerprint (it is their content address)
            return value.load() if blobs else {"$bytes_sha256": value.digest, "size": value.size}
        return value.load()
    return value


def _materialize(value: Any, blobs: bool) -> Any:
    # A folded field is a value or (FIELD_APPEND) a list of values; blob refs sit at one of those two
    # levels only, so never recurse into the values themselves: they may nest as deep as JSON allows.
    if isinstance(value, list):
        return [_materialize_one(v, blobs) for v in value]
    return _materialize_one(value, blobs)


def _fields(states: Mapping[str, ItemState], blobs: bool = False) -> dict[str, dict[str, Any]]:
    """Items' folded fields; a bytes value as its bytes with ``blobs``, else as its digest struct."""
    return {iid: {k: _materialize(v, blobs) for k, v in st.fields.items()} for iid, st in states.items()}


def _byte_sizes(states: Mapping[str, ItemState]) -> Iterator[tuple[str, str, int]]:
    """(item id, field, size) of every bytes value (read from the log's rows: no blob is loaded)."""
    for iid, st in states.items():
        for name, value in st.fields.items():
            for v in value if isinstance(value, list) else [value]:
                if isinstance(v, BlobRef) and v.kind == VALUE_KIND_BYTES:
                    yield iid, name, v.size


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
        raise _edited_error(source, len(edited), edited[0])
    return {i: by_id[i].data for i in ids}


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


def exported_ids(log: CheckpointLog, source: Any, key_field: str, include_removed: bool) -> tuple[pa.Array, int]:
    """The ids (sorted) of the completed root items an export holds (see :func:`export_results`), and how
    many completed items were left out.

    :raises ExperimentNotFoundError: the experiment has no log.
    """
    require_experiment(log)
    states = log.states()
    if states.num_rows == 0:
        return pa.array([], pa.string()), 0
    done = states.filter(
        pc.and_(
            pc.equal(states["status"], ItemStatus.COMPLETED.value),
            pc.equal(pc.count_substring(states["item_id"], "/"), 0),
        )
    )["item_id"]
    ids = done.take(pc.sort_indices(done))
    gone = _left_out(log, ids.to_pylist(), source, key_field, include_removed)
    if not gone:
        return ids, 0
    kept = pc.filter(ids, pc.invert(pc.is_in(ids, value_set=pa.array(sorted(gone), pa.string()))))
    return kept, len(ids) - len(kept)


def exported_states(
    log: CheckpointLog, source: Any, key_field: str, include_removed: bool
) -> tuple[dict[str, ItemState], int]:
    """The folds of the items :func:`exported_ids` names, all in memory (an in-memory dataset's read)."""
    ids, removed = exported_ids(log, source, key_field, include_removed)
    states: dict[str, ItemState] = {}
    for part in state_batches(log, ids, EXPORT_BATCH_ITEMS):
        states.update(part)
    return states, removed


def export_table(
    states: Mapping[str, ItemState], inputs: Mapping[str, Mapping[str, Any]] | None, *, include_blobs: bool, fmt: str
) -> tuple[pa.Table, list[str], dict[str, str]]:
    """The export table of ``states`` in ``fmt``'s layout, its JSON columns and renames (no marker)."""
    table, json_fields, renamed = results_table(_fields(states, blobs=include_blobs), inputs)
    return wide_binary(table, fmt), json_fields, renamed


def items_inputs(
    source: Any, key_field: str, states: Mapping[str, ItemState], log: CheckpointLog
) -> dict[str, dict[str, Any]]:
    """The source inputs of the exported items, read as the plan read them (the log's storage options)."""
    return _inputs(source, key_field, states, log.storage_options)


def _check_arguments(fmt: Any, include_input: Any, include_removed: Any, include_blobs: Any, source: Any) -> None:
    if fmt not in FORMATS:
        raise bad_argument(
            "export_results", "format", fmt, "is not an export format", f"pass one of {', '.join(map(repr, FORMATS))}"
        )
    for param, value in (("include_input", include_input), ("include_blobs", include_blobs)):
        if not isinstance(value, bool):
            raise bad_argument("export_results", param, value, "is not a bool", "pass True or False")
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


def _check_destination(destination_uri: str, storage_options: dict[str, str] | None, fmt: str) -> None:
    """Refuse a destination holding another format's export (or, for a file format, other files)."""
    kind = destination_kind(destination_uri, storage_options)
    if kind is None or kind == fmt or (fmt == "lance" and kind == "other"):
        return
    held = "files that are no datagen export" if kind == "other" else f"a {kind} export"
    raise bad_argument(
        "export_results",
        "destination",
        destination_uri,
        f"holds {held}, not a {fmt} one",
        f"pass format={kind!r} to update it, or export to another (new or empty) destination"
        if kind != "other"
        else "export to a new or empty folder",
    )


def _check_parquet_sizes(states: Mapping[str, ItemState]) -> None:
    for iid, name, size in _byte_sizes(states):
        if size > PARQUET_MAX_VALUE_BYTES:
            raise bad_argument(
                "export_results",
                "format",
                "parquet",
                f"cannot hold field {name!r} of item {iid!r}: {size} bytes, over Parquet's "
                f"{PARQUET_MAX_VALUE_BYTES} per value",
                "export with format='lance' (blob-encoded bytes) or include_blobs=False (their digests)",
            )


def _stored(destination_uri: str, storage_options: dict[str, str] | None, fmt: str) -> dict[str, Any] | None:
    if fmt == "lance":
        return _stored_marker(destination_uri, storage_options)
    return files_marker(destination_uri, storage_options, fmt)


def export_results(
    log: CheckpointLog,
    destination_uri: str,
    *,
    storage_options: dict[str, str] | None = None,
    include_input: bool = False,
    source: Any = None,
    key_field: str = "id",
    include_removed: bool = False,
    format: str = "lance",
    include_blobs: bool = True,
) -> dict[str, Any]:
    """Write completed items' folded fields, one typed column each, ordered by item id, to ``destination_uri``.

    ``format="lance"`` writes a Lance dataset; ``"parquet"`` and ``"jsonl"`` write part files and a
    manifest under the destination folder (see :mod:`~airflow_provider_datagen.core.export_files`).
    The columns and the fingerprint are the same in every format. Only the items of the experiment's
    current source are exported: the one the last plan recorded, or ``source`` when given. A
    completed item whose row was deleted from the source is left out (counted in ``removed``);
    ``include_removed=True`` exports every completed item. An experiment whose plans recorded no
    source exports every completed item.

    :param include_input: add each item's source input as a struct column ``input``; the log keeps
        only input fingerprints, so ``source`` (and ``key_field``) must give the items they were
        generated from.
    :param format: ``"lance"``, ``"parquet"`` or ``"jsonl"``.
    :param include_blobs: export a ``bytes`` field as a binary column of its bytes (Lance: blob-encoded
        ``large_binary``; Parquet: ``large_binary``; JSONL: base64 text, named in ``base64_fields``);
        False exports each as ``{"$bytes_sha256", "size"}``.
    :raises ExperimentNotFoundError: the experiment has no log (nothing is written).
    :raises ConfigurationError: an unknown format, a destination holding another format, a bytes value
        Parquet cannot hold (nothing is written).

    Returns ``{"rows", "fingerprint", "changed", "json_fields", "renamed_fields", "removed", "format",
    "base64_fields"}``: equal results give equal fingerprints; ``changed`` is False when the destination
    already held this very export (then nothing is written); ``json_fields`` lists the columns holding
    JSON text, ``renamed_fields`` maps a field to its column when they differ; ``removed`` is how many
    completed items were left out because the source no longer holds them.
    """
    _check_arguments(format, include_input, include_removed, include_blobs, source)
    _check_destination(destination_uri, storage_options, format)
    ids, removed = exported_ids(log, source, key_field, include_removed)
    batches: Iterator[dict[str, ItemState]] = state_batches(log, ids, EXPORT_BATCH_ITEMS)
    if format == "parquet" and include_blobs:
        batches = _parquet_checked(batches)
    paired: Iterator[StateBatch] = (
        # the log keeps only fingerprints: the inputs come from one streamed read of the source
        _with_inputs(source, key_field, ids, batches, log.storage_options)
        if include_input
        else ((states, None) for states in batches)
    )
    spilled = spill(paired, lambda st: _canonical(_fields(st)), lambda st: _fields(st, include_blobs))
    try:
        return _write(spilled, destination_uri, storage_options, format, include_blobs, include_input, removed)
    finally:
        spilled.discard()


def _parquet_checked(batches: Iterator[dict[str, ItemState]]) -> Iterator[dict[str, ItemState]]:
    for states in batches:
        _check_parquet_sizes(states)
        yield states


def _with_inputs(
    source: Any,
    key_field: str,
    ids: pa.Array,
    batches: Iterator[dict[str, ItemState]],
    storage_options: dict[str, str] | None,
) -> Iterator[tuple[dict[str, ItemState], dict[str, dict[str, Any]]]]:
    """Each batch of folds with its items' source dicts, checked to be the inputs they were generated from.

    The source is read first (a source lacking items fails before the log is read); items generated from
    other inputs are counted over every batch and refused at the end, before anything is written.
    """
    folder = tempfile.mkdtemp(prefix="datagen-export-source-")
    edited, first_edited = 0, ""
    try:
        for rows in source_batches(source, key_field, ids, EXPORT_BATCH_ITEMS, storage_options, folder):
            states = next(batches)
            for iid, st in states.items():
                if st.input_fingerprint != rows[iid].fingerprint:
                    edited += 1
                    first_edited = first_edited or iid
            if not edited:
                yield states, {iid: rows[iid].data for iid in states}
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if edited:
        raise _edited_error(source, edited, first_edited)


def _edited_error(source: Any, edited: int, first: str) -> DatagenError:
    return bad_argument(
        "export_results",
        "source",
        source,
        f"holds other inputs than {edited} exported items were generated from (e.g. key "
        f"{key_of(first)!r}, edited since)",
        "run the plan and generation again to regenerate them from these inputs, or pass the source they "
        "were generated from",
    )


def _write(
    spilled: Spilled,
    destination_uri: str,
    storage_options: dict[str, str] | None,
    fmt: str,
    include_blobs: bool,
    include_input: bool,
    removed: int,
) -> dict[str, Any]:
    """Pass two of :func:`export_results`: nothing when the destination holds this export, else the write."""
    content = {
        "format": EXPORT_FORMAT,
        "fingerprint": spilled.fingerprint,
        "inputs": spilled.inputs_digest if include_input else None,
        "rows": spilled.rows,
        "blobs": include_blobs,
    }
    result = {"rows": spilled.rows, "fingerprint": spilled.fingerprint, "removed": removed, "format": fmt}
    stored = _stored(destination_uri, storage_options, fmt)
    if stored is not None and all(stored.get(k) == v for k, v in content.items()):
        return {
            **result,
            "changed": False,
            "json_fields": list(stored.get("json_fields", [])),
            "renamed_fields": dict(stored.get("renamed_fields", {})),
            "base64_fields": list(stored.get("base64_fields", [])),
        }
    plan = layout(spilled)
    schema = wide_binary(plan.schema.empty_table(), fmt).schema
    base64_fields = binary_columns(schema.empty_table()) if fmt == "jsonl" else []
    marker = {
        **content,
        "json_fields": plan.json_fields,
        "renamed_fields": plan.renamed,
        "base64_fields": base64_fields,
    }
    schema = schema.with_metadata({EXPORT_META_KEY: canonical_json(marker)})
    tables = (wide_binary(t, fmt).cast(schema) for t in conformed(spilled, plan))
    if fmt in FILE_FORMATS:
        write_files_export(tables, schema, destination_uri, storage_options, fmt, marker)
    else:
        reader = pa.RecordBatchReader.from_batches(schema, (b for t in tables for b in t.to_batches()))
        write_results_dataset(reader, destination_uri, storage_options=storage_options)
    return {
        **result,
        "changed": True,
        "json_fields": plan.json_fields,
        "renamed_fields": plan.renamed,
        "base64_fields": base64_fields,
    }
