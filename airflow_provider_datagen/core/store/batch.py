"""Batch: the events of one checkpoint batch, staged in memory until :meth:`LogWriter.commit`.

A batch becomes one Lance append, all or nothing (see docs/design.md, "The event log"). Staging is
the per-event hot path of a run, so an event is held as a plain tuple (:data:`StagedEvent`) built
literally: a NamedTuple's constructor is a Python call, about 200 ns more per event (measured), while
unpacking by name costs nothing. The shape of an event (type, status, step coordinates, processor
version) is shared by every event of that kind at that step and cached by the writer, so an event
costs a tuple, not a record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from airflow_provider_datagen.core.error_text import error_message, error_traceback, error_type
from airflow_provider_datagen.core.events import ID_SEP, EncodedValue, StepCoord, encode_value
from airflow_provider_datagen.core.ids import MAX_KEY_LENGTH, check_field_name, parent_of
from airflow_provider_datagen.core.schema import (
    STORED_STATUS_FAILED,
    STORED_STATUS_TRANSIENT,
    TERMINAL_STATUSES,
    EventType,
    ItemStatus,
)
from airflow_provider_datagen.exceptions import InvalidEventError, InvalidItemError

if TYPE_CHECKING:
    from collections.abc import Collection, Container, Mapping

    from airflow_provider_datagen.core.schema import StepKind

MAX_ITEM_ID = 4 * MAX_KEY_LENGTH
#: Error texts longer than this are cut (a FAILED row must always be writable).
MAX_TEXT = 64 * 1024
SEP = ID_SEP

CREATED_VALUE = EventType.ITEM_CREATED.value
STARTED_VALUE = EventType.STEP_STARTED.value
SET_VALUE = EventType.FIELD_SET.value
APPEND_VALUE = EventType.FIELD_APPEND.value
COMPLETED_VALUE = EventType.STEP_COMPLETED.value
FAILED_VALUE = EventType.FAILED.value
TERMINAL_VALUE = EventType.TERMINAL.value
RUNNING = ItemStatus.RUNNING.value
NEVER_STARTED = ItemStatus.NEVER_STARTED.value
#: the coordinates of a failure given by its step name alone
_NOWHERE = StepCoord()
_RELEASED = "\x00released"  # the released shape's key among the TERMINAL shapes (no status)

#: What the commit must do for an event beyond numbering it (:attr:`Shape.kind`): an ITEM_CREATED
#: starts the item's fingerprint and field modes, a field event checks and records its field's mode.
OTHER, CREATED, SET, APPEND = 0, 1, 2, 3


@dataclass(frozen=True, slots=True, eq=False)
class Shape:
    """What an event is apart from its item: validated once per kind of event and cached by the writer.

    Built rarely (cached) and read on every event, so a slotted class: its attribute reads are
    cheaper than a tuple's indexing, a NamedTuple's about twice as dear (measured).

    ``id_middle`` and ``id_tail`` are the event-id text around the input fingerprint (see
    :func:`~airflow_provider_datagen.core.events.event_id_for`); ``id_coords`` is the tail without its
    field, value and error parts, for events that carry those.
    """

    shape_id: int
    kind: int  # OTHER, CREATED, SET or APPEND
    id_middle: str
    id_tail: str
    id_coords: str
    #: the shape columns of the event, in the order of ``writer.SHAPE_COLUMNS``
    columns: tuple[Any, ...]


class ErrorInfo(NamedTuple):
    """The error columns of a FAILED event."""

    type: str
    message: str
    traceback: str | None


#: The rarer parts of an event: ``(field, value, error, parent_item_id)``; None for most events.
#: A plain tuple like :data:`StagedEvent`, built on every field event; read it by unpacking.
EventExtras = tuple[str | None, EncodedValue | None, ErrorInfo | None, str | None]
#: One staged event: ``(item_id, shape, input_fingerprint, id_tail, extras)``. ``input_fingerprint``
#: is None except on ITEM_CREATED (the commit fills in the item's); ``id_tail`` is ``shape.id_tail``
#: unless the event carries a field, a value or an error.
StagedEvent = tuple[str, Shape, str | None, str, EventExtras | None]


class _Thresholds(Protocol):
    @property
    def blob_threshold(self) -> int: ...


class BatchWriter(Protocol):
    """What a batch needs of its writer (:class:`~.writer.LogWriter` is one; typed here, not imported back)."""

    @property
    def log(self) -> _Thresholds: ...

    @property
    def processor_version(self) -> str | None: ...

    @property
    def item_cursors(self) -> Container[str]: ...

    @property
    def terminal_shapes(self) -> dict[str, Shape]: ...

    def shape(
        self,
        event_type: str,
        *,
        step: str | None = None,
        step_kind: str | StepKind | None = None,
        enclosing_step: str | None = None,
        iteration: int | None = None,
        fanout_index: int | None = None,
        selector_step: str | None = None,
        processor_version: str | None = None,
        status: str | None = None,
    ) -> Shape: ...


def check_item_id(item_id: object) -> str:
    """An item id as the log stores it: a non-empty, NUL-free, bounded, encodable string."""
    if not isinstance(item_id, str) or not item_id:
        raise InvalidItemError(f"item id {item_id!r} must be a non-empty string; build it with root_item_id()")
    if "\x00" in item_id or len(item_id) > MAX_ITEM_ID:
        raise InvalidItemError(
            f"item id {item_id[:60]!r} contains NUL or is over {MAX_ITEM_ID} characters; "
            "build ids with root_item_id()/child_item_id()"
        )
    if not item_id.isascii():
        try:
            item_id.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidItemError(
                f"item id {item_id[:60]!r} contains a lone surrogate (not valid Unicode text); decode the "
                "source key properly before building ids with root_item_id()"
            ) from None
    return item_id


def exact(text: str) -> str:
    """``text`` as a plain str: a subclass may format differently from the text Arrow stores."""
    return text if type(text) is str else str.__str__(text)


def id_part(value: object) -> str:
    return "" if value is None else str(value)


def _clip(text: str | None) -> str | None:
    if text is None:
        return None
    if not text.isascii():
        # error texts may carry lone surrogates (paths decoded with surrogateescape); a FAILED row
        # must always be writable, so they are kept visibly as escapes instead of failing the batch
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) <= MAX_TEXT:
        return text
    return text[:MAX_TEXT] + f"... [{len(text) - MAX_TEXT} characters cut]"


class Batch:
    """One checkpoint batch: collected in memory, committed as one Lance append, all or nothing."""

    def __init__(self, writer: BatchWriter) -> None:
        self._writer = writer
        # the writer's own dicts, read on every event: the item ids it already sequences (validated
        # when it learnt them) and the TERMINAL shapes by status
        self._known = writer.item_cursors
        self._terminal_shapes = writer.terminal_shapes
        #: the staged events, in order
        self.events: list[StagedEvent] = []
        #: positions in :attr:`events` of the events whose ``extras`` is not None
        self.with_extras: list[int] = []
        self._extras = self.with_extras

    def __len__(self) -> int:
        return len(self.events)

    def _id(self, item_id: object) -> str:
        # Ids the writer already sequences were validated when it learnt them.
        if type(item_id) is str and item_id in self._known:
            return item_id
        return exact(check_item_id(item_id))

    # --- the runner's API: bulk and prebuilt-shape staging ----------------------------------------

    def extend(self, other: Batch) -> None:
        """Append ``other``'s events after this batch's (the runner's per-item buffers under concurrency).

        Safe because sequence numbers and event ids are assigned at :meth:`LogWriter.commit`, per item in
        batch order: an item's events keep their relative order, so its ids are those of a sequential run.
        """
        base = len(self.events)
        self.events.extend(other.events)
        self.with_extras.extend([i + base for i in other.with_extras])

    def touches_subtrees(self, item_ids: Collection[str]) -> bool:
        """Whether an event of one of ``item_ids``, or of an item below one of them, is staged."""
        below = tuple(f"{iid}/" for iid in item_ids)
        return any(iid in item_ids or iid.startswith(below) for iid, _, _, _, _ in self.events)

    def items_created(self, item_ids: list[str], fingerprints: list[str], processor_version: str | None) -> None:
        """:meth:`item_created` of many root items the writer knows (the runner's inbox pull)."""
        known = self._known
        if not all(type(iid) is str and iid in known for iid in item_ids) or not all(
            type(fp) is str and fp for fp in fingerprints
        ):
            for iid, fp in zip(item_ids, fingerprints):  # the checks and errors of the one-by-one path
                self.item_created(iid, input_fingerprint=fp, processor_version=processor_version)
            return
        w = self._writer
        pv = processor_version or w.processor_version
        shape = w.shape(CREATED_VALUE, processor_version=pv, status=RUNNING)
        tail = shape.id_tail
        self.events.extend([(iid, shape, fp, tail, None) for iid, fp in zip(item_ids, fingerprints)])

    def add_shaped(self, item_id: str, shape: Shape, then: Shape | None = None) -> None:
        """An event of a shape from :meth:`LogWriter.shape`, and one of shape ``then`` after it.

        For the runner's STEP_COMPLETED (and TERMINAL): its shape is built once per step, not per item.
        """
        if type(item_id) is not str or item_id not in self._known:
            item_id = exact(check_item_id(item_id))
        self.events.append((item_id, shape, None, shape.id_tail, None))
        if then is not None:
            self.events.append((item_id, then, None, then.id_tail, None))

    # --- one event at a time ------------------------------------------------------------------

    def item_created(
        self,
        item_id: str,
        *,
        input_fingerprint: str,
        processor_version: str | None = None,
        parent_item_id: str | None = None,
        step: str | None = None,
        step_kind: str | None = None,
        enclosing_step: str | None = None,
        fanout_index: int | None = None,
        selector_step: str | None = None,
    ) -> None:
        """The item enters the inbox (status running) for this input fingerprint."""
        item_id = self._id(item_id)
        if type(input_fingerprint) is not str:
            if not isinstance(input_fingerprint, str):
                raise InvalidEventError(f"item {item_id!r}: input_fingerprint must be a non-empty string")
            input_fingerprint = exact(input_fingerprint)
        if not input_fingerprint:
            raise InvalidEventError(f"item {item_id!r}: input_fingerprint must be a non-empty string")
        w = self._writer
        shape = w.shape(
            CREATED_VALUE,
            step=step,
            step_kind=step_kind,
            enclosing_step=enclosing_step,
            fanout_index=fanout_index,
            selector_step=selector_step,
            processor_version=processor_version or w.processor_version,
            status=RUNNING,
        )
        extras = None
        if parent_item_id and parent_item_id != parent_of(item_id):
            extras = (None, None, None, parent_item_id)
            self.with_extras.append(len(self.events))
        self.events.append((item_id, shape, input_fingerprint, shape.id_tail, extras))

    def step_started(
        self,
        item_id: str,
        *,
        step: str,
        step_kind: str = "Sequence",
        enclosing_step: str | None = None,
        iteration: int | None = None,
        fanout_index: int | None = None,
        selector_step: str | None = None,
    ) -> None:
        """A driver frame (Sequence/Loop iteration) opened: a structural marker."""
        item_id = self._id(item_id)
        shape = self._writer.shape(
            STARTED_VALUE,
            step=step,
            step_kind=step_kind,
            enclosing_step=enclosing_step,
            iteration=iteration,
            fanout_index=fanout_index,
            selector_step=selector_step,
        )
        self.events.append((item_id, shape, None, shape.id_tail, None))

    def _field(self, event_type: str, item_id: str, name: str, value: Any, step: str | None) -> None:
        item_id = self._id(item_id)
        check_field_name(name)
        enc = encode_value(
            value, blob_threshold=self._writer.log.blob_threshold, what=f"field {name!r} of item {item_id!r}"
        )
        shape = self._writer.shape(event_type, step=step)
        # the kind keeps bytes b'"x"' and the JSON string "x" (same digest) apart
        tail = f"{shape.id_coords}{SEP}{name}{SEP}{enc.kind}:{enc.digest}{SEP}{SEP}"
        self.with_extras.append(len(self.events))
        self.events.append((item_id, shape, None, tail, (name, enc, None, None)))

    def field_set(self, item_id: str, field: str, value: Any, *, step: str | None = None) -> None:
        """Replace a field's value (last writer wins in the fold)."""
        self._field(SET_VALUE, item_id, field, value, step)

    def field_append(self, item_id: str, field: str, value: Any, *, step: str | None = None) -> None:
        """Append a value to a field (accumulated in order by the fold)."""
        self._field(APPEND_VALUE, item_id, field, value, step)

    def step_completed(
        self,
        item_id: str,
        *,
        step: str,
        processor_version: str | None = None,
        step_kind: str | None = None,
        enclosing_step: str | None = None,
        iteration: int | None = None,
        fanout_index: int | None = None,
        selector_step: str | None = None,
        value: Any = None,
    ) -> None:
        """A checkpointed step boundary: the resume cursor, valid for ``processor_version`` only.

        ``value``: the attempt's usage record ``{"attempt", "usage"}`` (docs/adr/0011-usage-ledger.md),
        small JSON in the value columns; None for a step that recorded no usage.
        """
        item_id = self._id(item_id)
        w = self._writer
        shape = w.shape(
            COMPLETED_VALUE,
            step=step,
            step_kind=step_kind,
            enclosing_step=enclosing_step,
            iteration=iteration,
            fanout_index=fanout_index,
            selector_step=selector_step,
            processor_version=processor_version or w.processor_version,
        )
        if value is None:
            self.events.append((item_id, shape, None, shape.id_tail, None))
            return
        enc = encode_value(value, what=f"usage record of item {item_id!r}")
        tail = f"{shape.id_coords}{SEP}{SEP}{enc.kind}:{enc.digest}{SEP}{SEP}"
        self.with_extras.append(len(self.events))
        self.events.append((item_id, shape, None, tail, (None, enc, None, None)))

    def failed(
        self,
        item_id: str,
        *,
        error: BaseException | str,
        step: str | StepCoord | None = None,
        traceback: str | None = None,
        attempt: int | None = None,
        transient: bool = False,
        wait: float | None = None,
        usage: list[dict[str, Any]] | None = None,
        requests: int | None = None,
        batch: Mapping[str, str] | None = None,
    ) -> None:
        """A step raised: a failure-lens row; the item stays running and is retried later.

        With a retry policy the row also says which ``attempt`` it was and, for an attempt retried in
        place (``transient``), the ``wait`` before the next one, as the JSON ``{"attempt", "transient",
        "wait"}`` in the value columns; a transient row is stored with status ``transient``, which the
        folds keep out of the item's ``failures`` (see docs/adr/0008-in-place-retries.md). The
        ``usage`` entries the failed attempt recorded join that JSON (docs/adr/0011-usage-ledger.md).
        ``step`` names the step alone, or gives all its coordinates as a ``StepCoord`` (the runner's, where
        it failed).
        ``batch`` (``{"batch_id", "custom_id"}``): the attempt was a row of a provider's batch
        (core/batch), stored as ``"batch": True`` beside them.
        """
        item_id = self._id(item_id)
        at = step if isinstance(step, StepCoord) else None
        step_name = step.step if isinstance(step, StepCoord) else step
        if isinstance(error, BaseException):
            # the user's error may break its own __str__: it must still fail only its item
            etype, message = error_type(error), error_message(error)
            if traceback is None:
                traceback = error_traceback(error)
        elif isinstance(error, str):
            etype, message = "Error", error
        else:
            raise InvalidEventError(f"item {item_id!r}: error must be an exception or a message string")
        status = STORED_STATUS_TRANSIENT if transient else STORED_STATUS_FAILED
        where = at or _NOWHERE
        shape = self._writer.shape(
            FAILED_VALUE,
            step=step_name,
            step_kind=where.step_kind,
            enclosing_step=where.enclosing_step,
            iteration=where.iteration,
            fanout_index=where.fanout_index,
            status=status,
        )
        err = ErrorInfo(etype, _clip(message) or "", _clip(traceback))
        enc = None
        value_part = ""
        if attempt is not None or transient or usage or requests or batch:
            payload: dict[str, Any] = {"attempt": attempt, "transient": transient}
            if batch:
                payload.update(batch, batch=True)
            if wait is not None:
                payload["wait"] = wait
            if usage:
                payload["usage"] = usage
            if requests:  # the model requests the attempt sent (ctx.take_request_slot)
                payload["requests"] = requests
            enc = encode_value(payload, what=f"attempt record of item {item_id!r}")
            value_part = f"{enc.kind}:{enc.digest}"
        tail = f"{shape.id_coords}{SEP}{SEP}{value_part}{SEP}{id_part(err.type)}{SEP}{id_part(err.message)}"
        self.with_extras.append(len(self.events))
        self.events.append((item_id, shape, None, tail, (None, enc, err, None)))

    def released(self, item_id: str) -> None:
        """The item leaves the inbox unstarted: a TERMINAL ``never_started`` closes a generation with no steps.

        Staged by a clean stop for the items it pulled (ITEM_CREATED committed) but never started
        (core/runner/jobs.py): they fold as ``never_started``, and the next run pulls them afresh.
        """
        item_id = self._id(item_id)
        # cached under a key no terminal() status can be, so terminal() still refuses never_started
        shape = self._terminal_shapes.get(_RELEASED)
        if shape is None:
            shape = self._writer.shape(TERMINAL_VALUE, status=NEVER_STARTED)
            self._terminal_shapes[_RELEASED] = shape
        self.events.append((item_id, shape, None, shape.id_tail, None))

    def terminal(self, item_id: str, *, status: str = "completed", reason: Any = None) -> None:
        """The item finished: ``completed`` or ``filtered`` (with an optional JSON ``reason``)."""
        item_id = self._id(item_id)
        shape = self._terminal_shapes.get(status) if type(status) is str else None
        if shape is None:
            status_value = status.value if isinstance(status, ItemStatus) else status
            if status_value not in TERMINAL_STATUSES:
                raise InvalidEventError(
                    f"item {item_id!r}: unknown terminal status {status!r}; use 'completed' or 'filtered'"
                )
            shape = self._writer.shape(TERMINAL_VALUE, status=status_value)
            self._terminal_shapes[status_value] = shape
        if reason is None:
            self.events.append((item_id, shape, None, shape.id_tail, None))
            return
        enc = encode_value(reason, what=f"filter reason of item {item_id!r}")
        if enc.json_text is None:
            raise InvalidEventError(f"item {item_id!r}: the filter reason must be small JSON, not bytes")
        tail = f"{shape.id_coords}{SEP}{SEP}{enc.kind}:{enc.digest}{SEP}{SEP}"
        self.with_extras.append(len(self.events))
        self.events.append((item_id, shape, None, tail, (None, enc, None, None)))
