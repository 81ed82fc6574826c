"""Both engines against the local server's OpenAI and Anthropic APIs (tests/_support/openai_server.py):
the same fields for the same answer of every output type, the same errors' retryability, the same
slots and usage per request, the same ``version``; and what only ``engine="sdk"`` does (its client per
loop, on aiohttp, built from the connection on the first call)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import TYPE_CHECKING, Any

import anthropic
import openai
import pytest
from pydantic import BaseModel
from pydantic_ai.exceptions import UnexpectedModelBehavior
from pydantic_ai.models.test import TestModel
from typing_extensions import TypedDict

from airflow_provider_datagen.core.retry import RetryPolicy, retry_after_of
from airflow_provider_datagen.exceptions import ConfigurationError, OutputValidationError
from airflow_provider_datagen.llm import RETRYABLE_ERRORS, llm_process, sdk
from airflow_provider_datagen.llm import connection as connection_module
from tests._support import openai_server

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from tests._support.openai_server import FakeOpenAI
    from tests._support.recording_context import RecordingContext

POLICY = RetryPolicy(attempts=5, retry_on=RETRYABLE_ERRORS, backoff=1.0, max_backoff=60.0)
ENGINES = ["sdk", "pydantic-ai"]
#: (connection id, the model the connection names, the label its usage is recorded under)
APIS = {
    "openai": ("llm_oa", "openai-chat:gpt-4o-mini", "openai:gpt-4o-mini"),
    # a model pydantic-ai does not know the output limit of: it sends the request unstreamed (the server
    # does not stream)
    "anthropic": ("llm_an", "anthropic:claude-fake", "anthropic:claude-fake"),
}


class Translation(BaseModel):
    french: str
    words: int


@dataclasses.dataclass
class Pair:
    left: str
    right: int


class Movie(TypedDict):
    title: str
    year: int


SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "n": {"type": "integer"}}, "required": ["city"]}

#: (output type, the answer's value, the fields stored for it); a value type is answered wrapped in
#: one property: pydantic-ai's "response", the sdk engine's output field (the batch step's body)
OUTPUTS: dict[str, tuple[Any, Any, dict[str, Any]]] = {
    "str": (str, None, {"output": "echo: Say hello"}),
    "pydantic": (Translation, {"french": "bonjour", "words": 1}, {"french": "bonjour", "words": 1}),
    "dataclass": (Pair, {"left": "a", "right": 2}, {"left": "a", "right": 2}),
    "typeddict": (Movie, {"title": "Up", "year": 2009}, {"title": "Up", "year": 2009}),
    "json-schema": (SCHEMA, {"city": "Paris", "n": 3}, {"city": "Paris", "n": 3}),
    "list[str]": (list[str], ["a", "b"], {"output": ["a", "b"]}),
    "int": (int, 42, {"output": 42}),
}


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOpenAI]:
    """The fake server, and a ``pydanticai`` connection to each of its APIs."""
    fake = openai_server.start(retry_after=7, slow_seconds=30.0, tool_args={"french": "bonjour", "words": 1})
    for api, (conn_id, model, _label) in APIS.items():
        host = fake.anthropic_url if api == "anthropic" else fake.base_url
        conn = {"conn_type": "pydanticai", "host": host, "password": "sk-fake", "extra": {"model": model}}
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(conn))
    try:
        yield fake
    finally:
        fake.stop()


def _call(process: Any, item: dict[str, Any], ctx: RecordingContext) -> Any:
    return asyncio.run(process(item, ctx))


@pytest.mark.parametrize("api", list(APIS))
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("kind", list(OUTPUTS))
def test_every_output_type_stores_the_same_fields_on_both_engines(
    server: FakeOpenAI, make_ctx: Callable[..., RecordingContext], kind: str, engine: str, api: str
) -> None:
    output_type, value, fields = OUTPUTS[kind]
    if kind in ("list[str]", "int"):
        server.tool_args = {"response" if engine == "pydantic-ai" else "output": value}
    elif value is not None:
        server.tool_args = value
    conn_id, _model, label = APIS[api]
    process = llm_process("Say {{ w }}", llm_conn_id=conn_id, output_type=output_type, engine=engine)
    ctx = make_ctx()
    assert _call(process, {"w": "hello"}, ctx) == fields
    [request] = server.requests
    assert request.status == 200
    assert [u["model"] for u in ctx.usage] == [label] and ctx.requests == 1


@pytest.mark.parametrize("api", list(APIS))
@pytest.mark.parametrize("engine", ENGINES)
def test_an_invalid_answer_is_sent_back_once_then_the_valid_one_is_stored(
    server: FakeOpenAI, make_ctx: Callable[..., RecordingContext], engine: str, api: str
) -> None:
    process = llm_process("Say {{ w }}", llm_conn_id=APIS[api][0], output_type=Translation, engine=engine)
    ctx = make_ctx()
    assert _call(process, {"w": "hi [invalid once]"}, ctx) == {"french": "bonjour", "words": 1}
    assert [r.status for r in server.requests] == [200, 200]
    # two requests: two slots, and both replies paid for
    assert ctx.requests == 2
    assert sum(u["calls"] for u in ctx.usage) == 2
    assert sum(u["input_tokens"] for u in ctx.usage) == sum(r.usage["prompt_tokens"] for r in server.requests)
    if engine == "sdk":  # the second request carries the first answer and what was wrong with it
        second = json.dumps(server.requests[1].body)
        assert "does not validate" in second and "french" in second


@pytest.mark.parametrize("api", list(APIS))
@pytest.mark.parametrize("output_retries", [0, 2])
def test_an_answer_that_never_validates_fails_after_output_retries_more_requests(
    server: FakeOpenAI, make_ctx: Callable[..., RecordingContext], api: str, output_retries: int
) -> None:
    server.tool_args = {"french": 1}  # never valid
    process = llm_process(
        "Say {{ w }}", llm_conn_id=APIS[api][0], output_type=Translation, engine="sdk", output_retries=output_retries
    )
    ctx = make_ctx("k9")
    with pytest.raises(OutputValidationError, match=r"^llm_process: item 'k9': the answer does not validate") as caught:
        _call(process, {"w": "hello"}, ctx)
    assert f"after {output_retries + 1} answers" in str(caught.value)
    assert not POLICY.matches(caught.value)  # a prompt or schema problem: not retried
    assert len(server.requests) == ctx.requests == output_retries + 1
    assert sum(u["calls"] for u in ctx.usage) == output_retries + 1


def test_the_agent_engine_fails_an_answer_that_never_validates_its_own_way(
    server: FakeOpenAI, make_ctx: Callable[..., RecordingContext]
) -> None:
    server.tool_args = {"french": 1}
    process = llm_process("{{ w }}", llm_conn_id="llm_oa", output_type=Translation, engine="pydantic-ai")
    ctx = make_ctx()
    with pytest.raises(UnexpectedModelBehavior):
        _call(process, {"w": "hello"}, ctx)
    assert len(server.requests) == ctx.requests == 2  # output_retries=1: one more request


@pytest.mark.parametrize("api", list(APIS))
@pytest.mark.parametrize("engine", ENGINES)
def test_a_429_is_retryable_after_its_retry_after_and_a_400_is_not(
    server: FakeOpenAI, make_ctx: Callable[..., RecordingContext], engine: str, api: str
) -> None:
    process = llm_process("{{ w }}", llm_conn_id=APIS[api][0], engine=engine)
    ctx = make_ctx()
    with pytest.raises(Exception) as throttled:  # each engine raises its own type
        _call(process, {"w": "[429]"}, ctx)
    assert retry_after_of(throttled.value) == 7.0
    assert POLICY.retryable(throttled.value)
    for status in (500, 503):
        with pytest.raises(Exception) as failed:
            _call(process, {"w": f"[http {status}]"}, ctx)
        assert POLICY.retryable(failed.value), failed.value
    for status in (400, 401, 404):
        with pytest.raises(Exception) as rejected:
            _call(process, {"w": f"[http {status}]"}, ctx)
        assert not POLICY.matches(rejected.value), rejected.value
    # one request each (no client retry), each with a slot; none answered, none paid for
    assert [r.status for r in server.requests] == [429, 500, 503, 400, 401, 404]
    assert ctx.requests == 6 and ctx.usage == []


@pytest.mark.parametrize("api", list(APIS))
def test_a_slow_reply_times_out_with_the_sdks_retryable_timeout(
    server: FakeOpenAI, make_ctx: Callable[..., RecordingContext], api: str
) -> None:
    process = llm_process("{{ w }}", llm_conn_id=APIS[api][0], timeout=0.5)
    with pytest.raises((openai.APITimeoutError, anthropic.APITimeoutError)) as caught:
        _call(process, {"w": "[slow]"}, make_ctx())
    assert POLICY.retryable(caught.value) and retry_after_of(caught.value) is None
    assert [r.text for r in server.requests] == ["[slow]"]


def test_structured_tools_asks_an_openai_compatible_server_through_one_forced_function(
    server: FakeOpenAI, make_ctx: Callable[..., RecordingContext]
) -> None:
    process = llm_process("Say {{ w }}", llm_conn_id="llm_oa", output_type=Translation, structured="tools")
    ctx = make_ctx()
    # a server without the JSON-schema response format: the answer comes as the function's arguments
    assert _call(process, {"w": "hi [invalid once]"}, ctx) == {"french": "bonjour", "words": 1}
    first, second = server.requests
    assert "response_format" not in first.body
    assert [t["function"]["name"] for t in first.body["tools"]] == ["final_result"]
    assert first.body["tool_choice"] == {"type": "function", "function": {"name": "final_result"}}
    assert "does not validate" in json.dumps(second.body["messages"][-1])  # the first answer was sent back
    assert ctx.requests == 2
    assert (
        process.version
        == llm_process(  # type: ignore[attr-defined]
            "Say {{ w }}", llm_conn_id="llm_oa", output_type=Translation
        ).version
    )  # type: ignore[attr-defined]


def test_a_server_without_the_json_schema_format_is_asked_through_one_forced_function(
    server: FakeOpenAI, make_ctx: Callable[..., RecordingContext], caplog: pytest.LogCaptureFixture
) -> None:
    server.json_schema = False  # as some vLLM, Ollama and LiteLLM builds: a 400 naming response_format
    process = llm_process("Say {{ w }}", llm_conn_id="llm_oa", output_type=Translation)
    ctx = make_ctx()

    async def two_items() -> list[Any]:  # one run: one event loop, one client
        return [await process({"w": "one"}, ctx), await process({"w": "two"}, make_ctx())]

    with caplog.at_level("WARNING", logger="airflow_provider_datagen.llm.sdk"):
        assert asyncio.run(two_items()) == [{"french": "bonjour", "words": 1}] * 2
    refused, asked, second = server.requests
    assert refused.status == 400 and refused.body["response_format"]["type"] == "json_schema"
    assert "response_format" not in asked.body and asked.body["tools"][0]["function"]["name"] == "final_result"
    assert "response_format" not in second.body  # the step asks every later item through the tool at once
    assert ctx.requests == 2  # the refused request was sent: it took its slot
    warned = [r.getMessage() for r in caplog.records if "refuses the json_schema response format" in r.getMessage()]
    assert warned == [
        f"llm_process: the server at {server.base_url} refuses the json_schema response format; asking it "
        "through one forced tool instead (pass structured='tools' to skip the first try)"
    ]


def test_structured_json_schema_given_keeps_the_response_format_and_fails_on_a_refusal(
    server: FakeOpenAI, make_ctx: Callable[..., RecordingContext]
) -> None:
    server.json_schema = False
    process = llm_process("Say {{ w }}", llm_conn_id="llm_oa", output_type=Translation, structured="json_schema")
    with pytest.raises(openai.BadRequestError, match="response_format"):
        _call(process, {"w": "one"}, make_ctx())
    assert len(server.requests) == 1


def test_a_retry_after_ms_header_is_the_errors_retry_after() -> None:
    import httpx2

    request = httpx2.Request("POST", "http://127.0.0.1/v1/chat/completions")
    response = httpx2.Response(429, headers={"retry-after-ms": "1500", "Retry-After": "9"}, request=request)
    error = openai.RateLimitError("slow down", response=response, body=None)
    sdk._retry_after_ms(error)
    assert retry_after_of(error) == 1.5  # the finer header wins


def test_switching_engines_keeps_the_version() -> None:
    kwargs: dict[str, Any] = {"llm_conn_id": "llm_oa", "output_type": Translation, "instructions": "Be brief."}
    versions = {llm_process("Say {{ w }}", **kwargs, engine=e).version for e in (None, *ENGINES)}  # type: ignore[attr-defined]
    assert len(versions) == 1
    assert llm_process("Say {{ w }}", **kwargs, output_retries=2).version not in versions  # type: ignore[attr-defined]


def test_the_sdk_engine_reads_the_connection_on_the_first_call_and_builds_one_client_per_loop(
    server: FakeOpenAI, make_ctx: Callable[..., RecordingContext], monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[str] = []
    clients: list[Any] = []
    real_read, real_client = connection_module.read_connection, sdk._new_client

    def read(conn_id: str, model_id: str | None) -> Any:
        reads.append(conn_id)
        return real_read(conn_id, model_id)

    def client(*args: Any) -> Any:
        clients.append(real_client(*args))
        return clients[-1]

    monkeypatch.setattr(connection_module, "read_connection", read)
    monkeypatch.setattr(sdk, "_new_client", client)
    process = llm_process("Say {{ w }}", llm_conn_id="llm_oa")
    assert reads == []  # a DAG file that builds the step reads no connection

    async def many(n: int) -> list[Any]:
        return await asyncio.gather(*(process({"w": str(i)}, make_ctx(f"k{i}")) for i in range(n)))

    assert asyncio.run(many(6)) == [{"output": f"echo: Say {i}"} for i in range(6)]
    assert reads == ["llm_oa"] and len(clients) == 1
    first = clients[0]
    assert isinstance(first, openai.AsyncOpenAI) and first.max_retries == 0
    assert type(first._client).__name__ == "_InstalledAioHttpClient"  # aiohttp, installed by the extra
    assert first.is_closed()  # closed when its loop shut down
    asyncio.run(many(2))  # a new loop: a new client (its connections belong to the loop)
    assert reads == ["llm_oa", "llm_oa"] and len(clients) == 2


def test_a_model_only_pydantic_ai_knows_runs_on_the_agent_unless_sdk_is_asked_for(
    make_ctx: Callable[..., RecordingContext], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_LLM_TESTMODEL", json.dumps({"conn_type": "pydanticai", "extra": {"model": "test"}})
    )
    assert _call(llm_process("Say {{ w }}", llm_conn_id="llm_testmodel"), {"w": "a"}, make_ctx()) == {
        "output": "success (no tool calls)"
    }
    explicit = llm_process("Say {{ w }}", llm_conn_id="llm_testmodel", engine="sdk")
    with pytest.raises(ConfigurationError, match="engine='sdk' does not know the model prefix"):
        _call(explicit, {"w": "a"}, make_ctx())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"engine": "sdk", "model": TestModel()}, r"engine='sdk' .*cannot take model="),
        ({"engine": "sdk", "agent_kwargs": {"retries": 2}}, r"engine='sdk' .*cannot take agent_kwargs="),
        ({"engine": "raw"}, r"engine='raw' is not an engine"),
        ({"output_retries": -1}, r"output_retries=-1 is not an int >= 0"),
        ({"structured": "xml"}, r"structured='xml' is not a mode"),
    ],
)
def test_bad_engine_arguments_are_refused_when_built(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        llm_process("Say {{ w }}", **kwargs)


def test_a_pydantic_ai_model_implies_the_agent_engine(make_ctx: Callable[..., RecordingContext]) -> None:
    process = llm_process("Say {{ w }}", model=TestModel(custom_output_text="hi"))
    assert _call(process, {"w": "a"}, make_ctx()) == {"output": "hi"}
