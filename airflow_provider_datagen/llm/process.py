"""A ready model step: :func:`llm_process` builds an ``async def (item, ctx)`` process around a pydantic-ai agent.

The agent comes from the common.ai provider's ``PydanticAIHook`` (its connection gives the provider,
base URL, API key and default model), so the same step talks to OpenAI, Anthropic, a vLLM or an
Ollama server. Building it is deferred to the first call, on the worker: a DAG file that builds a step
parses without pydantic-ai installed and without looking the connection up. It is built once per event
loop (the HTTP client's connections belong to the loop that opened them) and shared by every item.

The client's own retries are off (``max_retries=0``), so the run's ``retry=`` policy owns retries
(attempts, waits, Retry-After, the failure lens). One call may still send several requests (an answer
that fails validation goes back to the model; tool calls): the process takes a slot of the run's
``rate_limit=`` for each request as it sends it (``takes_request_slots``; see
:mod:`~airflow_provider_datagen.llm.slots`). pydantic-ai raises typed errors that carry the provider's
Retry-After (:data:`~airflow_provider_datagen.llm.errors.RETRYABLE_ERRORS`).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import threading
import weakref
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from airflow_provider_datagen.exceptions import ConfigurationError, bad_argument
from airflow_provider_datagen.llm.output import OutputSpec
from airflow_provider_datagen.llm.prompt import PromptTemplate

if TYPE_CHECKING:
    from airflow_provider_datagen.core.steps import Step

#: An LLM process: ``await process(item, ctx)`` returns the item's new fields.
LLMProcess = Callable[[Mapping[str, Any], Any], Awaitable[dict[str, Any]]]

#: PydanticAIHook.default_conn_name, without importing the provider at parse time
_DEFAULT_CONN_ID = "pydanticai_default"
_INSTALL = "install the model-step extra: pip install 'airflow-provider-datagen[llm]'"


def llm_process(
    prompt: str,
    *,
    llm_conn_id: str | None = None,
    model_id: str | None = None,
    instructions: str | None = None,
    output_type: Any = str,
    output_field: str = "output",
    timeout: float | None = None,
    model_settings: Mapping[str, Any] | None = None,
    agent_kwargs: Mapping[str, Any] | None = None,
    model: Any = None,
) -> LLMProcess:
    """An ``async def process(item, ctx)`` that asks a model and returns its answer as the item's fields.

    Use it as ``process=`` of ``DatagenMapOperator`` or ``run_items``, or as a step
    (:func:`llm_step`). Each call renders the prompt from the item, asks the model (no retry of its
    own: give the run ``retry=`` with :data:`~airflow_provider_datagen.llm.errors.RETRYABLE_ERRORS`)
    and returns the fields. Each HTTP request it sends (validation retries and tool calls included)
    first takes a slot of the run's ``rate_limit=`` (``ctx.take_request_slot_async``: counted as the
    attempt's ``"requests"``, failed ones included), and each reply's tokens are recorded with
    ``ctx.record_usage`` as it arrives (so ``tokens_per_minute`` is charged per request, and a run that
    then fails, e.g. on an answer that does not validate, still pays for them).

    :param prompt: a Jinja2 template rendered per item (``StrictUndefined``): the names are the item's
        input fields and the fields earlier steps set, e.g. ``"Translate into French: {{ text }}"``. A
        name the item lacks fails that item with ``PromptTemplateError`` naming the field.
    :param llm_conn_id: a ``pydanticai`` connection (or ``pydanticai_azure`` / ``_bedrock`` /
        ``_vertex``): host = base URL, password = API key, extra ``{"model": "openai:gpt-5-mini"}``.
        ``None``: the hook's default, ``pydanticai_default``. A connection id that does not exist fails
        each item with ``ConfigurationError`` naming it and the ``airflow connections add`` that makes it.
    :param model_id: the model, overriding the connection's: ``"openai:gpt-5-mini"``,
        ``"anthropic:claude-sonnet-4-5"``, ``"ollama:llama3.2"``, ``"vllm:Qwen/Qwen2.5-7B-Instruct"``,
        ``"openai-chat:<name>"`` for any other OpenAI-compatible server.
    :param instructions: the system instructions, the same for every item.
    :param output_type: what the model must answer: ``str`` (one field, ``output_field``), a pydantic
        model class or a JSON schema dict of an object (its properties become the fields), a dataclass
        or TypedDict (its fields), or another type such as ``list[str]`` (one field).
    :param output_field: the field of a ``str`` (or other non-structured) answer.
    :param timeout: seconds one model request may take (pydantic-ai's ``request_timeout``); past it the
        request is cancelled and ``ModelRequestTimeout`` raised (a retryable error). ``None``: the
        client's default.
    :param model_settings: more pydantic-ai ``ModelSettings`` (``temperature``, ``max_tokens``, ...).
        ``max_retries`` is 0 unless given here.
    :param agent_kwargs: more keyword arguments of the pydantic-ai ``Agent``: ``retries={"output": 2}``
        (more tries at an answer that does not validate, within one call), ``tools``, ...
    :param model: a pydantic-ai ``Model`` or model name used instead of the connection (tests with
        ``TestModel``/``FunctionModel``, or code outside Airflow); ``llm_conn_id`` is then not read.
    :returns: the process; its ``version`` attribute is a digest of the prompt, instructions, output type,
        connection id, model and settings, to pass as ``processor_version`` so that changing any of them
        reruns the items. What a connection holds is not in it (the DAG file does not read the
        connection): editing the model inside a connection keeps the version, so name the model with
        ``model_id=`` or bump ``processor_version`` when you change it.
    """
    owner = "llm_process"
    template = PromptTemplate(prompt, owner)
    output = OutputSpec(output_type, output_field, owner)
    call = _ModelCall.checked(
        owner,
        llm_conn_id=llm_conn_id,
        model_id=model_id,
        instructions=instructions,
        timeout=timeout,
        model_settings=model_settings,
        agent_kwargs=agent_kwargs,
        model=model,
    )
    agents = _AgentCache(functools.partial(_build_agent, call, output))

    async def process(item: Mapping[str, Any], ctx: Any) -> dict[str, Any]:
        text = template.render(item, ctx.fields, ctx.item_id)
        agent = await agents.get()
        from airflow_provider_datagen.llm.slots import item_context  # loaded by agents.get() already

        # the agent's model takes a slot per request and records each reply's tokens (llm/slots.py)
        with item_context(ctx):
            result = await agent.run(text)
        return output.fields_of(result.output)

    process.version = _version(template, output, call)  # type: ignore[attr-defined]
    process.takes_request_slots = True  # type: ignore[attr-defined]  # a slot per request, not per call
    return process


@dataclass(frozen=True)
class _ModelCall:
    """How a step's agent asks the model: the arguments of :func:`llm_process` past the prompt and output, checked."""

    llm_conn_id: str | None
    model_id: str | None
    instructions: str | None
    settings: dict[str, Any]  # the pydantic-ai ModelSettings, max_retries and request_timeout included
    extra: dict[str, Any]  # the Agent's other keyword arguments
    model: Any

    @classmethod
    def checked(
        cls,
        owner: str,
        *,
        llm_conn_id: str | None,
        model_id: str | None,
        instructions: str | None,
        timeout: float | None,
        model_settings: Mapping[str, Any] | None,
        agent_kwargs: Mapping[str, Any] | None,
        model: Any,
    ) -> _ModelCall:
        """The call of these arguments; a ``bad_argument`` error names the first that is wrong."""
        for param, value in (("llm_conn_id", llm_conn_id), ("model_id", model_id), ("instructions", instructions)):
            if value is not None and not isinstance(value, str):
                raise bad_argument(owner, param, value, "is not a string", "give a string, or None")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
            raise bad_argument(owner, "timeout", timeout, "is not a positive number of seconds", "e.g. 120")
        for param, mapping in (("model_settings", model_settings), ("agent_kwargs", agent_kwargs)):
            if mapping is not None and not isinstance(mapping, Mapping):
                raise bad_argument(owner, param, mapping, "is not a dict", "give a dict of keyword arguments, or None")
        settings: dict[str, Any] = {"max_retries": 0, **(model_settings or {})}
        if timeout is not None:
            settings["request_timeout"] = float(timeout)
        extra = dict(agent_kwargs or {})
        for reserved in ("output_type", "instructions", "model_settings", "model"):
            if reserved in extra:
                raise bad_argument(
                    owner, "agent_kwargs", extra, f"sets {reserved!r}", f"pass {reserved}= to llm_process itself"
                )
        return cls(llm_conn_id, model_id, instructions, settings, extra, model)


def _build_agent(call: _ModelCall, output: OutputSpec) -> Any:
    """The step's agent (run in a worker thread by :class:`_AgentCache`): its model takes the run's slots."""
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
                **call.extra,
            )
        else:
            agent = _hook_agent(
                call.llm_conn_id, call.model_id, agent_output, call.instructions, call.settings, call.extra
            )
    except ImportError as exc:
        raise ConfigurationError(f"llm_process: a model step needs pydantic-ai ({exc}); {_INSTALL}") from exc
    agent.model = with_slots(agent.model)
    if output.schema is not None:
        agent.output_validator(output.check_answer)
    return agent


