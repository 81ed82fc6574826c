"""The step model: drivers, fan-outs and selectors, as plain declarative objects.

Steps only describe a pipeline; :mod:`runner` interprets them. The kind decides which rows a step
emits: drivers (``Step``, ``Sequence``, ``Loop``) record their frames, fan-outs (``MapReduce``,
``Branch``, ``SubPipeline``) create child items ``parent/step:idx`` and record only their reduce on the
parent, selectors (``Conditional``, ``Router``) record nothing themselves: the chosen child carries the
selector in ``selector_step`` (see docs/design.md, The event log). Every choice is recomputed from the
item and its folded fields on resume (see docs/design.md, Resume), so nothing opaque is ever stored.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from collections.abc import Sequence as Seq
from typing import Any

from airflow_provider_datagen.core.ids import check_name
from airflow_provider_datagen.core.schema import StepKind
from airflow_provider_datagen.exceptions import InvalidPipelineError

#: A user function: ``fn(item, ctx) -> dict | None``; a returned dict sets one field per key.
ProcessFn = Callable[..., Any]


def is_async(fn: Any) -> bool:
    """Whether calling ``fn`` gives a coroutine: an ``async def`` (or a partial of one), or an object
    whose ``__call__`` is one."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if inspect.iscoroutinefunction(fn):
        return True
    if inspect.isfunction(fn) or inspect.ismethod(fn):
        return False
    for klass in type(fn).__mro__:  # the class's own __call__, as a call of the object finds it
        if "__call__" in klass.__dict__:
            return inspect.iscoroutinefunction(klass.__dict__["__call__"])
    return False


def _sync_only(owner: str, what: str, fn: Any) -> None:
    """Selectors and fan-out callables stay plain functions: cheap functions of the item, run inline."""
    if fn is not None and is_async(fn):
        raise InvalidPipelineError(
            f"{owner}: {what} is async; selectors, fan-out callables and reduce must be plain functions of the "
            "item and its fields. Put the model call in a leaf step (Step(name, async_fn)) and read its field"
        )


class Step:
    """A leaf step: one call of a user function, checkpointed by one STEP_COMPLETED.

    :param name: unique name of the step in its pipeline (letters, digits, ``_-.``).
    :param fn: ``fn(item, ctx) -> dict | None``, or ``async def fn(item, ctx)`` (an object with an
        async ``__call__`` too): the runner awaits it (see ``run_items``' ``concurrency``).
    """

    kind: StepKind = StepKind.STEP
    #: whether ``fn`` is async (a leaf step only; the other kinds hold no fn of their own)
    is_async: bool = False

    def __init__(self, name: str, fn: ProcessFn) -> None:
        self.name = check_name(name, "step")
        if not callable(fn):
            raise InvalidPipelineError(f"step {name!r}: fn must be callable, got {type(fn).__name__}")
        self.fn = fn
        self.is_async = is_async(fn)

    def children(self) -> list[Step]:
        return []

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


def as_step(obj: Any, name: str) -> Step:
    """A Step from a Step or a bare callable (named ``name``)."""
    if isinstance(obj, Step):
        return obj
    if callable(obj):
        return Step(name, obj)
    raise InvalidPipelineError(
        f"{name!r}: expected a Step or a callable, got {type(obj).__name__}; "
        "use one of Step, Sequence, Loop, MapReduce, Branch, SubPipeline, Conditional, Router"
    )


class Sequence(Step):
    """A driver running its steps in order; one STEP_STARTED/STEP_COMPLETED frame around them."""

    kind = StepKind.SEQUENCE

    def __init__(self, name: str, steps: Seq[Step | ProcessFn]) -> None:
        self.name = check_name(name, "step")
        if isinstance(steps, (str, bytes)) or not isinstance(steps, Seq) or not steps:
            raise InvalidPipelineError(f"Sequence {name!r} needs a non-empty list of steps")
        self.steps = [as_step(s, f"{name}_{i}") for i, s in enumerate(steps)]

    def children(self) -> list[Step]:
        return list(self.steps)


