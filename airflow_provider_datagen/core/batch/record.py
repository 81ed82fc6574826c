"""Recording a batch's results in the log, each row once: the part of :class:`~.run.BatchRun` that reads rows.

A row that succeeded completes its item with its fields and usage in one checkpoint, priced at the batch
price; thousands of them are committed column by column (``LogWriter.commit_completions``). A row that
errored, expired or was cancelled is a FAILED row of that attempt (transient while attempts are left, so
the next round resubmits it); a row whose answer does not validate fails its item. A row whose attempt
the log already holds is skipped, so a crash while recording re-reads the results and records the rest.
"""

from __future__ import annotations

import gc
import itertools
import json
from typing import TYPE_CHECKING, Any, NamedTuple

import orjson
import pyarrow.compute as pc

from airflow_provider_datagen.core.batch.ids import attempt_of, base_of, custom_id
from airflow_provider_datagen.core.events import EncodedValue, canonical_json, digest, encode_value
from airflow_provider_datagen.core.ids import check_field_name
from airflow_provider_datagen.core.ledger.pricing import price_usd
from airflow_provider_datagen.core.ledger.records import attempt_entries, reused_record, usage_record
from airflow_provider_datagen.core.schema import DEFAULT_BLOB_THRESHOLD, VALUE_KIND_JSON, ItemStatus
from airflow_provider_datagen.core.store import batches
from airflow_provider_datagen.exceptions import BatchRowError, DatagenError, OutputValidationError

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from airflow_provider_datagen.core.batch.protocol import BatchClient, BatchStep, RowResult
    from airflow_provider_datagen.core.batch.report import BatchReport
    from airflow_provider_datagen.core.response_session import ResponseSession
    from airflow_provider_datagen.core.sources import SourceItem
    from airflow_provider_datagen.core.store.completions import Completion
    from airflow_provider_datagen.core.store.log import CheckpointLog
    from airflow_provider_datagen.core.store.responses import ResponseEntry
    from airflow_provider_datagen.core.store.writer import LogWriter

#: The share of the online price a batch request costs (OpenAI's Batch API and Anthropic's Message
#: Batches both bill 50%); genai-prices' table has no batch prices.
BATCH_PRICE_FACTOR = 0.5
#: Distinct (model, input tokens, output tokens) whose usage entries a run keeps shaped.
USAGE_CACHE_ENTRIES = 65_536
#: Items recorded per log commit while reading a batch's results.
RECORD_COMMIT_ITEMS = 20_000
DONE = (ItemStatus.COMPLETED.value, ItemStatus.FILTERED.value)


class _Seen(NamedTuple):
    """What a round needs of an item's state in the log (an :class:`ItemState` costs ~2 us more to build)."""

    status: str
    input_fingerprint: str | None
    processor_version: str | None
    #: failed and retried attempts of its running generation (0 where none is recorded)
    attempts: int


