"""What a rerun would touch now, and one item's input: both read from the source a plan recorded.

A plan records the source it read beside the log (:mod:`.store.source_ref`). These functions read
that source again and ask the planner's own functions what it makes of it against the folded log:
:func:`~.planner.classify` for an inline source (its snapshot), and for a path source the streamed
plan's steps (:func:`~.source_scan.scan_source`, :func:`~.planner.match_states`,
:func:`~.planner.classes`), so memory is the source's ids and fingerprints, never its rows.

:func:`~.chunks.record_plan_source` records what a plan task read (planning owns the record, this
module only reads it); :func:`rerun_counts` classifies;
:func:`source_item` finds one item's row by its key (a filtered scan of the key column for Lance and
Parquet, a streamed scan that stops at the match for JSONL).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from airflow_provider_datagen.core import jsonl
from airflow_provider_datagen.core.chunks import snapshot_items
from airflow_provider_datagen.core.ids import key_of, root_item_id
from airflow_provider_datagen.core.planner import (
    CLS_DEMOTED,
    CLS_FRESH,
    CLS_INVALIDATED,
    CLS_REPLAY,
    CLS_SKIP,
    classes,
    classify,
    match_states,
)
from airflow_provider_datagen.core.source_scan import JSONL, LANCE, PARQUET, scan_source
from airflow_provider_datagen.core.sources import prepare_items, source_path
from airflow_provider_datagen.core.store.paths import open_input_file
from airflow_provider_datagen.core.store.projection import rows_of
from airflow_provider_datagen.core.store.source_ref import (
    INLINE,
    PATH,
    SourceRef,
    lance_rows_by_key,
    open_lance_source,
)
from airflow_provider_datagen.exceptions import InvalidItemError

if TYPE_CHECKING:
    from collections.abc import Iterator

#: Key characters every JSON writer leaves as they are.
_UNESCAPED = re.compile(r"[A-Za-z0-9 _.:@-]+")


@dataclass
class RerunCounts:
    """Source items by what a rerun would do with them: the planner's classes, disjoint.

    The planner's replay class is split in two, as the log-only view counts it: ``replay`` (started,
    not failed) and ``failed`` (started, an attempt of the current generation failed).
    """

    fresh: int = 0
    replay: int = 0
    failed: int = 0
    edited: int = 0  # the planner's "invalidated": the input changed since it was recorded
    demoted: int = 0
    skip: int = 0
    #: skipped items done under another processor version, per version (kept with redo_completed="never")
    kept_other_version: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return self.fresh + self.replay + self.failed + self.edited + self.demoted + self.skip

    def as_dict(self) -> dict[str, Any]:
        return {
            "fresh": self.fresh,
            "replay": self.replay,
            "failed": self.failed,
            "edited": self.edited,
            "demoted": self.demoted,
            "skip": self.skip,
            "total": self.total,
            "kept_other_version": dict(sorted(self.kept_other_version.items())),
        }


#: Above this many items the UI does not classify a path source: the API server would hold the
#: source's ids and fingerprints and the folded states at once (~300 B per item, past 1 GiB at a few
#: million items), again at each new log version. The plan task classifies any size in bounded memory.
UI_CLASSIFY_LIMIT = 1_000_000


def too_large_to_classify(ref: SourceRef) -> str | None:
    """Why the UI does not classify ``ref``'s source (its size), or None when it does."""
    limit = UI_CLASSIFY_LIMIT
    if ref.kind != PATH or ref.items <= limit:
        return None
    return (
        f"the source the last plan read has {ref.items:,} items, more than the {limit:,} the UI classifies "
        "(the API server would hold every id and fingerprint); the plan task's log line 'plan: {...}' "
        "gives the planner's counts, and planning again gives them for now"
    )


def _check_readable(ref: SourceRef) -> None:
    if ref.uri_redacted:
        raise InvalidItemError(
            f"source {ref.uri!r} was given with credentials in its URI, which are not recorded; give the "
            "credentials through the datagen connection's storage options instead"
        )
    if ref.kind == PATH:
        source_path(ref.uri)  # a local path that is gone says so, in the reader's own words


