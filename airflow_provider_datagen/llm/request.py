"""One model request, built one way: :class:`LLMRequest` and the :class:`RequestBuilder` of a step.

``llm_process``'s executors (the provider SDKs', :mod:`~airflow_provider_datagen.llm.sdk`) and the
batch step (:mod:`~airflow_provider_datagen.llm.batch.step`) build an item's request with the same
builder, so one item's request is the same object online and in a batch, and its :meth:`LLMRequest.digest`
can key a response store. The request says what to ask (the messages, the answer's JSON schema, the
settings) and of whom (provider, base URL, model); :meth:`LLMRequest.body` is the provider's own body:
OpenAI chat completions with a ``json_schema`` response format for a structured answer, Anthropic
messages with one forced tool (``final_result``, pydantic-ai's name for it).

The model names are pydantic-ai's (``"openai:gpt-5-mini"``, ``"anthropic:claude-sonnet-4-5"``,
``"ollama:llama3.2"``, ``"vllm:<model>"``, ``"openai-chat:<model>"``): :data:`PROVIDERS` maps each
prefix to the API its server speaks.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping

    from airflow_provider_datagen.llm.output import OutputSpec
    from airflow_provider_datagen.llm.prompt import PromptTemplate

#: the API each model-name prefix speaks: the providers' own, and the OpenAI-compatible servers
PROVIDERS: dict[str, str] = {
    "openai": "openai",
    "openai-chat": "openai",
    "openai-responses": "openai",
    "anthropic": "anthropic",
    # OpenAI-compatible servers (pydantic-ai's provider names); their base URL is the connection's host
    "ollama": "openai",
    "vllm": "openai",
    "litellm": "openai",
    "deepseek": "openai",
    "openrouter": "openai",
    "together": "openai",
    "fireworks": "openai",
    "grok": "openai",
    "cerebras": "openai",
    "moonshotai": "openai",
    "nebius": "openai",
    "ovhcloud": "openai",
    "github": "openai",
    "heroku": "openai",
}
#: the prefixes with a batch API (llm_batch): the providers' own
BATCH_PREFIXES = frozenset({"openai", "openai-chat", "openai-responses", "anthropic"})
#: Anthropic requires max_tokens; a request's default when the settings give none
DEFAULT_MAX_TOKENS = 1024
#: the version of the key's canonical form (:meth:`LLMRequest.canonical`): a change is a migration
KEY_VERSION = 1
#: settings that change how a request travels, not what it asks: never part of its key
TRANSPORT_SETTINGS = frozenset({"timeout", "max_retries", "request_timeout"})
#: the tool an Anthropic structured answer is forced through, and the OpenAI response format's name
OUTPUT_TOOL = "final_result"


def usage_provider(prefix: str) -> str:
    """The provider part of a usage label (``"openai:gpt-4o-mini"``) for a model-name prefix, as
    pydantic-ai labels its replies: the OpenAI spellings are ``openai``, the others their own name."""
    return "openai" if prefix.startswith("openai") else prefix


@dataclass(frozen=True)
class LLMRequest:
    """One item's model request: what to ask and of whom, provider-neutral up to :meth:`body`.

    :param provider: the API: ``"openai"`` (OpenAI and every OpenAI-compatible server) or ``"anthropic"``.
    :param base_url: the API's base URL; None: the provider's own.
    :param model: the model as the provider names it (no ``openai:`` prefix).
    :param messages: the system instructions (if any) and the rendered user prompt, as chat messages;
        after an answer that did not validate, the answer and the errors follow.
    :param schema: the JSON schema of the answer (an object); None: a plain text answer.
    :param settings: more fields of the provider's body (``temperature``, ``max_tokens``, ...).
    :param structured: how OpenAI's API is asked for a structured answer: ``"json_schema"`` (the response
        format) or ``"tools"`` (one forced function, ``final_result``, for a server without the response
        format). Anthropic's is always a forced tool.
    :param sample: which sample of the same prompt this is (``sample=`` of the step, rendered); part of
        the :meth:`key` only, never sent. None: no sample.
    """

    provider: str
    base_url: str | None
    model: str
    messages: tuple[Mapping[str, Any], ...]
    schema: dict[str, Any] | None
    settings: Mapping[str, Any]
    structured: str = "json_schema"
    sample: str | None = None

    def body(self) -> dict[str, Any]:
        """The provider's request body."""
        return self.anthropic_body() if self.provider == "anthropic" else self.openai_body()

    def openai_body(self) -> dict[str, Any]:
        """An OpenAI chat-completions body; a structured answer through the ``json_schema`` response format
        (or one forced function, ``structured="tools"``)."""
        body: dict[str, Any] = {**self.settings, "model": self.model, "messages": list(self.messages)}
        if self.schema is not None and self.structured == "tools":
            function = {"name": OUTPUT_TOOL, "description": "The answer.", "parameters": self.schema}
            body["tools"] = [{"type": "function", "function": function}]
            body["tool_choice"] = {"type": "function", "function": {"name": OUTPUT_TOOL}}
        elif self.schema is not None:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": OUTPUT_TOOL, "schema": self.schema, "strict": False},
            }
        return body

    def anthropic_body(self) -> dict[str, Any]:
        """An Anthropic messages body; a structured answer through one forced tool, ``final_result``."""
        system = [m["content"] for m in self.messages if m.get("role") == "system"]
        body: dict[str, Any] = {
            "max_tokens": DEFAULT_MAX_TOKENS,
            **self.settings,
            "model": self.model,
            "messages": [m for m in self.messages if m.get("role") != "system"],
        }
        if system:
            body["system"] = "\n\n".join(system)
        if self.schema is not None:
            body["tools"] = [{"name": OUTPUT_TOOL, "description": "The answer.", "input_schema": self.schema}]
            body["tool_choice"] = {"type": "tool", "name": OUTPUT_TOOL}
        return body

    def followed_by(self, *messages: Mapping[str, Any]) -> LLMRequest:
        """The same request with ``messages`` appended (an answer, and what was wrong with it)."""
        return dataclasses.replace(self, messages=(*self.messages, *messages))

    def canonical(self) -> dict[str, Any]:
        """The request's canonical form, what its :meth:`key` digests (docs/guide/response-store.md).

        The provider's API and base URL (no trailing ``/``), the model, every message as sent (a
        validation retry's earlier turns included), the answer's schema, how a structured answer is
        asked, the settings without the transport-only ones (:data:`TRANSPORT_SETTINGS`) and the
        ``sample``. Nothing of the item id, the experiment, the attempt, the time or the code's layout.
        """
        return {
            "key_version": KEY_VERSION,
            "provider": self.provider,
            "base_url": self.base_url.rstrip("/") if self.base_url else None,
            "model": self.model,
            "messages": list(self.messages),
            "schema": self.schema,
            "structured": self.structured if self.schema is not None else None,
            "settings": {k: v for k, v in self.settings.items() if k not in TRANSPORT_SETTINGS},
            "sample": self.sample,
        }

    def key(self) -> str:
        """The request's key in the response store: the SHA-256 (hex) of its :meth:`canonical` form as
        canonical JSON (sorted keys, no spaces, UTF-8). Pinned by a test: a change needs a migration."""
        text = json.dumps(
            self.canonical(), sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_stable_value
        )
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()

    def digest(self) -> str:
        """The same as :meth:`key` (the name the batch step used first)."""
        return self.key()


