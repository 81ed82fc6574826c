"""A ready model step: :func:`llm_process` builds an ``async def (item, ctx)`` process that asks a model.

Two engines send the same request (:mod:`~airflow_provider_datagen.llm.request`): ``"sdk"`` (the
default) with the provider's official async client (:mod:`~airflow_provider_datagen.llm.sdk`),
``"pydantic-ai"`` through a pydantic-ai agent (:mod:`~airflow_provider_datagen.llm.agent`: tools,
``agent_kwargs``, ``model=`` and the models only pydantic-ai knows). Both read the same ``pydanticai``
connection (the provider, base URL, API key and default model), store the same fields for the same
answer, and give the process the same ``version``.

Building the executor is deferred to the first call, on the worker: a DAG file that builds a step
parses without the SDKs installed and without looking the connection up. It is built once per event
loop (the HTTP client's connections belong to the loop that opened them) and shared by every item.

The clients' own retries are off (``max_retries=0``), so the run's ``retry=`` policy owns retries
(attempts, waits, Retry-After, the failure lens). One call may still send several requests (an answer
that fails validation goes back to the model; tool calls): the process takes a slot of the run's
``rate_limit=`` for each request as it sends it (``takes_request_slots``). The errors of both engines
carry the provider's Retry-After (:data:`~airflow_provider_datagen.llm.errors.RETRYABLE_ERRORS`). While
calls are in flight the HTTP clients' loggers are at WARNING (:mod:`~airflow_provider_datagen.llm.quiet`):
no task-log line per request.
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
from airflow_provider_datagen.llm.quiet import quiet_http_logs

if TYPE_CHECKING:
    from airflow_provider_datagen.core.steps import Step

#: An LLM process: ``await process(item, ctx)`` returns the item's new fields.
LLMProcess = Callable[[Mapping[str, Any], Any], Awaitable[dict[str, Any]]]

#: PydanticAIHook.default_conn_name, without importing the provider at parse time
_DEFAULT_CONN_ID = "pydanticai_default"
_INSTALL = "install the model-step extra: pip install 'airflow-provider-datagen[llm]'"
#: who the errors of llm_process (and llm_step, built on it) name
_OWNER = "llm_process"
#: the engines of llm_process(engine=...)
ENGINES = ("sdk", "pydantic-ai")


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
    engine: str | None = None,
    output_retries: int = 1,
    structured: str | None = None,
    reuse: bool = True,
    sample: str | int | None = None,
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
    :param timeout: seconds one model request may take; past it the request is cancelled and a
        retryable error raised (``openai.APITimeoutError``/``anthropic.APITimeoutError`` on the sdk
        engine, ``ModelRequestTimeout`` on pydantic-ai's). ``None``: the client's default.
    :param model_settings: more pydantic-ai ``ModelSettings`` (``temperature``, ``max_tokens``,
        ``seed``, ``stop_sequences``, ``extra_body``, ``extra_headers``, ``timeout``, ``openai_<name>``
        / ``anthropic_<name>`` for a provider's own fields); the sdk engine sends them as the
        provider's body fields. ``max_retries`` is 0 unless given here.
    :param agent_kwargs: more keyword arguments of the pydantic-ai ``Agent`` (``tools``,
        ``retries={"output": 2}``, ...); implies ``engine="pydantic-ai"``.
    :param model: a pydantic-ai ``Model`` or model name used instead of the connection (tests with
        ``TestModel``/``FunctionModel``, or code outside Airflow); ``llm_conn_id`` is then not read.
        Implies ``engine="pydantic-ai"``.
    :param engine: ``"sdk"`` (the default): the request is sent with the provider's own async client
        (``openai.AsyncOpenAI`` for OpenAI and every OpenAI-compatible server, ``anthropic.AsyncAnthropic``),
        its answer validated with pydantic; a model prefix it does not know (``google-gla:``, ``bedrock:``,
        ...) falls back to pydantic-ai unless ``engine="sdk"`` is given. ``"pydantic-ai"``: a pydantic-ai
        agent (tools, ``agent_kwargs``, ``model=``, every model pydantic-ai knows); it costs more CPU per
        request. ``None``: ``"sdk"``, or ``"pydantic-ai"`` when ``model=`` or ``agent_kwargs=`` is given.
        The engine is not in ``version``: switching it reruns nothing.
    :param output_retries: how many times an answer that does not validate is sent back to the model,
        with the errors, within one call (each a request: a slot and its usage); then the item fails
        (``OutputValidationError`` on the sdk engine, pydantic-ai's ``UnexpectedModelBehavior`` on its own).
    :param structured: how the sdk engine asks an OpenAI-compatible server for a structured answer:
        ``None`` (the default): the ``json_schema`` response format, and one forced function call from the
        first request a server refuses for it on (an HTTP 400 naming the response format: some vLLM,
        Ollama and LiteLLM builds lack it), for the rest of the run; ``"json_schema"``: the response
        format only; ``"tools"``: the forced function only. Not in ``version``; Anthropic's is always a tool.
    :param reuse: ``True``: a request whose key is in the root's response store is answered from it (no
        request, slot or budget; a usage entry ``"reused": True``); ``False``: always sent (and stored).
        Not in ``version``; both engines (not ``TestModel``/``FunctionModel``): docs/guide/response-store.md.
    :param sample: a template (``"{{ sample_index }}"``) or an int telling samples of one prompt apart
        (distinct keys); in ``version``, never sent. A name the item lacks fails it before any request.
    :returns: the process; its ``version`` attribute is a digest of the prompt, instructions, output type,
        connection id, model and settings, to pass as ``processor_version`` so that changing any of them
        reruns the items. What a connection holds is not in it (the DAG file does not read the
        connection): editing the model inside a connection keeps the version, so name the model with
        ``model_id=`` or bump ``processor_version`` when you change it.
    """
    owner = _OWNER
    template = PromptTemplate(prompt, owner)
    output = OutputSpec(output_type, output_field, owner)
    call = _ModelCall.checked(
        llm_conn_id=llm_conn_id,
        model_id=model_id,
        instructions=instructions,
        timeout=timeout,
        model_settings=model_settings,
        agent_kwargs=agent_kwargs,
        model=model,
        engine=engine,
        output_retries=output_retries,
        structured=structured,
    )
    sample_template = _sample_template(owner, reuse, sample)
    executors = _ExecutorCache(functools.partial(_build_executor, call, template, output, reuse, sample_template))
    return _process(executors, _version(template, output, call, sample_template))


