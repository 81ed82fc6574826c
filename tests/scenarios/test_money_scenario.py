"""The issue's whole scenario on the model step, over real HTTP to the local OpenAI-compatible server.

300 prompts, about 10 % answered 429 + Retry-After and 3 % 500 on their first request; a budget stop,
a continuation SIGKILLed in the middle, a rerun to the end; then 5 rows edited, 2 added and 1 deleted
and a rerun: the export equals a fresh experiment's over the new source, and no completed item was
asked again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

import pytest

from airflow_provider_datagen.core import CheckpointLog, RetryPolicy, read_source, run_items
from airflow_provider_datagen.core.chunks import plan_chunks
from airflow_provider_datagen.core.export import export_results
from airflow_provider_datagen.llm import RETRYABLE_ERRORS, llm_process
from tests._support import openai_server

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from tests._support.openai_server import FakeOpenAI

PIPELINE = "money"
CONN_ID = "llm_money"
PROMPT = "Answer briefly: {{ text }}"
POLICY = RetryPolicy(attempts=4, retry_on=RETRYABLE_ERRORS, backoff=0.05, max_backoff=5.0)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def step() -> Any:
    return llm_process(PROMPT, llm_conn_id=CONN_ID)


def run_once(
    root: str, experiment: str, source: str, conn_id: str, budget_tokens: int | None, concurrency: int = 16
) -> Any:
    """One run as a DAG run does it: plan (which records the source), then the pending items."""
    assert conn_id == CONN_ID
    log = CheckpointLog.open(root, pipeline=PIPELINE, experiment=experiment)
    process = step()
    plan_chunks(log, source, processor_version=process.version, chunk_size=1000)
    return run_items(
        log,
        list(read_source(source)),
        process,
        processor_version=process.version,
        concurrency=concurrency,
        retry=POLICY,
        budget_tokens=budget_tokens,
    )


def _text(k: int) -> str:
    marker = " [429 once]" if k % 10 == 3 else " [500 once]" if k % 33 == 5 else ""
    return f"word {k}{marker}"


def _write(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOpenAI]:
    fake = openai_server.start(retry_after=1)
    answer = fake.answer
    failed_once: set[str] = set()

    def flaky(body: dict[str, Any]) -> Any:
        # "[500 once]": the first request of such a prompt is a 500, the next ones are answered
        text = openai_server._last_user_text(body)
        if "[500 once]" in text and text not in failed_once:
            failed_once.add(text)
            fake.requests.append(openai_server.Request(body, status=500))
            return 500, {}, {"error": {"message": "internal error", "type": "server_error"}}
        return answer(body)

    fake.answer = flaky  # type: ignore[method-assign]
    conn = {"conn_type": "pydanticai", "host": fake.base_url, "password": "sk-fake"}
    conn["extra"] = {"model": "openai-chat:gpt-4o-mini"}  # type: ignore[assignment]
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps(conn))
    try:
        yield fake
    finally:
        fake.stop()


def _answered(server: FakeOpenAI, start: int = 0) -> Counter[str]:
    return Counter(r.text for r in server.requests[start:] if r.status == 200)


@pytest.mark.slow  # `make test` runs it; `make unit`, the inner loop, leaves it out
def test_budget_stop_kill_edit_and_delete_export_what_a_fresh_run_exports(server: FakeOpenAI, tmp_path: Path) -> None:
    root = str(tmp_path / "root")
    source = tmp_path / "prompts.jsonl"
    rows = [{"id": f"p{k:03d}", "text": _text(k)} for k in range(300)]
    _write(source, rows)

    # 1. A budget stop: no item is left running, the never-sent ones are never_started, and every request
    # the server saw (429s and 500s included) is in the ledger.
    first = run_once(root, "e1", str(source), CONN_ID, budget_tokens=4000)
    assert first.stopped_by_budget
    log = CheckpointLog.open(root, pipeline=PIPELINE, experiment="e1")
    status = log.summary()
    assert status["stopped_by_budget"] is True
    assert status["total"] == 300
    assert status["running"] == 0
    assert status["completed"] == len(first.processed)
    assert status["never_started"] == 300 - len(first.processed)
    # a request the client sent that never reached the server (a connect that timed out under load;
    # the client's own retries are off) is a request too: an attempt failed with a connection error
    unreached = sum(1 for f in log.failures() if "Connection" in f.error_type or "Timeout" in f.error_type)
    errors = Counter(f"{f.error_type}: {f.message[:80]}" for f in log.failures())
    assert log.usage()["requests"] == len(server.requests) + unreached, errors
    done_first = set(first.processed)

    # 2. The continuation, SIGKILLed once the server has answered 60 more requests.
    seen = len(server.requests)
    env = {**os.environ, "PYTHONPATH": REPO}
    worker = subprocess.Popen(
        [
            *(sys.executable, "-m", "tests.scenarios.money_worker", "--root", root, "--experiment", "e1"),
            *("--source", str(source), "--conn-id", CONN_ID),
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        while sum(_answered(server, seen).values()) < 60 and worker.poll() is None:
            assert time.monotonic() < deadline, "the worker never reached 60 answers"
            time.sleep(0.01)
        assert worker.poll() is None, worker.communicate()
        os.kill(worker.pid, signal.SIGKILL)
    finally:
        worker.wait(timeout=30)
        worker.stdout.close()  # type: ignore[union-attr]
        worker.stderr.close()  # type: ignore[union-attr]
    assert worker.returncode == -signal.SIGKILL

    # 3. To the end: nothing completed before the stop is asked again.
    third = run_once(root, "e1", str(source), CONN_ID, budget_tokens=None)
    assert third.failed == []
    answered = _answered(server)
    texts = {r["id"]: PROMPT.replace("{{ text }}", r["text"]) for r in rows}
    assert [i for i in done_first if answered[texts[i]] != 1] == []

    # 4. The source changes: 5 rows edited, 2 added, 1 deleted.
    edited = [dict(r, text=r["text"] + " (edited)") if k in (10, 50, 90, 130, 170) else r for k, r in enumerate(rows)]
    new_rows = [r for r in edited if r["id"] != "p200"] + [{"id": "p300", "text": "new"}, {"id": "p301", "text": "two"}]
    _write(source, new_rows)
    fourth = run_once(root, "e1", str(source), CONN_ID, budget_tokens=None)
    assert sorted(fourth.processed) == ["p010", "p050", "p090", "p130", "p170", "p300", "p301"]
    resumed = export_results(CheckpointLog.open(root, pipeline=PIPELINE, experiment="e1"), str(tmp_path / "e1.lance"))
    assert resumed["rows"] == 301
    assert resumed["removed"] == 1
    status = CheckpointLog.open(root, pipeline=PIPELINE, experiment="e1").summary()
    assert (status["total"], status["completed"], status["removed"], status["pending"]) == (301, 301, 1, 0)

    # 5. A fresh experiment over the new source exports the same fingerprint.
    fresh_run = run_once(root, "fresh", str(source), CONN_ID, budget_tokens=None)
    assert fresh_run.failed == []
    fresh = export_results(CheckpointLog.open(root, pipeline=PIPELINE, experiment="fresh"), str(tmp_path / "f.lance"))
    assert fresh["rows"] == 301
    assert resumed["fingerprint"] == fresh["fingerprint"]
