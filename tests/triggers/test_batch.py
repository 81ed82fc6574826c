"""DatagenBatchTrigger against the in-process fake batch server: serialize round-trip, polling until ended, errors."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

import pytest

from airflow_provider_datagen.core.batch.protocol import RequestLine
from airflow_provider_datagen.exceptions import ConfigurationError
from airflow_provider_datagen.llm.batch.clients import OpenAIBatchClient
from airflow_provider_datagen.triggers import batch as batch_module
from airflow_provider_datagen.triggers.batch import DatagenBatchTrigger
from dev.batch_server import FakeBatchServer, serving

if TYPE_CHECKING:
    from collections.abc import Iterator

TRIGGER_PATH = "airflow_provider_datagen.triggers.batch.DatagenBatchTrigger"


@pytest.fixture
def fake() -> Iterator[FakeBatchServer]:
    with serving(complete_after_polls=3) as server:
        yield server


def _submit(fake: FakeBatchServer, n: int = 2) -> str:
    client = OpenAIBatchClient("sk-test", fake.base_url)
    try:
        lines = [
            RequestLine(f"c{i}-1", {"model": "m", "messages": [{"role": "user", "content": f"q{i}"}]}) for i in range(n)
        ]
        return client.submit(lines, metadata={})
    finally:
        client.close()


def _events(trigger: DatagenBatchTrigger) -> list[dict[str, Any]]:
    async def collect() -> list[dict[str, Any]]:
        return [event.payload async for event in trigger.run()]

    return asyncio.run(asyncio.wait_for(collect(), timeout=60))


def test_serialize_round_trips_and_holds_no_key_read_from_a_connection() -> None:
    trigger = DatagenBatchTrigger(
        batch_ids=["b1", "b2"], provider="anthropic", llm_conn_id="llm", poll_interval=5, resume={"epoch": 3}
    )
    path, kwargs = trigger.serialize()
    assert path == TRIGGER_PATH
    assert kwargs == {
        "batch_ids": ["b1", "b2"],
        "provider": "anthropic",
        "llm_conn_id": "llm",
        "base_url": None,
        "api_key": None,
        "poll_interval": 5.0,
        "resume": {"epoch": 3},
    }
    json.dumps(kwargs)  # what the metadata DB stores
    again = DatagenBatchTrigger(**kwargs)
    assert again.serialize() == (path, kwargs)


def test_polls_every_batch_until_all_have_ended(fake: FakeBatchServer) -> None:
    ids = [_submit(fake), _submit(fake, 3)]
    trigger = DatagenBatchTrigger(
        batch_ids=ids, provider="openai", base_url=fake.base_url, api_key="sk-test", poll_interval=0.01, resume={"x": 1}
    )
    [event] = _events(trigger)
    assert event["status"] == "ended" and event["resume"] == {"x": 1}
    assert set(event["batches"]) == set(ids)
    assert {b["state"] for b in event["batches"].values()} == {"ended"}
    assert event["batches"][ids[1]]["counts"]["succeeded"] == 3
    # each polled until it ended (the fake ends a batch on its third retrieve), and never again after
    assert [b.polls for b in fake.batches] == [3, 3]


def test_reads_the_connection_on_the_triggerer(fake: FakeBatchServer, monkeypatch: pytest.MonkeyPatch) -> None:
    conn = {"conn_type": "pydanticai", "host": fake.base_url, "password": "sk-conn"}
    monkeypatch.setenv("AIRFLOW_CONN_TRIGGER_LLM", json.dumps(conn))
    batch_id = _submit(fake)
    [event] = _events(
        DatagenBatchTrigger(batch_ids=[batch_id], provider="openai", llm_conn_id="trigger_llm", poll_interval=0.01)
    )
    assert event["status"] == "ended" and event["batches"][batch_id]["state"] == "ended"


def test_an_unknown_batch_yields_an_error_event_naming_it(fake: FakeBatchServer) -> None:
    trigger = DatagenBatchTrigger(
        batch_ids=["batch_missing"], provider="openai", base_url=fake.base_url, api_key="k", poll_interval=0.01
    )
    [event] = _events(trigger)
    assert event["status"] == "error" and event["batch_id"] == "batch_missing"
    assert event["error_type"] == "BatchAPIError" and "batch_missing" in event["message"]


def test_transient_poll_errors_are_retried_then_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    class Flaky:
        provider = "openai"

        def retrieve(self, batch_id: str) -> Any:
            calls.append(batch_id)
            raise ConnectionError("connection reset by peer")

        def close(self) -> None:
            pass

    trigger = DatagenBatchTrigger(batch_ids=["b1"], provider="openai", base_url="http://x", poll_interval=0.01)

    async def flaky_client() -> Flaky:
        return Flaky()

    monkeypatch.setattr(trigger, "_client", flaky_client)
    [event] = _events(trigger)
    assert calls == ["b1"] * batch_module.MAX_POLL_ERRORS
    assert event == {
        "status": "error",
        "message": "ConnectionError: connection reset by peer",
        "error_type": "ConnectionError",
        "batch_id": "b1",
        "batches": {},
        "resume": {},
    }


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"batch_ids": []}, r"^DatagenBatchTrigger: batch_ids=\[\] is not a non-empty list of batch ids"),
        ({"batch_ids": "b1"}, r"^DatagenBatchTrigger: batch_ids='b1' is not a non-empty list"),
        ({"provider": "gemini"}, r"^DatagenBatchTrigger: provider='gemini' is not a batch provider"),
        ({"poll_interval": -1}, r"^DatagenBatchTrigger: poll_interval=-1 is not a positive number of seconds"),
    ],
)
def test_bad_arguments_are_refused_naming_them(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        DatagenBatchTrigger(**{"batch_ids": ["b1"], "provider": "openai", **kwargs})
