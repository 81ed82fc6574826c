"""The model step's use of the response store: a stored reply instead of a request, and one request per key.

:class:`Replies` answers one request of the ``sdk`` engine (docs/guide/response-store.md):

1. with ``reuse=True``, the run's store is looked up by the request's key (:meth:`LLMRequest.key
   <airflow_provider_datagen.llm.request.LLMRequest.key>`) before any rate-limit slot is taken: a
   stored reply is the answer (no request, no slot, no budget), recorded with ``ctx.record_reused``
   (with its key, so the item page shows the exchange);
2. a request of the same key already in flight in this task (another item asking the same) is waited
   for and counts as reused (single flight);
3. otherwise the request is sent (its slot taken then) and its 2xx reply queued for the store
   (``reuse=False`` too: the reply is still stored, unless its key is). A failed request (429, 4xx, 5xx, a timeout)
   raises before anything is stored. The :class:`Reply` carries the key: the engine records the
   reply's usage with it (``ctx.record_usage(..., request_key=reply.key)``).

Outside a run of ``run_items`` (no response session) every request is sent and nothing is stored.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_provider_datagen.core.response_session import current_session

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from airflow_provider_datagen.core.response_session import ResponseSession
    from airflow_provider_datagen.core.store.responses import ResponseEntry
    from airflow_provider_datagen.llm.request import LLMRequest


@dataclass(frozen=True)
class Reply:
    """One request's reply: the provider's object, its usage, and the stored entry it came from (if reused)."""

    reply: Any
    model: str
    input_tokens: int
    output_tokens: int
    #: the entry it was read from (None: the request was sent for it)
    reused_from: ResponseEntry | None = None
    #: the request's key in the response store (None: outside a run, no store); the engine records
    #: a sent reply's usage with it (``ctx.record_usage(..., request_key=)``) for the item page
    key: str | None = None


class Replies:
    """The replies of one step's requests on one event loop (see the module).

    :param reuse: answer from the store when the key is there.
    :param parse: the provider's reply object of its stored JSON.
    :param usage: ``(usage label, input tokens, output tokens)`` of a reply.
    """

    def __init__(
        self, reuse: bool, parse: Callable[[str], Any], usage: Callable[[Any], tuple[str, int, int] | None]
    ) -> None:
        self.reuse = reuse
        self._parse = parse
        self._usage = usage
        #: the requests in flight by key: their reply's entry, or None when the request failed
        self._inflight: dict[str, asyncio.Future[ResponseEntry | None]] = {}
        self._lookups: _Lookups | None = None

    def _lookup(self, session: ResponseSession, key: str) -> Awaitable[ResponseEntry | None]:
        lookups = self._lookups
        if lookups is None or lookups.session is not session:
            lookups = self._lookups = _Lookups(session)
        return lookups.get(key)

    async def get(self, request: LLMRequest, ctx: Any, send: Callable[[], Awaitable[Any]]) -> Reply:
        """The reply of ``request``: stored, shared with a request in flight, or sent (``send`` takes the slot)."""
        session = current_session()
        if session is None:
            return self._sent(await send())
        key = request.key()
        while self.reuse:
            entry = await self._lookup(session, key)
            if entry is None:
                pending = self._inflight.get(key)
                if pending is None:
                    break
                entry = await asyncio.shield(pending)
                if entry is None:  # that request failed: ask again (or wait for the next one asking)
                    continue
            return self._reused(entry, ctx, key)
        future: asyncio.Future[ResponseEntry | None] = asyncio.get_running_loop().create_future()
        self._inflight.setdefault(key, future)
        entry = None
        try:
            reply = await send()
            got = self._sent(reply, key)
            entry = _entry(key, request, got, session)
            # one entry per key: with reuse=False the key may be stored already (not stored again)
            if self.reuse or await self._lookup(session, key) is None:
                session.put(entry)
            return got
        finally:
            if self._inflight.get(key) is future:
                del self._inflight[key]
            future.set_result(entry)

    def _sent(self, reply: Any, key: str | None = None) -> Reply:
        usage = self._usage(reply)
        model, tokens_in, tokens_out = usage if usage is not None else ("", 0, 0)
        return Reply(reply, model, tokens_in, tokens_out, key=key)

    def _reused(self, entry: ResponseEntry, ctx: Any, key: str) -> Reply:
        reply = self._parse(entry.reply_json)
        if entry.model:
            ctx.record_reused(entry.model, entry.input_tokens, entry.output_tokens, entry.cost_usd, request_key=key)
        return Reply(reply, entry.model, entry.input_tokens, entry.output_tokens, entry, key)


class _Lookups:
    """The store's lookups of the items on one event loop, coalesced: the keys asked while a read is in
    flight (hundreds at 256 in flight) are read together by the next one, in a worker thread."""

    def __init__(self, session: ResponseSession) -> None:
        self.session = session
        self._waiting: dict[str, list[asyncio.Future[ResponseEntry | None]]] = {}
        self._reader: asyncio.Task[None] | None = None

    async def get(self, key: str) -> ResponseEntry | None:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[ResponseEntry | None] = loop.create_future()
        self._waiting.setdefault(key, []).append(future)
        if self._reader is None:
            self._reader = loop.create_task(self._read())
        return await future

    async def _read(self) -> None:
        try:
            await asyncio.sleep(0)  # the items started in this loop iteration ask too
            while self._waiting:
                batch, self._waiting = self._waiting, {}
                try:
                    found = await asyncio.to_thread(self.session.lookup_many, list(batch))
                except BaseException as exc:
                    for futures in batch.values():
                        for f in futures:
                            if not f.done():
                                f.set_exception(exc)
                    continue
                for key, futures in batch.items():
                    for f in futures:
                        if not f.done():
                            f.set_result(found.get(key))
        finally:
            self._reader = None


def _entry(key: str, request: LLMRequest, got: Reply, session: Any) -> ResponseEntry:
    from airflow_provider_datagen.core.ledger.pricing import price_usd
    from airflow_provider_datagen.core.store.responses import ResponseEntry

    reply = got.reply
    dump = getattr(reply, "model_dump_json", None)
    raw = dump(exclude_unset=True) if callable(dump) else json.dumps(reply, default=str)
    cost = price_usd(got.model, got.input_tokens, got.output_tokens) if got.model else None
    return ResponseEntry(
        key=key,
        reply_json=raw,
        model=got.model,
        input_tokens=got.input_tokens,
        output_tokens=got.output_tokens,
        cost_usd=cost,
        request_json=json.dumps(request.canonical(), sort_keys=True, default=str),
        pipeline=session.pipeline,
        experiment=session.experiment,
    )
