"""DatagenPlanOperator: fold the log once and return the pending items as chunk descriptors."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from airflow_provider_datagen._arguments import (
    bad_argument,
    check_absolute_path,
    check_non_empty_str,
)
from airflow_provider_datagen.experiment import DatagenExperiment, resolve_version
from airflow_provider_datagen.operators import lineage
from airflow_provider_datagen.operators.base import DatagenBaseOperator

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator, Context

    from airflow_provider_datagen.core.chunks import PlannedChunks
    from airflow_provider_datagen.core.store.log import CheckpointLog

#: ``chunk_size="auto"``: one chunk per task instance Airflow runs at once.
AUTO = "auto"


class DatagenPlanOperator(DatagenBaseOperator):
    """
    Plan pending work: fold the log once and return chunks of the items that are not done.

    The return value is a list of kwargs dicts for ``DatagenMapOperator.partial(...).expand_kwargs()``;
    each names its source and item ids (never payloads). With nothing pending it is empty, so the
    mapped task is skipped. Inline sources are snapshotted once next to the log so mapped workers read
    the very items that were planned.

    :param pipeline: pipeline name (a directory under ``datagen_checkpoints/``). Not needed when
        ``experiment`` is a ``DatagenExperiment``.
    :param experiment: experiment name; one event log per pipeline/experiment. Or a
        :class:`~airflow_provider_datagen.experiment.DatagenExperiment`: then ``pipeline``,
        ``datagen_conn_id`` (and ``processor_version``) come from it, and an explicit different one is an error.
    :param source: a list of dicts, or a path/URI to a ``.jsonl``, ``.parquet`` or ``.lance`` source.
    :param key_field: the field holding each item's unique source key.
    :param chunk_size: items per mapped task instance (grown if the chunks would exceed
        ``[core] max_map_length``), or ``"auto"``: as many chunks as the mapped task can run at once
        (the smallest of ``[core] parallelism``, the DAG's ``max_active_tasks`` and the mapped task's
        ``max_active_tis_per_dagrun`` / ``max_active_tis_per_dag``), so the pending items run in one
        wave of task instances and each pays Airflow's start-up once; give the mapped task a
        ``concurrency`` to overlap the calls within a chunk.
    :param processor_version: version of the processing code; cursors of other versions are demoted.
    :param redo_completed: ``"never"`` (the default) keeps items completed under another processor
        version (the plan logs how many); ``"other_version"`` regenerates them (and filtered ones),
        each as a new generation: the old outputs stay in the log's history. The chunks carry the
        choice to the mapped tasks.
    :param budget_usd: the most USD the experiment may spend (its usage ledger: every attempt's
        recorded cost, in every run). Once reached, the plan returns no chunks and logs why; raise it
        to continue. Recorded as the experiment's budget for the UI. ``None``: no limit.
    :param budget_tokens: the same for input + output tokens.
    :param datagen_conn_id: connection of type ``datagen`` (root URI and storage options).
    """

    template_fields = ("pipeline", "experiment", "source", "processor_version")

    def __init__(
        self,
        *,
        pipeline: str | None = None,
        experiment: str | DatagenExperiment,
        source: Any,
        key_field: str = "id",
        chunk_size: int = 100,
        processor_version: str | None = None,
        redo_completed: str = "never",
        budget_usd: float | None = None,
        budget_tokens: int | None = None,
        datagen_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        processor_version = resolve_version(self, experiment, processor_version, "v1")
        super().__init__(pipeline=pipeline, experiment=experiment, datagen_conn_id=datagen_conn_id, **kwargs)
        self.budget_usd, self.budget_tokens = check_budget_arguments(self, budget_usd, budget_tokens)
        self.redo_completed = check_redo_completed_argument(self, redo_completed)
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
        if chunk_size != AUTO and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1):
            raise bad_argument(
                self,
                "chunk_size",
                chunk_size,
                "is not a positive int",
                f"give chunk_size an int of 1 or more, or {AUTO!r} for one chunk per parallel task slot",
            )
        self.chunk_size: int | str = chunk_size
        self.processor_version = check_non_empty_str(
            self, "processor_version", processor_version, "give the version of the processing code, e.g. 'v1'"
        )

    def execute(self, context: Context) -> list[dict[str, Any]]:
        # Deferred: core imports Lance, which DAG parsing must not pay for.
        from airflow_provider_datagen.core.chunks import plan_chunks
        from airflow_provider_datagen.core.ledger.budget import Budget, budget_reached

        event_log = self.get_log()
        budget = Budget(self.budget_usd, self.budget_tokens)
        event_log.set_budget(budget.usd, budget.tokens)  # what the UI shows; None clears an old one
        why = budget_reached(event_log, budget)
        if why is not None:
            self.log.warning(
                "the experiment's budget is reached (%s): no chunks are planned and nothing runs. Raise "
                "budget_usd/budget_tokens to continue where it stopped.",
                why,
            )
            self.push_status(context, event_log.summary())
            return []
        max_map = _max_map_length()
        chunk_size = self.chunk_size
        if chunk_size == AUTO:
            # one chunk per slot: plan_chunks grows the chunks from 1 item until they fit the slots
            max_map = min(max_map, self.parallel_slots())
            chunk_size = 1
        result = plan_chunks(
            event_log,
            self.source,
            key_field=self.key_field,
            chunk_size=chunk_size,
            processor_version=self.processor_version,
            max_chunks=max_map,
            redo_completed=self.redo_completed,
            record=False,  # recorded below, with the connection's names, and a failure only logged
        )
        self.log.info(
            "plan: %s; %d chunk(s) of up to %d items", result.plan.as_dict(), len(result.specs), result.chunk_size
        )
        kept = result.plan.kept_other_version
        if kept:
            self.log.info(
                "%d completed or filtered items were produced by other processor versions (%s); they are kept. "
                "Pass redo_completed='other_version' to regenerate them.",
                sum(kept.values()),
                ", ".join(f"{v}: {n}" for v, n in kept.items()),
            )
        self.record_source(event_log, result)
        lineage.record(self, inputs=[lineage.planned_source(self.source, result.specs)])
        self.push_status(context, result.status)
        # redo_completed is in each chunk; the kwarg beside it stays for whoever reads this XCom by it,
        # and the map operator only checks it against the chunk's
        return [{"chunk": s.to_xcom(), "redo_completed": self.redo_completed} for s in result.specs]

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage (with its provider installed): the source it read as an input dataset."""
        return lineage.operator_lineage(self)

    def record_source(self, event_log: CheckpointLog, result: PlannedChunks) -> None:
        """Record beside the log which source this plan read, for the UI's next-run panel and item inputs.

        Names only (the connection id, its storage options' keys), never their values. A failure to
        record is logged and the plan goes on: the UI then shows the log-only view.
        """
        from airflow_provider_datagen.core.chunks import record_plan_source
        from airflow_provider_datagen.exceptions import DatagenError

        try:
            record_plan_source(
                event_log,
                self.source,
                result,
                key_field=self.key_field,
                processor_version=self.processor_version,
                redo_completed=self.redo_completed,
                conn_id=self.datagen_conn_id,
                storage_option_names=list(self.hook.storage_options),
            )
        except (DatagenError, OSError) as exc:
            self.log.warning("could not record the plan's source beside the log (the UI shows less): %s", exc)

    def parallel_slots(self) -> int:
        """How many task instances of the mapped tasks after this plan Airflow runs at once.

        The smallest of ``[core] parallelism``, the DAG's ``max_active_tasks`` and each downstream
        task's ``max_active_tis_per_dagrun`` / ``max_active_tis_per_dag``. Pools are not counted (a
        task cannot read a pool's size) and neither are other DAGs' tasks sharing the executor.
        """
        limits = [_config_int("parallelism", 32)]
        dag = getattr(self, "dag", None)
        if dag is not None and getattr(dag, "max_active_tasks", None):
            limits.append(int(dag.max_active_tasks))
        for task in self.downstream_list:
            for attr in ("max_active_tis_per_dagrun", "max_active_tis_per_dag"):
                value = getattr(task, attr, None)
                if isinstance(value, int) and value > 0:
                    limits.append(value)
        return max(1, min(limits))


