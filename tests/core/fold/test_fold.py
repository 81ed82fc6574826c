"""The lifecycle and failure lenses on hand-built events: every rule of seed 000, and the fold laws.

No Lance here: events are built directly, with ids computed from their identity exactly as a writer
computes them, so a duplicate is a real retry and two different events at one sequence really conflict.
"""

from __future__ import annotations

import itertools
import json
import random
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_datagen.core import (
    BlobRef,
    Event,
    EventType,
    ItemStatus,
    StepCoord,
    fold_events,
    fold_table,
)
from airflow_provider_datagen.core.events import encode_value, event_id_for
from airflow_provider_datagen.core.fold import (
    FENCING_ERROR_TYPE,
    STATE_SCHEMA,
    VIOLATION_CONFLICT,
    VIOLATION_STALE_EPOCH,
    MisalignedStreamsError,
    _Compacted,
    _fold,
    failure_records,
    fold_batches,
    state_row,
)
from airflow_provider_datagen.core.ids import parent_of, root_of
from airflow_provider_datagen.core.schema import STORED_STATUS_FAILED, STORED_STATUS_TRANSIENT
from airflow_provider_datagen.core.schema import EventType as ET
from tests._support.profiles import examples

STATUS_OF = {ET.ITEM_CREATED: "running", ET.FAILED: STORED_STATUS_FAILED}


def ev(
    item: str,
    seq: int,
    etype: EventType,
    *,
    epoch: int = 1,
    writer: str = "w1",
    fp: str = "f1",
    pv: str | None = "v1",
    status: str | None = None,
    step: str | None = None,
    kind: str | None = None,
    iteration: int | None = None,
    field: str | None = None,
    value: Any = None,
    blob: bool = False,
    error: str | None = None,
) -> Event:
    """An event with the id a writer would give it (writer and epoch are not part of the id)."""
    if status is None:
        status = STATUS_OF.get(etype, "completed" if etype is ET.TERMINAL else None)
    enc = None
    if etype in (ET.FIELD_SET, ET.FIELD_APPEND):
        enc = encode_value(value, blob_threshold=0 if blob else 1 << 20)
    elif etype is ET.TERMINAL and value is not None:
        enc = encode_value(value)
    coord = StepCoord(step=step, step_kind=kind, iteration=iteration)
    err = (error or "ValueError", f"boom at {seq}") if etype is ET.FAILED else None
    eid = event_id_for(
        item,
        seq,
        etype.value,
        fp,
        pv if etype in (ET.ITEM_CREATED, ET.STEP_COMPLETED) else None,
        status,
        coord.step_kind,
        coord.step,
        coord.enclosing_step,
        coord.selector_step,
        coord.iteration,
        coord.fanout_index,
        field,
        f"{enc.kind}:{enc.digest}" if enc else None,
        err[0] if err else None,
        err[1] if err else None,
    )
    return Event(
        event_id=eid,
        item_id=item,
        root_item_id=root_of(item),
        parent_item_id=parent_of(item),
        item_seq=seq,
        event_type=etype,
        status=status,
        coord=coord,
        field=field,
        value_kind=enc.kind if enc else None,
        value_json=enc.json_text if enc else None,
        value_size=enc.size if enc else None,
        value_digest=enc.digest if enc else None,
        input_fingerprint=fp,
        processor_version=pv,
        writer_id=writer,
        writer_epoch=epoch,
        error_type=err[0] if err else None,
        error_message=err[1] if err else None,
    )


def rewritten(e: Event, *, epoch: int | None = None, writer: str | None = None) -> Event:
    """The same event (same id) as written again by another attempt or writer."""
    kw = {f: getattr(e, f) for f in Event.__dataclass_fields__}
    kw["writer_epoch"] = e.writer_epoch if epoch is None else epoch
    kw["writer_id"] = e.writer_id if writer is None else writer
    return Event(**kw)


def to_table(events: list[Event], chunks: int = 1) -> pa.Table:
    """The light columns ``fold_table`` reads, optionally split into several chunks."""
    cols = {
        "event_key": pa.array([e.event_key for e in events], pa.int64()),
        "item_id": pa.array([e.item_id for e in events], pa.string()),
        "item_seq": pa.array([e.item_seq for e in events], pa.int64()),
        "event_type": pa.array([e.event_type.value for e in events], pa.string()),
        "status": pa.array([e.status for e in events], pa.string()),
        "input_fingerprint": pa.array([e.input_fingerprint for e in events], pa.string()),
        "processor_version": pa.array([e.processor_version for e in events], pa.string()),
        "writer_epoch": pa.array([e.writer_epoch for e in events], pa.int64()),
    }
    table = pa.table(cols)
    if chunks <= 1 or table.num_rows < 2:
        return table
    bounds = sorted(
        {0, table.num_rows, *random.Random(chunks).sample(range(1, table.num_rows), min(chunks, table.num_rows - 1))}
    )
    return pa.concat_tables([table.slice(a, b - a) for a, b in itertools.pairwise(bounds)])