def _stable_value(obj: Any) -> Any:
    """A JSON value for a setting that is not one, the same in every process (never a ``repr`` with an address)."""
    if isinstance(obj, (set, frozenset)):
        return sorted(obj, key=str)
    dump = getattr(obj, "model_dump", None)  # a pydantic model
    if callable(dump):
        return dump(mode="json")
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    value = getattr(obj, "value", None)  # an Enum
    if isinstance(value, (str, int, float, bool)):
        return value
    return f"{type(obj).__module__}.{type(obj).__qualname__}:{obj}"


@dataclass(frozen=True)
class Target:
    """Whom a step's requests go to, known on the worker (the connection is read there)."""

    provider: str  # "openai" | "anthropic"
    base_url: str | None
    model: str  # without its prefix
    label: str  # the usage label's provider part: "openai", "anthropic", "ollama", ...


class RequestBuilder:
    """A step's requests: its prompt, output type, instructions and settings; :meth:`build` one per item.

    :param template: the step's prompt template.
    :param output: the step's output type.
    :param instructions: the system instructions, the same for every item.
    :param settings: fields of the body (the provider's own names), the same for every item.
    :param structured: ``"json_schema"`` or ``"tools"``: see :class:`LLMRequest`.
    """

    def __init__(
        self,
        template: PromptTemplate,
        output: OutputSpec,
        instructions: str | None,
        settings: Mapping[str, Any],
        structured: str = "json_schema",
    ) -> None:
        self.template = template
        self.structured = structured
        self.output = output
        self.instructions = instructions
        self.settings = dict(settings)
        self.schema = answer_schema(output)
        self._system: tuple[Mapping[str, Any], ...] = (
            ({"role": "system", "content": instructions},) if instructions else ()
        )

    def build(
        self,
        item: Mapping[str, Any],
        fields: Mapping[str, Any],
        item_id: str,
        target: Target,
        settings: Mapping[str, Any] | None = None,
        sample: str | None = None,
    ) -> LLMRequest:
        """The request of ``item`` (its prompt rendered from its fields and ``fields`` of earlier steps) to
        ``target``; ``settings`` (the provider's names) replace the builder's; ``sample`` goes into its key.

        :raises PromptTemplateError: the prompt names a field the item lacks.
        """
        text = self.template.render(item, fields, item_id)
        return LLMRequest(
            provider=target.provider,
            base_url=target.base_url,
            model=target.model,
            messages=(*self._system, {"role": "user", "content": text}),
            schema=self.schema,
            settings=self.settings if settings is None else settings,
            structured=self.structured,
            sample=sample,
        )


