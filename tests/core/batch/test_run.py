"""``run_batch`` against the in-process fake batch server (dev/batch_server.py): each item recorded exactly once.

Every test drives the real clients (the official SDKs over HTTP on 127.0.0.1) and the real log; what
the server saw (its ``requests_per_custom_id_base``, its batches) is the ground truth of what was paid.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

import pytest
from pydantic import BaseModel

from airflow_provider_datagen.core import RetryPolicy
from airflow_provider_datagen.core.batch import BatchConfig, BatchRun, custom_id, record, run
from airflow_provider_datagen.core.batch.ids import attempt_of
from airflow_provider_datagen.core.batch.record import BATCH_PRICE_FACTOR
from airflow_provider_datagen.core.batch.run import SUBMISSION_KEY
from airflow_provider_datagen.core.ledger.pricing import price_usd
from airflow_provider_datagen.core.schema import ItemStatus
from airflow_provider_datagen.core.store import batches
from airflow_provider_datagen.exceptions import ConfigurationError
from dev.batch_answers import usage as fake_usage
from dev.batch_server import FakeBatchServer, custom_id_base, serving
from tests.core.batch.helpers import (
    OPENAI_MODEL,
    anthropic_step,
    attempts,
    bases,
    make_items,
    openai_step,
)
from tests.core.batch.helpers import run as run_b

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from airflow_provider_datagen.core import CheckpointLog


@pytest.fixture
def fake() -> Iterator[FakeBatchServer]:
    with serving(complete_after_polls=2) as server:
        yield server


def _fields(log: CheckpointLog, ids: list[str]) -> dict[str, dict[str, Any]]:
    return {iid: st.fields for iid, st in log.item_states(ids).items()}


def _batch_price(model: str, input_tokens: int, output_tokens: int) -> float:
    online = price_usd(model, input_tokens, output_tokens)
    assert online is not None and online > 0
    return online * 0.5


def test_run_batch_is_exported_from_core_and_llm() -> None:
    from airflow_provider_datagen import core, llm

    assert core.run_batch is run.run_batch is llm.run_batch
    assert BATCH_PRICE_FACTOR == 0.5


def test_custom_id_is_deterministic_per_item_fingerprint_and_attempt() -> None:
    a1 = custom_id("item-1", "fp", 1)
    assert a1 == custom_id("item-1", "fp", 1)
    assert re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", a1)  # Anthropic's pattern (OpenAI takes any string)
    a2 = custom_id("item-1", "fp", 2)
    assert a2 != a1 and custom_id_base(a2) == custom_id_base(a1)
    assert (attempt_of(a1), attempt_of(a2)) == (1, 2)
    assert custom_id_base(custom_id("item-1", "fp2", 1)) != custom_id_base(a1)  # an edited input: a new base
    assert custom_id_base(custom_id("item-2", "fp", 1)) != custom_id_base(a1)


def test_openai_batch_records_each_item_once_and_a_rerun_submits_nothing(
    fake: FakeBatchServer, checkpoint_log: Callable[..., CheckpointLog]
) -> None:
    fake.shuffle_results = True  # rows come back in another order than submitted
    items = make_items(30)
    log = checkpoint_log()
    step = openai_step(fake.base_url)
    report = run_b(log, items, step)
    assert sorted(report.processed) == [it["id"] for it in items]
    assert report.failed == [] and report.skipped == [] and report.in_batch == 0
    assert report.batches == [fake.batches[0].id] and fake.creates == 1
    assert report.as_dict()["batches"] == report.batches
    # the server saw each item once, under the custom_id of its first attempt
    base = bases(items)
    assert fake.requests_per_custom_id_base == {b: 1 for b in base.values()}
    assert sorted(fake.batches[0].custom_ids) == sorted(f"{b}-1" for b in base.values())
    assert fake.batches[0].custom_ids != [
        row.custom_id for row in fake.result_order(fake.batches[0], fake.batches[0].rows)
    ]
    # results matched by custom_id whatever their order: each item has its own answer
    fields = _fields(log, [it["id"] for it in items])
    assert {iid: f["output"] for iid, f in fields.items()} == {it["id"]: f"echo: Say: {it['text']}" for it in items}
    assert all(st.status is ItemStatus.COMPLETED for st in log.item_states(list(fields)).values())
    # the submission is closed in the record beside the log
    (sub,) = batches.read(log).values()
    assert (sub.kind, sub.batch_id, sorted(sub.item_ids)) == (batches.RECORDED, report.batches[0], sorted(fields))
    assert batches.open_submissions(log) == []

    again = run_b(log, items, step)
    assert again.batches == [] and again.processed == [] and sorted(again.skipped) == sorted(fields)
    assert fake.creates == 1 and fake.requests_per_custom_id_base == {b: 1 for b in base.values()}


def test_each_result_is_priced_at_half_the_online_price_per_item_and_attempt(
    fake: FakeBatchServer, checkpoint_log: Callable[..., CheckpointLog]
) -> None:
    items = make_items(5)
    log = checkpoint_log()
    step = openai_step(fake.base_url)
    run_b(log, items, step)
    (batch,) = fake.batches
    total = 0.0
    for it in items:
        (entry,) = attempts(log, it["id"])
        row = next(r for r in batch.rows if custom_id_base(r.custom_id) == bases(items)[it["id"]])
        tokens_in, tokens_out = fake_usage(row.body, f"echo: Say: {it['text']}")
        cost = _batch_price(OPENAI_MODEL, tokens_in, tokens_out)
        assert entry["batch"] is True
        assert (entry["batch_id"], entry["custom_id"], entry["attempt"]) == (batch.id, row.custom_id, 1)
        assert (entry["model"], entry["input_tokens"], entry["output_tokens"]) == (OPENAI_MODEL, tokens_in, tokens_out)
        assert entry["cost_usd"] == pytest.approx(cost, rel=1e-9)
        total += cost
    usage = log.usage()
    assert usage["calls"] == 5
    assert usage["cost_usd"] == pytest.approx(total, rel=1e-9)


def test_errored_and_expired_rows_are_resubmitted_alone_as_a_new_attempt(
    fake: FakeBatchServer, checkpoint_log: Callable[..., CheckpointLog]
) -> None:
    items = make_items(2000)
    base = bases(items)
    ids = [it["id"] for it in items]
    errored = {base[i] for i in ids[::20]}  # 5%
    expired = {base[i] for i in ids[1::50]}  # 2%
    fake.errored = lambda cid: cid.endswith("-1") and custom_id_base(cid) in errored
    fake.expired = lambda cid: cid.endswith("-1") and custom_id_base(cid) in expired
    log = checkpoint_log()
    report = run_b(log, items, openai_step(fake.base_url), retry=RetryPolicy(attempts=2))
    assert report.failed == [] and len(report.processed) == 2000
    # exactly the errored and expired rows were asked twice: a second batch holding them alone
    resubmitted = errored | expired
    assert len(resubmitted) == 140
    assert fake.requests_per_custom_id_base == {b: 2 if b in resubmitted else 1 for b in base.values()}
    assert len(report.batches) == fake.creates == 2
    assert sorted(fake.batches[1].custom_ids) == sorted(f"{b}-2" for b in resubmitted)
    # each first attempt is a FAILED row marked transient, naming the batch, the row and its outcome
    by_base = {b: i for i, b in base.items()}
    for b in sorted(resubmitted)[:10]:
        (failure,) = log.failures(by_base[b])
        assert failure.transient is True and failure.error_type == "BatchRowError"
        outcome = "expired" if b in expired else "errored"
        assert f"batch {fake.batches[0].id}: row {b}-1 {outcome}: " in failure.message
        (entry,) = attempts(log, by_base[b])
        assert (entry["attempt"], entry["custom_id"], entry["batch_id"]) == (2, f"{b}-2", fake.batches[1].id)
    assert log.usage()["calls"] == 2000  # an unrun row costs nothing
    assert log.summary()["completed"] == 2000


def test_rows_failing_every_attempt_fail_their_items_and_a_rerun_resubmits_exactly_them(
    fake: FakeBatchServer, checkpoint_log: Callable[..., CheckpointLog]
) -> None:
    items = make_items(20)
    base = bases(items)
    doomed = {base["i00003"], base["i00011"]}
    fake.errored = lambda cid: custom_id_base(cid) in doomed
    log = checkpoint_log()
    step = openai_step(fake.base_url)
    report = run_b(log, items, step, retry=RetryPolicy(attempts=3))
    assert sorted(report.failed) == ["i00003", "i00011"] and len(report.processed) == 18
    assert report.errors["i00003"].startswith("BatchRowError: batch ")
    assert "server_error: fake row error" in report.errors["i00003"]
    assert [fake.requests_per_custom_id_base[b] for b in sorted(doomed)] == [3, 3]
    assert fake.creates == 3
    failures = log.failures("i00003")
    assert [f.transient for f in failures] == [True, True, False]
    assert [json.loads(json.dumps(f.error_type)) for f in failures] == ["BatchRowError"] * 3
    assert log.summary()["failed_item_ids"] == ["i00003", "i00011"]

    fake.errored = lambda cid: False
    again = run_b(log, items, step, retry=RetryPolicy(attempts=3))
    assert sorted(again.processed) == ["i00003", "i00011"] and len(again.skipped) == 18
    assert sorted(fake.batches[-1].custom_ids) == sorted(f"{b}-4" for b in doomed)  # the next attempt's ids
    assert fake.requests_per_custom_id_base == {b: 4 if b in doomed else 1 for b in base.values()}
    assert log.summary()["completed"] == 20


def test_without_a_retry_policy_an_errored_row_fails_at_once(
    fake: FakeBatchServer, checkpoint_log: Callable[..., CheckpointLog]
) -> None:
    items = make_items(4)
    fake.errored = lambda cid: custom_id_base(cid) == bases(items)["i00001"]
    log = checkpoint_log()
    report = run_b(log, items, openai_step(fake.base_url))
    assert report.failed == ["i00001"] and fake.creates == 1
    (failure,) = log.failures("i00001")
    assert failure.transient is False and failure.error_type == "BatchRowError"


class Answer(BaseModel):
    label: str
    score: int


def test_an_answer_that_does_not_validate_fails_its_item_with_output_validation_error(
    fake: FakeBatchServer, checkpoint_log: Callable[..., CheckpointLog]
) -> None:
    def answer(body: dict[str, Any]) -> dict[str, Any]:
        text = body["messages"][-1]["content"]
        return {"label": "x", "score": "not a number"} if text.endswith("00002") else {"label": text, "score": 1}

    fake.answer = answer
    items = make_items(4)
    log = checkpoint_log()
    report = run_b(log, items, openai_step(fake.base_url, output_type=Answer), retry=RetryPolicy(attempts=3))
    assert report.failed == ["i00002"] and sorted(report.processed) == ["i00000", "i00001", "i00003"]
    (failure,) = log.failures("i00002")
    assert failure.error_type == "OutputValidationError" and failure.transient is False
    assert "does not validate against the output type" in failure.message and "score" in failure.message
    # paid for: its usage is in the ledger, and it is not asked again (an answer is not a transient error)
    (entry,) = attempts(log, "i00002")
    assert entry["batch"] is True and entry["input_tokens"] > 0
    assert fake.creates == 1 and fake.requests_per_custom_id_base[bases(items)["i00002"]] == 1
    assert log.item_states(["i00001"])["i00001"].fields == {"label": "Say: hello 00001", "score": 1}


def test_an_answer_whose_key_is_no_field_name_fails_its_item_alone(
    fake: FakeBatchServer, checkpoint_log: Callable[..., CheckpointLog]
) -> None:
    # a permissive JSON schema lets the model answer any keys; the log refuses an empty field name
    fake.answer = lambda body: {"": 1} if body["messages"][-1]["content"].endswith("00001") else {"ok": 1}
    items = make_items(3)
    log = checkpoint_log()
    report = run_b(
        log,
        items,
        openai_step(fake.base_url, output_type={"type": "object", "properties": {"ok": {"type": "integer"}}}),
    )
    assert report.failed == ["i00001"] and sorted(report.processed) == ["i00000", "i00002"]
    (failure,) = log.failures("i00001")
    assert failure.error_type == "OutputValidationError" and "the field name '' is not usable" in failure.message
    assert log.item_states(["i00000"])["i00000"].fields == {"ok": 1}


def test_a_prompt_that_cannot_render_fails_only_that_item_and_is_never_sent(
    fake: FakeBatchServer, checkpoint_log: Callable[..., CheckpointLog]
) -> None:
    items = make_items(5)
    del items[2]["text"]
    log = checkpoint_log()
    report = run_b(log, items, openai_step(fake.base_url), retry=RetryPolicy(attempts=2))
    assert report.failed == ["i00002"] and len(report.processed) == 4
    (failure,) = log.failures("i00002")
    assert failure.error_type == "PromptTemplateError" and "text" in failure.message
    assert bases(items)["i00002"] not in fake.requests_per_custom_id_base
    assert fake.creates == 1 and fake.batches[0].row_count == 4
    assert attempts(log, "i00002") == []


def test_max_requests_per_batch_splits_the_submissions(
    fake: FakeBatchServer, checkpoint_log: Callable[..., CheckpointLog]
) -> None:
    items = make_items(20)
    log = checkpoint_log()
    report = run_b(log, items, openai_step(fake.base_url, max_requests_per_batch=7))
    assert [b.row_count for b in fake.batches] == [7, 7, 6]
    assert report.batches == [b.id for b in fake.batches] and len(report.processed) == 20
    assert len({b.metadata[SUBMISSION_KEY] for b in fake.batches}) == 3
    assert sorted(cid for b in fake.batches for cid in b.custom_ids) == sorted(f"{b}-1" for b in bases(items).values())


def test_max_bytes_per_batch_splits_the_submissions(
    fake: FakeBatchServer, checkpoint_log: Callable[..., CheckpointLog]
) -> None:
    items = make_items(10)  # equal-length texts: every line is the same size
    step = openai_step(fake.base_url)
    client = step.client()
    try:
        one = client.line_bytes(step.request(items[0], "i00000", custom_id("i00000", "fp", 1)))
    finally:
        client.close()
    log = checkpoint_log()
    bounded = openai_step(fake.base_url, max_bytes_per_batch=3 * one + one // 2)
    report = run_b(log, items, bounded)
    assert [b.row_count for b in fake.batches] == [3, 3, 3, 1]
    assert len(report.processed) == 10
    uploaded = [fake.files[b.input_file_id][1] for b in fake.batches if b.input_file_id]
    assert all(len(data) <= 3 * one + one // 2 for data in uploaded)


def test_a_request_larger_than_a_whole_batch_is_a_configuration_error(
    fake: FakeBatchServer, checkpoint_log: Callable[..., CheckpointLog]
) -> None:
    log = checkpoint_log()
    with pytest.raises(ConfigurationError, match=r"the batch request of item 'i00000' is [\d,]+ bytes, above"):
        run_b(log, make_items(2), openai_step(fake.base_url, max_bytes_per_batch=50))
    assert fake.creates == 0


def test_anthropic_end_to_end_with_a_structured_answer(
    fake: FakeBatchServer, checkpoint_log: Callable[..., CheckpointLog]
) -> None:
    fake.shuffle_results = True
    fake.answer = lambda body: {"label": body["messages"][-1]["content"], "score": 7}
    items = make_items(12)
    base = bases(items)
    failing = base["i00004"]
    fake.errored = lambda cid: cid == f"{failing}-1"
    log = checkpoint_log()
    step = anthropic_step(fake.anthropic_base_url, output_type=Answer)
    report = run_b(log, items, step, retry=RetryPolicy(attempts=2))
    assert len(report.processed) == 12 and report.failed == []
    assert [b.provider for b in fake.batches] == ["anthropic", "anthropic"]
    assert [b.row_count for b in fake.batches] == [12, 1]
    assert report.batches == [b.id for b in fake.batches] and report.batches[0].startswith("msgbatch_")
    # the forced tool carried the output schema
    body = fake.batches[0].rows[0].body
    assert body["tool_choice"] == {"type": "tool", "name": "final_result"} and body["max_tokens"] == 1024
    fields = _fields(log, list(base))
    assert fields["i00004"] == {"label": "Say: hello 00004", "score": 7}
    (failure,) = log.failures("i00004")
    assert failure.transient is True and "errored: api_error: fake row error" in failure.message
    (entry,) = attempts(log, "i00004")
    model = "anthropic:" + str(fake.batches[1].rows[0].body["model"])
    assert entry["model"] == model and entry["batch"] is True and entry["custom_id"] == f"{failing}-2"
    assert entry["cost_usd"] == pytest.approx(
        _batch_price(model, entry["input_tokens"], entry["output_tokens"]), rel=1e-9
    )


class _Crash(BaseException):
    """Stands for a SIGKILL: raised after the provider accepted the batch, before the log recorded it."""


class _LosesTheCreateAnswer:
    """A client whose first submit reaches the provider and then 'dies' before returning the id."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.crashed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def submit(self, lines: Any, *, metadata: Any) -> str:
        batch_id = self.inner.submit(lines, metadata=metadata)
        if not self.crashed:
            self.crashed = True
            raise _Crash(batch_id)
        return str(batch_id)


