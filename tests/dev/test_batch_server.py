"""The fake batch server answers the official OpenAI and Anthropic SDKs as their batch APIs would."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

import anthropic
import openai
import pytest

from dev.batch_answers import usage
from dev.batch_server import FakeBatchServer, custom_id_base, serving
from dev.batch_server_process import BatchServerProcess

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "tags": {"type": "array"}},
    "required": ["name", "age"],
}


@pytest.fixture
def fake() -> Iterator[FakeBatchServer]:
    with serving() as server:
        yield server


def _openai(fake: FakeBatchServer, **options: Any) -> openai.OpenAI:
    return openai.OpenAI(api_key="test", base_url=fake.base_url, **options)


def _anthropic(fake: FakeBatchServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key="test", base_url=fake.anthropic_base_url)


def _chat(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": "gpt-test", "messages": [{"role": "user", "content": text}], **extra}


def _params(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": "claude-test", "max_tokens": 100, "messages": [{"role": "user", "content": text}], **extra}


def _jsonl(rows: dict[str, dict[str, Any]]) -> bytes:
    lines = [{"custom_id": c, "method": "POST", "url": "/v1/chat/completions", "body": b} for c, b in rows.items()]
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def _openai_submit(client: openai.OpenAI, rows: dict[str, dict[str, Any]], **metadata: str) -> str:
    uploaded = client.files.create(file=("in.jsonl", _jsonl(rows)), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h", metadata=metadata
    )
    return batch.id


def _lines(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    with client.files.with_streaming_response.content(file_id) as response:
        return [json.loads(line) for line in response.iter_lines() if line]


def test_openai_batch_runs_as_it_is_retrieved_and_answers_each_row(fake: FakeBatchServer) -> None:
    fake.complete_after_polls = 2
    client = _openai(fake)
    batch_id = _openai_submit(client, {f"item{i}-s1": _chat(f"hello {i}") for i in range(4)}, run="r1")

    first = client.batches.retrieve(batch_id)
    assert (first.status, first.request_counts.completed, first.output_file_id) == ("in_progress", 2, None)
    done = client.batches.retrieve(batch_id)
    assert done.status == "completed"
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (4, 4, 0)
    assert done.metadata == {"run": "r1"} and done.error_file_id is None

    lines = _lines(client, done.output_file_id)
    assert [line["custom_id"] for line in lines] == [f"item{i}-s1" for i in range(4)]
    body = lines[1]["response"]["body"]
    assert lines[1]["response"]["status_code"] == 200 and lines[1]["error"] is None
    assert body["model"] == "gpt-test" and body["choices"][0]["message"]["content"] == "echo: hello 1"
    assert body["usage"]["prompt_tokens"] == 12 and body["usage"]["completion_tokens"] == len("echo: hello 1") // 4 + 1
    assert fake.requests_per_custom_id_base == {f"item{i}": 1 for i in range(4)}
    uploaded = client.files.retrieve(done.input_file_id)
    assert (uploaded.purpose, uploaded.bytes) == ("batch", len(fake.files[done.input_file_id][1]))
    assert [(b.provider, b.metadata, b.row_count) for b in fake.batches] == [("openai", {"run": "r1"}, 4)]


def test_openai_errored_and_expired_rows_are_in_the_error_file(fake: FakeBatchServer) -> None:
    fake.errored = lambda custom_id: custom_id.startswith("bad")
    fake.expired = lambda custom_id: custom_id.startswith("late")
    client = _openai(fake)
    batch_id = _openai_submit(client, {"ok-1": _chat("a"), "bad-1": _chat("b"), "late-1": _chat("c")})

    batch = client.batches.retrieve(batch_id)
    assert batch.status == "expired"  # OpenAI's word for a batch whose window ran out with rows unrun
    assert [line["custom_id"] for line in _lines(client, batch.output_file_id)] == ["ok-1"]
    errors = {line["custom_id"]: line for line in _lines(client, batch.error_file_id)}
    assert errors["bad-1"]["response"]["status_code"] == 500
    assert errors["bad-1"]["response"]["body"]["error"]["code"] == "server_error"
    assert errors["late-1"]["response"] is None and errors["late-1"]["error"]["code"] == "batch_expired"


def test_anthropic_batch_results_carry_every_outcome(fake: FakeBatchServer) -> None:
    fake.complete_after_polls = 2
    fake.errored = lambda custom_id: custom_id.startswith("bad")
    fake.expired = lambda custom_id: custom_id.startswith("late")
    client = _anthropic(fake)
    requests = [{"custom_id": c, "params": _params(c)} for c in ("ok-1", "bad-1", "late-1", "ok2-1")]
    created = client.messages.batches.create(requests=requests)  # type: ignore[arg-type]
    assert (created.processing_status, created.request_counts.processing, created.results_url) == (
        "in_progress",
        4,
        None,
    )

    assert client.messages.batches.retrieve(created.id).request_counts.processing == 2
    ended = client.messages.batches.retrieve(created.id)
    assert ended.processing_status == "ended" and ended.ended_at is not None
    counts = ended.request_counts
    assert (counts.succeeded, counts.errored, counts.expired, counts.canceled, counts.processing) == (2, 1, 1, 0, 0)

    results = {r.custom_id: r.result for r in client.messages.batches.results(created.id)}
    assert {c: r.type for c, r in results.items()} == {
        "ok-1": "succeeded",
        "bad-1": "errored",
        "late-1": "expired",
        "ok2-1": "succeeded",
    }
    message = results["ok-1"].message  # type: ignore[union-attr]
    assert message.model == "claude-test" and message.content[0].text == "echo: ok-1"  # type: ignore[union-attr]
    assert (message.usage.input_tokens, message.usage.output_tokens) == usage(_params("ok-1"), "echo: ok-1")
    assert results["bad-1"].error.error.type == "api_error"  # type: ignore[union-attr]


def test_shuffled_results_are_out_of_order_and_seeded() -> None:
    orders = []
    for _ in range(2):
        with serving(shuffle_results=True, seed=3) as fake:
            rows = {f"i{n}-s": _chat(str(n)) for n in range(20)}
            batch = _openai(fake).batches.retrieve(_openai_submit(_openai(fake), rows))
            orders.append([line["custom_id"] for line in _lines(_openai(fake), batch.output_file_id)])
    assert orders[0] == orders[1] and sorted(orders[0]) == sorted(rows) and orders[0] != list(rows)


def test_lists_page_newest_first(fake: FakeBatchServer) -> None:
    client = _openai(fake)
    ids = [_openai_submit(client, {f"i{n}-s": _chat("x")}) for n in range(5)]
    page = client.batches.list(limit=2)
    assert [b.id for b in page.data] == ids[:2:-1][:2] and page.has_more
    assert [b.id for b in client.batches.list(limit=2)] == ids[::-1]  # auto-paging walks every page

    claude = _anthropic(fake)
    message_ids = [
        claude.messages.batches.create(requests=[{"custom_id": f"i{n}-s", "params": _params("x")}]).id  # type: ignore[list-item]
        for n in range(3)
    ]
    first = claude.messages.batches.list(limit=2)
    assert [b.id for b in first.data] == message_ids[::-1][:2] and first.has_more
    assert [b.id for b in claude.messages.batches.list(limit=2)] == message_ids[::-1]


def test_cancel_ends_the_batch_with_its_unrun_rows_cancelled(fake: FakeBatchServer) -> None:
    fake.complete_after_polls = 4
    client = _openai(fake)
    batch_id = _openai_submit(client, {f"i{n}-s": _chat("x") for n in range(4)})
    client.batches.retrieve(batch_id)  # one row of four has run
    assert client.batches.cancel(batch_id).status == "cancelling"
    batch = client.batches.retrieve(batch_id)
    assert batch.status == "cancelled" and batch.request_counts.completed == 1
    assert [line["custom_id"] for line in _lines(client, batch.output_file_id)] == ["i0-s"]
    errors = _lines(client, batch.error_file_id)
    assert {line["error"]["code"] for line in errors} == {"batch_cancelled"} and len(errors) == 3

    claude = _anthropic(fake)
    created = claude.messages.batches.create(
        requests=[{"custom_id": f"m{n}-s", "params": _params("x")} for n in range(4)]  # type: ignore[misc]
    )
    claude.messages.batches.retrieve(created.id)
    assert claude.messages.batches.cancel(created.id).processing_status == "canceling"
    ended = claude.messages.batches.retrieve(created.id)
    assert ended.processing_status == "ended" and ended.cancel_initiated_at is not None
    assert (ended.request_counts.succeeded, ended.request_counts.canceled) == (1, 3)
    assert sorted(r.result.type for r in claude.messages.batches.results(created.id)) == ["canceled"] * 3 + [
        "succeeded"
    ]


def test_a_client_gone_during_create_leaves_the_batch_registered(fake: FakeBatchServer) -> None:
    fake.create_delay = 60  # ended by stop(), never waited out
    client = _openai(fake, timeout=0.5, max_retries=0)
    uploaded = client.files.create(file=("in.jsonl", _jsonl({"a-s": _chat("x")})), purpose="batch")
    with pytest.raises(openai.APITimeoutError):
        client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h", metadata={"k": "v"}
        )
    assert fake.creates == 1 and fake.batches[0].metadata == {"k": "v"}
    assert [b.id for b in _openai(fake).batches.list()] == [fake.batches[0].id]


def test_online_answers_equal_batch_answers(fake: FakeBatchServer) -> None:
    client, claude = _openai(fake), _anthropic(fake)
    bodies = {
        "plain-s": _chat("a question"),
        "schema-s": _chat("q", response_format={"type": "json_schema", "json_schema": {"name": "o", "schema": SCHEMA}}),
        "tool-s": _chat("q", tools=[{"type": "function", "function": {"name": "out", "parameters": SCHEMA}}]),
    }
    batch = client.batches.retrieve(_openai_submit(client, bodies))
    by_id = {line["custom_id"]: line["response"]["body"] for line in _lines(client, batch.output_file_id)}
    for custom_id, body in bodies.items():
        online = client.chat.completions.create(**body).model_dump(exclude_none=True)  # type: ignore[call-overload]
        batched = openai.types.chat.ChatCompletion.model_validate(by_id[custom_id]).model_dump(exclude_none=True)
        assert online["choices"][0]["message"] == batched["choices"][0]["message"]
        assert online["usage"] == batched["usage"]
    message = by_id["schema-s"]["choices"][0]["message"]
    assert json.loads(message["content"]) == {"name": "x", "age": 1, "tags": []}
    call = by_id["tool-s"]["choices"][0]["message"]["tool_calls"][0]["function"]
    assert call["name"] == "out" and json.loads(call["arguments"]) == {"name": "x", "age": 1, "tags": []}

    tool = {"name": "out", "input_schema": SCHEMA}
    params = _params("q", tools=[tool], tool_choice={"type": "tool", "name": "out"})
    created = claude.messages.batches.create(requests=[{"custom_id": "t-s", "params": params}])  # type: ignore[list-item]
    claude.messages.batches.retrieve(created.id)
    (row,) = claude.messages.batches.results(created.id)
    online_message = claude.messages.create(**params)
    assert row.result.message.content == online_message.content  # type: ignore[union-attr]
    assert online_message.content[0].input == {"name": "x", "age": 1, "tags": []}  # type: ignore[union-attr]
    assert row.result.message.usage == online_message.usage  # type: ignore[union-attr]
    assert fake.online_requests == 4


def test_the_answer_callable_decides_what_every_row_answers(fake: FakeBatchServer) -> None:
    fake.answer = lambda body: {"name": body["messages"][-1]["content"].upper(), "age": 7}
    fake.complete_after_polls = 1
    client = _anthropic(fake)
    params = _params("bob", tools=[{"name": "out", "input_schema": SCHEMA}], tool_choice={"type": "any"})
    created = client.messages.batches.create(requests=[{"custom_id": "b-s", "params": params}])  # type: ignore[list-item]
    client.messages.batches.retrieve(created.id)
    (row,) = client.messages.batches.results(created.id)
    assert row.result.message.content[0].input == {"name": "BOB", "age": 7}  # type: ignore[union-attr]


def test_a_failed_batch_names_why(fake: FakeBatchServer) -> None:
    fake.fail_batch = lambda batch: "too many tokens" if batch.row_count > 1 else None
    client = _openai(fake)
    batch = client.batches.retrieve(_openai_submit(client, {"a-s": _chat("x"), "b-s": _chat("y")}))
    assert batch.status == "failed" and batch.errors.data[0].message == "too many tokens"  # type: ignore[union-attr]
    assert batch.output_file_id is None and batch.error_file_id is None

    duplicate = _jsonl({"a-s": _chat("x")}) * 2
    uploaded = client.files.create(file=("dup.jsonl", duplicate), purpose="batch")
    created = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert created.status == "failed" and "repeats a custom_id" in created.errors.data[0].message  # type: ignore[union-attr]

    claude = _anthropic(fake)
    two = [{"custom_id": f"{n}-s", "params": _params("x")} for n in "ab"]
    with pytest.raises(anthropic.BadRequestError, match="too many tokens"):
        claude.messages.batches.create(requests=two)  # type: ignore[arg-type]
    with pytest.raises(anthropic.BadRequestError, match="custom_id"):
        claude.messages.batches.create(requests=[{"custom_id": "no spaces", "params": _params("x")}])  # type: ignore[list-item]


def test_custom_id_base_drops_the_submission_suffix() -> None:
    assert custom_id_base("item-7-a1") == "item-7" and custom_id_base("plain") == "plain"


def test_the_process_form_serves_until_stopped_by_its_pid(tmp_path: Path) -> None:
    server = BatchServerProcess(tmp_path, "--complete-after-polls", "1", "--errored-regex", "^bad")
    with server:
        assert server.process is not None
        pid_process = server.process
        client = openai.OpenAI(api_key="test", base_url=server.base_url)
        batch_id = _openai_submit(client, {"ok-s": _chat("hi"), "bad-s": _chat("no")})
        batch = client.batches.retrieve(batch_id)
        assert (batch.status, batch.request_counts.completed, batch.request_counts.failed) == ("completed", 1, 1)
        server.configure(errored_regex="")
        assert client.chat.completions.create(**_chat("hi")).choices[0].message.content == "echo: hi"  # type: ignore[call-overload]
        state = server.state()
        assert state["requests_per_custom_id_base"] == {"ok": 1, "bad": 1} and state["online_requests"] == 1
    assert not pid_process.alive()
    saved = json.loads((server.state_dir / "state.json").read_text())
    assert saved["batches"][0]["id"] == batch_id and saved["creates"] == 1


_CLIENT = """
import sys, openai
client = openai.OpenAI(api_key="test", base_url=sys.argv[1], max_retries=0)
uploaded = client.files.create(file=("in.jsonl", sys.stdin.buffer.read()), purpose="batch")
client.batches.create(
    input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h", metadata={"run": "killed"}
)
"""


def test_a_client_killed_inside_create_leaves_its_batch_at_the_process_server(tmp_path: Path) -> None:
    with BatchServerProcess(tmp_path, "--create-delay", "60") as server:  # ended by its stop, never waited out
        client = subprocess.Popen(
            [sys.executable, "-c", _CLIENT, server.base_url], stdin=subprocess.PIPE, start_new_session=True
        )
        try:
            assert client.stdin is not None
            client.stdin.write(_jsonl({"item1-s1": _chat("x"), "item2-s1": _chat("y")}))
            client.stdin.close()
            deadline = time.monotonic() + 60
            while server.state()["creates"] == 0:
                assert client.poll() is None and time.monotonic() < deadline, "the client never reached create"
                time.sleep(0.05)
        finally:
            os.kill(client.pid, signal.SIGKILL)  # by its own PID, also when the wait above failed
        assert client.wait(timeout=30) == -signal.SIGKILL

        server.configure(create_delay=0)
        listed = openai.OpenAI(api_key="test", base_url=server.base_url).batches.list()
        assert [(b.metadata, b.request_counts.total) for b in listed] == [({"run": "killed"}, 2)]  # type: ignore[union-attr]
        assert server.state()["requests_per_custom_id_base"] == {"item1": 1, "item2": 1}