def answer_schema(output: OutputSpec) -> dict[str, Any] | None:
    """The JSON schema of a structured answer (None: a plain text answer). A type that is not an object
    (``list[str]``, ``int``) is asked as an object of one property, the output field."""
    if output.kind == "text":
        return None
    if output.schema is not None:
        return output.schema
    from pydantic import TypeAdapter

    schema = TypeAdapter(output.output_type).json_schema()
    if output.kind in ("model", "structured"):
        return schema
    return {"type": "object", "properties": {output.output_field: schema}, "required": [output.output_field]}


#: pydantic-ai ModelSettings that configure the client or the call, not the body
_CLIENT_SETTINGS = frozenset({"max_retries", "request_timeout", "timeout", "extra_headers", "parallel_tool_calls"})


def wire_settings(provider: str, model_settings: Mapping[str, Any]) -> dict[str, Any]:
    """The body fields of pydantic-ai ``ModelSettings`` for ``provider``: the common ones as they are,
    ``stop_sequences`` as OpenAI's ``stop``, ``<provider>_<name>`` as ``<name>``, another provider's
    settings dropped, ``extra_body`` merged; the client's (timeouts, headers, retries) left out."""
    body: dict[str, Any] = {}
    other = "anthropic_" if provider == "openai" else "openai_"
    own = f"{provider}_"
    for key, value in model_settings.items():
        if key in _CLIENT_SETTINGS or key == "extra_body" or key.startswith(other):
            continue
        if key.startswith(own):
            body[key[len(own) :]] = value
        elif key == "stop_sequences" and provider == "openai":
            body["stop"] = value
        else:
            body[key] = value
    extra = model_settings.get("extra_body")
    if isinstance(extra, dict):
        body.update(extra)
    return body