def _crash_in_create(log: CheckpointLog, items: list[dict[str, Any]], step: Any) -> None:
    run_ = BatchRun(
        log, items, step, BatchConfig(processor_version=step.version, writer_id="w", epoch=log.next_epoch())
    )
    client = _LosesTheCreateAnswer(step.client())
    try:
        with pytest.raises(_Crash):
            run_.advance(client)
    finally:
        client.inner.close()
    (sub,) = batches.open_submissions(log)
    assert (sub.kind, sub.batch_id) == (batches.INTENT, None)


def test_openai_reattaches_to_a_batch_whose_create_was_not_recorded(
    fake: FakeBatchServer, checkpoint_log: Callable[..., CheckpointLog]
) -> None:
    items = make_items(8)
    log = checkpoint_log()
    step = openai_step(fake.base_url)
    _crash_in_create(log, items, step)
    assert fake.creates == 1
    report = run_b(log, items, step)
    assert fake.creates == 1  # not paid twice
    assert report.batches == [fake.batches[0].id] and len(report.processed) == 8
    assert fake.requests_per_custom_id_base == {b: 1 for b in bases(items).values()}
    assert log.usage()["calls"] == 8


def test_anthropic_submits_again_a_batch_whose_create_was_not_recorded(
    fake: FakeBatchServer, checkpoint_log: Callable[..., CheckpointLog]
) -> None:
    # Documented: a message batch carries no metadata to find it by, so the lost one runs (and is
    # billed) alongside the one submitted again; the log still records each item once.
    items = make_items(8)
    log = checkpoint_log()
    step = anthropic_step(fake.anthropic_base_url)
    _crash_in_create(log, items, step)
    report = run_b(log, items, step)
    assert fake.creates == 2 and report.batches == [fake.batches[1].id]
    assert fake.batches[0].custom_ids == fake.batches[1].custom_ids
    assert len(report.processed) == 8 and log.usage()["calls"] == 8


