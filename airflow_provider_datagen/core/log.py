"""CheckpointLog: one append-only Lance dataset per experiment, the only durable source of truth.

This is the only module that imports ``lance``; every Lance error is translated here into a
:class:`~airflow_provider_datagen.exceptions.DatagenError` that names the dataset and the fix.

Mapping of seed 000 onto Lance (see DESIGN.md): a checkpoint batch is one Lance append (one commit)
instead of a MemWAL generation; retried batches may land twice and the read path de-duplicates them by
``event_id``; writers are told apart by ``writer_id``/``writer_epoch`` instead of WAL shards; blob bytes
live in a blob-encoded ``value_blob`` column, located by ``event_id`` and fetched by stable row id.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import datetime as dt
import fcntl
import hashlib
import itertools
import logging
import os
import threading
import time
import traceback as tb_module
from typing import TYPE_CHECKING, Any, Final

import lance
import lance.fragment
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_datagen.core.events import (
    ID_DIGEST_SIZE,
    ID_SEP,
    EncodedValue,
    Event,
    StepCoord,
    encode_value,
    event_ids_of,
)
from airflow_provider_datagen.core.fold import (
    STATE_SCHEMA,
    FailureRecord,
    ItemState,
    MisalignedStreamsError,
    dedupe,
    failure_records,
    fold_batches,
    fold_events,
    fold_table,
)
from airflow_provider_datagen.core.ids import MAX_KEY_LENGTH, check_name, parent_of, root_of
from airflow_provider_datagen.core.schema import (
    DATAGEN_SCHEMA_VERSION,
    DEFAULT_BLOB_THRESHOLD,
    EVENT_SCHEMA,
    LIGHT_COLUMNS,
    NON_BLOB_COLUMNS,
    STORED_STATUS_FAILED,
    TERMINAL_STATUSES,
    EventType,
    ItemStatus,
    StepKind,
)
from airflow_provider_datagen.exceptions import (
    FencingError,
    InvalidEventError,
    InvalidItemError,
    InvalidNameError,
    LogCorruptedError,
    LogWriteError,
    NotALogError,
    SchemaVersionError,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

log = logging.getLogger(__name__)

_MAX_EPOCH = (1 << 31) - 1
_MAX_ITEM_ID = 4 * MAX_KEY_LENGTH
_MAX_TEXT = 64 * 1024
#: Lance data storage version: legacy blob encoding works on 2.1 and 2.2 (measured).
_STORAGE_VERSION: Final = "2.1"
_INDEXED_COLUMNS = ("item_id", "root_item_id", "event_id")
_FAILED_SAMPLE = 20
#: Lance's V2 manifest names count down from u64::MAX so that listings return the newest first.
_U64: Final = (1 << 64) - 1
#: Events a fold must cover beyond the state projection before a planner stores it as the new one.
PROJECTION_MIN_NEW_EVENTS = 1 << 20
#: Rows per batch of a streamed fold scan, and batches Lance decodes ahead: small enough that a
#: scan never holds much, large enough that per-batch Python stays a few percent of the fold.
_SCAN_BATCH_ROWS: Final = 1 << 16
_SCAN_READAHEAD: Final = 2
_VALID_STEP_NAMES: set[str] = set()
_STEP_KINDS: dict[Any, str] = {**{k.value: k.value for k in StepKind}, **{k: k.value for k in StepKind}}


def _is_local(uri: str) -> bool:
    return "://" not in uri or uri.startswith("file://")


def _local_path(uri: str) -> str:
    return uri[len("file://") :] if uri.startswith("file://") else uri


def _being_created(path: str) -> bool:
    """A local dataset directory whose first commit is in flight: no manifest yet, nothing foreign.

    A creating writer makes the directory, then ``data/``, then ``_transactions/`` and ``_versions/``
    and renames the first manifest into place last; a reader may list it at any of those moments
    (an empty directory included) and must see an empty log, not "not a dataset".
    """
    try:
        entries = set(os.listdir(path))
    except OSError:
        return False
    if not entries <= {"data", "_transactions", "_versions"} or _has_manifest(path):
        return False
    return not _later_commit_records(path)


def _later_commit_records(path: str) -> list[str]:
    """Transaction records of commits after the first: Lance names them ``<read_version>-<uuid>.txn``
    (a creation reads version 0; a record being written starts with a dot). Any of them in a directory
    without a manifest means the version history was deleted or not copied: never an empty log."""
    try:
        names = os.listdir(os.path.join(path, "_transactions"))
    except OSError:
        return []
    return [n for n in names if not n.startswith(("0-", "."))]


def _has_manifest(path: str) -> bool:
    try:
        return any(n.endswith(".manifest") for n in os.listdir(os.path.join(path, "_versions")))
    except OSError:
        return False


#: Object-store answers that mean "wrong bucket, endpoint or credentials", not a damaged log. (A LIST of
#: an existing bucket never answers 404; a GET of a deleted fragment does, and that is damage.)
_STORE_ACCESS_ERRORS = (
    "nosuchbucket",
    "403 forbidden",
    "accessdenied",
    "invalidaccesskeyid",
    "signaturedoesnotmatch",
    "error sending request",
    "connection refused",
)


def _sql_free_eq(column: str, value: str) -> pc.Expression:
    # pyarrow expressions never need SQL quoting, so ids with quotes or newlines are safe filters.
    return pc.field(column) == pa.scalar(value, pa.string())


def _check_item_id(item_id: object) -> str:
    if not isinstance(item_id, str) or not item_id:
        raise InvalidItemError(f"item id {item_id!r} must be a non-empty string; build it with root_item_id()")
    if "\x00" in item_id or len(item_id) > _MAX_ITEM_ID:
        raise InvalidItemError(
            f"item id {item_id[:60]!r} contains NUL or is over {_MAX_ITEM_ID} characters; "
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


def _check_field(name: object) -> str:
    if not isinstance(name, str) or not name or "\x00" in name or len(name) > 256:
        raise InvalidEventError(f"field name {name!r} must be a non-empty string of at most 256 characters")
    return name


def _clip(text: str | None) -> str | None:
    if text is None:
        return None
    if not text.isascii():
        # error texts may carry lone surrogates (paths decoded with surrogateescape); a FAILED row
        # must always be writable, so they are kept visibly as escapes instead of failing the batch
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) <= _MAX_TEXT:
        return text
    return text[:_MAX_TEXT] + f"... [{len(text) - _MAX_TEXT} characters cut]"


_CREATED_VALUE = EventType.ITEM_CREATED.value
_STARTED_VALUE = EventType.STEP_STARTED.value
_SET_VALUE = EventType.FIELD_SET.value
_APPEND_VALUE = EventType.FIELD_APPEND.value
_COMPLETED_VALUE = EventType.STEP_COMPLETED.value
_FAILED_VALUE = EventType.FAILED.value
_TERMINAL_VALUE = EventType.TERMINAL.value
_RUNNING = ItemStatus.RUNNING.value
_NO_MODES: dict[str, str] = {}  # shared, never mutated: the commit copies a mode map before writing it
#: Kinds of events the commit loop must treat specially (sequence bookkeeping and field modes).
_OTHER, _CREATED, _SET, _APPEND = 0, 1, 2, 3
_EVENT_KINDS = {_CREATED_VALUE: _CREATED, _SET_VALUE: _SET, _APPEND_VALUE: _APPEND}
_MODE_NAMES = {_SET: "set", _APPEND: "append"}
_SEP = ID_SEP
#: The event-id parts after the coordinates (field, value, error type, error message), all empty.
_NO_EXTRAS = _SEP * 4
#: Columns that depend only on an event's shape, in the order of a shape's column tuple.
_SHAPE_COLUMNS = (
    "event_type",
    "status",
    "step_kind",
    "step",
    "enclosing_step",
    "selector_step",
    "iteration",
    "fanout_index",
    "processor_version",
)
#: Columns filled from an event's extras (field value, error), in the order of ``_Extras``.
_EXTRA_COLUMNS = (
    "field",
    "value_kind",
    "value_json",
    "value_size",
    "value_digest",
    "value_blob",
    "error_type",
    "error_message",
    "error_traceback",
)
_SHAPE_IDS = itertools.count()
#: Shapes are few (event type x step coordinates); the bound only matters for huge fan-outs or loops.
_MAX_SHAPES = 8192
_ID_OFFSETS_CACHE: dict[int, pa.Buffer] = {}


def _id_part(value: object) -> str:
    return "" if value is None else str(value)


def _exact(text: str) -> str:
    # A str subclass may format differently from the text Arrow stores; ids hash the stored text.
    return text if type(text) is str else str.__str__(text)


class Batch:
    """One checkpoint batch: collected in memory, committed as one Lance append, all or nothing.

    Each event is held as a tuple ``(item_id, shape, input_fingerprint, id_tail, extras)``. The shape
    (event type, status, step coordinates, processor version) is shared by every event of that kind
    at that step and cached by the writer, so an event costs a tuple, not a record, and the commit
    fills the shape columns with one ``take`` instead of a Python value per row and column.
    """

    def __init__(self, writer: LogWriter) -> None:
        self._writer = writer
        self._pending: list[tuple[Any, ...]] = []
        #: positions of events carrying a field value, an error or an explicit parent
        self._extras: list[int] = []

    def __len__(self) -> int:
        return len(self._pending)

    def _id(self, item_id: object) -> str:
        # Ids the writer already sequences were validated when it learnt them.
        if type(item_id) is str and item_id in self._writer._items:
            return item_id
        return _exact(_check_item_id(item_id))

    def _extend(self, other: Batch) -> None:
        """Append ``other``'s events after this batch's (the runner's per-item buffers under concurrency).

        Safe because sequence numbers and event ids are assigned at :meth:`LogWriter.commit`, per item in
        batch order: an item's events keep their relative order, so its ids are those of a sequential run.
        """
        base = len(self._pending)
        self._pending.extend(other._pending)
        self._extras.extend([i + base for i in other._extras])

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
            input_fingerprint = _exact(input_fingerprint)
        if not input_fingerprint:
            raise InvalidEventError(f"item {item_id!r}: input_fingerprint must be a non-empty string")
        w = self._writer
        shape = w._shape(
            _CREATED_VALUE,
            step,
            step_kind,
            enclosing_step,
            None,
            fanout_index,
            selector_step,
            processor_version or w.processor_version,
            _RUNNING,
        )
        extras = None
        if parent_item_id and parent_item_id != parent_of(item_id):
            extras = (None, None, None, parent_item_id)
            self._extras.append(len(self._pending))
        self._pending.append((item_id, shape, input_fingerprint, shape[3], extras))

    def _created_many(self, item_ids: list[str], fingerprints: list[str], processor_version: str | None) -> None:
        """:meth:`item_created` of many root items the writer knows (the runner's inbox pull)."""
        items = self._writer._items
        if not all(type(iid) is str and iid in items for iid in item_ids) or not all(
            type(fp) is str and fp for fp in fingerprints
        ):
            for iid, fp in zip(item_ids, fingerprints):  # the checks and errors of the one-by-one path
                self.item_created(iid, input_fingerprint=fp, processor_version=processor_version)
            return
        w = self._writer
        pv = processor_version or w.processor_version
        shape = w._shape(_CREATED_VALUE, None, None, None, None, None, None, pv, _RUNNING)
        tail = shape[3]
        self._pending.extend([(iid, shape, fp, tail, None) for iid, fp in zip(item_ids, fingerprints)])

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
        shape = self._writer._shape(
            _STARTED_VALUE, step, step_kind, enclosing_step, iteration, fanout_index, selector_step, None, None
        )
        self._pending.append((item_id, shape, None, shape[3], None))

    def _shaped(self, item_id: str, shape: tuple[Any, ...], then: tuple[Any, ...] | None = None) -> None:
        """An event of a shape from :meth:`LogWriter._shape` for an item the writer knows (the runner's
        STEP_COMPLETED: its shape is built once per step, not per item), and one of shape ``then``."""
        if type(item_id) is not str or item_id not in self._writer._items:
            item_id = _exact(_check_item_id(item_id))
        self._pending.append((item_id, shape, None, shape[3], None))
        if then is not None:
            self._pending.append((item_id, then, None, then[3], None))

    def _field(self, et: str, item_id: str, name: str, value: Any, step: str | None) -> None:
        item_id = self._id(item_id)
        _check_field(name)
        enc = encode_value(
            value, blob_threshold=self._writer.log.blob_threshold, what=f"field {name!r} of item {item_id!r}"
        )
        self._add_field(et, item_id, name, enc, step)

    def _add_field(self, et: str, item_id: str, name: str, enc: EncodedValue, step: str | None) -> None:
        shape = self._writer._shape(et, step, None, None, None, None, None, None, None)
        # the kind keeps bytes b'"x"' and the JSON string "x" (same digest) apart
        tail = f"{shape[4]}{_SEP}{name}{_SEP}{enc.kind}:{enc.digest}{_SEP}{_SEP}"
        self._extras.append(len(self._pending))
        self._pending.append((item_id, shape, None, tail, (name, enc, None, None)))

    def field_set(self, item_id: str, field: str, value: Any, *, step: str | None = None) -> None:
        """Replace a field's value (last writer wins in the fold)."""
        self._field(_SET_VALUE, item_id, field, value, step)

    def field_append(self, item_id: str, field: str, value: Any, *, step: str | None = None) -> None:
        """Append a value to a field (accumulated in order by the fold)."""
        self._field(_APPEND_VALUE, item_id, field, value, step)

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
    ) -> None:
        """A checkpointed step boundary: the resume cursor, valid for ``processor_version`` only."""
        item_id = self._id(item_id)
        w = self._writer
        shape = w._shape(
            _COMPLETED_VALUE,
            step,
            step_kind,
            enclosing_step,
            iteration,
            fanout_index,
            selector_step,
            processor_version or w.processor_version,
            None,
        )
        self._pending.append((item_id, shape, None, shape[3], None))

    def failed(
        self,
        item_id: str,
        *,
        error: BaseException | str,
        step: str | None = None,
        step_kind: str | None = None,
        enclosing_step: str | None = None,
        iteration: int | None = None,
        fanout_index: int | None = None,
        traceback: str | None = None,
    ) -> None:
        """A step raised: a failure-lens row; the item stays running and is retried later."""
        item_id = self._id(item_id)
        if isinstance(error, BaseException):
            etype = type(error).__name__
            message = str(error)
            if traceback is None and error.__traceback__ is not None:
                traceback = "".join(tb_module.format_exception(type(error), error, error.__traceback__))
        elif isinstance(error, str):
            etype, message = "Error", error
        else:
            raise InvalidEventError(f"item {item_id!r}: error must be an exception or a message string")
        shape = self._writer._shape(
            _FAILED_VALUE, step, step_kind, enclosing_step, iteration, fanout_index, None, None, STORED_STATUS_FAILED
        )
        err = (etype, _clip(message) or "", _clip(traceback))
        tail = f"{shape[4]}{_SEP}{_SEP}{_SEP}{_id_part(err[0])}{_SEP}{_id_part(err[1])}"
        self._extras.append(len(self._pending))
        self._pending.append((item_id, shape, None, tail, (None, None, err, None)))

    def terminal(self, item_id: str, *, status: str = "completed", reason: Any = None) -> None:
        """The item finished: ``completed`` or ``filtered`` (with an optional JSON ``reason``)."""
        item_id = self._id(item_id)
        known = self._writer._terminal_shapes
        shape = known.get(status) if type(status) is str else None
        if shape is None:
            status_value = status.value if isinstance(status, ItemStatus) else status
            if status_value not in TERMINAL_STATUSES:
                raise InvalidEventError(
                    f"item {item_id!r}: unknown terminal status {status!r}; use 'completed' or 'filtered'"
                )
            shape = self._writer._shape(_TERMINAL_VALUE, None, None, None, None, None, None, None, status_value)
            known[status_value] = shape
        if reason is None:
            self._pending.append((item_id, shape, None, shape[3], None))
            return
        enc = encode_value(reason, what=f"filter reason of item {item_id!r}")
        if enc.json_text is None:
            raise InvalidEventError(f"item {item_id!r}: the filter reason must be small JSON, not bytes")
        tail = f"{shape[4]}{_SEP}{_SEP}{enc.kind}:{enc.digest}{_SEP}{_SEP}"
        self._extras.append(len(self._pending))
        self._pending.append((item_id, shape, None, tail, (None, enc, None, None)))


class LogWriter:
    """Appends batches for one owner (``writer_id``) at one ``epoch``; remembers item sequences."""

    def __init__(
        self,
        log: CheckpointLog,
        writer_id: str,
        epoch: int,
        *,
        processor_version: str | None = None,
        airflow: dict[str, Any] | None = None,
    ) -> None:
        if not isinstance(writer_id, str) or not writer_id or len(writer_id) > 1024 or "\x00" in writer_id:
            raise InvalidNameError(f"writer_id {writer_id!r} must be a non-empty string up to 1024 characters")
        if isinstance(epoch, bool) or not isinstance(epoch, int) or not 0 <= epoch <= _MAX_EPOCH:
            raise InvalidEventError(f"epoch {epoch!r} must be an int in [0, 2**31); use log.next_epoch()")
        self.log = log
        self.writer_id = writer_id
        self.epoch = epoch
        self.processor_version = processor_version
        self.airflow = dict(airflow or {})
        #: per item: (last_seq, input_fingerprint, field modes), a list once a commit staged it; every
        #: key is a validated item id
        self._items: dict[str, Sequence[Any]] = {}
        self._shapes: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        #: the shapes of TERMINAL by status, the one event every item ends with
        self._terminal_shapes: dict[str, tuple[Any, ...]] = {}
        self.commits = 0
        self.events_written = 0
        #: the error of a pipelined append that failed after this writer had counted its batch as
        #: staged: the writer's sequences are then ahead of the log, so it must not write again
        self._lost: BaseException | None = None

    def prime(
        self,
        item_id: str,
        *,
        last_seq: int,
        input_fingerprint: str | None = None,
        field_modes: dict[str, str] | None = None,
    ) -> None:
        """Tell the writer what it would otherwise look up: saves a query per new item on hot paths."""
        item_id = _exact(_check_item_id(item_id))
        self._items[item_id] = [last_seq, input_fingerprint, dict(field_modes) if field_modes else _NO_MODES]

    def _prime_new(self, item_ids: Iterable[str], last_seqs: Mapping[str, int]) -> None:
        """:meth:`prime` for item ids already validated (``prepare_items`` built them) with no history
        but their last sequence number."""
        get = last_seqs.get
        self._items.update({iid: (get(iid, -1), None, _NO_MODES) for iid in item_ids})

    def forget(self, item_id: str) -> None:
        self._items.pop(item_id, None)

    @contextlib.contextmanager
    def batch(self) -> Iterator[Batch]:
        """Collect events; on a clean exit they are committed as one append (nothing on an error)."""
        b = Batch(self)
        yield b
        if len(b):
            self.commit(b)

    def _shape(
        self,
        event_type: str,
        step: str | None,
        step_kind: str | StepKind | None,
        enclosing_step: str | None,
        iteration: int | None,
        fanout_index: int | None,
        selector_step: str | None,
        processor_version: str | None,
        status: str | None,
    ) -> tuple[Any, ...]:
        """The validated shape of an event: ``(id, kind, id_middle, id_tail, id_coords, columns)``.

        ``id_middle`` and ``id_tail`` are the event-id text around the fingerprint (see
        :func:`~airflow_provider_datagen.core.events.event_id_for`), ``id_coords`` the tail without its
        field, value and error parts.
        """
        if iteration is not None or fanout_index is not None:
            # checked on every call: True == 1 would otherwise hit the cached shape of iteration 1
            for what, val in (("iteration", iteration), ("fanout_index", fanout_index)):
                if val is not None and (isinstance(val, bool) or not isinstance(val, int) or val < 0):
                    raise InvalidEventError(f"{what} must be a non-negative int, got {val!r}")
        key = (
            event_type,
            step,
            step_kind,
            enclosing_step,
            iteration,
            fanout_index,
            selector_step,
            processor_version,
            status,
        )
        shape = self._shapes.get(key)
        if shape is not None:
            return shape
        if step is not None and step not in _VALID_STEP_NAMES:
            check_name(step, "step")
            if len(_VALID_STEP_NAMES) < 10_000:  # names are few; the cache only skips re-validation
                _VALID_STEP_NAMES.add(step)
        if step_kind is not None:
            kind = _STEP_KINDS.get(step_kind)
            if kind is None:
                raise InvalidEventError(f"unknown step_kind {step_kind!r}; use one of {[k.value for k in StepKind]}")
            step_kind = kind
        sequenced = event_type in (_CREATED_VALUE, _COMPLETED_VALUE)
        # One order for both: the id text and the stored columns name the same coordinates.
        parts = (status, step_kind, step, enclosing_step, selector_step, iteration, fanout_index)
        coords = _SEP + _SEP.join(_id_part(p) for p in (processor_version if sequenced else None, *parts))
        columns = (event_type, *parts, processor_version)
        shape = (
            next(_SHAPE_IDS),
            _EVENT_KINDS.get(event_type, _OTHER),
            f"{_SEP}{event_type}{_SEP}",
            coords + _NO_EXTRAS,
            coords,
            columns,
        )
        if len(self._shapes) >= _MAX_SHAPES:
            self._shapes.clear()
        self._shapes[key] = shape
        return shape

    def _lookup(self, item_ids: Sequence[str]) -> None:
        states = self.log.item_states(item_ids)
        for iid in item_ids:
            st = states[iid]
            if st.max_epoch > self.epoch:
                raise FencingError(
                    f"writer {self.writer_id!r} at epoch {self.epoch} may not write item {iid!r}: epoch "
                    f"{st.max_epoch} already owns it. A newer attempt took over; stop this one."
                )
            self._items[iid] = [st.last_seq, st.input_fingerprint, dict(st.field_modes)]

    def commit(self, batch: Batch, *, wait: bool = True) -> int:
        """Validate, sequence and append a batch in one Lance commit; returns the events written.

        ``wait=False`` pipelines the commit: the batch is validated and sequenced here (its errors
        raise before any write, as always), and the Lance append and fsync run on the log's committer
        thread while the caller goes on. At most one append is in flight; the next commit or any read
        of the log waits for it and raises its error, and :meth:`sync` waits for it explicitly. Group
        commit uses this because an unacknowledged item is redone after a crash either way, so the
        append need not hold up the next items' work.
        """
        if self._lost is not None:
            raise LogWriteError(
                f"writer {self.writer_id!r} lost a pipelined append ({self._lost}); the batches it counted "
                "after that one were not written. Open a new writer (rerun the task): the next run redoes "
                "exactly the unacknowledged work."
            )
        pending = batch._pending
        n = len(pending)
        if not n:
            return 0
        items = self._items
        sequenced = self._sequence(pending, items)
        if sequenced is None:  # items this writer has not seen: one query for all of them
            self._lookup([iid for iid in dict.fromkeys([p[0] for p in pending]) if iid not in items])
            sequenced = self._sequence(pending, items)
            assert sequenced is not None
        staged, seqs, fps, digests, shape_ids = sequenced
        try:
            table = self._table(batch, "/" in "\n".join(staged), seqs, fps, digests, shape_ids)
        except (UnicodeEncodeError, pa.ArrowInvalid) as exc:
            raise InvalidEventError(
                f"a batch of writer {self.writer_id!r} holds text that is not valid UTF-8 (an item id, "
                f"field name or fingerprint with a lone surrogate?): {str(exc)[:200]}; decode it properly "
                "(nothing of this batch was written)"
            ) from None
        if wait:
            self.log._append(table)
        else:
            self.log._append_pipelined(table, self._lose)
        items.update(staged)
        self.commits += 1
        self.events_written += n
        return n

    def _lose(self, exc: BaseException) -> None:
        self._lost = exc

    def sync(self) -> None:
        """Wait until every pipelined commit of this writer's log has landed; raise an append's error."""
        self.log._wait_appends(close=True)

    @staticmethod
    def _sequence(pending: list[tuple[Any, ...]], items: dict[str, Any]) -> tuple[Any, ...] | None:
        """Number the events of a batch and hash their ids; None if an item is unknown to the writer.

        Works on copies (``staged``: per item ``[last_seq, input_fingerprint, field modes, modes
        copied]``), so a batch that fails leaves the writer's state untouched.
        """
        staged: dict[str, list[Any]] = {}
        seqs: list[int] = []
        fps: list[str | None] = []
        digests: list[bytes] = []
        shape_ids: list[int] = []
        add_seq, add_fp, add_digest, add_shape = seqs.append, fps.append, digests.append, shape_ids.append
        staged_get, items_get = staged.get, items.get
        # copying a keyless BLAKE2b state is cheaper than constructing one per event
        new_hash = hashlib.blake2b(digest_size=ID_DIGEST_SIZE).copy
        for iid, shape, fp, tail, extras in pending:
            st = staged_get(iid)
            if st is None:
                base = items_get(iid)
                if base is None:
                    return None
                st = staged[iid] = [base[0], base[1], base[2], False]
            seq = st[0] = st[0] + 1
            kind = shape[1]
            if kind:
                if kind == _CREATED:
                    st[1] = fp
                    st[2] = {}
                    st[3] = True
                else:
                    name = extras[0]
                    mode = _MODE_NAMES[kind]
                    prev = st[2].get(name)
                    if prev is not None and prev != mode:
                        raise InvalidEventError(
                            f"item {iid!r}: field {name!r} was written with FIELD_"
                            f"{prev.upper()} and cannot take FIELD_{mode.upper()}; use one mode per field "
                            "(nothing of this batch was written)"
                        )
                    if prev is None:
                        if not st[3]:
                            st[2] = dict(st[2])
                            st[3] = True
                        st[2][name] = mode
            if fp is None:
                fp = st[1]
            add_seq(seq)
            add_fp(fp)
            add_shape(shape[0])
            # The text of events.event_id_for, built from the precomputed parts of the shape.
            h = new_hash()
            h.update(f"{iid}{_SEP}{seq}{shape[2]}{'' if fp is None else fp}{tail}".encode("utf-8", "surrogatepass"))
            add_digest(h.digest())
        return staged, seqs, fps, digests, shape_ids

    def _table(
        self,
        batch: Batch,
        nested: bool,
        seqs: list[int],
        fps: list[str | None],
        digests: list[bytes],
        shape_ids: list[int],
    ) -> pa.Table:
        """The Arrow table of a sequenced batch, built column by column (``nested``: a child id is in it)."""
        pending = batch._pending
        n = len(pending)
        cols: dict[str, Any] = {}
        ids, keys = event_ids_of(b"".join(digests))
        cols["event_id"] = ids
        cols["event_key"] = pa.array(keys)
        cols["schema_version"] = pa.array(np.full(n, DATAGEN_SCHEMA_VERSION, np.int32))
        item_ids = [p[0] for p in pending]
        item_arr = pa.array(item_ids, pa.string())
        cols["item_id"] = item_arr
        overrides = {i: pending[i][4][3] for i in batch._extras if pending[i][4][3] is not None}
        if nested or overrides:
            parents = {iid: parent_of(iid) for iid in dict.fromkeys(item_ids)}
            cols["root_item_id"] = pa.array([root_of(iid) for iid in item_ids], pa.string())
            parent_list = [parents[iid] for iid in item_ids]
            for i, parent in overrides.items():
                parent_list[i] = parent
            cols["parent_item_id"] = pa.array(parent_list, pa.string())
        else:
            cols["root_item_id"] = item_arr
            cols["parent_item_id"] = pa.nulls(n, pa.string())
        cols["item_seq"] = pa.array(np.fromiter(seqs, np.int64, n))
        # Shape columns: one row per distinct shape of the batch, spread to the events by take.
        _, first, inverse = np.unique(np.array(shape_ids, np.int64), return_index=True, return_inverse=True)
        shape_rows = [pending[int(i)][1][5] for i in first]
        where = pa.array(inverse.astype(np.int32))
        for j, name in enumerate(_SHAPE_COLUMNS):
            values = [row[j] for row in shape_rows]
            if name == "processor_version":
                values = [self.processor_version if v is None else v for v in values]
            cols[name] = pa.array(values, EVENT_SCHEMA.field(name).type).take(where)
        cols["input_fingerprint"] = pa.array(fps, pa.string())
        extra_cols: dict[str, list[Any]] = {}
        with_values = [i for i in batch._extras if pending[i][4][0] is not None or pending[i][4][1] is not None]
        with_errors = [i for i in batch._extras if pending[i][4][2] is not None]
        if with_values:
            field_, vkind, vjson, vsize, vdigest, vblob = ([None] * n for _ in range(6))
            for i in with_values:
                name, enc = pending[i][4][0], pending[i][4][1]
                field_[i] = name
                if enc is not None:
                    vkind[i], vjson[i], vsize[i], vdigest[i], vblob[i] = (
                        enc.kind,
                        enc.json_text,
                        enc.size,
                        enc.digest,
                        enc.blob,
                    )
            extra_cols.update(
                field=field_,
                value_kind=vkind,
                value_json=vjson,
                value_size=vsize,
                value_digest=vdigest,
                value_blob=vblob,
            )
        if with_errors:
            etype, emsg, etb = ([None] * n for _ in range(3))
            for i in with_errors:
                etype[i], emsg[i], etb[i] = pending[i][4][2]
            extra_cols.update(error_type=etype, error_message=emsg, error_traceback=etb)
        for name in _EXTRA_COLUMNS:
            typ = EVENT_SCHEMA.field(name).type
            filled = extra_cols.get(name)
            cols[name] = pa.nulls(n, typ) if filled is None else pa.array(filled, typ)
        # Per-writer constants are repeated, not built per event.
        cols["writer_id"] = pa.repeat(pa.scalar(self.writer_id, pa.string()), n)
        cols["writer_epoch"] = pa.array(np.full(n, self.epoch, np.int64))
        af = self.airflow
        for key, typ in _AIRFLOW_COLUMNS.items():
            value = af.get(key)
            cols[key] = pa.nulls(n, typ) if value is None else pa.repeat(pa.scalar(value, typ), n)
        now_us = np.datetime64(dt.datetime.now(dt.timezone.utc).replace(tzinfo=None), "us")
        cols["created_at"] = pa.array(np.full(n, now_us), pa.timestamp("us", tz="UTC"))
        return pa.Table.from_arrays([cols[f.name] for f in EVENT_SCHEMA], schema=EVENT_SCHEMA)


_AIRFLOW_COLUMNS = {
    "dag_id": pa.string(),
    "run_id": pa.string(),
    "task_id": pa.string(),
    "map_index": pa.int64(),
    "try_number": pa.int64(),
}


class _MaintenanceLease:
    """At most one maintenance worker per experiment on this host (a non-blocking file lock).

    On object stores two maintainers can still race; Lance's optimistic commit then rejects the later
    compaction, which :meth:`CheckpointLog.maintain` reports as skipped. Nothing is lost either way.
    """

    def __init__(self, uri: str) -> None:
        local = os.path.dirname(os.path.normpath(_local_path(uri))) if _is_local(uri) else None
        self._path = os.path.join(local, ".maintenance.lock") if local is not None else None
        self._fd: int | None = None

    def acquire(self) -> bool:
        if self._path is None:
            return True
        os.makedirs(os.path.dirname(os.path.abspath(self._path)), exist_ok=True)
        fd = os.open(self._path, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


class CheckpointLog:
    """The event log of one experiment: ``<root>/datagen_checkpoints/<pipeline>/<experiment>/log.lance``.

    Opening is lazy: nothing is created until the first batch is committed, so reads of a new
    experiment see an empty log.
    """

    def __init__(
        self,
        root: str,
        pipeline: str,
        experiment: str,
        *,
        storage_options: dict[str, str] | None = None,
        blob_threshold: int = DEFAULT_BLOB_THRESHOLD,
        auto_maintain_fragments: int | None = 512,
        durable: bool = True,
        remember_fold: bool = True,
    ) -> None:
        self.root = root
        self.durable = durable
        self.remember_fold = remember_fold
        self._max_fragment_id = -1
        self.pipeline = pipeline
        self.experiment = experiment
        self.storage_options = dict(storage_options) if storage_options else None
        self.blob_threshold = blob_threshold
        self.auto_maintain_fragments = auto_maintain_fragments
        self.uri = f"{root.rstrip('/')}/datagen_checkpoints/{pipeline}/{experiment}/log.lance"
        self._ds: lance.LanceDataset | None = None
        self._lock = threading.Lock()
        #: the pipelined append in flight (LogWriter.commit(wait=False)) and the thread that runs it
        self._inflight: concurrent.futures.Future[None] | None = None
        self._committer: concurrent.futures.ThreadPoolExecutor | None = None
        self._committer_ident: int | None = None
        #: the last fold: (log version, that version's manifest identity, states), see _memo_base
        self._memo: tuple[int, tuple[int, int] | None, pa.Table] | None = None
        self._appends_since_check = 0
        self.projection_uri = f"{self.uri.rsplit('/', 1)[0]}/state.lance"

    def __repr__(self) -> str:
        return f"CheckpointLog({self.uri!r})"

    @classmethod
    def open(
        cls,
        root: str | os.PathLike[str],
        *,
        pipeline: str,
        experiment: str,
        storage_options: dict[str, str] | None = None,
        blob_threshold: int = DEFAULT_BLOB_THRESHOLD,
        auto_maintain_fragments: int | None = 512,
        durable: bool = True,
        remember_fold: bool = True,
    ) -> CheckpointLog:
        """Open (lazily) the log of ``pipeline``/``experiment`` under ``root`` (a path or a URI).

        ``remember_fold`` keeps the last :meth:`states` in memory so the next one re-folds only what
        changed; a process that holds many logs open for long (the UI) turns it off.
        """
        check_name(pipeline, "pipeline")
        check_name(experiment, "experiment")
        root_s = os.fspath(root)
        if not isinstance(root_s, str) or not root_s or "\x00" in root_s:
            raise InvalidNameError(f"root {root!r} must be a non-empty path or URI")
        if _is_local(root_s):
            root_s = os.path.abspath(_local_path(root_s))
        lg = cls(
            root_s,
            pipeline,
            experiment,
            storage_options=storage_options,
            blob_threshold=blob_threshold,
            auto_maintain_fragments=auto_maintain_fragments,
            durable=durable,
            remember_fold=remember_fold,
        )
        lg._dataset()  # validates an existing dataset (schema version, is it ours) before any use
        return lg

    # --- dataset access and error translation ---------------------------------------------------

    def _translate(self, exc: BaseException, action: str) -> Exception:
        msg = str(exc)
        low = msg.lower()
        if isinstance(exc, OSError) and ("no space" in low or getattr(exc, "errno", None) == 28):
            return LogWriteError(
                f"{action} on {self.uri} failed: no space left on device. The batch was not acknowledged; "
                "free space and rerun: the next run redoes exactly the unacknowledged work."
            )
        listing_404 = "list request" in low and "404" in low
        if not _is_local(self.uri) and (listing_404 or any(s in low for s in _STORE_ACCESS_ERRORS)):
            bucket = self.uri.split("://", 1)[1].split("/", 1)[0]
            return LogWriteError(
                f"{action} on {self.uri} failed: the object store refused the request or has no bucket "
                f"{bucket!r} ({msg[:200]}). Check the connection's root (bucket and prefix) and its "
                "storage_options (endpoint, region, credentials); nothing was written."
            )
        advice = (
            "Nothing was changed. Restore the dataset directory from a backup or check out an earlier "
            "version (lance restore); run maintain() after restoring."
        )
        if "not found" in low or "no such file" in low or "corrupt" in low or "invalid" in low:
            return LogCorruptedError(
                f"{action} on {self.uri} failed: a file of the dataset is missing or damaged ({msg[:300]}). {advice}"
            )
        return (
            LogWriteError(f"{action} on {self.uri} failed: {msg[:500]}")
            if isinstance(exc, OSError)
            else LogCorruptedError(f"{action} on {self.uri} failed: the dataset is damaged ({msg[:400]}). {advice}")
        )

    def _open_dataset(self) -> lance.LanceDataset | None:
        if _is_local(self.uri):
            path = _local_path(self.uri)
            if not os.path.exists(path):
                return None
            if _being_created(path):
                return None
            if not _has_manifest(path) and _later_commit_records(path):
                raise LogCorruptedError(
                    f"{self.uri} holds data files and records of {len(_later_commit_records(path))} commits but no "
                    "_versions manifest: its version history was deleted or not copied. Nothing was changed. "
                    "Restore the dataset directory (with _versions) from a backup; run maintain() after restoring."
                )
            if not _has_manifest(path):
                raise NotALogError(
                    f"{self.uri} exists but is not a Lance dataset (no _versions manifest); move it away "
                    "or choose another experiment name"
                )
        try:
            ds = lance.dataset(self.uri, storage_options=self.storage_options)
        except ValueError as exc:
            if "was not found" in str(exc) and not _is_local(self.uri):
                return None
            raise self._translate(exc, "opening the log") from None
        except OSError as exc:
            raise self._translate(exc, "opening the log") from None
        self._check_schema(ds)
        return ds

    def _check_schema(self, ds: lance.LanceDataset) -> None:
        meta = ds.schema.metadata or {}
        raw = meta.get(b"datagen_schema_version")
        if raw is None or "event_id" not in ds.schema.names:
            raise NotALogError(
                f"{self.uri} is a Lance dataset but not a datagen checkpoint log (no "
                "datagen_schema_version); point the experiment elsewhere"
            )
        self._check_version(int(raw))

    def _check_version(self, version: int) -> None:
        if version > DATAGEN_SCHEMA_VERSION:
            raise SchemaVersionError(
                f"{self.uri} was written with datagen schema version {version}, newer than this code's "
                f"{DATAGEN_SCHEMA_VERSION}; upgrade airflow-provider-datagen to read it (it was not modified)"
            )
        if version < DATAGEN_SCHEMA_VERSION:
            raise SchemaVersionError(
                f"{self.uri} uses datagen schema version {version}; this code reads version "
                f"{DATAGEN_SCHEMA_VERSION} only. Migrate the log with a release that supports both."
            )

    def _dataset(self) -> lance.LanceDataset | None:
        self._wait_appends()  # read your own writes: a pipelined append lands first
        with self._lock:
            if self._ds is None:
                self._ds = self._open_dataset()
            elif not self._is_latest(self._ds):
                try:
                    self._ds.checkout_latest()
                except (OSError, ValueError) as exc:
                    raise self._translate(exc, "refreshing the log") from None
            return self._ds

    def _is_latest(self, ds: lance.LanceDataset) -> bool:
        """True when no version after ``ds`` exists: one stat instead of listing every manifest.

        ``checkout_latest`` lists the whole ``_versions`` directory on a local disk (0.4 ms per 1,000
        manifests, and maintenance keeps an hour of them), which dominated point reads after many small
        commits. Versions are consecutive and Lance's V2 manifest names are ``u64::MAX - version``, so
        "no manifest for version + 1" proves ``ds`` is the latest. Object stores, or a log with the old
        naming scheme, always refresh.
        """
        if not _is_local(self.uri):
            return False
        base = os.path.join(_local_path(self.uri), "_versions")
        version = int(ds.version)
        return os.path.exists(os.path.join(base, f"{_U64 - version}.manifest")) and not os.path.exists(
            os.path.join(base, f"{_U64 - version - 1}.manifest")
        )

    def exists(self) -> bool:
        return self._dataset() is not None

    @property
    def version(self) -> int:
        ds = self._dataset()
        return 0 if ds is None else int(ds.version)

    def _scan(self, columns: Sequence[str], filter: pc.Expression | None = None) -> pa.Table:
        ds = self._dataset()
        if ds is None:
            return EVENT_SCHEMA.empty_table().select(list(dict.fromkeys([*columns, "schema_version"])))
        return self._scan_ds(ds, columns, filter)

    def _append_pipelined(self, table: pa.Table, on_error: Callable[[BaseException], None]) -> None:
        """Start appending ``table`` on the committer thread, after the append before it has landed."""
        self._wait_appends()
        if self._committer is None:
            self._committer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="datagen-commit")
        self._inflight = self._committer.submit(self._append_on_committer, table, on_error)

    def _append_on_committer(self, table: pa.Table, on_error: Callable[[BaseException], None]) -> None:
        self._committer_ident = threading.get_ident()
        try:
            self._append(table)
        except BaseException as exc:
            on_error(exc)
            raise

    def _wait_appends(self, *, close: bool = False) -> None:
        """Wait for the pipelined append in flight, if any, and raise its error here.

        The committer thread itself never waits (an automatic maintenance inside its append reads the
        log); ``close`` also ends the thread, so an idle log holds none.
        """
        if (self._inflight is None and not close) or threading.get_ident() == self._committer_ident:
            return
        fut, self._inflight = self._inflight, None
        try:
            if fut is not None:
                fut.result()
        finally:
            if close and self._committer is not None:
                self._committer.shutdown(wait=True)
                self._committer = None
                self._committer_ident = None

    def _append(self, table: pa.Table) -> None:
        self._wait_appends()
        # No refresh before appending: Lance rebases an append onto whatever version is latest at
        # commit time (appends never conflict), so reading the newest manifest first is wasted I/O.
        ds = self._ds if self._ds is not None else self._dataset()
        kwargs: dict[str, Any] = {"storage_options": self.storage_options}
        try:
            if ds is None:
                self._create(table)
                self._make_durable()
                return
            self._ds = lance.write_dataset(table, ds, schema=EVENT_SCHEMA, mode="append", **kwargs)
            self._make_durable()
        except DatagenErrorTypes:
            raise
        except (OSError, ValueError, RuntimeError) as exc:
            raise self._translate(exc, "appending a batch") from None
        self._maybe_auto_maintain()

    def _make_durable(self) -> None:
        """fsync what a commit wrote before it counts as acknowledged (local logs only).

        Lance's local store does not fsync (strace shows no fsync/fdatasync, with or without a
        ``local_fsync`` storage option), so an acknowledged batch could vanish on power loss. We fsync
        the new fragments' data files, the new manifest and their directories: the same durability a
        SQLite manifest gets from ``synchronous=FULL``. Object stores are durable once a PUT returns.
        """
        ds = self._ds
        if not self.durable or ds is None or not _is_local(self.uri):
            return
        base = _local_path(self.uri)
        paths = [os.path.join(base, "data", path) for path in self._committed_files(ds)]
        paths.append(os.path.join(base, "_versions", f"{_U64 - int(ds.version)}.manifest"))
        paths.extend((os.path.join(base, "data"), os.path.join(base, "_versions")))
        for path in paths:
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue  # compacted away or an older manifest naming scheme: nothing to sync
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def _committed_files(self, ds: lance.LanceDataset) -> list[str]:
        """The data files our latest commit added, from its transaction record.

        Listing every fragment per commit grew linearly with the log (4 ms a commit at 3,000
        fragments); the transaction names exactly the new files. Should the record be unreadable,
        fall back to the fragments not seen before.
        """
        with contextlib.suppress(OSError, ValueError, RuntimeError, AttributeError):
            tx = ds.read_transaction(int(ds.version))
            frags = getattr(tx.operation, "fragments", None) if tx is not None else None
            if frags is not None:
                return [df.path for frag in frags for df in frag.files]
        files: list[str] = []
        for frag in ds.get_fragments():
            if frag.fragment_id > self._max_fragment_id:
                files.extend(df.path for df in frag.data_files())
                self._max_fragment_id = frag.fragment_id
        return files

    def _create(self, table: pa.Table) -> None:
        """Create the dataset with ``table`` as its first commit, or append it if another writer won.

        ``write_dataset(mode="create")`` commits an Overwrite that Lance retries onto the next version
        when writers race to create the log, silently replacing batches already acknowledged to the
        others (measured: 4 processes creating one log at once kept 1 to 3 of their 4 batches). So the
        first commit claims to read version 0 and is never retried: a writer that loses the race
        commits the fragments it already wrote as an Append onto the winner's dataset.
        """
        opts = self.storage_options
        try:
            frags = lance.fragment.write_fragments(
                table,
                self.uri,
                schema=EVENT_SCHEMA,
                mode="create",
                data_storage_version=_STORAGE_VERSION,
                enable_stable_row_ids=True,
                storage_options=opts,
            )
        except (OSError, ValueError, RuntimeError):
            existing = self._open_dataset()  # created since we looked: a plain append
            if existing is None:
                raise
            self._ds = lance.write_dataset(table, existing, schema=EVENT_SCHEMA, mode="append", storage_options=opts)
            return
        try:
            self._ds = lance.LanceDataset.commit(
                self.uri,
                lance.LanceOperation.Overwrite(EVENT_SCHEMA, frags),
                read_version=0,  # "there was no dataset": a version committed since is a conflict
                max_retries=0,
                enable_stable_row_ids=True,
                storage_options=opts,
            )
            return
        except (OSError, ValueError, RuntimeError) as exc:
            lost_race: BaseException = exc
        # The winner's first version is already visible when our commit of that version failed; poll
        # briefly for stores that list lazily.
        deadline = time.monotonic() + 10.0
        ds = self._open_dataset()
        while ds is None:
            if time.monotonic() > deadline:
                raise lost_race
            time.sleep(0.05)
            ds = self._open_dataset()
        self._ds = lance.LanceDataset.commit(
            self.uri, lance.LanceOperation.Append(frags), read_version=ds.version, storage_options=opts
        )

    def _maybe_auto_maintain(self) -> None:
        limit = self.auto_maintain_fragments
        if not limit or self._ds is None:
            return
        self._appends_since_check += 1
        # Counting fragments lists the manifest; once every 32 appends is plenty for a bound of hundreds.
        if self._appends_since_check < 32:
            return
        self._appends_since_check = 0
        fragments = len(self._ds.get_fragments())
        if fragments >= limit:
            log.info("log %s has %d fragments: running maintenance", self.uri, fragments)
            self.maintain()

    # --- writers ------------------------------------------------------------------------------

    def writer(
        self,
        writer_id: str,
        epoch: int,
        *,
        processor_version: str | None = None,
        airflow: dict[str, Any] | None = None,
    ) -> LogWriter:
        """A writer owning the items it writes at ``epoch``; a newer epoch fences older writers."""
        return LogWriter(self, writer_id, epoch, processor_version=processor_version, airflow=airflow)

    def next_epoch(self) -> int:
        """An epoch higher than any written so far: what a new owner of items should use.

        Every map task asks this first. A fold's ``max_epoch`` counts every row (losers and stale
        ones too), so when this object's last fold or the state projection covers the log up to some
        version, only the rows committed since are scanned, not the whole ``writer_epoch`` column.
        """
        ds = self._dataset()
        if ds is None:
            return 1
        version = int(ds.version)
        top, base = 0, None
        if _row_versions(ds):
            folded = self._memo_base(ds) or self._read_projection(version, columns=["max_epoch"])
            if folded is not None:
                top, base = _max_of(folded[0]["max_epoch"]), folded[1]
        if base != version:
            since = None if base is None else f"_row_created_at_version > {base}"
            top = max(top, _max_of(self._scan_ds(ds, ["writer_epoch"], since)["writer_epoch"]))
        return top + 1

    # --- reads --------------------------------------------------------------------------------

    def _events_from(self, table: pa.Table) -> list[Event]:
        out = []
        for r in table.to_pylist():
            out.append(
                Event(
                    event_id=r["event_id"],
                    item_id=r["item_id"],
                    root_item_id=r["root_item_id"],
                    parent_item_id=r["parent_item_id"],
                    item_seq=r["item_seq"],
                    event_type=EventType(r["event_type"]),
                    status=r["status"],
                    coord=StepCoord(
                        r["step"],
                        r["step_kind"],
                        r["enclosing_step"],
                        r["iteration"],
                        r["fanout_index"],
                        r["selector_step"],
                    ),
                    field=r["field"],
                    value_kind=r["value_kind"],
                    value_json=r["value_json"],
                    value_size=r["value_size"],
                    value_digest=r["value_digest"],
                    input_fingerprint=r["input_fingerprint"],
                    processor_version=r["processor_version"],
                    writer_id=r["writer_id"],
                    writer_epoch=r["writer_epoch"],
                    error_type=r["error_type"],
                    error_message=r["error_message"],
                    error_traceback=r["error_traceback"],
                    dag_id=r["dag_id"],
                    run_id=r["run_id"],
                    task_id=r["task_id"],
                    map_index=r["map_index"],
                    try_number=r["try_number"],
                    created_at=r["created_at"],
                    schema_version=r["schema_version"],
                )
            )
        return out

    def _dedupe_sorted(self, events: list[Event]) -> list[Event]:
        best = dedupe(events)
        return sorted(best.values(), key=lambda e: (e.item_id, e.item_seq, -e.writer_epoch, e.event_key))

    def events(self, item_id: str) -> list[Event]:
        """Every event of one item, ordered by ``item_seq``, de-duplicated by ``event_id``."""
        return self._dedupe_sorted(self._copies(item_id))

    def subtree(self, root_id: str) -> list[Event]:
        """Every event of a root item and its fan-out children (one filter on ``root_item_id``)."""
        return self._dedupe_sorted(self.subtree_copies(root_id))

    def subtree_copies(self, root_id: str) -> list[Event]:
        """Every stored row of a root item and its children, duplicates included (for folding)."""
        _check_item_id(root_id)
        return self._events_from(self._scan(NON_BLOB_COLUMNS, _sql_free_eq("root_item_id", root_id)))

    def _copies(self, item_id: str) -> list[Event]:
        """Every stored row of one item, duplicates included: which epochs wrote a copy matters to fencing."""
        _check_item_id(item_id)
        return self._events_from(self._scan(NON_BLOB_COLUMNS, _sql_free_eq("item_id", item_id)))

    def item_state(self, item_id: str) -> ItemState:
        """The lifecycle fold of one item (fields hold :class:`BlobRef` for blob-stored values)."""
        return fold_events(item_id, self._copies(item_id), self.load_blob)

    def item_states(self, item_ids: Iterable[str]) -> dict[str, ItemState]:
        """Lifecycle folds of many items with one query."""
        ids = list(dict.fromkeys(item_ids))
        if not ids:
            return {}
        for iid in ids:
            _check_item_id(iid)
        table = self._scan(NON_BLOB_COLUMNS, pc.field("item_id").isin(pa.array(ids, pa.string())))
        grouped: dict[str, list[Event]] = {iid: [] for iid in ids}
        for ev in self._events_from(table):
            grouped.setdefault(ev.item_id, []).append(ev)
        return {iid: fold_events(iid, grouped[iid], self.load_blob) for iid in ids}

    def scan(self, columns: Sequence[str], filter: pc.Expression | None = None) -> pa.Table:
        """Rows of the log projected to ``columns`` (never ``value_blob``), optionally filtered.

        For readers such as the UI that need a filtered projection the lenses do not offer; the
        schema version is checked and Lance errors are translated as for every other read.
        """
        if "value_blob" in columns:
            raise InvalidEventError("scan() never reads value_blob; use load_blob(event_id) for blob bytes")
        return self._scan(columns, filter)

    def completed_root_states(self) -> dict[str, ItemState]:
        """Lifecycle folds of every completed root item, from one scan of the non-blob columns."""
        states = self.states()
        if states.num_rows == 0:
            return {}
        done = states.filter(
            pc.and_(
                pc.equal(states["status"], ItemStatus.COMPLETED.value),
                pc.equal(pc.count_substring(states["item_id"], "/"), 0),
            )
        )
        ids = done["item_id"]
        cols = [c for c in NON_BLOB_COLUMNS if c not in ("error_traceback", "error_message")]
        table = self._scan(cols)
        table = table.filter(pc.is_in(table["item_id"], value_set=ids))
        for missing in ("error_traceback", "error_message"):
            table = table.append_column(missing, pa.nulls(table.num_rows, pa.string()))
        grouped: dict[str, list[Event]] = {}
        for ev in self._events_from(table):
            grouped.setdefault(ev.item_id, []).append(ev)
        return {iid: fold_events(iid, evs, self.load_blob) for iid, evs in grouped.items()}

    def failures(self, item_id: str | None = None) -> list[FailureRecord]:
        """The failure lens: FAILED rows and fencing violations, of one item or of the whole log."""
        if item_id is not None:
            evs = self._copies(item_id)
            return failure_records(evs, fold_events(item_id, evs).violations)
        table = self._scan(NON_BLOB_COLUMNS, pc.field("event_type") == pa.scalar(EventType.FAILED.value))
        states = self.states()
        bad = states.filter(pc.greater(states["violations"], 0))["item_id"].to_pylist()
        violations = [v for iid in bad for v in fold_events(iid, self._copies(iid)).violations]
        return failure_records(self._events_from(table), violations)

    def states(self) -> pa.Table:
        """Vectorized fold of every item: one row per item (see ``fold.STATE_SCHEMA``).

        Uses the state projection written by :meth:`maintain` when there is one: items with events
        newer than the projection's log version (``_row_created_at_version``) are re-folded from all
        their events; every other row is exact as stored. Without a usable projection it folds the
        light columns of the whole log.
        """
        return self._states(None)[0]

    def states_for(self, ids: pa.Array | Sequence[str]) -> tuple[pa.Table, np.ndarray]:
        """:meth:`states`, and for each of ``ids`` (unique) its row there, or -1 when it has no events.

        The planner's read. Without a usable projection the fold matches ``ids`` while it encodes
        the log's item ids (``fold.fold_batches``): one hashing pass over the ids instead of two.
        """
        table, index = self._states(ids)
        if index is None:
            index = _rows_of(table, _id_array(ids))
        return table, index

    def _states(self, ids: pa.Array | Sequence[str] | None) -> tuple[pa.Table, np.ndarray | None]:
        ds = self._dataset()
        if ds is None:
            return STATE_SCHEMA.empty_table(), None
        version = int(ds.version)
        table, index = self._states_at(ds, version, ids)
        if self.remember_fold:
            self._memo = (version, self._version_token(version, ds), table)
        return table, index

    def _version_token(self, version: int, ds: lance.LanceDataset) -> tuple[Any, ...] | None:
        """The identity of a version's manifest: a log deleted and written again reuses numbers.

        Local: the manifest file's inode and mtime (one stat). Object stores: the commit time the
        manifest records, from ``ds`` (the log as the caller loaded it) when it is at ``version``,
        so nothing is fetched, else from that version's manifest (one read). None when unknown.
        """
        if _is_local(self.uri):
            try:
                st = os.stat(os.path.join(_local_path(self.uri), "_versions", f"{_U64 - version}.manifest"))
            except OSError:
                return None
            return st.st_ino, st.st_mtime_ns
        try:
            at = ds if int(ds.version) == version else ds.checkout_version(version)
            return ("committed", str(at.get_version()["timestamp"]))
        except (OSError, ValueError, RuntimeError):
            return None  # that version is gone (cleaned up): its fold cannot be proven of this log

    def _memo_base(self, ds: lance.LanceDataset) -> tuple[pa.Table, int] | None:
        """The states this object folded last, when they are of this log at ``ds``'s version or before it.

        A map task folds the log to plan its chunk and again for its status after writing: the
        second fold then reads only the items the task touched, as with the projection.
        """
        memo = self._memo
        if memo is None or memo[1] is None or memo[0] > int(ds.version) or memo[1] != self._version_token(memo[0], ds):
            return None
        return memo[2], memo[0]

    def _states_at(
        self, ds: lance.LanceDataset, version: int, ids: pa.Array | Sequence[str] | None
    ) -> tuple[pa.Table, np.ndarray | None]:
        proj = (self._memo_base(ds) or self._read_projection(version)) if _row_versions(ds) else None
        if proj is not None:
            table, pversion = proj
            if pversion == ds.version:
                return table, None
            delta = self._scan_ds(ds, ["item_id"], f"_row_created_at_version > {pversion}")
            touched = pc.unique(delta["item_id"])
            if len(touched) == 0:
                return table, None
            if len(touched) <= max(1000, table.num_rows // 4):
                events = self._scan_ds(ds, LIGHT_COLUMNS, pc.field("item_id").isin(touched))
                kept = table.filter(pc.invert(pc.is_in(table["item_id"], value_set=touched)))
                return pa.concat_tables([kept, fold_table(events)]), None
        return self._fold_scan(ds, ids)

    def _fold_scan(
        self, ds: lance.LanceDataset, ids: pa.Array | Sequence[str] | None
    ) -> tuple[pa.Table, np.ndarray | None]:
        """Fold the whole log from streamed scans of its light columns (see ``fold.fold_batches``).

        Reading the columns whole held about 1.2 GB for 5M events; streams of batches reduced as
        they arrive hold their numbers and a fifth of their strings. The item ids are one stream
        and the other columns a second, of the same pinned version, so the ids are hashed while
        the wider columns are still read; Lance decodes ahead on its own threads.
        """
        try:
            pinned = ds.checkout_version(int(ds.version))
        except (OSError, ValueError, RuntimeError) as exc:
            raise self._translate(exc, "reading the log") from None
        other = [c for c in LIGHT_COLUMNS if c != "item_id"]
        wanted = None if ids is None else _id_array(ids)
        try:
            return fold_batches(
                self._batches(pinned, ["item_id"], checked=False), wanted, other=self._batches(pinned, other)
            )
        except MisalignedStreamsError:  # one pinned version cannot differ; never fold misaligned rows
            raise LogCorruptedError(f"reading {self.uri}: two scans of version {pinned.version} differ") from None

    def _batches(
        self, ds: lance.LanceDataset, columns: Sequence[str], *, checked: bool = True
    ) -> Iterator[pa.RecordBatch]:
        """The rows of ``columns`` of one version, batch by batch, each batch's schema version checked.

        ``checked=False`` for a second stream of the same rows, whose versions the first one checks.
        """
        cols = list(dict.fromkeys([*columns, "schema_version"])) if checked else list(columns)
        try:
            stream = iter(
                ds.to_batches(
                    columns=cols, batch_size=_SCAN_BATCH_ROWS, batch_readahead=_SCAN_READAHEAD, fragment_readahead=1
                )
            )
        except (OSError, ValueError, RuntimeError) as exc:
            raise self._translate(exc, "reading the log") from None
        while True:
            # only Lance's own calls are translated, never an error raised by the consumer at the yield
            try:
                batch = next(stream)
            except StopIteration:
                return
            except (OSError, ValueError, RuntimeError) as exc:
                raise self._translate(exc, "reading the log") from None
            if checked:
                self._check_versions(batch.column("schema_version"))
            yield batch

    def _scan_ds(self, ds: lance.LanceDataset, columns: Sequence[str], filter: Any) -> pa.Table:
        cols = list(dict.fromkeys([*columns, "schema_version"]))
        try:
            table = ds.to_table(columns=cols, filter=filter)
        except (OSError, ValueError, RuntimeError) as exc:
            raise self._translate(exc, "reading the log") from None
        self._check_versions(table["schema_version"])
        return table

    def _check_versions(self, versions: pa.ChunkedArray | pa.Array) -> None:
        """:meth:`_check_version` for the lowest and highest schema version in a scanned column."""
        if len(versions):
            for v in {pc.max(versions).as_py(), pc.min(versions).as_py()}:
                self._check_version(int(v))

    def _open_projection(self) -> tuple[lance.LanceDataset, int] | None:
        """The state projection and the log version it folds, when it is one this code can read.

        The projection is a disposable cache (seed 000: rebuildable, excluded from correctness): any
        doubt (missing, unreadable, another schema) means there is none.
        """
        if _is_local(self.projection_uri) and not os.path.isdir(os.path.join(self.projection_uri, "_versions")):
            return None
        try:
            pds = lance.dataset(self.projection_uri, storage_options=self.storage_options)
        except (OSError, ValueError, RuntimeError) as exc:
            # on an object store there is no directory to look for first: absent is the usual case
            if "not found" not in str(exc).lower():
                log.warning("ignoring the state projection of %s: %s", self.uri, str(exc)[:200])
            return None
        meta = pds.schema.metadata or {}
        if (
            int(meta.get(b"datagen_schema_version", b"0")) != DATAGEN_SCHEMA_VERSION
            or pds.schema.remove_metadata() != STATE_SCHEMA
        ):
            return None
        return pds, int(meta.get(b"log_version", b"-1"))

    def _read_projection(self, log_version: int, columns: Sequence[str] | None = None) -> tuple[pa.Table, int] | None:
        """The state projection (or its ``columns``) and the log version it folds; None when unusable.

        A projection of a version ahead of the log (a log deleted and written again) is unusable too.
        """
        opened = self._open_projection()
        if opened is None or not 0 < opened[1] <= log_version:
            return None
        pds, pversion = opened
        try:
            table = pds.to_table(columns=None if columns is None else list(columns))
        except (OSError, ValueError, RuntimeError) as exc:
            log.warning("ignoring the state projection of %s: %s", self.uri, str(exc)[:200])
            return None
        return table.replace_schema_metadata(None), pversion

    def _write_projection(self, ds: lance.LanceDataset, cleanup_older_than: dt.timedelta) -> int:
        """Fold the log at ``ds``'s version and store the result as the state projection."""
        table = self._fold_scan(ds, None)[0]
        self._store_projection(table, int(ds.version), cleanup_older_than)
        return table.num_rows

    def _store_projection(self, table: pa.Table, version: int, cleanup_older_than: dt.timedelta) -> bool:
        """Store ``table``, the fold of the log at ``version``, as the state projection.

        Each write is an overwrite, a new version of ``state.lance``; old versions are removed on the
        log's own retention, else every maintenance would leave a full copy behind. A reader that loses
        its version to the cleanup just folds the log (the projection is disposable).
        """
        table = table.replace_schema_metadata(
            {"log_version": str(version), "datagen_schema_version": str(DATAGEN_SCHEMA_VERSION)}
        )
        try:
            written = lance.write_dataset(
                table, self.projection_uri, mode="overwrite", storage_options=self.storage_options
            )
            written.cleanup_old_versions(older_than=cleanup_older_than)
        except (OSError, ValueError, RuntimeError) as exc:
            log.warning("could not write the state projection of %s: %s", self.uri, str(exc)[:200])
            return False
        return True

    def refresh_projection(
        self,
        *,
        min_new_events: int | None = None,
        cleanup_older_than: dt.timedelta = dt.timedelta(hours=1),
    ) -> bool:
        """Store this object's last fold as the state projection when it covers many more events.

        A planner has just folded the whole log; without a projection every mapped task would fold
        it again from scratch (seconds and most of a GiB at millions of events). Writing the fold it
        already has costs a fraction of one fold, and only when at least ``min_new_events`` events
        are covered by this fold but not by the projection (default :data:`PROJECTION_MIN_NEW_EVENTS`).
        The fold's identity (see ``_version_token``) is what proves it is of this log. Returns whether
        it wrote.
        """
        if min_new_events is None:
            min_new_events = PROJECTION_MIN_NEW_EVENTS
        ds = self._dataset()
        if ds is None or not _row_versions(ds):
            return False
        folded = self._memo_base(ds)
        if folded is None:
            return False
        table, version = folded
        proj = self._projection_version()
        if proj >= version:
            return False
        try:
            new = ds.count_rows(filter=f"_row_created_at_version > {proj} AND _row_created_at_version <= {version}")
        except (OSError, ValueError, RuntimeError) as exc:
            raise self._translate(exc, "reading the log") from None
        if new < min_new_events:
            return False
        lease = _MaintenanceLease(self.uri)
        if not lease.acquire():  # a maintenance is writing a newer projection
            return False
        try:
            stored = self._store_projection(table, version, cleanup_older_than)
        finally:
            lease.release()
        if stored:
            log.info(
                "stored the fold of %s at version %d as its state projection (%d new events)", self.uri, version, new
            )
        return stored

    def _projection_version(self) -> int:
        """The log version the state projection folds; 0 when there is none it could be read as."""
        opened = self._open_projection()
        return 0 if opened is None else max(opened[1], 0)

    def summary(self, states: pa.Table | None = None) -> dict[str, Any]:
        """Counts of root items by lifecycle status, failures, and the log version."""
        if states is None:
            states = self.states()
        ids = states["item_id"]
        depth = pc.count_substring(ids, "/") if states.num_rows else pa.array([], pa.int64())
        roots = states.filter(pc.equal(depth, 0)) if states.num_rows else states
        counts = {s.value: 0 for s in ItemStatus}
        if roots.num_rows:
            vc = pc.value_counts(roots["status"])
            for entry in vc.to_pylist():
                counts[entry["values"]] = int(entry["counts"])
        failed_mask = (
            pc.and_(pc.equal(roots["status"], ItemStatus.RUNNING.value), pc.greater(roots["failures"], 0))
            if roots.num_rows
            else None
        )
        failed = roots.filter(failed_mask) if failed_mask is not None else roots
        return {
            "pipeline": self.pipeline,
            "experiment": self.experiment,
            "total": roots.num_rows,
            "completed": counts[ItemStatus.COMPLETED.value],
            "filtered": counts[ItemStatus.FILTERED.value],
            "running": counts[ItemStatus.RUNNING.value],
            "never_started": counts[ItemStatus.NEVER_STARTED.value],
            "failed_items": failed.num_rows,
            "failed_item_ids": sorted(failed["item_id"].to_pylist())[:_FAILED_SAMPLE],
            "pending": counts[ItemStatus.RUNNING.value] + counts[ItemStatus.NEVER_STARTED.value],
            "children": states.num_rows - roots.num_rows,
            "fencing_violations": int(pc.sum(states["violations"]).as_py() or 0) if states.num_rows else 0,
            "log_version": self.version,
        }

    def load_blob(self, event_id: str) -> bytes:
        """The bytes of a blob-stored value; the only read that touches ``value_blob``."""
        ds = self._dataset()
        if ds is None:
            raise InvalidEventError(f"no event {event_id!r}: the log {self.uri} is empty")
        try:
            hit = ds.to_table(
                columns=["event_id", "value_kind", "value_size"],
                filter=_sql_free_eq("event_id", event_id),
                with_row_id=True,
            )
            if hit.num_rows == 0:
                raise InvalidEventError(f"no event {event_id!r} in {self.uri}")
            if hit["value_kind"][0].as_py() is None or hit["value_size"][0].as_py() is None:
                raise InvalidEventError(f"event {event_id!r} carries no value")
            blobs = ds.take_blobs("value_blob", ids=[int(hit["_rowid"][0].as_py())])
        except (OSError, RuntimeError) as exc:
            raise self._translate(exc, f"loading blob {event_id}") from None
        blob = blobs[0]
        if blob is None:
            raise InvalidEventError(f"event {event_id!r} stores its value inline; read it from item_state()")
        with blob as f:
            return f.read()

    def stats(self) -> dict[str, Any]:
        """Version, fragment count, event count and on-disk size of the log."""
        ds = self._dataset()
        if ds is None:
            return {"version": 0, "fragments": 0, "events": 0, "size_bytes": 0}
        size = 0
        if _is_local(self.uri):
            for dirpath, _, files in os.walk(_local_path(self.uri)):
                for name in files:
                    with contextlib.suppress(OSError):
                        size += os.path.getsize(os.path.join(dirpath, name))
        return {
            "version": int(ds.version),
            "fragments": len(ds.get_fragments()),
            "events": int(ds.count_rows()),
            "size_bytes": size,
        }

    def write_source_snapshot(self, items: Sequence[Any]) -> str:
        """Store an inline source once, content-addressed beside the log; returns its URI."""
        from airflow_provider_datagen.core.chunks import snapshot_digest
        from airflow_provider_datagen.core.events import canonical_json

        uri = f"{self.uri.rsplit('/', 1)[0]}/sources/{snapshot_digest(list(items))}.lance"
        try:
            lance.dataset(uri, storage_options=self.storage_options)
            return uri
        except (ValueError, OSError):
            pass
        table = pa.table(
            {
                "item_id": [s.item_id for s in items],
                "item": [canonical_json(s.data, what=f"item {s.item_id!r}") for s in items],
            }
        )
        try:
            lance.write_dataset(table, uri, mode="overwrite", storage_options=self.storage_options)
        except (OSError, ValueError) as exc:
            raise self._translate(exc, "writing the source snapshot") from None
        return uri

    # --- maintenance --------------------------------------------------------------------------

    def maintain(
        self,
        *,
        cleanup_older_than: dt.timedelta = dt.timedelta(hours=1),
        target_rows_per_fragment: int = 1 << 20,
    ) -> dict[str, Any]:
        """Compact fragments, build or refresh scalar indices, drop old versions; safe beside writers.

        Compaction rewrites existing fragments only and commits optimistically, so appends that land
        meanwhile are kept; stable row ids keep blob references valid; cleanup keeps every version
        younger than ``cleanup_older_than`` so concurrent readers never lose the files they read.
        """
        if self._dataset() is None:
            return {"skipped": True, "reason": "the log is empty"}
        lease = _MaintenanceLease(self.uri)
        if not lease.acquire():
            return {"skipped": True, "reason": "another maintenance worker holds the lease"}
        try:
            ds = self._dataset()
            if ds is None:
                return {"skipped": True, "reason": "the log is empty"}
            before = len(ds.get_fragments())
            try:
                ds.optimize.compact_files(target_rows_per_fragment=target_rows_per_fragment)
                ds = self._dataset()
                assert ds is not None
                present = {idx.field_names[0] for idx in ds.describe_indices() if idx.field_names}
                for col in _INDEXED_COLUMNS:
                    if col not in present:
                        ds.create_scalar_index(col, "BTREE")
                ds = self._dataset()
                assert ds is not None
                ds.optimize.optimize_indices()
                ds = self._dataset()
                assert ds is not None
                removed = ds.cleanup_old_versions(older_than=cleanup_older_than)
            except (OSError, RuntimeError, ValueError) as exc:
                if "conflict" in str(exc).lower() or "retryable" in str(exc).lower():
                    return {"skipped": True, "reason": f"a concurrent maintenance committed first ({exc})"}
                raise self._translate(exc, "maintaining the log") from None
            ds = self._dataset()
            assert ds is not None
            projected = self._write_projection(ds, cleanup_older_than)
            return {
                "skipped": False,
                "projected_items": projected,
                "fragments_before": before,
                "fragments_after": len(ds.get_fragments()),
                "version": int(ds.version),
                "removed_versions": int(getattr(removed, "old_versions", 0) or 0),
                "indices": sorted(_INDEXED_COLUMNS),
            }
        finally:
            lease.release()


DatagenErrorTypes = (
    FencingError,
    InvalidEventError,
    LogCorruptedError,
    LogWriteError,
    NotALogError,
    SchemaVersionError,
)

__all__ = ["Batch", "CheckpointLog", "LogWriter"]


def _row_versions(ds: lance.LanceDataset) -> bool:
    """Whether rows carry the version that committed them (``_row_created_at_version``).

    Only with stable row ids; otherwise every row reads as version 1. Our logs always have them, a
    dataset written by another tool may not: then no delta since a version can be trusted.
    """
    return bool(getattr(ds, "has_stable_row_ids", False))


def _max_of(col: pa.ChunkedArray | pa.Array) -> int:
    """The largest value of an integer column; 0 when it is empty."""
    top = pc.max(col).as_py() if len(col) else None
    return 0 if top is None else int(top)


def _id_array(ids: pa.Array | Sequence[str]) -> pa.Array:
    return ids if isinstance(ids, pa.Array) else pa.array(ids, pa.string())


def _rows_of(states: pa.Table, ids: pa.Array) -> np.ndarray:
    """For each of ``ids``, its row in ``states`` (-1 when absent)."""
    if states.num_rows == 0:
        return np.full(len(ids), -1, dtype=np.int64)
    found = pc.index_in(ids, value_set=states["item_id"]).fill_null(-1)
    return np.asarray(found.to_numpy(zero_copy_only=False), dtype=np.int64)


def read_lance_table(uri: str, storage_options: dict[str, str] | None = None) -> pa.Table:
    """Read a whole Lance dataset (a source of items); errors name the dataset."""
    try:
        return lance.dataset(uri, storage_options=storage_options).to_table()
    except (OSError, ValueError) as exc:
        raise InvalidItemError(f"source {uri!r} is not a readable Lance dataset: {str(exc)[:300]}") from None


def write_results_dataset(table: pa.Table, uri: str, storage_options: dict[str, str] | None = None) -> None:
    """Overwrite the export dataset at ``uri`` (the log is never touched)."""
    if uri.rstrip("/").endswith("/log.lance") and "/datagen_checkpoints/" in uri:
        raise InvalidNameError(f"export destination {uri!r} is a checkpoint log; export to another path")
    try:
        lance.write_dataset(table, uri, mode="overwrite", storage_options=storage_options)
    except (OSError, ValueError) as exc:
        raise LogWriteError(f"writing the export to {uri} failed: {str(exc)[:300]}") from None
