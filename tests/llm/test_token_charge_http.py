"""``tokens_per_minute`` is charged per model request (issue 24, point 2's contract), over real HTTP.

The model step records each reply's usage as it arrives, and recorded tokens are charged to the run's
token window: an answer that fails validation and is sent back to the model is two requests, and both
replies' tokens are in the window, once each (no estimate charged beside them, nothing charged twice).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest
from pydantic import BaseModel

from airflow_provider_datagen.core import RetryPolicy, run_items
from airflow_provider_datagen.core.ratelimit import RateLimit, open_limiter
from airflow_provider_datagen.llm import RETRYABLE_ERRORS, llm_process
from tests._support import openai_server
from tests._support.engine import open_log

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from tests._support.openai_server import FakeOpenAI

#: under 1000, the token window counts single tokens
TPM = 900


class Translation(BaseModel):
    french: str
    words: int


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOpenAI]:
    fake = openai_server.start(retry_after=1, tool_args={"french": "bonjour", "words": 1})
    conn = {"conn_type": "pydanticai", "host": fake.base_url, "password": "sk-fake"}
    conn["extra"] = {"model": "openai-chat:gpt-4o-mini"}  # type: ignore[assignment]
    monkeypatch.setenv("AIRFLOW_CONN_LLM_TOKENS", json.dumps(conn))
    try:
        yield fake
    finally:
        fake.stop()


@pytest.mark.parametrize("engine", ["sdk", "pydantic-ai"])
def test_each_replys_tokens_are_charged_to_the_token_window_once(
    server: FakeOpenAI, tmp_path: Path, engine: str
) -> None:
    items = [{"id": "q0", "text": "one"}, {"id": "q1", "text": "two [invalid once]"}, {"id": "q2", "text": "three"}]
    limit = RateLimit(requests_per_minute=100, tokens_per_minute=TPM, key="llm-tokens")
    process = llm_process(
        "Translate {{ text }}",
        llm_conn_id="llm_tokens",
        output_type=Translation,
        output_retries=1,
        engine=engine,
    )
    log = open_log(tmp_path, "tokens")
    policy = RetryPolicy(attempts=2, retry_on=RETRYABLE_ERRORS, backoff=0.0, jitter=False)
    version = process.version  # type: ignore[attr-defined]
    report = run_items(log, items, process, processor_version=version, retry=policy, rate_limit=limit)
    assert report.failed == []
    assert len(server.requests) == 4  # q1's answer failed validation and was sent back: two requests
    served = sum(r.usage["total_tokens"] for r in server.requests if r.usage)
    usage = log.usage()
    assert (usage["requests"], usage["calls"]) == (4, 4)
    assert usage["input_tokens"] + usage["output_tokens"] == served
    assert served < TPM
    # the window holds exactly the served tokens: what is left fits, one token more does not
    fits = open_limiter(limit, root=str(log.root))
    try:
        assert fits.try_acquire(cost_requests=1, est_tokens=TPM - served) is True
    finally:
        fits.close()
    full = open_limiter(limit, root=str(log.root))
    try:
        assert full.try_acquire(cost_requests=1, est_tokens=1) is False
    finally:
        full.close()
