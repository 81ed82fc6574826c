"""Operators: plan pending work, run it resumably per item in mapped chunks, export, maintain.

Each operator is a thin adapter: ``__init__`` stores and checks cheap keyword arguments, the hook is a
``cached_property``, and ``execute`` calls one function of :mod:`airflow_provider_datagen.core`.
"""

from __future__ import annotations

import importlib
import math
import os
import re
import time
from collections.abc import Mapping
from functools import cached_property
from typing import TYPE_CHECKING, Any

import jinja2.nativetypes
from airflow.sdk import Asset, BaseOperator
from airflow.sdk.exceptions import AirflowTaskTimeout

from airflow_provider_datagen._arguments import (
    bad_argument,
    check_absolute_path,
    check_name_argument,
    check_non_empty_str,
    check_positive_int,
    is_template,
)
from airflow_provider_datagen.exceptions import ConfigurationError, ItemsFailedError
from airflow_provider_datagen.hooks.datagen import DatagenHook
from airflow_provider_datagen.links import DatagenStatusLink

if TYPE_CHECKING:
    import logging

    from airflow.sdk import Context
    from airflow.sdk.definitions.mappedoperator import OperatorPartial

    from airflow_provider_datagen.core import CheckpointLog

STATUS_XCOM_KEY = "datagen_status"
REPORT_XCOM_KEY = "datagen_report"
_PROCESS_PATH_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
_FAILED_SHOWN = 20


def _bad_process(process: Any) -> Exception:
    return bad_argument(
        "DatagenMapOperator",
        "process",
        process,
        "is not a callable, a Step pipeline or a 'package.module:function' path",
        "pass the function or pipeline itself, or its dotted path",
    )


def resolve_process(process: Any) -> Any:
    """A callable or Step from ``"package.module:function"``, a callable or a step pipeline."""
    # Deferred, like every core import here: core imports Lance, which DAG parsing must not pay for.
    from airflow_provider_datagen.core.steps import Step

    if isinstance(process, Step) or callable(process):
        return process
    if not isinstance(process, str) or not _PROCESS_PATH_RE.match(process):
        raise _bad_process(process)
    module_name, _, attr = process.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise bad_argument(
            "DatagenMapOperator",
            "process",
            process,
            f"names a module it cannot import: module {module_name!r} ({exc})",
            "make it importable on the workers (a package, or a module next to the DAG file)",
        ) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise bad_argument(
                "DatagenMapOperator",
                "process",
                process,
                f"names a missing attribute: module {module_name!r} has no attribute {attr!r}",
                "check the name after the ':'",
            )
        obj = getattr(obj, part)
    if not (isinstance(obj, Step) or callable(obj)):
        raise bad_argument(
            "DatagenMapOperator",
            "process",
            process,
            f"is a {type(obj).__name__}, not a callable or a Step",
            "point it at a function or a step pipeline",
        )
    return obj


def _retry_dict(owner: object, retry: Any) -> dict[str, Any] | None:
    """``retry`` (a ``RetryPolicy``, its dict form or None) checked, in the dict form Airflow serialises."""
    if retry is None:
        return None
    # Deferred: see resolve_process.
    from airflow_provider_datagen.core.retry import RetryPolicy

    try:
        policy = RetryPolicy.coerce(retry)
    except ConfigurationError as exc:
        raise bad_argument(owner, "retry", retry, "is not a valid retry policy", str(exc)) from None
    assert policy is not None
    return policy.as_dict()


def _rate_limit_dict(owner: object, rate_limit: Any) -> dict[str, Any] | None:
    """``rate_limit`` (a ``RateLimit``, its dict form or None) checked, in the dict form Airflow serialises."""
    # Deferred: see resolve_process.
    from airflow_provider_datagen.core.ratelimit import RateLimit

    limit = RateLimit.coerce(rate_limit, owner=owner)
    return None if limit is None else limit.as_dict()


def _status(event_log: CheckpointLog) -> dict[str, Any]:
    # Deferred: see resolve_process.
    from airflow_provider_datagen.core import status_of

    return status_of(event_log)


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


