"""The resume engine: drives source items through a pipeline with inbox/ack semantics and group commit.

Seed 004's durable inbox mapped onto the log: pulling a group of items writes their ITEM_CREATED rows
in one commit *before* any work (the inbox); an item's field deltas, STEP_COMPLETED and TERMINAL are
acknowledged together later. A run first replays inbox items (from their rebuilt coordinates when the
processor version matches), then restarts demoted and edited items, then pulls fresh ones. Acked items
are never invoked again. Group commit (ack every N items or T seconds, whichever first) bounds what a
crash can cost: only unacknowledged work is redone, which is safe because processing is deterministic
(seed 001 ``process_is_deterministic``).
"""

from __future__ import annotations

import gc
import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from functools import cached_property
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from airflow_provider_datagen.core.events import BlobRef, StepCoord, encode_value, fingerprint_of
from airflow_provider_datagen.core.fold import ItemState, fold_events
from airflow_provider_datagen.core.ids import child_item_id
from airflow_provider_datagen.core.planner import ResumePlan, as_source, classify
from airflow_provider_datagen.core.schema import FANOUT_KINDS, EventType, ItemStatus, StepKind
from airflow_provider_datagen.core.steps import (
    Branch,
    Conditional,
    Loop,
    MapReduce,
    Router,
    Sequence,
    Step,
    SubPipeline,
    as_pipeline,
)
from airflow_provider_datagen.exceptions import DatagenError, InvalidEventError, ProcessError

if TYPE_CHECKING:
    from concurrent.futures import Future, ThreadPoolExecutor

    from airflow_provider_datagen.core.store.batch import Batch
    from airflow_provider_datagen.core.store.log import CheckpointLog
    from airflow_provider_datagen.core.store.writer import LogWriter
    from airflow_provider_datagen.core.sources import SourceItem

log = logging.getLogger(__name__)

#: Group commit defaults when ``checkpoint_every`` is None: ack every N items or T seconds.
DEFAULT_GROUP_ITEMS = 4096
DEFAULT_GROUP_SECONDS = 2.0
#: Inbox pulls are at least this large, so per-item acks cost about one commit per item.
MIN_PULL = 64
_STATE_CHUNK = 1000
_COMPLETED = ItemStatus.COMPLETED.value
#: a fresh item's fields and field modes: read-only here (ItemContext copies modes before writing)
_NO_FIELDS: Mapping[str, Any] = MappingProxyType({})
_FILTERED = ItemStatus.FILTERED.value
_STEP_COMPLETED = EventType.STEP_COMPLETED.value
_TERMINAL = EventType.TERMINAL.value


class ItemFailedError(DatagenError):
    """An item's processing raised and ``fail_fast`` was set."""


class ProcessInterrupted(DatagenError):
    """The user's function raised KeyboardInterrupt or SystemExit; acknowledged work was kept."""


class _Filtered(Exception):
    def __init__(self, reason: Any) -> None:
        self.reason = reason


@dataclass
class RunReport:
    """What one ``run_items`` call did. Lists hold item ids in processing order."""

    processed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    replayed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    invocations: int = 0
    commits: int = 0
    events: int = 0
    errors: dict[str, str] = field(default_factory=dict)
    plan: ResumePlan | None = None

    def as_dict(self) -> dict[str, int]:
        return {
            "processed": len(self.processed),
            "skipped": len(self.skipped),
            "replayed": len(self.replayed),
            "failed": len(self.failed),
            "invocations": self.invocations,
        }


def _check_field_name(name: Any, where: str) -> None:
    # The same rule the log applies at commit time, checked while the step can still fail alone.
    if not isinstance(name, str) or not name or "\x00" in name or len(name) > 256:
        raise ProcessError(
            f"{where} the field name {str(name)[:80]!r}; field names must be non-empty strings of at most 256 "
            "characters without NUL"
        )


class ItemContext:
    """What a step function sees besides the item: identity, attempt, folded fields, emitters."""

    # Most steps never write through the context: these start as shared class defaults and become
    # the instance's own on first use (one context is built per step and item).
    _own_modes = False
    _ops: list[tuple[str, str, Any]] | tuple[()] = ()
    _filtered: tuple[bool, Any] = (False, None)
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
        # Copied on the first write only: most steps set no new field, and a failed step's modes
        # must not leak into the item's.
        self._modes = modes

    def _mode_check(self, name: str, mode: str) -> None:
        prev = self._modes.get(name)
        if prev is not None and prev != mode:
            raise InvalidEventError(
                f"item {self.item_id!r}: field {name!r} is written with {prev} and cannot take {mode}; "
                "use ctx.set or ctx.append consistently for one field"
            )
        if prev is None:
            if not self._own_modes:
                self._modes = dict(self._modes)
                self._own_modes = True
            self._modes[name] = mode  # type: ignore[index]  # our own dict since the copy above

    def set(self, name: str, value: Any) -> None:
        """Set a field (FIELD_SET), checkpointed with this step."""
        _check_field_name(name, f"item {self.item_id!r}: ctx.set got")
        encode_value(value, what=f"field {name!r} of item {self.item_id!r}")
        self._mode_check(name, "set")
        self._op(("set", name, value))

    def append(self, name: str, value: Any) -> None:
        """Append to a field (FIELD_APPEND), checkpointed with this step."""
        _check_field_name(name, f"item {self.item_id!r}: ctx.append got")
        encode_value(value, what=f"field {name!r} of item {self.item_id!r}")
        self._mode_check(name, "append")
        self._op(("append", name, value))

    def _op(self, op: tuple[str, str, Any]) -> None:
        if self._ops:
            self._ops.append(op)  # non-empty: the list made below
        else:
            self._ops = [op]

    def filter(self, reason: Any = None) -> None:
        """Finish the item as ``filtered`` after this step (a terminal state, never retried)."""
        if reason is not None:
            enc = encode_value(reason, what=f"filter reason of item {self.item_id!r}")
            if enc.json_text is None:
                raise InvalidEventError(f"item {self.item_id!r}: a filter reason must be small JSON")
        self._filtered = (True, reason)

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
class _Item:
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
    ) -> _Item:
        it = cls(item_id, key, data, fp, state, children)
        if state is not None and state.status is ItemStatus.RUNNING and state.input_fingerprint == fp:
            it.fields = _loaded(state.fields)
            it.modes = dict(state.field_modes)
            it.completed = {c.coord.frame_key for c in state.completed_steps}
            it.open = {c.frame_key for c in state.open_frames}
            coords = [*(c.coord for c in state.completed_steps), *state.open_frames]
            it.frames = {(c.enclosing_step, c.step) for c in coords}
            it.attempt = state.failures + 1
        return it