def test_a_crash_while_recording_results_records_the_rest_and_counts_no_usage_twice(
    fake: FakeBatchServer, checkpoint_log: Callable[..., CheckpointLog], monkeypatch: pytest.MonkeyPatch
) -> None:
    items = make_items(23)
    base_log, log = checkpoint_log("base"), checkpoint_log("crashed")
    step = openai_step(fake.base_url)
    run_b(base_log, items, step)
    monkeypatch.setattr(record, "RECORD_COMMIT_ITEMS", 5)
    original = BatchRun._commit_rows
    commits = []

    def commit_then_die(self: BatchRun, sub: Any, rows: Any) -> None:
        original(self, sub, rows)
        commits.append(len(rows))
        if len(commits) == 2:
            self.log.wait_appends()
            raise _Crash

    monkeypatch.setattr(BatchRun, "_commit_rows", commit_then_die)
    with pytest.raises(_Crash):
        run_b(log, items, step)
    assert commits == [5, 5] and log.summary()["completed"] == 10
    monkeypatch.setattr(BatchRun, "_commit_rows", original)
    report = run_b(log, items, step)
    assert len(report.processed) == 13 and sorted(report.skipped) == [it["id"] for it in items[:10]]
    assert fake.creates == 2 and report.batches == [fake.batches[1].id]  # re-read, not resubmitted
    assert log.usage() == base_log.usage()
    assert log.summary()["completed"] == 23


