"""``llm_batch``: the batch step's arguments, version, request bodies and answer validation (no server)."""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any

import pytest
from pydantic import BaseModel

from airflow_provider_datagen.core.batch.protocol import RowResult
from airflow_provider_datagen.exceptions import ConfigurationError, OutputValidationError, PromptTemplateError
from airflow_provider_datagen.llm import llm_batch
from airflow_provider_datagen.llm.batch.clients import AnthropicBatchClient, OpenAIBatchClient

if TYPE_CHECKING:
    from airflow_provider_datagen.llm import LLMBatchStep


class Review(BaseModel):
    verdict: str
    stars: int


@dataclasses.dataclass
class Pair:
    left: str
    right: int


def _step(**kw: Any) -> LLMBatchStep:
    return llm_batch(kw.pop("prompt", "Rate {{ text }}"), model_id=kw.pop("model_id", "openai:gpt-4o-mini"), **kw)


def _row(answer: Any, model: str | None = None) -> RowResult:
    return RowResult("cid-1", "succeeded", answer, model, 10, 2)


def test_the_openai_request_is_a_chat_completion_with_a_json_schema_for_a_structured_answer() -> None:
    step = _step(output_type=Review, instructions="Be terse.", model_settings={"temperature": 0})
    line = step.request({"text": "this"}, "item-1", "cid-1")
    assert line.custom_id == "cid-1"
    body = line.body
    assert body["model"] == "gpt-4o-mini" and body["temperature"] == 0
    assert body["messages"] == [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Rate this"}]
    assert body["response_format"]["type"] == "json_schema"
    assert body["response_format"]["json_schema"]["schema"]["required"] == ["verdict", "stars"]
    plain = _step().request({"text": "x"}, "item-1", "c").body
    assert "response_format" not in plain and plain["messages"] == [{"role": "user", "content": "Rate x"}]


def test_the_anthropic_request_forces_one_tool_and_defaults_max_tokens() -> None:
    step = _step(model_id="anthropic:claude-3-5-haiku-latest", output_type=Review, instructions="Be terse.")
    body = step.request({"text": "this"}, "item-1", "cid-1").body
    assert body["model"] == "claude-3-5-haiku-latest" and body["max_tokens"] == 1024 and body["system"] == "Be terse."
    assert body["tool_choice"] == {"type": "tool", "name": "final_result"}
    assert body["tools"][0]["input_schema"]["properties"].keys() == {"verdict", "stars"}
    assert (
        _step(model_id="anthropic:claude-3-5-haiku-latest", model_settings={"max_tokens": 9})
        .request({"text": "x"}, "i", "c")
        .body["max_tokens"]
        == 9
    )


def test_a_value_output_type_is_asked_as_an_object_of_its_output_field() -> None:
    step = _step(output_type=list[str], output_field="tags")
    schema = step.request({"text": "x"}, "i", "c").body["response_format"]["json_schema"]["schema"]
    assert schema["required"] == ["tags"] and schema["properties"]["tags"]["type"] == "array"
    assert step.fields(_row({"tags": ["a", "b"]})) == {"tags": ["a", "b"]}
    with pytest.raises(OutputValidationError, match="the answer has no 'tags'"):
        step.fields(_row({"other": []}))
    with pytest.raises(OutputValidationError, match="does not validate against the output type"):
        step.fields(_row({"tags": "not a list"}))


def test_an_item_the_prompt_cannot_render_raises_the_prompts_error() -> None:
    with pytest.raises(PromptTemplateError, match="text"):
        _step().request({"other": 1}, "item-9", "c")


@pytest.mark.parametrize(
    ("output_type", "answer", "fields"),
    [
        (str, "hello", {"output": "hello"}),
        (Review, {"verdict": "ok", "stars": 4}, {"verdict": "ok", "stars": 4}),
        (Pair, {"left": "a", "right": 2}, {"left": "a", "right": 2}),
        ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}, {"a": 1}, {"a": 1}),
        (int, {"output": 3}, {"output": 3}),
    ],
)
def test_fields_of_a_valid_answer(output_type: Any, answer: Any, fields: dict[str, Any]) -> None:
    assert _step(output_type=output_type).fields(_row(answer)) == fields


