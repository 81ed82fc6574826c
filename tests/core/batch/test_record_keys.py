"""A batch's rows name their requests in their usage entries (``"request_keys"``), as the online step's do,
and the replies a batch stores carry the request as sent (the item page shows both)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_datagen.core import ResponseStore, run_items
from airflow_provider_datagen.core.batch.record import _keyed_json, _reused_usage
from airflow_provider_datagen.core.events import canonical_json
from airflow_provider_datagen.core.ledger import attempt_entries, usage_record
from airflow_provider_datagen.core.store.responses import ResponseEntry
from airflow_provider_datagen.llm import llm_process
from dev.batch_server import serving
from tests._support.profiles import examples
from tests.core.batch.helpers import PROMPT, make_items, openai_step, run

if TYPE_CHECKING:
    from collections.abc import Callable

    import pytest

    from airflow_provider_datagen.core import CheckpointLog

KEY = "0123456789abcdef" * 4


@settings(max_examples=examples(200), deadline=None, derandomize=True)
@given(
    model=st.text(min_size=1, max_size=40).filter(lambda t: not any(0xD800 <= ord(c) <= 0xDFFF for c in t)),
    tokens=st.integers(0, 10**12),
    cost=st.none() | st.floats(min_value=0, max_value=1e6, allow_nan=False),
)
def test_a_keyed_entry_is_the_canonical_json_of_the_entry_with_its_key(model: str, tokens: int, cost: Any) -> None:
    entries = attempt_entries([usage_record(model, tokens, tokens, cost, 1)])
    keyed = attempt_entries([usage_record(model, tokens, tokens, cost, 1, KEY)])
    assert _keyed_json(canonical_json(entries), KEY) == canonical_json(keyed)


def test_a_reused_rows_entry_names_its_key() -> None:
    entry = ResponseEntry(key=KEY, reply_json="{}", model="openai:gpt-4o-mini", input_tokens=3, cost_usd=0.5)
    usage, text = _reused_usage(entry)
    assert usage[0]["request_keys"] == [KEY] and usage[0]["reused"] is True
    assert json.loads(text) == usage


def _keys(log: CheckpointLog, item: str) -> list[str]:
    (ev,) = [e for e in log.events(item) if e.event_type.value == "STEP_COMPLETED"]
    assert ev.value_json is not None
    return [k for e in json.loads(ev.value_json)["usage"] for k in e["request_keys"]]


def test_batch_rows_record_the_keys_the_online_step_records(
    checkpoint_log: Callable[..., CheckpointLog], monkeypatch: pytest.MonkeyPatch
) -> None:
    items = make_items(6)
    with serving(complete_after_polls=1) as fake:
        conn = {"conn_type": "pydanticai", "host": fake.base_url, "password": "sk-fake"}
        conn["extra"] = {"model": "openai-chat:gpt-4o-mini"}  # type: ignore[assignment]
        monkeypatch.setenv("AIRFLOW_CONN_LLM_KEYS", json.dumps(conn))
        batch_log = checkpoint_log("batch")
        report = run(batch_log, items, openai_step(fake.base_url, reuse=True))  # sent in a batch, stored
        assert report.failed == [] and fake.creates == 1
        online_log = checkpoint_log("online")
        process = llm_process(PROMPT, llm_conn_id="llm_keys")
        run_items(online_log, items, process, processor_version=process.version)  # type: ignore[attr-defined]
        assert fake.online_requests == 0  # every request answered from the batch's replies
        again = checkpoint_log("batch-again")
        run(again, items, openai_step(fake.base_url, reuse=True))  # reused rows
        assert fake.creates == 1
    store = ResponseStore.open(batch_log.root)
    for item in items:
        iid = item["id"]
        (key,) = _keys(batch_log, iid)
        assert _keys(online_log, iid) == [key] == _keys(again, iid)
        stored = store.get_many([key])[key]
        assert stored.experiment == "batch"
        request = json.loads(stored.request_json or "null")
        assert request["messages"][-1]["content"] == PROMPT.replace("{{ text }}", item["text"])