def reference_rows(events: list[Event]) -> list[dict[str, Any]]:
    items = sorted({e.item_id for e in events})
    return [state_row(fold_events(i, events)) for i in items]


def vector_rows(events: list[Event], chunks: int = 1) -> list[dict[str, Any]]:
    return sorted(fold_table(to_table(events, chunks)).to_pylist(), key=lambda r: r["item_id"])


def happy(item: str = "5", *, fp: str = "f1", start: int = 0, epoch: int = 1) -> list[Event]:
    s = start
    return [
        ev(item, s, ET.ITEM_CREATED, fp=fp, epoch=epoch),
        ev(item, s + 1, ET.STEP_STARTED, step="gen", kind="Sequence", fp=fp, epoch=epoch),
        ev(item, s + 2, ET.FIELD_SET, field="answer", value={"text": "hi"}, step="gen", fp=fp, epoch=epoch),
        ev(item, s + 3, ET.FIELD_APPEND, field="votes", value=3, step="gen", fp=fp, epoch=epoch),
        ev(item, s + 4, ET.STEP_COMPLETED, step="gen", kind="Sequence", fp=fp, epoch=epoch),
        ev(item, s + 5, ET.TERMINAL, status="completed", fp=fp, epoch=epoch),
    ]


# --- the rules of seed 000 ---------------------------------------------------------------------


def test_there_are_seven_event_types_and_four_statuses() -> None:
    assert [t.value for t in EventType] == [
        "ITEM_CREATED",
        "STEP_STARTED",
        "FIELD_SET",
        "FIELD_APPEND",
        "STEP_COMPLETED",
        "FAILED",
        "TERMINAL",
    ]
    assert [s.value for s in ItemStatus] == ["never_started", "running", "completed", "filtered"]
    assert "failed" not in {s.value for s in ItemStatus}


def test_no_events_fold_to_never_started() -> None:
    st_ = fold_events("5", [])
    assert st_.status is ItemStatus.NEVER_STARTED
    assert st_.fields == {} and st_.cursor is None and st_.last_seq == -1
    assert fold_table(to_table([])).num_rows == 0
    assert fold_table(to_table([])).schema == STATE_SCHEMA


def test_events_without_item_created_fold_to_never_started() -> None:
    events = [
        ev("5", 0, ET.STEP_STARTED, step="gen"),
        ev("5", 1, ET.FIELD_SET, field="a", value=1),
        ev("5", 2, ET.FAILED, step="gen"),
        ev("5", 3, ET.TERMINAL, status="completed"),
    ]
    st_ = fold_events("5", events)
    assert st_.status is ItemStatus.NEVER_STARTED
    assert st_.fields == {}
    assert st_.failures == 0
    assert st_.input_fingerprint is None
    assert st_.last_seq == 3  # the events exist; a writer continues after them
    assert vector_rows(events) == reference_rows(events)


def test_happy_path_completes_with_fields_and_cursor() -> None:
    st_ = fold_events("5", happy())
    assert st_.status is ItemStatus.COMPLETED
    assert st_.is_done
    assert st_.fields == {"answer": {"text": "hi"}, "votes": [3]}
    assert st_.field_modes == {"answer": "set", "votes": "append"}
    assert st_.cursor is not None and st_.cursor.step == "gen" and st_.cursor.item_seq == 4
    assert st_.cursor.processor_version == "v1"
    assert st_.open_frames == []
    assert st_.input_fingerprint == "f1"
    assert (st_.created_seq, st_.terminal_seq, st_.last_seq) == (0, 5, 5)
    assert vector_rows(happy()) == reference_rows(happy())


def test_item_created_makes_it_running() -> None:
    st_ = fold_events("5", [ev("5", 0, ET.ITEM_CREATED, fp="fx", pv="v9")])
    assert st_.status is ItemStatus.RUNNING
    assert not st_.is_done
    assert (st_.input_fingerprint, st_.processor_version, st_.created_seq) == ("fx", "v9", 0)


def test_field_set_replaces_in_sequence_order_not_arrival_order() -> None:
    events = [
        ev("5", 0, ET.ITEM_CREATED),
        ev("5", 1, ET.FIELD_SET, field="a", value=1),
        ev("5", 2, ET.FIELD_SET, field="a", value={"x": 2}),
        ev("5", 3, ET.FIELD_SET, field="b", value=None),
    ]
    for order in (events, events[::-1], [events[2], events[0], events[3], events[1]]):
        assert fold_events("5", order).fields == {"a": {"x": 2}, "b": None}


