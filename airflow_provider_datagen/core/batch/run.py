"""Pending items through a provider's batch API, recorded per item exactly once: :class:`BatchRun`, :func:`run_batch`.

A round (:meth:`BatchRun.advance`) does, in order:

1. every open submission of these items moves on: one without a batch id (a crash inside the provider's
   create) is re-attached by the key its batch carries in its metadata, or submitted again where the
   provider keeps none; a running one is polled; an ended one has its rows recorded in the log;
2. the items still pending (not done, not in an open batch, attempts left) are submitted, split at the
   provider's limits and the step's, unless the budget is reached. Each submission has a key of its own
   (recorded before the provider is asked); a batch the provider refuses at create (its input) is
   closed as failed, each row a failed attempt, as a batch the provider fails whole.

A row that succeeded completes its item with its fields and usage in one checkpoint, priced at the batch
price; a row that errored, expired or was cancelled is a FAILED row of that attempt (transient while
attempts are left: it is resubmitted alone, with the next attempt's ``custom_id``); a row whose answer
does not validate fails its item. Recording is idempotent: a row whose attempt the log already holds is
skipped, so a crash while recording re-reads the results and records only the rest.

:func:`run_batch` repeats rounds, sleeping ``poll_interval`` between polls, until nothing is open; the
Airflow operator runs one round per task resumption and polls from the triggerer instead.
"""

from __future__ import annotations

import json
import logging
import math
import time
from typing import TYPE_CHECKING, Any

