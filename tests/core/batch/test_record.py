"""Recording a batch's rows: the STEP_COMPLETED value put together from its parts is encode_value's."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_datagen.core.batch.ids import custom_id
from airflow_provider_datagen.core.batch.record import _completed_value
from airflow_provider_datagen.core.events import canonical_json, encode_value
from airflow_provider_datagen.core.schema import DEFAULT_BLOB_THRESHOLD
from tests._support.profiles import examples

costs = (
    st.none() | st.floats(min_value=0, max_value=1e6, allow_nan=False) | st.sampled_from([0.0, 1.5e-6, 7.5e-8, 1e-4])
)
entries = st.lists(
    st.fixed_dictionaries(
        {
            "model": st.text(min_size=1, max_size=40),
            "calls": st.integers(1, 10),
            "input_tokens": st.integers(0, 10**12),
            "output_tokens": st.integers(0, 10**12),
            "cost_usd": costs,
            "unpriced_calls": st.integers(0, 10),
        }
    ),
    min_size=1,
    max_size=3,
)


@settings(max_examples=examples(300), deadline=None, derandomize=True)
@given(
    attempt=st.integers(1, 10**6),
    batch_id=st.text(max_size=80).filter(lambda t: not any(0xD800 <= ord(c) <= 0xDFFF for c in t)),
    item=st.text(min_size=1, max_size=30),
    usage=entries,
)
def test_the_completed_value_is_the_encoding_of_its_dict(attempt: int, batch_id: str, item: str, usage: Any) -> None:
    cid = custom_id(item, "f" * 32, attempt)
    value = {"attempt": attempt, "usage": usage, "batch": True, "batch_id": batch_id, "custom_id": cid}
    assert _completed_value(attempt, canonical_json(batch_id), cid, canonical_json(usage)) == encode_value(value)


def test_a_value_past_the_blob_threshold_is_stored_as_encode_value_stores_it() -> None:
    usage = [{"model": "m" * 200, "calls": 1, "input_tokens": 1, "output_tokens": 1, "cost_usd": None}] * 400
    cid = custom_id("k", "f" * 32, 1)
    value = {"attempt": 1, "usage": usage, "batch": True, "batch_id": "b", "custom_id": cid}
    enc = _completed_value(1, canonical_json("b"), cid, canonical_json(usage))
    assert enc.size > DEFAULT_BLOB_THRESHOLD and enc.json_text is None
    assert enc == encode_value(value)