def test_field_append_accumulates_in_sequence_order() -> None:
    events = [ev("5", 0, ET.ITEM_CREATED)] + [
        ev("5", i, ET.FIELD_APPEND, field="votes", value=i * 10) for i in range(1, 6)
    ]
    assert fold_events("5", events[::-1]).fields == {"votes": [10, 20, 30, 40, 50]}
    # the same value appended twice at two sequences is two entries, not a duplicate
    twice = [ev("5", 0, ET.ITEM_CREATED), ev("5", 1, ET.FIELD_APPEND, field="v", value=1)]
    twice.append(ev("5", 2, ET.FIELD_APPEND, field="v", value=1))
    assert fold_events("5", twice).fields == {"v": [1, 1]}


def test_cursor_is_the_last_step_completed_and_open_frame_is_started_minus_completed() -> None:
    events = [
        ev("5", 0, ET.ITEM_CREATED),
        ev("5", 1, ET.STEP_STARTED, step="outer", kind="Loop", iteration=0),
        ev("5", 2, ET.STEP_COMPLETED, step="outer", kind="Loop", iteration=0),
        ev("5", 3, ET.STEP_STARTED, step="outer", kind="Loop", iteration=1),
        ev("5", 4, ET.STEP_STARTED, step="inner", kind="Sequence"),
        ev("5", 5, ET.STEP_COMPLETED, step="inner", kind="Sequence"),
    ]
    st_ = fold_events("5", events)
    assert st_.cursor is not None
    assert (st_.cursor.step, st_.cursor.item_seq) == ("inner", 5)
    assert [c.step for c in st_.completed_steps] == ["outer", "inner"]
    assert st_.completed_steps[0].iteration == 0
    assert [(f.step, f.iteration) for f in st_.open_frames] == [("outer", 1)]
    assert st_.status is ItemStatus.RUNNING


def test_cursor_remembers_its_processor_version() -> None:
    events = [ev("5", 0, ET.ITEM_CREATED), ev("5", 1, ET.STEP_COMPLETED, step="a", pv="v2")]
    st_ = fold_events("5", events)
    assert st_.cursor is not None and st_.cursor.processor_version == "v2"


def test_failed_leaves_the_item_running_and_counts() -> None:
    events = [ev("5", 0, ET.ITEM_CREATED), ev("5", 1, ET.STEP_STARTED, step="gen")]
    events += [ev("5", 2, ET.FAILED, step="gen"), ev("5", 3, ET.FAILED, step="gen", error="KeyError")]
    st_ = fold_events("5", events)
    assert st_.status is ItemStatus.RUNNING
    assert st_.failures == 2
    assert [(f.step, f.iteration) for f in st_.open_frames] == [("gen", None)]
    records = failure_records(events)
    assert [(r.error_type, r.step, r.item_seq, r.writer_id, r.epoch) for r in records] == [
        ("ValueError", "gen", 2, "w1", 1),
        ("KeyError", "gen", 3, "w1", 1),
    ]
    assert vector_rows(events) == reference_rows(events)


def test_filtered_terminal_keeps_its_reason() -> None:
    events = [
        ev("5", 0, ET.ITEM_CREATED),
        ev("5", 1, ET.TERMINAL, status="filtered", value={"why": "too short"}),
    ]
    st_ = fold_events("5", events)
    assert st_.status is ItemStatus.FILTERED
    assert st_.filter_reason == {"why": "too short"}
    assert st_.is_done


def test_nothing_after_terminal_changes_the_item() -> None:
    late = [
        ev("5", 6, ET.FIELD_SET, field="answer", value="changed"),
        ev("5", 7, ET.FAILED, step="gen"),
        ev("5", 8, ET.STEP_STARTED, step="again"),
        ev("5", 9, ET.STEP_COMPLETED, step="again"),
        ev("5", 10, ET.TERMINAL, status="filtered"),
    ]
    before = fold_events("5", happy())
    after = fold_events("5", happy() + late)
    assert after.status is ItemStatus.COMPLETED
    assert after.fields == before.fields
    assert after.cursor == before.cursor
    assert after.failures == 0
    assert after.terminal_seq == 5
    assert after.last_seq == 10
    assert vector_rows(happy() + late) == reference_rows(happy() + late)


def test_a_new_item_created_starts_a_new_generation() -> None:
    # a changed input: new fingerprint, fields of the old generation never leak
    gen2 = [
        ev("5", 6, ET.ITEM_CREATED, fp="f2", pv="v2"),
        ev("5", 7, ET.FIELD_APPEND, field="votes", value=9, fp="f2"),
        ev("5", 8, ET.FAILED, step="gen", fp="f2"),
    ]
    st_ = fold_events("5", happy() + gen2)
    assert st_.status is ItemStatus.RUNNING
    assert st_.fields == {"votes": [9]}
    assert st_.cursor is None and st_.completed_steps == []
    assert (st_.input_fingerprint, st_.processor_version, st_.created_seq) == ("f2", "v2", 6)
    assert st_.failures == 1
    assert vector_rows(happy() + gen2) == reference_rows(happy() + gen2)
    # a restart of a running item (processor version change) also resets it
    restart = [ev("5", 0, ET.ITEM_CREATED), ev("5", 1, ET.FIELD_SET, field="a", value=1)]
    restart += [ev("5", 2, ET.FAILED), ev("5", 3, ET.ITEM_CREATED, pv="v2")]
    st2 = fold_events("5", restart)
    assert (st2.fields, st2.failures, st2.processor_version) == ({}, 0, "v2")


