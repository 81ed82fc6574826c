"""Provider metadata: schema-valid, named exactly like the distribution, pointing at real code."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
from pathlib import Path

import pytest

from airflow_provider_datagen.get_provider_info import get_provider_info

INFO = get_provider_info()


def _listed_modules() -> list[str]:
    return sorted(
        {
            module
            for section in ("hooks", "operators", "sensors", "triggers")
            for entry in INFO[section]
            for module in entry["python-modules"]
        }
    )


def _listed_classes() -> list[str]:
    return sorted([c["hook-class-name"] for c in INFO["connection-types"]] + list(INFO.get("extra-links", [])))


def test_matches_airflow_runtime_and_provider_yaml_schemas():
    import airflow
    import jsonschema

    schema_dir = Path(airflow.__file__).parent
    jsonschema.validate(INFO, json.loads((schema_dir / "provider_info.schema.json").read_text()))
    # The stricter development schema describes connection-types' conn-fields / ui-field-behaviour.
    yaml_schema = json.loads((schema_dir / "provider.yaml.schema.json").read_text())
    jsonschema.validate(INFO["connection-types"], yaml_schema["properties"]["connection-types"])


def test_package_name_is_the_distribution_name():
    # `airflow providers list` raises when these differ.
    assert INFO["package-name"] == "airflow-provider-datagen"


def test_plugin_is_not_registered_through_provider_info():
    # It is registered by the airflow.plugins entry point; both would load it twice.
    assert "plugins" not in INFO


@pytest.mark.parametrize("module", _listed_modules())
def test_listed_modules_import(module):
    assert importlib.util.find_spec(module) is not None, f"provider info lists {module}, which does not exist"
    importlib.import_module(module)


@pytest.mark.parametrize("dotted", _listed_classes())
def test_listed_classes_import(dotted):
    module, _, name = dotted.rpartition(".")
    assert importlib.util.find_spec(module) is not None, f"provider info lists {dotted}, whose module is missing"
    assert hasattr(importlib.import_module(module), name), f"{module} has no {name}"


def test_providers_manager_registers_hook_and_form_when_installed():
    # `make test` installs the package (uv pip install -e '.[dev]'): a missing entry point is a failure.
    dist = importlib.metadata.distribution("airflow-provider-datagen")
    assert any(ep.group == "apache_airflow_provider" for ep in dist.entry_points), (
        "installed without the apache_airflow_provider entry point; reinstall with uv pip install -e '.[dev]'"
    )

    from airflow.providers_manager import ProvidersManager
    from airflow.sdk.providers_manager_runtime import ProvidersManagerTaskRuntime

    manager = ProvidersManager()
    assert "airflow-provider-datagen" in manager.providers
    # Workers resolve a conn type to its hook through the task SDK's runtime manager.
    hook = ProvidersManagerTaskRuntime().hooks["datagen"]
    assert hook is not None
    assert hook.hook_class_name == "airflow_provider_datagen.hooks.datagen.DatagenHook"
    assert hook.connection_id_attribute_name == "datagen_conn_id"
    assert "extra__datagen__storage_options" in manager.connection_form_widgets
    assert manager.field_behaviours["datagen"]["relabeling"] == {"host": "Root URI"}


def test_the_ui_connection_option_is_declared_and_is_what_the_ui_reads(monkeypatch):
    from airflow.providers_manager import ProvidersManager

    from airflow_provider_datagen.plugins.data import conn_id

    option = INFO["config"]["datagen"]["options"]["ui_conn_id"]
    assert option["default"] == "datagen_default"
    # Airflow collects the option from provider info: `airflow config list` and the config page show it.
    declared = dict(ProvidersManager().provider_configs)["airflow-provider-datagen"]
    assert declared["datagen"]["options"]["ui_conn_id"]["default"] == "datagen_default"
    assert conn_id() == option["default"]
    monkeypatch.setenv("AIRFLOW__DATAGEN__UI_CONN_ID", "datagen_s3")
    assert conn_id() == "datagen_s3"