def test_a_batch_the_provider_fails_whole_is_a_failed_attempt_of_each_row(
    fake: FakeBatchServer, checkpoint_log: Callable[..., CheckpointLog]
) -> None:
    fake.fail_batch = lambda batch: "bad input" if len(fake.batches) == 1 else None
    items = make_items(3)
    log = checkpoint_log()
    report = run_b(log, items, openai_step(fake.base_url), retry=RetryPolicy(attempts=2))
    assert len(report.processed) == 3 and fake.creates == 2
    (failure,) = log.failures("i00000")
    assert (
        failure.transient is True
        and "the provider failed the whole batch: invalid_request: bad input" in failure.message
    )
    states = {s.batch_id: s.kind for s in batches.read(log).values()}
    assert states == {fake.batches[0].id: batches.FAILED, fake.batches[1].id: batches.RECORDED}


def test_a_batch_the_provider_no_longer_knows_fails_its_rows_and_they_are_resubmitted(
    fake: FakeBatchServer, checkpoint_log: Callable[..., CheckpointLog]
) -> None:
    items = make_items(3)
    log = checkpoint_log()
    step = openai_step(fake.base_url)
    fake.complete_after_polls = 1000
    run = BatchRun(log, items, step, BatchConfig(processor_version=step.version, writer_id="w", epoch=log.next_epoch()))
    client = step.client()
    try:
        (sub,) = run.advance(client)
    finally:
        client.close()
    with fake.lock:
        fake.batches.clear()  # the provider forgot it: retrieve answers 404
    fake.complete_after_polls = 0
    report = run_b(log, items, step, retry=RetryPolicy(attempts=2))
    assert len(report.processed) == 3 and fake.creates == 2  # the lost batch, then the resubmission
    (failure,) = log.failures("i00000")
    assert failure.transient is True  # an attempt was left: resubmitted, not failed for good
    assert "the provider no longer knows it" in failure.message and "HTTP 404" in failure.message
    states = {s.batch_id: s.kind for s in batches.read(log).values()}
    assert states[sub.batch_id] == batches.FAILED and list(states.values()).count(batches.RECORDED) == 1


