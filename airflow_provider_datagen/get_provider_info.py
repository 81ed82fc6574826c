"""Provider metadata, read by Airflow through the ``apache_airflow_provider`` entry point.

Airflow calls :func:`get_provider_info` in every component at start-up, so this module imports nothing
but the package version (and the standard library): no hook, operator or Lance import may happen here.

The connection form is declared here (``conn-fields`` and ``ui-field-behaviour``) rather than with the
hook's ``get_connection_form_widgets`` / ``get_ui_field_behaviour`` classmethods: Airflow 3.2 deprecated
those (they need wtforms, and importing every hook to draw a form is slow), and 3.3 reads the
declarative form from provider info without importing the hook.

The UI plugin is registered only through the ``airflow.plugins`` entry point in pyproject.toml; listing
it here as well would register it twice.
"""

from __future__ import annotations

import copy

from airflow_provider_datagen import __version__

_INTEGRATION = "Datagen"


def _modules(*modules: str) -> list[dict]:
    return [{"integration-name": _INTEGRATION, "python-modules": list(modules)}]


_DESCRIPTION = (
    "Resumable per-item fan-out data generation (model calls, API calls, expensive transforms) "
    "on an append-only Lance event log: clearing a failed task reruns only the items not done.\n"
)

_INTEGRATIONS = [
    {
        "integration-name": _INTEGRATION,
        "external-doc-url": "https://pypi.org/project/airflow-provider-datagen/",
        "tags": ["software"],
    }
]

# Stored as keys of Connection.extra; DatagenHook reads the same keys.
_CONN_FIELDS = {
    "storage_options": {
        "label": "Storage options",
        "description": (
            "JSON object passed to Lance as storage_options, e.g. "
            '{"aws_access_key_id": "...", "aws_secret_access_key": "...", '
            '"aws_endpoint": "http://127.0.0.1:9000", "aws_region": "us-east-1"}. '
            "Leave empty for a local root."
        ),
        "schema": {"type": ["object", "null"]},
    },
    "rate_limit_storage": {
        "label": "Rate limit storage",
        "description": (
            "Where shared rate limits are kept when workers run on many hosts, e.g. "
            "redis://redis-host:6379/0. Leave empty to keep them on each host (beside a local root)."
        ),
        "schema": {"type": ["string", "null"]},
    },
}

_UI_FIELD_BEHAVIOUR = {
    "hidden-fields": ["schema", "port", "login", "password"],
    "relabeling": {"host": "Root URI"},
    "placeholders": {
        "host": "/data/datagen or s3://bucket/prefix (empty: $AIRFLOW_HOME/datagen)",
        "extra": (
            '{"root": "s3://bucket/prefix", "storage_options": {...}, '
            '"rate_limit_storage": "redis://redis-host:6379/0"}'
        ),
    },
}

_CONNECTION_TYPES = [
    {
        "hook-class-name": "airflow_provider_datagen.hooks.datagen.DatagenHook",
        "hook-name": "Datagen",
        "connection-type": "datagen",
        "conn-fields": _CONN_FIELDS,
        "ui-field-behaviour": _UI_FIELD_BEHAVIOUR,
    }
]

# The [datagen] options the provider reads; Airflow shows them in `airflow config list` and
# its configuration page with these defaults.
_CONFIG = {
    "datagen": {
        "description": "Options of the datagen provider's UI plugin.",
        "options": {
            "ui_conn_id": {
                "description": (
                    "The datagen connection whose root the Datagen UI pages list experiments from. "
                    "Without that connection the pages use the embedded root $AIRFLOW_HOME/datagen."
                ),
                "version_added": "0.1.0",
                "type": "string",
                "example": "datagen_s3",
                "default": "datagen_default",
            },
        },
    },
}


def get_provider_info() -> dict:
    """Return the provider description in the shape of Airflow's ``provider_info.schema.json``."""
    info = {
        # Must equal the distribution name exactly: Airflow compares it with the installed package's
        # metadata and `airflow providers list` raises on a mismatch.
        "package-name": "airflow-provider-datagen",
        "name": "Datagen",
        "description": _DESCRIPTION,
        "versions": [__version__],
        "integrations": _INTEGRATIONS,
        "hooks": _modules("airflow_provider_datagen.hooks.datagen"),
        "operators": _modules("airflow_provider_datagen.operators.datagen", "airflow_provider_datagen.operators.batch"),
        "sensors": _modules("airflow_provider_datagen.sensors.datagen"),
        "triggers": _modules("airflow_provider_datagen.triggers.datagen", "airflow_provider_datagen.triggers.batch"),
        "connection-types": _CONNECTION_TYPES,
        "extra-links": ["airflow_provider_datagen.links.DatagenStatusLink"],
        "config": _CONFIG,
    }
    # a fresh copy per call, as the literal gave: whoever reads it may change it without changing the next
    return copy.deepcopy(info)
