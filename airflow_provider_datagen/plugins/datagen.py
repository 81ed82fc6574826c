"""The datagen Airflow plugin: status pages in the Airflow UI.

Registered only through the ``airflow.plugins`` entry point (pyproject.toml). It contributes:

* a FastAPI app mounted by the API server at ``/datagen`` (``links.PLUGIN_URL_PREFIX``; the app is
  ``plugins/app.py``), every route behind Airflow's own auth;
* a top-level nav entry "Datagen" (the experiments index in an iframe);
* a listener that fails, as it starts, a run whose datagen task asks for more pool slots than its
  pool has (``plugins/pools.py``): Airflow would leave it waiting forever;
* a "Datagen" tab on every task instance (``/datagen/ti/<dag>/<run>/<task>/<map index>`` in an
  iframe): the items that map index wrote and what each try did to them.

Every Airflow component loads plugins (workers do, for macros and listeners), and building the app
imports FastAPI, the API server's security module and Lance: about 1.5 s that a task process must not
pay. So ``fastapi_apps`` is a property: only the API server, which reads it, builds the app.

The "Datagen status" operator extra link (``airflow_provider_datagen.links``) is declared by the
datagen operators themselves; Airflow 3 stores a link's URL as an XCom when the task runs and
rebuilds the button from the serialized DAG, so no plugin registration is needed for it, and a
global link would show on tasks that have no experiment.
"""

from __future__ import annotations

import threading
from typing import Any
from urllib.parse import quote

from airflow.sdk.plugins_manager import AirflowPlugin

from airflow_provider_datagen.links import PLUGIN_URL_PREFIX
from airflow_provider_datagen.plugins.pools import PoolSlotsCheck

# Hrefs are relative (no leading slash): the Airflow UI page sets <base href> to the API server's
# base path, so the iframe resolves them under a reverse-proxy sub-path too.
_NAV_HREF = PLUGIN_URL_PREFIX.strip("/") + "/"
_TI_HREF = _NAV_HREF + "ti/{DAG_ID}/{RUN_ID}/{TASK_ID}/{MAP_INDEX}"


def _icon(color: str) -> str:
    # A data: URI so the nav icon needs no route of its own (and no extra authenticated request).
    svg = (
        "<svg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 24 24' fill='none' "
        f"stroke='{color}' stroke-width='2' stroke-linecap='round'>"
        "<ellipse cx='12' cy='5' rx='8' ry='3'/><path d='M4 5v6c0 1.7 3.6 3 8 3s8-1.3 8-3V5'/>"
        "<path d='M4 11v6c0 1.7 3.6 3 8 3s8-1.3 8-3v-6'/></svg>"
    )
    return "data:image/svg+xml;charset=utf-8," + quote(svg, safe="")


_app_lock = threading.Lock()
_app: Any = None


def get_app() -> Any:
    """The plugin's FastAPI app, built on first use (imports FastAPI, Airflow's API security, Lance)."""
    global _app
    with _app_lock:
        if _app is None:
            # Deferred: every Airflow component loads this plugin module; only the API server builds the app.
            from airflow_provider_datagen.plugins.app import create_app

            _app = create_app()
        return _app


class DatagenPlugin(AirflowPlugin):
    """
    Inspect datagen experiments in the Airflow UI: a nav view, a task-instance tab and JSON routes.

    The pages read the root of the connection named by ``[datagen] ui_conn_id`` (default
    ``datagen_default``; without that connection, ``$AIRFLOW_HOME/datagen``).
    """

    name = "datagen"
    external_views = [
        {
            "name": "Datagen",
            "href": _NAV_HREF,
            "destination": "nav",
            "url_route": "datagen",
            "nav_top_level": True,
            "icon": _icon("#3b4a5a"),
            "icon_dark_mode": _icon("#d8dee6"),
        },
        {
            "name": "Datagen",
            "href": _TI_HREF,
            "destination": "task_instance",
            "url_route": "datagen-ti",
            "icon": _icon("#3b4a5a"),
            "icon_dark_mode": _icon("#d8dee6"),
        },
    ]
    operator_extra_links: list[Any] = []
    global_operator_extra_links: list[Any] = []
    # In the scheduler: a run whose datagen task asks for more pool slots than its pool has is failed
    # when it starts, with the reason as its note, instead of waiting forever (plugins/pools.py).
    listeners = [PoolSlotsCheck()]

    @property  # type: ignore[override]
    def fastapi_apps(self) -> list[dict[str, Any]]:
        return [{"app": get_app(), "url_prefix": PLUGIN_URL_PREFIX, "name": "Datagen"}]
