"""The model step offline, on pydantic-ai's own TestModel and FunctionModel (and the hook with its "test" model)."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import sys
from typing import TYPE_CHECKING, Any

import pytest
from pydantic import BaseModel
from pydantic_ai.exceptions import UnexpectedModelBehavior
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel
from pydantic_ai.usage import RequestUsage

from airflow_provider_datagen.core.steps import Step
from airflow_provider_datagen.exceptions import ConfigurationError, PromptTemplateError
from airflow_provider_datagen.llm import llm_process, llm_step

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests._support.recording_context import RecordingContext


class Translation(BaseModel):
    french: str
    words: int


@dataclasses.dataclass
class Pair:
    left: str
    right: str


class Replies:
    """A FunctionModel function answering with the given replies in turn, recording what it was asked."""

    def __init__(self, *replies: ModelResponse) -> None:
        self.replies = list(replies)
        self.seen: list[tuple[list[Any], AgentInfo]] = []

    def __call__(self, messages: list[Any], info: AgentInfo) -> ModelResponse:
        self.seen.append((messages, info))
        return self.replies[min(len(self.seen), len(self.replies)) - 1]


def _final(args: dict[str, Any], input_tokens: int, output_tokens: int) -> ModelResponse:
    return ModelResponse(
        parts=[ToolCallPart("final_result", json.dumps(args))],
        usage=RequestUsage(input_tokens=input_tokens, output_tokens=output_tokens),
        provider_name="acme",
    )


def _prompt_of(messages: list[Any]) -> str:
    return next(p.content for m in messages for p in m.parts if p.part_kind == "user-prompt")


def test_a_pydantic_model_answer_becomes_the_items_fields_and_its_usage_is_recorded(
    make_ctx: Callable[..., RecordingContext],
) -> None:
    replies = Replies(_final({"french": "bonjour", "words": 1}, input_tokens=120, output_tokens=17))
    process = llm_process(
        "Translate: {{ text }}",
        instructions="Translate into French.",
        output_type=Translation,
        timeout=30,
        model=FunctionModel(replies, model_name="fake"),
    )
    assert inspect.iscoroutinefunction(process)
    ctx = make_ctx("k1")
    fields = asyncio.run(process({"id": "k1", "text": "hello"}, ctx))
    assert fields == {"french": "bonjour", "words": 1}
    assert ctx.usage == [{"model": "acme:fake", "input_tokens": 120, "output_tokens": 17, "cost_usd": None, "calls": 1}]
    [(messages, info)] = replies.seen
    assert _prompt_of(messages) == "Translate: hello"
    assert info.instructions == "Translate into French."
    # the client makes one request per call (the run's retry= owns retries); timeout= is the request deadline
    assert info.model_settings == {"max_retries": 0, "request_timeout": 30.0}


def test_a_json_schema_answer_is_validated_and_stored_as_fields(make_ctx: Callable[..., RecordingContext]) -> None:
    schema = {
        "title": "Verdict",
        "type": "object",
        "properties": {"label": {"type": "string", "enum": ["yes", "no"]}, "score": {"type": "number"}},
        "required": ["label", "score"],
    }
    replies = Replies(_final({"label": "yes", "score": 0.75}, 50, 9))
    process = llm_process("Is {{ claim }} true?", output_type=schema, model=FunctionModel(replies, model_name="fake"))
    assert asyncio.run(process({"claim": "water is wet"}, make_ctx())) == {"label": "yes", "score": 0.75}
    [(_, info)] = replies.seen
    [tool] = info.output_tools
    assert tool.name == "final_result" and tool.parameters_json_schema["required"] == ["label", "score"]


def test_an_answer_that_never_validates_fails_and_still_records_every_reply(
    make_ctx: Callable[..., RecordingContext],
) -> None:
    schema = {"type": "object", "properties": {"label": {"type": "string"}}, "required": ["label"]}
    replies = Replies(_final({"wrong": 1}, 40, 5), _final({"wrong": 2}, 60, 5), _final({"wrong": 3}, 80, 5))
    process = llm_process(
        "{{ q }}",
        output_type=schema,
        agent_kwargs={"retries": {"output": 2}},
        model=FunctionModel(replies, model_name="fake"),
    )
    ctx = make_ctx()
    with pytest.raises(UnexpectedModelBehavior, match="Exceeded maximum output retries"):
        asyncio.run(process({"q": "?"}, ctx))
    assert len(replies.seen) == 3
    # the three replies were paid for although the item failed, each as it arrived (a token window is
    # charged per request), and each of the three requests took its own slot
    one = {"model": "acme:fake", "output_tokens": 5, "cost_usd": None, "calls": 1}
    assert ctx.usage == [{**one, "input_tokens": n} for n in (40, 60, 80)]
    assert ctx.requests == 3


def test_text_and_other_answers_go_to_output_field(make_ctx: Callable[..., RecordingContext]) -> None:
    text = llm_process("Say {{ w }}", output_field="said", model=TestModel(custom_output_text="hi there"))
    ctx = make_ctx()
    assert asyncio.run(text({"w": "hi"}, ctx)) == {"said": "hi there"}
    [usage] = ctx.usage
    assert usage["model"] == "test:test" and usage["calls"] == 1 and usage["output_tokens"] > 0

    listing = llm_process("List {{ w }}", output_type=list[str], model=TestModel(custom_output_args=["a", "b"]))
    assert asyncio.run(listing({"w": "x"}, make_ctx())) == {"output": ["a", "b"]}
    pair = llm_process(
        "Pair {{ w }}", output_type=Pair, model=TestModel(custom_output_args={"left": "l", "right": "r"})
    )
    assert asyncio.run(pair({"w": "x"}, make_ctx())) == {"left": "l", "right": "r"}


def test_the_prompt_reads_fields_of_earlier_steps_and_a_missing_field_calls_no_model(
    make_ctx: Callable[..., RecordingContext],
) -> None:
    replies = Replies(ModelResponse(parts=[TextPart("ok")], usage=RequestUsage(input_tokens=3, output_tokens=1)))
    process = llm_process("Improve {{ draft }} of {{ text }}", model=FunctionModel(replies, model_name="fake"))
    ctx = make_ctx("k2", fields={"draft": "d1"})
    assert asyncio.run(process({"text": "t"}, ctx)) == {"output": "ok"}
    assert _prompt_of(replies.seen[0][0]) == "Improve d1 of t"

    ctx = make_ctx("k3")
    with pytest.raises(PromptTemplateError, match=r"^item 'k3': the prompt names field 'draft' the item does not have"):
        asyncio.run(process({"text": "t"}, ctx))
    assert len(replies.seen) == 1 and ctx.usage == []


def test_the_hook_builds_one_agent_per_event_loop(
    make_ctx: Callable[..., RecordingContext], monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.providers.common.ai.hooks.pydantic_ai import PydanticAIHook

    # pydantic-ai's "test" model through a real pydanticai connection: the hook path, offline
    monkeypatch.setenv("AIRFLOW_CONN_LLM_OFFLINE", json.dumps({"conn_type": "pydanticai", "extra": {"model": "test"}}))
    built: list[str] = []
    real = PydanticAIHook.get_hook.__func__  # type: ignore[attr-defined]

    def counted(cls: type, conn_id: str, hook_params: dict[str, Any] | None = None) -> Any:
        built.append(conn_id)
        return real(cls, conn_id, hook_params=hook_params)

    monkeypatch.setattr(PydanticAIHook, "get_hook", classmethod(counted))
    process = llm_process("Say {{ w }}", llm_conn_id="llm_offline")
    assert built == []  # nothing is looked up before the first call

    async def many(n: int) -> list[dict[str, Any]]:
        return await asyncio.gather(*(process({"w": str(i)}, make_ctx(f"k{i}")) for i in range(n)))

    assert asyncio.run(many(8)) == [{"output": "success (no tool calls)"}] * 8
    assert built == ["llm_offline"]
    asyncio.run(many(3))  # a new loop: a new agent (its HTTP connections belong to the loop)
    assert built == ["llm_offline", "llm_offline"]


def test_a_failed_build_fails_the_call_and_is_tried_again(
    make_ctx: Callable[..., RecordingContext], monkeypatch: pytest.MonkeyPatch
) -> None:
    process = llm_process("Say {{ w }}", llm_conn_id="llm_later")

    async def twice() -> None:
        with pytest.raises(Exception, match="llm_later"):
            await process({"w": "a"}, make_ctx())
        monkeypatch.setenv(
            "AIRFLOW_CONN_LLM_LATER", json.dumps({"conn_type": "pydanticai", "extra": {"model": "test"}})
        )
        assert await process({"w": "b"}, make_ctx()) == {"output": "success (no tool calls)"}

    asyncio.run(twice())


def test_without_pydantic_ai_the_first_call_says_what_to_install(
    make_ctx: Callable[..., RecordingContext], monkeypatch: pytest.MonkeyPatch
) -> None:
    process = llm_process("Say {{ w }}", model="test")
    monkeypatch.setitem(sys.modules, "pydantic_ai", None)
    with pytest.raises(
        ConfigurationError,
        match=r"^llm_process: a model step needs pydantic-ai \(.*\); install the model-step extra: "
        r"pip install 'airflow-provider-datagen\[llm\]'$",
    ):
        asyncio.run(process({"w": "a"}, make_ctx()))


def test_version_follows_what_changes_the_answers() -> None:
    def v(prompt: str = "Say {{ w }}", **kwargs: Any) -> str:
        return llm_process(prompt, **kwargs).version  # type: ignore[attr-defined,no-any-return]

    base = v(model_id="openai:gpt-5-mini")
    assert base.startswith("llm-") and len(base) == 16
    others = {
        v("Say {{ w }}!", model_id="openai:gpt-5-mini"),
        v(model_id="openai:gpt-5"),
        v(model_id="openai:gpt-5-mini", instructions="Be brief."),
        v(model_id="openai:gpt-5-mini", output_type=Translation),
        v(model_id="openai:gpt-5-mini", model_settings={"temperature": 0.2}),
        v(model_id="openai:gpt-5-mini", output_field="said"),
    }
    assert base not in others and len(others) == 6


def test_version_covers_the_connection_id() -> None:
    # two connections may hold two models or two servers: a step moved to another one reruns its items
    a = llm_process("Say {{ w }}", llm_conn_id="a")
    b = llm_process("Say {{ w }}", llm_conn_id="b")
    assert a.version != b.version  # type: ignore[attr-defined]
    assert (
        llm_step("s", "Say {{ w }}", llm_conn_id="a").fn.version
        != llm_step(  # type: ignore[attr-defined]
            "s", "Say {{ w }}", llm_conn_id="b"
        ).fn.version
    )
    # the hook's default connection named or not is one connection; model= reads no connection at all
    default = llm_process("Say {{ w }}").version  # type: ignore[attr-defined]
    assert llm_process("Say {{ w }}", llm_conn_id="pydanticai_default").version == default  # type: ignore[attr-defined]
    assert default not in {a.version, b.version}  # type: ignore[attr-defined]
    assert (
        llm_process("Say {{ w }}", llm_conn_id="a", model="test").version  # type: ignore[attr-defined]
        == llm_process("Say {{ w }}", llm_conn_id="b", model="test").version  # type: ignore[attr-defined]
    )


def test_the_process_takes_its_own_request_slots() -> None:
    # the runner takes no slot per attempt: the process takes one per model request (llm/slots.py)
    assert llm_process("Say {{ w }}", model="test").takes_request_slots is True  # type: ignore[attr-defined]


def test_version_is_the_same_in_every_process_that_builds_the_step() -> None:
    def tool_of(n: int) -> Callable[[], int]:
        def lookup() -> int:
            return n

        return lookup

    # two function objects (two parses of a DAG file) with one dotted name: one version, not their addresses
    first, second = tool_of(1), tool_of(2)
    assert first is not second
    steps = [llm_process("Say {{ w }}", model_id="m", agent_kwargs={"tools": [tool]}) for tool in (first, second)]
    assert steps[0].version == steps[1].version  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"output_type": {"type": "string"}}, r"output_type=\{'type': 'string'\} is not a JSON schema of an object"),
        ({"output_type": object()}, r"output_type=<object object at .*> is not a type pydantic can validate"),
        ({"output_field": ""}, r"output_field='' is not a usable field name"),
        ({"timeout": 0}, r"timeout=0 is not a positive number of seconds"),
        ({"model_id": 5}, r"model_id=5 is not a string"),
        ({"model_settings": [1]}, r"model_settings=\[1\] is not a dict"),
        (
            {"agent_kwargs": {"output_type": str}},
            r"agent_kwargs=.* sets 'output_type'; pass output_type= to llm_process",
        ),
    ],
)
def test_bad_arguments_are_refused_when_built(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=rf"^llm_process: {message}"):
        llm_process("Say {{ w }}", **kwargs)


def test_llm_step_is_a_pipeline_step_of_the_process(make_ctx: Callable[..., RecordingContext]) -> None:
    step = llm_step("translate", "Say {{ w }}", model=TestModel(custom_output_text="salut"))
    assert isinstance(step, Step) and step.name == "translate"
    assert inspect.iscoroutinefunction(step.fn)
    assert asyncio.run(step.fn({"w": "hi"}, make_ctx())) == {"output": "salut"}


def test_a_tool_call_is_one_more_request_with_its_own_slot_and_usage(make_ctx: Callable[..., RecordingContext]) -> None:
    def lookup(word: str) -> str:
        """The dictionary's entry of a word."""
        return f"{word}: salut"

    replies = Replies(
        ModelResponse(
            parts=[ToolCallPart("lookup", json.dumps({"word": "hi"}))],
            usage=RequestUsage(input_tokens=30, output_tokens=4),
            provider_name="acme",
        ),
        ModelResponse(
            parts=[TextPart("salut")], usage=RequestUsage(input_tokens=50, output_tokens=2), provider_name="acme"
        ),
    )
    process = llm_process(
        "Say {{ w }}", agent_kwargs={"tools": [lookup]}, model=FunctionModel(replies, model_name="fake")
    )
    ctx = make_ctx()
    assert asyncio.run(process({"w": "hi"}, ctx)) == {"output": "salut"}
    # the tool's result went back to the model: two requests, each with its slot and its reply's usage
    assert len(replies.seen) == 2 and ctx.requests == 2
    one = {"model": "acme:fake", "cost_usd": None, "calls": 1}
    assert ctx.usage == [
        {**one, "input_tokens": 30, "output_tokens": 4},
        {**one, "input_tokens": 50, "output_tokens": 2},
    ]
