"""What every datagen operator shares: the connection, names, status XCom, templated names."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from functools import cached_property
from typing import TYPE_CHECKING, Any

import jinja2.nativetypes
from airflow.sdk import BaseOperator

from airflow_provider_datagen._arguments import bad_argument, check_name_argument
from airflow_provider_datagen.core.chunk_spec import ChunkSpec
from airflow_provider_datagen.exceptions import ConfigurationError, DatagenError
from airflow_provider_datagen.experiment import DatagenExperiment, resolve_names
from airflow_provider_datagen.hooks.datagen import DatagenHook
from airflow_provider_datagen.links import DatagenStatusLink

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_datagen.core import CheckpointLog


logger = logging.getLogger(__name__)

STATUS_XCOM_KEY = "datagen_status"
REPORT_XCOM_KEY = "datagen_report"


def check_chunk_or_source(owner: object, chunk: Any, source: Any) -> dict[str, Any] | None:
    """A mapped task's ``chunk`` (a plan's descriptor dict) as a dict; one of ``chunk`` and ``source`` is needed."""
    if chunk is not None and not isinstance(chunk, Mapping):
        raise bad_argument(
            owner,
            "chunk",
            chunk,
            "is not a chunk descriptor dict",
            "map the operator with expand_kwargs(plan.output) of a DatagenPlanOperator",
        )
    if chunk is None and source is None:
        raise bad_argument(
            owner,
            "chunk",
            chunk,
            "and source=None leave nothing to run",
            "give either chunk (expand_kwargs(plan.output) from a DatagenPlanOperator) or source",
        )
    return dict(chunk) if chunk is not None else None


def folded_status(event_log: CheckpointLog) -> dict[str, Any]:
    """The experiment's ``datagen_status`` (what ``status_of(event_log)`` gives), as cheaply as the log allows.

    Counted from the state projection and the items changed since when there is one (see
    ``CheckpointLog.summary``); when it had to fold the whole log instead, that fold is stored as the
    projection, so the tasks after this one count from it: without that, each of a thousand mapped
    tasks would fold a log grown by the tasks before it.
    """
    status = event_log.summary()
    try:
        event_log.refresh_projection(min_new_events=0)
    except (DatagenError, OSError) as exc:
        # Only a saving for the tasks after this one: the task's own work is committed, and a later
        # task or maintenance stores the projection, so a store that fails here must not fail the task.
        logger.warning("did not store the state projection of %s: %s", event_log.uri, exc)
    return status


def _is_literal(value: str, env: Any) -> bool:
    """Whether rendering ``value`` in ``env`` can only return ``value`` itself (no Jinja markup).

    Jinja compiles every string it is given, about a third of a millisecond each: an inline source of a
    thousand prompts cost the plan task more than its own work. A string without any of ``env``'s
    delimiters is template data, which Jinja copies out unchanged except in three cases kept on the slow
    path: native rendering (``"123"`` would become an int), the normalisation of carriage returns, and
    the stripping of one trailing newline when ``keep_trailing_newline`` is off.
    """
    if isinstance(env, jinja2.nativetypes.NativeEnvironment) or "\r" in value:
        return False
    if value.endswith("\n") and not env.keep_trailing_newline:
        return False
    markers = (
        env.variable_start_string,
        env.block_start_string,
        env.comment_start_string,
        env.line_statement_prefix,
        env.line_comment_prefix,
    )
    return not any(m and m in value for m in markers)


class DatagenBaseOperator(BaseOperator):
    """Shared plumbing: the hook, the log, the status XCom and the extra link."""

    operator_extra_links = (DatagenStatusLink(),)
    ui_color = "#e8f4ea"

    def __init__(
        self,
        *,
        pipeline: str | None = None,
        experiment: str | DatagenExperiment,
        datagen_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        # experiment= may be the DatagenExperiment declaring the names: the attributes hold its strings
        pipeline, experiment, datagen_conn_id = resolve_names(self, experiment, pipeline, datagen_conn_id)
        self.pipeline = check_name_argument(self, "pipeline", pipeline)
        self.experiment = check_name_argument(self, "experiment", experiment)
        self.datagen_conn_id = datagen_conn_id

    @cached_property
    def hook(self) -> DatagenHook:
        return DatagenHook(datagen_conn_id=self.datagen_conn_id)

    def get_log(self) -> CheckpointLog:
        """The experiment's event log (names checked again: templates are rendered by now)."""
        check_name_argument(self, "pipeline", self.pipeline)
        check_name_argument(self, "experiment", self.experiment)
        return self.hook.get_log(self.pipeline, self.experiment)

    def render_template(
        self, content: Any, context: Context, jinja_env: Any = None, seen_oids: set[int] | None = None
    ) -> Any:
        """Render like Airflow does, but hand strings without Jinja markup back without compiling them.

        The result is the same as Airflow's (see :func:`_is_literal`); the difference is speed on large
        templated values such as an inline ``source`` list.
        """
        if isinstance(content, str) and not content.endswith(tuple(self.template_ext)):
            if jinja_env is None:
                jinja_env = self.get_template_env()
            if _is_literal(content, jinja_env):
                return content
        return super().render_template(content, context, jinja_env, seen_oids)

    def push_status(self, context: Context, status: Mapping[str, Any]) -> dict[str, Any]:
        payload = dict(status)
        context["ti"].xcom_push(key=STATUS_XCOM_KEY, value=payload)
        self.log.info(
            "datagen %s/%s: %s completed, %s filtered, %s running, %s never started, %s failed items, "
            "%s pending (log version %s)",
            payload.get("pipeline"),
            payload.get("experiment"),
            payload.get("completed"),
            payload.get("filtered"),
            payload.get("running"),
            payload.get("never_started"),
            payload.get("failed_items"),
            payload.get("pending"),
            payload.get("log_version"),
        )
        return payload


class DatagenChunkOperator(DatagenBaseOperator):
    """An operator mapped over the plan's chunks (``expand_kwargs(plan.output)``): the map and batch operators.

    Subclasses set ``chunk`` (the chunk's XCom dict, or None without a plan) in their ``__init__``.
    """

    chunk: dict[str, Any] | None

    @property
    def chunk_label(self) -> str:
        """What the UI shows for this map index: the chunk's key range."""
        try:
            spec = self.spec() if self.chunk else None
        except ConfigurationError:
            return ""  # execute() raises the error naming the bad field: the label must not hide it
        return "all items" if spec is None else spec.label

    def spec(self) -> ChunkSpec | None:
        """This task's chunk decoded (None without a plan); refuses one this provider cannot read."""
        return None if self.chunk is None else ChunkSpec.from_xcom(self.chunk)
