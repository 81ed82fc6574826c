"""DatagenTaskGroup: plan -> generate (mapped map or batch tasks) -> all_done sensor -> export, in one line.

The four tasks the README's quick start wires by hand, with the trigger rules a run needs: the sensor
runs when nothing was pending (``generate`` is then skipped: ``none_failed``), and the export follows
the sensor (``all_success``), so a budget stop, which skips the sensor, skips the export and ends the
run at once. Every operator's keyword arguments stay reachable through ``plan_kwargs``,
``map_kwargs``, ``sensor_kwargs`` and ``export_kwargs`` (they override the group's defaults).
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import TaskGroup

from airflow_provider_datagen._arguments import bad_argument
from airflow_provider_datagen.experiment import DatagenExperiment
from airflow_provider_datagen.operators.batch import DatagenBatchOperator
from airflow_provider_datagen.operators.export import DatagenExportOperator
from airflow_provider_datagen.operators.map import DatagenMapOperator
from airflow_provider_datagen.operators.plan import DatagenPlanOperator
from airflow_provider_datagen.sensors.datagen import DatagenStatusSensor

_OPERATOR_KWARGS = ("plan_kwargs", "map_kwargs", "sensor_kwargs", "export_kwargs")


def _kwargs(owner: object, name: str, value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise bad_argument(owner, name, value, "is not a dict of keyword arguments", f"pass {name}={{'name': value}}")
    return dict(value)


class DatagenTaskGroup(TaskGroup):
    """
    One experiment's tasks: ``plan``, ``generate`` (mapped over the plan), ``all_done``, ``export``.

    The tasks are the group's attributes (``group.plan``, ``group.generate``, ``group.all_done``,
    ``group.export``) and their ids are prefixed by ``group_id`` as in any task group. Set
    dependencies on the group itself (``upstream >> group >> downstream``).

    :param group_id: the task group's id.
    :param experiment: the :class:`~airflow_provider_datagen.experiment.DatagenExperiment` every task takes.
    :param source: the items (a list of dicts, or a ``.jsonl``, ``.parquet`` or ``.lance`` path or URI),
        for the plan and the sensor (its never-started items count as pending).
    :param process: ``package.module:function`` (or a step) each item runs through.
    :param destination: absolute path or URI of the export.
    :param key_field: the key field of ``source``.
    :param batch: generate with :class:`~airflow_provider_datagen.operators.batch.DatagenBatchOperator`
        (a provider's batch API) instead of
        :class:`~airflow_provider_datagen.operators.map.DatagenMapOperator`.
    :param plan_kwargs: more keyword arguments of the plan operator (``chunk_size``, ``budget_usd``...).
    :param map_kwargs: more keyword arguments of the map (or batch) operator's ``partial``.
    :param sensor_kwargs: more keyword arguments of the sensor (``poke_interval``, ``deferrable``...).
    :param export_kwargs: more keyword arguments of the export operator (``format``, ``include_input``...).
    :param kwargs: the task group's own (``tooltip``, ``default_args``, ``prefix_group_id``...).
    """

    def __init__(
        self,
        group_id: str,
        *,
        experiment: DatagenExperiment,
        source: Any,
        process: Any,
        destination: str,
        key_field: str = "id",
        batch: bool = False,
        plan_kwargs: dict[str, Any] | None = None,
        map_kwargs: dict[str, Any] | None = None,
        sensor_kwargs: dict[str, Any] | None = None,
        export_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if not isinstance(experiment, DatagenExperiment):
            raise bad_argument(
                type(self),
                "experiment",
                experiment,
                f"is a {type(experiment).__name__}, not a DatagenExperiment",
                "pass experiment=DatagenExperiment(pipeline, experiment, processor_version=..., datagen_conn_id=...)",
            )
        given = dict(zip(_OPERATOR_KWARGS, (plan_kwargs, map_kwargs, sensor_kwargs, export_kwargs), strict=True))
        extra = {name: _kwargs(type(self), name, value) for name, value in given.items()}
        super().__init__(group_id=group_id, **kwargs)
        with self:
            self.plan = DatagenPlanOperator(
                **{"task_id": "plan", "experiment": experiment, "source": source, "key_field": key_field}
                | extra["plan_kwargs"]
            )
            generator = DatagenBatchOperator if batch else DatagenMapOperator
            self.generate = generator.partial(
                **{"task_id": "generate", "experiment": experiment, "process": process} | extra["map_kwargs"]
            ).expand_kwargs(self.plan.output)
            self.all_done = DatagenStatusSensor(
                **{
                    "task_id": "all_done",
                    "experiment": experiment,
                    "condition": "all_done",
                    "source": source,
                    "key_field": key_field,
                    "deferrable": True,
                    "poke_interval": 30,
                    # also runs when nothing was pending: generate is then skipped, not failed
                    "trigger_rule": "none_failed",
                }
                | extra["sensor_kwargs"]
            )
            self.export = DatagenExportOperator(
                **{"task_id": "export", "experiment": experiment, "destination": destination} | extra["export_kwargs"]
            )
            self.plan >> self.generate >> self.all_done >> self.export
