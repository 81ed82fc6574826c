"""The response store on the ``engine="pydantic-ai"`` executor: each model request the agent makes goes
through :class:`~airflow_provider_datagen.llm.reuse.Replies`, as the sdk engine's do.

:class:`StoreModel` wraps the agent's model (outside :class:`~airflow_provider_datagen.llm.slots.SlotModel`,
so a stored reply takes no rate-limit slot). Each ``request`` is keyed by :class:`AgentRequest`, the
request's canonical form as pydantic-ai hands it to the model: provider, base URL, model, the message
history (an output-validation retry's earlier turns included), the tools and output schema, the settings
without the transport-only ones, and the item's ``sample``. A stored key is answered with the stored
``ModelResponse`` (no request, no slot, no budget: ``ctx.record_reused``); identical keys in flight are
sent once; a 2xx reply is stored, a failed request never (docs/guide/response-store.md, "The
pydantic-ai engine's key").

Not stored: streamed requests (``agent.run_stream``, an ``event_stream_handler``), and pydantic-ai's
in-process models (``TestModel``, ``FunctionModel``), whose answers are code that may change under
the same name.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
from typing import TYPE_CHECKING, Any, cast

from pydantic import TypeAdapter
from pydantic_ai.messages import ModelMessagesTypeAdapter, ModelResponse
from pydantic_ai.models import ModelRequestParameters
from pydantic_ai.models.fallback import FallbackModel
from pydantic_ai.models.wrapper import WrapperModel

from airflow_provider_datagen.core.response_session import current_session
from airflow_provider_datagen.llm.request import TRANSPORT_SETTINGS, _stable_value
from airflow_provider_datagen.llm.reuse import Replies
from airflow_provider_datagen.llm.usage import model_label, sending

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

    from pydantic_ai.models import Model

#: the version of :meth:`AgentRequest.canonical`'s form: a change is a migration of the store
AGENT_KEY_VERSION = 1
#: pydantic-ai's models that answer in this process (no server, nothing paid): never stored
LOCAL_SYSTEMS = frozenset({"test", "function"})
#: settings never in the key: the transport-only ones (the sdk engine's list) and the HTTP headers
_UNKEYED_SETTINGS = TRANSPORT_SETTINGS | {"extra_headers"}
#: fields of a message that are never sent to the model, or differ per run or time (pydantic-ai's docs)
_MESSAGE_UNSENT = frozenset(
    {
        "timestamp",
        "run_id",
        "conversation_id",
        "metadata",
        "usage",
        "model_id",
        "provider_url",
        "provider_details",
        "provider_response_id",
        "finish_reason",
        "history_digest",
        "failed_attempts",
        "workspace_ref",
    }
)
#: fields of a message's part never sent: its time, and the application's metadata
_PART_UNSENT = frozenset({"timestamp", "metadata"})
#: fields of the request parameters left out: the instructions are in the messages already (these name
#: the code that made them), and the rest is pydantic-ai's bookkeeping of tools shown and deferred
_PARAMETERS_UNSENT = frozenset(
    {"instruction_parts", "revealed_tool_names", "introduced_tool_names", "deferred_capability_ids"}
)
#: fields of a tool definition never sent: how and where pydantic-ai runs the tool
_TOOL_UNSENT = frozenset({"sequential", "metadata", "timeout", "toolset_id", "capability_id"})
#: the fields that tell pydantic-ai's unions apart: kept even at their default
_DISCRIMINATORS = frozenset({"kind", "part_kind"})

_RESPONSE = TypeAdapter(ModelResponse)
_PARAMETERS = TypeAdapter(ModelRequestParameters)

#: (the item's context, its rendered sample) while an item's agent run is in progress in this task
_ITEM: contextvars.ContextVar[tuple[Any, str | None] | None] = contextvars.ContextVar(
    "datagen_agent_item", default=None
)


@contextlib.contextmanager
def item_request(ctx: Any, sample: str | None) -> Iterator[None]:
    """Within the block the agent's requests are ``ctx``'s item's, keyed with ``sample``."""
    token = _ITEM.set((ctx, sample))
    try:
        yield
    finally:
        _ITEM.reset(token)


def agent_replies(reuse: bool) -> Replies:
    """The :class:`Replies` of an agent's requests (one per agent: single flight is per event loop)."""
    return Replies(reuse, _parse, _usage)


def with_store(model: Model, replies: Replies) -> Model:
    """``model`` answering from the store (``model`` already takes slots: :func:`~.slots.with_slots`); each
    model of a fallback chain on its own, since each sends its own request to its own server."""
    if isinstance(model, FallbackModel):
        model.models = [with_store(m, replies) for m in model.models]
        return model
    if isinstance(model, StoreModel) or model.system in LOCAL_SYSTEMS:
        return model
    return StoreModel(model, replies)


class StoreModel(WrapperModel):
    """A model whose requests are answered from the response store when their key is there (see the module).

    :param wrapped: the model (a :class:`~.slots.SlotModel`: the slot is taken only when a request is sent).
    :param replies: the agent's :class:`Replies` (``reuse``, the in-flight keys).
    """

    def __init__(self, wrapped: Model, replies: Replies) -> None:
        super().__init__(wrapped)
        self.replies = replies

    async def request(self, messages: Any, model_settings: Any, model_request_parameters: Any) -> Any:
        item = _ITEM.get()
        # the agent used outside an item's run, or a run without a store: nothing to key (as the sdk engine)
        if item is None or current_session() is None:
            return await self.wrapped.request(messages, model_settings, model_request_parameters)
        ctx, sample = item
        wrapped = self.wrapped
        request = AgentRequest(
            wrapped.system,
            wrapped.base_url,
            wrapped.model_name,
            messages,
            model_settings,
            model_request_parameters,
            sample,
        )

        async def send() -> _Stored:
            with sending(request.key()):  # the slot's model records the reply's usage with its key
                return _Stored(await wrapped.request(messages, model_settings, model_request_parameters))

        # Replies asks of a request only its key() and canonical() (typed as the sdk engine's LLMRequest)
        got = await self.replies.get(cast("Any", request), ctx, send)
        return got.reply.response


