"""From a classification to a :class:`~.rules.ResumePlan` and its counts: one assembler for every plan.

A classification is each source item's class (:func:`~.rules.classes`) beside how it matched the
state table (:class:`~.rules.StateMatch`). The inline plan (a list), the in-memory plan of a path
source and the partitioned plan (one bucket of items at a time) all hand theirs to :func:`part_of`,
which keeps what a plan lists of them (ids, source positions, last sequence numbers, failures), and
:func:`assemble` merges the parts into source order per class. Adding a class of item is then an
edit of :mod:`.rules` and :data:`~.rules.CLASS_FIELDS`, not of each path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_datagen.core.plan.rules import (
    CLASS_FIELDS,
    CLS_DEMOTED,
    CLS_FRESH,
    CLS_INVALIDATED,
    CLS_REPLAY,
    CLS_SKIP,
    PENDING_ORDER,
    ResumePlan,
    StateMatch,
    classes,
    ints,
)
from airflow_provider_datagen.core.schema import ItemStatus
from airflow_provider_datagen.core.status import item_counts, version_counts

if TYPE_CHECKING:
    from collections.abc import Sequence

#: A classification's item ids: an Arrow string array, or a numpy object array of the source's own
#: strings (an inline plan's lists then reuse them instead of a copy per id: 1M items, ~60 MB).
Ids: TypeAlias = "pa.Array | np.ndarray"


@dataclass
class Part:
    """What one classification (a whole source, or one bucket of it) hands on to the plan, per class."""

    #: the listed classes' rows: source positions, ids, JSONL offsets (when the source has them)
    pos: dict[int, np.ndarray] = field(default_factory=dict)
    ids: dict[int, Ids] = field(default_factory=dict)
    offs: dict[int, np.ndarray] | None = None
    #: per pending class, each row's last sequence number in the log (-1: it has no events)
    last_seq: dict[int, np.ndarray] = field(default_factory=dict)
    #: per replay row, whether its generation has a FAILED event
    failed: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    skip: int = 0
    kept: dict[str, int] = field(default_factory=dict)


@dataclass
class Assembled:
    """A plan, and its pending items' source positions (and JSONL offsets) in pending order."""

    plan: ResumePlan
    pending_pos: np.ndarray
    pending_offsets: np.ndarray | None


def _take(ids: Ids, rows: np.ndarray) -> Ids:
    return ids[rows] if isinstance(ids, np.ndarray) else ids.take(pa.array(rows))


def _concat(parts: list[Ids]) -> Ids:
    if isinstance(parts[0], np.ndarray):
        return np.concatenate(parts) if len(parts) > 1 else parts[0]
    return pa.concat_arrays(parts) if len(parts) > 1 else parts[0]


def _ascending(pos: np.ndarray) -> bool:
    return len(pos) < 2 or bool(np.all(pos[1:] >= pos[:-1]))


def _as_list(ids: Ids) -> list[str]:
    return ids.tolist() if isinstance(ids, np.ndarray) else ids.to_pylist()


def part_of(
    cls: np.ndarray,
    match: StateMatch,
    states: pa.Table,
    ids: Ids,
    *,
    kept: dict[str, int] | None = None,
    pos: np.ndarray | None = None,
    offs: np.ndarray | None = None,
    list_skip: bool = False,
) -> Part:
    """Keep what the plan needs of one classification of ``ids`` (``cls``, ``match``, against ``states``).

    ``pos``: each item's position in the whole source (None: its position here); ``offs``: each
    one's JSONL byte offset; ``list_skip``: list the skipped ids too, not only count them.
    Failures and last sequence numbers are read for the pending items only, not gathered for all.
    """
    part = Part(kept=dict(kept or {}), offs=None if offs is None else {})
    part.skip = int(np.count_nonzero(cls == CLS_SKIP))
    for c in (CLS_SKIP, *PENDING_ORDER) if list_skip else PENDING_ORDER:
        rows = np.flatnonzero(cls == c)
        part.pos[c] = rows if pos is None else pos[rows]
        part.ids[c] = _take(ids, rows)
        if part.offs is not None and offs is not None:
            part.offs[c] = offs[rows]
        if c == CLS_SKIP:
            continue
        seq = np.full(len(rows), -1, np.int64)
        found = match.found[rows]
        if found.any():
            seq[found] = ints(pc.take(states["last_seq"], pa.array(match.pick[rows[found]])))
        part.last_seq[c] = seq
        if c == CLS_REPLAY and len(rows):
            part.failed = ints(pc.take(states["failures"], pa.array(match.pick[rows]))) > 0
    return part