def _loaded(fields: Mapping[str, Any]) -> dict[str, Any]:
    """Folded fields with blob-stored values read back: a replay must see what the first run saw."""

    def load(v: Any) -> Any:
        return v.load() if isinstance(v, BlobRef) else v

    # one level only (an appended field is a list of values): values may nest as deep as JSON allows
    return {k: [load(x) for x in v] if isinstance(v, list) else load(v) for k, v in fields.items()}


def _step_names(step: Step) -> set[str]:
    return {step.name}.union(*(_step_names(c) for c in step.children()))


class _Runner:
    def __init__(
        self,
        log: CheckpointLog,
        writer: LogWriter,
        pipeline: Step,
        processor_version: str,
        checkpoint_every: int | None,
        checkpoint_interval: float,
        fail_fast: bool,
        report: RunReport,
        progress: Callable[[int, int], None] | None,
        reraise: tuple[type[BaseException], ...],
    ) -> None:
        self.log = log
        self.writer = writer
        self.pipeline = pipeline
        self.pv = processor_version
        self.group = checkpoint_every or DEFAULT_GROUP_ITEMS
        self.per_step = checkpoint_every == 1
        # Default group commit pipelines its appends: the next items run while Lance writes and
        # fsyncs (an unacknowledged item is redone after a crash either way). An explicit
        # checkpoint_every=N asks for a cadence, so each of its commits lands before the run goes on.
        self.pipelined = checkpoint_every is None
        #: the count bound on acknowledgements: in pipelined pulls a pull holds at most ``group``
        #: items and commits the previous pull's acknowledgements with its inbox, so the pull is the
        #: count bound there and only the time bound flushes inside it
        self.ack_bound = self.group
        self.interval = checkpoint_interval
        self.fail_fast = fail_fast
        self.report = report
        self.progress = progress
        self.reraise = reraise
        self.batch: Batch = self._new_batch()
        self.acked = 0
        self.steps = 0
        self.last_flush = time.monotonic()
        self.has_fanout = _has_fanout(pipeline)
        self._names: dict[int, set[str]] = {}
        #: with concurrency: how workers hand their items' progress to this (main) thread
        self.handoff = _Handoff()
        #: with concurrency and a fan-out: the pool a root's children run in, and the permits that keep
        #: the threads running user code at ``concurrency`` (a root waiting for its children holds none)
        self.child_pool: ThreadPoolExecutor | None = None
        self.permits: threading.Semaphore | None = None
        #: fan-out children whose sequence this writer already tracks (a Loop re-runs a fan-out).
        self._known_children: set[str] = set()
        #: (step, enclosing, iteration, selector) -> (coordinates, frame key, path, STEP_COMPLETED shape):
        #: the same for every item, so built once instead of per step and item.
        self._coords: dict[tuple[int, str | None, int | None, str | None], tuple[StepCoord, Any, str, Any]] = {}

    def _new_batch(self) -> Batch:
        from airflow_provider_datagen.core.store.batch import Batch

        return Batch(self.writer)

    # --- commits ----------------------------------------------------------------------------

    def flush(self) -> None:
        if len(self.batch):
            n = self.writer.commit(self.batch, wait=not self.pipelined)
            self.report.commits += 1
            self.report.events += n
        self.batch = self._new_batch()
        self.acked = 0
        self.steps = 0
        self.last_flush = time.monotonic()

    def maybe_flush(self, *, boundary: bool = False) -> None:
        if not self.batch._pending:
            return
        if (
            self.acked >= self.ack_bound
            or (boundary and self.per_step and self.steps)
            or time.monotonic() - self.last_flush >= self.interval
        ):
            self.flush()

    def _flush_due(self) -> bool:
        """:meth:`maybe_flush` at a step boundary, as a test: the per-item hot paths call it twice."""
        return bool(self.batch._pending) and (
            self.acked >= self.ack_bound
            or (self.per_step and self.steps > 0)
            or time.monotonic() - self.last_flush >= self.interval
        )

    def pull(self, items: list[tuple[SourceItem, ItemState | None]]) -> None:
        """The inbox: one commit of ITEM_CREATED rows before any of these items is processed."""
        if not items:
            return
        ids, fps = [src.item_id for src, _ in items], [src.fingerprint for src, _ in items]
        if self.pipelined:
            # The previous pull's acknowledgements ride in the same commit: one append per pull, and
            # the inbox never waits behind an acknowledgement still being written.
            self.batch._created_many(ids, fps, self.pv)
            self.flush()
            return
        self.flush()
        inbox = self._new_batch()
        inbox._created_many(ids, fps, self.pv)
        self.report.events += self.writer.commit(inbox)
        self.report.commits += 1

    # --- driving items ------------------------------------------------------------------------

    def run_root(self, src: SourceItem, state: ItemState | None, replayed: bool, *, history: bool = False) -> None:
        children: dict[str, ItemState] = {}
        if self.has_fanout:
            self._known_children.clear()
        if self.has_fanout and (history or (state is not None and state.status is ItemStatus.RUNNING)):
            # A restarted root (demoted, edited) has children in the log too: their sequences must be
            # known before the new generation appends to them.
            children = self._children_states(src.item_id)
        item = _Item.start(src.item_id, src.key, src.data, src.fingerprint, state, children)
        if replayed:
            self.report.replayed.append(src.item_id)
        try:
            status, reason = self._drive(item, self.pipeline, None, None, None)
        except BaseException as exc:
            self._on_failure(item, exc)
            return
        self.batch.terminal(item.item_id, status=status, reason=reason)
        self.acked += 1
        self.report.processed.append(item.item_id)
        if self._flush_due():
            self.flush()

    def run_fresh_leaf(self, src: SourceItem, replayed: bool) -> None:
        """:meth:`run_root` for an item with no state when the pipeline is one step (a process function).

        The same events in the same order as the general driver, without its per-item frame sets and
        dispatch: the profile of a no-op run showed them costing more than the item's log writes.
        """
        step, coord, shape, done = self._leaf
        iid = src.item_id
        if replayed:
            self.report.replayed.append(iid)
        ctx = ItemContext(iid, src.key, src.fingerprint, 1, _NO_FIELDS, coord, _NO_FIELDS)
        self.report.invocations += 1
        try:
            result = step.fn(src.data, ctx)
            sets = self._check_result_of(iid, step, result) if result is not None else _NO_FIELDS
            for name in sets:
                ctx._mode_check(name, "set")
        except BaseException as exc:
            self._on_failure(self._bare_item(src), _StepFailure(iid, coord, exc))
            return
        filtered, reason = ctx._filtered
        try:
            if ctx._ops or sets:
                self._stage_delta(iid, coord.step, sets, ctx._ops)
            # STEP_COMPLETED, and TERMINAL(completed) with it unless the step filtered the item
            self.batch._shaped(iid, shape, None if filtered else done)
        except BaseException as exc:
            self._on_failure(self._bare_item(src), exc)
            return
        self.steps += 1
        if filtered:
            self.batch.terminal(iid, status=_FILTERED, reason=reason)
        self.acked += 1
        self.report.processed.append(iid)
        if self._flush_due():
            self.flush()

    @cached_property
    def _leaf(self) -> tuple[Step, StepCoord, tuple[Any, ...], tuple[Any, ...]]:
        """The one step, its coordinates, and the shapes of its STEP_COMPLETED and of TERMINAL(completed)."""
        coord, _frame, _path, shape = self._coord(self.pipeline, None, None, None)
        done = self.writer._shape(_TERMINAL, None, None, None, None, None, None, None, _COMPLETED)
        return self.pipeline, coord, shape, done

    @staticmethod
    def _bare_item(src: SourceItem) -> _Item:
        return _Item(src.item_id, src.key, src.data, src.fingerprint, None, {})

    # --- in-chunk concurrency --------------------------------------------------------------------

    def run_concurrent(
        self,
        pool: ThreadPoolExecutor,
        concurrency: int,
        jobs: Iterable[tuple[SourceItem, bool, bool]],
        tick: Callable[[], None],
    ) -> None:
        """:meth:`run_root` for ``jobs`` (source item, replayed, history), up to ``concurrency`` at a time.

        Workers only drive an item into a private buffer; this (main) thread stays the only writer: it
        merges a finished item's buffer into the shared batch and acknowledges it exactly as
        :meth:`run_root` does, then flushes, reports progress and submits the next item. A worker hands
        over its item's finished steps mid-item when a sequential run would commit them (its own
        ``flush``), and this thread commits them before anything else. An item that never finished has
        only its ITEM_CREATED and the steps handed over in the log, so it resumes from there next run.
        """
        todo: Iterator[tuple[SourceItem, bool, bool]] = iter(jobs)
        inflight: dict[Future[tuple[tuple[str, Any] | None, BaseException | None]], tuple[_ItemWorker, _Item]] = {}
        order: dict[str, int] = {}
        stopped: ItemFailedError | None = None
        waiting = False
        handoff = self.handoff

        def woken(_: Any) -> None:
            handoff.wake.set()

        try:
            while True:
                while stopped is None and len(inflight) < concurrency:
                    job = next(todo, None)
                    if job is None:
                        break
                    src, replayed, history = job
                    # A restarted root's children are read here, in the thread that owns the log, as
                    # run_root reads them; a worker only primes the ids of children it creates.
                    children = self._children_states(src.item_id) if self.has_fanout and history else {}
                    if children:  # their blob-stored values too: a worker never reads the log
                        children = {cid: replace(st, fields=_loaded(st.fields)) for cid, st in children.items()}
                    item = _Item.start(src.item_id, src.key, src.data, src.fingerprint, None, children)
                    if replayed:
                        self.report.replayed.append(src.item_id)
                    worker = _ItemWorker.for_item(self)
                    order[item.item_id] = len(order)
                    future = pool.submit(worker.work, item)
                    inflight[future] = (worker, item)
                    future.add_done_callback(woken)
                if not inflight:
                    break
                waiting = True
                while True:
                    handoff.wake.clear()
                    # requests first: a worker posts one and waits, so its item cannot finish before it
                    requests = handoff.take()
                    done = [f for f in inflight if f.done()]
                    if requests or done:
                        break
                    handoff.wake.wait()
                waiting = False
                if requests:
                    self._serve(requests)
                # several can finish together: acknowledge them in submission order, not set order
                for fut in sorted(done, key=lambda f: order[inflight[f][1].item_id]):
                    worker, item = inflight.pop(fut)
                    outcome, exc = fut.result()  # work() returns every exception of the item's own
                    self.batch._extend(worker.batch)
                    self.report.invocations += worker.report.invocations
                    self.steps += worker.steps
                    if exc is None:
                        assert outcome is not None
                        # the tail of run_root, kept in step with it
                        self.batch.terminal(item.item_id, status=outcome[0], reason=outcome[1])
                        self.acked += 1
                        self.report.processed.append(item.item_id)
                        if self._flush_due():
                            self.flush()
                    else:
                        try:
                            self._on_failure(item, exc)
                        except ItemFailedError as err:
                            # fail_fast: submit nothing more, but acknowledge what is already running
                            # (its work is paid for) before raising the first failure, as sequential does
                            if stopped is None:
                                stopped = err
                    tick()
        except BaseException as exc:
            # A run-ending error (a reraise type, an interrupt, a fencing error): items still in flight
            # are not acknowledged (they replay next run); their threads finish into buffers nobody reads
            # (the caller shuts the pool down without waiting), and a worker waiting for its progress
            # to be committed is told the run ended.
            for request in handoff.close():
                request.error = exc
                request.done.set()
            if waiting:
                # it arrived between items (an orchestrator's timeout lands in the main thread): the
                # batch holds whole acknowledgements only, so keep them, as run_root's handler does
                self.flush()
            raise
        handoff.close()
        if stopped is not None:
            self.flush()
            raise stopped

    def _serve(self, requests: list[_FlushRequest]) -> None:
        """Commit workers' mid-item progress (with any acknowledgements waiting), then let them go on."""
        try:
            for request in requests:
                self.batch._extend(request.batch)
            self.flush()
        except BaseException as exc:
            for request in requests:
                request.error = exc
            raise
        finally:
            for request in requests:
                request.done.set()

    def _on_failure(self, item: _Item, exc: BaseException) -> None:
        err = exc.__cause__ if isinstance(exc, _StepFailure) and exc.__cause__ is not None else exc
        if self.reraise and isinstance(err, self.reraise):
            # An orchestrator's timeout or kill must end the run, not fail one item and go on.
            self.flush()
            raise err
        where = exc.coord if isinstance(exc, _StepFailure) else StepCoord()
        failed_id = exc.item_id if isinstance(exc, _StepFailure) else item.item_id
        self.batch.failed(
            failed_id,
            error=err,
            step=where.step,
            step_kind=where.step_kind,
            enclosing_step=where.enclosing_step,
            iteration=where.iteration,
            fanout_index=where.fanout_index,
        )
        if failed_id != item.item_id:
            # A child's failure also fails its root, so the root's failure lens tells the story.
            self.batch.failed(item.item_id, error=err, step=where.step)
        self.acked += 1  # a failed attempt leaves the group too: checkpoint_every counts it
        self.report.failed.append(item.item_id)
        self.report.errors[item.item_id] = f"{type(err).__name__}: {err}"
        log.warning("item %s failed: %s: %s", item.item_id, type(err).__name__, err)
        if isinstance(err, (KeyboardInterrupt, SystemExit)):
            self.flush()
            raise ProcessInterrupted(
                f"the process function raised {type(err).__name__} on item {item.item_id!r}; acknowledged "
                "items were kept and the item stays pending for the next run"
            ) from err
        if not isinstance(err, Exception):
            # Anything else outside Exception (an orchestrator's task timeout, say) ends the run: it is
            # not the item's fault, and swallowing it would defeat the timeout.
            self.flush()
            raise err
        if self.fail_fast:
            self.flush()
            raise ItemFailedError(
                f"item {item.item_id!r} failed with {type(err).__name__}: {err} (fail_fast=True stopped the "
                "run; rerun to retry it)"
            ) from err
        self.maybe_flush(boundary=True)

    def _children_states(self, root_id: str) -> dict[str, ItemState]:
        events = self.log.subtree_copies(root_id)  # fencing needs every copy's epoch
        by_item: dict[str, list[Any]] = {}
        for ev in events:
            if ev.item_id != root_id:
                by_item.setdefault(ev.item_id, []).append(ev)
        states = {iid: fold_events(iid, evs, self.log.load_blob) for iid, evs in by_item.items()}
        for iid, st in states.items():
            self.writer.prime(
                iid, last_seq=st.last_seq, input_fingerprint=st.input_fingerprint, field_modes=st.field_modes
            )
        return states

    def _ctx(self, item: _Item, coord: StepCoord) -> ItemContext:
        return ItemContext(item.item_id, item.key, item.fingerprint, item.attempt, item.fields, coord, item.modes)

    def _drive(
        self,
        item: _Item,
        step: Step,
        enclosing: str | None,
        iteration: int | None,
        selector: str | None,
    ) -> tuple[str, Any]:
        """Run ``step`` for ``item``; returns the terminal status and filter reason."""
        try:
            self._run(item, step, enclosing, iteration, selector)
        except _Filtered as f:
            return _FILTERED, f.reason
        return _COMPLETED, None

    def _coord(
        self, step: Step, enclosing: str | None, iteration: int | None, selector: str | None
    ) -> tuple[StepCoord, Any, str, Any]:
        key = (id(step), enclosing, iteration, selector)
        hit = self._coords.get(key)
        if hit is None:
            coord = StepCoord(step.name, type(step).kind.value, enclosing, iteration, None, selector)
            # what Batch.step_completed would build for this coordinate on every call
            shape = self.writer._shape(
                _STEP_COMPLETED,
                coord.step or "",
                coord.step_kind,
                coord.enclosing_step,
                coord.iteration,
                coord.fanout_index,
                coord.selector_step,
                self.pv or self.writer.processor_version,
                None,
            )
            hit = (coord, coord.frame_key, f"{enclosing}/{step.name}" if enclosing else step.name, shape)
            if len(self._coords) >= 10_000:  # long loops: keep the cache bounded
                self._coords.clear()
            self._coords[key] = hit
        return hit

    def _run(self, item: _Item, step: Step, enclosing: str | None, iteration: int | None, selector: str | None) -> None:
        coord, frame, path, shape = self._coord(step, enclosing, iteration, selector)
        if type(step) is Step:
            self._run_leaf(item, step, coord, frame, shape)
        elif isinstance(step, Sequence):
            if frame in item.completed:
                return
            self._start_frame(item, coord)
            for child in step.steps:
                self._run(item, child, path, iteration, None)
            self._complete(item, coord, {}, [], frame, shape)
        elif isinstance(step, Loop):
            self._run_loop(item, step, enclosing, selector, path)
        elif isinstance(step, (MapReduce, Branch, SubPipeline)):
            self._run_fanout(item, step, coord, path)
        elif isinstance(step, Conditional):
            options = [c for c in (step.then, step.otherwise) if c is not None]
            chosen = self._recorded_choice(item, options, enclosing)
            if chosen is None:
                ctx = self._ctx(item, coord)
                chosen = step.then if self._call(item, coord, step.predicate, item.data, ctx) else step.otherwise
            if chosen is not None:
                self._run(item, chosen, enclosing, iteration, step.name)
        elif isinstance(step, Router):
            target = self._recorded_choice(item, list(step.routes.values()), enclosing)
            name: Any = target.name if target is not None else None
            if target is None:
                ctx = self._ctx(item, coord)
                name = self._call(item, coord, step.route, item.data, ctx)
                target = step.routes.get(str(name)) or (step.routes[step.default] if step.default else None)
            if target is None:
                raise _StepFailure(
                    item.item_id,
                    coord,
                    ProcessError(
                        f"item {item.item_id!r}: router {step.name!r} chose {name!r}, which is not one of "
                        f"{sorted(step.routes)}; add the route or a default"
                    ),
                )
            self._run(item, target, enclosing, iteration, step.name)
        else:
            self._run_leaf(item, step, coord, frame, shape)

    def _call(self, item: _Item, coord: StepCoord, fn: Callable[..., Any], *args: Any) -> Any:
        """Call a selector or fan-out callable; its error fails the item at this step's coordinates."""
        try:
            return fn(*args)
        except Exception as exc:
            raise _StepFailure(item.item_id, coord, exc) from exc

    def _recorded_choice(self, item: _Item, options: list[Step], enclosing: str | None) -> Step | None:
        """The branch a selector took before a crash, rebuilt from the recorded frames of its subtree.

        Re-asking the predicate on replay would see fields written *after* the choice and could take
        the other branch too; step names are unique, so a recorded frame names its branch.
        """
        if not item.frames:
            return None
        for option in options:
            names = self._names.get(id(option))
            if names is None:
                names = self._names[id(option)] = _step_names(option)
            for enc, name in item.frames:
                if name in names and (enclosing is None or enc == enclosing or (enc or "").startswith(enclosing + "/")):
                    return option
        return None

    def _start_frame(self, item: _Item, coord: StepCoord) -> None:
        if coord.frame_key not in item.open:
            self.batch.step_started(
                item.item_id,
                step=coord.step or "",
                step_kind=coord.step_kind or StepKind.SEQUENCE.value,
                enclosing_step=coord.enclosing_step,
                iteration=coord.iteration,
                fanout_index=coord.fanout_index,
                selector_step=coord.selector_step,
            )
            item.open.add(coord.frame_key)

    def _complete(
        self,
        item: _Item,
        coord: StepCoord,
        sets: Mapping[str, Any],
        ops: Iterable[tuple[str, str, Any]],
        frame: Any = None,
        shape: Any = None,
    ) -> None:
        """Stage a step's field delta and its STEP_COMPLETED together (one checkpoint unit)."""
        b = self.batch
        self._stage_delta(item.item_id, coord.step, sets, ops)
        for op, name, value in ops:
            if op == "set":
                item.fields[name] = value
            else:
                prev = item.fields.get(name) if item.modes.get(name) == "append" else None
                item.fields[name] = [*(prev or []), value]
            item.modes[name] = op
        for name, value in sets.items():
            item.fields[name] = value
            item.modes[name] = "set"
        if shape is not None:
            b._shaped(item.item_id, shape)
        else:
            b.step_completed(
                item.item_id,
                step=coord.step or "",
                processor_version=self.pv,
                step_kind=coord.step_kind,
                enclosing_step=coord.enclosing_step,
                iteration=coord.iteration,
                fanout_index=coord.fanout_index,
                selector_step=coord.selector_step,
            )
        if frame is None:
            frame = coord.frame_key
        item.completed.add(frame)
        item.open.discard(frame)
        self.steps += 1

    def _stage_delta(
        self, item_id: str, step: str | None, sets: Mapping[str, Any], ops: Iterable[tuple[str, str, Any]]
    ) -> None:
        """A step's field events: its ``ctx.set``/``ctx.append`` calls in order, then its returned fields."""
        b = self.batch
        for op, name, value in ops:
            if op == "set":
                b.field_set(item_id, name, value, step=step)
            else:
                b.field_append(item_id, name, value, step=step)
        for name, value in sets.items():
            b.field_set(item_id, name, value, step=step)

    def _run_leaf(self, item: _Item, step: Step, coord: StepCoord, frame: Any, shape: Any) -> None:
        if frame in item.completed:
            return
        # checkpoint_every=1: completed steps become durable before the next step runs. Checking here
        # rather than after each step keeps an item's last step, its TERMINAL and its field deltas in
        # one commit (the ack), as the contract says.
        if self._flush_due():
            self.flush()
        ctx = self._ctx(item, coord)
        self.report.invocations += 1
        try:
            result = step.fn(item.data, ctx)
            sets = self._check_result(item, step, result)
            if sets:
                for name in sets:
                    ctx._mode_check(name, "set")
        except Exception as exc:
            raise _StepFailure(item.item_id, coord, exc) from exc
        except BaseException as exc:
            raise _StepFailure(item.item_id, coord, exc) from exc
        self._complete(item, coord, sets, ctx._ops, frame, shape)
        if ctx._filtered[0]:
            raise _Filtered(ctx._filtered[1])

    def _check_result(self, item: _Item, step: Step, result: Any) -> dict[str, Any]:
        return {} if result is None else self._check_result_of(item.item_id, step, result)

    @staticmethod
    def _check_result_of(item_id: str, step: Step, result: Any) -> dict[str, Any]:
        if not isinstance(result, Mapping):
            raise ProcessError(
                f"item {item_id!r}: step {step.name!r} returned a {type(result).__name__}; return a dict "
                "of fields (or None) from the process function"
            )
        out: dict[str, Any] = {}
        for name, value in result.items():
            _check_field_name(name, f"item {item_id!r}: step {step.name!r} returned")
            encode_value(value, what=f"field {name!r} returned by step {step.name!r} for item {item_id!r}")
            out[name] = value
        return out

    def _run_loop(self, item: _Item, step: Loop, enclosing: str | None, selector: str | None, path: str) -> None:
        for i in range(step.max_iterations):
            coord = StepCoord(step.name, StepKind.LOOP.value, enclosing, i, None, selector)
            if coord.frame_key in item.completed:
                continue
            # Only decide to stop where the original run would have: before an unstarted iteration.
            if step.until is not None and i > 0 and coord.frame_key not in item.open and step.until(item.fields):
                return
            self._start_frame(item, coord)
            self._run(item, step.body, f"{path}#{i}", i, None)
            self._complete(item, coord, {}, [])

    def _run_fanout(self, item: _Item, step: Step, coord: StepCoord, path: str) -> None:
        if coord.frame_key in item.completed:
            return
        ctx = self._ctx(item, coord)
        if isinstance(step, MapReduce):
            inputs = self._call(item, coord, lambda: [dict(x) for x in step.over(item.data, ctx)])
            bodies: list[Step] = [step.map] * len(inputs)
        elif isinstance(step, Branch):
            inputs = [item.data] * len(step.branches)
            bodies = list(step.branches)
        else:
            assert isinstance(step, SubPipeline)
            make_input = step.input
            inputs = [self._call(item, coord, lambda: dict(make_input(item.data, ctx))) if make_input else item.data]
            bodies = [step.pipeline]
        children_fields: list[dict[str, Any]] = [{} for _ in inputs]
        # an item on a worker thread, root or child (the main thread's own replays stay sequential)
        parallel = self.child_pool is not None and isinstance(self, _ItemWorker)
        jobs: list[tuple[int, _Item, Step, dict[str, Any] | None]] = []
        for idx, (child_input, body) in enumerate(zip(inputs, bodies)):
            cid = child_item_id(item.item_id, step.name, idx)
            fp = fingerprint_of(child_input)
            cstate = item.children.get(cid)
            if (
                cstate is not None
                and cstate.is_done
                and cstate.input_fingerprint == fp
                and cstate.processor_version == self.pv
            ):
                children_fields[idx] = _loaded(cstate.fields)
                continue
            resumable = (
                cstate is not None
                and cstate.status is ItemStatus.RUNNING
                and cstate.input_fingerprint == fp
                and cstate.processor_version == self.pv
            )
            created: dict[str, Any] | None = None
            if resumable:
                child = _Item.start(cid, item.key, child_input, fp, cstate, item.children)
            else:
                if cstate is None and cid not in self._known_children:
                    self.writer.prime(cid, last_seq=-1)
                child = _Item(cid, item.key, child_input, fp, None, item.children)
                created = {
                    "input_fingerprint": fp,
                    "processor_version": self.pv,
                    "parent_item_id": item.item_id,
                    "step": step.name,
                    "step_kind": type(step).kind.value,
                    "enclosing_step": coord.enclosing_step,
                    "fanout_index": idx,
                    "selector_step": coord.selector_step,
                }
            # From here on the writer tracks the child's sequence; a Loop running this fan-out again
            # starts a new generation of the same child id after it, never over it.
            self._known_children.add(cid)
            item.children.pop(cid, None)
            if parallel:
                jobs.append((idx, child, body, created))
                continue
            if created is not None:
                self.batch.item_created(cid, **created)
            status, reason = self._drive(child, body, path, None, None)
            self.batch.terminal(cid, status=status, reason=reason)
            children_fields[idx] = dict(child.fields)
        if jobs:
            self._run_children(jobs, path, children_fields)
        sets: dict[str, Any] = {}
        try:
            reduce = getattr(step, "reduce", None)
            if reduce is not None:
                self.report.invocations += 1
                sets = self._check_result(item, step, reduce(children_fields, ctx))
            else:
                for f in children_fields:
                    sets.update(f)
        except Exception as exc:
            raise _StepFailure(item.item_id, coord, exc) from exc
        self._complete(item, coord, sets, [])

    def _run_children(
        self, jobs: list[tuple[int, _Item, Step, dict[str, Any] | None]], path: str, fields: list[dict[str, Any]]
    ) -> None:
        """Run an item's fan-out children in the child pool; merge their buffers in index order.

        Each child gets its own worker and buffer, so the events are those of the sequential loop
        (every item numbers its own events). The waiting item gives its permit back, so the threads
        running user code stay at ``concurrency``, and runs the children no pool thread has started
        itself: a child waiting for its own children must never wait for a pool that such waiting
        children fill, so nested fan-outs run in parallel at any depth without a pool per depth. When
        children fail, the first in index order is raised, as the sequential loop would raise it; the
        buffers of every child are kept, so work that finished beside a failure is not redone on the
        rerun.
        """
        assert self.child_pool is not None and self.permits is not None and isinstance(self, _ItemWorker)
        ids = {child.item_id for _, child, _, _ in jobs}
        below = tuple(f"{cid}/" for cid in ids)
        if any(p[0] in ids or p[0].startswith(below) for p in self.batch._pending):
            # A Loop runs this fan-out again: the last generation of these children (and theirs)
            # ended in this buffer. It must be committed before the new generation hands anything
            # over, or the two generations' events of one child id would be numbered out of order.
            self.flush()
        running = []
        for idx, child, body, created in jobs:
            worker = _ItemWorker.for_item(self.main)
            worker._known_children = self._known_children  # ids of one root: disjoint keys, GIL-atomic adds
            job = (child, body, path, created)
            running.append((idx, worker, job, self.child_pool.submit(worker.work_child, *job)))
        self.permits.release()
        try:
            inline = {}
            # from the back: the pool's threads take the queue from the front
            for idx, worker, job, future in reversed(running):
                if future.cancel():  # also true when the run ended and its pools cancelled the queue
                    if self.main.handoff.closed:  # never start user code after the run has ended
                        inline[idx] = (None, _RunEnded("the run ended before this fan-out child started"))
                    else:
                        inline[idx] = worker.work_child(*job)
            outcomes = [
                (idx, worker, inline[idx] if idx in inline else future.result()) for idx, worker, _, future in running
            ]
        finally:
            self.permits.acquire()
        first: BaseException | None = None
        for idx, worker, (child_fields, exc) in outcomes:
            self.batch._extend(worker.batch)
            self.report.invocations += worker.report.invocations
            self.steps += worker.steps
            if exc is not None:
                first = first or exc
            else:
                assert child_fields is not None
                fields[idx] = child_fields
        if first is not None:
            raise first


