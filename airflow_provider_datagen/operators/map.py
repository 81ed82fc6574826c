"""DatagenMapOperator: run one chunk of items resumably (the mapped task of a plan)."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowSkipException, AirflowTaskTimeout

from airflow_provider_datagen._arguments import (
    bad_argument,
    check_positive_int,
)
from airflow_provider_datagen.exceptions import ConfigurationError, ItemsFailedError

# a light module (no Lance, pyarrow or numpy): DAG parsing may import it
from airflow_provider_datagen.experiment import DatagenExperiment, resolve_version
from airflow_provider_datagen.operators import lineage
from airflow_provider_datagen.operators.base import (
    REPORT_XCOM_KEY,
    DatagenChunkOperator,
    check_chunk_or_source,
    folded_status,
)
from airflow_provider_datagen.operators.plan import check_budget_arguments, check_redo_completed_argument
from airflow_provider_datagen.operators.process import PROCESS_PATH_RE, bad_process, resolve_process

if TYPE_CHECKING:
    import logging
    from collections.abc import Mapping

    from airflow.sdk import Context
    from airflow.sdk.definitions.mappedoperator import OperatorPartial

    from airflow_provider_datagen.core.chunk_spec import ChunkSpec


_FAILED_SHOWN = 20


def retry_dict(owner: object, retry: Any) -> dict[str, Any] | None:
    """``retry`` (a ``RetryPolicy``, its dict form or None) checked, in the dict form Airflow serialises."""
    if retry is None:
        return None
    # Deferred: core imports Lance, which DAG parsing must not pay for.
    from airflow_provider_datagen.core.retry import RetryPolicy

    try:
        policy = RetryPolicy.coerce(retry)
    except ConfigurationError as exc:
        raise bad_argument(owner, "retry", retry, "is not a valid retry policy", str(exc)) from None
    assert policy is not None
    return policy.as_dict()


def _rate_limit_dict(owner: object, rate_limit: Any) -> dict[str, Any] | None:
    """``rate_limit`` (a ``RateLimit``, its dict form or None) checked, in the dict form Airflow serialises."""
    if rate_limit is None:
        return None
    # Deferred: core imports Lance, which DAG parsing must not pay for.
    from airflow_provider_datagen.core.ratelimit import RateLimit

    limit = RateLimit.coerce(rate_limit, owner=owner)
    return None if limit is None else limit.as_dict()


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


class DatagenMapOperator(DatagenChunkOperator):
    """
    Run one chunk of items resumably: skip acknowledged items, replay the inbox, then fresh items.

    Use it mapped over a :class:`DatagenPlanOperator`'s output::

        gen = DatagenMapOperator.partial(task_id="generate", pipeline="qa", experiment="e1",
                                         process="my_pkg.gen:answer").expand_kwargs(plan.output)

    Each task-instance attempt writes as its own writer (dag/run/task/map index) with a fresh epoch,
    so a zombie attempt is fenced. Failed items are recorded in the log and the task fails at the
    end naming them: clearing it reruns only what is pending.

    :param pipeline: pipeline name; must match the plan's. Not needed when ``experiment`` is a ``DatagenExperiment``.
    :param experiment: experiment name; must match the plan's. Or a
        :class:`~airflow_provider_datagen.experiment.DatagenExperiment`: then ``pipeline``,
        ``datagen_conn_id`` (and ``processor_version``) come from it, and an explicit different one is an error.
    :param process: ``"package.module:function"``, a callable ``fn(item, ctx) -> dict | None`` or a
        step pipeline (``Sequence``, ``Loop``, ``MapReduce``, ...).
    :param processor_version: version of ``process``. Mapped over a plan, the chunk carries the plan's
        and this may be left out; when given it must match the plan's. Without a plan, ``"v1"`` if not given.
    :param redo_completed: ``"never"`` or ``"other_version"`` (see :class:`DatagenPlanOperator`). Mapped
        over a plan, the chunk carries the plan's choice (``expand_kwargs`` also passes it, checked
        against the chunk's). Without a plan, ``"never"`` if not given.
    :param checkpoint_every: items per acknowledgement commit, each landed before the next item runs;
        ``None`` is pipelined group commit (every 4096 items or ``checkpoint_interval`` seconds,
        whichever first, appended while the next items run).
    :param checkpoint_interval: the time bound of group commit, in seconds.
    :param chunk: a chunk from the plan, a :class:`~airflow_provider_datagen.core.ChunkSpec`'s XCom dict
        (set by ``expand_kwargs``).
    :param source: without a plan, the source to run whole (list or path/URI).
    :param key_field: the key field of ``source`` when used without a plan.
    :param fail_fast: stop at the first failing item instead of recording it and going on.
    :param progress_interval: seconds between progress lines in the task log.
    :param concurrency: items processed at once in threads, for I/O-bound ``process`` functions (model
        or HTTP calls); ``process`` must then be thread-safe. ``1`` (the default) runs items one at a
        time. A thread hands its item's finished steps to the task's writer on the usual cadence, so
        ``checkpoint_every=1`` still commits each step before the item's next one. A fan-out's
        children run in threads too; at most ``concurrency`` threads run user code at once. An
        ``async def`` process instead runs on an event loop in the task's main thread with up to
        ``concurrency`` calls in flight (hundreds are fine); async steps of a step pipeline are
        awaited by the threads.
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
    :param budget_usd: the most USD the experiment may spend (its usage ledger, shared by every task
        through the log). Once reached, the task starts no new item, finishes those in flight and ends
        **skipped** with a warning saying so (no item is marked failed); the rest stays pending for a
        run with a higher budget. ``None`` (the default): no limit.
    :param budget_tokens: the same for input + output tokens.
    :param max_repeated_failures: when this many items in a row fail (after their retries) with the
        same error type and message (a wrong connection id, an unreachable server), the task starts no
        new item, finishes those in flight and fails with
        :class:`~airflow_provider_datagen.exceptions.RepeatedFailureError` naming the error; the rest
        stays pending for a rerun once the cause is fixed. Errors whose messages differ per item never
        stop it. ``None``: never stop for it. Default 5.
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
            kwargs["retry"] = retry_dict(cls, kwargs["retry"])
        if kwargs.get("rate_limit") is not None:
            kwargs["rate_limit"] = _rate_limit_dict(cls, kwargs["rate_limit"])
        if kwargs.get("budget_usd") is not None or kwargs.get("budget_tokens") is not None:
            kwargs["budget_usd"], kwargs["budget_tokens"] = check_budget_arguments(
                cls, kwargs.get("budget_usd"), kwargs.get("budget_tokens")
            )
        if "max_repeated_failures" in kwargs:
            check_positive_int(cls, "max_repeated_failures", kwargs["max_repeated_failures"], allow_none=True)
        return super().partial(**kwargs)

    def __init__(
        self,
        *,
        pipeline: str | None = None,
        experiment: str | DatagenExperiment,
        process: Any,
        processor_version: str | None = None,
        redo_completed: str | None = None,
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
        budget_usd: float | None = None,
        budget_tokens: int | None = None,
        max_repeated_failures: int | None = 5,
        datagen_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        processor_version = resolve_version(self, experiment, processor_version, None)
        if kwargs.get("map_index_template") is None:
            kwargs["map_index_template"] = self._MAP_INDEX_TEMPLATE
        super().__init__(pipeline=pipeline, experiment=experiment, datagen_conn_id=datagen_conn_id, **kwargs)
        if isinstance(process, str) and not PROCESS_PATH_RE.match(process):
            raise bad_process(process)
        if not (isinstance(process, str) or callable(process)):
            # Deferred: core imports Lance, which DAG parsing must not pay for.
            from airflow_provider_datagen.core.steps import Step

            if not isinstance(process, Step):
                raise bad_process(process)
        self.process = process
        #: None: the chunk's (the plan's), or "v1" without a plan
        self.processor_version = processor_version
        #: None: the chunk's (the plan's), or "never" without a plan
        self.redo_completed = None if redo_completed is None else check_redo_completed_argument(self, redo_completed)
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
        self.chunk = check_chunk_or_source(self, chunk, source)
        self.source = source
        self.key_field = key_field
        self.fail_fast = bool(fail_fast)
        self.progress_interval = float(progress_interval)
        self.concurrency = check_positive_int(self, "concurrency", concurrency)
        #: the retry policy in its dict form (what Airflow serialises), or None
        self.retry = retry_dict(self, retry)
        #: the rate limit in its dict form, or None
        self.rate_limit = _rate_limit_dict(self, rate_limit)
        self.budget_usd, self.budget_tokens = check_budget_arguments(self, budget_usd, budget_tokens)
        self.max_repeated_failures = check_positive_int(
            self, "max_repeated_failures", max_repeated_failures, allow_none=True
        )

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage (its provider installed): the chunk's source as an input, the experiment's log as the output."""
        return lineage.operator_lineage(self)

    def _items(self, spec: ChunkSpec | None) -> tuple[list[Any], str]:
        """The items of this chunk (or of the whole source without a plan) and their key field."""
        # Deferred: core imports Lance, which DAG parsing must not pay for.
        from airflow_provider_datagen.core import load_source
        from airflow_provider_datagen.core.chunks import chunk_items

        if spec is None:
            return (
                load_source(self.source, self.key_field, storage_options=self.hook.storage_options or None),
                self.key_field,
            )
        spec.check_task(
            pipeline=self.pipeline,
            experiment=self.experiment,
            processor_version=self.processor_version,
            redo_completed=self.redo_completed,
        )
        items = chunk_items(
            spec,
            pipeline=self.pipeline,
            experiment=self.experiment,
            processor_version=self.processor_version,
            storage_options=self.hook.storage_options or None,
        )
        return items, spec.key_field

    def execute(self, context: Context) -> dict[str, Any]:
        # Deferred: core imports Lance, which DAG parsing must not pay for.
        from airflow_provider_datagen.core import RateLimit, RetryPolicy
        from airflow_provider_datagen.core.runner.config import RunConfig
        from airflow_provider_datagen.core.runner.run import run_configured

        process = resolve_process(self.process)
        event_log = self.get_log()
        spec = self.spec()
        lineage.record(self, inputs=[lineage.chunk_source(spec, self.source)], outputs=[event_log.uri])
        items, key_field = self._items(spec)
        # the plan's choices travel in its chunk; without a plan, this task's own or the defaults
        if spec is not None:
            processor_version, redo_completed = spec.processor_version, spec.redo_completed
        else:
            processor_version = "v1" if self.processor_version is None else self.processor_version
            redo_completed = "never" if self.redo_completed is None else self.redo_completed
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
        # run_items's configuration, checked once with this operator named in its errors
        config = RunConfig(
            owner=self,
            key_field=key_field,
            processor_version=processor_version,
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
            redo_completed=redo_completed,
            budget_usd=self.budget_usd,
            budget_tokens=self.budget_tokens,
            max_repeated_failures=self.max_repeated_failures,
        )
        report = run_configured(event_log, items, process, config)
        result = report.as_dict()
        self.log.info("chunk done: %s (%d commits, %d events)", result, report.commits, report.events)
        self.push_status(context, folded_status(event_log))
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
        if report.stopped_by_budget:
            self.log.warning("chunk stopped by the experiment's budget: %s", result)
            ti.xcom_push(key=REPORT_XCOM_KEY, value={**result, "stopped_by_budget": True})
            # Skipped, not failed: nothing went wrong, and no item is marked failed; the grid shows
            # the task apart from a finished one, and the rest of the chunk stays pending.
            raise AirflowSkipException(
                f"stopped by the budget (budget_usd={self.budget_usd}, budget_tokens={self.budget_tokens}): "
                f"{len(report.processed)} items were acknowledged, the items in flight finished, and the rest "
                "of this chunk stays pending. Raise the budget and rerun to continue where it stopped."
            )
        return result
