"""The ``engine="sdk"`` executor of a model step: an :class:`~airflow_provider_datagen.llm.request.LLMRequest`
sent with the provider's official async client, its answer validated with pydantic.

``openai.AsyncOpenAI`` (OpenAI and every OpenAI-compatible server: a structured answer through the
``json_schema`` response format) or ``anthropic.AsyncAnthropic`` (through one forced tool). The client
is built on the worker from the step's connection (:func:`read_connection`), one per event loop (its
connections belong to the loop that opened them), on aiohttp where it is installed (httpx's pool
scans every idle connection per request, which costs more the more calls are in flight), with
``max_retries=0``: the run's ``retry=`` owns retries. It is closed when its loop shuts down its async
generators (``asyncio.run`` and the runner's loops do).

Each HTTP request takes one slot of the run's rate limit first (``ctx.take_request_slot_async``) and
records its reply's tokens (``ctx.record_usage``); an answer that does not validate is sent back with
the errors, ``output_retries`` times, then the item fails with ``OutputValidationError``. The SDKs'
errors are raised as they are (:data:`~airflow_provider_datagen.llm.errors.RETRYABLE_ERRORS` names the
transient ones), a rate limit's ``retry-after-ms`` as ``retry_after`` and a connection error naming the
server it could not reach.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from typing import TYPE_CHECKING, Any

from airflow_provider_datagen.core.error_text import error_message
from airflow_provider_datagen.exceptions import ConfigurationError, OutputValidationError
from airflow_provider_datagen.llm.output import validated_fields
from airflow_provider_datagen.llm.quiet import quiet_http_logs
from airflow_provider_datagen.llm.request import PROVIDERS, Target, usage_provider, wire_settings
from airflow_provider_datagen.llm.reuse import Replies, Reply

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

    from airflow_provider_datagen.llm.output import OutputSpec
    from airflow_provider_datagen.llm.prompt import PromptTemplate
    from airflow_provider_datagen.llm.request import LLMRequest, RequestBuilder

_OWNER = "llm_process"
logger = logging.getLogger(__name__)
#: an OpenAI-compatible server that needs no key still needs the client to send one
_NO_KEY = "api-key-not-set"


class UnknownModelError(ConfigurationError):
    """A model name whose prefix the SDK engine does not know (pydantic-ai may: ``google-gla:``, ``bedrock:``)."""


def resolve_target(model_name: str | None, base_url: str | None) -> Target:
    """The :class:`Target` of a pydantic-ai model name (``"openai:gpt-5-mini"``); a name without a prefix
    (pydantic-ai's ``"test"``, its inference of a bare name) is not one this engine knows."""
    if not model_name:
        raise ConfigurationError(
            f"{_OWNER}: no model: pass model_id='openai:<model>' or set the connection's extra "
            '{"model": "openai:<model>"}'
        )
    prefix, sep, bare = model_name.partition(":")
    api = PROVIDERS.get(prefix) if sep else None
    if api is None:
        raise UnknownModelError(
            f"{_OWNER}: engine='sdk' does not know the model prefix {prefix!r} of {model_name!r} (it knows "
            f"{sorted(PROVIDERS)}); pass engine='pydantic-ai' for the models only pydantic-ai knows"
        )
    return Target(api, base_url, bare, usage_provider(prefix))


class SDKExecutor:
    """Sends a step's requests with the provider's SDK (see the module); one per event loop.

    :param builder: the step's request builder.
    :param target: whom to ask.
    :param api_key: the API key (None: the SDK's environment variable, or none for a local server).
    :param model_settings: the step's pydantic-ai ``ModelSettings`` (body fields, ``timeout``, ``extra_headers``).
    :param output_retries: how many times an answer that does not validate is sent back.
    :param reuse: answer a request from the run's response store when its key is there (:mod:`~.reuse`).
    :param sample: the step's ``sample=`` template (None: no sample), rendered per item into the key.
    """

    def __init__(
        self,
        builder: RequestBuilder,
        target: Target,
        api_key: str | None,
        model_settings: Mapping[str, Any],
        output_retries: int,
        reuse: bool = True,
        sample: PromptTemplate | None = None,
        tools_if_refused: bool = False,
    ) -> None:
        self.builder = builder
        #: a server that refuses the json_schema response format is asked through one forced tool instead
        self.tools_if_refused = tools_if_refused
        self.output: OutputSpec = builder.output
        self.target = target
        self.output_retries = output_retries
        self.settings = wire_settings(target.provider, model_settings)
        timeout = model_settings.get("request_timeout", model_settings.get("timeout"))
        self._timeout = float(timeout) if isinstance(timeout, (int, float)) else None
        headers = model_settings.get("extra_headers")
        self._options: dict[str, Any] = {"headers": dict(headers)} if isinstance(headers, dict) else {}
        self._api_key = api_key
        self._client: Any = None
        self._closer: Any = None  # the async generator whose aclose() closes the client (see _client_on_loop)
        self._errors = _sdk_errors(target.provider)
        self._sample = sample
        self._replies = Replies(reuse, self._parse, self._usage)

    async def run(self, item: Mapping[str, Any], ctx: Any) -> dict[str, Any]:
        """The item's fields: ask (or read the stored reply), validate, send an invalid answer back
        (``output_retries`` times)."""
        sample = None if self._sample is None else self._sample.render(item, ctx.fields, ctx.item_id)
        request = self.builder.build(item, ctx.fields, ctx.item_id, self.target, self.settings, sample=sample)
        client = self._client if self._client is not None else await self._client_on_loop()
        where = f"{_OWNER}: item {ctx.item_id!r}"
        error: OutputValidationError | None = None
        for _ in range(self.output_retries + 1):
            try:
                got = await self._replies.get(request, ctx, self._sender(client, ctx, request))
            except self._errors[0] as exc:
                if not self._refuses_json_schema(exc, request):
                    raise
                request = dataclasses.replace(request, structured="tools")
                got = await self._replies.get(request, ctx, self._sender(client, ctx, request))
            reply = got.reply
            answer, feedback = (
                _anthropic_answer(reply, request)
                if self.target.provider == "anthropic"
                else _openai_answer(reply, request)
            )
            if got.reused_from is None:
                self._record(ctx, got)
            try:
                return validated_fields(self.output, answer, where)
            except OutputValidationError as exc:
                error = exc
                # what was wrong, without the item's id: the retry's key must not depend on it
                request = request.followed_by(*feedback(str(exc).removeprefix(f"{where}: ")))
        assert error is not None
        raise OutputValidationError(
            f"{error} (after {self.output_retries + 1} answers; raise output_retries=, or look at the prompt)"
        )

    def _sender(self, client: Any, ctx: Any, request: LLMRequest) -> Callable[[], Awaitable[Any]]:
        async def send() -> Any:
            await ctx.take_request_slot_async()  # after the store's lookup: a stored reply takes no slot
            return await self._send(client, request)

        return send

    def _refuses_json_schema(self, exc: BaseException, request: LLMRequest) -> bool:
        """Whether ``exc`` is a server refusing the json_schema response format (then, with the default
        ``structured=None``, this and every later request of the step go through one forced tool)."""
        if not (self.tools_if_refused and request.schema is not None and request.structured == "json_schema"):
            return False
        if getattr(exc, "status_code", None) not in (400, 404, 422, 501):
            return False
        text = error_message(exc).lower()
        if not any(word in text for word in ("response_format", "json_schema", "response format")):
            return False
        if self.builder.structured != "tools":
            logger.warning(
                "%s: the server at %s refuses the json_schema response format; asking it through one forced "
                "tool instead (pass structured='tools' to skip the first try)",
                _OWNER,
                self.target.base_url or "the provider's API",
            )
            self.builder.structured = "tools"
        return True

    async def _send(self, client: Any, request: LLMRequest) -> Any:
        status_error, connection_error = self._errors
        try:
            if request.provider == "anthropic":
                from anthropic.types import Message

                return await client.post("/v1/messages", cast_to=Message, body=request.body(), options=self._options)
            from openai.types.chat import ChatCompletion

            return await client.post(
                "/chat/completions", cast_to=ChatCompletion, body=request.body(), options=self._options
            )
        except status_error as exc:
            _retry_after_ms(exc)
            raise
        except connection_error as exc:
            _name_the_server(exc, request.model, str(client.base_url))
            raise

    def _record(self, ctx: Any, got: Reply) -> None:
        if got.model:
            # the key only within a run (a context outside one may not take it)
            keyed = {} if got.key is None else {"request_key": got.key}
            ctx.record_usage(
                model=got.model, input_tokens=got.input_tokens, output_tokens=got.output_tokens, calls=1, **keyed
            )

    def _parse(self, text: str) -> Any:
        """The SDK's reply object of a stored reply's JSON."""
        if self.target.provider == "anthropic":
            from anthropic.types import Message

            return Message.model_validate_json(text)
        from openai.types.chat import ChatCompletion

        return ChatCompletion.model_validate_json(text)

    def _usage(self, reply: Any) -> tuple[str, int, int] | None:
        """(usage label, input tokens, output tokens) of a reply; None when it reports no usage."""
        usage = getattr(reply, "usage", None)
        if usage is None:
            return None
        if self.target.provider == "anthropic":
            tokens_in = (
                int(usage.input_tokens or 0)
                + int(getattr(usage, "cache_creation_input_tokens", 0) or 0)
                + int(getattr(usage, "cache_read_input_tokens", 0) or 0)
            )
            tokens_out = int(usage.output_tokens or 0)
        else:
            tokens_in, tokens_out = int(usage.prompt_tokens or 0), int(usage.completion_tokens or 0)
        model = f"{self.target.label}:{getattr(reply, 'model', None) or self.target.model}"
        return model, tokens_in, tokens_out

    async def _client_on_loop(self) -> Any:
        """The client, built on the loop that uses it (aiohttp's session belongs to one loop)."""
        if self._client is None:
            self._client = _new_client(self.target, self._api_key, self._timeout)
            self._closer = _close_at_shutdown(self._client)
            await self._closer.__anext__()  # registered with the loop: shutdown_asyncgens() closes it
        return self._client


def _sdk_errors(provider: str) -> tuple[type[Exception], type[Exception]]:
    if provider == "anthropic":
        import anthropic

        return anthropic.APIStatusError, anthropic.APIConnectionError
    import openai

    return openai.APIStatusError, openai.APIConnectionError


def _new_client(target: Target, api_key: str | None, timeout: float | None) -> Any:
    kwargs: dict[str, Any] = {"max_retries": 0}
    if target.base_url:
        kwargs["base_url"] = target.base_url
    if timeout is not None:
        kwargs["timeout"] = timeout
    if target.provider == "anthropic":
        import anthropic

        kwargs["api_key"] = api_key
        aio: Any = getattr(anthropic, "DefaultAioHttpClient", None)  # an older SDK has none
        make: Any = anthropic.AsyncAnthropic
    else:
        import openai

        # a local server needs no key, but the client insists on one
        kwargs["api_key"] = api_key or (None if target.label == "openai" and not target.base_url else _NO_KEY)
        aio, make = getattr(openai, "DefaultAioHttpClient", None), openai.AsyncOpenAI
    try:
        http_client = None if aio is None else aio(timeout=timeout) if timeout is not None else aio()
    except RuntimeError:  # the SDK's aiohttp extra is not installed: its default httpx client
        http_client = None
    if http_client is not None:
        kwargs["http_client"] = http_client
    return make(**kwargs)


async def _close_at_shutdown(client: Any) -> AsyncIterator[None]:
    """Held from the client's first request until its loop shuts down: the HTTP loggers stay quiet for
    the whole run (not switched per call when calls do not overlap), then the client is closed."""
    with quiet_http_logs():
        try:
            yield
        finally:
            await client.close()


def _openai_answer(reply: Any, request: LLMRequest) -> tuple[Any, Any]:
    """(the raw answer, a function of the errors giving the messages that send it back) of a completion:
    a structured answer's JSON decoded, a text answer as it is (even when it looks like JSON)."""
    message = reply.choices[0].message if reply.choices else None
    content = None if message is None else message.content
    if content is None and message is not None and message.tool_calls:
        content = message.tool_calls[0].function.arguments  # a server that answered through a tool
    answer: Any = content
    if content is not None and request.schema is not None:
        try:
            decoded = json.loads(content)
        except ValueError:
            decoded = None
        if isinstance(decoded, dict):
            answer = decoded

    def feedback(errors: str) -> tuple[dict[str, Any], ...]:
        return (
            {"role": "assistant", "content": content or ""},
            {"role": "user", "content": f"{errors}\nFix the errors and answer again."},
        )

    return answer, feedback


def _anthropic_answer(reply: Any, request: LLMRequest) -> tuple[Any, Any]:
    blocks = list(reply.content or [])
    tool = next((b for b in blocks if getattr(b, "type", None) == "tool_use"), None)
    text = "".join(getattr(b, "text", "") for b in blocks if getattr(b, "type", None) == "text")
    answer: Any = tool.input if request.schema is not None and tool is not None else (text or None)

    def feedback(errors: str) -> tuple[dict[str, Any], ...]:
        if tool is None:
            return (
                {"role": "assistant", "content": text or "(no answer)"},
                {"role": "user", "content": f"{errors}\nFix the errors and answer again."},
            )
        return (
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": tool.id, "name": tool.name, "input": tool.input}],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": tool.id, "content": errors, "is_error": True}],
            },
        )

    return answer, feedback


def _retry_after_ms(exc: Any) -> None:
    """A rate limit's ``retry-after-ms`` header as the error's ``retry_after`` (seconds), which the retry
    policy waits at least; ``Retry-After`` it reads from the response itself."""
    headers = getattr(getattr(exc, "response", None), "headers", None)
    value = headers.get("retry-after-ms") if headers is not None else None
    if value is not None:
        with contextlib.suppress(ValueError):
            exc.retry_after = float(value) / 1000.0


def _name_the_server(exc: Any, model: str, url: str) -> None:
    """A connection error says which server could not be reached: the SDK's says only "Connection error."."""
    message = str(exc)
    if url in message:
        return
    exc.message = (
        f"{message} (model {model!r} at {url}: is the server up, and is it the host of the step's connection?)"
    )
    exc.args = (exc.message, *exc.args[1:])
