"""The usage lens: the reference fold over events and the vectorized fold over Arrow columns agree.

The vectorized fold parses the usage payloads with pyarrow's JSON reader and sums per model with
grouped aggregates; the reference fold is plain Python. Both count one copy per event id, keep failed
attempts' cost apart and can leave one writer's rows out (a run's budget counts its own usage itself).
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_datagen.core.events import Event, StepCoord, event_id_for
from airflow_provider_datagen.core.fold.usage import USAGE_COLUMNS, usage_of_events, usage_of_table
from airflow_provider_datagen.core.schema import STORED_STATUS_FAILED, STORED_STATUS_TRANSIENT
from airflow_provider_datagen.core.schema import EventType as ET
from tests._support.profiles import examples

MODELS = ["openai:gpt-5-mini", "anthropic:claude-x", "local:unpriced"]
WRITERS = [("w1", 1), ("w1", 2), ("w2", 3)]


def _event(n: int, et: ET, status: str | None, value: Any, writer: tuple[str, int]) -> Event:
    text = None if value is None else json.dumps(value, sort_keys=True)
    return Event(
        event_id=event_id_for("i", n, et.value, text),
        item_id=f"i{n % 5}",
        root_item_id=f"i{n % 5}",
        parent_item_id=None,
        item_seq=n,
        event_type=et,
        status=status,
        coord=StepCoord("s", "Step"),
        field=None,
        value_kind=None if value is None else "json",
        value_json=text,
        value_size=None,
        value_digest=None,
        input_fingerprint=None,
        processor_version=None,
        writer_id=writer[0],
        writer_epoch=writer[1],
    )


entries = st.fixed_dictionaries(
    {
        "model": st.sampled_from(MODELS),
        "calls": st.integers(1, 5),
        "input_tokens": st.integers(0, 10_000),
        "output_tokens": st.integers(0, 10_000),
        "cost_usd": st.one_of(st.none(), st.floats(0, 3, allow_nan=False)),
        "unpriced_calls": st.integers(0, 5),
    }
)
#: an older version's unchecked values: beyond int64, beyond the bounds the folds read them at
hostile_entries = st.fixed_dictionaries(
    {
        "model": st.sampled_from(MODELS),
        "calls": st.sampled_from([1, 2**64, 10**16]),
        "input_tokens": st.sampled_from([0, 2**64, 2**63 - 1, 10**15 + 1]),
        "output_tokens": st.sampled_from([0, 2**70, 10**12]),
        "cost_usd": st.sampled_from([None, 9.2e9, 1e300, 0.5]),
        "unpriced_calls": st.sampled_from([0, 2**64]),
    }
)
requests = st.integers(0, 12) | st.sampled_from([2**64, 10**16])
payloads = st.one_of(
    st.none(),  # a row without a value (a plain STEP_COMPLETED, a FAILED row without a policy)
    st.fixed_dictionaries({"attempt": st.integers(1, 4), "transient": st.booleans()}),  # a retry record only
    st.fixed_dictionaries({"attempt": st.integers(1, 4), "usage": st.lists(entries, max_size=3)}),
    # an attempt that counted its requests (ctx.take_request_slot), with usage or without (all failed)
    st.fixed_dictionaries({"attempt": st.integers(1, 4), "usage": st.lists(entries, max_size=3), "requests": requests}),
    st.fixed_dictionaries({"attempt": st.integers(1, 4), "transient": st.booleans(), "requests": requests}),
    st.fixed_dictionaries({"attempt": st.integers(1, 4), "usage": st.lists(hostile_entries, min_size=1, max_size=2)}),
    # values that are not a usage record: another JSON type, an object that only mentions "usage"
    st.sampled_from(["a string", 7, ["usage"], {"note": "usage"}, {"note": "requests"}]),
)
kinds = st.sampled_from(
    [
        (ET.STEP_COMPLETED, None),
        (ET.FAILED, STORED_STATUS_FAILED),
        (ET.FAILED, STORED_STATUS_TRANSIENT),
        (ET.FIELD_SET, None),
    ]
)


@st.composite
def logs(draw: st.DrawFn) -> list[Event]:
    rows = draw(st.lists(st.tuples(kinds, payloads, st.sampled_from(WRITERS)), max_size=25))
    events = [_event(n, et, status, value, w) for n, ((et, status), value, w) in enumerate(rows)]
    # a retried batch lands twice: the same event ids again (another copy of some rows)
    again = draw(st.lists(st.sampled_from(events), max_size=5)) if events else []
    return events + again


def _table(events: list[Event], *, keys: bool = False) -> pa.Table:
    """The fold's columns of ``events``; with ``keys``, also ``event_key`` (as a store scan reads it)."""
    columns = [*USAGE_COLUMNS, "event_key"] if keys else list(USAGE_COLUMNS)
    return pa.table(
        {
            "event_key": pa.array([e.event_key for e in events], pa.int64()),
            "event_id": pa.array([e.event_id for e in events], pa.string()),
            "event_type": pa.array([e.event_type.value for e in events], pa.string()),
            "value_json": pa.array([e.value_json for e in events], pa.string()),
            "writer_id": pa.array([e.writer_id for e in events], pa.string()),
            "writer_epoch": pa.array([e.writer_epoch for e in events], pa.int64()),
        }
    ).select(columns)


@settings(max_examples=examples(150), deadline=None)
@given(logs(), st.randoms())
def test_the_vectorized_fold_equals_the_reference_fold(events: list[Event], rnd: Any) -> None:
    shuffled = list(events)
    rnd.shuffle(shuffled)
    assert usage_of_table(_table(shuffled)) == usage_of_events(events)
    assert usage_of_table(_table(shuffled, keys=True)) == usage_of_events(events)


@settings(max_examples=examples(60), deadline=None)
@given(logs(), st.sampled_from(WRITERS))
def test_leaving_a_writer_out_equals_folding_without_its_rows(events: list[Event], writer: tuple[str, int]) -> None:
    others = [e for e in events if (e.writer_id, e.writer_epoch) != writer]
    assert usage_of_table(_table(events), exclude_writer=writer) == usage_of_events(others)


def test_a_copy_counts_once_and_failed_attempts_are_shown_apart() -> None:
    entry = {"model": "m", "calls": 1, "input_tokens": 10, "output_tokens": 2, "cost_usd": 0.1, "unpriced_calls": 0}
    done = _event(1, ET.STEP_COMPLETED, None, {"attempt": 2, "usage": [entry]}, ("w", 1))
    transient = _event(
        0, ET.FAILED, STORED_STATUS_TRANSIENT, {"attempt": 1, "transient": True, "usage": [entry]}, ("w", 1)
    )
    events = [transient, done, done, transient]
    for usage in (usage_of_events(events), usage_of_table(_table(events))):
        assert usage["calls"] == 2
        assert usage["input_tokens"] == 20
        assert usage["cost_usd"] == 0.2
        assert usage["failed_attempts_cost_usd"] == 0.1
        assert usage["by_model"] == {
            "m": {"calls": 2, "input_tokens": 20, "output_tokens": 4, "cost_usd": 0.2, "unpriced_calls": 0}
        }