def test_a_version_redo_after_terminal_starts_a_new_generation_of_the_same_input() -> None:
    # redo_completed="other_version": the same input, a new ITEM_CREATED under v2 after the v1 TERMINAL
    redo = [ev("5", 6, ET.ITEM_CREATED, pv="v2"), ev("5", 7, ET.STEP_STARTED, step="gen", kind="Sequence")]
    mid = fold_events("5", happy() + redo)
    assert (mid.status, mid.fields, mid.cursor, mid.terminal_seq) == (ItemStatus.RUNNING, {}, None, None)
    assert (mid.input_fingerprint, mid.processor_version, mid.created_seq) == ("f1", "v2", 6)
    assert vector_rows(happy() + redo) == reference_rows(happy() + redo)
    redo += [
        ev("5", 8, ET.FIELD_SET, field="answer", value="v2 answer", step="gen"),
        ev("5", 9, ET.STEP_COMPLETED, step="gen", kind="Sequence", pv="v2"),
        ev("5", 10, ET.TERMINAL, status="completed"),
    ]
    done = fold_events("5", happy() + redo)
    assert done.status is ItemStatus.COMPLETED
    assert done.fields == {"answer": "v2 answer"}  # the v1 "votes" stays in history only
    assert [c.processor_version for c in done.completed_steps] == ["v2"]
    assert (done.processor_version, done.created_seq, done.terminal_seq) == ("v2", 6, 10)
    assert vector_rows(happy() + redo) == reference_rows(happy() + redo)
    assert vector_rows(happy() + redo)[0]["processor_version"] == "v2"


def test_retried_batches_are_deduplicated() -> None:
    events = happy()
    retried = events + events[2:5] + [rewritten(e, writer="w2") for e in events]
    assert fold_events("5", retried) == fold_events("5", events)
    assert fold_events("5", retried).violations == []
    assert fold_events("5", retried).fields["votes"] == [3]
    assert vector_rows(retried) == reference_rows(events)


def test_a_retry_under_a_newer_epoch_is_the_same_event() -> None:
    # a new attempt that redoes the tail of an ambiguously acknowledged batch writes the same ids
    events = happy()
    redone = [rewritten(e, epoch=2, writer="attempt-2") for e in events[3:]]
    st_ = fold_events("5", events + redone)
    assert st_.violations == []
    assert st_.max_epoch == 2
    assert st_ == fold_events("5", redone + events)
    assert st_.fields["votes"] == [3]
    assert st_.status is ItemStatus.COMPLETED
    assert vector_rows(events + redone)[0]["violations"] == 0


def test_two_different_events_at_one_seq_are_a_conflict() -> None:
    a = ev("5", 1, ET.FIELD_SET, field="answer", value="from a", writer="a")
    b = ev("5", 1, ET.FIELD_SET, field="answer", value="from b", writer="b")
    base = ev("5", 0, ET.ITEM_CREATED)
    winner, loser = sorted([a, b], key=lambda e: e.event_key)
    for order in ([base, a, b], [b, base, a]):
        st_ = fold_events("5", order)
        assert st_.fields == {"answer": json.loads(winner.value_json or "null")}
        assert len(st_.violations) == 1
        v = st_.violations[0]
        assert (v.kind, v.item_seq, v.event_id, v.winner_event_id) == (
            VIOLATION_CONFLICT,
            1,
            loser.event_id,
            winner.event_id,
        )
        assert v.writer_id == loser.writer_id
    records = failure_records([], fold_events("5", [base, a, b]).violations)
    assert [r.error_type for r in records] == [FENCING_ERROR_TYPE]
    assert "item_seq 1" in records[0].message and "epoch" in records[0].message
    assert vector_rows([base, a, b])[0]["violations"] == 1


def test_at_one_seq_the_higher_epoch_wins() -> None:
    base = ev("5", 0, ET.ITEM_CREATED)
    old = ev("5", 1, ET.FIELD_SET, field="x", value="old", epoch=1)
    new = ev("5", 1, ET.FIELD_SET, field="x", value="new", epoch=2)
    st_ = fold_events("5", [base, new, old])
    assert st_.fields == {"x": "new"}
    assert [(v.kind, v.writer_epoch, v.winner_epoch) for v in st_.violations] == [(VIOLATION_CONFLICT, 1, 2)]