def rerun_counts(
    ref: SourceRef,
    states: pa.Table,
    log_version: int,
    storage_options: dict[str, str] | None = None,
) -> RerunCounts:
    """Classify the recorded source against ``states`` (the folded log) as a rerun of that plan would.

    Raises what reading the source raises (a :class:`~airflow_provider_datagen.exceptions.DatagenError`,
    an ``OSError``...) when the source is gone or unreadable; the caller says so.
    """
    _check_readable(ref)
    if ref.kind == INLINE:
        source = snapshot_items(ref.uri, ref.key_field, storage_options)
        plan = classify(source, states, ref.processor_version, log_version, redo_completed=ref.redo_completed)
        return RerunCounts(
            fresh=len(plan.fresh),
            replay=len(plan.replay) - len(plan.failed),
            failed=len(plan.failed),
            edited=len(plan.invalidated),
            demoted=len(plan.demoted),
            skip=plan.skipped,
            kept_other_version=dict(plan.kept_other_version),
        )
    if ref.format == LANCE:
        # opened here with the options first: scan_source reports a bad source by reading it again
        # without them (for its error message), which on an object store asks elsewhere for a region
        open_lance_source(ref.uri, storage_options)
    scanned = scan_source(ref.uri, ref.key_field, storage_options)
    n = len(scanned.ids)
    index = rows_of(states, scanned.ids)
    fps = scanned.fingerprints
    match = match_states(n, lambda rows: fps.take(pa.array(rows)), states, index)
    del index
    cls, kept = classes(match, states, ref.processor_version, ref.redo_completed)
    replay = np.flatnonzero(cls == CLS_REPLAY)
    failed = 0
    if len(replay) and states.num_rows:
        failures = pc.take(states["failures"], pa.array(match.pick[replay])).fill_null(0)
        failed = int(np.count_nonzero(failures.to_numpy(zero_copy_only=False)))
    return RerunCounts(
        fresh=int(np.count_nonzero(cls == CLS_FRESH)),
        replay=len(replay) - failed,
        failed=failed,
        edited=int(np.count_nonzero(cls == CLS_INVALIDATED)),
        demoted=int(np.count_nonzero(cls == CLS_DEMOTED)),
        skip=int(np.count_nonzero(cls == CLS_SKIP)),
        kept_other_version=dict(kept),
    )


# --- one item's input -----------------------------------------------------------------------------


def source_item(ref: SourceRef, item_id: str, storage_options: dict[str, str] | None = None) -> dict[str, Any] | None:
    """The row of a path source whose key is the root item ``item_id``'s key; None when there is none.

    Reads bounded by the key, never the whole source into memory: Lance filters on the key column,
    Parquet reads the key column a row group at a time and the matching row group only, JSONL streams
    its lines (parsing only those that can hold the key) and stops at the match.
    """
    _check_readable(ref)
    key = key_of(item_id)
    if ref.format == LANCE:
        rows = lance_rows_by_key(ref.uri, ref.key_field, key, storage_options)
    elif ref.format == PARQUET:
        rows = _parquet_rows(ref.uri, ref.key_field, key, storage_options)
    elif ref.format == JSONL:
        rows = _jsonl_rows(ref.uri, ref.key_field, item_id, key, storage_options)
    else:
        raise InvalidItemError(f"source {ref.uri!r}: the recorded format {ref.format!r} is not a path source's")
    # an int key 5 and a string key "5" have one id: keep the rows whose key really is this item's
    mine = [r for r in rows if isinstance(r, dict) and _id_of(r.get(ref.key_field)) == item_id]
    return mine[0] if mine else None


def _id_of(key: Any) -> str | None:
    try:
        return root_item_id(key)
    except InvalidItemError:
        return None


def _parquet_rows(uri: str, key_field: str, key: str, storage_options: dict[str, str] | None) -> list[dict[str, Any]]:
    with open_input_file(uri, storage_options) as fh:
        pf = pq.ParquetFile(fh)
        kind = pf.schema_arrow.field(key_field).type  # KeyError when the column is gone
        if pa.types.is_integer(kind):
            try:
                value: Any = int(key)
            except ValueError:
                return []
        else:
            value = key
        for group in range(pf.metadata.num_row_groups):
            keys = pf.read_row_group(group, columns=[key_field])[key_field]
            hits = pc.indices_nonzero(pc.fill_null(pc.equal(keys, pa.scalar(value, kind)), False))
            if len(hits):
                return pf.read_row_group(group).take(hits).to_pylist()
    return []


def _jsonl_rows(
    uri: str, key_field: str, item_id: str, key: str, storage_options: dict[str, str] | None
) -> list[dict[str, Any]]:
    # A line holds the key as JSON text; when no JSON writer escapes any of its characters (some write
    # "/" as "\/", "<" as "\u003c", non-ASCII as "\uXXXX"), lines without it are skipped unparsed,
    # which makes the scan about as fast as reading the file.
    needle = key.encode() if _UNESCAPED.fullmatch(key) else None
    for line in _lines(uri, storage_options):
        if needle is not None and needle not in line:
            continue
        if not line.strip():
            continue
        try:
            row = jsonl.loads(line)  # as the plan's reader parses it
        except (ValueError, UnicodeDecodeError):
            continue  # not this item's line: the plan validated them all, a bad one is not ours
        if isinstance(row, dict) and _id_of(row.get(key_field)) == item_id:
            return [row]
    return []


def _lines(uri: str, storage_options: dict[str, str] | None) -> Iterator[bytes]:
    with open_input_file(uri, storage_options) as fh:
        yield from jsonl.lines(fh)


def source_input(
    ref: SourceRef, item_id: str, fingerprint: str, storage_options: dict[str, str] | None
) -> dict[str, Any]:
    """One root item's input from the recorded path source, checked against its input fingerprint.

    ``{"found": True, "value": row}`` when the source's row for the item digests to ``fingerprint``;
    otherwise ``found`` is False and ``problem`` says why (the item is gone from the source, or its row
    changed since the item's input was recorded).
    """
    row = source_item(ref, item_id, storage_options)
    if row is None:
        return {"found": False, "value": None, "problem": "gone"}
    current = prepare_items([row], ref.key_field)[0].fingerprint
    if current != fingerprint:
        return {"found": False, "value": None, "problem": "changed", "fingerprint": current}
    return {"found": True, "value": row, "problem": None}