def test_a_budget_already_reached_submits_nothing(
    fake: FakeBatchServer, checkpoint_log: Callable[..., CheckpointLog]
) -> None:
    log = checkpoint_log()
    step = openai_step(fake.base_url)
    run_b(log, make_items(4), step)
    spent = log.usage()["cost_usd"]
    report = run_b(log, make_items(10, prefix="more"), step, budget_usd=spent)
    assert report.stopped_by_budget is True and report.batches == [] and fake.creates == 1
    assert report.processed == [] and report.failed == []
    tokens = log.usage()["input_tokens"] + log.usage()["output_tokens"]
    report = run_b(log, make_items(10, prefix="more"), step, budget_tokens=tokens)
    assert report.stopped_by_budget is True and fake.creates == 1


def test_a_submission_holds_no_more_items_than_the_rest_of_the_budget_covers(
    fake: FakeBatchServer, checkpoint_log: Callable[..., CheckpointLog]
) -> None:
    log = checkpoint_log()
    step = openai_step(fake.base_url)
    run_b(log, make_items(4), step)  # every item costs the same (equal-length prompts and answers)
    spent = log.usage()["cost_usd"]
    per_item = spent / 4
    report = run_b(log, make_items(40, prefix="more"), step, budget_usd=spent + 5.5 * per_item)
    assert [b.row_count for b in fake.batches] == [4, 5]  # then the rest covers none: a clean stop
    assert report.stopped_by_budget is True and len(report.processed) == 5
    assert log.summary()["completed"] == 9 and log.summary()["never_started"] == 0


