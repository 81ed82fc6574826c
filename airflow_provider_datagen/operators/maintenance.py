"""DatagenMaintenanceOperator: compact the log, refresh its indices and fold cache, drop old versions; and,
with ``responses_older_than``, the root's response store."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

from airflow_provider_datagen.exceptions import bad_argument
from airflow_provider_datagen.operators.base import DatagenBaseOperator, folded_status

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_datagen.experiment import DatagenExperiment


class DatagenMaintenanceOperator(DatagenBaseOperator):
    """
    Compact the log, refresh its scalar indices and drop old versions; safe beside running writers.

    At most one maintenance runs per experiment at a time: the task is limited to one active
    instance, and the log's own maintenance lease makes a concurrent one a no-op.

    :param pipeline: pipeline name. Not needed when ``experiment`` is a ``DatagenExperiment``.
    :param experiment: experiment name, or a
        :class:`~airflow_provider_datagen.experiment.DatagenExperiment` (then ``pipeline`` and
        ``datagen_conn_id`` come from it).
    :param datagen_conn_id: connection of type ``datagen`` (default ``datagen_default``).
    :param responses_older_than: also maintain the root's response store (``<root>/datagen_responses``,
        shared by every experiment): drop the entries made longer ago than this ``timedelta`` (their
        requests are then paid again) and compact it. None (the default): the store is not touched.
    """

    template_fields = ("pipeline", "experiment")

    def __init__(
        self,
        *,
        pipeline: str | None = None,
        experiment: str | DatagenExperiment,
        datagen_conn_id: str | None = None,
        responses_older_than: dt.timedelta | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("max_active_tis_per_dag", 1)
        super().__init__(pipeline=pipeline, experiment=experiment, datagen_conn_id=datagen_conn_id, **kwargs)
        if responses_older_than is not None and (
            not isinstance(responses_older_than, dt.timedelta) or responses_older_than.total_seconds() < 0
        ):
            raise bad_argument(
                self,
                "responses_older_than",
                responses_older_than,
                "is not a timedelta >= 0",
                "give e.g. datetime.timedelta(days=90), or None",
            )
        self.responses_older_than = responses_older_than

    def execute(self, context: Context) -> dict[str, Any]:
        event_log = self.get_log()
        result = event_log.maintain()
        self.log.info("maintenance of %s: %s", event_log.uri, result)
        if self.responses_older_than is not None:
            store = self.hook.get_response_store()
            responses = store.maintain(older_than=self.responses_older_than)
            self.log.info("maintenance of the response store %s: %s", store.uri, responses)
            result = {**result, "responses": responses}
        self.push_status(context, folded_status(event_log))
        return result
