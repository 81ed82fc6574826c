"""The "Datagen status" operator extra link: from a task in the Airflow UI to its experiment page.

In Airflow 3 a link is computed on the worker when the task finishes and stored as an XCom; the UI
only reads that XCom. So :meth:`DatagenStatusLink.get_link` must not need the API server: it builds
the URL from ``[api] base_url`` (absolute when set) and the operator's ``pipeline``/``experiment``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import quote, urljoin

from airflow.sdk import BaseOperatorLink

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator
    from airflow.sdk.types import TaskInstanceKey

#: Where the plugin mounts its FastAPI app: the one definition the plugin, its pages and this link use.
PLUGIN_URL_PREFIX = "/datagen"


def experiment_path(pipeline: str, experiment: str) -> str:
    """The plugin-relative path of an experiment page, each name percent-quoted as one segment."""
    return f"experiments/{quote(pipeline, safe='')}/{quote(experiment, safe='')}"


def ui_url(path: str) -> str:
    """``path`` (relative to the plugin prefix) under ``[api] base_url``; a root-relative URL if unset."""
    # Deferred: the configuration is read when a link is built, not when operators import this module.
    try:
        from airflow.sdk.configuration import conf
    except ImportError:  # pragma: no cover - every Airflow 3.3 install has the task SDK
        base = "/"
    else:
        base = conf.get("api", "base_url", fallback="/") or "/"
    return urljoin(base.rstrip("/") + "/", PLUGIN_URL_PREFIX.strip("/") + "/" + path.lstrip("/"))


class DatagenStatusLink(BaseOperatorLink):
    """
    Link a datagen task to the status page of the experiment it reads or writes.

    Datagen operators set ``operator_extra_links = (DatagenStatusLink(),)`` and carry ``pipeline`` and
    ``experiment`` attributes; the link points at ``/datagen/experiments/<pipeline>/<experiment>``
    under the API server's ``[api] base_url``. An operator without those attributes gets no link
    (an empty string, which the UI shows as disabled) rather than a failing task.
    """

    name = "Datagen status"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        """
        Return the experiment page URL of ``operator``.

        :param operator: the datagen operator; its ``pipeline`` and ``experiment`` attributes are read
            after templating.
        :param ti_key: the task instance the link is computed for (unused: the page is per experiment).
        """
        pipeline = getattr(operator, "pipeline", None)
        experiment = getattr(operator, "experiment", None)
        if not isinstance(pipeline, str) or not isinstance(experiment, str) or not pipeline or not experiment:
            return ""
        return ui_url(experiment_path(pipeline, experiment))