def _version(template: PromptTemplate, output: OutputSpec, call: _ModelCall) -> str:
    """The process's ``version``: a digest of what the DAG file says about the step (see :func:`llm_process`)."""
    model = call.model
    description: dict[str, Any] = {
        "prompt": template.source,
        "instructions": call.instructions,
        "output": output.describe(),
        "model_id": call.model_id,
        "model": model if isinstance(model, str) or model is None else type(model).__name__,
        "model_settings": call.settings,
        "agent_kwargs": call.extra,
    }
    if model is None and call.llm_conn_id not in (None, _DEFAULT_CONN_ID):
        # only when named: the versions of steps on the default connection (or on model=) stay as they were
        description["llm_conn_id"] = call.llm_conn_id
    digest = hashlib.sha256(json.dumps(description, sort_keys=True, default=_stable_name).encode()).hexdigest()
    return f"llm-{digest[:12]}"


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
        model = model_id or "openai:gpt-5-mini"
        raise ConfigurationError(
            f"llm_process: the connection {conn_id!r} (llm_conn_id) does not exist; add it, e.g. "
            f"`airflow connections add {conn_id} --conn-type pydanticai --conn-host <base url> "
            f'--conn-password <api key> --conn-extra \'{{"model": "{model}"}}\'`, '
            "or pass the llm_conn_id of an existing one"
        ) from exc


