"""The model step and the response store over real HTTP (tests/_support/openai_server.py counts requests):
a second experiment pays nothing, samples cost one request each once, a regeneration asks only the
edited step, identical requests in flight are sent once, and a bad store fails before any request."""

from __future__ import annotations

import json
from collections import Counter
from typing import TYPE_CHECKING, Any

import pytest
from pydantic import BaseModel

from airflow_provider_datagen.core import ResponseStore, Sequence, run_items
from airflow_provider_datagen.core.export import collect_results, results_fingerprint
from airflow_provider_datagen.core.store.responses import RESPONSES_DIR
from airflow_provider_datagen.exceptions import ConfigurationError, ResponseStoreError
from airflow_provider_datagen.llm import llm_process, llm_step
from tests._support import openai_server
from tests._support.engine import open_log

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from tests._support.openai_server import FakeOpenAI


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOpenAI]:
    fake = openai_server.start()
    conn = {"conn_type": "pydanticai", "host": fake.base_url, "password": "sk-fake"}
    conn["extra"] = {"model": "openai-chat:gpt-4o-mini"}  # type: ignore[assignment]
    monkeypatch.setenv("AIRFLOW_CONN_LLM_REUSE", json.dumps(conn))
    try:
        yield fake
    finally:
        fake.stop()


def _items(n: int) -> list[dict[str, Any]]:
    return [{"id": f"q{k}", "text": f"word {k}"} for k in range(n)]


def _sent(server: FakeOpenAI) -> int:
    return sum(1 for r in server.requests if r.status == 200)


def test_a_second_experiment_over_the_same_prompts_sends_nothing(server: FakeOpenAI, tmp_path: Path) -> None:
    process = llm_process("Repeat {{ text }}", llm_conn_id="llm_reuse")
    first = open_log(tmp_path, "first")
    run_items(first, _items(300), process, processor_version=process.version, concurrency=32)
    assert _sent(server) == 300
    assert ResponseStore.open(tmp_path).stats()["entries"] == 300
    second = open_log(tmp_path, "second")
    report = run_items(second, _items(300), process, processor_version=process.version, concurrency=32)
    assert report.failed == [] and len(report.processed) == 300
    assert _sent(server) == 300  # not one more request
    assert results_fingerprint(collect_results(second)) == results_fingerprint(collect_results(first))
    usage, paid = second.usage(), first.usage()
    assert (usage["calls"], usage["input_tokens"], usage["output_tokens"], usage["requests"]) == (0, 0, 0, 0)
    assert usage["cost_usd"] == 0.0
    assert usage["reused_calls"] == 300
    assert usage["saved_usd"] == pytest.approx(paid["cost_usd"])
    assert paid["reused_calls"] == 0
    attempts = second.item_usage("q1")["attempts"]
    assert [(a["reused"], a["cost_usd"], a["input_tokens"] > 0) for a in attempts] == [(True, 0.0, True)]


def test_reuse_false_sends_every_request_and_still_stores(server: FakeOpenAI, tmp_path: Path) -> None:
    process = llm_process("Repeat {{ text }}", llm_conn_id="llm_reuse", reuse=False)
    run_items(open_log(tmp_path, "a"), _items(5), process, processor_version=process.version)
    run_items(open_log(tmp_path, "b"), _items(5), process, processor_version=process.version)
    assert _sent(server) == 10
    assert ResponseStore.open(tmp_path).stats()["entries"] == 5  # a reply already stored is not stored again


