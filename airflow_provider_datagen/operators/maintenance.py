"""DatagenMaintenanceOperator: compact the log, refresh its indices and fold cache, drop old versions."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_provider_datagen.hooks.datagen import DatagenHook
from airflow_provider_datagen.operators.base import DatagenBaseOperator, folded_status

if TYPE_CHECKING:
    from airflow.sdk import Context


class DatagenMaintenanceOperator(DatagenBaseOperator):
    """
    Compact the log, refresh its scalar indices and drop old versions; safe beside running writers.

    At most one maintenance runs per experiment at a time: the task is limited to one active
    instance, and the log's own maintenance lease makes a concurrent one a no-op.

    :param pipeline: pipeline name.
    :param experiment: experiment name.
    :param datagen_conn_id: connection of type ``datagen``.
    """

    template_fields = ("pipeline", "experiment")

    def __init__(
        self,
        *,
        pipeline: str,
        experiment: str,
        datagen_conn_id: str = DatagenHook.default_conn_name,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("max_active_tis_per_dag", 1)
        super().__init__(pipeline=pipeline, experiment=experiment, datagen_conn_id=datagen_conn_id, **kwargs)

    def execute(self, context: Context) -> dict[str, Any]:
        event_log = self.get_log()
        result = event_log.maintain()
        self.log.info("maintenance of %s: %s", event_log.uri, result)
        self.push_status(context, folded_status(event_log))
        return result
