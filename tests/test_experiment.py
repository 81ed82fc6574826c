"""DatagenExperiment: every operator and the sensor take it as experiment= (names from it, the string form
unchanged), a conflicting explicit value is an error naming both, and it imports without Lance or pyarrow."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from airflow_provider_datagen.exceptions import ConfigurationError
from airflow_provider_datagen.experiment import DEFAULT_CONN_ID, DatagenExperiment
from airflow_provider_datagen.hooks.datagen import DatagenHook
from airflow_provider_datagen.operators.datagen import (
    DatagenBatchOperator,
    DatagenExportOperator,
    DatagenMaintenanceOperator,
    DatagenMapOperator,
    DatagenPlanOperator,
)
from airflow_provider_datagen.sensors.datagen import DatagenStatusSensor

EXP = DatagenExperiment("qa", "e1", processor_version="v7", datagen_conn_id="my_datagen")


def _all(**kw: object) -> list[object]:
    return [
        DatagenPlanOperator(task_id="plan", source=[{"id": "a"}], **kw),  # type: ignore[arg-type]
        DatagenMapOperator(task_id="map", process="m:f", source=[{"id": "a"}], **kw),  # type: ignore[arg-type]
        DatagenBatchOperator(task_id="batch", process="m:f", source=[{"id": "a"}], **kw),  # type: ignore[arg-type]
        DatagenStatusSensor(task_id="sensor", **kw),  # type: ignore[arg-type]
        DatagenExportOperator(task_id="export", destination="/tmp/x", **kw),  # type: ignore[arg-type]
    ]


def test_every_operator_and_the_sensor_take_the_declaration() -> None:
    for op in _all(experiment=EXP):
        assert (op.pipeline, op.experiment, op.datagen_conn_id) == ("qa", "e1", "my_datagen"), op  # type: ignore[attr-defined]
    plan, map_, batch, *_ = _all(experiment=EXP)
    assert plan.processor_version == map_.processor_version == batch.processor_version == "v7"  # type: ignore[attr-defined]
    # an explicit equal value is fine
    assert (
        DatagenPlanOperator(task_id="p", experiment=EXP, pipeline="qa", processor_version="v7", source=[]).pipeline
        == "qa"
    )


def test_the_maintenance_operator_takes_the_declaration_too() -> None:
    op = DatagenMaintenanceOperator(task_id="maintain", experiment=EXP)
    assert (op.pipeline, op.experiment, op.datagen_conn_id) == ("qa", "e1", "my_datagen")
    named = DatagenMaintenanceOperator(task_id="maintain2", pipeline="qa", experiment="e1")
    assert (named.pipeline, named.experiment, named.datagen_conn_id) == ("qa", "e1", DEFAULT_CONN_ID)
    with pytest.raises(ConfigurationError, match=r"differs from the experiment's pipeline='qa'"):
        DatagenMaintenanceOperator(task_id="maintain3", experiment=EXP, pipeline="other")


def test_the_string_form_is_unchanged() -> None:
    plan, map_, _, sensor, export = _all(pipeline="qa", experiment="e1")
    assert (plan.pipeline, plan.experiment, plan.datagen_conn_id, plan.processor_version) == (  # type: ignore[attr-defined]
        "qa",
        "e1",
        "datagen_default",
        "v1",
    )
    assert map_.processor_version is None  # type: ignore[attr-defined]  # the chunk's (the plan's)
    assert sensor.datagen_conn_id == export.datagen_conn_id == DEFAULT_CONN_ID == DatagenHook.default_conn_name  # type: ignore[attr-defined]
    missing = r"pipeline=None is missing; pass pipeline= \(the pipeline name\), or experiment=DatagenExperiment"
    with pytest.raises(ConfigurationError, match=missing):
        DatagenExportOperator(task_id="x", experiment="e1", destination="/tmp/x")


@pytest.mark.parametrize(
    ("param", "value"), [("pipeline", "other"), ("datagen_conn_id", "other_conn"), ("processor_version", "v8")]
)
def test_a_conflicting_explicit_value_is_refused(param: str, value: str) -> None:
    declared = getattr(EXP, param)
    with pytest.raises(
        ConfigurationError, match=rf"{param}='{value}' differs from the experiment's {param}='{declared}'"
    ):
        DatagenPlanOperator(task_id="p", experiment=EXP, source=[], **{param: value})  # type: ignore[arg-type]


def test_the_declaration_checks_its_names() -> None:
    with pytest.raises(ConfigurationError, match="experiment='a/b' is not a valid name"):
        DatagenExperiment("qa", "a/b")
    with pytest.raises(ConfigurationError, match="processor_version='' is not a non-empty string"):
        DatagenExperiment("qa", "e", processor_version="")
    with pytest.raises(AttributeError):
        EXP.experiment = "e2"  # type: ignore[misc]


def test_the_declaration_imports_without_lance_or_pyarrow() -> None:
    code = (
        "import json, sys; from airflow_provider_datagen.experiment import DatagenExperiment; "
        "DatagenExperiment('qa', 'e1'); "
        "print(json.dumps(sorted(m for m in ('lance', 'pyarrow', 'numpy', 'airflow') if m in sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