class Recording:
    """The recording half of :class:`~.run.BatchRun` (which sets these attributes up)."""

    log: CheckpointLog
    step: BatchStep
    writer: LogWriter
    report: BatchReport
    max_attempts: int
    by_id: dict[str, SourceItem]
    by_base: dict[str, SourceItem]
    submitted: dict[str, int]
    given_up: set[str]
    _reported: set[str]
    _recorded_here: set[str]
    _created_here: set[str]
    _field_what: dict[str, str]
    _usage_entries: dict[tuple[str | None, int, int], tuple[list[dict[str, Any]], str]]
    responses: ResponseSession | None

    def _row(self, sub: batches.Submission, kind: str, **extra: Any) -> dict[str, Any]:
        raise NotImplementedError  # BatchRun's

    def _record(self, client: BatchClient, sub: batches.Submission) -> None:
        # As run_items does: the collector's generation-2 passes would walk the chunk's items (alive all
        # along) again and again while the rows' objects are made; frozen, it looks at those alone.
        gc.freeze()
        try:
            self._record_rows(client, sub)
        finally:
            gc.unfreeze()

    def _record_rows(self, client: BatchClient, sub: batches.Submission) -> None:
        assert sub.batch_id is not None
        by_base = self.by_base
        wanted = {cid: item for cid in sub.custom_ids if (item := by_base.get(base_of(cid))) is not None}
        # an item whose generation this run created holds only the outcomes this run recorded (each
        # submission once): only the others (submitted before a crash or a deferral) need their states read
        earlier = [it.item_id for it in wanted.values() if it.item_id not in self._created_here]
        states = self._states(earlier) if earlier else {}
        seen: set[str] = set()
        pending: list[tuple[SourceItem, int, RowResult]] = []  # (item, attempt, row)
        for row in client.results(sub.batch_id):
            item = wanted.get(row.custom_id)
            if item is None or row.custom_id in seen:
                continue  # a row of another chunk's item, or a duplicate line
            seen.add(row.custom_id)
            attempt = attempt_of(row.custom_id)
            if not _recorded(states.get(item.item_id), item, attempt):
                pending.append((item, attempt, row))
            if len(pending) >= RECORD_COMMIT_ITEMS:
                self._commit_rows(sub, pending)
                pending = []
        self._commit_rows(sub, pending)
        self.writer.sync()  # every row's events have landed before anything else is read or written
        missing = [
            cid
            for cid in wanted
            if cid not in seen and not _recorded(states.get(wanted[cid].item_id), wanted[cid], attempt_of(cid))
        ]
        if missing:
            self._fail_rows(sub, missing, "the batch's results hold no row for it")
        if self._others_unsettled(sub):
            # items of another chunk (the plan's chunking changed since the submission): their rows are
            # theirs to record, so the submission stays open for their run instead of being closed with
            # their rows dropped (they would be submitted and paid for again)
            self._recorded_here.add(sub.submission_key)
            return
        batches.append(self.log, [self._row(sub, batches.RECORDED)])
        sub.kind = batches.RECORDED

    def _others_unsettled(self, sub: batches.Submission) -> bool:
        """Whether an item of ``sub`` outside this run's items still waits for its row to be recorded."""
        others = [(iid, cid) for iid, cid in zip(sub.item_ids, sub.custom_ids, strict=True) if iid not in self.by_id]
        if not others:
            return False
        states = self._states(list(dict.fromkeys(iid for iid, _ in others)))
        for iid, cid in others:
            state = states.get(iid)
            if state is None or state.status != ItemStatus.RUNNING.value or state.input_fingerprint is None:
                continue  # done, released, or never created: nothing of it waits
            if base_of(custom_id(iid, state.input_fingerprint, 0)) != base_of(cid):
                continue  # its input changed since: the row is of an older generation
            if state.attempts < attempt_of(cid):
                return True
        return False

    def _answer_from_store(self, lines: list[tuple[SourceItem, Any, bool]]) -> list[tuple[SourceItem, Any, bool]]:
        """Record the items whose request's key is in the response store from it; the lines left to submit."""
        assert self.responses is not None
        step: Any = self.step
        keys = {line.custom_id: step.key(it.data, it.item_id) for it, line, _ in lines}
        found = self.responses.store.get_many(list(dict.fromkeys(keys.values())), request_json=False, provenance=False)
        if not found:
            return lines
        reused: dict[str, Any] = {}
        rows: list[tuple[SourceItem, int, RowResult]] = []
        for it, line, _ in lines:
            entry = found.get(keys[line.custom_id])
            if entry is not None:
                reused[line.custom_id] = entry
                rows.append((it, attempt_of(line.custom_id), step.stored_row(entry.reply_json, line.custom_id)))
        self._commit_rows(None, rows, reused)
        self.writer.sync()
        return [entry for entry in lines if entry[1].custom_id not in reused]

    def _commit_rows(
        self,
        sub: batches.Submission | None,
        rows: list[tuple[SourceItem, int, RowResult]],
        reused: Mapping[str, Any] | None = None,
    ) -> None:
        """Record ``rows`` (of ``sub``, or, with ``reused``, read from the response store by custom_id)."""
        if not rows:
            return
        report = self.report
        step_name = self.step.step_name
        threshold = self.log.blob_threshold
        batch_id = sub.batch_id if sub is not None else None
        batch_json = canonical_json(batch_id or "")
        where_of = {"batch_id": batch_id or ""}
        store = self.responses
        field_what = self._field_what
        done: list[Completion] = []  # committed column by column (LogWriter.commit_completions)
        with self.writer.batch() as b:  # the rest: failed rows and answers that are not answers
            for item, attempt, row in rows:
                cid = row.custom_id
                if row.outcome != "succeeded":
                    err = BatchRowError(f"batch {batch_id}: row {cid} {row.outcome}: {row.error or 'no detail'}")
                    self._stage_failure(b, item, attempt, err, {**where_of, "custom_id": cid})
                    continue
                entry = reused.get(cid) if reused is not None else None
                usage, usage_json = self._usage(row) if entry is None else _reused_usage(entry)
                try:
                    fields = self.step.fields(row)
                    encoded = []
                    for name, value in fields.items():
                        what = field_what.get(name)
                        if what is None:  # an answer's keys become field names: one the log refuses fails
                            check_field_name(name, OutputValidationError, f"row {cid}'s answer gives")
                            what = field_what[name] = f"field {name!r} of a batch answer"
                        encoded.append((name, encode_value(value, blob_threshold=threshold, what=what)))
                except DatagenError as exc:
                    # paid for, but not an answer: the item fails with the usage it cost
                    b.failed(
                        item.item_id,
                        error=exc,
                        step=step_name,
                        attempt=attempt,
                        usage=usage,
                        batch={**where_of, "custom_id": cid},
                    )
                    self._give_up(item.item_id, exc)
                    continue
                if entry is not None:
                    done.append((item.item_id, encoded, encode_value({"attempt": attempt, "usage": usage})))
                    continue
                if store is not None and row.raw is not None:
                    response = self._response_entry(item, row, usage)
                    store.put(response)
                    usage_json = _keyed_json(usage_json, response.key)  # the item page's exchange
                done.append((item.item_id, encoded, _completed_value(attempt, batch_json, cid, usage_json)))
        if done and store is not None:
            store.flush()  # the rows' replies are in the response store before the rows are acknowledged
        if done:
            # pipelined: Lance writes this commit (without the GIL) while the next rows are read and laid out;
            # every read of the log, the next commit and the sync below wait for it
            self.writer.commit_completions(step_name, done, wait=False)
            for iid, _, _ in done:
                report.processed.append(iid)
                self._reported.add(iid)
        report.commits += 1

    def _usage(self, row: RowResult) -> tuple[list[dict[str, Any]], str]:
        """The usage entries of ``row``'s attempt and their canonical JSON text."""
        key = (row.model, row.input_tokens, row.output_tokens)
        cached = self._usage_entries.get(key)
        if cached is None:
            label = self.step.model_label(row)
            # rows repeat the same (model, tokens) often: checked, priced, shaped and encoded once (the
            # entries are only encoded into each row's JSON, never changed)
            online = price_usd(label, row.input_tokens, row.output_tokens)
            cost = None if online is None else online * BATCH_PRICE_FACTOR
            entries = attempt_entries([usage_record(label, row.input_tokens, row.output_tokens, cost, 1)])
            cached = (entries, canonical_json(entries, what=f"usage of row {row.custom_id}"))
            if len(self._usage_entries) < USAGE_CACHE_ENTRIES:
                self._usage_entries[key] = cached
        return cached

    def _response_entry(self, item: SourceItem, row: RowResult, usage: list[dict[str, Any]]) -> ResponseEntry:
        from airflow_provider_datagen.core.store.responses import ResponseEntry

        step: Any = self.step
        assert self.responses is not None and row.raw is not None
        request = step.llm_request(item.data, item.item_id)
        return ResponseEntry(
            key=request.key(),
            reply_json=row.raw,
            model=usage[0]["model"],
            input_tokens=row.input_tokens,
            output_tokens=row.output_tokens,
            cost_usd=usage[0]["cost_usd"],
            request_json=json.dumps(request.canonical(), sort_keys=True, default=str),
            pipeline=self.responses.pipeline,
            experiment=self.responses.experiment,
        )

    def _stage_failure(
        self, b: Any, item: SourceItem, attempt: int, err: BaseException, where: Mapping[str, str]
    ) -> None:
        # a row of a batch an earlier process submitted (re-attached, re-read) counts as this run's first
        # submission of the item: a resumed run spends no more than retry.attempts on it either
        transient = self.submitted.setdefault(item.item_id, 1) < self.max_attempts
        b.failed(
            item.item_id,
            error=err,
            step=self.step.step_name,
            attempt=attempt,
            transient=transient,
            batch=where,
        )
        if not transient:
            self._give_up(item.item_id, err)

    def _give_up(self, item_id: str, err: BaseException) -> None:
        """``item_id`` failed for good in this run: reported once, and not submitted again by it."""
        if item_id not in self.given_up:
            self.given_up.add(item_id)
            self.report.failed.append(item_id)
        self.report.errors[item_id] = f"{type(err).__name__}: {err}"

    def _fail_rows(self, sub: batches.Submission, cids: Iterable[str], why: str) -> None:
        with self.writer.batch() as b:
            for cid in cids:
                item = self.by_base.get(base_of(cid))
                if item is not None:
                    err = BatchRowError(f"batch {sub.batch_id}: row {cid}: {why}")
                    self._stage_failure(
                        b, item, attempt_of(cid), err, {"batch_id": sub.batch_id or "", "custom_id": cid}
                    )

    def _states(self, ids: list[str]) -> dict[str, _Seen]:
        """What the log holds of ``ids``, from the vectorized fold; folded one by one (for their failed and
        retried attempts) only where the generation holds more than its ITEM_CREATED and has not ended.

        A round reads the states of every item of the chunk twice; the reference fold of each costs ~100 us,
        and in the common rounds (a fresh submission, the first recording of its results) no item needs it.
        """
        table = self.log.states_of(ids)
        running = pc.equal(table["status"], ItemStatus.RUNNING.value)
        created_alone = pc.equal(table["created_seq"], table["last_seq"])
        deep_mask = pc.and_(running, pc.invert(created_alone))
        # a generation that holds its ITEM_CREATED alone (a submission's items): the writer learns its
        # cursor here, instead of folding each item again when the rows are committed
        created = table.filter(pc.and_(running, created_alone))
        if created.num_rows:
            self.writer.prime_created(
                *(created[c].to_pylist() for c in ("item_id", "last_seq", "input_fingerprint", "max_epoch"))
            )
        # attempts recorded in their generation: their count is needed
        deep = table.filter(deep_mask)["item_id"].to_pylist()
        plain = table.filter(pc.invert(deep_mask))
        out = dict(
            zip(
                plain["item_id"].to_pylist(),
                map(
                    _Seen._make,
                    zip(
                        plain["status"].to_pylist(),
                        plain["input_fingerprint"].to_pylist(),
                        plain["processor_version"].to_pylist(),
                        itertools.repeat(0),
                    ),
                ),
                strict=True,
            )
        )
        for iid, st in self.log.item_states(deep).items() if deep else ():
            out[iid] = _Seen(st.status.value, st.input_fingerprint, st.processor_version, st.failures + st.retries)
        return out


