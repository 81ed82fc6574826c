"""A stand-in for the runner's ItemContext that records ``record_usage`` calls (the model step's tests)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping


class RecordingContext:
    """What a model step reads from ``ctx`` (``item_id``, ``fields``), the ``record_usage`` calls it made and
    the requests it counted (``take_request_slot``/``_async``; no rate limit to wait for).

    ``record_usage`` has the runner's signature, so a call the real context would refuse fails here too.
    """

    def __init__(self, item_id: str = "k1", fields: Mapping[str, Any] | None = None) -> None:
        self.item_id = item_id
        self.fields: Mapping[str, Any] = dict(fields or {})
        self.usage: list[dict[str, Any]] = []
        self.requests = 0

    def take_request_slot(self) -> None:
        self.requests += 1

    async def take_request_slot_async(self) -> None:
        self.requests += 1

    def record_usage(
        self,
        model: str,
        input_tokens: int = 0,
        output_tokens: int = 0,
        cost_usd: float | None = None,
        calls: int = 1,
        request_key: str | None = None,
    ) -> None:
        self.usage.append(
            {
                "model": model,
                "input_tokens": input_tokens,
                "output_tokens": output_tokens,
                "cost_usd": cost_usd,
                "calls": calls,
                **({} if request_key is None else {"request_key": request_key}),
            }
        )
