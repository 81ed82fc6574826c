"""The HTTP clients' loggers are at WARNING while a model step's calls are in flight, and back after:
no task-log line per request (httpx's ``HTTP Request: POST ...`` at INFO), on both engines."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from typing import TYPE_CHECKING, Any

import pytest

from airflow_provider_datagen.core import RetryPolicy, run_items
from airflow_provider_datagen.llm import RETRYABLE_ERRORS, llm_process
from airflow_provider_datagen.llm.quiet import HTTP_LOGGERS, quiet_http_logs
from tests._support import openai_server
from tests._support.engine import open_log

if TYPE_CHECKING:
    from pathlib import Path


def test_the_levels_are_warning_inside_and_restored_after_the_last_block() -> None:
    httpx_logger, openai_logger = logging.getLogger("httpx"), logging.getLogger("openai")
    httpx_logger.setLevel(logging.INFO)
    openai_logger.setLevel(logging.ERROR)  # higher already: kept
    try:
        with quiet_http_logs():
            assert httpx_logger.level == logging.WARNING and openai_logger.level == logging.ERROR
            with quiet_http_logs():  # a concurrent call
                pass
            assert httpx_logger.level == logging.WARNING  # still one call in flight
        assert httpx_logger.level == logging.INFO and openai_logger.level == logging.ERROR
    finally:
        httpx_logger.setLevel(logging.NOTSET)
        openai_logger.setLevel(logging.NOTSET)


@pytest.mark.parametrize("engine", ["sdk", "pydantic-ai"])
def test_a_run_writes_no_log_line_per_request(
    engine: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    levels: list[dict[str, int]] = []
    lock = threading.Lock()

    def during(_request: object) -> None:
        with lock:
            levels.append({name: logging.getLogger(name).getEffectiveLevel() for name in HTTP_LOGGERS})

    fake = openai_server.start(on_arrival=during)
    conn = {"conn_type": "pydanticai", "host": fake.base_url, "password": "sk-fake"}
    conn["extra"] = {"model": "openai-chat:gpt-4o-mini"}  # type: ignore[assignment]
    monkeypatch.setenv("AIRFLOW_CONN_LLM_QUIET", json.dumps(conn))
    before = {name: logging.getLogger(name).level for name in HTTP_LOGGERS}
    caplog.set_level(logging.INFO)  # the root at INFO: a request's INFO line would be captured
    process = llm_process("Repeat {{ text }}", llm_conn_id="llm_quiet", engine=engine)
    items = [{"id": f"q{k}", "text": f"word {k}"} for k in range(6)]
    log = open_log(tmp_path, "quiet")
    try:
        report = run_items(
            log,
            items,
            process,
            processor_version=process.version,  # type: ignore[attr-defined]
            concurrency=3,
            retry=RetryPolicy(attempts=2, retry_on=RETRYABLE_ERRORS, backoff=0.1),
        )
    finally:
        fake.stop()
    assert report.failed == [] and len(fake.requests) == 6
    # while each request was in flight, every HTTP logger was at WARNING (or higher)
    assert len(levels) == 6 and all(level >= logging.WARNING for seen in levels for level in seen.values())
    assert [r.getMessage() for r in caplog.records if "HTTP Request" in r.getMessage()] == []
    assert {name: logging.getLogger(name).level for name in HTTP_LOGGERS} == before


@pytest.mark.parametrize("engine", ["sdk", "pydantic-ai"])
def test_the_levels_stay_quiet_between_calls_until_the_loop_shuts_down(
    engine: str, monkeypatch: pytest.MonkeyPatch, make_ctx: Any
) -> None:
    fake = openai_server.start()
    conn = {"conn_type": "pydanticai", "host": fake.base_url, "password": "sk-fake"}
    conn["extra"] = {"model": "openai-chat:gpt-4o-mini"}  # type: ignore[assignment]
    monkeypatch.setenv("AIRFLOW_CONN_LLM_QUIET", json.dumps(conn))
    process = llm_process("Repeat {{ text }}", llm_conn_id="llm_quiet", engine=engine)
    httpx2 = logging.getLogger("httpx2")
    before = httpx2.level
    httpx2.setLevel(logging.INFO)  # what a request would log at

    async def one_after_another() -> int:
        await process({"text": "a"}, make_ctx("k1"))
        between = httpx2.getEffectiveLevel()  # no call in flight, the run still going: not switched back
        await process({"text": "b"}, make_ctx("k2"))
        return between

    try:
        assert asyncio.run(one_after_another()) == logging.WARNING
        assert httpx2.level == logging.INFO  # the loop shut down: restored
    finally:
        fake.stop()
        httpx2.setLevel(before)


def test_a_level_reset_while_a_block_is_open_is_quieted_again_by_the_next_call() -> None:
    """Airflow configures logging on the first connection read, inside the first call's block: it may set
    an HTTP logger back to INFO while the loop's block is still open; the next call quiets it again."""
    httpx2 = logging.getLogger("httpx2")
    before = httpx2.level
    with quiet_http_logs():  # the loop's block, open for the whole run
        httpx2.setLevel(logging.INFO)  # logging configured meanwhile
        with quiet_http_logs():  # the next call
            assert httpx2.getEffectiveLevel() == logging.WARNING
    assert httpx2.level == before  # the last block restores what was there before the run