class _StepFailure(Exception):
    """Carries the failing item and coordinates of a step's error up to the root item."""

    def __init__(self, item_id: str, coord: StepCoord, exc: BaseException) -> None:
        super().__init__(str(exc))
        self.item_id = item_id
        self.coord = coord
        self.__cause__ = exc


class _ItemWorker(_Runner):
    """One item's driver on a worker thread: the runner's config and caches, its own batch and report.

    Shared caches are safe under the GIL: ``_coords``/``_names`` and the writer's shape caches only
    ever get a key set to an equal value (or cleared). The writer's item table is read here, and a
    fan-out primes its new children into it: a single key set, for ids no other item uses, whose events
    stay in this worker's buffer until the main thread merges and commits them (the main thread's
    commits replace values, never remove keys). A restarted root's existing children were looked up by
    the main thread before the item was submitted. Completed steps are handed to the main thread to
    commit on the sequential cadence (:meth:`flush`), so a crash loses no more of a long item than it
    would without threads.
    """

    #: the runner of the main thread, the only writer
    main: _Runner

    @classmethod
    def for_item(cls, runner: _Runner) -> _ItemWorker:
        worker = cls.__new__(cls)
        worker.__dict__.update(runner.__dict__)
        worker.main = runner
        worker.report = RunReport()
        worker.batch = runner._new_batch()
        worker.steps = 0
        worker._known_children = set()  # per root, as run_root clears it per root
        return worker

    def work(self, item: _Item) -> tuple[tuple[str, Any] | None, BaseException | None]:
        """Drive the item; the outcome or the exception, for the main thread to acknowledge."""
        if self.permits is not None:
            self.permits.acquire()
        try:
            return self._drive(item, self.pipeline, None, None, None), None
        except BaseException as exc:
            return None, exc
        finally:
            if self.permits is not None:
                self.permits.release()

    def work_child(
        self, child: _Item, body: Step, path: str, created: dict[str, Any] | None
    ) -> tuple[dict[str, Any] | None, BaseException | None]:
        """Drive one fan-out child into this worker's buffer: its fields, or the exception."""
        assert self.permits is not None
        with self.permits:
            try:
                if created is not None:
                    self.batch.item_created(child.item_id, **created)
                status, reason = self._drive(child, body, path, None, None)
                self.batch.terminal(child.item_id, status=status, reason=reason)
                return dict(child.fields), None
            except BaseException as exc:
                return None, exc

    def _flush_due(self) -> bool:
        """At a step boundary, on the sequential run's cadence: ``checkpoint_every=1`` or the time bound.

        A fan-out child's worker hands over its own events too; what is left of them joins its
        root's buffer once the children are done.
        """
        return bool(self.batch._pending) and (
            (self.per_step and self.steps > 0) or time.monotonic() - self.main.last_flush >= self.interval
        )

    def flush(self) -> None:
        """Hand the item's completed steps to the main thread, the only writer, and wait until it committed them.

        As in a sequential run, a long item's finished steps then survive a crash; the rest of the
        item goes on into a fresh buffer. If the run has ended meanwhile, the item stops here.
        """
        request = _FlushRequest(self.batch)
        if not self.main.handoff.post(request):
            raise _RunEnded("the run ended before this item's progress could be committed")
        request.done.wait()
        if request.error is not None:
            raise _RunEnded("the run ended while committing this item's progress") from request.error
        self.batch = self._new_batch()
        self.steps = 0


