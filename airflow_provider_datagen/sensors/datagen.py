"""DatagenStatusSensor: wait on a condition over an experiment's folded status."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue
from airflow.sdk.exceptions import AirflowSkipException

from airflow_provider_datagen.exceptions import (
    DatagenError,
    ExperimentNotFoundError,
    TooManyFailedItemsError,
    UsageLimitExceededError,
)
from airflow_provider_datagen.experiment import DatagenExperiment, resolve_names
from airflow_provider_datagen.links import DatagenStatusLink
from airflow_provider_datagen.operators.datagen import STATUS_XCOM_KEY
from airflow_provider_datagen.triggers.datagen import DatagenStatusTrigger
from airflow_provider_datagen.triggers.status_watch import StatusWatch

if TYPE_CHECKING:
    from airflow.sdk import Context


class DatagenStatusSensor(BaseSensorOperator):
    """
    Wait until an experiment's folded status satisfies a condition; return that status as XCom.

    Works in ``poke``, ``reschedule`` and deferrable modes (the latter through
    :class:`~airflow_provider_datagen.triggers.datagen.DatagenStatusTrigger`).

    :param pipeline: pipeline name. Not needed when ``experiment`` is a ``DatagenExperiment``.
    :param experiment: experiment name. Or a
        :class:`~airflow_provider_datagen.experiment.DatagenExperiment`: then ``pipeline``,
        ``datagen_conn_id`` (and ``processor_version``) come from it, and an explicit different one is an error.
    :param condition: ``"all_done"`` (every item completed or filtered), ``"no_pending"``,
        ``"no_failures"``, or a callable ``f(status) -> bool`` (poke/reschedule modes only).
    :param source: optional source (list or path/URI); its never-started items count as pending.
    :param key_field: key field of ``source``.
    :param max_failed_items: fail as soon as more items than this are failed, naming some of them.
    :param max_cost_usd: fail as soon as the experiment's recorded cost (``status["usage"]["cost_usd"]``,
        every attempt's, failed ones included) is above this many USD: a watchdog on spend.
    :param max_tokens: fail as soon as its recorded input + output tokens are above this.
    :param allow_missing: wait while the experiment has no log (it reads as an empty experiment and the
        condition is not checked) instead of failing with
        :class:`~airflow_provider_datagen.exceptions.ExperimentNotFoundError`, e.g. to wait on an
        experiment another DAG has not started yet.
    :param deferrable: wait in the triggerer instead of occupying a worker slot.
    :param datagen_conn_id: connection of type ``datagen``.

    When the experiment stopped at its budget (``status["stopped_by_budget"]``: the budget the plan
    or map tasks recorded is reached and items are pending, which no task will run) and the
    condition does not hold, the sensor is skipped at its next check, logging the budget, the spend
    and the fix; downstream tasks follow their trigger rules (``all_success`` ones are skipped).
    """

    template_fields = ("pipeline", "experiment", "source")
    operator_extra_links = (DatagenStatusLink(),)

    def __init__(
        self,
        *,
        pipeline: str | None = None,
        experiment: str | DatagenExperiment,
        condition: Any = "all_done",
        source: Any = None,
        key_field: str = "id",
        max_failed_items: int | None = None,
        allow_missing: bool = False,
        max_cost_usd: float | None = None,
        max_tokens: int | None = None,
        deferrable: bool = False,
        datagen_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        pipeline, experiment, datagen_conn_id = resolve_names(self, experiment, pipeline, datagen_conn_id)
        watch = StatusWatch(
            pipeline=pipeline,
            experiment=experiment,
            condition=condition,
            source=source,
            key_field=key_field,
            max_failed_items=max_failed_items,
            allow_missing=allow_missing,
            max_cost_usd=max_cost_usd,
            max_tokens=max_tokens,
            datagen_conn_id=datagen_conn_id,
        ).checked(self, deferrable=deferrable)
        # Attributes, and the watch read back from them when needed (see watch): Airflow renders the
        # template fields into the attributes after this constructor ran.
        self.pipeline = watch.pipeline
        self.experiment = watch.experiment
        self.condition = watch.condition
        self.source = watch.source
        self.key_field = watch.key_field
        self.max_failed_items = watch.max_failed_items
        self.allow_missing = watch.allow_missing
        self.max_cost_usd = watch.max_cost_usd
        self.max_tokens = watch.max_tokens
        self.datagen_conn_id = watch.datagen_conn_id
        self.deferrable = bool(deferrable)

    @property
    def watch(self) -> StatusWatch:
        """What this sensor watches, its template fields as rendered; a trigger gets the same."""
        return StatusWatch.of(self)

    def _status(self) -> dict[str, Any]:
        return self._observe()[0]

    def _observe(self) -> tuple[dict[str, Any], bool]:
        return self.watch.read()

    def _holds(self, status: dict[str, Any]) -> bool:
        return self.watch.holds(status)

    def _check_failures(self, status: dict[str, Any]) -> None:
        watch = self.watch
        if watch.too_many_failed(status):
            ids = ", ".join(repr(i) for i in status.get("failed_item_ids", [])[:10])
            raise TooManyFailedItemsError(
                f"{status['failed_items']} items of {self.pipeline}/{self.experiment} are failed, more than "
                f"max_failed_items={self.max_failed_items} (e.g. {ids}). Their errors are in the Datagen UI's "
                "failure lens; fix the cause and clear the failed DatagenMapOperator task instances (or trigger "
                "a new run of the DAG) to rerun only them."
            )
        why = watch.usage_exceeded(status)
        if why is not None:
            raise UsageLimitExceededError(
                f"{self.pipeline}/{self.experiment}: {why}. The spend by model is in the Datagen UI; give the "
                "map tasks a budget_usd/budget_tokens to stop generating at a limit."
            )

    def poke(self, context: Context) -> PokeReturnValue:
        status, exists = self._observe()
        if not exists:
            self.log.info(
                "datagen %s/%s has no log yet; waiting for a run to create it", self.pipeline, self.experiment
            )
            return PokeReturnValue(is_done=False, xcom_value=status)
        self._check_failures(status)
        done = self._holds(status)
        if done:
            context["ti"].xcom_push(key=STATUS_XCOM_KEY, value=status)
        elif status.get("stopped_by_budget"):
            self._skip_at_budget(context, status, self.watch.budget_stop_message(int(status["pending"])))
        return PokeReturnValue(is_done=done, xcom_value=status)

    def _skip_at_budget(self, context: Context, status: dict[str, Any], message: str) -> None:
        """Push the status (it says ``stopped_by_budget``) and end this sensor skipped, logging why."""
        self.log.warning("%s", message)
        context["ti"].xcom_push(key=STATUS_XCOM_KEY, value=status)
        raise AirflowSkipException(message)

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        # Check once on the worker: a condition that already holds needs no trip to the triggerer.
        first = self.poke(context)
        if first.is_done:
            return first.xcom_value
        self.defer(
            trigger=DatagenStatusTrigger(poke_interval=float(self.poke_interval), **self.watch.to_kwargs()),
            method_name="execute_complete",
            timeout=timedelta(seconds=float(self.timeout)) if self.timeout is not None else None,
        )

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        if event.get("outcome") == "not_found":
            raise ExperimentNotFoundError(event.get("message", f"{self.pipeline}/{self.experiment} has no log"))
        status = event["status"]
        self._check_failures(status)
        if event.get("outcome") == "stopped_by_budget":
            self._skip_at_budget(context, status, str(event.get("message", "the experiment's budget is reached")))
        if event.get("outcome") != "done":
            raise DatagenError(f"datagen status trigger ended without its condition: {event.get('outcome')}")
        context["ti"].xcom_push(key=STATUS_XCOM_KEY, value=status)
        return status
