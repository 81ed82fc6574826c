"""One request builder: an item's :class:`LLMRequest` is the same online and in a batch, its bodies are
the providers' own, and the step's pydantic-ai settings become the provider's body fields."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from airflow_provider_datagen.llm import LLMRequest, llm_batch
from airflow_provider_datagen.llm.output import OutputSpec
from airflow_provider_datagen.llm.prompt import PromptTemplate
from airflow_provider_datagen.llm.request import RequestBuilder, Target, answer_schema, usage_provider, wire_settings


class Translation(BaseModel):
    french: str


def _builder(output_type: Any = Translation, instructions: str | None = "Be brief.") -> RequestBuilder:
    return RequestBuilder(
        PromptTemplate("Translate {{ text }}"), OutputSpec(output_type, "output"), instructions, {"temperature": 0}
    )


def test_an_items_request_holds_the_messages_schema_and_settings() -> None:
    request = _builder().build(
        {"text": "hi"}, {}, "k1", Target("openai", "http://127.0.0.1:1/v1", "gpt-4o-mini", "openai")
    )
    assert isinstance(request, LLMRequest)
    assert request.messages == (
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Translate hi"},
    )
    assert request.schema == Translation.model_json_schema()
    assert request.openai_body() == {
        "temperature": 0,
        "model": "gpt-4o-mini",
        "messages": list(request.messages),
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "final_result", "schema": Translation.model_json_schema(), "strict": False},
        },
    }


def test_the_anthropic_body_forces_the_output_tool_and_sets_the_system_apart() -> None:
    request = _builder().build({"text": "hi"}, {}, "k1", Target("anthropic", None, "claude-x", "anthropic"))
    body = request.body()
    assert body["system"] == "Be brief." and body["messages"] == [{"role": "user", "content": "Translate hi"}]
    assert body["max_tokens"] == 1024  # Anthropic requires one
    assert body["tool_choice"] == {"type": "tool", "name": "final_result"}
    assert [t["name"] for t in body["tools"]] == ["final_result"]
    text = _builder(str, None).build({"text": "hi"}, {}, "k1", Target("anthropic", None, "claude-x", "anthropic"))
    assert "tools" not in text.body() and "system" not in text.body()


@pytest.mark.parametrize("model_id", ["openai:gpt-4o-mini", "anthropic:claude-x"])
def test_the_batch_steps_body_is_the_online_requests(model_id: str) -> None:
    step = llm_batch(
        "Translate {{ text }}",
        model_id=model_id,
        instructions="Be brief.",
        output_type=Translation,
        model_settings={"temperature": 0},
        base_url="http://127.0.0.1:1",
        api_key="k",
    )
    provider, _, model = model_id.partition(":")
    online = _builder().build({"text": "hi"}, {}, "k1", Target(provider, None, model, provider))
    assert step.request({"text": "hi"}, "k1", "c-1").body == online.body()


def test_the_digest_is_of_what_is_asked() -> None:
    target = Target("openai", None, "gpt-4o-mini", "openai")
    one = _builder().build({"text": "hi"}, {}, "k1", target)
    assert one.digest() == _builder().build({"text": "hi"}, {}, "k2", target).digest()  # the item id is not asked
    assert one.digest() != _builder().build({"text": "ho"}, {}, "k1", target).digest()
    assert one.followed_by({"role": "user", "content": "again"}).digest() != one.digest()


def test_a_value_answer_is_asked_as_an_object_of_the_output_field() -> None:
    assert answer_schema(OutputSpec(list[str], "tags")) == {
        "type": "object",
        "properties": {"tags": {"items": {"type": "string"}, "type": "array"}},
        "required": ["tags"],
    }
    assert answer_schema(OutputSpec(str, "output")) is None


def test_pydantic_ai_settings_become_the_providers_body_fields() -> None:
    settings = {
        "max_retries": 0,
        "request_timeout": 5.0,
        "timeout": 3,
        "extra_headers": {"x": "1"},
        "temperature": 0.2,
        "stop_sequences": ["END"],
        "openai_reasoning_effort": "low",
        "anthropic_metadata": {"user_id": "u"},
        "extra_body": {"top_k": 5},
    }
    assert wire_settings("openai", settings) == {
        "temperature": 0.2,
        "stop": ["END"],
        "reasoning_effort": "low",
        "top_k": 5,
    }
    assert wire_settings("anthropic", settings) == {
        "temperature": 0.2,
        "stop_sequences": ["END"],
        "metadata": {"user_id": "u"},
        "top_k": 5,
    }


def test_usage_labels_follow_pydantic_ais_provider_names() -> None:
    assert [usage_provider(p) for p in ("openai", "openai-chat", "anthropic", "vllm", "ollama")] == [
        "openai",
        "openai",
        "anthropic",
        "vllm",
        "ollama",
    ]
