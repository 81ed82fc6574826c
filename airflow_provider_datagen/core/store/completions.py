"""Many items completed in one commit, built column by column: the recording of a batch's results.

A batch run (core/batch) records each succeeded row as the same three kinds of event: a FIELD_SET per
answer field, the STEP_COMPLETED holding the attempt's usage, and the TERMINAL ``completed``. Staged one
event at a time (:class:`~.batch.Batch`) and numbered by :meth:`LogWriter.commit`, that costs about
30 us per item; here the events of thousands of items are numbered, hashed and laid out in one pass,
and the table is the one the one-by-one path builds (same sequence numbers, event ids and columns;
``tests/core/store/test_completions.py`` holds them equal).
"""

from __future__ import annotations

import hashlib
import operator
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from airflow_provider_datagen.core.events import ID_DIGEST_SIZE, event_ids_of
from airflow_provider_datagen.core.ids import check_field_name, parent_of, root_of
from airflow_provider_datagen.core.schema import DATAGEN_SCHEMA_VERSION, EVENT_SCHEMA
from airflow_provider_datagen.core.store.batch import SEP
from airflow_provider_datagen.exceptions import InvalidEventError

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from airflow_provider_datagen.core.events import EncodedValue
    from airflow_provider_datagen.core.store.batch import Shape

#: One completed item: ``(item_id, [(field name, encoded value), ...], encoded STEP_COMPLETED value)``.
Completion = tuple[str, "Sequence[tuple[str, EncodedValue]]", "EncodedValue"]
_SET = "set"


def sequence_completions(
    rows: Sequence[Completion],
    cursors: Mapping[str, Sequence[Any]],
    shapes: tuple[Shape, Shape, Shape],
) -> tuple[dict[str, list[Any]], dict[str, Any]]:
    """Number and hash the events of ``rows`` from the items' ``cursors``; the new cursors and what
    :func:`completions_columns` lays out (per event only its digest; the rest per item or per field).

    ``shapes``: the FIELD_SET, STEP_COMPLETED and TERMINAL shapes. Raises, before anything is written,
    on a repeated item or a field the item already writes in append mode (the one-by-one path's rule).
    """
    field_shape, completed_shape, terminal_shape = shapes
    f_mid, f_coords = field_shape.id_middle, field_shape.id_coords
    c_mid, c_coords = completed_shape.id_middle, completed_shape.id_coords
    t_mid, t_tail = terminal_shape.id_middle, terminal_shape.id_tail
    new_hash = hashlib.blake2b(digest_size=ID_DIGEST_SIZE).copy
    out: dict[str, list[Any]] = {}
    first_seqs: list[int] = []  # per item
    fps: list[str | None] = []
    counts: list[int] = []  # fields per item
    names: list[str] = []  # per field event
    encs: list[EncodedValue] = []
    values: list[EncodedValue] = []  # per item: its STEP_COMPLETED value
    digests: list[bytes] = []  # per event
    add_digest, add_name, add_enc = digests.append, names.append, encs.append
    shared_modes: dict[tuple[str, ...], dict[str, str]] = {}
    for iid, fields, value in rows:
        if iid in out:
            raise InvalidEventError(f"item {iid!r} is completed twice in one commit; record each item once")
        seq, fp, modes, owned = cursors[iid]
        first_seqs.append(seq + 1)
        fps.append(fp)
        counts.append(len(fields))
        values.append(value)
        fpt = "" if fp is None else fp
        if not modes and not owned:
            # a new generation (no field yet): its modes are those of its field names, one shared map per
            # set of names, never mutated (the cursor does not own it: a later write copies it first)
            key = tuple(name for name, _ in fields)
            shared = shared_modes.get(key)
            if shared is None:
                for name in key:
                    check_field_name(name)
                shared = shared_modes[key] = dict.fromkeys(key, _SET)
            modes = shared
        else:
            for name, _ in fields:
                check_field_name(name)
                prev = modes.get(name)
                if prev is None:
                    if not owned:
                        modes, owned = dict(modes), True
                    modes[name] = _SET
                elif prev != _SET:
                    raise InvalidEventError(
                        f"item {iid!r}: field {name!r} was written with FIELD_{prev.upper()} and cannot take "
                        "FIELD_SET; use one mode per field (nothing of this batch was written)"
                    )
        for name, enc in fields:
            seq += 1
            h = new_hash()
            h.update(
                f"{iid}{SEP}{seq}{f_mid}{fpt}{f_coords}{SEP}{name}{SEP}{enc.kind}:{enc.digest}{SEP}{SEP}".encode(
                    "utf-8", "surrogatepass"
                )
            )
            add_digest(h.digest())
            add_name(name)
            add_enc(enc)
        h = new_hash()
        h.update(
            f"{iid}{SEP}{seq + 1}{c_mid}{fpt}{c_coords}{SEP}{SEP}{value.kind}:{value.digest}{SEP}{SEP}".encode(
                "utf-8", "surrogatepass"
            )
        )
        add_digest(h.digest())
        h = new_hash()
        h.update(f"{iid}{SEP}{seq + 2}{t_mid}{fpt}{t_tail}".encode("utf-8", "surrogatepass"))
        add_digest(h.digest())
        out[iid] = [seq + 2, fp, modes, owned]
    return out, {
        "item_ids": list(out),
        "first_seqs": first_seqs,
        "fps": fps,
        "counts": counts,
        "names": names,
        "encs": encs,
        "values": values,
        "digests": digests,
    }