def _process(executors: _ExecutorCache, version: str) -> LLMProcess:
    """The step's ``async def process(item, ctx)``, with its ``version`` and what the runner reads of it."""

    async def process(item: Mapping[str, Any], ctx: Any) -> dict[str, Any]:
        with quiet_http_logs():
            executor = await executors.get()
            return cast("dict[str, Any]", await executor.run(item, ctx))

    # the name errors and the UI show for the step: the public function's, not this helper's
    process.__qualname__ = "llm_process.<locals>.process"
    process.version = version  # type: ignore[attr-defined]
    process.takes_request_slots = True  # type: ignore[attr-defined]  # a slot per request, not per call
    process.uses_response_store = True  # type: ignore[attr-defined]  # run_items opens the store (both engines)
    return process


def _sample_template(owner: str, reuse: Any, sample: Any) -> PromptTemplate | None:
    """The ``sample=`` of a step as a template (an int is its decimal text); None: no sample. Checks ``reuse``."""
    if not isinstance(reuse, bool):
        raise bad_argument(
            owner, "reuse", reuse, "is not a bool", "give True (answer from the response store) or False"
        )
    if sample is None:
        return None
    if isinstance(sample, bool) or not isinstance(sample, (str, int)):
        raise bad_argument(
            owner, "sample", sample, "is not a template or an int", "give e.g. '{{ sample_index }}', 3, or None"
        )
    return PromptTemplate(str(sample), owner, "sample")


@dataclass(frozen=True)
class _ModelCall:
    """How a step's agent asks the model: the arguments of :func:`llm_process` past the prompt and output, checked."""

    llm_conn_id: str | None
    model_id: str | None
    instructions: str | None
    settings: dict[str, Any]  # the pydantic-ai ModelSettings, max_retries and request_timeout included
    extra: dict[str, Any]  # the Agent's other keyword arguments
    model: Any
    engine: str  # "sdk" or "pydantic-ai"
    explicit: bool  # engine= was given (no fallback to pydantic-ai for a model the sdk engine does not know)
    output_retries: int
    structured: str | None  # "json_schema", "tools", or None: the response format, a tool where refused

    @classmethod
    def checked(
        cls,
        *,
        llm_conn_id: str | None,
        model_id: str | None,
        instructions: str | None,
        timeout: float | None,
        model_settings: Mapping[str, Any] | None,
        agent_kwargs: Mapping[str, Any] | None,
        model: Any,
        engine: str | None = None,
        output_retries: int = 1,
        structured: str | None = None,
    ) -> _ModelCall:
        """The call of these arguments; a ``bad_argument`` error names the first that is wrong."""
        owner = _OWNER
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
        if isinstance(output_retries, bool) or not isinstance(output_retries, int) or output_retries < 0:
            raise bad_argument(owner, "output_retries", output_retries, "is not an int >= 0", "e.g. 1")
        if structured not in (None, "json_schema", "tools"):
            raise bad_argument(
                owner, "structured", structured, "is not a mode", "give 'json_schema', 'tools' or None (either)"
            )
        chosen = _engine(owner, engine, model, extra)
        explicit = engine is not None
        return cls(
            llm_conn_id, model_id, instructions, settings, extra, model, chosen, explicit, output_retries, structured
        )


