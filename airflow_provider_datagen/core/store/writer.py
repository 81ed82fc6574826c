"""LogWriter: numbers and hashes a batch's events, builds its Arrow table, and commits it.

One writer appends for one owner (``writer_id``) at one ``epoch``; a newer epoch fences older
writers (see docs/design.md, "The event log"). The writer remembers each item's last sequence
number, input fingerprint and field modes, so a commit needs no read of the log for items it has
seen. :class:`Committer` runs pipelined commits (group commit) on one thread per log.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import datetime as dt
import hashlib
import itertools
import threading
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import numpy as np
import pyarrow as pa

from airflow_provider_datagen.core.events import ID_DIGEST_SIZE, event_ids_of
from airflow_provider_datagen.core.ids import check_name, parent_of, root_of
from airflow_provider_datagen.core.schema import DATAGEN_SCHEMA_VERSION, EVENT_SCHEMA, ItemStatus, StepKind
from airflow_provider_datagen.core.store import completions
from airflow_provider_datagen.core.store.batch import (
    APPEND,
    APPEND_VALUE,
    COMPLETED_VALUE,
    CREATED,
    CREATED_VALUE,
    OTHER,
    SEP,
    SET,
    SET_VALUE,
    TERMINAL_VALUE,
    Batch,
    Shape,
    check_item_id,
    exact,
    id_part,
)
from airflow_provider_datagen.exceptions import FencingError, InvalidEventError, InvalidNameError, LogWriteError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

    from airflow_provider_datagen.core.fold import ItemState
    from airflow_provider_datagen.core.store.batch import StagedEvent
    from airflow_provider_datagen.core.store.completions import Completion

MAX_EPOCH = (1 << 31) - 1
_VALID_STEP_NAMES: set[str] = set()
_STEP_KINDS: dict[Any, str] = {**{k.value: k.value for k in StepKind}, **{k: k.value for k in StepKind}}
_EVENT_KINDS = {CREATED_VALUE: CREATED, SET_VALUE: SET, APPEND_VALUE: APPEND}
_MODE_NAMES = {SET: "set", APPEND: "append"}
_NO_MODES: dict[str, str] = {}  # shared, never mutated: a commit copies a mode map before writing it
#: The event-id parts after the coordinates (field, value, error type, error message), all empty.
_NO_EXTRAS = SEP * 4
#: Columns that depend only on an event's shape, in the order of :attr:`Shape.columns`.
SHAPE_COLUMNS = (
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
_SHAPE_IDS = itertools.count()
#: Shapes are few (event type x step coordinates); the bound only matters for huge fan-outs or loops.
_MAX_SHAPES = 8192
_AIRFLOW_COLUMNS = {
    "dag_id": pa.string(),
    "run_id": pa.string(),
    "task_id": pa.string(),
    "map_index": pa.int64(),
    "try_number": pa.int64(),
}

#: What a writer knows of an item, a list ``[last_seq, input_fingerprint, field_modes, modes_owned]``
#: (``modes_owned``: the mode map is this list's own copy). Mutable and per item, so indexed by these
#: names rather than built as a record: :meth:`LogWriter._sequence` makes one per item per commit.
LAST_SEQ, FINGERPRINT, FIELD_MODES, MODES_OWNED = 0, 1, 2, 3


class WriterLog(Protocol):
    """What a writer needs of its log (:class:`~.log.CheckpointLog` is one, typed here, not imported).

    The states of the items it has not seen (one query per commit), and the appends of the tables it builds.
    """

    blob_threshold: int

    def item_states(self, item_ids: Iterable[str]) -> dict[str, ItemState]: ...

    def append(self, table: pa.Table) -> None: ...

    def append_pipelined(self, table: pa.Table, on_error: Callable[[BaseException], None]) -> None: ...

    def wait_appends(self, *, close: bool = False) -> None: ...


class Sequenced(NamedTuple):
    """A batch numbered and hashed: per item its new cursor, per event its columns."""

    cursors: dict[str, list[Any]]
    seqs: list[int]
    fingerprints: list[str | None]
    digests: list[bytes]
    shape_ids: list[int]


class LogWriter:
    """Appends batches for one owner (``writer_id``) at one ``epoch``; remembers item sequences."""

    def __init__(
        self,
        log: WriterLog,
        writer_id: str,
        epoch: int,
        *,
        processor_version: str | None = None,
        airflow: dict[str, Any] | None = None,
    ) -> None:
        if not isinstance(writer_id, str) or not writer_id or len(writer_id) > 1024 or "\x00" in writer_id:
            raise InvalidNameError(f"writer_id {writer_id!r} must be a non-empty string up to 1024 characters")
        if isinstance(epoch, bool) or not isinstance(epoch, int) or not 0 <= epoch <= MAX_EPOCH:
            raise InvalidEventError(f"epoch {epoch!r} must be an int in [0, 2**31); use log.next_epoch()")
        self.log = log
        self.writer_id = writer_id
        self.epoch = epoch
        self.processor_version = processor_version
        self.airflow = dict(airflow or {})
        #: per validated item id, its cursor (see LAST_SEQ); a batch reads this dict on every event
        self.item_cursors: dict[str, Sequence[Any]] = {}
        self._shapes: dict[tuple[Any, ...], Shape] = {}
        #: the shapes of TERMINAL by status, the one event every item ends with (batches fill it)
        self.terminal_shapes: dict[str, Shape] = {}
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
        item_id = exact(check_item_id(item_id))
        self.item_cursors[item_id] = [
            last_seq,
            input_fingerprint,
            dict(field_modes) if field_modes else _NO_MODES,
            False,
        ]

    def prime_new(self, item_ids: Iterable[str], last_seqs: Mapping[str, int]) -> None:
        """:meth:`prime` for item ids already validated (``prepare_items`` built them) with no history
        but their last sequence number."""
        get = last_seqs.get
        self.item_cursors.update({iid: (get(iid, -1), None, _NO_MODES, False) for iid in item_ids})

    def new_batch(self) -> Batch:
        """An empty batch of this writer, committed by :meth:`commit` (the runner's buffers)."""
        return Batch(self)

    @contextlib.contextmanager
    def batch(self) -> Iterator[Batch]:
        """Collect events; on a clean exit they are committed as one append (nothing on an error)."""
        b = Batch(self)
        yield b
        if len(b):
            self.commit(b)

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
    ) -> Shape:
        """The validated, cached :class:`Shape` of an event (the runner builds its per-step shapes here)."""
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
        sequenced = event_type in (CREATED_VALUE, COMPLETED_VALUE)
        # One order for both: the id text and the stored columns name the same coordinates.
        parts = (status, step_kind, step, enclosing_step, selector_step, iteration, fanout_index)
        coords = SEP + SEP.join(id_part(p) for p in (processor_version if sequenced else None, *parts))
        shape = Shape(
            shape_id=next(_SHAPE_IDS),
            kind=_EVENT_KINDS.get(event_type, OTHER),
            id_middle=f"{SEP}{event_type}{SEP}",
            id_tail=coords + _NO_EXTRAS,
            id_coords=coords,
            columns=(event_type, *parts, processor_version),
        )
        if len(self._shapes) >= _MAX_SHAPES:
            self._shapes.clear()
        self._shapes[key] = shape
        return shape

    def _lookup(self, item_ids: Sequence[str]) -> None:
        states = self.log.item_states(item_ids)
        for iid in item_ids:
            st = states[iid]
            self._check_epoch(iid, st.max_epoch)
            self.item_cursors[iid] = [st.last_seq, st.input_fingerprint, dict(st.field_modes), False]

    def prime_created(
        self, item_ids: Sequence[str], last_seqs: Sequence[int], fingerprints: Sequence[str], max_epochs: Sequence[int]
    ) -> None:
        """Tell the writer of items whose generation holds its ITEM_CREATED alone (no field yet), from a
        vectorized fold's state rows: what :meth:`_lookup` would fold one by one (~40 us an item), checked
        for fencing the same way. For item ids the log already holds (validated when written); an item the
        writer already knows keeps its cursor."""
        known = self.item_cursors
        new = [k for k, iid in enumerate(item_ids) if iid not in known]  # this writer's own cursor is as new
        for k in new:
            self._check_epoch(item_ids[k], max_epochs[k])
        known.update({item_ids[k]: (last_seqs[k], fingerprints[k], _NO_MODES, False) for k in new})

    def _check_epoch(self, item_id: str, max_epoch: int) -> None:
        if max_epoch > self.epoch:
            raise FencingError(
                f"writer {self.writer_id!r} at epoch {self.epoch} may not write item {item_id!r}: epoch "
                f"{max_epoch} already owns it. A newer attempt took over; stop this one."
            )

    def commit(self, batch: Batch, *, wait: bool = True) -> int:
        """Validate, sequence and append a batch in one Lance commit; returns the events written.

        ``wait=False`` pipelines the commit: the batch is validated and sequenced here (its errors
        raise before any write, as always), and the Lance append and fsync run on the log's committer
        thread while the caller goes on. At most one append is in flight; the next commit or any read
        of the log waits for it and raises its error, and :meth:`sync` waits for it explicitly. Group
        commit uses this because an unacknowledged item is redone after a crash either way, so the
        append need not hold up the next items' work.
        """
        self._check_usable()
        events = batch.events
        n = len(events)
        if not n:
            return 0
        items = self.item_cursors
        sequenced = self._sequence(events, items)
        if sequenced is None:  # items this writer has not seen: one query for all of them
            unknown = dict.fromkeys([iid for iid, _, _, _, _ in events])
            self._lookup([iid for iid in unknown if iid not in items])
            sequenced = self._sequence(events, items)
            assert sequenced is not None
        return self._land(
            lambda: self._table(batch, "/" in "\n".join(sequenced.cursors), sequenced), sequenced.cursors, n, wait
        )

    def commit_completions(self, step: str, rows: Sequence[Completion], *, wait: bool = True) -> int:
        """Complete many items in one commit: per item its FIELD_SETs, a STEP_COMPLETED with its value
        (``step_kind`` Step) and the TERMINAL ``completed``; returns the events written.

        The same events, ids and columns as staging each through :meth:`batch` (``field_set`` per field,
        ``step_completed``, ``terminal``), built column by column (``core/store/completions.py``): the
        recording of a batch's results, thousands of items a commit. ``wait=False`` pipelines the append
        as :meth:`commit` does.
        """
        self._check_usable()
        if not rows:
            return 0
        items = self.item_cursors
        unknown = [iid for iid, _, _ in rows if type(iid) is not str or iid not in items]
        if unknown:
            self._lookup([exact(check_item_id(iid)) for iid in dict.fromkeys(unknown)])
        shapes = (
            self.shape(SET_VALUE, step=step),
            self.shape(
                COMPLETED_VALUE, step=step, step_kind=StepKind.STEP.value, processor_version=self.processor_version
            ),
            self.shape(TERMINAL_VALUE, status=ItemStatus.COMPLETED.value),
        )
        cursors, staged = completions.sequence_completions(rows, items, shapes)
        n = len(staged["digests"])

        def table() -> pa.Table:
            cols = completions.completions_columns(staged, shapes, SHAPE_COLUMNS, self.processor_version)
            cols.update(self._constant_columns(n))
            return pa.Table.from_arrays([cols[f.name] for f in EVENT_SCHEMA], schema=EVENT_SCHEMA)

        return self._land(table, cursors, n, wait)

    def _land(self, build: Callable[[], pa.Table], cursors: Mapping[str, Any], n: int, wait: bool) -> int:
        """Build a sequenced commit's table and append it (pipelined unless ``wait``); then the writer
        takes the commit's ``cursors``. Text Arrow refuses is an error before any write."""
        try:
            table = build()
        except (UnicodeEncodeError, pa.ArrowInvalid) as exc:
            raise InvalidEventError(
                f"a batch of writer {self.writer_id!r} holds text that is not valid UTF-8 (an item id, "
                f"field name or fingerprint with a lone surrogate?): {str(exc)[:200]}; decode it properly "
                "(nothing of this batch was written)"
            ) from None
        if wait:
            self.log.append(table)
        else:
            self.log.append_pipelined(table, self._lose)
        self.item_cursors.update(cursors)
        self.commits += 1
        self.events_written += n
        return n

    def _check_usable(self) -> None:
        if self._lost is not None:
            raise LogWriteError(
                f"writer {self.writer_id!r} lost a pipelined append ({self._lost}); the batches it counted "
                "after that one were not written. Open a new writer (rerun the task): the next run redoes "
                "exactly the unacknowledged work."
            )

    def _lose(self, exc: BaseException) -> None:
        self._lost = exc

    def sync(self) -> None:
        """Wait until every pipelined commit of this writer's log has landed; raise an append's error."""
        self.log.wait_appends(close=True)

    @staticmethod
    def _sequence(events: list[StagedEvent], items: dict[str, Any]) -> Sequenced | None:
        """Number the events of a batch and hash their ids; None if an item is unknown to the writer.

        Works on copies of the items' cursors, so a batch that fails leaves the writer's state untouched.
        """
        cursors: dict[str, list[Any]] = {}
        seqs: list[int] = []
        fps: list[str | None] = []
        digests: list[bytes] = []
        shape_ids: list[int] = []
        add_seq, add_fp, add_digest, add_shape = seqs.append, fps.append, digests.append, shape_ids.append
        cursors_get, items_get = cursors.get, items.get
        # copying a keyless BLAKE2b state is cheaper than constructing one per event
        new_hash = hashlib.blake2b(digest_size=ID_DIGEST_SIZE).copy
        for iid, shape, fp, tail, extras in events:
            cur = cursors_get(iid)
            if cur is None:
                known = items_get(iid)
                if known is None:
                    return None
                last_seq, fingerprint, modes, _ = known
                cur = cursors[iid] = [last_seq, fingerprint, modes, False]
            seq = cur[LAST_SEQ] = cur[LAST_SEQ] + 1
            kind = shape.kind
            if kind:
                if kind == CREATED:
                    cur[FINGERPRINT] = fp
                    cur[FIELD_MODES] = {}
                    cur[MODES_OWNED] = True
                else:
                    name = extras[0]  # type: ignore[index]  # a field event always carries its name
                    mode = _MODE_NAMES[kind]
                    prev = cur[FIELD_MODES].get(name)
                    if prev is not None and prev != mode:
                        raise InvalidEventError(
                            f"item {iid!r}: field {name!r} was written with FIELD_"
                            f"{prev.upper()} and cannot take FIELD_{mode.upper()}; use one mode per field "
                            "(nothing of this batch was written)"
                        )
                    if prev is None:
                        if not cur[MODES_OWNED]:
                            cur[FIELD_MODES] = dict(cur[FIELD_MODES])
                            cur[MODES_OWNED] = True
                        cur[FIELD_MODES][name] = mode
            if fp is None:
                fp = cur[FINGERPRINT]
            add_seq(seq)
            add_fp(fp)
            add_shape(shape.shape_id)
            # The text of events.event_id_for, built from the precomputed parts of the shape.
            h = new_hash()
            h.update(
                f"{iid}{SEP}{seq}{shape.id_middle}{'' if fp is None else fp}{tail}".encode("utf-8", "surrogatepass")
            )
            add_digest(h.digest())
        return Sequenced(cursors, seqs, fps, digests, shape_ids)

    def _table(self, batch: Batch, nested: bool, sequenced: Sequenced) -> pa.Table:
        """The Arrow table of a sequenced batch, built column by column (``nested``: a child id is in it)."""
        events = batch.events
        n = len(events)
        cols: dict[str, Any] = {}
        ids, keys = event_ids_of(b"".join(sequenced.digests))
        cols["event_id"] = ids
        cols["event_key"] = pa.array(keys)
        cols["schema_version"] = pa.array(np.full(n, DATAGEN_SCHEMA_VERSION, np.int32))
        item_ids = [iid for iid, _, _, _, _ in events]
        item_arr = pa.array(item_ids, pa.string())
        cols["item_id"] = item_arr
        parent_overrides: dict[int, str] = {}
        with_values: list[tuple[int, Any, Any]] = []
        with_errors: list[tuple[int, Any]] = []
        for i in batch.with_extras:
            _, _, _, _, extras = events[i]
            field, value, error, parent = extras  # type: ignore[misc]  # with_extras lists only events with extras
            if parent is not None:
                parent_overrides[i] = parent
            if field is not None or value is not None:
                with_values.append((i, field, value))
            if error is not None:
                with_errors.append((i, error))
        if nested or parent_overrides:
            parents = {iid: parent_of(iid) for iid in dict.fromkeys(item_ids)}
            cols["root_item_id"] = pa.array([root_of(iid) for iid in item_ids], pa.string())
            parent_list = [parents[iid] for iid in item_ids]
            for i, parent in parent_overrides.items():
                parent_list[i] = parent
            cols["parent_item_id"] = pa.array(parent_list, pa.string())
        else:
            cols["root_item_id"] = item_arr
            cols["parent_item_id"] = pa.nulls(n, pa.string())
        cols["item_seq"] = pa.array(np.fromiter(sequenced.seqs, np.int64, n))
        # Shape columns: one row per distinct shape of the batch, spread to the events by take.
        _, first, inverse = np.unique(np.array(sequenced.shape_ids, np.int64), return_index=True, return_inverse=True)
        shape_rows = [shape.columns for _, shape, _, _, _ in (events[int(i)] for i in first)]
        where = pa.array(inverse.astype(np.int32))
        for j, name in enumerate(SHAPE_COLUMNS):
            values = [row[j] for row in shape_rows]
            if name == "processor_version":
                values = [self.processor_version if v is None else v for v in values]
            cols[name] = pa.array(values, EVENT_SCHEMA.field(name).type).take(where)
        cols["input_fingerprint"] = pa.array(sequenced.fingerprints, pa.string())
        extra_cols: dict[str, list[Any]] = {}
        if with_values:
            field_, vkind, vjson, vsize, vdigest, vblob = ([None] * n for _ in range(6))
            for i, name, enc in with_values:
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
            for i, error in with_errors:
                etype[i], emsg[i], etb[i] = error.type, error.message, error.traceback
            extra_cols.update(error_type=etype, error_message=emsg, error_traceback=etb)
        for name in _EXTRA_COLUMNS:
            typ = EVENT_SCHEMA.field(name).type
            filled = extra_cols.get(name)
            cols[name] = pa.nulls(n, typ) if filled is None else pa.array(filled, typ)
        cols.update(self._constant_columns(n))
        return pa.Table.from_arrays([cols[f.name] for f in EVENT_SCHEMA], schema=EVENT_SCHEMA)

    def _constant_columns(self, n: int) -> dict[str, Any]:
        """The columns every event of a commit shares: per-writer constants repeated, not built per event."""
        cols: dict[str, Any] = {}
        cols["writer_id"] = pa.repeat(pa.scalar(self.writer_id, pa.string()), n)
        cols["writer_epoch"] = pa.array(np.full(n, self.epoch, np.int64))
        af = self.airflow
        for key, typ in _AIRFLOW_COLUMNS.items():
            value = af.get(key)
            cols[key] = pa.nulls(n, typ) if value is None else pa.repeat(pa.scalar(value, typ), n)
        now_us = np.datetime64(dt.datetime.now(dt.UTC).replace(tzinfo=None), "us")
        cols["created_at"] = pa.array(np.full(n, now_us), pa.timestamp("us", tz="UTC"))
        return cols


