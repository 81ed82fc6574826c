"""The ``engine="pydantic-ai"`` executor of a model step: a pydantic-ai agent per event loop.

The agent comes from the common.ai provider's ``PydanticAIHook`` (its connection gives the provider,
base URL, API key and default model), or is built around the step's ``model=`` (a pydantic-ai
``Model``: ``TestModel``, ``FunctionModel``). Its model answers a request from the run's response
store when its key is there (:mod:`~airflow_provider_datagen.llm.agent_reuse`), else takes a slot of
the run's rate limit and records the reply's tokens (:mod:`~airflow_provider_datagen.llm.slots`). For
tools, ``agent_kwargs`` and the models only pydantic-ai knows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from airflow_provider_datagen.exceptions import ConfigurationError
from airflow_provider_datagen.llm.connection import missing_connection
from airflow_provider_datagen.llm.quiet import quiet_http_logs

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Mapping

    from airflow_provider_datagen.llm.output import OutputSpec
    from airflow_provider_datagen.llm.prompt import PromptTemplate

_INSTALL = "install the model-step extra: pip install 'airflow-provider-datagen[llm]'"


class AgentExecutor:
    """Runs an item's prompt through the step's agent.

    :param agent: the pydantic-ai agent (its model wrapped by ``with_slots`` and ``with_store``).
    :param template: the step's prompt template.
    :param output: the step's output type.
    :param sample: the step's ``sample=`` template (None: no sample), rendered per item into the keys.
    """

    def __init__(
        self, agent: Any, template: PromptTemplate, output: OutputSpec, sample: PromptTemplate | None = None
    ) -> None:
        self.agent = agent
        self.template = template
        self.output = output
        self.sample = sample
        self._lease: Any = None  # held until the loop shuts down: see _quiet_until_shutdown

    async def run(self, item: Mapping[str, Any], ctx: Any) -> dict[str, Any]:
        """The item's fields of the agent's answer."""
        from airflow_provider_datagen.llm.agent_reuse import item_request  # loaded with the agent already
        from airflow_provider_datagen.llm.slots import item_context

        if self._lease is None:
            self._lease = _quiet_until_shutdown()
            await self._lease.__anext__()  # registered with the loop: shutdown_asyncgens() ends it

        # a sample naming a field the item lacks fails it before any request, as the prompt does
        sample = None if self.sample is None else self.sample.render(item, ctx.fields, ctx.item_id)
        text = self.template.render(item, ctx.fields, ctx.item_id)
        # the agent's model answers from the store or takes a slot per request and records its tokens
        with item_context(ctx), item_request(ctx, sample):
            result = await self.agent.run(text)
        return self.output.fields_of(result.output)


def build_agent(call: Any, output: OutputSpec, reuse: bool = True) -> Any:
    """The step's agent (run in a worker thread): its model answers from the response store, else takes
    the run's slots.

    :param call: the step's ``_ModelCall`` (llm/process.py).
    :param output: the step's output type.
    :param reuse: answer a request from the store when its key is there (``False``: send, and store).
    """
    extra = dict(call.extra)
    if call.output_retries != 1 and "retries" not in extra:
        extra["retries"] = {"output": call.output_retries}
    try:
        from airflow_provider_datagen.llm.slots import with_slots

        agent_output = output.agent_output_type()
        if call.model is not None:
            from pydantic_ai import Agent

            agent: Any = Agent(
                call.model,
                output_type=agent_output,
                instructions=call.instructions,
                model_settings=cast("Any", call.settings),  # a ModelSettings TypedDict, built as a dict
                **extra,
            )
        else:
            agent = _hook_agent(call.llm_conn_id, call.model_id, agent_output, call.instructions, call.settings, extra)
    except ImportError as exc:
        raise ConfigurationError(f"llm_process: a model step needs pydantic-ai ({exc}); {_INSTALL}") from exc
    from airflow_provider_datagen.llm.agent_reuse import agent_replies, with_store

    # the store outside the slots: a stored reply takes no slot (one Replies per agent, so per event loop)
    agent.model = with_store(with_slots(agent.model), agent_replies(reuse))
    if output.schema is not None:
        agent.output_validator(output.check_answer)
    return agent


def _hook_agent(
    llm_conn_id: str | None,
    model_id: str | None,
    agent_output: Any,
    instructions: str | None,
    settings: dict[str, Any],
    extra: dict[str, Any],
) -> Any:
    """The agent of the common.ai provider's hook on ``llm_conn_id``; a missing connection is a
    ``ConfigurationError`` saying how to add it (every item would fail the same way: not retryable)."""
    from airflow.exceptions import AirflowNotFoundException
    from airflow.providers.common.ai.hooks.pydantic_ai import PydanticAIHook

    conn_id = llm_conn_id if llm_conn_id is not None else PydanticAIHook.default_conn_name
    try:
        hook = PydanticAIHook.get_hook(conn_id, hook_params={"model_id": model_id} if model_id else None)
        return hook.create_agent(agent_output, instructions=instructions or "", model_settings=settings, **extra)
    except AirflowNotFoundException as exc:
        raise missing_connection(conn_id, model_id, exc) from exc


async def _quiet_until_shutdown() -> AsyncIterator[None]:
    """The HTTP loggers quiet from the first call until the loop shuts down (the run), not per call."""
    with quiet_http_logs():
        yield
