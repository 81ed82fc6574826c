"""The keys a step records are the requests' own: equal prompts give equal keys whatever the item ids,
an output-validation retry included (its feedback names no item)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
from pydantic import BaseModel

from airflow_provider_datagen.core import run_items
from airflow_provider_datagen.llm import llm_process
from tests._support import openai_server
from tests._support.engine import open_log

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from airflow_provider_datagen.core import CheckpointLog
    from tests._support.openai_server import FakeOpenAI


class Capital(BaseModel):
    city: str


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOpenAI]:
    fake = openai_server.start(tool_args={"city": "Lima"})
    conn = {"conn_type": "pydanticai", "host": fake.base_url, "password": "sk-fake"}
    conn["extra"] = {"model": "openai-chat:gpt-4o-mini"}  # type: ignore[assignment]
    monkeypatch.setenv("AIRFLOW_CONN_LLM_KEYS", json.dumps(conn))
    try:
        yield fake
    finally:
        fake.stop()


def _keys(log: CheckpointLog, item: str) -> list[tuple[bool, list[str]]]:
    (ev,) = [e for e in log.events(item) if e.event_type.value == "STEP_COMPLETED"]
    assert ev.value_json is not None
    return [(e.get("reused", False), e["request_keys"]) for e in json.loads(ev.value_json)["usage"]]


def test_a_validation_retry_is_reused_by_an_experiment_with_other_item_ids(server: FakeOpenAI, tmp_path: Path) -> None:
    process = llm_process("Capital of {{ text }}", llm_conn_id="llm_keys", output_type=Capital)
    items: list[dict[str, Any]] = [{"id": "a", "text": "Peru [invalid once]"}]
    first = open_log(tmp_path, "first")
    run_items(first, items, process, processor_version=process.version)
    assert sum(1 for r in server.requests if r.status == 200) == 2  # the answer, then the retry
    assert "'a'" not in server.requests[1].text  # the feedback names no item
    second = open_log(tmp_path, "second")
    report = run_items(second, [{"id": "b", "text": "Peru [invalid once]"}], process, processor_version=process.version)
    assert report.failed == []
    assert len(server.requests) == 2  # both answers read from the store, the retry's too
    ((sent, keys),) = _keys(first, "a")
    assert sent is False and len(keys) == 2
    assert _keys(second, "b") == [(True, keys)]