def completions_columns(
    staged: dict[str, Any],
    shapes: tuple[Shape, Shape, Shape],
    shape_columns: Sequence[str],
    processor_version: str | None,
) -> dict[str, Any]:
    """The per-event columns of :func:`sequence_completions`' output (the writer adds its constant ones).

    Item-level columns are built once per item and spread to its events by ``take``, so Arrow converts
    one Python value per item (or per field), not one per event. ``shape_columns``: the names of
    :attr:`Shape.columns`, in order (the writer's ``SHAPE_COLUMNS``).
    """
    n_items = len(staged["item_ids"])
    counts = np.fromiter(staged["counts"], np.int64, n_items)
    per_item = counts + 2  # its fields, the STEP_COMPLETED, the TERMINAL
    n = int(per_item.sum())
    starts = np.cumsum(per_item) - per_item  # each item's first event
    owner = np.repeat(np.arange(n_items), per_item)  # each event's item
    pos = np.arange(n) - starts[owner]  # each event's place in its item
    n_fields = int(counts.sum())
    # 0: a field event, 1: the STEP_COMPLETED, 2: the TERMINAL
    kind = np.where(pos < counts[owner], 0, np.where(pos == counts[owner], 1, 2)).astype(np.int32)
    # where an event's value is in [field values..., completed values...]; the TERMINAL's is null
    field_rank = np.cumsum(kind == 0) - 1
    source = np.where(kind == 0, field_rank, n_fields + owner)
    value_at = pa.array(source, mask=kind == 2)
    take_item = pa.array(owner)

    cols: dict[str, Any] = {}
    ids, keys = event_ids_of(b"".join(staged["digests"]))
    cols["event_id"] = ids
    cols["event_key"] = pa.array(keys)
    cols["schema_version"] = pa.array(np.full(n, DATAGEN_SCHEMA_VERSION, np.int32))
    item_ids = staged["item_ids"]
    item_arr = pa.array(item_ids, pa.string()).take(take_item)
    cols["item_id"] = item_arr
    if "/" in "\n".join(item_ids):
        cols["root_item_id"] = pa.array([root_of(iid) for iid in item_ids], pa.string()).take(take_item)
        cols["parent_item_id"] = pa.array([parent_of(iid) for iid in item_ids], pa.string()).take(take_item)
    else:
        cols["root_item_id"] = item_arr
        cols["parent_item_id"] = pa.nulls(n, pa.string())
    first = np.fromiter(staged["first_seqs"], np.int64, n_items)
    cols["item_seq"] = pa.array(first[owner] + pos)
    where = pa.array(kind)
    for j, name in enumerate(shape_columns):
        values = [shape.columns[j] for shape in shapes]
        if name == "processor_version":
            values = [processor_version if v is None else v for v in values]
        cols[name] = pa.array(values, EVENT_SCHEMA.field(name).type).take(where)
    cols["input_fingerprint"] = pa.array(staged["fps"], pa.string()).take(take_item)
    encs = [*staged["encs"], *staged["values"]]
    cols["field"] = pa.array([*staged["names"], *([None] * n_items)], pa.string()).take(value_at)
    for name, attr in (
        ("value_kind", "kind"),
        ("value_json", "json_text"),
        ("value_size", "size"),
        ("value_digest", "digest"),
    ):
        get = operator.attrgetter(attr)
        cols[name] = pa.array([get(e) for e in encs], EVENT_SCHEMA.field(name).type).take(value_at)
    blob_type = EVENT_SCHEMA.field("value_blob").type
    blobs = [e.blob for e in encs]
    if all(b is None for b in blobs):
        cols["value_blob"] = pa.nulls(n, blob_type)
    else:
        cols["value_blob"] = pa.array(blobs, blob_type).take(value_at)
    for name in ("error_type", "error_message", "error_traceback"):
        cols[name] = pa.nulls(n, EVENT_SCHEMA.field(name).type)
    return cols