class _RunEnded(BaseException):
    """Stops a worker's item when the main thread has ended the run (never an item failure)."""


class _FlushRequest:
    """One worker's buffer of completed steps, waiting for the main thread to commit it."""

    __slots__ = ("batch", "done", "error")

    def __init__(self, batch: Batch) -> None:
        self.batch = batch
        self.done = threading.Event()
        self.error: BaseException | None = None


class _Handoff:
    """How workers hand mid-item progress to the main thread, and what wakes the main thread.

    The main thread waits for either a finished item or a flush request; ``close`` refuses further
    requests and returns the unserved ones, so no worker waits for a thread that stopped serving.
    """

    def __init__(self) -> None:
        self.wake = threading.Event()
        self._lock = threading.Lock()
        self._requests: list[_FlushRequest] = []
        self._closed = False

    def post(self, request: _FlushRequest) -> bool:
        with self._lock:
            if self._closed:
                return False
            self._requests.append(request)
        self.wake.set()
        return True

    def take(self) -> list[_FlushRequest]:
        with self._lock:
            taken, self._requests = self._requests, []
        return taken

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> list[_FlushRequest]:
        with self._lock:
            self._closed = True
            taken, self._requests = self._requests, []
        return taken


def _has_fanout(step: Step) -> bool:
    return type(step).kind in FANOUT_KINDS or any(_has_fanout(c) for c in step.children())


