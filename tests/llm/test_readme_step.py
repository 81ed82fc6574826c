"""The README's model step runs as written, against a local OpenAI-compatible server."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING

from tests._support import openai_server
from tests._support.recording_context import RecordingContext
from tests.test_readme import _block

if TYPE_CHECKING:
    import pytest


def test_the_readme_model_step_translates_as_written(monkeypatch: pytest.MonkeyPatch) -> None:
    code = _block("A model step", "translate = llm_process(")
    namespace: dict[str, object] = {}
    exec(compile(code, "README.md", "exec"), namespace)
    translate = namespace["translate"]
    fake = openai_server.start(tool_args={"french": "bonjour", "formality": "informal"})
    try:
        conn = {"conn_type": "pydanticai", "host": fake.base_url, "extra": {"model": "ollama:llama3.2"}}
        monkeypatch.setenv("AIRFLOW_CONN_DATAGEN_LLM", json.dumps(conn))
        ctx = RecordingContext("s1")
        fields = asyncio.run(translate({"id": "s1", "text": "hello"}, ctx))  # type: ignore[operator]
    finally:
        fake.stop()
    assert fields == {"french": "bonjour", "formality": "informal"}
    [request] = fake.requests
    assert request.body["model"] == "llama3.2"
    assert request.body["messages"][0] == {"role": "system", "content": "You are a careful translator."}
    assert request.text == "Translate into French: hello"
    assert [u["model"] for u in ctx.usage] == ["ollama:llama3.2"]
    assert translate.version.startswith("llm-")  # type: ignore[attr-defined]
