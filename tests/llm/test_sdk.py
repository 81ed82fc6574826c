"""The sdk engine's reading of a reply: a structured answer's JSON decoded, a text answer kept as text."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from pydantic import BaseModel

from airflow_provider_datagen.llm import sdk
from airflow_provider_datagen.llm.output import OutputSpec
from airflow_provider_datagen.llm.prompt import PromptTemplate
from airflow_provider_datagen.llm.request import RequestBuilder, Target


class Pair(BaseModel):
    a: int


def _reply(content: str | None, tool_args: str | None = None) -> Any:
    calls = [SimpleNamespace(function=SimpleNamespace(arguments=tool_args))] if tool_args else None
    return SimpleNamespace(choices=[SimpleNamespace(message=SimpleNamespace(content=content, tool_calls=calls))])


def _request(output_type: Any) -> Any:
    builder = RequestBuilder(PromptTemplate("{{ w }}"), OutputSpec(output_type, "output"), None, {})
    return builder.build({"w": "x"}, {}, "k", Target("openai", None, "m", "openai"))


def test_a_text_answer_that_looks_like_json_stays_text() -> None:
    answer, _ = sdk._openai_answer(_reply('{"a": 1}'), _request(str))
    assert answer == '{"a": 1}'


def test_a_structured_answer_is_decoded_from_the_content_or_a_tool_call() -> None:
    assert sdk._openai_answer(_reply('{"a": 1}'), _request(Pair))[0] == {"a": 1}
    assert sdk._openai_answer(_reply(None, '{"a": 2}'), _request(Pair))[0] == {"a": 2}
    answer, feedback = sdk._openai_answer(_reply("not json"), _request(Pair))
    assert answer == "not json"  # fails validation, and is sent back as it was
    assert feedback("wrong") == (
        {"role": "assistant", "content": "not json"},
        {"role": "user", "content": "wrong\nFix the errors and answer again."},
    )
