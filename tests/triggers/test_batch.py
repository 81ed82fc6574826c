"""DatagenBatchTrigger against the in-process fake batch server: serialize round-trip, polling until ended, errors,
on_kill cancelling exactly its own open batches (and cleanup() none)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest

from airflow_provider_datagen.core.batch import BatchConfig, BatchRun
from airflow_provider_datagen.core.batch.protocol import BatchInfo, RequestLine
from airflow_provider_datagen.core.store import batches
from airflow_provider_datagen.exceptions import ConfigurationError
from airflow_provider_datagen.llm.batch.clients import OpenAIBatchClient
from airflow_provider_datagen.triggers import batch as batch_module
from airflow_provider_datagen.triggers.batch import DatagenBatchTrigger
from dev.batch_server import FakeBatchServer, serving
from tests.core.batch.helpers import make_items, openai_step
from tests.core.batch.helpers import run as run_b

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from airflow_provider_datagen.core import CheckpointLog

TRIGGER_PATH = "airflow_provider_datagen.triggers.batch.DatagenBatchTrigger"


@pytest.fixture
def fake() -> Iterator[FakeBatchServer]:
    with serving(complete_after_polls=3) as server:
        yield server


def _submit(fake: FakeBatchServer, n: int = 2) -> str:
    client = OpenAIBatchClient("sk-test", fake.base_url)
    try:
        lines = [
            RequestLine(f"c{i}-1", {"model": "m", "messages": [{"role": "user", "content": f"q{i}"}]}) for i in range(n)
        ]
        return client.submit(lines, metadata={})
    finally:
        client.close()


def _events(trigger: DatagenBatchTrigger) -> list[dict[str, Any]]:
    async def collect() -> list[dict[str, Any]]:
        return [event.payload async for event in trigger.run()]

    return asyncio.run(asyncio.wait_for(collect(), timeout=60))


def test_serialize_round_trips_and_holds_no_key_read_from_a_connection() -> None:
    trigger = DatagenBatchTrigger(
        batch_ids=["b1", "b2"], provider="anthropic", llm_conn_id="llm", poll_interval=5, resume={"epoch": 3}
    )
    path, kwargs = trigger.serialize()
    assert path == TRIGGER_PATH
    assert kwargs == {
        "batch_ids": ["b1", "b2"],
        "provider": "anthropic",
        "llm_conn_id": "llm",
        "base_url": None,
        "api_key": None,
        "poll_interval": 5.0,
        "resume": {"epoch": 3},
    }
    json.dumps(kwargs)  # what the metadata DB stores
    again = DatagenBatchTrigger(**kwargs)
    assert again.serialize() == (path, kwargs)


def test_polls_every_batch_until_all_have_ended(fake: FakeBatchServer) -> None:
    ids = [_submit(fake), _submit(fake, 3)]
    trigger = DatagenBatchTrigger(
        batch_ids=ids, provider="openai", base_url=fake.base_url, api_key="sk-test", poll_interval=0.01, resume={"x": 1}
    )
    [event] = _events(trigger)
    assert event["status"] == "ended" and event["resume"] == {"x": 1}
    assert set(event["batches"]) == set(ids)
    assert {b["state"] for b in event["batches"].values()} == {"ended"}
    assert event["batches"][ids[1]]["counts"]["succeeded"] == 3
    # each polled until it ended (the fake ends a batch on its third retrieve), and never again after
    assert [b.polls for b in fake.batches] == [3, 3]


def test_reads_the_connection_on_the_triggerer(fake: FakeBatchServer, monkeypatch: pytest.MonkeyPatch) -> None:
    conn = {"conn_type": "pydanticai", "host": fake.base_url, "password": "sk-conn"}
    monkeypatch.setenv("AIRFLOW_CONN_TRIGGER_LLM", json.dumps(conn))
    batch_id = _submit(fake)
    [event] = _events(
        DatagenBatchTrigger(batch_ids=[batch_id], provider="openai", llm_conn_id="trigger_llm", poll_interval=0.01)
    )
    assert event["status"] == "ended" and event["batches"][batch_id]["state"] == "ended"


def test_an_unknown_batch_yields_an_error_event_naming_it(fake: FakeBatchServer) -> None:
    trigger = DatagenBatchTrigger(
        batch_ids=["batch_missing"], provider="openai", base_url=fake.base_url, api_key="k", poll_interval=0.01
    )
    [event] = _events(trigger)
    assert event["status"] == "error" and event["batch_id"] == "batch_missing"
    assert event["error_type"] == "BatchAPIError" and "batch_missing" in event["message"]


def test_transient_poll_errors_are_retried_then_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    class Flaky:
        provider = "openai"

        def retrieve(self, batch_id: str) -> Any:
            calls.append(batch_id)
            raise ConnectionError("connection reset by peer")

        def close(self) -> None:
            pass

    trigger = DatagenBatchTrigger(batch_ids=["b1"], provider="openai", base_url="http://x", poll_interval=0.01)

    async def flaky_client() -> Flaky:
        return Flaky()

    monkeypatch.setattr(trigger, "_client", flaky_client)
    [event] = _events(trigger)
    assert calls == ["b1"] * batch_module.MAX_POLL_ERRORS
    assert event == {
        "status": "error",
        "message": "ConnectionError: connection reset by peer",
        "error_type": "ConnectionError",
        "batch_id": "b1",
        "batches": {},
        "resume": {},
    }


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"batch_ids": []}, r"^DatagenBatchTrigger: batch_ids=\[\] is not a non-empty list of batch ids"),
        ({"batch_ids": "b1"}, r"^DatagenBatchTrigger: batch_ids='b1' is not a non-empty list"),
        ({"provider": "gemini"}, r"^DatagenBatchTrigger: provider='gemini' is not a batch provider"),
        ({"poll_interval": -1}, r"^DatagenBatchTrigger: poll_interval=-1 is not a positive number of seconds"),
    ],
)
def test_bad_arguments_are_refused_naming_them(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        DatagenBatchTrigger(**{"batch_ids": ["b1"], "provider": "openai", **kwargs})


# --- on_kill: a user's kill of the deferred task ---------------------------------------------------


async def _remove(trigger: DatagenBatchTrigger, polled: Callable[[], bool], *, user_action: bool) -> None:
    """What the triggerer does to a running trigger it drops (jobs/triggerer_job_runner.py, run_trigger).

    run() is cancelled; on_kill() is awaited only when a user acted on the task (the cancel message says
    so), never for a triggerer stopping or handing the trigger on; cleanup() runs either way.
    """

    async def consume() -> None:
        async for event in trigger.run():
            raise AssertionError(f"the trigger fired before it was removed: {event}")

    task = asyncio.create_task(consume())
    deadline = time.monotonic() + 30
    while not polled():
        assert time.monotonic() < deadline and not task.done(), "the trigger never polled"
        await asyncio.sleep(0.01)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    if user_action:
        await trigger.on_kill()
    await trigger.cleanup()


def _two_chunks(
    fake: FakeBatchServer, log: CheckpointLog
) -> tuple[list[dict[str, Any]], batches.Submission, batches.Submission, Any]:
    """Chunk a (3 items) and chunk b (3 items) of one experiment submitted, one open batch each."""
    step = openai_step(fake.base_url)
    client = step.client()
    try:
        subs = []
        for prefix in ("a", "b"):
            run = BatchRun(
                log,
                make_items(3, prefix),
                step,
                BatchConfig(processor_version=step.version, writer_id="w", epoch=log.next_epoch()),
            )
            (sub,) = run.advance(client)
            subs.append(sub)
    finally:
        client.close()
    return make_items(3, "a"), subs[0], subs[1], step


def test_on_kill_cancels_exactly_its_open_batches_and_the_next_run_records_them_cancelled(
    checkpoint_log: Callable[..., CheckpointLog],
) -> None:
    with serving(complete_after_polls=10**6) as fake:  # the batches never end on their own
        log = checkpoint_log("kill")
        items_a, sub_a, sub_b, step = _two_chunks(fake, log)
        batch_a, batch_b = fake.batches
        assert (batch_a.id, batch_b.id) == (sub_a.batch_id, sub_b.batch_id)
        trigger = DatagenBatchTrigger(
            batch_ids=[batch_a.id], provider="openai", base_url=fake.base_url, api_key="k", poll_interval=0.01
        )
        asyncio.run(_remove(trigger, lambda: batch_a.polls >= 2, user_action=True))

        # the provider was asked to cancel chunk a's batch, and only it: chunk b's task is still waiting on its own
        assert batch_a.cancel_requested_at is not None
        assert batch_b.cancel_requested_at is None
        # nothing was closed in the submissions record (core/batch/cancel.py): the next round reads the
        # cancelled batch, records its finished rows and fails the rows that never ran
        record = batches.read(log)
        assert (record[sub_a.submission_key].kind, record[sub_b.submission_key].kind) == ("submitted", "submitted")

        report = run_b(log, items_a, step)
        record = batches.read(log)
        assert (record[sub_a.submission_key].kind, record[sub_a.submission_key].status) == ("recorded", "cancelled")
        assert {row.outcome for row in batch_a.rows} == {"cancelled"}
        assert sorted(report.failed) == ["a00000", "a00001", "a00002"]
        assert all(" cancelled: " in f.message for i in report.failed for f in log.failures(i))
        # chunk b's batch was neither cancelled nor polled by chunk a's run, and nothing was resubmitted
        assert (record[sub_b.submission_key].kind, batch_b.cancel_requested_at) == ("submitted", None)
        assert fake.creates == 2


def test_cleanup_alone_cancels_nothing(checkpoint_log: Callable[..., CheckpointLog]) -> None:
    # a triggerer stopping, or handing the trigger to another, removes it without on_kill: the batch runs on
    with serving(complete_after_polls=10**6) as fake:
        log = checkpoint_log("restart")
        _, sub_a, _, _ = _two_chunks(fake, log)
        trigger = DatagenBatchTrigger(
            batch_ids=[str(sub_a.batch_id)], provider="openai", base_url=fake.base_url, api_key="k", poll_interval=0.01
        )
        asyncio.run(_remove(trigger, lambda: fake.batches[0].polls >= 2, user_action=False))
        assert [b.cancel_requested_at for b in fake.batches] == [None, None]
        assert {s.kind for s in batches.read(log).values()} == {"submitted"}


class _Client:
    """A batch client whose batches are as ``states`` says; records its calls."""

    provider = "openai"

    def __init__(self, states: dict[str, str], *, refuse: str = "", block: threading.Event | None = None) -> None:
        self.states, self.refuse, self.block = states, refuse, block
        self.cancels: list[str] = []
        self.closed = False

    def retrieve(self, batch_id: str) -> BatchInfo:
        return BatchInfo(batch_id, self.states[batch_id], self.states[batch_id])  # type: ignore[arg-type]

    def cancel(self, batch_id: str) -> None:
        self.cancels.append(batch_id)
        if self.block is not None:
            self.block.wait(30)
        if batch_id == self.refuse:
            raise ConnectionError("connection reset by peer")

    def close(self) -> None:
        self.closed = True


def _with_client(monkeypatch: pytest.MonkeyPatch, trigger: DatagenBatchTrigger, client: _Client) -> None:
    async def made() -> _Client:
        return client

    monkeypatch.setattr(trigger, "_client", made)
    # the trigger's structlog logger, as a stdlib one: caplog reads what it says
    monkeypatch.setattr(trigger, "_log", logging.getLogger("test.trigger"))


def test_on_kill_skips_the_batches_that_ended_and_a_refusal_stops_no_other(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    client = _Client({"b1": "ended", "b2": "in_progress", "b3": "in_progress"}, refuse="b2")
    trigger = DatagenBatchTrigger(batch_ids=["b1", "b2", "b3"], provider="openai", base_url="http://x", poll_interval=5)
    _with_client(monkeypatch, trigger, client)
    polls: list[str] = []
    retrieve = client.retrieve

    def counted(batch_id: str) -> BatchInfo:
        polls.append(batch_id)
        return retrieve(batch_id)

    monkeypatch.setattr(client, "retrieve", counted)
    with caplog.at_level(logging.WARNING, logger="test.trigger"):
        asyncio.run(_remove(trigger, lambda: len(polls) >= 3, user_action=True))
    assert client.cancels == ["b2", "b3"] and client.closed
    assert [r.getMessage() for r in caplog.records] == [
        "could not cancel batch b2 (its deferred task was killed): ConnectionError: connection reset by peer",
        "asked the provider to cancel batch b3: its deferred task was killed",
        "the task was killed while deferred: asked openai to cancel 1 of its 2 open batches: ['b3']",
    ]
    assert all(isinstance(r.args, tuple) and r.args for r in caplog.records)  # %-args, formatted only if shown


def test_on_kill_gives_up_after_its_own_timeout_without_blocking_the_event_loop(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(batch_module, "ON_KILL_TIMEOUT", 0.3)
    hung = threading.Event()
    client = _Client({"b1": "in_progress", "b2": "in_progress"}, block=hung)  # the provider never answers
    trigger = DatagenBatchTrigger(batch_ids=["b1", "b2"], provider="openai", base_url="http://x", poll_interval=5)
    _with_client(monkeypatch, trigger, client)

    async def kill_while_ticking() -> tuple[int, float]:
        ticks = 0
        started = time.monotonic()
        killing = asyncio.create_task(trigger.on_kill())
        try:
            while not killing.done():
                ticks += 1  # the loop runs on while the cancel call hangs in its thread
                await asyncio.sleep(0.01)
            await killing
        finally:
            hung.set()  # the provider answers at last (asyncio.run waits for the thread before it returns)
        return ticks, time.monotonic() - started

    with caplog.at_level(logging.WARNING, logger="test.trigger"):
        ticks, took = asyncio.run(asyncio.wait_for(kill_while_ticking(), timeout=10))
    assert 0.3 <= took < 2 and ticks >= 10, (took, ticks)
    assert client.cancels == ["b1"] and client.closed
    assert [r.getMessage() for r in caplog.records] == [
        "gave up cancelling after 0.3 s: 2 of 2 openai batches may still run: ['b1', 'b2']",
        "the task was killed while deferred: asked openai to cancel 0 of its 2 open batches: []",
        # the call in flight when it gave up still lands, and says so
        "asked the provider to cancel batch b1: its deferred task was killed",
    ]