def _stable_name(obj: Any) -> str:
    """A name for a non-JSON value of the version digest that is the same in every process that parses the
    DAG (a ``repr`` may hold a memory address): a function or class by its dotted name, else its type's."""
    named = obj if hasattr(obj, "__qualname__") else type(obj)
    return f"{getattr(named, '__module__', '')}.{named.__qualname__}"


def llm_step(name: str, prompt: str, **kwargs: Any) -> Step:
    """A pipeline :class:`~airflow_provider_datagen.core.Step` named ``name`` running :func:`llm_process`.

    ``llm_step("translate", "Translate: {{ text }}", llm_conn_id="openai", output_type=Translation)``;
    the keyword arguments are :func:`llm_process`'s.
    """
    # Deferred: core imports Lance, which DAG parsing must not pay for.
    from airflow_provider_datagen.core.steps import Step

    return Step(name, llm_process(prompt, **kwargs))


class _AgentCache:
    """One agent per event loop, built on first use in a worker thread (imports and the connection
    lookup must not stall the loop); concurrent first calls wait for the same build, a failed build is
    tried again by the next call."""

    def __init__(self, build: Callable[[], Any]) -> None:
        self._build = build
        self._lock = threading.Lock()
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = weakref.WeakKeyDictionary()

    async def get(self) -> Any:
        """The agent of the running loop."""
        loop = asyncio.get_running_loop()
        with self._lock:
            entry = self._by_loop.get(loop)
            if entry is None:
                entry = self._by_loop[loop] = loop.create_task(asyncio.to_thread(self._build))
        if not isinstance(entry, asyncio.Task):
            return entry
        try:
            agent = await asyncio.shield(entry)
        except BaseException:
            if entry.done():
                with self._lock:
                    if self._by_loop.get(loop) is entry:
                        del self._by_loop[loop]
            raise
        with self._lock:
            if self._by_loop.get(loop) is entry:
                self._by_loop[loop] = agent
        return agent