class Loop(Step):
    """A driver repeating ``body``: a frame per iteration, so a crash resumes mid-loop.

    :param times: a fixed number of iterations, or
    :param until: ``until(fields) -> bool`` checked after each iteration (deterministic on the
        folded fields), bounded by ``max_iterations``.
    """

    kind = StepKind.LOOP

    def __init__(
        self,
        name: str,
        body: Step | ProcessFn,
        *,
        times: int | None = None,
        until: Callable[[dict[str, Any]], bool] | None = None,
        max_iterations: int = 100,
    ) -> None:
        self.name = check_name(name, "step")
        self.body = as_step(body, f"{name}_body")
        if (times is None) == (until is None):
            raise InvalidPipelineError(f"Loop {name!r}: give exactly one of times= or until=")
        _sync_only(f"Loop {name!r}", "until", until)
        if times is not None and (isinstance(times, bool) or not isinstance(times, int) or times < 0):
            raise InvalidPipelineError(f"Loop {name!r}: times must be a non-negative int")
        if not isinstance(max_iterations, int) or max_iterations < 1:
            raise InvalidPipelineError(f"Loop {name!r}: max_iterations must be a positive int")
        self.times = times
        self.until = until
        self.max_iterations = max_iterations if times is None else times

    def children(self) -> list[Step]:
        return [self.body]


def _default_reduce(children_fields: list[dict[str, Any]], ctx: Any) -> dict[str, Any]:
    return {"results": children_fields}


class MapReduce(Step):
    """A fan-out: ``over(item, ctx)`` lists child inputs, ``map`` runs on each child item, ``reduce``
    folds the children's fields (in index order) into the parent's fields.
    """

    kind = StepKind.MAP_REDUCE

    def __init__(
        self,
        name: str,
        *,
        over: Callable[..., Seq[Mapping[str, Any]]],
        map: Step | ProcessFn,
        reduce: Callable[..., dict[str, Any] | None] = _default_reduce,
    ) -> None:
        self.name = check_name(name, "step")
        if not callable(over) or not callable(reduce):
            raise InvalidPipelineError(f"MapReduce {name!r}: over and reduce must be callables")
        _sync_only(f"MapReduce {name!r}", "over", over)
        _sync_only(f"MapReduce {name!r}", "reduce", reduce)
        self.over = over
        self.map = as_step(map, f"{name}_map")
        self.reduce = reduce

    def children(self) -> list[Step]:
        return [self.map]


class Branch(Step):
    """A fan-out running each branch on its own child item (same input); ``reduce`` merges them."""

    kind = StepKind.BRANCH

    def __init__(
        self,
        name: str,
        branches: Seq[Step | ProcessFn],
        *,
        reduce: Callable[..., dict[str, Any] | None] | None = None,
    ) -> None:
        self.name = check_name(name, "step")
        if isinstance(branches, (str, bytes)) or not isinstance(branches, Seq) or not branches:
            raise InvalidPipelineError(f"Branch {name!r} needs a non-empty list of branches")
        _sync_only(f"Branch {name!r}", "reduce", reduce)
        self.branches = [as_step(b, f"{name}_{i}") for i, b in enumerate(branches)]
        self.reduce = reduce

    def children(self) -> list[Step]:
        return list(self.branches)


class SubPipeline(Step):
    """A fan-out of one: a nested pipeline on a child item; its fields come back through ``reduce``."""

    kind = StepKind.SUB_PIPELINE

    def __init__(
        self,
        name: str,
        pipeline: Step | ProcessFn,
        *,
        input: Callable[..., Mapping[str, Any]] | None = None,
        reduce: Callable[..., dict[str, Any] | None] | None = None,
    ) -> None:
        self.name = check_name(name, "step")
        _sync_only(f"SubPipeline {name!r}", "input", input)
        _sync_only(f"SubPipeline {name!r}", "reduce", reduce)
        self.pipeline = as_step(pipeline, f"{name}_pipeline")
        self.input = input
        self.reduce = reduce

    def children(self) -> list[Step]:
        return [self.pipeline]


