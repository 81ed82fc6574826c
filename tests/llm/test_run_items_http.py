"""The model step run by ``run_items`` end to end: async on the event loop, a 429 retried in place
after its Retry-After, and the usage of every reply in the log's ledger, all over real HTTP to the
local OpenAI-compatible server (tests/_support/openai_server.py)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from airflow_provider_datagen.core import RetryPolicy, run_items
from airflow_provider_datagen.core.schema import EventType
from airflow_provider_datagen.llm import RETRYABLE_ERRORS, llm_process
from tests._support import openai_server
from tests._support.engine import open_log

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from tests._support.openai_server import FakeOpenAI


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOpenAI]:
    fake = openai_server.start(retry_after=1, slow_seconds=30.0)
    conn = {"conn_type": "pydanticai", "host": fake.base_url, "password": "sk-fake"}
    conn["extra"] = {"model": "openai-chat:gpt-4o-mini"}  # type: ignore[assignment]
    monkeypatch.setenv("AIRFLOW_CONN_LLM_RUN", json.dumps(conn))
    try:
        yield fake
    finally:
        fake.stop()


@pytest.mark.parametrize("engine", ["sdk", "pydantic-ai"])
def test_run_items_with_the_model_step_retries_a_429_and_records_every_replys_usage(
    server: FakeOpenAI, tmp_path: Path, engine: str
) -> None:
    # every fourth prompt is throttled on its first request only
    items: list[dict[str, Any]] = [
        {"id": f"q{k}", "text": f"word {k}" + (" [429 once]" if k % 4 == 0 else "")} for k in range(12)
    ]
    process = llm_process("Repeat {{ text }}", llm_conn_id="llm_run", engine=engine)
    log = open_log(tmp_path, "llm")
    report = run_items(
        log,
        items,
        process,
        processor_version=process.version,
        concurrency=8,
        retry=RetryPolicy(attempts=3, retry_on=RETRYABLE_ERRORS, backoff=0.1),
    )
    assert report.failed == []
    assert sorted(report.processed) == sorted(i["id"] for i in items)
    answered = [r for r in server.requests if r.status == 200]
    throttled = [r for r in server.requests if r.status == 429]
    assert len(answered) == 12
    assert len(throttled) == 3
    # the ledger holds exactly the usage the server reported, and no call for a 429 (it has none)
    usage = log.usage()
    assert usage["calls"] == 12
    assert usage["input_tokens"] == sum(r.usage["prompt_tokens"] for r in answered)
    assert usage["output_tokens"] == sum(r.usage["completion_tokens"] for r in answered)
    assert set(usage["by_model"]) == {"openai:gpt-4o-mini"}
    # each 429 is one transient FAILED row whose wait honoured the Retry-After header (1 s)
    for k in (0, 4, 8):
        failed = [ev for ev in log.events(f"q{k}") if ev.event_type is EventType.FAILED]
        assert len(failed) == 1
        record = json.loads(failed[0].value_json)
        assert record["transient"] is True
        assert record["attempt"] == 1
        assert record["wait"] >= 1.0
    assert log.states().num_rows == 12