class AgentRequest:
    """One request of the agent as its model receives it: :meth:`canonical` and :meth:`key` for the store.

    :param provider: the model's provider name (pydantic-ai's ``Model.system``: ``"openai"``, ``"anthropic"``).
    :param base_url: the server's base URL (None: the provider's own).
    :param model: the model's name as the provider knows it.
    :param messages: the message history as pydantic-ai sends it (``ModelMessage`` objects).
    :param settings: the request's ``ModelSettings`` (the agent's and the model's, merged).
    :param parameters: the request's ``ModelRequestParameters`` (tools, output mode and schema).
    :param sample: the item's rendered ``sample=`` (None: no sample); in the key only, never sent.
    """

    def __init__(
        self,
        provider: str,
        base_url: str | None,
        model: str,
        messages: list[Any],
        settings: Mapping[str, Any] | None,
        parameters: ModelRequestParameters,
        sample: str | None = None,
    ) -> None:
        self.provider = provider
        self.base_url = base_url
        self.model = model
        self.messages = messages
        self.settings = settings
        self.parameters = parameters
        self.sample = sample
        #: computed once, when the key is first asked (before the request is awaited: the agent appends
        #: to the same history afterwards)
        self._canonical: dict[str, Any] | None = None
        self._key: str | None = None

    def canonical(self) -> dict[str, Any]:
        """The request's canonical form (docs/guide/response-store.md): nothing of the item id, the experiment,
        the attempt, the time or the code's layout; a field at its default is left out, so a pydantic-ai
        release adding a field does not change the keys."""
        if self._canonical is None:
            self._canonical = self._canonical_form()
        return self._canonical

    def _canonical_form(self) -> dict[str, Any]:
        full = ModelMessagesTypeAdapter.dump_python(self.messages, mode="json", fallback=_stable_value)
        lean = ModelMessagesTypeAdapter.dump_python(
            self.messages, mode="json", exclude_defaults=True, fallback=_stable_value
        )
        messages = [_sent_message(m) for m in _without_defaults(full, lean)]
        full = _PARAMETERS.dump_python(self.parameters, mode="json", fallback=_stable_value)
        lean = _PARAMETERS.dump_python(self.parameters, mode="json", exclude_defaults=True, fallback=_stable_value)
        parameters = {k: v for k, v in _without_defaults(full, lean).items() if k not in _PARAMETERS_UNSENT}
        for tools in ("function_tools", "output_tools"):
            if tools in parameters:
                parameters[tools] = [_dropping(t, _TOOL_UNSENT) for t in parameters[tools]]
        return {
            "key_version": AGENT_KEY_VERSION,
            "engine": "pydantic-ai",
            "provider": self.provider,
            "base_url": self.base_url.rstrip("/") if self.base_url else None,
            "model": self.model,
            "messages": messages,
            "parameters": parameters,
            "settings": {k: v for k, v in (self.settings or {}).items() if k not in _UNKEYED_SETTINGS},
            "sample": self.sample,
        }

    def key(self) -> str:
        """The SHA-256 (hex) of :meth:`canonical` as canonical JSON, as ``LLMRequest.key`` digests its form
        (computed once: the store's lookup and the usage record of a sent request both ask)."""
        if self._key is None:
            self._key = self._digest()
        return self._key

    def _digest(self) -> str:
        text = json.dumps(
            self.canonical(), sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_stable_value
        )
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


class _Stored:
    """A reply as :class:`Replies` stores it: the ``ModelResponse`` and its JSON (``model_dump_json``)."""

    def __init__(self, response: ModelResponse) -> None:
        self.response = response

    def model_dump_json(self, **_: Any) -> str:
        return _RESPONSE.dump_json(self.response).decode()


def _parse(text: str) -> _Stored:
    """A stored reply's ``ModelResponse``, field for field the one received."""
    return _Stored(_RESPONSE.validate_json(text))


def _usage(reply: _Stored) -> tuple[str, int, int]:
    """(usage label, input tokens, output tokens) of a reply, as :func:`~.usage.record_usage` records them."""
    response = reply.response
    return model_label(response), int(response.usage.input_tokens or 0), int(response.usage.output_tokens or 0)


def _without_defaults(full: Any, lean: Any) -> Any:
    """``full`` (a JSON dump) without the fields ``lean`` (the same dump with ``exclude_defaults``) left out,
    but with the union discriminators, which ``exclude_defaults`` drops too."""
    if isinstance(full, dict):
        kept = lean if isinstance(lean, dict) else {}
        return {k: _without_defaults(v, kept.get(k, v)) for k, v in full.items() if k in kept or k in _DISCRIMINATORS}
    if isinstance(full, list) and isinstance(lean, list) and len(lean) == len(full):
        return [_without_defaults(f, g) for f, g in zip(full, lean, strict=True)]
    return full


def _sent_message(message: dict[str, Any]) -> dict[str, Any]:
    """A message's fields as sent: its own and its parts' (the parts' content as it is, however nested)."""
    kept = _dropping(message, _MESSAGE_UNSENT)
    if isinstance(kept.get("parts"), list):
        kept["parts"] = [_dropping(p, _PART_UNSENT) if isinstance(p, dict) else p for p in kept["parts"]]
    return kept


def _dropping(fields: dict[str, Any], names: frozenset[str]) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if k not in names}