def run_items(
    log: CheckpointLog,
    items: Iterable[Any],
    process_or_pipeline: Any,
    *,
    key_field: str = "id",
    processor_version: str = "v1",
    writer_id: str = "w1",
    epoch: int = 1,
    checkpoint_every: int | None = None,
    fail_fast: bool = False,
    checkpoint_interval: float = DEFAULT_GROUP_SECONDS,
    airflow: dict[str, Any] | None = None,
    progress: Callable[[int, int], None] | None = None,
    reraise: tuple[type[BaseException], ...] = (),
    concurrency: int = 1,
) -> RunReport:
    """Process every pending item of ``items`` and record it in ``log``; touch nothing that is done.

    ``checkpoint_every=N`` acknowledges N items per commit (``1`` also checkpoints every step
    boundary), and each commit lands before the next item starts. None (the default) is group commit:
    :data:`DEFAULT_GROUP_ITEMS` items or ``checkpoint_interval`` seconds, whichever comes first, with
    each append pipelined (the next items run while it is written; a crash meanwhile only means those
    acknowledgements are redone). Either way every commit has landed when this returns or raises.
    ``reraise`` lists exception types that must end the run instead of failing one item (an
    orchestrator's timeout, say).

    ``concurrency=N`` (N > 1) runs the per-item work of fresh and restarted items in N threads, so
    I/O-bound calls that release the GIL (model or HTTP calls) overlap; the user's code must then be
    thread-safe. Results are the same as with ``concurrency=1``: one thread still does every write and
    commit, acknowledging items as they finish; a thread hands its item's finished steps to that
    thread on the sequential cadence (each step with ``checkpoint_every=1``, else the time bound), so
    a crash loses no more of a long item than without threads. Inbox replays stay sequential (a few
    items resuming mid-cursor). Fan-out children, at any depth, run in a second pool of threads, each
    into its own buffer merged in index order; permits keep the threads running user code at
    ``concurrency`` (an item waiting for its children holds none and runs those not yet started).
    """
    if checkpoint_every is not None and (
        isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, int) or checkpoint_every < 1
    ):
        raise InvalidEventError(f"checkpoint_every must be a positive int or None, got {checkpoint_every!r}")
    if not isinstance(processor_version, str) or not processor_version:
        raise InvalidEventError(f"processor_version must be a non-empty string, got {processor_version!r}")
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise InvalidEventError(f"concurrency must be an int >= 1 (1 runs items one at a time), got {concurrency!r}")
    pipeline = as_pipeline(process_or_pipeline)
    source = as_source(items, key_field)
    writer = log.writer(writer_id, epoch, processor_version=processor_version, airflow=airflow)
    states = log.states()
    plan = classify(source, states, processor_version, log.version)
    report = RunReport(skipped=list(plan.skip), plan=plan)
    runner = _Runner(
        log,
        writer,
        pipeline,
        processor_version,
        checkpoint_every,
        checkpoint_interval,
        fail_fast,
        report,
        progress,
        reraise,
    )
    by_id = {s.item_id: s for s in source}
    total = len(plan.pending)
    done = 0

    def tick() -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total)

    # The profile of a no-op run showed a third of the time in generation-2 collections walking the
    # source items and plan already alive; frozen, the collector only looks at what the run allocates.
    gc.freeze()
    try:
        # 1. The inbox: items created and never acknowledged, resumed from their coordinates.
        for chunk in _chunks(plan.replay, _STATE_CHUNK):
            for iid, st in log.item_states(chunk).items():
                if st.is_done and st.input_fingerprint == by_id[iid].fingerprint:
                    # another writer acknowledged it after our plan: acknowledged work is never redone
                    report.skipped.append(iid)
                    tick()
                    continue
                writer.prime(
                    iid, last_seq=st.last_seq, input_fingerprint=st.input_fingerprint, field_modes=st.field_modes
                )
                runner.run_root(by_id[iid], st, replayed=True)
                tick()
        # 2. Restarts (demoted cursors, edited inputs) and fresh items: pulled into the inbox first.
        restart = [*plan.demoted, *plan.invalidated, *plan.fresh]
        replayed_restarts = set(plan.demoted)
        cap = max(runner.group, MIN_PULL)
        one_step = type(pipeline) is Step  # no frames, no fan-out: the driver's short path
        if runner.pipelined:
            runner.ack_bound = cap + 1  # never reached: each pull's acks commit with the next pull
        if concurrency > 1 and restart:
            _run_pulls_concurrently(runner, writer, restart, by_id, plan, concurrency, tick)
        else:
            for chunk in _pulls(restart, cap, checkpoint_interval):
                writer._prime_new(chunk, plan.last_seq)  # ids built and validated by prepare_items
                runner.pull([(by_id[iid], None) for iid in chunk])
                for iid in chunk:
                    if one_step:
                        runner.run_fresh_leaf(by_id[iid], iid in replayed_restarts)
                    else:
                        runner.run_root(
                            by_id[iid], None, replayed=iid in replayed_restarts, history=iid in plan.last_seq
                        )
                    tick()
        runner.flush()
        writer.sync()  # every acknowledgement has landed before the report is returned
    except BaseException:
        # Whatever ends the run (a timeout, fail_fast), a pipelined append in flight lands or fails
        # before we return: nothing may write to the log after run_items is gone.
        try:
            writer.sync()
        except Exception as exc:  # the run's own error is the one to raise
            logging.getLogger(__name__).warning("a pipelined commit failed while the run was ending: %s", exc)
        raise
    finally:
        gc.unfreeze()
    return report