from airflow_provider_datagen.core.batch.config import BatchConfig
from airflow_provider_datagen.core.batch.ids import base_of, custom_id, submission_key
from airflow_provider_datagen.core.batch.protocol import BatchInfo
from airflow_provider_datagen.core.batch.record import DONE, Recording
from airflow_provider_datagen.core.batch.report import BatchReport
from airflow_provider_datagen.core.planner import REDO_NEVER, as_source
from airflow_provider_datagen.core.response_session import ResponseSession
from airflow_provider_datagen.core.schema import ItemStatus
from airflow_provider_datagen.core.store import batches
from airflow_provider_datagen.exceptions import (
    BatchAPIError,
    ConfigurationError,
    DatagenError,
    bad_argument,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    from airflow_provider_datagen.core.batch.protocol import BatchClient, BatchStep, RequestLine
    from airflow_provider_datagen.core.retry import RetryPolicy
    from airflow_provider_datagen.core.sources import SourceItem
    from airflow_provider_datagen.core.store.log import CheckpointLog
    from airflow_provider_datagen.core.store.writer import LogWriter

logger = logging.getLogger(__name__)

#: metadata keys a submitted batch carries (OpenAI keeps them; :meth:`BatchClient.find` matches them)
SUBMISSION_KEY = "datagen_submission"
EXPERIMENT_KEY = "datagen_experiment"


class BatchRun(Recording):
    """The batch run of ``items`` through ``step`` into ``log`` at ``(writer_id, epoch)``; see the module doc.

    ``config`` (:class:`~airflow_provider_datagen.core.batch.config.BatchConfig`) holds the run's checked
    keyword arguments: the writer, the processor version, retries, the budget, ``redo_completed``.
    """

    def __init__(self, log: CheckpointLog, items: Iterable[Any], step: BatchStep, config: BatchConfig) -> None:
        self.config = config
        #: submissions of one item per run (Recording reads it too)
        self.max_attempts = config.max_attempts
        self.log = log
        self.step = step
        # run_items's items: dicts, or the SourceItems a plan's chunk gives (core/chunks.chunk_items)
        self.items: list[SourceItem] = as_source(items, config.key_field)
        self.by_id = {it.item_id: it for it in self.items}
        self.by_base = {base_of(custom_id(it.item_id, it.fingerprint, 0)): it for it in self.items}
        self.writer: LogWriter = log.writer(
            config.writer_id, config.epoch, processor_version=config.processor_version, airflow=config.airflow
        )
        self.report = BatchReport()
        #: submissions this run made per item (a row that did not succeed counts; a prompt error too)
        self.submitted: dict[str, int] = {}
        #: by the row's (model, input tokens, output tokens)
        self._usage_entries: dict[tuple[str | None, int, int], tuple[list[dict[str, Any]], str]] = {}
        #: items that failed for good in this run (attempts spent, an invalid answer, a prompt that cannot
        #: render): never submitted again by this run (a rerun resubmits them)
        self.given_up: set[str] = set()
        #: the report's processed and skipped items, for membership tests
        self._reported: set[str] = set()
        #: submissions still open for another chunk's items after this run recorded its own rows of them
        self._recorded_here: set[str] = set()
        #: items whose current generation (ITEM_CREATED) this run committed
        self._created_here: set[str] = set()
        #: field names of answers already checked, and each one's ``what`` for encode_value's errors
        self._field_what: dict[str, str] = {}
        #: the response store (a step that uses it): opened now, so a bad one fails before any write
        self.responses = ResponseSession.for_log(log) if getattr(step, "uses_response_store", False) else None

    # --- one round --------------------------------------------------------------------------------

    def advance(self, client: BatchClient) -> list[batches.Submission]:
        """One round (see the module doc); the submissions of these items still open after it."""
        for sub in self._ours(batches.open_submissions(self.log)):
            self._move_on(client, sub)
        while self._submit_pending(client):
            pass  # a batch the provider refused: its rows, attempts left, go in the next one
        still = self._ours(batches.open_submissions(self.log))
        self.report.in_batch = sum(len(s.item_ids) for s in still)
        return still

    def poll(self, client: BatchClient, subs: Sequence[batches.Submission]) -> bool:
        """Poll ``subs`` once, recording those that ended; whether every one has ended (or closed)."""
        done = True
        for sub in subs:
            if sub.kind in (batches.ENDED, *batches.CLOSED):
                continue
            if sub.batch_id is None or not self._poll_one(client, sub):
                done = False
        return done

    def _ours(self, subs: Iterable[batches.Submission]) -> list[batches.Submission]:
        """The open submissions holding items of this run, but those whose rows of them it has recorded."""
        return [
            s for s in subs if s.submission_key not in self._recorded_here and any(i in self.by_id for i in s.item_ids)
        ]

    def _move_on(self, client: BatchClient, sub: batches.Submission) -> None:
        if sub.batch_id is None:
            self._reattach_or_resubmit(client, sub)
            return
        if sub.batch_id not in self.report.batches:
            self.report.batches.append(sub.batch_id)
        if sub.kind != batches.ENDED and not self._poll_one(client, sub):
            return
        if sub.kind == batches.ENDED:
            self._record(client, sub)

    def _poll_one(self, client: BatchClient, sub: batches.Submission) -> bool:
        """Retrieve ``sub``'s batch; record an end (or the provider's failure of it). Whether it ended."""
        assert sub.batch_id is not None
        try:
            info = client.retrieve(sub.batch_id)
        except BatchAPIError as exc:
            if getattr(exc.__cause__, "status_code", None) != 404:
                raise
            # the provider no longer knows the batch (deleted, or past its retention): nothing of it will
            # come back, so it ends as failed whole, its rows failed attempts resubmitted while attempts are
            # left (else every run would ask for it again and raise)
            info = BatchInfo(sub.batch_id, "failed", "not_found", {}, f"the provider no longer knows it ({exc})")
        if info.state == "in_progress":
            return False
        kind = batches.ENDED if info.state == "ended" else batches.FAILED
        batches.append(
            self.log,
            [self._row(sub, kind, status=info.status, counts_json=json.dumps(dict(info.counts), sort_keys=True))],
        )
        sub.kind, sub.status, sub.counts = kind, info.status, dict(info.counts)
        if kind == batches.FAILED:
            # the provider ran none of its rows: each is a failed attempt of its item (resubmitted if
            # attempts are left), as an errored row would be
            logger.warning("batch %s failed at the provider: %s", sub.batch_id, info.error)
            self._fail_rows(sub, sub.custom_ids, f"the provider failed the whole batch: {info.error}")
        return True

    def _reattach_or_resubmit(self, client: BatchClient, sub: batches.Submission) -> None:
        found = None
        if client.supports_metadata:
            found = client.find({SUBMISSION_KEY: sub.submission_key}, created_after=sub.intent_at)
        if found is not None:
            logger.info(
                "re-attached to batch %s of submission %s (its create was not recorded)", found, sub.submission_key
            )
            batch_id = found
        else:
            lines = [self._line(cid) for cid in sub.custom_ids]
            try:
                batch_id = client.submit(
                    [ln for ln in lines if ln is not None], metadata=self._metadata(sub.submission_key)
                )
            except BatchAPIError as exc:
                if not _refused_input(exc):
                    raise
                self._refused(sub, exc)
                return
        batches.append(self.log, [self._row(sub, batches.SUBMITTED, batch_id=batch_id)])
        sub.batch_id, sub.kind = batch_id, batches.SUBMITTED
        self.report.batches.append(batch_id)

    def _refused(self, sub: batches.Submission, exc: BatchAPIError) -> None:
        """The provider refused the batch's input at create (Anthropic validates there): closed as failed,
        each row a failed attempt of its item (resubmitted while attempts are left), not an open intent
        every later run would submit again and see refused again."""
        logger.warning("the provider refused submission %s: %s", sub.submission_key, exc)
        batches.append(self.log, [self._row(sub, batches.FAILED, status="refused")])
        sub.kind, sub.status = batches.FAILED, "refused"
        self._fail_rows(sub, sub.custom_ids, f"the provider refused the batch: {exc}")

    def _line(self, cid: str) -> RequestLine | None:
        item = self.by_base.get(base_of(cid))
        if item is None:
            return None
        return self.step.request(item.data, item.item_id, cid)

    # --- recording results ------------------------------------------------------------------------

    # --- submitting -------------------------------------------------------------------------------

    def _submit_pending(self, client: BatchClient) -> bool:
        """Submit the pending items; whether the provider refused a batch of them (they may be pending again)."""
        open_ids = {i for s in self._ours(batches.open_submissions(self.log)) for i in s.item_ids}
        # items this run recorded or skipped as done, failed for good, or still in a batch need no state:
        # after the recording of a whole chunk, none is read
        settled = open_ids.union(self._reported, self.given_up)
        candidates = [it for it in self.items if it.item_id not in settled]
        states = self._states([it.item_id for it in candidates]) if candidates else {}
        todo: list[tuple[SourceItem, int, bool]] = []  # (item, attempt, new generation)
        for it in candidates:
            state = states.get(it.item_id)
            same = state is not None and state.input_fingerprint == it.fingerprint
            if (
                same
                and state is not None
                and state.status in DONE
                and not (self.config.redo_other and state.processor_version != self.config.processor_version)
            ):
                if it.item_id not in self._reported:
                    self.report.skipped.append(it.item_id)
                    self._reported.add(it.item_id)
                continue
            if it.item_id in self.given_up or self.submitted.get(it.item_id, 0) >= self.max_attempts:
                continue  # failed this run: a rerun resubmits it
            fresh = not (
                same
                and state is not None
                and state.status == ItemStatus.RUNNING.value
                and state.processor_version == self.config.processor_version
            )
            attempt = 1 if fresh or state is None else state.attempts + 1
            todo.append((it, attempt, fresh))
        if not todo:
            return False
        todo = todo[: self._affordable(len(todo))]
        if not todo:
            return False
        lines: list[tuple[SourceItem, RequestLine, bool]] = []
        with self.writer.batch() as b:
            for it, attempt, fresh in todo:
                cid = custom_id(it.item_id, it.fingerprint, attempt)
                if fresh:
                    b.item_created(
                        it.item_id, input_fingerprint=it.fingerprint, processor_version=self.config.processor_version
                    )
                self.submitted[it.item_id] = self.submitted.get(it.item_id, 0) + 1
                try:
                    line = self.step.request(it.data, it.item_id, cid)
                except DatagenError as exc:  # a prompt the item cannot render: it fails alone, never sent
                    b.failed(it.item_id, error=exc, step=self.step.step_name, attempt=attempt)
                    self._give_up(it.item_id, exc)
                    continue
                lines.append((it, line, fresh))
        self._created_here.update(it.item_id for it, _, fresh in todo if fresh)
        if lines and self.responses is not None and getattr(self.step, "reuse", False):
            lines = self._answer_from_store(lines)  # the stored ones are recorded now, never submitted
        refused = False
        for group in self._split(client, lines):
            refused = not self._submit(client, group) or refused
        return refused

    def _split(
        self, client: BatchClient, lines: list[tuple[SourceItem, RequestLine, bool]]
    ) -> list[list[tuple[SourceItem, RequestLine, bool]]]:
        step = self.step
        max_n = min(client.max_requests, step.max_requests_per_batch or client.max_requests)
        max_b = min(client.max_bytes, step.max_bytes_per_batch or client.max_bytes)
        groups: list[list[tuple[SourceItem, RequestLine, bool]]] = []
        cur: list[tuple[SourceItem, RequestLine, bool]] = []
        size = 0
        for entry in lines:
            n = client.line_bytes(entry[1])
            if n > max_b:
                raise ConfigurationError(
                    f"the batch request of item {entry[0].item_id!r} is {n:,} bytes, above the most one batch may "
                    f"hold ({max_b:,} bytes, max_bytes_per_batch or the provider's limit); shorten its prompt "
                    "or raise max_bytes_per_batch"
                )
            if cur and (len(cur) >= max_n or size + n > max_b):
                groups.append(cur)
                cur, size = [], 0
            cur.append(entry)
            size += n
        if cur:
            groups.append(cur)
        return groups

    def _submit(self, client: BatchClient, group: list[tuple[SourceItem, RequestLine, bool]]) -> bool:
        """Submit one batch of ``group``; False when the provider refused it (its rows failed)."""
        cids = [line.custom_id for _, line, _ in group]
        key = submission_key(self.log.uri, cids)
        sub = batches.Submission(
            key, provider=client.provider, custom_ids=cids, item_ids=[it.item_id for it, _, _ in group]
        )
        batches.append(self.log, [self._row(sub, batches.INTENT, custom_ids=cids, item_ids=sub.item_ids)])
        try:
            batch_id = client.submit([line for _, line, _ in group], metadata=self._metadata(key))
        except BatchAPIError as exc:
            if not _refused_input(exc):
                raise
            self._refused(sub, exc)
            return False
        batches.append(self.log, [self._row(sub, batches.SUBMITTED, batch_id=batch_id)])
        self.report.batches.append(batch_id)
        logger.info("submitted batch %s: %d requests (submission %s)", batch_id, len(cids), key)
        return True

    def _affordable(self, wanted: int) -> int:
        """How many of ``wanted`` items the budget lets one submission hold (all without a budget)."""
        if self.config.budget_usd is None and self.config.budget_tokens is None:
            return wanted
        nanos, tokens = self.log.usage_spend()
        spent_usd = nanos / 1e9
        if (self.config.budget_usd is not None and spent_usd >= self.config.budget_usd) or (
            self.config.budget_tokens is not None and tokens >= self.config.budget_tokens
        ):
            self.report.stopped_by_budget = True
            logger.warning(
                "the budget is reached (%.6f USD, %d tokens spent): nothing more is submitted", spent_usd, tokens
            )
            return 0
        done = self.log.summary().get("completed", 0)
        if not done:
            return wanted  # nothing known yet of what an item costs
        cap = wanted
        if self.config.budget_usd is not None and spent_usd > 0:
            cap = min(cap, math.floor((self.config.budget_usd - spent_usd) / (spent_usd / done)))
        if self.config.budget_tokens is not None and tokens > 0:
            cap = min(cap, math.floor((self.config.budget_tokens - tokens) / (tokens / done)))
        if cap < wanted:
            self.report.stopped_by_budget = cap == 0
            logger.info(
                "the budget covers %d more items at the mean cost so far; submitting %d of %d", cap, cap, wanted
            )
        return max(cap, 0)

    def _metadata(self, key: str) -> dict[str, str]:
        return {SUBMISSION_KEY: key, EXPERIMENT_KEY: f"{self.log.pipeline}/{self.log.experiment}"[:512]}

    def _row(self, sub: batches.Submission, kind: str, **extra: Any) -> dict[str, Any]:
        return {
            "submission_key": sub.submission_key,
            "kind": kind,
            "provider": sub.provider,
            "batch_id": extra.pop("batch_id", sub.batch_id),
            "writer_id": self.writer.writer_id,
            "writer_epoch": self.writer.epoch,
            **extra,
        }


def _refused_input(exc: BatchAPIError) -> bool:
    """Whether the provider refused what the batch holds (HTTP 400, 413, 422), rather than the call
    itself (a bad key, a missing permission): those fail the rows; the others end the run."""
    return getattr(exc.__cause__, "status_code", None) in (400, 413, 422)


def run_batch(
    log: CheckpointLog,
    items: Iterable[Any],
    step: BatchStep,
    *,
    processor_version: str,
    writer_id: str,
    epoch: int,
    poll_interval: float = 60,
    retry: RetryPolicy | None = None,
    budget_usd: float | None = None,
    budget_tokens: int | None = None,
    key_field: str = "id",
    redo_completed: str = REDO_NEVER,
    sleep: Callable[[float], None] = time.sleep,
) -> BatchReport:
    """Submit the pending ``items`` through ``step``'s batch API, poll, record each result; a :class:`BatchReport`.

    Takes the same ``items`` as ``run_items`` and skips what the log says is done; rounds of
    :class:`BatchRun` repeat until no submission of these items is open (errored, expired and cancelled
    rows are resubmitted alone up to ``retry.attempts`` submissions per item). ``poll_interval``: seconds
    between polls of the open batches. The report's ``batches`` lists every batch submitted or re-attached
    to; ``stopped_by_budget`` says the budget held items back (they stay pending). ``redo_completed``:
    as :class:`BatchRun`'s (and ``run_items``').
    """
    if isinstance(poll_interval, bool) or not isinstance(poll_interval, (int, float)) or poll_interval < 0:
        raise bad_argument("run_batch", "poll_interval", poll_interval, "is not a number of seconds >= 0", "e.g. 60")
    config = BatchConfig(
        processor_version=processor_version,
        writer_id=writer_id,
        epoch=epoch,
        key_field=key_field,
        retry=retry,
        budget_usd=budget_usd,
        budget_tokens=budget_tokens,
        redo_completed=redo_completed,
    )
    run = BatchRun(log, items, step, config)
    client = step.client()
    try:
        while True:
            still = run.advance(client)
            if not still:
                break
            while not run.poll(client, still):
                sleep(poll_interval)
    finally:
        client.close()
        if run.responses is not None:
            run.responses.close()
    run.report.in_batch = 0
    run.report.events = run.writer.events_written
    return run.report
