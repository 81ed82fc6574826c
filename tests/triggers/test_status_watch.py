"""StatusWatch: the one declaration of what DatagenStatusSensor and DatagenStatusTrigger watch."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest
from airflow.sdk import PokeReturnValue
from airflow.sdk.exceptions import TaskDeferred

from airflow_provider_datagen.exceptions import ConfigurationError
from airflow_provider_datagen.sensors import datagen as sensors_module
from airflow_provider_datagen.sensors.datagen import DatagenStatusSensor
from airflow_provider_datagen.triggers import datagen as triggers_module
from airflow_provider_datagen.triggers.datagen import DatagenStatusTrigger
from airflow_provider_datagen.triggers.status_watch import StatusWatch

TRIGGER_PATH = "airflow_provider_datagen.triggers.datagen.DatagenStatusTrigger"

#: A trigger's kwargs as serialize() wrote them before StatusWatch existed, as a metadata DB holds them.
SERIALIZED_BEFORE: dict[str, Any] = {
    "pipeline": "sens",
    "experiment": "e",
    "condition": "no_failures",
    "source": [{"id": "1"}, {"id": "2"}],
    "key_field": "id",
    "max_failed_items": 2,
    "poke_interval": 5.0,
    "datagen_conn_id": "other_conn",
    "allow_missing": True,
    "max_cost_usd": 1.5,
    "max_tokens": 1000,
}


def _deferred_trigger(sensor: DatagenStatusSensor, monkeypatch: pytest.MonkeyPatch) -> DatagenStatusTrigger:
    """The trigger ``sensor`` defers to when its first check finds the condition unmet."""
    monkeypatch.setattr(sensor, "poke", lambda context: PokeReturnValue(is_done=False))
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute({})
    trigger = deferred.value.trigger
    assert isinstance(trigger, DatagenStatusTrigger)
    return trigger


def test_a_trigger_serialized_before_the_watch_still_deserializes_to_the_same_kwargs() -> None:
    trigger = DatagenStatusTrigger(**SERIALIZED_BEFORE)
    assert trigger.serialize() == (TRIGGER_PATH, SERIALIZED_BEFORE)
    assert trigger.poke_interval == 5.0
    assert trigger.watch == StatusWatch(
        pipeline="sens",
        experiment="e",
        condition="no_failures",
        source=[{"id": "1"}, {"id": "2"}],
        key_field="id",
        max_failed_items=2,
        allow_missing=True,
        max_cost_usd=1.5,
        max_tokens=1000,
        datagen_conn_id="other_conn",
    )


def test_the_trigger_serializes_every_watch_field_and_its_poke_interval() -> None:
    path, kwargs = DatagenStatusTrigger(pipeline="sens", experiment="e").serialize()
    assert path == TRIGGER_PATH
    assert list(kwargs) == [*(f.name for f in dataclasses.fields(StatusWatch)), "poke_interval"]
    assert kwargs == {**StatusWatch(pipeline="sens", experiment="e").to_kwargs(), "poke_interval": 30.0}
    assert StatusWatch.from_kwargs({k: v for k, v in kwargs.items() if k != "poke_interval"}).to_kwargs() == {
        k: v for k, v in kwargs.items() if k != "poke_interval"
    }


def test_the_sensor_takes_every_watch_field_with_the_watch_default() -> None:
    params = inspect.signature(DatagenStatusSensor.__init__).parameters
    # what a DatagenExperiment given as experiment= supplies: None on the sensor, resolved into the watch
    from_the_declaration = {"pipeline", "datagen_conn_id"}
    for field in dataclasses.fields(StatusWatch):
        assert field.name in params, field.name
        assert params[field.name].kind is inspect.Parameter.KEYWORD_ONLY
        default = inspect.Parameter.empty if field.default is dataclasses.MISSING else field.default
        if field.name in from_the_declaration:
            default = None
        assert params[field.name].default == default, field.name


def test_the_sensor_defers_with_its_watch_as_rendered(monkeypatch: pytest.MonkeyPatch) -> None:
    sensor = DatagenStatusSensor(
        task_id="s",
        pipeline="p{{ params.n }}",
        experiment="e",
        condition="no_pending",
        source="/data/{{ params.n }}.jsonl",
        max_failed_items=3,
        max_cost_usd=2.0,
        deferrable=True,
        poke_interval=0.5,
    )
    sensor.render_template_fields(context={"params": {"n": "7"}})
    assert sensor.watch.pipeline == "p7" and sensor.watch.source == "/data/7.jsonl"
    trigger = _deferred_trigger(sensor, monkeypatch)
    assert trigger.watch == sensor.watch
    assert trigger.serialize() == (TRIGGER_PATH, {**sensor.watch.to_kwargs(), "poke_interval": 0.5})


def test_a_field_added_to_the_watch_reaches_the_trigger_round_trip(monkeypatch: pytest.MonkeyPatch) -> None:
    # what adding `note: str = ""` to StatusWatch would be, without editing it
    noted = dataclasses.make_dataclass(
        "NotedWatch", [("note", str, dataclasses.field(default=""))], bases=(StatusWatch,), frozen=True
    )
    monkeypatch.setattr(triggers_module, "StatusWatch", noted)
    monkeypatch.setattr(sensors_module, "StatusWatch", noted)
    trigger = DatagenStatusTrigger(pipeline="sens", experiment="e", note="kept", poke_interval=1.0)
    path, kwargs = trigger.serialize()
    assert kwargs["note"] == "kept"
    assert DatagenStatusTrigger(**kwargs).serialize() == (path, kwargs)
    # a serialized trigger without the new key still loads, with the field's default
    old = DatagenStatusTrigger(**SERIALIZED_BEFORE)
    assert old.serialize()[1] == {**SERIALIZED_BEFORE, "note": ""}
    # the sensor: its attribute of that name (what its new argument would set) is what it defers with
    sensor = DatagenStatusSensor(task_id="s", pipeline="sens", experiment="e", deferrable=True)
    sensor.note = "from the sensor"
    assert _deferred_trigger(sensor, monkeypatch).serialize()[1]["note"] == "from the sensor"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"pipeline": "a/b"}, r"pipeline='a/b' is not a valid name; "),
        ({"condition": "sometimes"}, r"condition='sometimes' is unknown; use one of"),
        ({"max_failed_items": -1}, r"max_failed_items=-1 is not a non-negative int; "),
        ({"allow_missing": "yes"}, r"allow_missing='yes' is not a bool; "),
        ({"max_cost_usd": float("nan")}, r"max_cost_usd=nan is not a non-negative number; "),
        ({"max_tokens": True}, r"max_tokens=True is not a non-negative int; "),
    ],
)
def test_the_sensor_and_the_trigger_refuse_a_bad_argument_alike(kwargs: dict[str, Any], message: str) -> None:
    given = {"pipeline": "sens", "experiment": "e", **kwargs}
    with pytest.raises(ConfigurationError, match=r"^DatagenStatusSensor: " + message):
        DatagenStatusSensor(task_id="w", **given)
    with pytest.raises(ConfigurationError, match=r"^DatagenStatusTrigger: " + message):
        DatagenStatusTrigger(**given)


def test_constructing_a_watch_checks_nothing_and_checked_names_its_owner() -> None:
    # a serialized trigger or rendered template fields are read back as they are
    watch = StatusWatch(pipeline="sens", experiment="e", condition=lambda s: True)
    assert watch.checked("DatagenStatusSensor") is watch
    with pytest.raises(ConfigurationError, match=r"^Someone: condition=<function .* cannot run in the triggerer"):
        watch.checked("Someone", deferrable=True)