def _run_pulls_concurrently(
    runner: _Runner,
    writer: LogWriter,
    restart: list[str],
    by_id: dict[str, SourceItem],
    plan: ResumePlan,
    concurrency: int,
    tick: Callable[[], None],
) -> None:
    """Phase 2 of :func:`run_items` with ``concurrency > 1``: the same pulls, each run by a thread pool."""
    from concurrent.futures import ThreadPoolExecutor

    replayed_restarts = set(plan.demoted)

    def jobs() -> Iterator[tuple[SourceItem, bool, bool]]:
        # Consumed as threads free up: the next pull happens once the previous pull's items are all
        # submitted, while its last ones still run (no idle tail per pull), and each pull's inbox
        # commit still precedes its own items' work.
        for chunk in _pulls(restart, max(runner.group, MIN_PULL), runner.interval):
            writer._prime_new(chunk, plan.last_seq)  # ids built and validated by prepare_items
            runner.pull([(by_id[iid], None) for iid in chunk])
            for iid in chunk:
                yield by_id[iid], iid in replayed_restarts, iid in plan.last_seq

    pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="datagen-item")
    if runner.has_fanout:
        # a second pool: children queued behind roots that wait for them would never run
        runner.child_pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="datagen-child")
        runner.permits = threading.Semaphore(concurrency)
    pools = [p for p in (pool, runner.child_pool) if p is not None]
    try:
        runner.run_concurrent(pool, concurrency, jobs(), tick)
    except BaseException:
        # in-flight items are not acknowledged (they replay next run); their threads end on their own
        for p in pools:
            p.shutdown(wait=False, cancel_futures=True)
        raise
    finally:
        runner.child_pool = runner.permits = None
    for p in pools:
        p.shutdown(wait=True)


def _chunks(seq: list[str], n: int) -> Iterable[list[str]]:
    for i in range(0, len(seq), n):
        yield seq[i : i + n]


def _pulls(seq: list[str], cap: int, interval: float) -> Iterable[list[str]]:
    """Inbox groups that adapt to the item rate: start small, double while a group takes under half
    the checkpoint interval, halve when one takes longer than it.

    Fast processes get few, large pull commits; slow ones never mark thousands of items as in flight
    (running) long before they are processed, so the inbox a crash leaves stays small.
    """
    size = min(MIN_PULL, cap)
    i = 0
    while i < len(seq):
        started = time.monotonic()
        yield seq[i : i + size]
        i += size
        took = time.monotonic() - started
        if took < interval / 2:
            size = min(cap, size * 2)
        elif took > interval:
            size = max(min(MIN_PULL, cap), size // 2)