def test_nothing_known_of_the_cost_submits_everything_under_a_budget(
    fake: FakeBatchServer, checkpoint_log: Callable[..., CheckpointLog]
) -> None:
    log = checkpoint_log()
    report = run_b(log, make_items(6), openai_step(fake.base_url), budget_usd=1e-9)
    assert [b.row_count for b in fake.batches] == [6] and len(report.processed) == 6
    assert report.stopped_by_budget is False


@pytest.mark.parametrize(
    ("param", "value"), [("budget_usd", 0), ("budget_tokens", -1), ("budget_usd", True), ("poll_interval", -1)]
)
def test_bad_arguments_are_refused_naming_the_parameter(
    fake: FakeBatchServer, checkpoint_log: Callable[..., CheckpointLog], param: str, value: Any
) -> None:
    with pytest.raises(ValueError, match=param):
        run_b(checkpoint_log(), make_items(1), openai_step(fake.base_url), **{param: value})
    assert fake.creates == 0


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_rows_of_a_cancelled_batch_that_never_ran_are_resubmitted(
    fake: FakeBatchServer, checkpoint_log: Callable[..., CheckpointLog], provider: str
) -> None:
    fake.complete_after_polls = 4  # a quarter of the rows run per retrieve
    items = make_items(8)
    log = checkpoint_log()
    step = openai_step(fake.base_url) if provider == "openai" else anthropic_step(fake.anthropic_base_url)
    first = BatchRun(
        log, items, step, BatchConfig(processor_version=step.version, writer_id="w", epoch=log.next_epoch())
    )
    client = step.client()
    try:
        (sub,) = first.advance(client)  # submitted
        assert first.poll(client, [sub]) is False  # polled once: 2 rows ran
        assert sub.batch_id is not None
        client.cancel(sub.batch_id)
    finally:
        client.close()
    fake.complete_after_polls = 0
    report = run_b(log, items, step, retry=RetryPolicy(attempts=2))
    assert len(report.processed) == 8 and report.failed == []
    assert [b.row_count for b in fake.batches] == [8, 6]
    ran = {custom_id_base(r.custom_id) for r in fake.batches[0].rows if r.outcome == "succeeded"}
    assert len(ran) == 2
    assert sorted(fake.batches[1].custom_ids) == sorted(f"{b}-2" for b in set(bases(items).values()) - ran)
    cancelled = next(i for i, b in bases(items).items() if b not in ran)
    (failure,) = log.failures(cancelled)
    assert failure.transient is True and " cancelled: " in failure.message
    assert log.usage()["calls"] == 8


