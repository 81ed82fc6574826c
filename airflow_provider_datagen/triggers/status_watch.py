"""StatusWatch: what a datagen status sensor and its trigger watch, checked, read and judged in one place.

:class:`~airflow_provider_datagen.sensors.datagen.DatagenStatusSensor` builds one from its arguments;
in deferrable mode it hands it to
:class:`~airflow_provider_datagen.triggers.datagen.DatagenStatusTrigger`, whose ``serialize()``
writes it as flat keyword arguments (:meth:`StatusWatch.to_kwargs`) and reads them back
(:meth:`StatusWatch.from_kwargs`). Those keys are what the metadata DB already holds for deferred
sensors, so they are the fields' names and must stay so.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from airflow_provider_datagen._arguments import bad_argument, check_name_argument
from airflow_provider_datagen.hooks.datagen import DatagenHook

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

#: Conditions a sensor or trigger understands by name; a sensor also accepts a callable.
CONDITIONS: dict[str, Callable[[dict[str, Any]], bool]] = {
    # Every item known (to the log, or to the source when one is given) is completed or filtered.
    "all_done": lambda s: s["total"] > 0 and s["pending"] == 0,
    # Nothing left to do, including the trivial case of an empty experiment.
    "no_pending": lambda s: s["pending"] == 0,
    # No item is currently failed (a failed item that was retried successfully does not count).
    "no_failures": lambda s: s["failed_items"] == 0,
}

#: The end of the message when a sensor's experiment has no log.
MISSING_FIX = (
    "Check the pipeline and experiment names and the connection's root, or pass allow_missing=True to wait "
    "until a run creates the experiment"
)


@dataclass(frozen=True, kw_only=True)
class StatusWatch:
    """
    An experiment to watch, the condition to wait for and the bounds that end the wait early.

    Constructing one checks nothing (a serialized trigger or a sensor's rendered template fields are
    read back as they are); :meth:`checked` is the one check of the arguments a user gives.
    The fields are documented on the sensor, whose arguments they are.
    """

    pipeline: str
    experiment: str
    # a name of CONDITIONS, or (poke/reschedule sensors only) a callable on the status
    condition: Any = "all_done"
    source: Any = None
    key_field: str = "id"
    max_failed_items: int | None = None
    allow_missing: bool = False
    max_cost_usd: float | None = None
    max_tokens: int | None = None
    datagen_conn_id: str = DatagenHook.default_conn_name

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any]) -> StatusWatch:
        """The watch :meth:`to_kwargs` wrote; a key it lacks takes the field's default."""
        return cls(**kwargs)

    def to_kwargs(self) -> dict[str, Any]:
        """The fields by name, as a trigger serializes them (JSON-able when ``source`` is)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def of(cls, holder: object) -> StatusWatch:
        """The watch read from ``holder``'s attributes of the fields' names (a sensor's, after templating)."""
        return cls(**{f.name: getattr(holder, f.name) for f in fields(cls)})

    def checked(self, owner: object, *, deferrable: bool = False) -> StatusWatch:
        """This watch if every argument is valid, raising the error that names ``owner`` otherwise.

        ``deferrable``: the condition will run in the triggerer, so it must be a name.
        """
        check_name_argument(owner, "pipeline", self.pipeline)
        check_name_argument(owner, "experiment", self.experiment)
        check_condition(owner, self.condition)
        if deferrable and not isinstance(self.condition, str):
            raise bad_argument(
                owner,
                "condition",
                self.condition,
                "is a callable, which cannot run in the triggerer",
                "use a named condition with deferrable=True, or poke/reschedule mode for a callable",
            )
        limit = self.max_failed_items
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            raise bad_argument(
                owner,
                "max_failed_items",
                limit,
                "is not a non-negative int",
                "give how many failed items to tolerate, or None to never fail on them",
            )
        if not isinstance(self.allow_missing, bool):
            raise bad_argument(
                owner,
                "allow_missing",
                self.allow_missing,
                "is not a bool",
                "pass True to wait for the experiment's creation, False to fail when it does not exist",
            )
        _check_usage_limit(owner, "max_cost_usd", self.max_cost_usd)
        _check_usage_limit(owner, "max_tokens", self.max_tokens)
        return self

    def read(self) -> tuple[dict[str, Any], bool]:
        """The folded ``datagen_status`` of the experiment and whether its log exists.

        With a source, its unstarted items are pending. A missing log raises
        :class:`~airflow_provider_datagen.exceptions.ExperimentNotFoundError` unless ``allow_missing``,
        when it reads as an empty experiment.
        """
        # Deferred: core imports Lance, which DAG parsing must not pay for.
        from airflow_provider_datagen.core import status_of
        from airflow_provider_datagen.core.export import require_experiment

        event_log = DatagenHook(datagen_conn_id=self.datagen_conn_id).get_log(self.pipeline, self.experiment)
        exists = event_log.exists()
        if not exists and not self.allow_missing:
            require_experiment(event_log, fix=MISSING_FIX)
        items = None if self.source is None else _source_items(self.source, event_log.storage_options)
        return status_of(event_log, items, self.key_field), exists

    def holds(self, status: dict[str, Any]) -> bool:
        cond = self.condition
        return bool(CONDITIONS[cond](status) if isinstance(cond, str) else cond(status))

    def too_many_failed(self, status: dict[str, Any]) -> bool:
        return self.max_failed_items is not None and int(status.get("failed_items", 0)) > self.max_failed_items

    def usage_exceeded(self, status: dict[str, Any]) -> str | None:
        """Why the status's recorded usage is above a limit of this watch, or None (see the usage ledger)."""
        usage = status.get("usage") or {}
        cost = float(usage.get("cost_usd", 0.0))
        tokens = int(usage.get("input_tokens", 0)) + int(usage.get("output_tokens", 0))
        if self.max_cost_usd is not None and cost > self.max_cost_usd:
            return f"recorded cost ${cost:.6f} is above max_cost_usd=${self.max_cost_usd:.6f}"
        if self.max_tokens is not None and tokens > self.max_tokens:
            return f"recorded tokens {tokens} are above max_tokens={self.max_tokens}"
        return None

    def budget_stop_message(self, pending: int) -> str:
        """What a sensor logs when its experiment stopped at its budget: the budget, the spend and the fix."""
        # Deferred: see read.
        from airflow_provider_datagen.core.store.tally import budget_stop

        event_log = DatagenHook(datagen_conn_id=self.datagen_conn_id).get_log(self.pipeline, self.experiment)
        why = budget_stop(event_log, pending) or "its budget is reached"
        return (
            f"datagen {self.pipeline}/{self.experiment} stopped at its budget ({why}) with {pending} items "
            "pending, which no task will run: the condition cannot hold, so this sensor is skipped. Raise "
            "budget_usd/budget_tokens (on the plan and map tasks) and trigger the DAG again to continue where "
            "it stopped."
        )


def check_condition(owner: object, condition: Any) -> Any:
    """``condition`` if it is a known condition name or a callable; ``owner`` is the class taking it."""
    if isinstance(condition, str):
        if condition not in CONDITIONS:
            raise bad_argument(
                owner,
                "condition",
                condition,
                "is unknown",
                f"use one of {sorted(CONDITIONS)} or a callable on the status",
            )
        return condition
    if callable(condition):
        return condition
    raise bad_argument(
        owner,
        "condition",
        condition,
        f"is a {type(condition).__name__}, not a condition name or a callable",
        f"use one of {sorted(CONDITIONS)} or a callable on the status",
    )


def _check_usage_limit(owner: object, param: str, value: Any) -> None:
    """``max_cost_usd`` must be a number >= 0 and ``max_tokens`` an int >= 0, or None: no limit."""
    if value is None:
        return
    ok = not isinstance(value, bool) and isinstance(value, int if param == "max_tokens" else (int, float))
    if not ok or not value >= 0:  # NaN too
        kind = "int" if param == "max_tokens" else "number"
        raise bad_argument(owner, param, value, f"is not a non-negative {kind}", "give the limit, or None for none")


def _source_items(source: Any, storage_options: dict[str, str] | None) -> Any:
    # Deferred: see StatusWatch.read.
    from airflow_provider_datagen.core import read_source

    # the connection's storage options: an object-store source reads as the plan read it
    return list(read_source(source, storage_options=storage_options))
