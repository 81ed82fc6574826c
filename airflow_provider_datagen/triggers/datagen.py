"""DatagenStatusTrigger: wait for a condition on an experiment's folded status in the triggerer."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider_datagen._arguments import bad_argument
from airflow_provider_datagen.exceptions import ExperimentNotFoundError
from airflow_provider_datagen.triggers.status_watch import CONDITIONS, StatusWatch

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


class DatagenStatusTrigger(BaseTrigger):
    """
    Poll an experiment's folded status until a named condition holds or failures exceed a bound.

    Lance reads run in ``asyncio.to_thread`` so the triggerer's event loop never blocks. Yields one
    ``TriggerEvent`` ``{"status": ..., "outcome": "done" | "too_many_failures" | "usage_exceeded"}``, or
    ``{"status": None, "outcome": "not_found", "message": ...}`` when the experiment has no log and
    ``allow_missing`` is False, or ``{"status": ..., "outcome": "stopped_by_budget", "message": ...}``
    when the experiment stopped at its budget with items pending (the sensor is then skipped).

    :param poke_interval: seconds between two status reads.
    :param watch: the fields of :class:`~airflow_provider_datagen.triggers.status_watch.StatusWatch`
        (``pipeline``, ``experiment``, ``condition``, ...), as
        :class:`~airflow_provider_datagen.sensors.datagen.DatagenStatusSensor` takes them; the
        ``condition`` must be a name, since a callable cannot be serialized into the triggerer.
        ``max_failed_items``, ``max_cost_usd`` and ``max_tokens`` fire early with ``too_many_failures``
        or ``usage_exceeded``.
    """

    def __init__(self, *, poke_interval: float = 30.0, **watch: Any) -> None:
        super().__init__()
        # flat keyword arguments, not one object: they are what serialize() writes and the metadata DB holds
        params = StatusWatch.from_kwargs(watch)
        if not isinstance(params.condition, str):
            raise bad_argument(
                self,
                "condition",
                params.condition,
                "is not a condition name",
                f"a deferrable datagen sensor needs one of {sorted(CONDITIONS)}: a callable cannot be serialized "
                "into the triggerer",
            )
        self.watch = params.checked(self)
        self.poke_interval = float(poke_interval)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {**self.watch.to_kwargs(), "poke_interval": self.poke_interval},
        )

    def _status(self) -> tuple[dict[str, Any], bool]:
        return self.watch.read()

    async def run(self) -> AsyncIterator[TriggerEvent]:
        watch = self.watch
        while True:
            try:
                status, exists = await asyncio.to_thread(self._status)
            except ExperimentNotFoundError as exc:
                # The sensor raises it again on the worker, where the task's failure shows it.
                yield TriggerEvent({"status": None, "outcome": "not_found", "message": str(exc)})
                return
            if not exists:
                self.log.info(
                    "datagen %s/%s has no log yet; waiting for a run to create it", watch.pipeline, watch.experiment
                )
                await asyncio.sleep(self.poke_interval)
                continue
            if watch.too_many_failed(status):
                yield TriggerEvent({"status": status, "outcome": "too_many_failures"})
                return
            if watch.usage_exceeded(status):
                yield TriggerEvent({"status": status, "outcome": "usage_exceeded"})
                return
            if watch.holds(status):
                yield TriggerEvent({"status": status, "outcome": "done"})
                return
            if status.get("stopped_by_budget"):
                # no task will run the pending items: waiting would last until the sensor's timeout
                message = await asyncio.to_thread(watch.budget_stop_message, int(status["pending"]))
                yield TriggerEvent({"status": status, "outcome": "stopped_by_budget", "message": message})
                return
            self.log.info(
                "datagen %s/%s: %s pending, %s failed items; waiting for %s",
                watch.pipeline,
                watch.experiment,
                status.get("pending"),
                status.get("failed_items"),
                watch.condition,
            )
            await asyncio.sleep(self.poke_interval)