def _engine(owner: str, engine: str | None, model: Any, agent_kwargs: dict[str, Any]) -> str:
    """The engine of ``engine=``: ``model=`` and ``agent_kwargs=`` are pydantic-ai's alone."""
    if engine is not None and engine not in ENGINES:
        raise bad_argument(owner, "engine", engine, "is not an engine", "give 'sdk' or 'pydantic-ai'")
    agent_only = "model" if model is not None else "agent_kwargs" if agent_kwargs else None
    if agent_only is None:
        return engine or "sdk"
    if engine == "sdk":
        raise bad_argument(
            owner,
            "engine",
            engine,
            f"cannot take {agent_only}= (a pydantic-ai {'Model' if model is not None else 'Agent argument'})",
            "pass engine='pydantic-ai' (or leave engine unset), or drop " + agent_only,
        )
    return "pydantic-ai"


def _build_executor(
    call: _ModelCall, template: PromptTemplate, output: OutputSpec, reuse: bool, sample: PromptTemplate | None
) -> Any:
    """The step's executor (run in a worker thread by :class:`_ExecutorCache`): reads the connection."""
    from airflow_provider_datagen.llm.agent import AgentExecutor, build_agent

    if call.engine == "pydantic-ai":
        return AgentExecutor(build_agent(call, output, reuse), template, output, sample)
    try:
        from airflow_provider_datagen.llm.connection import read_connection
        from airflow_provider_datagen.llm.request import RequestBuilder
        from airflow_provider_datagen.llm.sdk import SDKExecutor, UnknownModelError, resolve_target

        conn_id = call.llm_conn_id if call.llm_conn_id is not None else _DEFAULT_CONN_ID
        base_url, api_key, conn_model = read_connection(conn_id, call.model_id)
        try:
            target = resolve_target(call.model_id or conn_model, base_url)
        except UnknownModelError:
            if call.explicit:
                raise
            return AgentExecutor(build_agent(call, output, reuse), template, output, sample)
    except ImportError as exc:
        raise ConfigurationError(f"llm_process: engine='sdk' needs the SDKs ({exc}); {_INSTALL}") from exc
    builder = RequestBuilder(template, output, call.instructions, {}, call.structured or "json_schema")
    return SDKExecutor(
        builder,
        target,
        api_key,
        call.settings,
        call.output_retries,
        reuse,
        sample,
        tools_if_refused=call.structured is None,
    )


def _version(template: PromptTemplate, output: OutputSpec, call: _ModelCall, sample: PromptTemplate | None) -> str:
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
    if sample is not None:
        # only when given: the versions of steps without samples stay as they were
        description["sample"] = sample.source
    if call.output_retries != 1:
        # only when not the default: the versions of steps from before output_retries= stay as they were
        description["output_retries"] = call.output_retries
    if model is None and call.llm_conn_id not in (None, _DEFAULT_CONN_ID):
        # only when named: the versions of steps on the default connection (or on model=) stay as they were
        description["llm_conn_id"] = call.llm_conn_id
    digest = hashlib.sha256(json.dumps(description, sort_keys=True, default=_stable_name).encode()).hexdigest()
    return f"llm-{digest[:12]}"


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


class _ExecutorCache:
    """One executor (an sdk client, or an agent) per event loop, built on first use in a worker thread
    (imports and the connection lookup must not stall the loop); concurrent first calls wait for the
    same build, a failed build is tried again by the next call."""

    def __init__(self, build: Callable[[], Any]) -> None:
        self._build = build
        self._lock = threading.Lock()
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = weakref.WeakKeyDictionary()

    async def get(self) -> Any:
        """The executor of the running loop."""
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
