"""The model step over HTTP, on both engines (``engine="sdk"``: the OpenAI SDK; ``"pydantic-ai"``: the
common.ai hook's agent) against a local OpenAI-compatible server (tests/_support/openai_server.py) that
returns usage, a 429 with Retry-After, errors and slow replies. The engines raise their own error types;
both are in RETRYABLE_ERRORS or not alike."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

import openai
import pytest
from pydantic import BaseModel
from pydantic_ai.exceptions import (
    ModelRateLimitError,
    ModelRequestRejectedError,
    ModelRequestTimeout,
    ModelTimeoutError,
    ModelUnavailableError,
)

from airflow_provider_datagen.core.retry import RetryPolicy, retry_after_of
from airflow_provider_datagen.llm import RETRYABLE_ERRORS, llm_process
from tests._support import openai_server

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from tests._support.openai_server import FakeOpenAI
    from tests._support.recording_context import RecordingContext

POLICY = RetryPolicy(attempts=5, retry_on=RETRYABLE_ERRORS, backoff=1.0, max_backoff=60.0)


class Translation(BaseModel):
    french: str
    words: int


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOpenAI]:
    """The fake server, and a ``pydanticai`` connection ``llm_http`` to it as the provider reads one:
    host = base URL, password = API key, extra ``model`` (``openai-chat:``: the Chat Completions API
    that vLLM, Ollama and other OpenAI-compatible servers speak)."""
    fake = openai_server.start(retry_after=7, slow_seconds=30.0, tool_args={"french": "bonjour", "words": 1})
    conn = {
        "conn_type": "pydanticai",
        "host": fake.base_url,
        "password": "sk-fake",
        "extra": {"model": "openai-chat:gpt-4o-mini"},
    }
    monkeypatch.setenv("AIRFLOW_CONN_LLM_HTTP", json.dumps(conn))
    try:
        yield fake
    finally:
        fake.stop()


@pytest.fixture(params=["sdk", "pydantic-ai"])
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _call(process: Any, item: dict[str, Any], ctx: RecordingContext) -> Any:
    return asyncio.run(process(item, ctx))


def test_usage_is_recorded_from_the_http_reply(
    server: FakeOpenAI, make_ctx: Callable[..., RecordingContext], engine: str
) -> None:
    process = llm_process("Say {{ w }}", llm_conn_id="llm_http", instructions="Be brief.", engine=engine)
    ctx = make_ctx()
    assert _call(process, {"w": "hello"}, ctx) == {"output": "echo: Say hello"}
    [request] = server.requests
    assert request.body["model"] == "gpt-4o-mini"
    assert request.body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Say hello"},
    ]
    assert request.usage == {"prompt_tokens": 19, "completion_tokens": 7, "total_tokens": 26}
    assert ctx.usage == [
        {"model": "openai:gpt-4o-mini", "input_tokens": 19, "output_tokens": 7, "cost_usd": None, "calls": 1}
    ]


def test_a_structured_answer_over_http(
    server: FakeOpenAI, make_ctx: Callable[..., RecordingContext], engine: str
) -> None:
    process = llm_process(
        "Translate {{ w }}",
        llm_conn_id="llm_http",
        model_id="openai-chat:gpt-4.1-nano",
        output_type=Translation,
        engine=engine,
    )
    ctx = make_ctx()
    assert _call(process, {"w": "hello"}, ctx) == {"french": "bonjour", "words": 1}
    [request] = server.requests
    assert request.body["model"] == "gpt-4.1-nano"  # model_id wins over the connection's model
    if engine == "sdk":  # the JSON-schema response format (the batch step's body)
        assert request.body["response_format"] == {
            "type": "json_schema",
            "json_schema": {"name": "final_result", "schema": Translation.model_json_schema(), "strict": False},
        }
    else:  # pydantic-ai's output tool
        assert [t["function"]["name"] for t in request.body["tools"]] == ["final_result"]
    assert ctx.usage == [
        {"model": "openai:gpt-4.1-nano", "input_tokens": 25, "output_tokens": 10, "cost_usd": None, "calls": 1}
    ]


def test_a_429_carries_the_retry_after_of_its_header_and_is_sent_once(
    server: FakeOpenAI, make_ctx: Callable[..., RecordingContext], engine: str
) -> None:
    process = llm_process("{{ w }}", llm_conn_id="llm_http", engine=engine)
    ctx = make_ctx()
    error, text = (
        (openai.RateLimitError, "Error code: 429") if engine == "sdk" else (ModelRateLimitError, "status_code: 429")
    )
    with pytest.raises(error, match=text) as caught:
        _call(process, {"w": "[429]"}, ctx)
    assert retry_after_of(caught.value) == 7.0  # what core/retry.py waits at least
    assert POLICY.retryable(caught.value)
    assert not RetryPolicy(retry_on=RETRYABLE_ERRORS, backoff=1.0, max_backoff=5.0).retryable(caught.value)
    # the client did not retry it itself (its default is twice, after the Retry-After): the run's policy owns retries
    assert [r.status for r in server.requests] == [429]
    assert ctx.usage == []  # a refused request is not paid for


@pytest.mark.parametrize(
    ("settings", "engine", "error"),
    [
        ({}, "pydantic-ai", ModelRequestTimeout),
        ({"timeout": 0.5}, "pydantic-ai", ModelTimeoutError),
        ({}, "sdk", openai.APITimeoutError),
        ({"timeout": 0.5}, "sdk", openai.APITimeoutError),
    ],
    ids=["pydantic-ai-timeout=", "pydantic-ai-client-timeout", "sdk-timeout=", "sdk-client-timeout"],
)
def test_a_slow_reply_times_out_with_a_retryable_error_after_one_request(
    server: FakeOpenAI,
    make_ctx: Callable[..., RecordingContext],
    settings: dict[str, Any],
    engine: str,
    error: type[Exception],
) -> None:
    # timeout= is pydantic-ai's deadline of the request (the sdk client's timeout); model_settings={"timeout": ...}
    # the client's own on both
    process = llm_process(
        "{{ w }}", llm_conn_id="llm_http", timeout=None if settings else 0.5, model_settings=settings, engine=engine
    )
    with pytest.raises(error) as caught:
        _call(process, {"w": "[slow]"}, make_ctx())
    assert POLICY.retryable(caught.value) and retry_after_of(caught.value) is None
    assert [r.text for r in server.requests] == ["[slow]"]  # one request per call, no client retry


def test_server_errors_are_retryable_and_rejected_requests_are_not(
    server: FakeOpenAI, make_ctx: Callable[..., RecordingContext], engine: str
) -> None:
    process = llm_process("{{ w }}", llm_conn_id="llm_http", engine=engine)
    sdk = engine == "sdk"
    with pytest.raises(openai.InternalServerError if sdk else ModelUnavailableError) as unavailable:
        _call(process, {"w": "[http 503]"}, make_ctx())
    assert POLICY.retryable(unavailable.value)
    with pytest.raises(openai.BadRequestError if sdk else ModelRequestRejectedError) as rejected:
        _call(process, {"w": "[http 400]"}, make_ctx())
    assert not POLICY.matches(rejected.value)
    assert [r.status for r in server.requests] == [503, 400]
