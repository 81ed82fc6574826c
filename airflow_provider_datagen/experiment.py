"""DatagenExperiment: the names a DAG's datagen tasks share, declared once.

The plan, map (or batch), sensor and export tasks of one experiment must agree on the pipeline, the
experiment, the processor version and the connection; an operator given ``experiment=`` as a
:class:`DatagenExperiment` takes them from it. Light (no Airflow, no pyarrow): DAG files import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from airflow_provider_datagen._arguments import bad_argument, check_name_argument, check_non_empty_str

#: ``DatagenHook.default_conn_name`` (tests/test_experiment.py checks they are equal; the hook imports Airflow).
DEFAULT_CONN_ID: Final = "datagen_default"


@dataclass(frozen=True)
class DatagenExperiment:
    """
    The shared names of one experiment's tasks, given to every operator and the sensor as ``experiment=``.

    :param pipeline: pipeline name.
    :param experiment: experiment name.
    :param processor_version: version of the processing code (the plan's and the map's).
    :param datagen_conn_id: connection of type ``datagen``.
    """

    pipeline: str
    experiment: str
    processor_version: str = "v1"
    datagen_conn_id: str = DEFAULT_CONN_ID

    def __post_init__(self) -> None:
        check_name_argument(self, "pipeline", self.pipeline)
        check_name_argument(self, "experiment", self.experiment)
        check_non_empty_str(
            self, "processor_version", self.processor_version, "give the version of the processing code, e.g. 'v1'"
        )
        check_non_empty_str(self, "datagen_conn_id", self.datagen_conn_id, "name a connection of type datagen")


def _conflict(owner: object, param: str, given: Any, declared: Any) -> Exception:
    return bad_argument(
        owner,
        param,
        given,
        f"differs from the experiment's {param}={declared!r} (experiment= is a DatagenExperiment)",
        f"drop {param}= (it comes from the DatagenExperiment) or change the DatagenExperiment",
    )


def resolve_names(owner: object, experiment: Any, pipeline: Any, datagen_conn_id: Any) -> tuple[Any, Any, str]:
    """(pipeline, experiment name, connection id) of an operator given ``experiment`` as a name or a declaration.

    With a :class:`DatagenExperiment`, an explicit ``pipeline`` or ``datagen_conn_id`` must equal its
    own; with a name, ``pipeline`` is needed and the connection defaults to ``datagen_default``.
    """
    if isinstance(experiment, DatagenExperiment):
        if pipeline is not None and pipeline != experiment.pipeline:
            raise _conflict(owner, "pipeline", pipeline, experiment.pipeline)
        if datagen_conn_id is not None and datagen_conn_id != experiment.datagen_conn_id:
            raise _conflict(owner, "datagen_conn_id", datagen_conn_id, experiment.datagen_conn_id)
        return experiment.pipeline, experiment.experiment, experiment.datagen_conn_id
    if pipeline is None:
        raise bad_argument(
            owner,
            "pipeline",
            pipeline,
            "is missing",
            "pass pipeline= (the pipeline name), or experiment=DatagenExperiment(pipeline, experiment)",
        )
    return pipeline, experiment, DEFAULT_CONN_ID if datagen_conn_id is None else datagen_conn_id


def resolve_version(owner: object, experiment: Any, processor_version: Any, default: Any) -> Any:
    """The processor version of an operator: the declaration's, an equal explicit one, or ``default``."""
    if not isinstance(experiment, DatagenExperiment):
        return default if processor_version is None else processor_version
    if processor_version is not None and processor_version != experiment.processor_version:
        raise _conflict(owner, "processor_version", processor_version, experiment.processor_version)
    return experiment.processor_version