def test_a_stale_epochs_late_writes_change_nothing() -> None:
    owner = [
        ev("5", 0, ET.ITEM_CREATED, epoch=1),
        ev("5", 1, ET.STEP_STARTED, step="gen", epoch=1),
        # epoch 2 takes over
        ev("5", 2, ET.FIELD_SET, field="answer", value="good", epoch=2),
        ev("5", 3, ET.STEP_COMPLETED, step="gen", epoch=2),
    ]
    zombie = [
        ev("5", 4, ET.FIELD_SET, field="answer", value="zombie", epoch=1, writer="zombie"),
        ev("5", 5, ET.STEP_COMPLETED, step="late", epoch=1, writer="zombie"),
        ev("5", 6, ET.TERMINAL, status="filtered", epoch=1, writer="zombie"),
        ev("5", 7, ET.ITEM_CREATED, fp="f9", epoch=1, writer="zombie"),
    ]
    clean = fold_events("5", owner)
    dirty = fold_events("5", owner + zombie)
    assert dirty.status is ItemStatus.RUNNING
    assert dirty.fields == clean.fields == {"answer": "good"}
    assert dirty.cursor == clean.cursor
    assert dirty.input_fingerprint == "f1"
    assert [v.kind for v in dirty.violations] == [VIOLATION_STALE_EPOCH] * 4
    assert {v.winner_epoch for v in dirty.violations} == {2}
    assert {v.writer_id for v in dirty.violations} == {"zombie"}
    assert dirty.last_seq == 7  # the next writer must continue after the zombie's rows
    records = failure_records(owner + zombie, dirty.violations)
    assert [r.error_type for r in records] == [FENCING_ERROR_TYPE] * 4
    assert all("stale epoch 1" in r.message for r in records)
    assert vector_rows(owner + zombie) == reference_rows(owner + zombie)
    # the owner continues after the zombie and is applied
    more = [*owner, *zombie, ev("5", 8, ET.TERMINAL, status="completed", epoch=2)]
    assert fold_events("5", more).status is ItemStatus.COMPLETED


def test_the_old_epoch_before_the_takeover_still_counts() -> None:
    events = [
        ev("5", 0, ET.ITEM_CREATED, epoch=1),
        ev("5", 1, ET.FIELD_APPEND, field="v", value=1, epoch=1),
        ev("5", 2, ET.FIELD_APPEND, field="v", value=2, epoch=3),
        ev("5", 3, ET.FIELD_APPEND, field="v", value=3, epoch=2),
    ]
    st_ = fold_events("5", events)
    assert st_.fields == {"v": [1, 2]}
    assert [(v.kind, v.item_seq) for v in st_.violations] == [(VIOLATION_STALE_EPOCH, 3)]


def test_other_items_are_ignored_by_the_per_item_fold() -> None:
    events = happy("5") + happy("6", fp="f6")[:3]
    assert fold_events("5", events) == fold_events("5", happy("5"))
    assert fold_events("6", events).status is ItemStatus.RUNNING
    rows = vector_rows(events)
    assert [(r["item_id"], r["status"], r["input_fingerprint"]) for r in rows] == [
        ("5", "completed", "f1"),
        ("6", "running", "f6"),
    ]


def test_blob_values_fold_to_lazy_refs() -> None:
    loads: list[str] = []

    def loader(event_id: str) -> bytes:
        loads.append(event_id)
        return b'{"big":true}'

    big = ev("5", 1, ET.FIELD_SET, field="doc", value={"big": True}, blob=True)
    raw = ev("5", 2, ET.FIELD_APPEND, field="raw", value=b"\x00\x01")
    st_ = fold_events("5", [ev("5", 0, ET.ITEM_CREATED), big, raw], loader)
    assert loads == []
    doc = st_.fields["doc"]
    assert isinstance(doc, BlobRef)
    assert doc.event_id == big.event_id
    assert isinstance(st_.fields["raw"][0], BlobRef)
    assert doc.load() == {"big": True}
    assert loads == [big.event_id]


def test_failure_records_deduplicate_failed_rows() -> None:
    f = ev("5", 1, ET.FAILED, step="gen")
    records = failure_records([f, rewritten(f, writer="w2"), f, ev("5", 0, ET.ITEM_CREATED)])
    assert len(records) == 1
    assert records[0].message == "boom at 1"


def test_vectorized_fold_refuses_out_of_range_sequences() -> None:
    with pytest.raises(ValueError, match="2\\*\\*31"):
        fold_table(to_table([ev("5", 2**31, ET.ITEM_CREATED)]))
    with pytest.raises(ValueError, match="2\\*\\*31"):
        fold_table(to_table([ev("5", 0, ET.ITEM_CREATED, epoch=2**31)]))


