"""The model wrapper of llm/slots.py on its own: a slot and a usage record per request, streamed or not,
nothing outside an item's run, and each model of a fallback chain wrapped (each sends its own request)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from pydantic_ai import Agent
from pydantic_ai.models.fallback import FallbackModel
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel

from airflow_provider_datagen.llm.slots import SlotModel, item_context, with_slots

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from tests._support.recording_context import RecordingContext


async def _stream(messages: list[Any], info: AgentInfo) -> AsyncIterator[str]:
    yield "sal"
    yield "ut"


def test_a_streamed_request_takes_a_slot_and_records_its_reply(make_ctx: Callable[..., RecordingContext]) -> None:
    agent = Agent(SlotModel(FunctionModel(stream_function=_stream, model_name="fake")))
    ctx = make_ctx()

    async def main() -> str:
        with item_context(ctx):
            async with agent.run_stream("hi") as run:
                return await run.get_output()

    assert asyncio.run(main()) == "salut"
    assert ctx.requests == 1
    assert ctx.usage == [{"model": "fake", "input_tokens": 50, "output_tokens": 2, "cost_usd": None, "calls": 1}]


def test_outside_an_items_run_the_model_only_passes_through(make_ctx: Callable[..., RecordingContext]) -> None:
    ctx = make_ctx()
    agent = Agent(SlotModel(TestModel(custom_output_text="ok")))
    with item_context(ctx):
        pass
    assert asyncio.run(agent.run("hi")).output == "ok"
    assert ctx.requests == 0 and ctx.usage == []


def test_each_model_of_a_fallback_chain_takes_its_own_slots() -> None:
    first, second = TestModel(), TestModel()
    chain = with_slots(FallbackModel(first, second))
    assert isinstance(chain, FallbackModel)
    assert [type(m) for m in chain.models] == [SlotModel, SlotModel]
    assert [m.wrapped for m in chain.models] == [first, second]  # type: ignore[attr-defined]
    wrapped = with_slots(first)
    assert with_slots(wrapped) is wrapped  # never wrapped twice (one slot per request)