#: Columns filled from an event's extras (field value, error).
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


class Committer:
    """The one thread that runs a log's pipelined appends, one at a time (``commit(wait=False)``).

    It calls the log's ``append`` itself, so a read on the committer thread (an automatic maintenance
    inside an append) must never wait for it: :meth:`on_thread` tells.
    """

    def __init__(self, append: Callable[[pa.Table], None]) -> None:
        self._append = append
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="datagen-commit")
        self._ident: int | None = None
        #: the append in flight, if any
        self.inflight: concurrent.futures.Future[None] | None = None

    def submit(self, table: pa.Table, on_error: Callable[[BaseException], None]) -> None:
        """Start appending ``table``; the caller waited for the append before it."""
        self.inflight = self._pool.submit(self._run, table, on_error)

    def _run(self, table: pa.Table, on_error: Callable[[BaseException], None]) -> None:
        self._ident = threading.get_ident()
        try:
            self._append(table)
        except BaseException as exc:
            on_error(exc)
            raise

    def on_thread(self) -> bool:
        return threading.get_ident() == self._ident

    def wait(self) -> None:
        """Wait for the append in flight, if any, and raise its error here."""
        fut, self.inflight = self.inflight, None
        if fut is not None:
            fut.result()

    def close(self) -> None:
        self._pool.shutdown(wait=True)
