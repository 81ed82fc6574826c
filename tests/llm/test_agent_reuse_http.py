"""The response store on ``engine="pydantic-ai"`` over real HTTP (the common.ai hook's agent against
tests/_support/openai_server.py, which counts requests): a second experiment pays nothing and exports the
same, ``reuse=False`` sends again, a failed request is never stored, samples are distinct keys, a
validation retry is its own request, identical requests in flight are sent once."""

from __future__ import annotations

import json
from collections import Counter
from typing import TYPE_CHECKING, Any

import pytest
from pydantic import BaseModel

from airflow_provider_datagen.core import ResponseStore, run_items
from airflow_provider_datagen.core.export import collect_results, results_fingerprint
from airflow_provider_datagen.core.retry import RetryPolicy
from airflow_provider_datagen.core.store.responses import RESPONSES_DIR
from airflow_provider_datagen.llm import RETRYABLE_ERRORS, llm_process
from tests._support import openai_server
from tests._support.engine import open_log

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from tests._support.openai_server import FakeOpenAI

AGENT = "pydantic-ai"


class Translation(BaseModel):
    french: str
    words: int


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOpenAI]:
    fake = openai_server.start(tool_args={"french": "bonjour", "words": 1})
    conn = {"conn_type": "pydanticai", "host": fake.base_url, "password": "sk-fake"}
    conn["extra"] = {"model": "openai-chat:gpt-4o-mini"}  # type: ignore[assignment]
    monkeypatch.setenv("AIRFLOW_CONN_LLM_AGENT_REUSE", json.dumps(conn))
    try:
        yield fake
    finally:
        fake.stop()


def _items(n: int, prefix: str = "q") -> list[dict[str, Any]]:
    return [{"id": f"{prefix}{k}", "text": f"word {k}"} for k in range(n)]


def _sent(server: FakeOpenAI) -> int:
    return sum(1 for r in server.requests if r.status == 200)


def _entries(root: Path) -> int:
    return int(ResponseStore.open(root).stats()["entries"])


def test_a_second_experiment_over_the_same_prompts_sends_nothing(server: FakeOpenAI, tmp_path: Path) -> None:
    process = llm_process("Repeat {{ text }}", llm_conn_id="llm_agent_reuse", engine=AGENT, instructions="Be brief.")
    first = open_log(tmp_path, "first")
    run_items(first, _items(60), process, processor_version=process.version, concurrency=16)
    assert _sent(server) == 60
    assert _entries(tmp_path) == 60
    # other item ids, another experiment, later: the same requests, so the same keys
    second = open_log(tmp_path, "second")
    report = run_items(second, _items(60, "other-"), process, processor_version=process.version, concurrency=16)
    assert report.failed == [] and len(report.processed) == 60
    assert len(server.requests) == 60  # not one more request
    again = open_log(tmp_path, "again")
    run_items(again, _items(60), process, processor_version=process.version, concurrency=16)
    assert len(server.requests) == 60
    assert results_fingerprint(collect_results(again)) == results_fingerprint(collect_results(first))
    assert second.item_state("other-7").fields == first.item_state("q7").fields == {"output": "echo: Repeat word 7"}
    usage, paid = again.usage(), first.usage()
    assert (usage["calls"], usage["input_tokens"], usage["output_tokens"], usage["requests"]) == (0, 0, 0, 0)
    assert usage["cost_usd"] == 0.0
    assert usage["reused_calls"] == 60 and paid["reused_calls"] == 0
    assert paid["cost_usd"] > 0 and usage["saved_usd"] == pytest.approx(paid["cost_usd"])
    attempts = again.item_usage("q1")["attempts"]
    assert [(a["reused"], a["cost_usd"], a["input_tokens"] > 0) for a in attempts] == [(True, 0.0, True)]


def test_reuse_false_sends_every_request_and_still_stores_once(server: FakeOpenAI, tmp_path: Path) -> None:
    process = llm_process("Repeat {{ text }}", llm_conn_id="llm_agent_reuse", engine=AGENT, reuse=False)
    run_items(open_log(tmp_path, "a"), _items(5), process, processor_version=process.version)
    log = open_log(tmp_path, "b")
    run_items(log, _items(5), process, processor_version=process.version)
    assert _sent(server) == 10
    assert _entries(tmp_path) == 5  # a reply already stored is not stored again
    assert (log.usage()["calls"], log.usage()["reused_calls"], log.usage()["requests"]) == (5, 0, 5)
    reusing = llm_process("Repeat {{ text }}", llm_conn_id="llm_agent_reuse", engine=AGENT)
    run_items(open_log(tmp_path, "c"), _items(5), reusing, processor_version=reusing.version)
    assert _sent(server) == 10  # what reuse=False stored answers a reusing step


@pytest.mark.parametrize("status", ["[429]", "[http 500]", "[http 400]"])
def test_a_failed_request_is_never_stored(server: FakeOpenAI, tmp_path: Path, status: str) -> None:
    process = llm_process("Repeat {{ text }}", llm_conn_id="llm_agent_reuse", engine=AGENT)
    items = [{"id": "bad", "text": f"it {status}"}, {"id": "good", "text": "it"}]
    report = run_items(open_log(tmp_path, "a"), items, process, processor_version=process.version)
    assert report.failed == ["bad"]
    assert _entries(tmp_path) == 1
    run_items(open_log(tmp_path, "b"), items, process, processor_version=process.version)
    assert Counter(r.text for r in server.requests) == {f"Repeat it {status}": 2, "Repeat it": 1}