class Conditional(Step):
    """A selector: ``predicate(item, fields)`` picks ``then`` or ``otherwise``; no row of its own."""

    kind = StepKind.CONDITIONAL

    def __init__(
        self,
        name: str,
        predicate: Callable[..., bool],
        then: Step | ProcessFn,
        otherwise: Step | ProcessFn | None = None,
    ) -> None:
        self.name = check_name(name, "step")
        if not callable(predicate):
            raise InvalidPipelineError(f"Conditional {name!r}: predicate must be callable")
        _sync_only(f"Conditional {name!r}", "predicate", predicate)
        self.predicate = predicate
        self.then = as_step(then, f"{name}_then")
        self.otherwise = as_step(otherwise, f"{name}_otherwise") if otherwise is not None else None

    def children(self) -> list[Step]:
        return [self.then] + ([self.otherwise] if self.otherwise is not None else [])


class Router(Step):
    """A selector: ``route(item, fields) -> name`` picks one of ``routes``; no row of its own."""

    kind = StepKind.ROUTER

    def __init__(
        self,
        name: str,
        route: Callable[..., str],
        routes: Mapping[str, Step | ProcessFn],
        *,
        default: str | None = None,
    ) -> None:
        self.name = check_name(name, "step")
        if not callable(route):
            raise InvalidPipelineError(f"Router {name!r}: route must be callable")
        _sync_only(f"Router {name!r}", "route", route)
        if not isinstance(routes, Mapping) or not routes:
            raise InvalidPipelineError(f"Router {name!r} needs a non-empty mapping of routes")
        self.route = route
        self.routes = {str(k): as_step(v, f"{name}_{k}") for k, v in routes.items()}
        if default is not None and default not in self.routes:
            raise InvalidPipelineError(f"Router {name!r}: default route {default!r} is not in routes")
        self.default = default

    def children(self) -> list[Step]:
        return list(self.routes.values())


_KNOWN = (Step, Sequence, Loop, MapReduce, Branch, SubPipeline, Conditional, Router)


def validate_pipeline(root: Step) -> Step:
    """Check a step graph before anything runs: known kinds, unique names, no cycles."""
    seen: dict[str, Step] = {}
    stack: list[tuple[Step, frozenset[int]]] = [(root, frozenset())]
    while stack:
        step, ancestors = stack.pop()
        if not isinstance(step, _KNOWN) or type(step).kind not in StepKind.__members__.values():
            raise InvalidPipelineError(
                f"unknown step kind {type(step).__name__!r}; use one of {[k.__name__ for k in _KNOWN]}"
            )
        if id(step) in ancestors:
            raise InvalidPipelineError(f"step {step.name!r} contains itself; step graphs must be trees")
        if step.name in seen and seen[step.name] is not step:
            raise InvalidPipelineError(
                f"duplicate step name {step.name!r}: step names key the checkpoints, so each must be unique"
            )
        if step.name in seen:
            raise InvalidPipelineError(f"step {step.name!r} is used twice; build a separate step for each use")
        seen[step.name] = step
        stack.extend((child, ancestors | {id(step)}) for child in step.children())
    return root


def as_pipeline(process_or_pipeline: Any) -> Step:
    """The root step for ``run_items``: a Step as given, or a bare function as one leaf ``process``."""
    if isinstance(process_or_pipeline, Step):
        return validate_pipeline(process_or_pipeline)
    if callable(process_or_pipeline):
        return Step("process", process_or_pipeline)
    raise InvalidPipelineError(
        f"process must be a callable fn(item, ctx) or a Step pipeline, got {type(process_or_pipeline).__name__}"
    )
