"""DatagenStatusTrigger: wait for a condition on an experiment's folded status in the triggerer."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider_datagen._arguments import bad_argument
from airflow_provider_datagen.exceptions import ExperimentNotFoundError
from airflow_provider_datagen.hooks.datagen import DatagenHook

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

#: Conditions a sensor or trigger understands by name; a sensor also accepts a callable.
CONDITIONS: dict[str, Callable[[dict[str, Any]], bool]] = {
    # Every item known (to the log, or to the source when one is given) is completed or filtered.
    "all_done": lambda s: s["total"] > 0 and s["pending"] == 0,
    # Nothing left to do, including the trivial case of an empty experiment.
    "no_pending": lambda s: s["pending"] == 0,
    # No item is currently failed (a failed item that was retried successfully does not count).
    "no_failures": lambda s: s["failed_items"] == 0,
}


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


#: The end of the message when a sensor's experiment has no log.
MISSING_FIX = (
    "Check the pipeline and experiment names and the connection's root, or pass allow_missing=True to wait "
    "until a run creates the experiment"
)


def compute_status(
    *, pipeline: str, experiment: str, source: Any, key_field: str, datagen_conn_id: str, allow_missing: bool = False
) -> tuple[dict[str, Any], bool]:
    """The folded ``datagen_status`` of an experiment and whether its log exists.

    With a source, its unstarted items are pending. A missing log raises
    :class:`~airflow_provider_datagen.exceptions.ExperimentNotFoundError` unless ``allow_missing``,
    when it reads as an empty experiment.
    """
    # Deferred: core imports Lance, which DAG parsing must not pay for.
    from airflow_provider_datagen.core import status_of
    from airflow_provider_datagen.core.export import require_experiment

    event_log = DatagenHook(datagen_conn_id=datagen_conn_id).get_log(pipeline, experiment)
    exists = event_log.exists()
    if not exists and not allow_missing:
        require_experiment(event_log, fix=MISSING_FIX)
    items = None if source is None else _source_items(source, event_log.storage_options)
    return status_of(event_log, items, key_field), exists


def budget_stop_message(*, pipeline: str, experiment: str, datagen_conn_id: str, pending: int) -> str:
    """What a sensor logs when its experiment stopped at its budget: the budget, the spend and the fix."""
    # Deferred: see compute_status.
    from airflow_provider_datagen.core.store.tally import budget_stop

    event_log = DatagenHook(datagen_conn_id=datagen_conn_id).get_log(pipeline, experiment)
    why = budget_stop(event_log, pending) or "its budget is reached"
    return (
        f"datagen {pipeline}/{experiment} stopped at its budget ({why}) with {pending} items pending, which no "
        "task will run: the condition cannot hold, so this sensor is skipped. Raise budget_usd/budget_tokens "
        "(on the plan and map tasks) and trigger the DAG again to continue where it stopped."
    )


def _source_items(source: Any, storage_options: dict[str, str] | None) -> Any:
    # Deferred: see compute_status.
    from airflow_provider_datagen.core import read_source

    # the connection's storage options: an object-store source reads as the plan read it
    return list(read_source(source, storage_options=storage_options))


def failed_items_exceeded(status: dict[str, Any], max_failed_items: int | None) -> bool:
    return max_failed_items is not None and int(status.get("failed_items", 0)) > max_failed_items


def usage_exceeded(status: dict[str, Any], max_cost_usd: float | None, max_tokens: int | None) -> str | None:
    """Why the status's recorded usage is above a sensor's limit, or None (see the usage ledger)."""
    usage = status.get("usage") or {}
    cost = float(usage.get("cost_usd", 0.0))
    tokens = int(usage.get("input_tokens", 0)) + int(usage.get("output_tokens", 0))
    if max_cost_usd is not None and cost > max_cost_usd:
        return f"recorded cost ${cost:.6f} is above max_cost_usd=${max_cost_usd:.6f}"
    if max_tokens is not None and tokens > max_tokens:
        return f"recorded tokens {tokens} are above max_tokens={max_tokens}"
    return None


class DatagenStatusTrigger(BaseTrigger):
    """
    Poll an experiment's folded status until a named condition holds or failures exceed a bound.

    Lance reads run in ``asyncio.to_thread`` so the triggerer's event loop never blocks. Yields one
    ``TriggerEvent`` ``{"status": ..., "outcome": "done" | "too_many_failures"}``, or
    ``{"status": None, "outcome": "not_found", "message": ...}`` when the experiment has no log and
    ``allow_missing`` is False, or ``{"status": ..., "outcome": "stopped_by_budget", "message": ...}``
    when the experiment stopped at its budget with items pending (the sensor is then skipped).

    :param pipeline: pipeline name.
    :param experiment: experiment name.
    :param condition: ``"all_done"``, ``"no_pending"`` or ``"no_failures"`` (callables cannot be
        serialized into the triggerer; use a poking sensor for those).
    :param source: optional source (path/URI or list) whose never-started items count as pending.
    :param key_field: key field of ``source``.
    :param max_failed_items: fire early with ``too_many_failures`` when more items are failed.
    :param max_cost_usd: fire early with ``usage_exceeded`` when the recorded cost is above it.
    :param max_tokens: fire early with ``usage_exceeded`` when the recorded tokens are above it.
    :param poke_interval: seconds between two status reads.
    :param datagen_conn_id: connection of type ``datagen``.
    :param allow_missing: wait while the experiment has no log instead of failing.
    """

    def __init__(
        self,
        *,
        pipeline: str,
        experiment: str,
        condition: str = "all_done",
        source: Any = None,
        key_field: str = "id",
        max_failed_items: int | None = None,
        poke_interval: float = 30.0,
        datagen_conn_id: str = "datagen_default",
        allow_missing: bool = False,
        max_cost_usd: float | None = None,
        max_tokens: int | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(condition, str):
            raise bad_argument(
                self,
                "condition",
                condition,
                "is not a condition name",
                f"a deferrable datagen sensor needs one of {sorted(CONDITIONS)}: a callable cannot be serialized "
                "into the triggerer",
            )
        self.pipeline = pipeline
        self.experiment = experiment
        self.condition = check_condition(self, condition)
        self.source = source
        self.key_field = key_field
        self.max_failed_items = max_failed_items
        self.poke_interval = float(poke_interval)
        self.datagen_conn_id = datagen_conn_id
        self.allow_missing = bool(allow_missing)
        self.max_cost_usd = max_cost_usd
        self.max_tokens = max_tokens

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "pipeline": self.pipeline,
                "experiment": self.experiment,
                "condition": self.condition,
                "source": self.source,
                "key_field": self.key_field,
                "max_failed_items": self.max_failed_items,
                "poke_interval": self.poke_interval,
                "datagen_conn_id": self.datagen_conn_id,
                "allow_missing": self.allow_missing,
                "max_cost_usd": self.max_cost_usd,
                "max_tokens": self.max_tokens,
            },
        )

    def _status(self) -> tuple[dict[str, Any], bool]:
        return compute_status(
            pipeline=self.pipeline,
            experiment=self.experiment,
            source=self.source,
            key_field=self.key_field,
            datagen_conn_id=self.datagen_conn_id,
            allow_missing=self.allow_missing,
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            try:
                status, exists = await asyncio.to_thread(self._status)
            except ExperimentNotFoundError as exc:
                # The sensor raises it again on the worker, where the task's failure shows it.
                yield TriggerEvent({"status": None, "outcome": "not_found", "message": str(exc)})
                return
            if not exists:
                self.log.info(
                    "datagen %s/%s has no log yet; waiting for a run to create it", self.pipeline, self.experiment
                )
                await asyncio.sleep(self.poke_interval)
                continue
            if failed_items_exceeded(status, self.max_failed_items):
                yield TriggerEvent({"status": status, "outcome": "too_many_failures"})
                return
            if usage_exceeded(status, self.max_cost_usd, self.max_tokens):
                yield TriggerEvent({"status": status, "outcome": "usage_exceeded"})
                return
            if CONDITIONS[self.condition](status):
                yield TriggerEvent({"status": status, "outcome": "done"})
                return
            if status.get("stopped_by_budget"):
                # no task will run the pending items: waiting would last until the sensor's timeout
                message = await asyncio.to_thread(
                    budget_stop_message,
                    pipeline=self.pipeline,
                    experiment=self.experiment,
                    datagen_conn_id=self.datagen_conn_id,
                    pending=int(status["pending"]),
                )
                yield TriggerEvent({"status": status, "outcome": "stopped_by_budget", "message": message})
                return
            self.log.info(
                "datagen %s/%s: %s pending, %s failed items; waiting for %s",
                self.pipeline,
                self.experiment,
                status.get("pending"),
                status.get("failed_items"),
                self.condition,
            )
            await asyncio.sleep(self.poke_interval)
