"""The OpenAI and Anthropic batch clients against the fake batch server, through the official SDKs."""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING, Any

import anthropic
import httpx2
import pytest

from airflow_provider_datagen.core.batch.protocol import RequestLine
from airflow_provider_datagen.exceptions import BatchAPIError, ConfigurationError
from airflow_provider_datagen.llm.batch.clients import (
    JSON_ROWS_KEY,
    AnthropicBatchClient,
    OpenAIBatchClient,
    client_for,
)
from dev import batch_api
from dev.batch_answers import usage
from dev.batch_server import FakeBatchServer, serving

if TYPE_CHECKING:
    from collections.abc import Iterator

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "rank": {"type": "integer"}}}


@pytest.fixture
def fake() -> Iterator[FakeBatchServer]:
    with serving() as server:
        yield server


@pytest.fixture
def openai_client(fake: FakeBatchServer) -> Iterator[OpenAIBatchClient]:
    client = OpenAIBatchClient("test-key", fake.base_url)
    yield client
    client.close()


@pytest.fixture
def anthropic_client(fake: FakeBatchServer) -> Iterator[AnthropicBatchClient]:
    client = AnthropicBatchClient("test-key", fake.anthropic_base_url)
    yield client
    client.close()


def _chat(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": "gpt-test", "messages": [{"role": "user", "content": text}], **extra}


def _params(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": "claude-test", "max_tokens": 50, "messages": [{"role": "user", "content": text}], **extra}


def _json_format() -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": SCHEMA}}


def _outcomes(fake: FakeBatchServer) -> None:
    fake.errored = lambda custom_id: custom_id.startswith("bad")
    fake.expired = lambda custom_id: custom_id.startswith("late")


def test_openai_round_trip_reports_every_outcome(fake: FakeBatchServer, openai_client: OpenAIBatchClient) -> None:
    fake.complete_after_polls = 2
    _outcomes(fake)
    lines = [RequestLine(c, _chat(f"q {c}")) for c in ("ok-a1", "bad-a1", "late-a1", "ok2-a1")]
    batch_id = openai_client.submit(lines, metadata={"run": "r1"})

    running = openai_client.retrieve(batch_id)
    assert (running.state, running.status) == ("in_progress", "in_progress")
    assert running.counts == {"succeeded": 1, "errored": 1, "processing": 2}
    ended = openai_client.retrieve(batch_id)
    # OpenAI calls a batch with rows left unrun "expired"; its rows are readable all the same
    assert (ended.state, ended.status, ended.error) == ("ended", "expired", None)
    assert ended.counts == {"succeeded": 2, "errored": 1, "expired": 1}

    rows = {row.custom_id: row for row in openai_client.results(batch_id)}
    assert {c: r.outcome for c, r in rows.items()} == {
        "ok-a1": "succeeded",
        "ok2-a1": "succeeded",
        "bad-a1": "errored",
        "late-a1": "expired",
    }
    ok = rows["ok-a1"]
    assert (ok.answer, ok.model, ok.error) == ("echo: q ok-a1", "gpt-test", None)
    assert (ok.input_tokens, ok.output_tokens) == usage(lines[0].body, "echo: q ok-a1")
    assert rows["bad-a1"].error == "server_error: fake row error" and rows["bad-a1"].answer is None
    assert rows["late-a1"].error is not None and rows["late-a1"].error.startswith("batch_expired: ")
    assert fake.batches[0].metadata == {"run": "r1"}  # no json_schema row: nothing added


def test_anthropic_round_trip_reports_every_outcome(
    fake: FakeBatchServer, anthropic_client: AnthropicBatchClient
) -> None:
    fake.complete_after_polls = 2
    _outcomes(fake)
    lines = [RequestLine(c, _params(f"q {c}")) for c in ("ok-a1", "bad-a1", "late-a1", "ok2-a1")]
    batch_id = anthropic_client.submit(lines, metadata={"run": "r1"})

    running = anthropic_client.retrieve(batch_id)
    assert (running.state, running.status, running.counts["processing"]) == ("in_progress", "in_progress", 2)
    ended = anthropic_client.retrieve(batch_id)
    assert (ended.state, ended.status) == ("ended", "ended")
    assert ended.counts == {"succeeded": 2, "errored": 1, "expired": 1, "cancelled": 0, "processing": 0}

    rows = {row.custom_id: row for row in anthropic_client.results(batch_id)}
    assert {c: r.outcome for c, r in rows.items()} == {
        "ok-a1": "succeeded",
        "ok2-a1": "succeeded",
        "bad-a1": "errored",
        "late-a1": "expired",
    }
    ok = rows["ok2-a1"]
    assert (ok.answer, ok.model) == ("echo: q ok2-a1", "claude-test")
    assert (ok.input_tokens, ok.output_tokens) == usage(lines[3].body, "echo: q ok2-a1")
    assert rows["bad-a1"].error == "api_error: fake row error"
    assert rows["late-a1"].error is not None and rows["late-a1"].error.startswith("expired: ")


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_cancel_leaves_the_rows_that_ran_readable(fake: FakeBatchServer, provider: str) -> None:
    fake.complete_after_polls = 4
    base_url = fake.base_url if provider == "openai" else fake.anthropic_base_url
    client = client_for(provider, api_key="test-key", base_url=base_url)
    body = _chat if provider == "openai" else _params
    batch_id = client.submit([RequestLine(f"i{n}-a1", body(f"q{n}")) for n in range(4)], metadata={})
    client.retrieve(batch_id)  # one row of four has run
    client.cancel(batch_id)
    assert client.retrieve(batch_id).state == "ended"
    rows = sorted((row.custom_id, row.outcome) for row in client.results(batch_id))
    assert rows == [("i0-a1", "succeeded")] + [(f"i{n}-a1", "cancelled") for n in (1, 2, 3)]
    client.close()


def test_openai_line_bytes_are_the_bytes_uploaded(fake: FakeBatchServer, openai_client: OpenAIBatchClient) -> None:
    lines = [RequestLine("ü-1", _chat("naïve 東京 ✓")), RequestLine("b-1", _chat("x", temperature=0.5))]
    batch_id = openai_client.submit(lines, metadata={})
    batch = fake.batch(batch_id)
    assert batch is not None and batch.input_file_id is not None
    uploaded = fake.files[batch.input_file_id][1]
    assert sum(openai_client.line_bytes(line) for line in lines) == len(uploaded)
    assert [json.loads(line)["custom_id"] for line in uploaded.splitlines()] == ["ü-1", "b-1"]


def test_anthropic_line_bytes_are_the_bytes_sent(fake: FakeBatchServer) -> None:
    sent: list[int] = []

    def record(request: httpx2.Request) -> None:
        if request.method == "POST":
            sent.append(len(request.read()))

    http = httpx2.Client(event_hooks={"request": [record]})
    sdk = anthropic.Anthropic(api_key="test-key", base_url=fake.anthropic_base_url, http_client=http)
    client = AnthropicBatchClient(client=sdk)
    lines = [RequestLine(f"r{n}-1", _params(f"naïve 東京 {n}")) for n in range(3)]
    client.submit(lines, metadata={})
    # {"requests":[a,b,c]}: the framing, and the lines less the one comma the last one does not need
    assert sent == [len('{"requests":[]}') + sum(client.line_bytes(line) for line in lines) - 1]
    client.close()


def test_openai_find_matches_metadata_among_recent_batches(
    fake: FakeBatchServer, openai_client: OpenAIBatchClient
) -> None:
    now = time.time()
    fake.clock = lambda: now - 3600  # an hour ago: older than created_after and its slack
    openai_client.submit([RequestLine("o-1", _chat("x"))], metadata={"run": "old"})
    fake.clock = lambda: now
    first = openai_client.submit([RequestLine("a-1", _chat("x"))], metadata={"run": "r1", "chunk": "0"})
    newest = openai_client.submit([RequestLine("a-2", _chat("x"))], metadata={"run": "r1", "chunk": "0"})
    other = openai_client.submit([RequestLine("b-1", _chat("x"))], metadata={"run": "r2"})

    assert openai_client.find({"run": "r1", "chunk": "0"}, created_after=now - 5) == newest != first
    assert openai_client.find({"run": "r2"}, created_after=now - 5) == other
    assert openai_client.find({"run": "r1", "chunk": "1"}, created_after=now - 5) is None
    assert openai_client.find({"run": "old"}, created_after=now - 5) is None
    assert openai_client.find({"run": "old"}, created_after=now - 3600) == fake.batches[0].id


def test_anthropic_find_is_none(fake: FakeBatchServer, anthropic_client: AnthropicBatchClient) -> None:
    anthropic_client.submit([RequestLine("a-1", _params("x"))], metadata={"run": "r1"})
    assert not anthropic_client.supports_metadata
    assert anthropic_client.find({"run": "r1"}, created_after=0) is None


def test_openai_structured_answers_are_parsed(fake: FakeBatchServer, openai_client: OpenAIBatchClient) -> None:
    # A plain request answered with a JSON-looking text keeps its text; a json_schema one that is not
    # JSON stays a str for the step's validation to name.
    texts = {"plain": '{"not": "parsed"}', "broken": "not json"}
    default = fake.answer
    fake.answer = lambda body: texts.get(body["messages"][-1]["content"], default(body))
    tool = {"type": "function", "function": {"name": "final_result", "parameters": SCHEMA}}
    lines = [
        RequestLine("schema-1", _chat("s", response_format=_json_format())),
        RequestLine("broken-1", _chat("broken", response_format=_json_format())),
        RequestLine("tool-1", _chat("t", tools=[tool])),
        RequestLine("plain-1", _chat("plain")),
    ]
    batch_id = openai_client.submit(lines, metadata={"run": "r1"})
    assert fake.batches[0].metadata == {"run": "r1", JSON_ROWS_KEY: "some"}
    answers = {row.custom_id: row.answer for row in openai_client.results(batch_id)}
    assert answers == {
        "schema-1": {"city": "x", "rank": 1},
        "broken-1": "not json",
        "tool-1": {"city": "x", "rank": 1},
        "plain-1": '{"not": "parsed"}',
    }

    only_json = openai_client.submit([RequestLine("s-2", _chat("s", response_format=_json_format()))], metadata={})
    assert fake.batches[-1].metadata == {JSON_ROWS_KEY: "all"}
    assert [row.answer for row in openai_client.results(only_json)] == [{"city": "x", "rank": 1}]


def test_anthropic_structured_answer_is_the_tool_input(
    fake: FakeBatchServer, anthropic_client: AnthropicBatchClient
) -> None:
    params = _params("s", tools=[{"name": "out", "input_schema": SCHEMA}], tool_choice={"type": "tool", "name": "out"})
    batch_id = anthropic_client.submit([RequestLine("s-1", params)], metadata={})
    assert [row.answer for row in anthropic_client.results(batch_id)] == [{"city": "x", "rank": 1}]


def test_openai_malformed_line_is_skipped(
    fake: FakeBatchServer, openai_client: OpenAIBatchClient, caplog: pytest.LogCaptureFixture
) -> None:
    batch_id = openai_client.submit([RequestLine(f"i{n}-1", _chat("x")) for n in range(3)], metadata={})
    batch = fake.batch(batch_id)
    assert batch is not None and batch.output_file_id is not None
    name, data, created = fake.files[batch.output_file_id]
    good = data.splitlines(keepends=True)
    broken = good[0] + b"{not json\n" + b'{"custom_id": "i1-1", "response": {"status_code": 200}}\n' + good[2]
    fake.files[batch.output_file_id] = (name, broken, created)

    assert sorted(row.custom_id for row in openai_client.results(batch_id)) == ["i0-1", "i2-1"]
    assert sum("skipped a malformed line" in r.getMessage() for r in caplog.records) == 2


def test_anthropic_malformed_line_is_skipped(
    fake: FakeBatchServer,
    anthropic_client: AnthropicBatchClient,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    key = ("GET", "/v1/messages/batches/([^/]+)/results")
    original = batch_api._ROUTES[key]

    def with_bad_lines(*args: Any) -> Any:
        status, payload = original(*args)
        return status, b'not json\n{"custom_id": "x-1", "result": {"type": "mystery"}}\n' + payload

    monkeypatch.setitem(batch_api._ROUTES, key, with_bad_lines)
    batch_id = anthropic_client.submit([RequestLine(f"i{n}-1", _params("x")) for n in range(2)], metadata={})
    assert sorted(row.custom_id for row in anthropic_client.results(batch_id)) == ["i0-1", "i1-1"]
    assert sum("skipped a malformed result" in r.getMessage() for r in caplog.records) == 2


def test_a_failed_batch_and_a_refused_call(fake: FakeBatchServer, openai_client: OpenAIBatchClient) -> None:
    fake.fail_batch = lambda batch: "the input file is over the token limit"
    batch_id = openai_client.submit([RequestLine("a-1", _chat("x"))], metadata={})
    info = openai_client.retrieve(batch_id)
    assert (info.state, info.status) == ("failed", "failed")
    assert info.error == "invalid_request: the input file is over the token limit"
    with pytest.raises(BatchAPIError, match="openai refused the retrieval of batch batch_nope: HTTP 404"):
        openai_client.retrieve("batch_nope")
    claude = AnthropicBatchClient("test-key", fake.anthropic_base_url)
    with pytest.raises(BatchAPIError, match="anthropic refused the creation of a message batch of 1 requests"):
        claude.submit([RequestLine("a-1", _params("x"))], metadata={})
    claude.close()


def test_client_for_names_the_providers(fake: FakeBatchServer) -> None:
    assert isinstance(client_for("openai", api_key="k", base_url=fake.base_url), OpenAIBatchClient)
    assert isinstance(client_for("anthropic", api_key="k", base_url=None), AnthropicBatchClient)
    with pytest.raises(
        ConfigurationError, match='provider=\'gemini\' has no batch API here; use "openai" or "anthropic"'
    ):
        client_for("gemini", api_key=None, base_url=None)


@pytest.mark.parametrize("cls", [OpenAIBatchClient, AnthropicBatchClient])
def test_a_missing_sdk_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch, cls: type[Any]) -> None:
    monkeypatch.setitem(sys.modules, cls.provider, None)  # import of it now raises ImportError
    with pytest.raises(ConfigurationError, match=r"pip install 'airflow-provider-datagen\[llm\]'"):
        cls("k", "http://127.0.0.1:9")
