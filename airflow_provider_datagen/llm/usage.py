"""Usage of a model step's run, read from the model's replies and recorded on the item's context.

Every reply (``ModelResponse``) of a pydantic-ai run carries the tokens of its request and the
provider and model that answered (with a fallback chain, not necessarily the configured one). The
step records one ``ctx.record_usage`` per model, ``calls`` being its replies; the price is left to
the ledger (``cost_usd=None``: priced from the model name), so there is one price table.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

#: the response-store key of the request being sent (set by the store's wrapper around the slot's model,
#: read when its reply's usage is recorded), so the item page finds the exchange of a sent request too
_REQUEST_KEY: ContextVar[str | None] = ContextVar("datagen_request_key", default=None)


@contextlib.contextmanager
def sending(key: str | None) -> Iterator[None]:
    """The request of ``key`` is being sent in this context: its reply's usage is recorded with the key."""
    token = _REQUEST_KEY.set(key)
    try:
        yield
    finally:
        _REQUEST_KEY.reset(token)


def model_label(response: Any) -> str:
    """``"provider:model"`` of a reply, the form prices are looked up by: the provider and the model as the
    provider reported it (``"openai:gpt-4o-mini-2024-07-18"``); without a provider (a test model), the
    model as configured (``"function:fake"``)."""
    provider = getattr(response, "provider_name", None)
    model = response.model_name
    if provider and model:
        return model if model.startswith(f"{provider}:") else f"{provider}:{model}"
    return getattr(response, "model_id", None) or model or "unknown"


def usage_by_model(messages: Iterable[Any]) -> dict[str, tuple[int, int, int]]:
    """``{model label: (input_tokens, output_tokens, replies)}`` over the replies among ``messages``."""
    totals: dict[str, tuple[int, int, int]] = {}
    for message in messages:
        if getattr(message, "kind", None) != "response":  # requests carry no usage
            continue
        label = model_label(message)
        usage = message.usage
        i, o, n = totals.get(label, (0, 0, 0))
        totals[label] = (i + int(usage.input_tokens or 0), o + int(usage.output_tokens or 0), n + 1)
    return totals


def record_usage(ctx: Any, messages: Iterable[Any]) -> None:
    """Record the usage of ``messages``' replies on ``ctx``, one call per model (nothing if none replied)."""
    key = _REQUEST_KEY.get()
    # the key only when there is one: a test's context may not take it
    extra = {"request_key": key} if key is not None else {}
    for label, (input_tokens, output_tokens, calls) in usage_by_model(messages).items():
        ctx.record_usage(model=label, input_tokens=input_tokens, output_tokens=output_tokens, calls=calls, **extra)