def assemble(parts: Sequence[Part], *, log_version: int, list_skip: bool = False) -> Assembled:
    """The plan of ``parts`` (from :func:`part_of`), each class's items merged into source order.

    ``list_skip`` as the parts were made: the plan lists the skipped ids, else it counts them.
    """
    plan = ResumePlan(log_version=log_version)
    kept: dict[str, int] = {}
    for p in parts:
        for version, count in p.kept.items():
            kept[version] = kept.get(version, 0) + count
    plan.kept_other_version = dict(sorted(kept.items()))
    if not list_skip:
        plan.skip_count = sum(p.skip for p in parts)
    with_offs = bool(parts) and parts[0].offs is not None
    positions, offsets, seqs = [], [], []
    for c in (CLS_SKIP, *PENDING_ORDER) if list_skip else PENDING_ORDER:
        if not parts:
            continue
        pos = _concat([p.pos[c] for p in parts])
        # one part is in source order already; buckets interleave, so their rows are sorted back
        order = None if _ascending(pos) else np.argsort(pos, kind="stable")
        ids = _concat([p.ids[c] for p in parts])
        ids_list = _as_list(ids if order is None else _take(ids, order))
        setattr(plan, CLASS_FIELDS[c], ids_list)
        if c == CLS_SKIP:
            continue
        positions.append(pos if order is None else pos[order])
        if with_offs:
            offs = np.concatenate([p.offs[c] for p in parts if p.offs is not None])
            offsets.append(offs if order is None else offs[order])
        seq = np.concatenate([p.last_seq[c] for p in parts])
        seqs.append(seq if order is None else seq[order])
        if c == CLS_REPLAY:
            failed = np.concatenate([p.failed for p in parts])
            failed = failed if order is None else failed[order]
            plan.failed = [ids_list[i] for i in np.flatnonzero(failed).tolist()]
    empty = np.zeros(0, np.int64)
    seq = np.concatenate(seqs) if seqs else empty
    found = np.flatnonzero(seq >= 0)
    if len(found):
        pending_ids = plan.pending
        plan.last_seq = dict(zip([pending_ids[i] for i in found.tolist()], seq[found].tolist()))
    pending_pos = np.concatenate(positions) if positions else empty
    return Assembled(plan, pending_pos, (np.concatenate(offsets) if offsets else empty) if with_offs else None)


def source_counts(states: pa.Table, match: StateMatch) -> dict[str, Any]:
    """A source's counts in the ``datagen_status`` dict, from how its items matched ``states``.

    The status's view: no processor version demotes anything, so this classifies ``match`` again
    (numpy over the match; the match, the costly part, is the plan's).
    """
    cls, _ = classes(match, states, None)
    done = np.flatnonzero(cls == CLS_SKIP)
    completed = filtered = 0
    by_version: dict[str, int] = {}
    if len(done):
        picked = pa.array(match.pick[done])
        st = pc.take(states["status"], picked)
        is_completed = pc.equal(st, ItemStatus.COMPLETED.value)
        completed = int(pc.sum(is_completed).as_py() or 0)
        filtered = int(pc.sum(pc.equal(st, ItemStatus.FILTERED.value)).as_py() or 0)
        versions = pc.filter(pc.take(states["processor_version"], picked), is_completed)
        by_version = version_counts(versions)
    return dict(
        item_counts(
            total=len(cls),
            completed=completed,
            completed_by_version=by_version,
            filtered=filtered,
            running=int(np.count_nonzero(cls == CLS_REPLAY) + np.count_nonzero(cls == CLS_DEMOTED)),
            never_started=int(np.count_nonzero(cls == CLS_FRESH)),
            invalidated=int(np.count_nonzero(cls == CLS_INVALIDATED)),
        )
    )
