"""What a step function sees besides its item (:class:`ItemContext`), and one item being driven (:class:`WorkItem`).

A replayed item starts from the fields, field modes and frames its unacknowledged attempt recorded,
so its steps see what they saw before the crash (see docs/design.md, Resume).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from airflow_provider_datagen.core.events import BlobRef, encode_value
from airflow_provider_datagen.core.ledger.records import AttemptUsage, reused_record, usage_record
from airflow_provider_datagen.core.runner.contract import check_field
from airflow_provider_datagen.core.schema import ItemStatus
from airflow_provider_datagen.exceptions import InvalidEventError, ProcessError

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping
    from collections.abc import Set as AbstractSet

    from airflow_provider_datagen.core.events import StepCoord
    from airflow_provider_datagen.core.fold import ItemState

#: a fresh item's fields and field modes: read-only here (ItemContext copies modes before writing)
NO_FIELDS: Mapping[str, Any] = MappingProxyType({})


class AttemptRecord:
    """What one call of a step staged through its :class:`ItemContext`, read by the runner as the call ends.

    The context's public methods write it (``set``/``append``/``filter``/``record_usage``/
    ``take_request_slot``); the drivers read it and bind the rate limit into it. Most steps never
    write through the context, so the fields start as shared class defaults and become the record's
    own on first use (one record is built per step and item).
    """

    #: the field writes, in order: ("set" | "append", name, value)
    ops: list[tuple[str, str, Any]] | tuple[()] = ()
    #: (True, reason) once the step called ``ctx.filter``
    filtered: tuple[bool, Any] = (False, None)
    #: what ``record_usage`` recorded and the requests ``take_request_slot`` counted (staged with the
    #: row that ends the attempt), or None
    usage: AttemptUsage | None = None
    #: set by :meth:`end`: nothing more is stored
    ended = False
    #: with a rate limit: charges recorded usage to it as it becomes known (``RunUsage.charge``)
    charge: Callable[..., None] | None = None
    #: with a rate limit and a process that takes its own slots (``takes_request_slots``): the
    #: limiter's acquire and acquire_async (attempts.py binds them); None: no limit to wait for
    acquire: Callable[[], Any] | None = None
    acquire_async: Callable[[], Awaitable[Any]] | None = None
    #: the process takes a slot per request itself: record_usage's ``calls`` are not charged again
    own_slots = False
    _own_modes = False

    def __init__(self, modes: Mapping[str, str]) -> None:
        # Copied on the first write only: most steps set no new field, and a failed step's modes
        # must not leak into the item's.
        self._modes = modes

    def end(self) -> AttemptUsage | None:
        """The attempt's recorded usage and requests: the runner reads it once as the attempt ends.

        Every path that ends an attempt (completion, failure, a retried attempt) calls this to stage
        it, so it marks the attempt ended: a later ``record_usage`` (a leaked background task)
        raises instead of adding usage no row will ever store.
        """
        self.ended = True
        return self.usage

    def check_mode(self, item_id: str, name: str, mode: str) -> None:
        """Refuse writing field ``name`` with ``mode`` ("set" or "append") if the item wrote it the other way."""
        prev = self._modes.get(name)
        if prev is not None and prev != mode:
            raise InvalidEventError(
                f"item {item_id!r}: field {name!r} is written with {prev} and cannot take {mode}; "
                "use ctx.set or ctx.append consistently for one field"
            )
        if prev is None:
            if not self._own_modes:
                self._modes = dict(self._modes)
                self._own_modes = True
            self._modes[name] = mode  # type: ignore[index]  # our own dict since the copy above

    def add(self, op: tuple[str, str, Any]) -> None:
        if self.ops:
            self.ops.append(op)  # non-empty: the list made below
        else:
            self.ops = [op]


class ItemContext:
    """What a step function sees besides the item: identity, attempt, folded fields, emitters.

    :attr:`record` is the runner's side of the call (:class:`AttemptRecord`).
    """

    _emissions: dict[str, int] | None = None

    def __init__(
        self,
        item_id: str,
        key: str,
        input_fingerprint: str,
        attempt: int,
        fields: Mapping[str, Any],
        coord: StepCoord,
        modes: Mapping[str, str],
    ) -> None:
        self.item_id = item_id
        self.key = key
        self.input_fingerprint = input_fingerprint
        self.attempt = attempt
        # A read-only view: a step that assigned into it would change later steps of this run but not
        # of a resumed one, breaking resumed == uninterrupted. Fields change through set/append only.
        self.fields: Mapping[str, Any] = MappingProxyType(fields) if isinstance(fields, dict) else fields
        self.step = coord.step
        self.iteration = coord.iteration
        self._coord = coord
        #: the runner's record of this call: what set/append/filter/record_usage staged
        self.record = AttemptRecord(modes)

    def set(self, name: str, value: Any) -> None:
        """Set a field (FIELD_SET), checkpointed with this step."""
        check_field(self.item_id, "ctx.set", name, value)
        record = self.record
        record.check_mode(self.item_id, name, "set")
        record.add(("set", name, value))

    def append(self, name: str, value: Any) -> None:
        """Append to a field (FIELD_APPEND), checkpointed with this step."""
        check_field(self.item_id, "ctx.append", name, value)
        record = self.record
        record.check_mode(self.item_id, name, "append")
        record.add(("append", name, value))

    def filter(self, reason: Any = None) -> None:
        """Finish the item as ``filtered`` after this step (a terminal state, never retried)."""
        if reason is not None:
            enc = encode_value(reason, what=f"filter reason of item {self.item_id!r}")
            if enc.json_text is None:
                raise InvalidEventError(f"item {self.item_id!r}: a filter reason must be small JSON")
        self.record.filtered = (True, reason)

    def _attempt_usage(self, what: str) -> AttemptUsage:
        record = self.record
        if record.ended:
            raise ProcessError(
                f"item {self.item_id!r}: {what} was called after attempt {self.attempt} ended, so nothing "
                "would store it; call it before the process returns (await every task that records "
                "usage or sends requests)"
            )
        if record.usage is None:
            record.usage = AttemptUsage()
        return record.usage

    def record_usage(
        self,
        model: str,
        input_tokens: int = 0,
        output_tokens: int = 0,
        cost_usd: float | None = None,
        calls: int = 1,
        request_key: str | None = None,
    ) -> None:
        """Record model usage of this attempt: stored with the step's completion, or its failure.

        ``cost_usd=None`` prices the tokens with genai-prices from ``model`` (``"provider:model"``
        or a bare name); a model it does not know counts as unpriced, never as $0. A given
        ``cost_usd`` wins. May be called several times per attempt, from sync or async code; usage
        of an attempt that then fails still counts (see docs/adr/0011-usage-ledger.md). With a rate
        limit, the tokens are charged to its token window now, and ``calls`` beyond the first
        count as requests unless the process takes its own slots (``takes_request_slots``).

        ``request_key`` (one call's: ``calls=1``) is the response-store key of the request it paid
        for (:meth:`LLMRequest.key <airflow_provider_datagen.llm.request.LLMRequest.key>`), stored in
        the usage entry's ``"request_keys"`` so the item page shows the exchange.

        :raises UsageValueError: a token count above 10**12 or a cost above 10**6 USD.
        :raises ProcessError: called after the attempt ended (its row is already staged).
        """
        record = usage_record(model, input_tokens, output_tokens, cost_usd, calls, request_key)
        self._attempt_usage("ctx.record_usage").append(record)
        charge = self.record.charge
        if charge is not None:
            charge(record, extra_requests=not self.record.own_slots)

    def record_reused(
        self,
        model: str,
        input_tokens: int = 0,
        output_tokens: int = 0,
        saved_usd: float | None = None,
        request_key: str | None = None,
    ) -> None:
        """Record one answer read from the response store instead of asked (no request was sent).

        Stored as its own usage entry (``"reused": True``, ``cost_usd`` 0, the stored tokens) and
        summed by ``log.usage()`` as ``reused_calls`` and ``saved_usd``, never as calls, tokens or
        spend: no budget, no rate-limit window is charged.

        :param model: the usage label the original reply was recorded under.
        :param saved_usd: the original reply's recorded cost (None: it was unpriced).
        :param request_key: the key the answer was read by (stored in the entry's ``"request_keys"``).
        """
        record = reused_record(model, input_tokens, output_tokens, saved_usd, request_key)
        self._attempt_usage("ctx.record_reused").append(record)

    def take_request_slot(self) -> None:
        """Before each model request: wait for a slot of the run's rate limit, and count the request.

        Without a rate limit it only counts. Counted requests (failed ones included: a 429, a 5xx, a
        timeout) are stored with the attempt and shown as ``"requests"`` by ``log.usage()``. A
        process that calls it sets ``takes_request_slots = True`` so the runner takes no slot of
        its own before each attempt.
        """
        usage = self._attempt_usage("ctx.take_request_slot")
        acquire = self.record.acquire
        if acquire is not None:
            acquire()
        usage.requests += 1

    async def take_request_slot_async(self) -> None:
        """:meth:`take_request_slot` for an event loop: the wait is ``asyncio.sleep``, blocking no other item."""
        usage = self._attempt_usage("ctx.take_request_slot_async")
        acquire = self.record.acquire_async
        if acquire is not None:
            await acquire()
        usage.requests += 1

    def idempotency_key(self, name: str) -> str:
        """A key for an external side effect, equal on every replay of the same work.

        Derived from the input fingerprint, the step coordinates and the emission index, never from
        time or attempt, so a receiver can drop the duplicate of an emission replayed after a crash.
        """
        if self._emissions is None:
            self._emissions = {}
        n = self._emissions.get(name, 0)
        self._emissions[name] = n + 1
        c = self._coord
        text = "\x1f".join(
            str(p)
            for p in (
                self.item_id,
                self.input_fingerprint,
                c.enclosing_step,
                c.step,
                c.iteration,
                c.fanout_index,
                name,
                n,
            )
        )
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


@dataclass(slots=True)
class WorkItem:
    """One item (root or fan-out child) being driven through its pipeline in this run."""

    item_id: str
    key: str
    data: dict[str, Any]
    fingerprint: str
    state: ItemState | None
    children: dict[str, ItemState]
    fields: dict[str, Any] = field(default_factory=dict)
    modes: dict[str, str] = field(default_factory=dict)
    completed: set[tuple[Any, ...]] = field(default_factory=set)
    open: set[tuple[Any, ...]] = field(default_factory=set)
    #: recorded frames as (enclosing_step, step) pairs: which branch a selector took before a crash
    #: (only read during a run: a fresh item shares the empty one)
    frames: AbstractSet[tuple[str | None, str | None]] = frozenset()
    attempt: int = 1

    @classmethod
    def start(
        cls, item_id: str, key: str, data: dict[str, Any], fp: str, state: ItemState | None, children: Any
    ) -> WorkItem:
        it = cls(item_id, key, data, fp, state, children)
        if state is not None and state.status is ItemStatus.RUNNING and state.input_fingerprint == fp:
            it.fields = loaded_fields(state.fields)
            it.modes = dict(state.field_modes)
            it.completed = {c.coord.frame_key for c in state.completed_steps}
            it.open = {c.frame_key for c in state.open_frames}
            coords = [*(c.coord for c in state.completed_steps), *state.open_frames]
            it.frames = {(c.enclosing_step, c.step) for c in coords}
            # every FAILED row of the generation, transient ones too: a retry sees the next number
            it.attempt = state.failures + state.retries + 1
        return it


def loaded_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
    """Folded fields with blob-stored values read back: a replay must see what the first run saw."""

    def load(v: Any) -> Any:
        return v.load() if isinstance(v, BlobRef) else v

    # one level only (an appended field is a list of values): values may nest as deep as JSON allows
    return {k: [load(x) for x in v] if isinstance(v, list) else load(v) for k, v in fields.items()}
