"""The model step's requests, one at a time: a rate-limit slot as each is sent, its usage as its reply arrives.

One call of the step may send several model requests (an answer that fails validation goes back to the
model, a tool call's result too). :class:`SlotModel` wraps the agent's model so that each request
takes one slot of the run's rate limit right before it is sent (``ctx.take_request_slot_async``, which
also counts it in the attempt's ``"requests"``, failed requests included) and records the reply's tokens
as soon as it arrives, so ``tokens_per_minute`` is charged per request too.

The agent is shared by every item of a task, so the item's context reaches the model through a
context variable set around the agent's run (:func:`item_context`); asyncio copies it into every task
the run starts. Outside such a run (the agent used on its own) the wrapper only passes through.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import TYPE_CHECKING, Any

from pydantic_ai.exceptions import ModelConnectionError
from pydantic_ai.models.fallback import FallbackModel
from pydantic_ai.models.wrapper import WrapperModel

from airflow_provider_datagen.llm.usage import record_usage

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from pydantic_ai.models import Model

#: the context of the item whose agent run is in progress in this task
_ITEM_CTX: contextvars.ContextVar[Any] = contextvars.ContextVar("datagen_llm_item_ctx", default=None)


@contextlib.contextmanager
def item_context(ctx: Any) -> Iterator[None]:
    """Within the block, the requests of the model step are those of ``ctx``'s item."""
    token = _ITEM_CTX.set(ctx)
    try:
        yield
    finally:
        _ITEM_CTX.reset(token)


def with_slots(model: Model) -> Model:
    """``model`` with each request taking a slot; a fallback chain's models each take their own, since each
    of them sends its own request."""
    if isinstance(model, FallbackModel):
        model.models = [with_slots(m) for m in model.models]
        return model
    return model if isinstance(model, SlotModel) else SlotModel(model)


class SlotModel(WrapperModel):
    """A model whose every request takes a rate-limit slot of the current item first (see the module)."""

    async def request(self, messages: Any, model_settings: Any, model_request_parameters: Any) -> Any:
        ctx = await _before_request()
        with _naming_the_server(self.wrapped):
            response = await self.wrapped.request(messages, model_settings, model_request_parameters)
        if ctx is not None:
            record_usage(ctx, [response])
        return response

    @contextlib.asynccontextmanager
    async def request_stream(
        self, messages: Any, model_settings: Any, model_request_parameters: Any, run_context: Any = None
    ) -> AsyncIterator[Any]:
        ctx = await _before_request()
        with _naming_the_server(self.wrapped):
            async with self.wrapped.request_stream(
                messages, model_settings, model_request_parameters, run_context
            ) as stream:
                try:
                    yield stream
                finally:
                    # what the stream delivered is paid for, also when its consumer stopped early
                    if ctx is not None:
                        record_usage(ctx, [stream.get()])


async def _before_request() -> Any:
    ctx = _ITEM_CTX.get()
    if ctx is not None:
        await ctx.take_request_slot_async()
    return ctx


@contextlib.contextmanager
def _naming_the_server(model: Model) -> Iterator[None]:
    """A connection error says which server could not be reached: the SDK's says only "Connection error."."""
    try:
        yield
    except ModelConnectionError as exc:
        url = getattr(model, "base_url", None)
        if url and url not in exc.message:
            # the same exception, so its type (and whether the run's retry= retries it) is unchanged
            exc.message = (
                f"{exc.message} (model {exc.model_name!r} at {url}: is the server up, and is it the host "
                "of the step's connection?)"
            )
            exc.args = (exc.message, *exc.args[1:])
        raise