@pytest.mark.parametrize(
    ("output_type", "answer", "message"),
    [
        (str, {"a": 1}, "the answer is not text"),
        (Review, "not json", "the answer is not a JSON object"),
        (Review, {"verdict": "ok", "stars": "many"}, "does not validate against the output type"),
        (Pair, {"left": "a"}, "does not validate against the output type"),
        (
            {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
            {"a": "x"},
            "does not match the JSON schema: a: 'x' is not of type 'integer'",
        ),
        (Review, None, "the model gave no answer"),
    ],
)
def test_an_answer_that_does_not_validate_raises_output_validation_error(
    output_type: Any, answer: Any, message: str
) -> None:
    with pytest.raises(OutputValidationError, match=message) as info:
        _step(output_type=output_type).fields(_row(answer))
    assert "row cid-1" in str(info.value)


def test_the_version_changes_with_what_the_step_says() -> None:
    base = _step()
    assert base.version.startswith("llm-batch-") and base.version == _step().version
    others = [
        _step(prompt="Score {{ text }}"),
        _step(model_id="openai:gpt-4o"),
        _step(instructions="x"),
        _step(output_type=Review),
        _step(model_settings={"temperature": 1}),
        _step(llm_conn_id="other"),
    ]
    assert len({base.version, *(s.version for s in others)}) == 1 + len(others)
    # where the requests go is not what they say
    assert _step(base_url="http://127.0.0.1:1/v1", api_key="k").version == base.version
    assert _step(llm_conn_id="pydanticai_default").version == base.version


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"model_id": "gpt-4o-mini"}, "does not name a batch provider"),
        ({"model_id": "openai:gpt-4o-mini", "provider": "anthropic"}, "differs from the model's"),
        ({"provider": "gemini"}, "is not a batch provider"),
        ({"max_requests_per_batch": 0}, "is not an int >= 1"),
        ({"max_bytes_per_batch": True}, "is not an int >= 1"),
        ({"model_settings": [1]}, "is not a dict"),
        ({"instructions": 3}, "is not a string"),
    ],
)
def test_bad_arguments_fail_when_the_step_is_built(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        llm_batch("x", **kwargs)


def test_an_openai_compatible_model_without_a_prefix_is_taken_with_provider() -> None:
    step = llm_batch("x", model_id="my-local-model", provider="openai", base_url="http://127.0.0.1:1/v1", api_key="k")
    assert step.request({}, "i", "c").body["model"] == "my-local-model"
    assert step.model_label(_row("a")) == "openai:my-local-model"
    assert step.model_label(_row("a", model="my-local-model-v2")) == "openai:my-local-model-v2"


def test_the_client_is_the_providers_and_the_model_comes_from_the_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    step = _step(base_url="http://127.0.0.1:1/v1", api_key="k")
    client = step.client()
    try:
        assert isinstance(client, OpenAIBatchClient) and client.supports_metadata
    finally:
        client.close()
    anthropic = _step(model_id="anthropic:claude-3-5-haiku-latest", base_url="http://127.0.0.1:1", api_key="k")
    client = anthropic.client()
    try:
        assert isinstance(client, AnthropicBatchClient) and not client.supports_metadata
    finally:
        client.close()

    conn = {"conn_type": "pydanticai", "host": "http://127.0.0.1:1/v1", "password": "k"}
    conn["extra"] = {"model": "anthropic:claude-3-5-haiku-latest"}  # type: ignore[assignment]
    monkeypatch.setenv("AIRFLOW_CONN_BATCH_STEP", json.dumps(conn))
    from_conn = llm_batch("Rate {{ text }}", llm_conn_id="batch_step")
    with pytest.raises(ConfigurationError, match="the model is read from the connection by client"):
        from_conn.request({"text": "x"}, "i", "c")
    client = from_conn.client()
    try:
        assert isinstance(client, AnthropicBatchClient)
    finally:
        client.close()
    assert from_conn.request({"text": "x"}, "i", "c").body["model"] == "claude-3-5-haiku-latest"


def test_a_connection_without_a_model_and_no_model_id_is_a_configuration_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    conn = {"conn_type": "pydanticai", "host": "http://127.0.0.1:1/v1", "password": "k"}
    monkeypatch.setenv("AIRFLOW_CONN_BATCH_NO_MODEL", json.dumps(conn))
    with pytest.raises(ConfigurationError, match="no model: pass model_id="):
        llm_batch("x", llm_conn_id="batch_no_model").client()
    with pytest.raises(ConfigurationError, match=r"'batch_missing' .* does not exist"):
        llm_batch("x", llm_conn_id="batch_missing").client()
