"""The pydantic-ai engine's key of a request (llm/agent_reuse.py), offline: what it digests, what it never
depends on (time, run ids, code), pinned values, the stored reply's round trip, and which models are wrapped.

A pinned value changing means every stored answer of the engine would be paid for again: change
``AGENT_KEY_VERSION`` and write a migration of the store instead of updating the pin.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from pydantic_ai.messages import (
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models import ModelRequestParameters
from pydantic_ai.models.fallback import FallbackModel
from pydantic_ai.models.function import FunctionModel
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.models.test import TestModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.usage import RequestUsage

from airflow_provider_datagen.llm.agent_reuse import (
    AGENT_KEY_VERSION,
    AgentRequest,
    StoreModel,
    _parse,
    _Stored,
    _usage,
    agent_replies,
    with_store,
)
from airflow_provider_datagen.llm.request import LLMRequest
from airflow_provider_datagen.llm.slots import SlotModel, with_slots

T0 = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
T1 = dt.datetime(2026, 6, 7, 8, 9, 10, tzinfo=dt.UTC)
SCHEMA = {"type": "object", "properties": {"fr": {"type": "string"}}, "required": ["fr"]}


def _history(at: dt.datetime = T0, run_id: str = "run-1", retry: bool = False) -> list[Any]:
    first = ModelRequest(
        parts=[UserPromptPart("Translate: hi", timestamp=at)],
        instructions="Be brief.",
        timestamp=at,
        run_id=run_id,
        conversation_id=f"conv-{run_id}",
    )
    if not retry:
        return [first]
    answer = ModelResponse(
        parts=[ToolCallPart("final_result", {}, tool_call_id="call_1")],
        model_name="gpt-4o-mini",
        provider_name="openai",
        usage=RequestUsage(input_tokens=10, output_tokens=3),
        timestamp=at,
        run_id=run_id,
        provider_response_id=f"chatcmpl-{run_id}",
    )
    errors = ToolReturnPart(
        "final_result", "fr: Field required", tool_call_id="call_1", outcome="retried", timestamp=at
    )
    return [first, answer, ModelRequest(parts=[errors], timestamp=at, run_id=run_id)]


def _structured() -> ModelRequestParameters:
    tool = ToolDefinition(name="final_result", parameters_json_schema=SCHEMA, description="The answer.", kind="output")
    return ModelRequestParameters(output_mode="tool", output_tools=[tool], allow_text_output=False)


def _request(
    messages: list[Any] | None = None,
    settings: dict[str, Any] | None = None,
    parameters: ModelRequestParameters | None = None,
    **overrides: Any,
) -> AgentRequest:
    fields: dict[str, Any] = {
        "provider": "openai",
        "base_url": "http://127.0.0.1:8000/v1/",
        "model": "gpt-4o-mini",
        "messages": _history() if messages is None else messages,
        "settings": {"temperature": 0, "max_retries": 0} if settings is None else settings,
        "parameters": ModelRequestParameters() if parameters is None else parameters,
    }
    fields.update(overrides)
    return AgentRequest(**fields)


#: the keys of AGENT_KEY_VERSION 1: never edit these, migrate the store
PINNED = {
    "text": "1211b90b9567e8bab386cc726e931f5a77e0183a124309dc6196697f948a888c",
    "structured": "6321cb7d6f42c4566e1ff5c7756d17d943d2676ec7887baad17885a3064255ec",
    "retry": "659b7e82643ece5b9ca3a0573e83bc6c4d20cf60c339266261346b69e7358103",
    "sample": "abbf47397029af371b15a17600a2aaeea88a4d14b8a27986f2693e388a151507",
}


def _pinned() -> dict[str, AgentRequest]:
    return {
        "text": _request(),
        "structured": _request(parameters=_structured(), settings={"temperature": 0.2, "seed": 7}),
        "retry": _request(messages=_history(retry=True), parameters=_structured()),
        "sample": _request(sample="3"),
    }


def test_the_pinned_keys_do_not_change() -> None:
    assert AGENT_KEY_VERSION == 1
    assert {name: r.key() for name, r in _pinned().items()} == PINNED


def test_the_key_never_depends_on_the_time_the_run_or_the_reply_ids() -> None:
    for retry in (False, True):
        base = _request(messages=_history(T0, "run-1", retry)).key()
        assert _request(messages=_history(T1, "run-2", retry)).key() == base


def test_the_key_is_of_what_is_asked_and_of_whom() -> None:
    base = _request().key()
    assert _request(base_url="http://127.0.0.1:8000/v1").key() == base  # a trailing slash: the same server
    assert _request(base_url="http://127.0.0.1:9000/v1").key() != base
    assert _request(model="gpt-4o").key() != base
    assert _request(provider="anthropic").key() != base
    assert _request(settings={"temperature": 1}).key() != base
    assert _request(parameters=_structured()).key() != base
    assert _request(messages=_history(retry=True)).key() != base  # a validation retry: its own key
    assert _request(sample="1").key() != _request(sample="2").key() != base
    other = [ModelRequest(parts=[UserPromptPart("Translate: bye", timestamp=T0)], instructions="Be brief.")]
    assert _request(messages=other).key() != base
    unbrief = [ModelRequest(parts=[UserPromptPart("Translate: hi", timestamp=T0)], instructions="Be long.")]
    assert _request(messages=unbrief).key() != base


def test_transport_settings_and_headers_are_not_in_the_key() -> None:
    base = _request(settings={"temperature": 0}).key()
    transport = {"temperature": 0, "timeout": 3.0, "max_retries": 5, "request_timeout": 9, "extra_headers": {"a": "b"}}
    assert _request(settings=transport).key() == base


def test_the_canonical_form_holds_what_is_sent_and_nothing_of_the_run() -> None:
    form = _request(messages=_history(retry=True), parameters=_structured()).canonical()
    assert form["engine"] == "pydantic-ai" and form["base_url"] == "http://127.0.0.1:8000/v1"
    assert form["settings"] == {"temperature": 0}
    first, answer, errors = form["messages"]
    assert first == {
        "kind": "request",
        "instructions": "Be brief.",
        "parts": [{"part_kind": "user-prompt", "content": "Translate: hi"}],
    }
    assert "usage" not in answer and "timestamp" not in answer and "provider_response_id" not in answer
    assert answer["parts"] == [
        {"part_kind": "tool-call", "tool_name": "final_result", "args": {}, "tool_call_id": "call_1"}
    ]
    assert errors["parts"][0]["content"] == "fr: Field required"
    [tool] = form["parameters"]["output_tools"]
    assert tool["parameters_json_schema"] == SCHEMA and tool["kind"] == "output"


def test_agent_and_sdk_keys_of_one_prompt_differ() -> None:
    sdk = LLMRequest(
        provider="openai",
        base_url="http://127.0.0.1:8000/v1",
        model="gpt-4o-mini",
        messages=({"role": "system", "content": "Be brief."}, {"role": "user", "content": "Translate: hi"}),
        schema=None,
        settings={"temperature": 0},
    )
    assert _request().key() != sdk.key()


def test_a_stored_reply_reads_back_as_the_same_response_and_usage() -> None:
    response = _history(retry=True)[1]
    stored = _parse(_Stored(response).model_dump_json())
    assert stored.response == response
    assert _usage(stored) == ("openai:gpt-4o-mini", 10, 3)


def _openai(port: int) -> OpenAIChatModel:
    return OpenAIChatModel("gpt-4o-mini", provider=OpenAIProvider(base_url=f"http://127.0.0.1:{port}/v1", api_key="k"))


def test_each_sending_model_is_wrapped_once_outside_its_slots_and_local_models_not_at_all() -> None:
    replies = agent_replies(True)
    model = with_store(with_slots(_openai(1)), replies)
    assert isinstance(model, StoreModel) and isinstance(model.wrapped, SlotModel)
    assert with_store(model, replies) is model
    assert model.system == "openai" and model.base_url == "http://127.0.0.1:1/v1/"
    chain = with_store(with_slots(FallbackModel(_openai(1), _openai(2))), replies)
    assert isinstance(chain, FallbackModel)
    assert [type(m) for m in chain.models] == [StoreModel, StoreModel]
    # in-process models answer with code that may change under the same name: never stored
    local = with_slots(TestModel())
    assert with_store(local, replies) is local
    function = with_slots(FunctionModel(lambda messages, info: ModelResponse(parts=[TextPart("x")])))
    assert with_store(function, replies) is function