def test_a_run_resuming_a_crashed_runs_batch_spends_no_more_than_retry_attempts(
    fake: FakeBatchServer, checkpoint_log: Callable[..., CheckpointLog]
) -> None:
    items = make_items(3)
    doomed = bases(items)["i00001"]
    fake.errored = lambda cid: custom_id_base(cid) == doomed
    log = checkpoint_log()
    step = openai_step(fake.base_url)
    crashed = BatchRun(
        log, items, step, BatchConfig(processor_version=step.version, writer_id="w", epoch=log.next_epoch())
    )
    client = step.client()
    try:
        crashed.advance(client)  # submitted, then the process is gone
    finally:
        client.close()
    report = run_b(log, items, step, retry=RetryPolicy(attempts=2))
    # the re-read batch was this item's first submission: one resubmission, then it fails
    assert report.failed == ["i00001"] and fake.requests_per_custom_id_base[doomed] == 2
    assert [f.transient for f in log.failures("i00001")] == [True, False]


def test_a_new_step_version_resubmits_failed_items_in_a_submission_of_its_own(
    fake: FakeBatchServer, checkpoint_log: Callable[..., CheckpointLog]
) -> None:
    # The same items at the same attempt (a new generation starts at attempt 1) ask the same custom_ids:
    # their submission must still be a new one, polled and recorded (not folded into the closed one).
    items = make_items(3)
    fake.errored = lambda cid: True
    log = checkpoint_log()
    first = run_b(log, items, openai_step(fake.base_url))
    assert sorted(first.failed) == ["i00000", "i00001", "i00002"]
    fake.errored = lambda cid: False
    edited = openai_step(fake.base_url, prompt="Now say: {{ text }}")
    report = run_b(log, items, edited)
    assert sorted(report.processed) == ["i00000", "i00001", "i00002"] and fake.creates == 2
    assert fake.batches[0].custom_ids == fake.batches[1].custom_ids
    assert report.batches == [fake.batches[1].id]
    assert log.item_states(["i00000"])["i00000"].fields == {"output": "echo: Now say: hello 00000"}
    assert len(batches.read(log)) == 2 and batches.open_submissions(log) == []


def test_a_batch_the_provider_refuses_at_create_fails_its_rows_and_is_not_an_open_intent(
    fake: FakeBatchServer, checkpoint_log: Callable[..., CheckpointLog]
) -> None:
    # Anthropic validates a message batch at create: a refused one never exists (HTTP 400)
    refusals = [1]

    def refuse_once(batch: Any) -> str | None:
        if refusals:
            refusals.pop()
            return "requests.0.params: max_tokens: too large"
        return None

    fake.fail_batch = refuse_once
    items = make_items(3)
    log = checkpoint_log()
    step = anthropic_step(fake.anthropic_base_url)
    report = run_b(log, items, step, retry=RetryPolicy(attempts=2))
    assert len(report.processed) == 3 and report.failed == [] and fake.creates == 2
    (failure,) = log.failures("i00000")
    assert failure.transient is True and failure.error_type == "BatchRowError"
    assert "the provider refused the batch: anthropic refused the creation of a message batch" in failure.message
    assert "HTTP 400" in failure.message and "max_tokens: too large" in failure.message
    assert sorted(s.kind for s in batches.read(log).values()) == [batches.FAILED, batches.RECORDED]

    # without attempts left the items fail, and a rerun submits them again
    refusals.append(1)
    other = make_items(2, prefix="o")
    failed = run_b(log, other, step)
    assert sorted(failed.failed) == ["o00000", "o00001"] and batches.open_submissions(log) == []
    assert len(run_b(log, other, step).processed) == 2


def test_run_batch_sleeps_poll_interval_between_polls_until_the_batch_ends(
    fake: FakeBatchServer, checkpoint_log: Callable[..., CheckpointLog]
) -> None:
    fake.complete_after_polls = 3
    slept: list[float] = []
    report = run_b(checkpoint_log(), make_items(3), openai_step(fake.base_url), poll_interval=7.5, sleep=slept.append)
    assert slept == [7.5, 7.5]
    assert fake.batches[0].polls == 4  # three polls, and the retrieve that reads its result files
    assert len(report.processed) == 3 and report.in_batch == 0