def test_vectorized_fold_over_a_chunked_table_with_disjoint_chunks() -> None:
    events = happy("a") + happy("b", fp="fb") + happy("a/s:0")[:2] + happy("c")[:1]
    for chunks in (1, 2, 3, 7):
        assert vector_rows(events, chunks) == reference_rows(events)


# --- random event streams ----------------------------------------------------------------------

ITEMS = ["a", "b", "a/s:0", "a%2Fb.txt"]

# What an event says, beyond item/seq/epoch/writer: a few shapes per type, drawn with one choice so
# that Hypothesis spends its time on the interesting dimensions (sequences, epochs, duplicates).
SHAPES: dict[EventType, list[dict[str, Any]]] = {
    ET.ITEM_CREATED: [{"fp": fp, "pv": pv} for fp in ("f1", "f2") for pv in ("v1", "v2", None)],
    ET.STEP_STARTED: [{"step": s, "iteration": i} for s in ("gen", "judge") for i in (None, 0, 1)],
    ET.FIELD_SET: [{"field": f, "value": v} for f in ("x", "y") for v in range(3)],
    ET.FIELD_APPEND: [{"field": f, "value": v} for f in ("x", "y") for v in range(3)],
    ET.STEP_COMPLETED: [
        {"step": s, "iteration": i, "pv": pv} for s in ("gen", "judge") for i in (None, 0) for pv in ("v1", "v2")
    ],
    ET.FAILED: [{"step": s, "error": e} for s in (None, "gen") for e in ("ValueError", "KeyError")]
    # attempts retried in place (issue 16): not failures of the item, in both folds
    + [{"step": "gen", "error": "TimeoutError", "status": STORED_STATUS_TRANSIENT}],
    ET.TERMINAL: [{"status": "completed"}, {"status": "filtered"}, {"status": "filtered", "value": "why"}],
}


@st.composite
def raw_events(draw: st.DrawFn, max_seq: int = 10) -> Event:
    etype = draw(st.sampled_from(list(SHAPES)))
    shape = draw(st.sampled_from(SHAPES[etype]))
    item, seq, epoch = draw(st.tuples(st.sampled_from(ITEMS), st.integers(0, max_seq), st.integers(0, 3)))
    fp = shape.get("fp", draw(st.sampled_from(["f1", "f2"])))
    return ev(item, seq, etype, epoch=epoch, writer="w1", **{**shape, "fp": fp})


@st.composite
def logs(draw: st.DrawFn) -> list[list[Event]]:
    """A log as a list of batches: random events, plus retries of earlier events by other attempts."""
    batches = draw(st.lists(st.lists(raw_events(), min_size=1, max_size=8), min_size=0, max_size=6))
    flat = [e for b in batches for e in b]
    if flat:
        retries = draw(
            st.lists(
                st.tuples(st.sampled_from(flat), st.sampled_from([None, 0, 1, 2, 3]), st.sampled_from([None, "w3"])),
                max_size=6,
            )
        )
        if retries:
            batches.append([rewritten(e, epoch=ep, writer=w) for e, ep, w in retries])
    return batches


def flat(batches: list[list[Event]]) -> list[Event]:
    return [e for b in batches for e in b]


def all_states(events: list[Event]) -> dict[str, Any]:
    return {i: fold_events(i, events) for i in ITEMS}