#: ``core.planner.REDO_COMPLETED``, repeated so that a valid value is accepted at DAG parse without
#: importing the planner (pyarrow and numpy); the planner's check stays the rule and its message.
_REDO_COMPLETED = ("never", "other_version")


def check_redo_completed_argument(owner: BaseOperator, value: Any) -> str:
    if isinstance(value, str) and value in _REDO_COMPLETED:
        return value
    # Deferred: the planner imports pyarrow, which DAG parsing must not pay for.
    from airflow_provider_datagen.core.planner import check_redo_completed

    return check_redo_completed(owner, value)


def check_budget_arguments(owner: BaseOperator, budget_usd: Any, budget_tokens: Any) -> tuple[Any, Any]:
    """``budget_usd`` (a positive number) and ``budget_tokens`` (a positive int), each or None, checked."""
    if budget_usd is None and budget_tokens is None:
        return None, None
    # Deferred: core imports Lance, which DAG parsing must not pay for (only a DAG with a budget does).
    from airflow_provider_datagen.core.ledger.budget import Budget

    budget = Budget.of(owner, budget_usd, budget_tokens)
    return budget.usd, budget.tokens


def _max_map_length() -> int:
    return _config_int("max_map_length", 1024)


def _config_int(key: str, default: int) -> int:
    """``[core] <key>`` as an int, or ``default``."""
    try:
        # Deferred and guarded: the full Airflow configuration is absent on a task-SDK-only worker.
        from airflow.configuration import conf

        return conf.getint("core", key, fallback=default)
    except Exception:  # a worker with only the task SDK
        return default