def _completed_value(attempt: int, batch_json: str, cid: str, usage_json: str) -> EncodedValue:
    """The STEP_COMPLETED value of a batch row, ``{"attempt", "batch": True, "batch_id", "custom_id", "usage"}``,
    encoded: its canonical text put together from the parts' (sorted keys; equal to ``encode_value`` of
    the dict, tests/core/batch/test_record.py), which is most of what encoding it cost per row. ``cid`` is
    one of :func:`custom_id`'s (hex digits, ``-`` and digits): its JSON text is itself in quotes."""
    text = f'{{"attempt":{attempt},"batch":true,"batch_id":{batch_json},"custom_id":"{cid}","usage":{usage_json}}}'
    raw = text.encode("utf-8")
    if len(raw) > DEFAULT_BLOB_THRESHOLD:  # a usage list that long is stored as encode_value stores it
        return encode_value(orjson.loads(raw))
    return EncodedValue(VALUE_KIND_JSON, text, None, len(raw), digest(raw))


def _keyed_json(usage_json: str, key: str) -> str:
    """One sent entry's canonical JSON (:meth:`Recording._usage`, shared by rows of equal usage) with
    the row's ``"request_keys": [key]`` in its sorted place, after ``output_tokens`` (always followed
    by ``unpriced_calls``; the pattern cannot occur inside a string, whose quotes are escaped)."""
    at = usage_json.index('"output_tokens":')
    end = usage_json.index(",", at)
    return f'{usage_json[:end]},"request_keys":["{key}"]{usage_json[end:]}'


def _reused_usage(entry: Any) -> tuple[list[dict[str, Any]], str]:
    """The usage entries (and their JSON) of an answer read from the response store, with its key."""
    record = reused_record(entry.model, entry.input_tokens, entry.output_tokens, entry.cost_usd, entry.key)
    entries = attempt_entries([record])
    return entries, canonical_json(entries, what="usage of a reused answer")


def _recorded(state: _Seen | None, item: SourceItem, attempt: int) -> bool:
    """Whether the log already holds the outcome of ``item``'s ``attempt`` (a row recorded before a crash)."""
    if state is None or state.input_fingerprint != item.fingerprint:
        return False
    return state.status in DONE or state.attempts >= attempt