def test_no_items_submit_nothing(fake: FakeBatchServer, checkpoint_log: Callable[..., CheckpointLog]) -> None:
    report = run_b(checkpoint_log(), [], openai_step(fake.base_url))
    assert report.batches == [] and report.processed == [] and fake.creates == 0


def test_the_budget_is_checked_again_before_a_resubmission(
    fake: FakeBatchServer, checkpoint_log: Callable[..., CheckpointLog]
) -> None:
    items = make_items(10)
    base = bases(items)
    fake.errored = lambda cid: cid.endswith("-1") and custom_id_base(cid) in {base["i00002"], base["i00007"]}
    probe = checkpoint_log("probe")
    run_b(probe, make_items(1, prefix="p"), openai_step(fake.base_url))
    per_item = probe.usage()["cost_usd"]  # every item costs the same
    log = checkpoint_log()
    report = run_b(log, items, openai_step(fake.base_url), retry=RetryPolicy(attempts=2), budget_usd=8 * per_item)
    # nothing known at first: all ten go; then 8 items' cost is the whole budget: the two are held back
    assert [b.row_count for b in fake.batches] == [1, 10]
    assert report.stopped_by_budget is True and len(report.processed) == 8 and report.failed == []
    assert [f.transient for f in log.failures("i00002")] == [True]
    assert log.summary()["completed"] == 8


def test_redo_completed_other_version_resubmits_items_completed_under_another_version(
    fake: FakeBatchServer, checkpoint_log: Callable[..., CheckpointLog]
) -> None:
    items = make_items(4)
    log = checkpoint_log()
    run_b(log, items, openai_step(fake.base_url))
    edited = openai_step(fake.base_url, prompt="Now say: {{ text }}")
    kept = run_b(log, items, edited)  # "never", the default: completed under v1 and kept
    assert kept.batches == [] and sorted(kept.skipped) == [it["id"] for it in items] and fake.creates == 1

    report = run_b(log, items, edited, redo_completed="other_version")
    assert sorted(report.processed) == [it["id"] for it in items] and fake.creates == 2
    assert fake.requests_per_custom_id_base == {b: 2 for b in bases(items).values()}
    states = log.item_states([it["id"] for it in items])
    assert {s.processor_version for s in states.values()} == {edited.version}
    assert states["i00001"].fields == {"output": "echo: Now say: hello 00001"}
    again = run_b(log, items, edited, redo_completed="other_version")  # now current: nothing to redo
    assert again.batches == [] and fake.creates == 2

    with pytest.raises(ValueError, match="redo_completed"):
        run_b(log, items, edited, redo_completed="always")


def test_a_submission_of_items_now_in_two_chunks_is_recorded_by_both_and_paid_once(
    fake: FakeBatchServer, checkpoint_log: Callable[..., CheckpointLog]
) -> None:
    # One run submitted ten items as one batch, then the plan's chunking changed (5 + 5): each chunk's run
    # records its own rows of that batch; neither closes it with the other's rows dropped (re-paid).
    items = make_items(10)
    log = checkpoint_log()
    step = openai_step(fake.base_url)
    client = step.client()
    whole = BatchRun(
        log, items, step, BatchConfig(processor_version=step.version, writer_id="w0", epoch=log.next_epoch())
    )
    (sub,) = whole.advance(client)  # submitted, still in progress
    client.close()
    assert fake.creates == 1 and len(sub.item_ids) == 10
    assert log.summary()["in_batch"] == 10

    first = run_b(log, items[:5], step)
    assert sorted(first.processed) == [it["id"] for it in items[:5]] and first.batches == [sub.batch_id]
    (still,) = batches.open_submissions(log)  # the other chunk's rows wait in it
    assert still.submission_key == sub.submission_key
    # the batch has ended: its five unrecorded rows are back, waiting for their chunk's run, not in a batch
    assert (log.summary()["completed"], log.summary()["in_batch"]) == (5, 0)

    second = run_b(log, items[5:], step)
    assert sorted(second.processed) == [it["id"] for it in items[5:]] and second.batches == [sub.batch_id]
    assert fake.creates == 1 and fake.requests_per_custom_id_base == {b: 1 for b in bases(items).values()}
    assert batches.open_submissions(log) == [] and log.summary()["completed"] == 10
    assert batches.read(log)[sub.submission_key].kind == batches.RECORDED
