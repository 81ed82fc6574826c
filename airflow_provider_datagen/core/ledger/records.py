"""What ``ctx.record_usage`` keeps (:class:`UsageRecord`) and the entries an attempt's row stores.

An attempt's usage goes into the JSON value of the event that ends the attempt: its STEP_COMPLETED,
or its FAILED row (transient or not), as ``{"attempt": n, "usage": [entry, ...]}`` with one entry
per model (see docs/adr/0011-usage-ledger.md)::

    {"model": "openai:gpt-5-mini", "calls": 2, "input_tokens": 1624, "output_tokens": 480,
     "cost_usd": 0.001366, "unpriced_calls": 0}

``cost_usd`` sums the priced calls (None when none was priced); ``unpriced_calls`` counts the others.
An entry of calls whose requests have a response-store key (the model step's) also stores
``"request_keys": [key, ...]``, one per call in the order they were made (a reused entry's: the keys
its answers were read by), so the item page can show each exchange; the sums never read it, and an
older entry without it is read as before.
An attempt whose process counted its model requests (``ctx.take_request_slot``, one per HTTP
request, failed ones included) also stores ``"requests": k``, also when it recorded no usage (its
FAILED row then stores ``{"attempt": n, "transient": ..., "requests": k}``); without the key the
ledger counts the entries' ``calls`` as requests (older logs, processes that take no slot per request).

Values are bounded per call (:data:`MAX_TOKENS`, :data:`MAX_COST_USD`): a larger one is a
:class:`~airflow_provider_datagen.exceptions.UsageValueError` and the item fails with it.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any, NamedTuple

from airflow_provider_datagen.core.ledger.pricing import price_usd
from airflow_provider_datagen.exceptions import UsageValueError, bad_argument

if TYPE_CHECKING:
    from collections.abc import Iterable

_OWNER = "ctx.record_usage"
#: the most characters of a model name (a longer one is not a name)
MAX_MODEL = 200
#: the most tokens (input or output) one call may record: no model reads or writes a trillion
MAX_TOKENS = 10**12
#: the most USD one call may record
MAX_COST_USD = 10**6
#: a response-store key (:meth:`LLMRequest.key <airflow_provider_datagen.llm.request.LLMRequest.key>`)
REQUEST_KEY = re.compile(r"[0-9a-f]{64}")


class AttemptUsage(list["UsageRecord"]):
    """What one attempt recorded: its :class:`UsageRecord` list, and the model requests it sent.

    ``requests`` counts ``ctx.take_request_slot`` calls (a process that takes its own slots, e.g. the
    model step: one per HTTP request, failed ones included); 0 means "not counted", and the ledger
    then counts the records' ``calls``.
    """

    __slots__ = ("requests",)

    def __init__(self) -> None:
        super().__init__()
        self.requests = 0

    def __bool__(self) -> bool:
        # an attempt that recorded nothing but sent requests still has something to store
        return bool(len(self)) or self.requests > 0


class UsageRecord(NamedTuple):
    """One ``ctx.record_usage`` call, checked and priced."""

    model: str
    calls: int
    input_tokens: int
    output_tokens: int
    #: the caller's cost, else the genai-prices price; None: unpriced
    cost_usd: float | None
    #: answered from the response store (no request was sent; ``cost_usd`` is 0)
    reused: bool = False
    #: a reused answer's stored cost: what reusing it saved (None: the original was unpriced)
    saved_usd: float | None = None
    #: the response-store key of the call's request (None: not known, or not one request)
    request_key: str | None = None

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens


def _count(param: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise bad_argument(_OWNER, param, value, f"is not an int >= {low}", "give the count the model reported")
    return value


def _too_large(param: str, value: Any, limit: int, unit: str, calls: int) -> UsageValueError:
    # a value no model reports: a unit mix-up or a corrupt response; stored, it would swamp the ledger
    per = "one call" if calls == 1 else f"{calls} calls"
    return UsageValueError(
        f"{_OWNER}: {param}={value!r} is above the most {per} may record ({limit * calls:,} {unit}); "
        f"record the {unit} the model reported for this call (a larger value is a bug in the caller)"
    )


def _request_key(key: Any, calls: int) -> str | None:
    if key is None:
        return None
    if not isinstance(key, str) or not REQUEST_KEY.fullmatch(key):
        raise bad_argument(
            _OWNER,
            "request_key",
            key,
            "is not a request key",
            "give LLMRequest.key() (64 lowercase hex digits), or None",
        )
    if calls != 1:
        raise bad_argument(
            _OWNER, "request_key", key, f"names one request but calls={calls}", "record each request's call on its own"
        )
    return key


def usage_record(
    model: Any, input_tokens: Any, output_tokens: Any, cost_usd: Any, calls: Any, request_key: Any = None
) -> UsageRecord:
    """A :class:`UsageRecord` of the arguments, checked; priced with genai-prices unless ``cost_usd`` is given."""
    if not isinstance(model, str) or not model or len(model) > MAX_MODEL:
        raise bad_argument(
            _OWNER, "model", model, "is not a model name", "give the model's name, e.g. 'openai:gpt-5-mini'"
        )
    calls = _count("calls", calls, 1)
    key = _request_key(request_key, calls)
    input_tokens = _count("input_tokens", input_tokens, 0)
    output_tokens = _count("output_tokens", output_tokens, 0)
    for param, value in (("input_tokens", input_tokens), ("output_tokens", output_tokens)):
        if value > MAX_TOKENS * calls:
            raise _too_large(param, value, MAX_TOKENS, "tokens", calls)
    if cost_usd is not None:
        if isinstance(cost_usd, bool) or not isinstance(cost_usd, (int, float)) or not math.isfinite(cost_usd):
            raise bad_argument(_OWNER, "cost_usd", cost_usd, "is not a number", "give the cost in USD, or None")
        if cost_usd < 0:
            raise bad_argument(_OWNER, "cost_usd", cost_usd, "is negative", "give the cost in USD, or None")
        if cost_usd > MAX_COST_USD * calls:
            raise _too_large("cost_usd", cost_usd, MAX_COST_USD, "USD", calls)
        cost: float | None = float(cost_usd)
    else:
        cost = price_usd(model, input_tokens, output_tokens)
    return UsageRecord(model, calls, input_tokens, output_tokens, cost, request_key=key)


def reused_record(
    model: Any, input_tokens: Any, output_tokens: Any, saved_usd: Any, request_key: Any = None
) -> UsageRecord:
    """The :class:`UsageRecord` of one answer read from the response store: its stored tokens, cost 0,
    and its stored cost as ``saved_usd`` (None: unpriced, saving nothing)."""
    cost = saved_usd if saved_usd is not None else 0.0
    checked = usage_record(model, input_tokens, output_tokens, cost, 1, request_key)
    return checked._replace(cost_usd=0.0, reused=True, saved_usd=None if saved_usd is None else checked.cost_usd)


def attempt_entries(records: Iterable[UsageRecord]) -> list[dict[str, Any]]:
    """The stored entries of one attempt's records: one per model, in the order models were first seen;
    a model's reused answers (:func:`reused_record`) in an entry of their own, ``"reused": True``; the
    records' request keys, where known, as the entry's ``"request_keys"``."""
    by_model: dict[tuple[str, bool], dict[str, Any]] = {}
    for r in records:
        e = by_model.get((r.model, r.reused))
        if e is None:
            e = by_model[(r.model, r.reused)] = {
                "model": r.model,
                "calls": 0,
                "input_tokens": 0,
                "output_tokens": 0,
                "cost_usd": None,
                "unpriced_calls": 0,
            }
            if r.reused:
                e["reused"], e["saved_usd"] = True, None
        if r.reused and r.saved_usd is not None:
            e["saved_usd"] = (e["saved_usd"] or 0.0) + r.saved_usd
        if r.request_key is not None:
            keys = e.get("request_keys")
            if keys is None:
                e["request_keys"] = [r.request_key]
            else:
                keys.append(r.request_key)
        e["calls"] += r.calls
        e["input_tokens"] += r.input_tokens
        e["output_tokens"] += r.output_tokens
        if r.cost_usd is None:
            e["unpriced_calls"] += r.calls
        else:
            e["cost_usd"] = (e["cost_usd"] or 0.0) + r.cost_usd
    return list(by_model.values())