def test_reuse_must_be_a_bool(server: FakeOpenAI) -> None:
    with pytest.raises(ConfigurationError, match="reuse"):
        llm_process("Repeat {{ text }}", reuse="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="sample"):
        llm_process("Repeat {{ text }}", sample=1.5)  # type: ignore[arg-type]


def test_n_samples_send_n_requests_once(server: FakeOpenAI, tmp_path: Path) -> None:
    process = llm_process("Write a joke about {{ topic }}", llm_conn_id="llm_reuse", sample="{{ sample_index }}")
    assert process.version != llm_process("Write a joke about {{ topic }}", llm_conn_id="llm_reuse").version
    items = [{"id": f"s{k}", "topic": "cats", "sample_index": k} for k in range(4)]
    run_items(open_log(tmp_path, "a"), items, process, processor_version=process.version)
    assert _sent(server) == 4
    assert Counter(r.text for r in server.requests) == {"Write a joke about cats": 4}
    run_items(open_log(tmp_path, "b"), items, process, processor_version=process.version)
    assert _sent(server) == 4


def test_a_sample_template_naming_a_missing_field_fails_the_item_before_any_request(
    server: FakeOpenAI, tmp_path: Path
) -> None:
    process = llm_process("Repeat {{ text }}", llm_conn_id="llm_reuse", sample="{{ sample_index }}")
    log = open_log(tmp_path, "a")
    report = run_items(log, _items(2), process, processor_version=process.version)
    assert sorted(report.failed) == ["q0", "q1"]
    assert server.requests == []
    failures = log.failures()
    assert "the sample names field 'sample_index'" in str(failures)


def test_identical_requests_in_flight_are_sent_once(server: FakeOpenAI, tmp_path: Path) -> None:
    process = llm_process("Repeat {{ text }}", llm_conn_id="llm_reuse")
    items = [{"id": f"d{k}", "text": "the same"} for k in range(20)]
    log = open_log(tmp_path, "a")
    report = run_items(log, items, process, processor_version=process.version, concurrency=20)
    assert len(report.processed) == 20
    assert _sent(server) == 1
    usage = log.usage()
    assert (usage["calls"], usage["reused_calls"]) == (1, 19)


@pytest.mark.parametrize("engine", ["sdk", "pydantic-ai"])
def test_regenerating_after_editing_step_two_asks_only_step_two(
    server: FakeOpenAI, tmp_path: Path, engine: str
) -> None:
    def pipeline(second_prompt: str, reuse: bool = True) -> Sequence:
        conn = {"llm_conn_id": "llm_reuse", "engine": engine, "reuse": reuse}
        return Sequence(
            "both",
            [
                llm_step("first", "Repeat {{ text }}", output_field="a", **conn),
                llm_step("second", second_prompt, output_field="b", **conn),
            ],
        )

    log = open_log(tmp_path, "regen")
    run_items(log, _items(6), pipeline("Shorten {{ a }}"), processor_version="v1")
    assert _sent(server) == 12
    before = len(server.requests)
    report = run_items(
        log, _items(6), pipeline("Lengthen {{ a }}"), processor_version="v2", redo_completed="other_version"
    )
    assert len(report.processed) == 6
    again = [r.text for r in server.requests[before:]]
    assert len(again) == 6 and all(t.startswith("Lengthen echo: Repeat word") for t in again)
    fresh = open_log(tmp_path, "fresh")
    run_items(fresh, _items(6), pipeline("Lengthen {{ a }}", reuse=False), processor_version="v2")
    assert results_fingerprint(collect_results(fresh)) == results_fingerprint(collect_results(log))


def test_a_bad_store_fails_the_run_before_any_request_and_any_write(server: FakeOpenAI, tmp_path: Path) -> None:
    (tmp_path / RESPONSES_DIR).write_text("not a store")
    process = llm_process("Repeat {{ text }}", llm_conn_id="llm_reuse")
    log = open_log(tmp_path, "a")
    with pytest.raises(ResponseStoreError, match=RESPONSES_DIR):
        run_items(log, _items(3), process, processor_version=process.version)
    assert server.requests == []
    assert not (tmp_path / "datagen_checkpoints").exists()


class Translation(BaseModel):
    french: str
    words: int


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_a_stored_structured_answer_reads_back_as_the_same_fields(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, api: str
) -> None:
    fake = openai_server.start(tool_args={"french": "bonjour", "words": 1})
    try:
        host = fake.anthropic_url if api == "anthropic" else fake.base_url
        model = "anthropic:claude-fake" if api == "anthropic" else "openai-chat:gpt-4o-mini"
        conn = {"conn_type": "pydanticai", "host": host, "password": "sk-fake", "extra": {"model": model}}
        monkeypatch.setenv("AIRFLOW_CONN_LLM_STRUCT", json.dumps(conn))
        process = llm_process("Translate {{ text }}", llm_conn_id="llm_struct", output_type=Translation)
        first, second = open_log(tmp_path, "a"), open_log(tmp_path, "b")
        run_items(first, _items(3), process, processor_version=process.version)
        run_items(second, _items(3), process, processor_version=process.version)
        assert sum(1 for r in fake.requests if r.status == 200) == 3
        assert collect_results(second) == collect_results(first)
        assert second.item_state("q0").fields == {"french": "bonjour", "words": 1}
    finally:
        fake.stop()