class _DatagenBase(BaseOperator):
    """Shared plumbing: the hook, the log, the status XCom and the extra link."""

    operator_extra_links = (DatagenStatusLink(),)
    ui_color = "#e8f4ea"

    def __init__(
        self, *, pipeline: str, experiment: str, datagen_conn_id: str = DatagenHook.default_conn_name, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
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


class DatagenPlanOperator(_DatagenBase):
    """
    Plan pending work: fold the log once and return chunks of the items that are not done.

    The return value is a list of kwargs dicts for ``DatagenMapOperator.partial(...).expand_kwargs()``;
    each names its source and item ids (never payloads). With nothing pending it is empty, so the
    mapped task is skipped. Inline sources are snapshotted once next to the log so mapped workers read
    the very items that were planned.

    :param pipeline: pipeline name (a directory under ``datagen_checkpoints/``).
    :param experiment: experiment name; one event log per pipeline/experiment.
    :param source: a list of dicts, or a path/URI to a ``.jsonl``, ``.parquet`` or ``.lance`` source.
    :param key_field: the field holding each item's unique source key.
    :param chunk_size: items per mapped task instance (grown if the chunks would exceed
        ``[core] max_map_length``).
    :param processor_version: version of the processing code; cursors of other versions are demoted.
    :param redo_completed: ``"never"`` (the default) keeps items completed under another processor
        version (the plan logs how many); ``"other_version"`` regenerates them (and filtered ones),
        each as a new generation: the old outputs stay in the log's history. The chunks carry the
        choice to the mapped tasks.
    :param datagen_conn_id: connection of type ``datagen`` (root URI and storage options).
    """

    template_fields = ("pipeline", "experiment", "source", "processor_version")

    def __init__(
        self,
        *,
        pipeline: str,
        experiment: str,
        source: Any,
        key_field: str = "id",
        chunk_size: int = 100,
        processor_version: str = "v1",
        redo_completed: str = "never",
        datagen_conn_id: str = DatagenHook.default_conn_name,
        **kwargs: Any,
    ) -> None:
        super().__init__(pipeline=pipeline, experiment=experiment, datagen_conn_id=datagen_conn_id, **kwargs)
        self.redo_completed = _check_redo_completed(self, redo_completed)
        if not isinstance(source, (list, tuple, str, os.PathLike)):
            raise bad_argument(
                self,
                "source",
                source,
                f"is a {type(source).__name__}, not a list of dicts or a path/URI string",
                "give the items inline or a .jsonl, .parquet or .lance path or URI",
            )
        self.source = list(source) if isinstance(source, tuple) else check_absolute_path(self, "source", source)
        self.key_field = check_non_empty_str(self, "key_field", key_field, "name the field holding each item's key")
        self.chunk_size = check_positive_int(self, "chunk_size", chunk_size)
        self.processor_version = check_non_empty_str(
            self, "processor_version", processor_version, "give the version of the processing code, e.g. 'v1'"
        )

    def execute(self, context: Context) -> list[dict[str, Any]]:
        # Deferred: see resolve_process.
        from airflow_provider_datagen.core.chunks import plan_chunks

        max_map = _max_map_length()
        result = plan_chunks(
            self.get_log(),
            self.source,
            key_field=self.key_field,
            chunk_size=self.chunk_size,
            processor_version=self.processor_version,
            max_chunks=max_map,
            redo_completed=self.redo_completed,
        )
        self.log.info(
            "plan: %s; %d chunk(s) of up to %d items", result.plan.as_dict(), len(result.chunks), result.chunk_size
        )
        kept = result.plan.kept_other_version
        if kept:
            self.log.info(
                "%d completed or filtered items were produced by other processor versions (%s); they are kept. "
                "Pass redo_completed='other_version' to regenerate them.",
                sum(kept.values()),
                ", ".join(f"{v}: {n}" for v, n in kept.items()),
            )
        self.push_status(context, result.status)
        return [{"chunk": c, "redo_completed": self.redo_completed} for c in result.chunks]


def _check_redo_completed(owner: BaseOperator, value: Any) -> str:
    # Deferred: see resolve_process.
    from airflow_provider_datagen.core.planner import check_redo_completed

    return check_redo_completed(owner, value)


def _max_map_length() -> int:
    try:
        # Deferred and guarded: the full Airflow configuration is absent on a task-SDK-only worker.
        from airflow.configuration import conf

        return conf.getint("core", "max_map_length", fallback=1024)
    except Exception:  # a worker with only the task SDK
        return 1024


class _Progress:
    """Logs done/total, items/s and ETA at most every ``interval`` seconds."""

    def __init__(self, logger: logging.Logger, interval: float) -> None:
        self.logger = logger
        self.interval = interval
        self.start = time.monotonic()
        self.last = self.start

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if now - self.last < self.interval and done < total:
            return
        self.last = now
        elapsed = max(now - self.start, 1e-9)
        rate = done / elapsed
        eta = (total - done) / rate if rate > 0 else math.inf
        self.logger.info(
            "progress: %d/%d items (%.0f%%), %.1f items/s, ETA %s",
            done,
            total,
            100.0 * done / max(total, 1),
            rate,
            "unknown" if math.isinf(eta) else f"{eta:.0f}s",
        )


class DatagenMapOperator(_DatagenBase):
    """
    Run one chunk of items resumably: skip acknowledged items, replay the inbox, then fresh items.

    Use it mapped over a :class:`DatagenPlanOperator`'s output::

        gen = DatagenMapOperator.partial(task_id="generate", pipeline="qa", experiment="e1",
                                         process="my_pkg.gen:answer").expand_kwargs(plan.output)

    Each task-instance attempt writes as its own writer (dag/run/task/map index) with a fresh epoch,
    so a zombie attempt is fenced. Failed items are recorded in the log and the task fails at the
    end naming them: clearing it reruns only what is pending.

    :param pipeline: pipeline name; must match the plan's.
    :param experiment: experiment name; must match the plan's.
    :param process: ``"package.module:function"``, a callable ``fn(item, ctx) -> dict | None`` or a
        step pipeline (``Sequence``, ``Loop``, ``MapReduce``, ...).
    :param processor_version: version of ``process``; must match the plan's.
    :param redo_completed: ``"never"`` or ``"other_version"`` (see :class:`DatagenPlanOperator`); set
        by ``expand_kwargs`` from the plan, whose chunks carry its choice. Give it only without a plan.
    :param checkpoint_every: items per acknowledgement commit, each landed before the next item runs;
        ``None`` is pipelined group commit (every 4096 items or ``checkpoint_interval`` seconds,
        whichever first, appended while the next items run).
    :param checkpoint_interval: the time bound of group commit, in seconds.
    :param chunk: a chunk descriptor from the plan (set by ``expand_kwargs``).
    :param source: without a plan, the source to run whole (list or path/URI).
    :param key_field: the key field of ``source`` when used without a plan.
    :param fail_fast: stop at the first failing item instead of recording it and going on.
    :param progress_interval: seconds between progress lines in the task log.
    :param concurrency: items processed at once in threads, for I/O-bound ``process`` functions (model
        or HTTP calls); ``process`` must then be thread-safe. ``1`` (the default) runs items one at a
        time. A thread hands its item's finished steps to the task's writer on the usual cadence, so
        ``checkpoint_every=1`` still commits each step before the item's next one. A fan-out's
        children run in threads too; at most ``concurrency`` threads run user code at once.
    :param retry: retry transient errors of ``process`` in place (see
        :class:`~airflow_provider_datagen.core.RetryPolicy`): a ``RetryPolicy`` or its dict form
        ``{"attempts", "retry_on", "backoff", "max_backoff", "jitter"}`` (e.g. from params or a
        Variable; ``retry_on`` as dotted class names). Checked when the DAG is parsed. An item whose
        attempts run out fails the task as without it. ``None`` (the default): no retry.
    :param rate_limit: a :class:`~airflow_provider_datagen.core.RateLimit` or its dict form
        ``{"requests_per_minute", "tokens_per_minute", "key"}``: every call of ``process`` (each
        attempt) takes a start from the budget that every task naming the same ``key`` shares, on
        this host, or across hosts through the connection's ``rate_limit_storage`` (a Redis URI).
        Checked when the DAG is parsed. ``None`` (the default): no limit.
    :param datagen_conn_id: connection of type ``datagen``.
    """

    template_fields = ("pipeline", "experiment", "processor_version")
    _MAP_INDEX_TEMPLATE = "{{ task.chunk_label }}"

    @classmethod
    def partial(cls, **kwargs: Any) -> OperatorPartial:
        """``BaseOperator.partial`` with the chunk's key range as the default map index label.

        The task runner renders the *mapped* operator's ``map_index_template`` (a partial kwarg,
        ``None`` unless given), read before the operator is unmapped, so the default set in
        ``__init__`` alone never reaches the UI.
        """
        if kwargs.get("map_index_template") is None:
            kwargs["map_index_template"] = cls._MAP_INDEX_TEMPLATE
        if kwargs.get("retry") is not None:
            # a mapped operator's __init__ runs only on the worker: check the policy when the DAG is parsed
            kwargs["retry"] = _retry_dict(cls, kwargs["retry"])
        if kwargs.get("rate_limit") is not None:
            kwargs["rate_limit"] = _rate_limit_dict(cls, kwargs["rate_limit"])
        return super().partial(**kwargs)

    def __init__(
        self,
        *,
        pipeline: str,
        experiment: str,
        process: Any,
        processor_version: str = "v1",
        redo_completed: str = "never",
        checkpoint_every: int | None = None,
        checkpoint_interval: float = 2.0,
        chunk: Mapping[str, Any] | None = None,
        source: Any = None,
        key_field: str = "id",
        fail_fast: bool = False,
        progress_interval: float = 5.0,
        concurrency: int = 1,
        retry: Any = None,
        rate_limit: Any = None,
        datagen_conn_id: str = DatagenHook.default_conn_name,
        **kwargs: Any,
    ) -> None:
        if kwargs.get("map_index_template") is None:
            kwargs["map_index_template"] = self._MAP_INDEX_TEMPLATE
        super().__init__(pipeline=pipeline, experiment=experiment, datagen_conn_id=datagen_conn_id, **kwargs)
        if isinstance(process, str) and not _PROCESS_PATH_RE.match(process):
            raise _bad_process(process)
        if not (isinstance(process, str) or callable(process)):
            # Deferred: see resolve_process.
            from airflow_provider_datagen.core.steps import Step

            if not isinstance(process, Step):
                raise _bad_process(process)
        self.process = process
        self.processor_version = processor_version
        self.redo_completed = _check_redo_completed(self, redo_completed)
        self.checkpoint_every = check_positive_int(self, "checkpoint_every", checkpoint_every, allow_none=True)
        if not isinstance(checkpoint_interval, (int, float)) or checkpoint_interval <= 0:
            raise bad_argument(
                self,
                "checkpoint_interval",
                checkpoint_interval,
                "is not a positive number",
                "give the time bound of group commit in seconds, e.g. 2.0",
            )
        self.checkpoint_interval = float(checkpoint_interval)
        if chunk is not None and not isinstance(chunk, Mapping):
            raise bad_argument(
                self,
                "chunk",
                chunk,
                "is not a chunk descriptor dict",
                "map the operator with expand_kwargs(plan.output) of a DatagenPlanOperator",
            )
        self.chunk = dict(chunk) if chunk is not None else None
        if chunk is None and source is None:
            raise bad_argument(
                self,
                "chunk",
                chunk,
                "and source=None leave nothing to run",
                "give either chunk (expand_kwargs(plan.output) from a DatagenPlanOperator) or source",
            )
        self.source = source
        self.key_field = key_field
        self.fail_fast = bool(fail_fast)
        self.progress_interval = float(progress_interval)
        self.concurrency = check_positive_int(self, "concurrency", concurrency)
        #: the retry policy in its dict form (what Airflow serialises), or None
        self.retry = _retry_dict(self, retry)
        #: the rate limit in its dict form, or None
        self.rate_limit = _rate_limit_dict(self, rate_limit)

    @property
    def chunk_label(self) -> str:
        """What the UI shows for this map index: the chunk's key range."""
        if self.chunk:
            return str(self.chunk.get("label", ""))
        return "all items"

    def _items(self) -> tuple[list[Any], str]:
        """The items of this chunk (or of the whole source without a plan) and their key field."""
        # Deferred: see resolve_process.
        from airflow_provider_datagen.core import load_source
        from airflow_provider_datagen.core.chunks import chunk_items

        if self.chunk is None:
            return load_source(self.source, self.key_field), self.key_field
        items = chunk_items(
            self.chunk,
            pipeline=self.pipeline,
            experiment=self.experiment,
            processor_version=self.processor_version,
            storage_options=self.hook.storage_options or None,
        )
        return items, str(self.chunk.get("key_field", self.key_field))

    def execute(self, context: Context) -> dict[str, Any]:
        # Deferred: see resolve_process.
        from airflow_provider_datagen.core import RateLimit, RetryPolicy, run_items

        process = resolve_process(self.process)
        event_log = self.get_log()
        items, key_field = self._items()
        ti = context["ti"]
        map_index = getattr(ti, "map_index", -1)
        try_number = int(getattr(ti, "try_number", 1) or 1)
        coords = {
            "dag_id": ti.dag_id,
            "run_id": ti.run_id,
            "task_id": ti.task_id,
            "map_index": map_index,
            "try_number": try_number,
        }
        writer_id = f"{ti.dag_id}/{ti.run_id}/{ti.task_id}/{map_index}"
        epoch = event_log.next_epoch()
        self.log.info("writer %s epoch %d (try %d): %d items in this chunk", writer_id, epoch, try_number, len(items))
        report = run_items(
            event_log,
            items,
            process,
            key_field=key_field,
            processor_version=self.processor_version,
            writer_id=writer_id,
            epoch=epoch,
            checkpoint_every=self.checkpoint_every,
            checkpoint_interval=self.checkpoint_interval,
            fail_fast=self.fail_fast,
            airflow=coords,
            progress=_Progress(self.log, self.progress_interval),
            reraise=(AirflowTaskTimeout,),
            concurrency=self.concurrency,
            retry=RetryPolicy.from_dict(self.retry) if self.retry is not None else None,
            rate_limit=RateLimit.from_dict(self.rate_limit) if self.rate_limit is not None else None,
            rate_limit_storage=self.hook.rate_limit_storage if self.rate_limit is not None else None,
            # the plan's choice travels in its chunks (older plans' chunks lack it)
            redo_completed=self.chunk.get("redo_completed", self.redo_completed) if self.chunk else self.redo_completed,
        )
        result = report.as_dict()
        self.log.info("chunk done: %s (%d commits, %d events)", result, report.commits, report.events)
        self.push_status(context, _status(event_log))
        if report.failed:
            ti.xcom_push(key=REPORT_XCOM_KEY, value=result)
            shown = ", ".join(repr(i) for i in report.failed[:_FAILED_SHOWN])
            more = f" and {len(report.failed) - _FAILED_SHOWN} more" if len(report.failed) > _FAILED_SHOWN else ""
            first = report.errors.get(report.failed[0], "")
            raise ItemsFailedError(
                f"{len(report.failed)} of {len(items)} items failed in this chunk: {shown}{more} "
                f"(first error: {first[:300]}). They are recorded in the log's failure lens; "
                f"{len(report.processed)} items were acknowledged. Clear this task instance to rerun only the "
                "pending items."
            )
        return result


class DatagenExportOperator(_DatagenBase):
    """
    Export the folded fields of completed items to a Lance dataset and fingerprint it.

    Columns: ``item_id``, ``key``, one typed column per field (Arrow types inferred from the values;
    a field whose values do not share one type is a column of JSON text, named in the task log and
    in ``json_fields``), and with ``include_input=True`` the item's input as a struct column
    ``input``. A field named ``item_id``, ``key`` or ``input``, or holding a ``.``, gets the column
    ``field_<name>`` (dots as ``_``), listed in ``renamed_fields``.

    The destination is declared as an Airflow Asset (outlet), so downstream DAGs can be scheduled on
    fresh results. An unchanged export (the destination already holds the same content) writes no
    new version and emits no asset event. Returns ``{"rows", "fingerprint", "changed",
    "json_fields", "renamed_fields"}``; equal results give equal fingerprints whatever history
    (failures, crashes, reruns) produced them. Fails with
    :class:`~airflow_provider_datagen.exceptions.ExperimentNotFoundError` when the experiment has no
    log (a misspelt name), writing nothing.

    :param pipeline: pipeline name.
    :param experiment: experiment name.
    :param destination: absolute path or URI of the export dataset (overwritten when it changes).
    :param include_input: add each item's source input as a struct column ``input``; needs ``source``.
    :param source: with ``include_input=True``, the source the experiment was planned with (the log
        keeps input fingerprints, not inputs); read only then.
    :param key_field: the key field of ``source``.
    :param datagen_conn_id: connection of type ``datagen``; its storage options apply to the
        destination too.
    """

    template_fields = ("pipeline", "experiment", "destination", "source")

    def __init__(
        self,
        *,
        pipeline: str,
        experiment: str,
        destination: str,
        include_input: bool = False,
        source: Any = None,
        key_field: str = "id",
        datagen_conn_id: str = DatagenHook.default_conn_name,
        **kwargs: Any,
    ) -> None:
        if not isinstance(destination, (str, os.PathLike)) or not os.fspath(destination):
            raise bad_argument(
                self, "destination", destination, "is not a path or URI string", "give an absolute path or a URI"
            )
        destination = os.fspath(destination)
        check_absolute_path(self, "destination", destination)
        if not is_template(destination):
            kwargs.setdefault("outlets", [Asset(asset_uri(destination))])
        if not isinstance(include_input, bool):
            raise bad_argument(self, "include_input", include_input, "is not a bool", "pass True or False")
        if include_input and source is None:
            raise bad_argument(
                self,
                "include_input",
                include_input,
                "needs the items' inputs, and the log keeps only their fingerprints",
                "pass source= and key_field= as given to DatagenPlanOperator, or include_input=False",
            )
        if source is not None and not isinstance(source, (list, tuple, str, os.PathLike)):
            raise bad_argument(
                self,
                "source",
                source,
                f"is a {type(source).__name__}, not a list of dicts or a path/URI string",
                "give the plan's source: the items inline or a .jsonl, .parquet or .lance path or URI",
            )
        super().__init__(pipeline=pipeline, experiment=experiment, datagen_conn_id=datagen_conn_id, **kwargs)
        self.destination = destination
        self.include_input = include_input
        self.source = list(source) if isinstance(source, tuple) else source
        self.key_field = check_non_empty_str(self, "key_field", key_field, "name the field holding each item's key")

    def execute(self, context: Context) -> dict[str, Any]:
        # Deferred: see resolve_process.
        from airflow_provider_datagen.core import export_results

        event_log = self.get_log()
        result = export_results(
            event_log,
            self.destination,
            storage_options=self.hook.storage_options or None,
            include_input=self.include_input,
            source=self.source,
            key_field=self.key_field,
        )
        if result["json_fields"]:
            self.log.info(
                "columns holding JSON text (their values do not share one Arrow type): %s",
                ", ".join(result["json_fields"]),
            )
        if result["renamed_fields"]:
            self.log.info("fields exported under another column name: %s", result["renamed_fields"])
        if result["changed"]:
            self.log.info(
                "exported %d rows to %s, fingerprint %s", result["rows"], self.destination, result["fingerprint"]
            )
        else:
            # The task runner builds the success message's asset events from this task's outlets as they
            # are when execute returns (task_runner._handle_current_task_success): without the destination's
            # asset this run announces nothing about it (the DAG still declares it; other outlets stay).
            unchanged = Asset(asset_uri(self.destination)).uri
            self.outlets = [o for o in self.outlets if not (isinstance(o, Asset) and o.uri == unchanged)]
            self.log.info(
                "export unchanged: %s already holds these %d rows (fingerprint %s); no new version, no asset event",
                self.destination,
                result["rows"],
                result["fingerprint"],
            )
        self.push_status(context, _status(event_log))
        return result


def asset_uri(destination: str) -> str:
    """The Asset URI of an export destination (``file://`` for local paths)."""
    if "://" in destination:
        return destination
    return "file://" + os.path.abspath(destination)


class DatagenMaintenanceOperator(_DatagenBase):
    """
    Compact the log, refresh its scalar indices and drop old versions; safe beside running writers.

    At most one maintenance runs per experiment at a time: the task is limited to one active
    instance, and the log's own maintenance lease makes a concurrent one a no-op.

    :param pipeline: pipeline name.
    :param experiment: experiment name.
    :param datagen_conn_id: connection of type ``datagen``.
    """

    template_fields = ("pipeline", "experiment")

    def __init__(
        self,
        *,
        pipeline: str,
        experiment: str,
        datagen_conn_id: str = DatagenHook.default_conn_name,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("max_active_tis_per_dag", 1)
        super().__init__(pipeline=pipeline, experiment=experiment, datagen_conn_id=datagen_conn_id, **kwargs)

    def execute(self, context: Context) -> dict[str, Any]:
        event_log = self.get_log()
        result = event_log.maintain()
        self.log.info("maintenance of %s: %s", event_log.uri, result)
        self.push_status(context, _status(event_log))
        return result


__all__ = [
    "STATUS_XCOM_KEY",
    "DatagenExportOperator",
    "DatagenMaintenanceOperator",
    "DatagenMapOperator",
    "DatagenPlanOperator",
    "DatagenStatusLink",
    "ItemsFailedError",
    "resolve_process",
]
