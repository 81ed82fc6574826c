"""The item page's exchanges: per attempt and step, each model request as sent and its reply as received.

The log records which requests an attempt made: each usage entry of the model step carries the
response-store keys of its calls (``"request_keys"``, core/ledger/records.py), a reused entry those
its answers were read by. The store holds the exchange itself (the request's canonical form and the
provider's raw reply, docs/guide/response-store.md), so the page reads every key of the item in one
:meth:`~airflow_provider_datagen.core.store.responses.ResponseStore.get_many`.

A page stays fast and small whatever was asked: each text shown (a message, the settings, the
schema, the reply) is cut at :data:`MAX_TEXT` characters with a "truncated" note, a stored JSON text
larger than :data:`MAX_PARSED` is shown raw (cut) instead of parsed and pretty-printed, and a page
shows at most :data:`MAX_EXCHANGES` exchanges. A store that cannot be read never breaks the page: it
says "response store unavailable" and why. Everything returned is JSON-able (the ``/api`` twin shows
the same); the template escapes it (Jinja2 autoescape).
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from airflow_provider_datagen.core import EventType
from airflow_provider_datagen.core.ledger.records import REQUEST_KEY
from airflow_provider_datagen.core.schema import STORED_STATUS_TRANSIENT
from airflow_provider_datagen.exceptions import DatagenError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

    from airflow_provider_datagen.core import Event
    from airflow_provider_datagen.core.store.responses import ResponseEntry

logger = logging.getLogger(__name__)

#: the most characters of one text an exchange shows (the rest is cut, with a note)
MAX_TEXT = 64 * 1024
#: a stored JSON text above this many characters is shown raw (cut), not parsed and pretty-printed
MAX_PARSED = 1024 * 1024
#: the most exchanges one item page shows (the rest is counted)
MAX_EXCHANGES = 200
_USAGE_TYPES = (EventType.STEP_COMPLETED, EventType.FAILED)


class StoreUnavailable(Exception):
    """The response store cannot answer the page (e.g. there is none under the root): its message says why."""


def unavailable_reason(exc: BaseException) -> str:
    """Why a store could not be read, for the page: our errors' own messages, others' with their type."""
    text = str(exc)[:500]
    return text if isinstance(exc, (DatagenError, StoreUnavailable)) else f"{type(exc).__name__}: {text}"


def logged_exchanges(events: Iterable[Event]) -> list[dict[str, Any]]:
    """The requests the log says ``events``' attempts made: one row per key, in the log's order.

    Each row: ``attempt``, ``step``, ``status`` (completed, transient, failed), ``model``, ``key``
    and ``reused``. An older log's entries (no ``"request_keys"``) give none, nor does a value that
    is not a key (only a hand-written log holds one).
    """
    rows: list[dict[str, Any]] = []
    for ev in events:
        if ev.event_type not in _USAGE_TYPES or not ev.value_json or '"request_keys"' not in ev.value_json:
            continue
        try:
            record = json.loads(ev.value_json)
        except ValueError:
            continue
        entries = record.get("usage") if isinstance(record, dict) else None
        if not isinstance(entries, list):
            continue
        if ev.event_type is EventType.STEP_COMPLETED:
            status = "completed"
        else:
            status = "transient" if ev.status == STORED_STATUS_TRANSIENT else "failed"
        for entry in entries:
            keys = entry.get("request_keys") if isinstance(entry, dict) else None
            if not isinstance(keys, list):
                continue
            for key in keys:
                if isinstance(key, str) and REQUEST_KEY.fullmatch(key):
                    rows.append(
                        {
                            "attempt": record.get("attempt"),
                            "step": ev.step,
                            "status": status,
                            "model": entry.get("model"),
                            "key": key,
                            "reused": entry.get("reused") is True,
                        }
                    )
    return rows


def capped(text: str) -> dict[str, Any]:
    """``{"text", "truncated", "chars"}``: ``text`` cut at :data:`MAX_TEXT` characters."""
    return {"text": text[:MAX_TEXT], "truncated": len(text) > MAX_TEXT, "chars": len(text)}


def pretty(value: Any) -> dict[str, Any]:
    """A JSON value pretty-printed, :func:`capped`."""
    return capped(json.dumps(value, ensure_ascii=False, indent=2, sort_keys=True, default=str))


def _parsed(text: str | None) -> tuple[Any, dict[str, Any] | None]:
    """(the parsed JSON or None, the text to show): parsed and pretty when it is small enough."""
    if text is None:
        return None, None
    if len(text) > MAX_PARSED:
        return None, capped(text)
    try:
        value = json.loads(text)
    except ValueError:
        return None, capped(text)
    return value, pretty(value)


def request_view(request_json: str | None) -> dict[str, Any] | None:
    """The request as sent (its canonical form, :meth:`LLMRequest.canonical`): whom it asked, the
    messages (a text content as it is, other content as JSON), the settings and the output schema."""
    value, shown = _parsed(request_json)
    if shown is None:
        return None
    if not isinstance(value, dict):
        return {"raw": shown, "messages": None}
    messages = []
    for m in value.get("messages") or []:
        content = m.get("content") if isinstance(m, dict) else m
        messages.append(
            {
                "role": m.get("role") if isinstance(m, dict) else None,
                "content": capped(content) if isinstance(content, str) else pretty(content),
            }
        )
    schema = value.get("schema")
    return {
        "raw": shown,
        "provider": value.get("provider"),
        "base_url": value.get("base_url"),
        "model": value.get("model"),
        "structured": value.get("structured"),
        "sample": value.get("sample"),
        "messages": messages,
        "settings": pretty(value.get("settings") or {}),
        "schema": None if schema is None else pretty(schema),
    }


def exchange_view(
    row: Mapping[str, Any], entry: ResponseEntry | None, pipeline: str, experiment: str
) -> dict[str, Any]:
    """One logged request (:func:`logged_exchanges`) with what the store holds of it."""
    out: dict[str, Any] = {**row, "stored": entry is not None}
    if entry is None:
        return out
    made = entry.describe()
    _, reply = _parsed(entry.reply_json)
    out.update(
        request=request_view(entry.request_json),
        reply=reply,
        input_tokens=entry.input_tokens,
        output_tokens=entry.output_tokens,
        cost_usd=entry.cost_usd,
        made_by={"pipeline": made["pipeline"], "experiment": made["experiment"], "created_at": made["created_at"]},
        # a sent request whose key another experiment had stored (reuse=False): its own reply was not
        # stored again, so the reply shown is that experiment's
        other_reply=not row["reused"] and (entry.pipeline, entry.experiment) != (pipeline, experiment),
    )
    return out


def item_exchanges(
    logged: list[dict[str, Any]],
    lookup: Callable[[list[str]], dict[str, ResponseEntry]] | None,
    pipeline: str,
    experiment: str,
    unavailable: str | None = None,
) -> dict[str, Any]:
    """The item page's exchanges: ``logged`` (:func:`logged_exchanges`) looked up in the store at once.

    :param lookup: the store's ``get_many`` (None: the store could not be opened, ``unavailable`` says why).
    :returns: ``{"available", "message", "total", "attempts": [{"attempt", "step", "status", "exchanges"}]}``.
    """
    shown = logged[:MAX_EXCHANGES]
    found: dict[str, ResponseEntry] = {}
    message = unavailable
    if shown and lookup is not None and message is None:
        try:
            found = lookup(list(dict.fromkeys(r["key"] for r in shown)))
        except Exception as exc:  # unreachable, damaged, no credentials: the rest of the page still shows
            logger.warning("item page: the response store cannot be read: %s", exc)
            message = unavailable_reason(exc)
    attempts: list[dict[str, Any]] = []
    for row in shown:
        group = (row["attempt"], row["step"], row["status"])
        if not attempts or (attempts[-1]["attempt"], attempts[-1]["step"], attempts[-1]["status"]) != group:
            attempts.append({"attempt": group[0], "step": group[1], "status": group[2], "exchanges": []})
        attempts[-1]["exchanges"].append(exchange_view(row, found.get(row["key"]), pipeline, experiment))
    return {
        "available": message is None,
        "message": None if message is None else f"response store unavailable: {message}",
        "total": len(logged),
        "shown": len(shown),
        "attempts": attempts,
    }