@settings(max_examples=examples(300), suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(logs(), st.integers(1, 4))
def test_vectorized_fold_equals_reference_fold(batches: list[list[Event]], chunks: int) -> None:
    events = flat(batches)
    assert vector_rows(events, chunks) == reference_rows(events)


@settings(max_examples=examples(100), deadline=None)
@given(st.lists(raw_events(max_seq=40), min_size=1, max_size=60), st.integers(1, 3))
def test_vectorized_fold_equals_reference_fold_on_sparse_sequences(events: list[Event], chunks: int) -> None:
    assert vector_rows(events, chunks) == reference_rows(events)


@st.composite
def orderly_item(draw: st.DrawFn, item: str) -> list[Event]:
    """A plausible trajectory: generations of created/steps/fields/failures/terminal, then zombies."""
    out: list[Event] = []
    seq = 0
    epoch = draw(st.integers(1, 2))
    fp, pv = "f0", "v1"
    for gen in range(draw(st.integers(1, 3))):
        if gen and draw(st.booleans()):
            pv = f"v{gen + 1}"  # a processor-version redo: the same input, a new version
        else:
            fp = f"f{gen}"  # an edited input
        out.append(ev(item, seq, ET.ITEM_CREATED, fp=fp, pv=pv, epoch=epoch))
        seq += 1
        for _ in range(draw(st.integers(0, 4))):
            etype = draw(
                st.sampled_from([ET.STEP_STARTED, ET.FIELD_SET, ET.FIELD_APPEND, ET.STEP_COMPLETED, ET.FAILED])
            )
            out.append(ev(item, seq, etype, fp=fp, epoch=epoch, step="s", field="x", value=seq))
            seq += 1
            if draw(st.booleans()):
                epoch += 1
        if draw(st.booleans()):
            out.append(
                ev(item, seq, ET.TERMINAL, fp=fp, epoch=epoch, status=draw(st.sampled_from(["completed", "filtered"])))
            )
            seq += 1
    # a zombie at an older epoch writes late, at new sequences and at taken ones
    for _ in range(draw(st.integers(0, 3))):
        zseq = draw(st.integers(0, seq + 2))
        out.append(ev(item, zseq, ET.TERMINAL, epoch=max(epoch - 1, 0), writer="zombie", status="filtered"))
    return out


@settings(max_examples=examples(100), deadline=None)
@given(
    st.lists(st.sampled_from(ITEMS), min_size=1, max_size=4, unique=True).flatmap(
        lambda items: st.tuples(*(orderly_item(i) for i in items))
    ),
    st.randoms(),
)
def test_vectorized_fold_equals_reference_fold_on_plausible_trajectories(
    per_item: tuple[list[Event], ...], rnd: random.Random
) -> None:
    events = [e for evs in per_item for e in evs]
    rnd.shuffle(events)
    assert vector_rows(events, 3) == reference_rows(events)


@settings(max_examples=examples(200), suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    logs(),
    st.lists(st.sampled_from([*ITEMS, "z", "b/s:1"]), unique=True),
    st.booleans(),
    st.integers(1, 3),
)
def test_aligned_fold_equals_reference_fold_and_indexes_the_given_ids(
    batches: list[list[Event]], ids: list[str], by_item: bool, chunks: int
) -> None:
    """The planner's fold: same rows as the reference, and each given id's row (or -1 with no events)."""
    events = flat(batches)
    if by_item:  # long runs of one item, as an ack commit writes them: the run-head path of the encoder
        events = sorted(events, key=lambda e: e.item_id)
    light = to_table(events, chunks)
    # chunks == 2: the log's form, a stream of small batches with an item's run split across them
    batches = light.to_batches(max_chunksize=3) if chunks == 2 else light.to_batches()
    table, index = fold_batches(batches, pa.array(ids, pa.string()))
    assert index is not None
    assert sorted(table.to_pylist(), key=lambda r: r["item_id"]) == reference_rows(events)
    present = {e.item_id for e in events}
    assert len(index) == len(ids)
    for iid, row in zip(ids, index.tolist()):
        assert (row >= 0) == (iid in present)
        if row >= 0:
            assert table["item_id"][row].as_py() == iid


@settings(max_examples=examples(60), deadline=None)
@given(logs(), logs(), st.randoms())
def test_interleaving_other_items_changes_nothing(
    mine: list[list[Event]], others: list[list[Event]], rnd: random.Random
) -> None:
    own = [e for e in flat(mine) if e.item_id == "a"]
    noise = [e for e in flat(others) if e.item_id != "a"]
    mixed = own + noise
    rnd.shuffle(mixed)
    assert fold_events("a", mixed) == fold_events("a", own)
    if own:
        alone = vector_rows(own)
        together = [r for r in vector_rows(mixed) if r["item_id"] == "a"]
        assert together == alone


@settings(max_examples=examples(100), deadline=None)
@given(logs(), st.randoms())
def test_replaying_and_shuffling_batches_changes_nothing(batches: list[list[Event]], rnd: random.Random) -> None:
    events = flat(batches)
    expected = all_states(events)
    # replay any prefix of batches (an ambiguously acknowledged retry), in any order
    k = rnd.randint(0, len(batches))
    replayed = flat(batches) + flat(batches[:k])
    rnd.shuffle(replayed)
    assert all_states(replayed) == expected
    assert vector_rows(replayed) == vector_rows(events)


@settings(max_examples=examples(60), deadline=None)
@given(logs(), logs(), logs(), st.randoms())
def test_union_of_logs_is_a_semilattice_under_the_fold(
    a: list[list[Event]], b: list[list[Event]], c: list[list[Event]], rnd: random.Random
) -> None:
    A, B, C = flat(a), flat(b), flat(c)

    def merge(*logs: list[Event]) -> list[Event]:
        out = [e for log in logs for e in log]
        rnd.shuffle(out)  # a union has no order
        return out

    def f(events: list[Event]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        return all_states(events), vector_rows(events)

    assert f(merge(A, B)) == f(merge(B, A))  # commutative
    assert f(merge(merge(A, B), C)) == f(merge(A, merge(B, C)))  # associative
    assert f(merge(A, A)) == f(A)  # idempotent
    assert f(merge(A, [])) == f(A)  # the empty log is the identity
    assert f(merge(A, B, A, B)) == f(merge(A, B))


def test_which_copy_of_a_retried_event_is_kept_does_not_depend_on_order() -> None:
    # the same losing event written by two writers at one epoch: the violation names the same copy
    base = ev("a", 0, ET.ITEM_CREATED)
    winner, loser = sorted(
        [ev("a", 1, ET.FIELD_SET, field="x", value=1), ev("a", 1, ET.FIELD_SET, field="x", value=2)],
        key=lambda e: e.event_key,
    )
    copies = [rewritten(loser, writer="w1"), rewritten(loser, writer="w3")]
    failed = ev("a", 2, ET.FAILED)
    failed_copies = [rewritten(failed, writer="w1"), rewritten(failed, writer="w3")]
    one = [base, winner, *copies, *failed_copies]
    two = [*failed_copies[::-1], *copies[::-1], winner, base]
    assert fold_events("a", one) == fold_events("a", two)
    assert [v.writer_id for v in fold_events("a", one).violations] == ["w3"]
    assert failure_records(one) == failure_records(two)
    assert [r.writer_id for r in failure_records(one)] == ["w3"]


@settings(max_examples=examples(150), suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(logs(), st.lists(st.sampled_from([*ITEMS, "z"]), unique=True), st.integers(1, 7), st.integers(1, 7))
def test_two_streams_of_different_batch_sizes_fold_as_one_table(
    batches: list[list[Event]], ids: list[str], id_rows: int, other_rows: int
) -> None:
    """The log's form: ids in one stream, the other columns in another, cut at other places."""
    events = flat(batches)
    light = to_table(events)
    wanted = pa.array(ids, pa.string()) if ids else None
    table, index = fold_batches(
        light.select(["item_id"]).to_batches(max_chunksize=id_rows),
        wanted,
        other=light.drop_columns(["item_id"]).to_batches(max_chunksize=other_rows),
    )
    assert sorted(table.to_pylist(), key=lambda r: r["item_id"]) == reference_rows(events)
    if wanted is None:
        assert index is None
    else:
        assert index is not None
        for iid, row in zip(ids, index.tolist()):
            assert (row >= 0) == any(e.item_id == iid for e in events)
            if row >= 0:
                assert table["item_id"][row].as_py() == iid


def test_streams_of_different_lengths_are_refused() -> None:
    light = to_table(happy("a") + happy("b"))
    with pytest.raises(MisalignedStreamsError, match="item ids: 12 rows, the other columns: 11"):
        fold_batches([light.select(["item_id"])], None, other=[light.drop_columns(["item_id"]).slice(0, 11)])


def test_an_error_in_the_id_stream_stops_the_other_stream() -> None:
    light = to_table(happy("a") * 1)
    pulled = []

    def other() -> Any:
        for i in range(1000):
            pulled.append(i)
            yield light.drop_columns(["item_id"])

    def ids() -> Any:
        yield light.select(["item_id"])
        raise RuntimeError("the scan broke")

    with pytest.raises(RuntimeError, match="the scan broke"):
        fold_batches(ids(), None, other=other())
    assert len(pulled) < 1000


def test_a_batch_is_reduced_to_a_fraction_of_its_memory() -> None:
    """A streamed fold keeps numbers and sparse strings, and no view into the batches it was given.

    Keeping a numpy view of a scanned column kept Lance's whole decoded buffers alive: about 400 MB
    for a fold of 5M events.
    """
    n = 20_000
    fps = [f"{i:032x}" for i in range(n)]
    types = ("ITEM_CREATED", "STEP_STARTED", "FIELD_SET", "STEP_COMPLETED", "TERMINAL")
    before = pa.total_allocated_bytes()
    batch = pa.table(
        {
            # a slice of a larger buffer, as a scan's decoded page can be: a view would keep all of it
            "event_key": pa.array(range(20 * n), pa.int64()).slice(0, n),
            "item_id": pa.array([f"item-{i // 5:08d}" for i in range(n)]),
            "item_seq": pa.array([i % 5 for i in range(n)], pa.int64()),
            "event_type": pa.array([types[i % 5] for i in range(n)]),
            "status": pa.array([("running", None, None, None, "completed")[i % 5] for i in range(n)]),
            "input_fingerprint": pa.array(fps),
            "processor_version": pa.array(["v1"] * n),
            "writer_epoch": pa.array([1] * n, pa.int64()),
        }
    )
    size = batch.nbytes
    acc = _Compacted()
    acc.add(batch)
    del batch  # what is still allocated is what the fold kept
    kept = pa.total_allocated_bytes() - before
    # the per-row numbers live in numpy; of the strings, a fifth of the fingerprints and the run heads
    assert kept < 0.25 * size, (kept, size)
    table, _ = _fold(acc, None)
    assert table.num_rows == n // 5
    assert table["input_fingerprint"].to_pylist() == fps[::5]
