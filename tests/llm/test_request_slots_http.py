"""The model step under a rate limit, over real HTTP to the local OpenAI-compatible server
(tests/_support/openai_server.py), on both engines: a slot for each request as it is sent (validation
retries, 429s and 500s included), none while the client is still being built; and the errors of a
systemic failure (an unreachable server, a missing connection) say what to fix."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from typing import TYPE_CHECKING, Any

import openai
import pytest
from airflow.providers.common.ai.hooks.pydantic_ai import PydanticAIHook
from pydantic import BaseModel
from pydantic_ai.exceptions import ModelConnectionError

from airflow_provider_datagen.core import RetryPolicy, run_items
from airflow_provider_datagen.core.ratelimit import RateLimit, open_limiter
from airflow_provider_datagen.core.runner import run as run_module
from airflow_provider_datagen.core.schema import EventType
from airflow_provider_datagen.exceptions import ConfigurationError, RepeatedFailureError
from airflow_provider_datagen.llm import RETRYABLE_ERRORS, llm_process, sdk
from tests._support import openai_server
from tests._support.engine import open_log

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from tests._support.openai_server import FakeOpenAI
    from tests._support.recording_context import RecordingContext

POLICY = RetryPolicy(attempts=3, retry_on=RETRYABLE_ERRORS, backoff=0.1, max_backoff=5.0)


class Translation(BaseModel):
    french: str
    words: int


def _connection(monkeypatch: pytest.MonkeyPatch, conn_id: str, base_url: str) -> None:
    conn = {"conn_type": "pydanticai", "host": base_url, "password": "sk-fake"}
    conn["extra"] = {"model": "openai-chat:gpt-4o-mini"}  # type: ignore[assignment]
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(conn))


@pytest.fixture(params=["sdk", "pydantic-ai"])
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def events() -> list[str]:
    """What happened, in order: "built" (the agent), "slot" (a rate-limit slot granted), "arrival" (at the server)."""
    return []


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch, events: list[str]) -> Iterator[FakeOpenAI]:
    fake = openai_server.start(
        retry_after=1, tool_args={"french": "bonjour", "words": 1}, on_arrival=lambda _r: events.append("arrival")
    )
    _connection(monkeypatch, "llm_slots", fake.base_url)
    try:
        yield fake
    finally:
        fake.stop()


def test_each_http_request_takes_one_slot_as_it_is_sent(
    server: FakeOpenAI, events: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: str
) -> None:
    lock = threading.Lock()

    def note(what: str) -> None:
        with lock:
            events.append(what)

    real_open = run_module.open_limiter

    def recording_open(*args: Any, **kwargs: Any) -> Any:
        # every slot the run takes, whoever takes it (the runner before an attempt, or the process)
        limiter = real_open(*args, **kwargs)
        acquire, acquire_async = limiter.acquire, limiter.acquire_async

        def sync_slot(*a: Any, **k: Any) -> float:
            waited = acquire(*a, **k)
            note("slot")
            return waited

        async def async_slot(*a: Any, **k: Any) -> float:
            waited = await acquire_async(*a, **k)
            note("slot")
            return waited

        limiter.acquire, limiter.acquire_async = sync_slot, async_slot
        return limiter

    real_create = PydanticAIHook.create_agent

    def recording_create(self: PydanticAIHook, *args: Any, **kwargs: Any) -> Any:
        agent = real_create(self, *args, **kwargs)
        note("built")
        return agent

    real_client = sdk._new_client

    def recording_client(*args: Any) -> Any:
        client = real_client(*args)
        note("built")
        return client

    monkeypatch.setattr(run_module, "open_limiter", recording_open)
    monkeypatch.setattr(PydanticAIHook, "create_agent", recording_create)
    monkeypatch.setattr(sdk, "_new_client", recording_client)
    # 9 items, 12 HTTP requests: a 429 and a 500 answered on the retried attempt, and an answer that
    # fails validation sent back to the model within its one call
    markers = {0: " [429 once]", 1: " [500 once]", 2: " [invalid once]"}
    items = [{"id": f"q{k}", "text": f"word {k}{markers.get(k, '')}"} for k in range(9)]
    requests = 12
    limit = RateLimit(requests_per_minute=requests, key="llm-slots")
    process = llm_process(
        "Translate {{ text }}",
        llm_conn_id="llm_slots",
        output_type=Translation,
        output_retries=1,
        engine=engine,
    )
    log = open_log(tmp_path, "slots")
    report = run_items(
        log, items, process, processor_version=process.version, concurrency=4, retry=POLICY, rate_limit=limit
    )
    assert report.failed == []
    assert sorted(str(r.status) for r in server.requests) == sorted(["429", "500"] + ["200"] * 10)
    assert len(server.requests) == requests
    # no slot was taken while the client was being built (the runner took one per attempt, before it)
    assert events.index("built") < events.index("slot")
    # one slot per request, each granted before its request arrived
    assert events.count("slot") == events.count("arrival") == requests
    for n in range(len(events)):
        assert events[:n].count("slot") >= events[:n].count("arrival"), events
    # the window holds exactly those slots: the key's budget is spent, so nothing more may start now
    probe = open_limiter(limit, root=str(log.root))
    try:
        assert probe.try_acquire() is False
    finally:
        probe.close()
    # the ledger counts every request (the 429 and the 500 too) and every reply
    usage = log.usage()
    assert usage["requests"] == requests
    assert usage["calls"] == 10


def test_an_unreachable_server_is_named_by_its_base_url_and_stays_retryable(
    monkeypatch: pytest.MonkeyPatch, make_ctx: Callable[..., RecordingContext], engine: str
) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    _connection(monkeypatch, "llm_down", url)
    process = llm_process("{{ w }}", llm_conn_id="llm_down", engine=engine)
    ctx = make_ctx()
    # the SDK's aiohttp transport reports a refused connect as a timeout (an APIConnectionError too)
    with pytest.raises(openai.APIConnectionError if engine == "sdk" else ModelConnectionError) as caught:
        asyncio.run(process({"w": "hello"}, ctx))
    assert str(caught.value).endswith(
        f". (model 'gpt-4o-mini' at {url}/: is the server up, and is it the host of the step's connection?)"
    )
    assert POLICY.retryable(caught.value)
    assert ctx.requests == 1 and ctx.usage == []


def test_a_missing_connection_says_how_to_add_it_and_is_not_retried(
    monkeypatch: pytest.MonkeyPatch, make_ctx: Callable[..., RecordingContext], engine: str
) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_NO_SUCH_LLM", raising=False)
    process = llm_process("{{ w }}", llm_conn_id="no_such_llm", model_id="openai:gpt-5-mini", engine=engine)
    ctx = make_ctx()
    with pytest.raises(ConfigurationError) as caught:
        asyncio.run(process({"w": "hello"}, ctx))
    assert str(caught.value) == (
        "llm_process: the connection 'no_such_llm' (llm_conn_id) does not exist; add it, e.g. "
        "`airflow connections add no_such_llm --conn-type pydanticai --conn-host <base url> "
        '--conn-password <api key> --conn-extra \'{"model": "openai:gpt-5-mini"}\'`, '
        "or pass the llm_conn_id of an existing one"
    )
    assert type(caught.value.__cause__).__name__ == "AirflowNotFoundException"
    assert not POLICY.matches(caught.value)  # systemic: every item would fail the same way
    assert ctx.requests == 0


def test_a_missing_connection_stops_the_run_early_with_one_attempt_per_item(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_NO_SUCH_LLM", raising=False)
    process = llm_process("{{ text }}", llm_conn_id="no_such_llm")
    log = open_log(tmp_path, "missing")
    items = [{"id": f"q{k}", "text": f"word {k}"} for k in range(12)]
    with pytest.raises(RepeatedFailureError, match="ConfigurationError") as caught:
        run_items(
            log, items, process, processor_version=process.version, retry=POLICY, concurrency=1, max_repeated_failures=3
        )
    assert "no_such_llm" in str(caught.value)
    failed = [ev for k in range(12) for ev in log.events(f"q{k}") if ev.event_type is EventType.FAILED]
    assert len(failed) == 3  # one attempt each (not retried), then no new item started
    assert all(json.loads(ev.value_json)["transient"] is False for ev in failed)
