"""The connection of a model step: a ``pydanticai`` connection read through Airflow's connection API.

host = the API's base URL, password = the API key, extra ``{"model": "openai:gpt-5-mini"}``. Read on
the worker, when a step first runs: a DAG file that builds the step parses without reading it.
"""

from __future__ import annotations

from airflow_provider_datagen.exceptions import ConfigurationError

_OWNER = "llm_process"


def missing_connection(conn_id: str, model_id: str | None, cause: BaseException) -> ConfigurationError:
    """The error of a connection id that does not exist: every item would fail the same way (not retryable)."""
    model = model_id or "openai:gpt-5-mini"
    error = ConfigurationError(
        f"{_OWNER}: the connection {conn_id!r} (llm_conn_id) does not exist; add it, e.g. "
        f"`airflow connections add {conn_id} --conn-type pydanticai --conn-host <base url> "
        f'--conn-password <api key> --conn-extra \'{{"model": "{model}"}}\'`, '
        "or pass the llm_conn_id of an existing one"
    )
    error.__cause__ = cause
    return error


def read_connection(conn_id: str, model_id: str | None) -> tuple[str | None, str | None, str | None]:
    """``(base_url, api_key, model)`` of a ``pydanticai`` connection, through Airflow's connection API."""
    from airflow.sdk import BaseHook

    try:
        conn = BaseHook.get_connection(conn_id)
    except Exception as exc:  # AirflowNotFoundException; its module moved between Airflow releases
        if "NotFound" not in type(exc).__name__:
            raise
        raise missing_connection(conn_id, model_id, exc) from exc
    extra = conn.extra_dejson if isinstance(conn.extra_dejson, dict) else {}
    return conn.host or None, conn.password or None, extra.get("model")