def test_the_reply_of_a_retry_after_a_failure_is_stored_and_the_failure_not(server: FakeOpenAI, tmp_path: Path) -> None:
    process = llm_process("Repeat {{ text }}", llm_conn_id="llm_agent_reuse", engine=AGENT)
    items = [{"id": "flaky", "text": "it [500 once]"}]
    policy = RetryPolicy(attempts=3, retry_on=RETRYABLE_ERRORS, backoff=0.01, jitter=False)
    log = open_log(tmp_path, "a")
    run_items(log, items, process, processor_version=process.version, retry=policy)
    assert [r.status for r in server.requests] == [500, 200]
    run_items(open_log(tmp_path, "b"), items, process, processor_version=process.version, retry=policy)
    assert len(server.requests) == 2
    assert log.item_state("flaky").fields == {"output": "echo: Repeat it [500 once]"}


def test_n_samples_send_n_requests_once(server: FakeOpenAI, tmp_path: Path) -> None:
    process = llm_process(
        "Write a joke about {{ topic }}", llm_conn_id="llm_agent_reuse", engine=AGENT, sample="{{ sample_index }}"
    )
    items = [{"id": f"s{k}", "topic": "cats", "sample_index": k} for k in range(4)]
    run_items(open_log(tmp_path, "a"), items, process, processor_version=process.version)
    assert Counter(r.text for r in server.requests) == {"Write a joke about cats": 4}
    assert _entries(tmp_path) == 4
    run_items(open_log(tmp_path, "b"), items, process, processor_version=process.version)
    assert _sent(server) == 4


def test_a_sample_naming_a_missing_field_fails_the_item_before_any_request(server: FakeOpenAI, tmp_path: Path) -> None:
    process = llm_process("Repeat {{ text }}", llm_conn_id="llm_agent_reuse", engine=AGENT, sample="{{ nope }}")
    log = open_log(tmp_path, "a")
    report = run_items(log, _items(2), process, processor_version=process.version)
    assert sorted(report.failed) == ["q0", "q1"]
    assert server.requests == []
    assert "the sample names field 'nope'" in str(log.failures())


def test_a_validation_retry_is_its_own_stored_request(server: FakeOpenAI, tmp_path: Path) -> None:
    process = llm_process("Translate {{ text }}", llm_conn_id="llm_agent_reuse", engine=AGENT, output_type=Translation)
    items = [{"id": "v", "text": "hi [invalid once]"}]
    first = open_log(tmp_path, "a")
    run_items(first, items, process, processor_version=process.version)
    # the invalid answer went back to the model with the errors: two requests, two keys
    assert [r.status for r in server.requests] == [200, 200]
    assert len(server.requests[1].body["messages"]) > len(server.requests[0].body["messages"])
    assert _entries(tmp_path) == 2
    second = open_log(tmp_path, "b")
    run_items(second, items, process, processor_version=process.version)
    assert len(server.requests) == 2
    assert second.item_state("v").fields == first.item_state("v").fields == {"french": "bonjour", "words": 1}
    assert second.usage()["reused_calls"] == 2


def test_identical_requests_in_flight_are_sent_once(server: FakeOpenAI, tmp_path: Path) -> None:
    process = llm_process("Repeat {{ text }}", llm_conn_id="llm_agent_reuse", engine=AGENT)
    items = [{"id": f"d{k}", "text": "the same"} for k in range(20)]
    log = open_log(tmp_path, "a")
    report = run_items(log, items, process, processor_version=process.version, concurrency=20)
    assert len(report.processed) == 20
    assert _sent(server) == 1
    usage = log.usage()
    assert (usage["calls"], usage["reused_calls"], usage["requests"]) == (1, 19, 1)


def test_the_engines_keep_their_own_keys(server: FakeOpenAI, tmp_path: Path) -> None:
    # the requests as sent differ (pydantic-ai's own body), so one engine's replies do not answer the other's
    for engine in ("sdk", AGENT, "sdk", AGENT):
        process = llm_process("Repeat {{ text }}", llm_conn_id="llm_agent_reuse", engine=engine)
        run_items(open_log(tmp_path, engine), _items(3), process, processor_version=process.version)
    assert _sent(server) == 6
    assert _entries(tmp_path) == 6


def test_an_in_process_model_is_never_stored(tmp_path: Path) -> None:
    from pydantic_ai.models.test import TestModel

    process = llm_process("Repeat {{ text }}", model=TestModel(custom_output_text="hi"))
    report = run_items(open_log(tmp_path, "a"), _items(3), process, processor_version=process.version)
    assert len(report.processed) == 3
    assert not (tmp_path / RESPONSES_DIR).exists()


def _usage_keys(log: Any, item: str) -> list[tuple[bool, list[str]]]:
    (ev,) = [e for e in log.events(item) if e.event_type.value == "STEP_COMPLETED"]
    return [(e.get("reused", False), e.get("request_keys", [])) for e in json.loads(ev.value_json)["usage"]]


def test_sent_and_reused_usage_carry_the_request_key_for_the_item_page(server: FakeOpenAI, tmp_path: Path) -> None:
    """The item page finds an exchange by the key in its usage entry: a sent request's too (the slot's model
    records its usage with the key the store's wrapper is sending), as the sdk engine's."""
    process = llm_process("Repeat {{ text }}", llm_conn_id="llm_agent_reuse", engine=AGENT)
    first, second = open_log(tmp_path, "first"), open_log(tmp_path, "second")
    run_items(first, _items(2), process, processor_version=process.version)
    run_items(second, _items(2), process, processor_version=process.version)
    store = ResponseStore.open(tmp_path)
    for item in ("q0", "q1"):
        ((reused, keys),) = _usage_keys(first, item)
        assert reused is False and len(keys) == 1 and store.get(keys[0]) is not None
        assert _usage_keys(second, item) == [(True, keys)]
