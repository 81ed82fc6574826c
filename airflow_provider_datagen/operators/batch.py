"""DatagenBatchOperator: run one chunk of items through a provider's batch API (the batch form of the map task)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowSkipException

from airflow_provider_datagen._arguments import bad_argument

# light modules (no Lance, pyarrow or numpy): DAG parsing may import them
from airflow_provider_datagen.core.batch.cancel import cancel_each
from airflow_provider_datagen.exceptions import BatchAPIError, ItemsFailedError
from airflow_provider_datagen.experiment import DatagenExperiment, resolve_version
from airflow_provider_datagen.operators import lineage
from airflow_provider_datagen.operators.base import (
    REPORT_XCOM_KEY,
    DatagenChunkOperator,
    check_chunk_or_source,
    folded_status,
)
from airflow_provider_datagen.operators.map import retry_dict
from airflow_provider_datagen.operators.plan import check_budget_arguments, check_redo_completed_argument
from airflow_provider_datagen.operators.process import PROCESS_PATH_RE, import_path
from airflow_provider_datagen.triggers.batch import DatagenBatchTrigger, check_poll_interval

if TYPE_CHECKING:
    from collections.abc import Mapping

    from airflow.sdk import Context
    from airflow.sdk.definitions.mappedoperator import OperatorPartial

    from airflow_provider_datagen.core import CheckpointLog
    from airflow_provider_datagen.core.batch import BatchRun
    from airflow_provider_datagen.core.batch.protocol import BatchClient, BatchStep
    from airflow_provider_datagen.core.chunk_spec import ChunkSpec

_OWNER = "DatagenBatchOperator"
_FAILED_SHOWN = 20
#: what a batch step (core/batch/protocol.py's BatchStep, llm_batch's LLMBatchStep) has
_STEP_MEMBERS = ("version", "step_name", "client", "request", "fields", "model_label")
_STEP_FIX = (
    "pass the step llm_batch(...) returns, or its 'package.module:name' path; a per-item function or a step "
    "pipeline runs with DatagenMapOperator"
)


def _is_batch_step(obj: Any) -> bool:
    return not isinstance(obj, type) and all(hasattr(obj, name) for name in _STEP_MEMBERS)


def check_batch_process(owner: object, process: Any) -> Any:
    """``process`` as given if it is a batch step or a well-formed ``"package.module:name"`` (resolved later)."""
    if isinstance(process, str):
        if not PROCESS_PATH_RE.match(process):
            raise bad_argument(owner, "process", process, "is not a 'package.module:name' path", _STEP_FIX)
    elif not _is_batch_step(process):
        raise bad_argument(owner, "process", process, f"is a {type(process).__name__}, not a batch step", _STEP_FIX)
    return process


def resolve_batch_step(owner: object, process: Any) -> BatchStep:
    """The batch step ``process`` is or names (``"package.module:name"`` imported now, on the worker)."""
    check_batch_process(owner, process)
    if not isinstance(process, str):
        return process
    obj = import_path(owner, process)
    if not _is_batch_step(obj):
        raise bad_argument(owner, "process", process, f"is a {type(obj).__name__}, not a batch step", _STEP_FIX)
    return obj


@dataclass
class _Carry:
    """What one task try keeps across its deferrals; travels in the trigger's ``resume`` and back in its event.

    ``BatchRun`` counts submissions per item in memory, for one run: a resumed task builds a new run, so
    without the counts it would resubmit an item whose attempts ran out in an earlier round. Its report is
    per round too: the task's own adds the rounds up (an item processed in round 1 is "skipped" by round 2).
    """

    epoch: int
    submitted: dict[str, int] = field(default_factory=dict)
    #: the items that failed for good in this try (BatchRun.given_up, where it keeps that set)
    given_up: list[str] = field(default_factory=list)
    processed: int = 0
    #: the items already done when the try started (counted by its first round only)
    skipped: int | None = None
    failed: int = 0
    failed_ids: list[str] = field(default_factory=list)
    first_error: str = ""
    batches: list[str] = field(default_factory=list)

    def add(self, run: BatchRun) -> None:
        report = run.report
        # Only the items submitted more than once: BatchRun counts an item it has no count of, whose row it
        # reads, as submitted once, so the ones left out mean the same and the trigger's kwargs (the
        # metadata DB) hold a few ids, not every item of a 50,000-item chunk.
        self.submitted = {item_id: n for item_id, n in run.submitted.items() if n > 1}
        self.given_up = sorted(getattr(run, "given_up", ()))
        self.processed += len(report.processed)
        if self.skipped is None:
            self.skipped = len(report.skipped)
        if report.failed and not self.first_error:
            self.first_error = report.errors.get(report.failed[0], "")
        self.failed += len(report.failed)
        self.failed_ids += report.failed[: max(0, _FAILED_SHOWN - len(self.failed_ids))]
        self.batches += [b for b in report.batches if b not in self.batches]

    def result(self, in_batch: int = 0) -> dict[str, Any]:
        return {
            "processed": self.processed,
            "skipped": self.skipped or 0,
            "failed": self.failed,
            "batches": list(self.batches),
            "in_batch": in_batch,
        }


class DatagenBatchOperator(DatagenChunkOperator):
    """
    Run one chunk of items through a provider's batch API (OpenAI's Batch API, Anthropic's Message Batches),
    at the batch price, without holding a worker slot while the batches run.

    Use it mapped over a :class:`DatagenPlanOperator`'s output, as :class:`DatagenMapOperator`::

        step = llm_batch("Answer: {{ question }}", model_id="openai:gpt-4o-mini")
        gen = DatagenBatchOperator.partial(task_id="generate", pipeline="qa", experiment="e1", process=step,
                                           processor_version=step.version).expand_kwargs(plan.output)

    A round submits the chunk's pending items (skipping what the log says is done, re-attaching to the
    batches an earlier try left open), then the task defers to
    :class:`~airflow_provider_datagen.triggers.batch.DatagenBatchTrigger`, which polls them in the
    triggerer; when they have ended the task resumes, records every row in the log exactly once,
    resubmits the rows that errored or expired (up to ``retry``'s attempts) and defers again while
    anything is open. Items that failed are recorded and the task fails at the end naming them, as the
    map task does: clearing it resubmits only those.

    :param pipeline: pipeline name; must match the plan's. Not needed when ``experiment`` is a ``DatagenExperiment``.
    :param experiment: experiment name; must match the plan's. Or a
        :class:`~airflow_provider_datagen.experiment.DatagenExperiment`: then ``pipeline``,
        ``datagen_conn_id`` (and ``processor_version``) come from it, and an explicit different one is an error.
    :param process: the batch step of :func:`~airflow_provider_datagen.llm.batch.step.llm_batch` or its
        ``"package.module:name"`` path (imported on the worker).
    :param processor_version: version of ``process``. Mapped over a plan, the chunk carries the plan's
        and this may be left out; when given it must match the plan's. Without a plan, the step's
        ``version`` if not given.
    :param redo_completed: ``"never"`` or ``"other_version"`` (see :class:`DatagenPlanOperator`). Mapped
        over a plan, the chunk carries the plan's and this may be left out; when given it must match.
        ``"other_version"`` submits items completed under another processor version again.
    :param chunk: a chunk from the plan, a :class:`~airflow_provider_datagen.core.ChunkSpec`'s XCom dict
        (set by ``expand_kwargs``).
    :param source: without a plan, the source to run whole (list or path/URI).
    :param key_field: the key field of ``source`` when used without a plan.
    :param retry: a ``RetryPolicy`` or its dict form; its ``attempts`` is how many times one item may be
        submitted per task try (an errored, expired or cancelled row is resubmitted alone until then).
        ``None`` (the default): once.
    :param budget_usd: the most USD the experiment may spend. No batch is submitted once it is reached,
        nor one holding more items than the rest covers at the mean cost so far; the task then ends
        **skipped** with a warning, the rest of the chunk pending for a run with a higher budget.
    :param budget_tokens: the same for input + output tokens.
    :param poll_interval: seconds between two polls of the open batches (in the triggerer, or in the
        worker with ``deferrable=False``).
    :param deferrable: wait for the batches in the triggerer (no worker slot held); ``False`` polls in
        the worker, sleeping ``poll_interval`` between polls.
    :param datagen_conn_id: connection of type ``datagen``.
    """

    template_fields = ("pipeline", "experiment", "processor_version")
    _MAP_INDEX_TEMPLATE = "{{ task.chunk_label }}"

    @classmethod
    def partial(cls, **kwargs: Any) -> OperatorPartial:
        """``BaseOperator.partial`` with the chunk's key range as the map index label, arguments checked at parse.

        A mapped operator's ``__init__`` runs only on the worker: what can be checked now is checked now.
        """
        if kwargs.get("map_index_template") is None:
            kwargs["map_index_template"] = cls._MAP_INDEX_TEMPLATE
        if "process" in kwargs:
            check_batch_process(cls, kwargs["process"])
        if "poll_interval" in kwargs:
            kwargs["poll_interval"] = check_poll_interval(cls, kwargs["poll_interval"])
        if kwargs.get("retry") is not None:
            kwargs["retry"] = retry_dict(cls, kwargs["retry"])
        if kwargs.get("budget_usd") is not None or kwargs.get("budget_tokens") is not None:
            kwargs["budget_usd"], kwargs["budget_tokens"] = check_budget_arguments(
                cls,  # type: ignore[arg-type]  # the class names itself in the error, as an instance would
                kwargs.get("budget_usd"),
                kwargs.get("budget_tokens"),
            )
        return super().partial(**kwargs)

    def __init__(
        self,
        *,
        pipeline: str | None = None,
        experiment: str | DatagenExperiment,
        process: Any,
        processor_version: str | None = None,
        redo_completed: str | None = None,
        chunk: Mapping[str, Any] | None = None,
        source: Any = None,
        key_field: str = "id",
        retry: Any = None,
        budget_usd: float | None = None,
        budget_tokens: int | None = None,
        poll_interval: float = 60.0,
        deferrable: bool = True,
        datagen_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        processor_version = resolve_version(self, experiment, processor_version, None)
        if kwargs.get("map_index_template") is None:
            kwargs["map_index_template"] = self._MAP_INDEX_TEMPLATE
        super().__init__(pipeline=pipeline, experiment=experiment, datagen_conn_id=datagen_conn_id, **kwargs)
        self.process = check_batch_process(self, process)
        #: None: the chunk's (the plan's), or the step's version without a plan
        self.processor_version = processor_version
        self.redo_completed = None if redo_completed is None else check_redo_completed_argument(self, redo_completed)
        self.chunk = check_chunk_or_source(self, chunk, source)
        self.source = source
        self.key_field = key_field
        #: the retry policy in its dict form (what Airflow serialises), or None
        self.retry = retry_dict(self, retry)
        self.budget_usd, self.budget_tokens = check_budget_arguments(self, budget_usd, budget_tokens)
        self.poll_interval = check_poll_interval(self, poll_interval)
        if not isinstance(deferrable, bool):
            raise bad_argument(self, "deferrable", deferrable, "is not a bool", "give True or False")
        self.deferrable = deferrable
        #: (step, batch ids) of the batches this worker waits on now, for on_kill
        self._waiting: tuple[BatchStep, list[str]] | None = None

    # --- the rounds -----------------------------------------------------------------------------

    def execute(self, context: Context) -> dict[str, Any]:
        step = resolve_batch_step(self, self.process)  # before anything is read or written
        event_log = self.get_log()
        if self.budget_usd is not None or self.budget_tokens is not None:
            # recorded on the log as the map task records it: the UI shows it and the status sensor
            # reads a stop at it (BatchRun only checks it)
            event_log.set_budget(self.budget_usd, self.budget_tokens)
        epoch = event_log.next_epoch()
        self.log.info("writer %s epoch %d (try %d)", _writer_id(context), epoch, _try_number(context))
        return self._rounds(context, step, event_log, _Carry(epoch=epoch))

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """Resume after the trigger: record what ended, resubmit errored rows, defer again while any is open."""
        step = resolve_batch_step(self, self.process)
        resume = event.get("resume") or {}
        if event.get("status") != "ended":
            batch_id = event.get("batch_id")
            which = f"batch {batch_id}" if batch_id else "the batches " + ", ".join(resume.get("batches") or [])
            raise BatchAPIError(
                f"polling {which} from the triggerer failed: {event.get('message')}. The batch stays recorded as "
                f"open in {self.pipeline}/{self.experiment}'s submissions and runs on at the provider: fix the "
                f"cause (the connection {getattr(step, 'llm_conn_id', None) or 'pydanticai_default'!r}, the "
                "provider's availability) and clear this task instance; the rerun re-attaches to the open "
                "batches and submits nothing twice"
            )
        # The same epoch as before the deferral: resuming is the same task-instance try, not a new
        # attempt. A fresh epoch here would let a stale resumption (its trigger fired after the task was
        # cleared and retried) out-rank the newer try's writer and fence it; reusing this try's epoch
        # keeps the newer try in charge and fences the stale one instead.
        carry = _Carry(**resume)
        return self._rounds(context, step, self.get_log(), carry)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage (its provider installed): the chunk's source as an input, the experiment's log as the output."""
        return lineage.operator_lineage(self)

    def _rounds(self, context: Context, step: BatchStep, event_log: CheckpointLog, carry: _Carry) -> dict[str, Any]:
        """Rounds of the batch run until nothing is open (deferring in between when deferrable)."""
        spec = self.spec()
        # here, not in execute: a resumed task (execute_complete) is a new operator object
        lineage.record(self, inputs=[lineage.chunk_source(spec, self.source)], outputs=[event_log.uri])
        items, key_field, processor_version = self._items(spec, step)
        redo = spec.redo_completed if spec is not None else (self.redo_completed or "never")
        run = self._run(context, event_log, items, step, key_field, processor_version, carry.epoch, redo)
        run.submitted = dict(carry.submitted)
        if hasattr(run, "given_up"):
            run.given_up = set(carry.given_up)
        client = step.client()
        try:
            while True:
                still = run.advance(client)
                if not still:
                    break
                batch_ids = [s.batch_id for s in still if s.batch_id]
                self.log.info("%d items in %d open batches: %s", run.report.in_batch, len(still), batch_ids)
                if self.deferrable:
                    carry.add(run)
                    self.defer(
                        trigger=DatagenBatchTrigger(
                            batch_ids=batch_ids,
                            provider=client.provider,
                            llm_conn_id=getattr(step, "llm_conn_id", None),
                            # only what llm_batch was given itself: a connection's key is read on the triggerer
                            base_url=getattr(step, "base_url", None),
                            api_key=getattr(step, "api_key", None),
                            poll_interval=self.poll_interval,
                            resume=asdict(carry),
                        ),
                        method_name="execute_complete",
                    )
                self._waiting = (step, batch_ids)
                while not run.poll(client, still):
                    time.sleep(self.poll_interval)
                self._waiting = None
        finally:
            client.close()
        carry.add(run)
        return self._finish(context, event_log, run, carry, len(items))

    def _run(
        self,
        context: Context,
        event_log: CheckpointLog,
        items: list[Any],
        step: BatchStep,
        key_field: str,
        processor_version: str,
        epoch: int,
        redo_completed: str,
    ) -> BatchRun:
        # Deferred: core imports Lance, which DAG parsing must not pay for.
        from airflow_provider_datagen.core.batch import BatchConfig, BatchRun
        from airflow_provider_datagen.core.retry import RetryPolicy

        writer_id = _writer_id(context)
        run = BatchRun(
            event_log,
            items,
            step,
            BatchConfig(
                processor_version=processor_version,
                writer_id=writer_id,
                epoch=epoch,
                key_field=key_field,
                retry=RetryPolicy.from_dict(self.retry) if self.retry is not None else None,
                budget_usd=self.budget_usd,
                budget_tokens=self.budget_tokens,
                # the task instance in every event, as the map task's (the failure lens shows them)
                airflow=_coords(context),
                redo_completed=redo_completed,
            ),
        )
        return run

    def _items(self, spec: ChunkSpec | None, step: BatchStep) -> tuple[list[Any], str, str]:
        """The items of this chunk (or of the whole source), their key field and the processor version."""
        # Deferred: core imports Lance, which DAG parsing must not pay for.
        from airflow_provider_datagen.core import load_source
        from airflow_provider_datagen.core.chunks import chunk_items

        storage_options = self.hook.storage_options or None
        if spec is None:
            version = step.version if self.processor_version is None else self.processor_version
            return load_source(self.source, self.key_field, storage_options=storage_options), self.key_field, version
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
            storage_options=storage_options,
        )
        return items, spec.key_field, spec.processor_version

    def _finish(
        self, context: Context, event_log: CheckpointLog, run: BatchRun, carry: _Carry, total: int
    ) -> dict[str, Any]:
        """End the task as the map task ends: its report, the status XCom, failed or skipped at a budget stop."""
        result = carry.result()
        self.log.info("chunk done: %s", result)
        ti = context["ti"]
        self.push_status(context, folded_status(event_log))
        if carry.failed:
            ti.xcom_push(key=REPORT_XCOM_KEY, value=result)
            shown = ", ".join(repr(i) for i in carry.failed_ids)
            more = f" and {carry.failed - len(carry.failed_ids)} more" if carry.failed > len(carry.failed_ids) else ""
            raise ItemsFailedError(
                f"{carry.failed} of {total} items failed in this chunk: {shown}{more} (first error: "
                f"{carry.first_error[:300]}). They are recorded in the log's failure lens; {carry.processed} items "
                "were acknowledged. Clear this task instance to resubmit only the pending items."
            )
        if run.report.stopped_by_budget:
            self.log.warning("chunk stopped by the experiment's budget: %s", result)
            ti.xcom_push(key=REPORT_XCOM_KEY, value={**result, "stopped_by_budget": True})
            # Skipped, not failed, as the map task: nothing went wrong and no item is marked failed.
            raise AirflowSkipException(
                f"stopped by the budget (budget_usd={self.budget_usd}, budget_tokens={self.budget_tokens}): "
                f"{carry.processed} items were acknowledged, every submitted batch was recorded, and the rest of "
                "this chunk stays pending. Raise the budget and rerun to continue where it stopped."
            )
        return result

    def on_kill(self) -> None:
        """Cancel the batches this worker is waiting on (their finished rows stay readable for a rerun)."""
        waiting = self._waiting
        if waiting is None:
            return
        step, batch_ids = waiting
        client: BatchClient = step.client()
        try:
            cancel_each(client, batch_ids, why="the task was killed", log=self.log)
        finally:
            client.close()


def _try_number(context: Context) -> int:
    return int(getattr(context["ti"], "try_number", 1) or 1)


def _writer_id(context: Context) -> str:
    ti = context["ti"]
    return f"{ti.dag_id}/{ti.run_id}/{ti.task_id}/{getattr(ti, 'map_index', -1)}"


def _coords(context: Context) -> dict[str, Any]:
    ti = context["ti"]
    return {
        "dag_id": ti.dag_id,
        "run_id": ti.run_id,
        "task_id": ti.task_id,
        "map_index": getattr(ti, "map_index", -1),
        "try_number": _try_number(context),
    }
