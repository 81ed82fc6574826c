"""The step interpreter: drives one item through its step graph, staging its events into a batch.

Both the main thread's runner (driver.py) and a worker thread's (threads.py) are interpreters; they
differ only in what a checkpoint is (``flush``: commit it, or hand it to the main thread) and when
one is due. Replay follows docs/design.md, Resume: a completed frame is skipped, an open one is
re-entered, and a selector takes the branch its recorded frames name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from airflow_provider_datagen.core.events import StepCoord, fingerprint_of
from airflow_provider_datagen.core.ids import child_item_id
from airflow_provider_datagen.core.ledger.staging import completed_value
from airflow_provider_datagen.core.runner.attempts import call_step
from airflow_provider_datagen.core.runner.context import NO_FIELDS, ItemContext, WorkItem, loaded_fields
from airflow_provider_datagen.core.runner.contract import check_result_of
from airflow_provider_datagen.core.runner.shared import StepSite
from airflow_provider_datagen.core.runner.signals import Filtered, StepFailure
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
)
from airflow_provider_datagen.exceptions import ProcessError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

    from airflow_provider_datagen.core.runner.report import RunReport
    from airflow_provider_datagen.core.runner.shared import RunShared
    from airflow_provider_datagen.core.sources import SourceItem
    from airflow_provider_datagen.core.store.batch import Batch

COMPLETED = ItemStatus.COMPLETED.value
FILTERED = ItemStatus.FILTERED.value
_STEP_COMPLETED = EventType.STEP_COMPLETED.value
#: long loops: the cache of step sites is cleared at this size to stay bounded
_MAX_SITES = 10_000


class ChildJob(NamedTuple):
    """A fan-out child to drive: where it goes among its siblings, its body, and its ITEM_CREATED."""

    fanout_index: int
    child: WorkItem
    body: Step
    #: the keyword arguments of the child's ITEM_CREATED, or None when the child resumes
    created: dict[str, Any] | None


class Interpreter:
    """Drives items through the pipeline into ``self.batch``; subclasses decide what a checkpoint is."""

    def __init__(self, shared: RunShared, report: RunReport, known_children: set[str] | None = None) -> None:
        self.shared = shared
        self.report = report
        self.batch = self.new_batch()
        #: steps completed into ``batch`` since the last checkpoint (``checkpoint_every=1`` flushes them)
        self.steps = 0
        #: fan-out children whose sequence this writer already tracks (a Loop re-runs a fan-out)
        self.known_children: set[str] = set() if known_children is None else known_children
        #: rate-limit slots taken already for calls not yet made: with a budget, the threads and the
        #: async driver take an item's slot before its budget check (threads.py, aio.py); a call
        #: that finds one takes no slot of its own
        self.prepaid_slots = 0
        if guarded(shared):
            # Bound once per interpreter, not tested per item: a run without a policy, a rate limit or
            # an async step keeps its path.
            self._run_leaf = self._run_leaf_guarded  # type: ignore[method-assign]
        if shared.usage is not None and shared.usage.charges:
            # a rate limit: ctx.record_usage charges it (bound here, never tested per item)
            self.new_context = self.new_context_charged  # type: ignore[method-assign]

    def new_batch(self) -> Batch:
        return self.shared.writer.new_batch()

    def stage_created(self, src: SourceItem) -> None:
        """A lazily pulled root item's ITEM_CREATED, staged as the item starts (a run that a budget may stop).

        Its commit then carries it with the item's first checkpoint or acknowledgement: an item the
        stop never started has none, and stays ``never_started``.
        """
        self.batch.items_created([src.item_id], [src.fingerprint], self.shared.processor_version)

    # --- what subclasses decide ----------------------------------------------------------------

    def flush(self) -> None:
        """Make the events staged so far a checkpoint."""
        raise NotImplementedError

    def flush_due(self) -> bool:
        """Whether a checkpoint is due at this step boundary."""
        raise NotImplementedError

    def _children_in_pool(self) -> bool:
        """Whether this item's fan-out children run in the child pool (:meth:`_run_children`)."""
        return False

    def _run_children(self, jobs: list[ChildJob], path: str, fields: list[dict[str, Any]]) -> None:
        raise NotImplementedError

    # --- driving -------------------------------------------------------------------------------

    def new_context(self, item: WorkItem, coord: StepCoord) -> ItemContext:
        return ItemContext(item.item_id, item.key, item.fingerprint, item.attempt, item.fields, coord, item.modes)

    def new_context_charged(self, item: WorkItem, coord: StepCoord) -> ItemContext:
        ctx = ItemContext(item.item_id, item.key, item.fingerprint, item.attempt, item.fields, coord, item.modes)
        assert self.shared.usage is not None  # bound only then
        ctx.record.charge = self.shared.usage.charge
        return ctx

    def _stage_completed_usage(self, item_id: str, coord: StepCoord, ctx: ItemContext) -> None:
        """A STEP_COMPLETED carrying the usage ``ctx`` recorded (the attempt's end; see core/ledger/staging.py)."""
        usage = ctx.record.end()
        assert usage is not None
        self._step_completed(item_id, coord, completed_value(self.shared, ctx.attempt, usage))

    def _stage_leaf(
        self, iid: str, coord: StepCoord, shape: Any, done: Any, ctx: ItemContext, sets: Mapping[str, Any]
    ) -> None:
        """Stage a one-step pipeline's finished call: field deltas, STEP_COMPLETED and its TERMINAL.

        The TERMINAL is completed, or filtered by the step. Shared by the main thread's short path
        (:meth:`Runner.finish_leaf`) and a worker's (``ItemWorker.work_fresh_leaf``).
        """
        filtered, reason = ctx.record.filtered
        if ctx.record.ops or sets:
            self._stage_delta(iid, coord.step, sets, ctx.record.ops)
        if ctx.record.end() is None:
            # STEP_COMPLETED, and TERMINAL(completed) with it unless the step filtered the item
            self.batch.add_shaped(iid, shape, None if filtered else done)
        else:  # a STEP_COMPLETED carrying the recorded usage
            self._stage_completed_usage(iid, coord, ctx)
            if not filtered:
                self.batch.add_shaped(iid, done)
        self.steps += 1
        if filtered:
            self.batch.terminal(iid, status=FILTERED, reason=reason)

    def _step_completed(self, item_id: str, coord: StepCoord, value: Any = None) -> None:
        """Stage a STEP_COMPLETED at ``coord`` without a cached shape (``value``: its JSON payload, if any)."""
        self.batch.step_completed(
            item_id,
            step=coord.step or "",
            processor_version=self.shared.processor_version,
            step_kind=coord.step_kind,
            enclosing_step=coord.enclosing_step,
            iteration=coord.iteration,
            fanout_index=coord.fanout_index,
            selector_step=coord.selector_step,
            value=value,
        )

    def _drive(
        self,
        item: WorkItem,
        step: Step,
        enclosing: str | None,
        iteration: int | None,
        selector: str | None,
    ) -> tuple[str, Any]:
        """Run ``step`` for ``item``; returns the terminal status and filter reason."""
        try:
            self._run(item, step, enclosing, iteration, selector)
        except Filtered as f:
            return FILTERED, f.reason
        return COMPLETED, None

    def step_site(self, step: Step, enclosing: str | None, iteration: int | None, selector: str | None) -> StepSite:
        shared = self.shared
        key = (id(step), enclosing, iteration, selector)
        hit = shared.sites.get(key)
        if hit is None:
            coord = StepCoord(step.name, type(step).kind.value, enclosing, iteration, None, selector)
            writer = shared.writer
            shape = writer.shape(
                _STEP_COMPLETED,
                step=coord.step or "",
                step_kind=coord.step_kind,
                enclosing_step=coord.enclosing_step,
                iteration=coord.iteration,
                fanout_index=coord.fanout_index,
                selector_step=coord.selector_step,
                processor_version=shared.processor_version or writer.processor_version,
            )
            hit = StepSite(coord, coord.frame_key, f"{enclosing}/{step.name}" if enclosing else step.name, shape)
            if len(shared.sites) >= _MAX_SITES:
                shared.sites.clear()
            shared.sites[key] = hit
        return hit

    def _run(
        self, item: WorkItem, step: Step, enclosing: str | None, iteration: int | None, selector: str | None
    ) -> None:
        coord, frame, path, shape = self.step_site(step, enclosing, iteration, selector)
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
                ctx = self.new_context(item, coord)
                chosen = step.then if self._call(item, coord, step.predicate, item.data, ctx) else step.otherwise
            if chosen is not None:
                self._run(item, chosen, enclosing, iteration, step.name)
        elif isinstance(step, Router):
            target = self._recorded_choice(item, list(step.routes.values()), enclosing)
            name: Any = target.name if target is not None else None
            if target is None:
                ctx = self.new_context(item, coord)
                name = self._call(item, coord, step.route, item.data, ctx)
                target = step.routes.get(str(name)) or (step.routes[step.default] if step.default else None)
            if target is None:
                raise StepFailure(
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

    def _call(self, item: WorkItem, coord: StepCoord, fn: Callable[..., Any], *args: Any) -> Any:
        """Call a selector or fan-out callable; its error fails the item at this step's coordinates."""
        try:
            return fn(*args)
        except Exception as exc:
            raise StepFailure(item.item_id, coord, exc) from exc

    def _recorded_choice(self, item: WorkItem, options: list[Step], enclosing: str | None) -> Step | None:
        """The branch a selector took before a crash, rebuilt from the recorded frames of its subtree.

        Re-asking the predicate on replay would see fields written *after* the choice and could take
        the other branch too; step names are unique, so a recorded frame names its branch.
        """
        if not item.frames:
            return None
        known = self.shared.names
        for option in options:
            names = known.get(id(option))
            if names is None:
                names = known[id(option)] = step_names(option)
            for enc, name in item.frames:
                if name in names and (enclosing is None or enc == enclosing or (enc or "").startswith(enclosing + "/")):
                    return option
        return None

    def _start_frame(self, item: WorkItem, coord: StepCoord) -> None:
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
        item: WorkItem,
        coord: StepCoord,
        sets: Mapping[str, Any],
        ops: Iterable[tuple[str, str, Any]],
        frame: Any = None,
        shape: Any = None,
        ctx: ItemContext | None = None,
    ) -> None:
        """Stage a step's field delta and its STEP_COMPLETED together (one checkpoint unit).

        The STEP_COMPLETED carries the usage ``ctx`` recorded, if any.
        """
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
        if ctx is not None and ctx.record.end() is not None:
            self._stage_completed_usage(item.item_id, coord, ctx)
        elif shape is not None:
            b.add_shaped(item.item_id, shape)
        else:
            self._step_completed(item.item_id, coord)
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

    def _run_leaf(self, item: WorkItem, step: Step, coord: StepCoord, frame: Any, shape: Any) -> None:
        if frame in item.completed:
            return
        # checkpoint_every=1: completed steps become durable before the next step runs. Checking here
        # rather than after each step keeps an item's last step, its TERMINAL and its field deltas in
        # one commit (the ack), as the contract says.
        if self.flush_due():
            self.flush()
        ctx = self.new_context(item, coord)
        self.report.invocations += 1
        try:
            result = step.fn(item.data, ctx)
            sets = self.checked_sets(item.item_id, step, result, ctx)
        except Exception as exc:
            raise StepFailure(item.item_id, coord, exc, usage=ctx.record.end()) from exc
        except BaseException as exc:
            raise StepFailure(item.item_id, coord, exc, usage=ctx.record.end()) from exc
        self._complete(item, coord, sets, ctx.record.ops, frame, shape, ctx)
        if ctx.record.filtered[0]:
            raise Filtered(ctx.record.filtered[1])

    def _run_leaf_guarded(self, item: WorkItem, step: Step, coord: StepCoord, frame: Any, shape: Any) -> None:
        """:meth:`_run_leaf` with a retry policy, a rate limit or async steps: the call goes through attempts.py."""
        if frame in item.completed:
            return
        if self.flush_due():
            self.flush()
        calls: list[ItemContext] = []
        try:
            result, ctx = call_step(self, item, step, coord, calls)
            sets = self.checked_sets(item.item_id, step, result, ctx)
        except BaseException as exc:
            attempt = item.attempt if self.shared.retry is not None else None
            # the last attempt's usage goes with its FAILED row (an earlier one's went with its transient row)
            usage = calls[-1].record.end() if calls else None
            raise StepFailure(item.item_id, coord, exc, attempt=attempt, usage=usage) from exc
        self._complete(item, coord, sets, ctx.record.ops, frame, shape, ctx)
        if ctx.record.filtered[0]:
            raise Filtered(ctx.record.filtered[1])

    def checked_sets(self, item_id: str, step: Step, result: Any, ctx: ItemContext) -> Mapping[str, Any]:
        """The fields a finished call of ``step`` returned, checked: the one place every driver checks a call.

        The result against the process's contract, then each returned field against the mode the
        item's earlier steps (or this call's ``ctx.append``) gave it; raises the contract error
        otherwise, for the caller to fail the item with. None (no fields) is :data:`NO_FIELDS`.
        """
        if result is None:
            return NO_FIELDS
        sets = self._check_result_of(item_id, step, result)
        for name in sets:
            ctx.record.check_mode(item_id, name, "set")
        return sets

    def _check_result(self, item: WorkItem, step: Step, result: Any) -> dict[str, Any]:
        return {} if result is None else self._check_result_of(item.item_id, step, result)

    #: the fields a step returned, checked against the process's contract (a contract error otherwise)
    _check_result_of = staticmethod(check_result_of)

    def _run_loop(self, item: WorkItem, step: Loop, enclosing: str | None, selector: str | None, path: str) -> None:
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

    def _run_fanout(self, item: WorkItem, step: Step, coord: StepCoord, path: str) -> None:
        if coord.frame_key in item.completed:
            return
        pv = self.shared.processor_version
        ctx = self.new_context(item, coord)
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
        # an item on a worker thread, root or child (with concurrency=1 the main thread runs them in order)
        parallel = self._children_in_pool()
        jobs: list[ChildJob] = []
        for idx, (child_input, body) in enumerate(zip(inputs, bodies)):
            cid = child_item_id(item.item_id, step.name, idx)
            fp = fingerprint_of(child_input)
            cstate = item.children.get(cid)
            if (
                cstate is not None
                and cstate.is_done
                and cstate.input_fingerprint == fp
                and cstate.processor_version == pv
            ):
                children_fields[idx] = loaded_fields(cstate.fields)
                continue
            resumable = (
                cstate is not None
                and cstate.status is ItemStatus.RUNNING
                and cstate.input_fingerprint == fp
                and cstate.processor_version == pv
            )
            created: dict[str, Any] | None = None
            if resumable:
                child = WorkItem.start(cid, item.key, child_input, fp, cstate, item.children)
            else:
                if cstate is None and cid not in self.known_children:
                    self.shared.writer.prime(cid, last_seq=-1)
                child = WorkItem(cid, item.key, child_input, fp, None, item.children)
                created = {
                    "input_fingerprint": fp,
                    "processor_version": pv,
                    "parent_item_id": item.item_id,
                    "step": step.name,
                    "step_kind": type(step).kind.value,
                    "enclosing_step": coord.enclosing_step,
                    "fanout_index": idx,
                    "selector_step": coord.selector_step,
                }
            # From here on the writer tracks the child's sequence; a Loop running this fan-out again
            # starts a new generation of the same child id after it, never over it.
            self.known_children.add(cid)
            item.children.pop(cid, None)
            if parallel:
                jobs.append(ChildJob(idx, child, body, created))
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
            raise StepFailure(item.item_id, coord, exc, usage=ctx.record.end()) from exc
        self._complete(item, coord, sets, [], ctx=ctx)


def step_names(step: Step) -> set[str]:
    """The names of ``step`` and of every step below it."""
    return {step.name}.union(*(step_names(c) for c in step.children()))


def guarded(shared: RunShared) -> bool:
    """Whether a leaf call goes through attempts.py: a retry policy, a rate limit, or async steps bridged."""
    return (
        shared.retry is not None
        or shared.before_attempt is not None
        or shared.on_throttled is not None
        or shared.bridge is not None
    )


def has_async(step: Step) -> bool:
    """Whether a leaf step under ``step`` (``step`` included) is async."""
    return step.is_async or any(has_async(c) for c in step.children())


def has_fanout(step: Step) -> bool:
    """Whether the graph under ``step`` holds a fan-out (its children need log reads and a pool)."""
    return type(step).kind in FANOUT_KINDS or any(has_fanout(c) for c in step.children())
