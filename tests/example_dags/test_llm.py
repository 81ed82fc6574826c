"""The model-step example DAG: it parses without the [llm] extra, and its step answers over HTTP."""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

import airflow_provider_datagen.example_dags as example_dags
from airflow_provider_datagen.llm import RETRYABLE_ERRORS
from tests._support import openai_server
from tests._support.recording_context import RecordingContext

if TYPE_CHECKING:
    import pytest

LLM_DAG = Path(example_dags.__file__).parent / "datagen_llm.py"

# Parse the DAG file as the dag-processor does, with pydantic-ai, openai and the common.ai provider's hooks
# unimportable (the provider's package stays: Airflow's provider discovery reads its metadata).
_PARSE = textwrap.dedent(
    """
    import json, sys
    for name in ("pydantic_ai", "openai", "airflow.providers.common.ai.hooks"):
        sys.modules[name] = None  # import raises ImportError
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=sys.argv[1], safe_mode=False)
    dag = bag.dags.get("datagen_llm")
    out = {"errors": {k: str(v) for k, v in bag.import_errors.items()}}
    if dag is not None:
        gen = dag.get_task("generate")
        out["tasks"] = sorted(dag.task_ids)
        keys = ("retry", "rate_limit", "concurrency", "processor_version")
        out["generate"] = {k: gen.partial_kwargs.get(k) for k in keys}
        out["process"] = gen.partial_kwargs["process"].__qualname__
        out["plan_version"] = dag.get_task("plan").processor_version
    out["imported"] = sorted(m for m in ("pydantic_ai", "openai") if sys.modules.get(m) is not None)
    print(json.dumps(out, default=str))
    """
)


def test_the_llm_example_parses_without_the_llm_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = {**os.environ, "DATAGEN_LLM_CONN_ID": "my_llm"}
    done = subprocess.run(
        [sys.executable, "-c", _PARSE, str(LLM_DAG)], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["errors"] == {}
    assert out["imported"] == []
    assert out["tasks"] == ["export", "generate", "plan"]
    generate = out["generate"]
    assert generate["retry"] == {
        "attempts": 5,
        "retry_on": list(RETRYABLE_ERRORS),
        "backoff": 2.0,
        "max_backoff": 60.0,
        "jitter": True,
    }
    assert generate["rate_limit"]["requests_per_minute"] == 60 and generate["rate_limit"]["key"] == "my_llm"
    assert generate["concurrency"] == 8
    assert out["process"] == "llm_process.<locals>.process"
    assert generate["processor_version"] == out["plan_version"] and out["plan_version"].startswith("llm-")
    from airflow_provider_datagen.example_dags import datagen_llm

    # the worker parses the file again, in another process: the version must not change there (the
    # version covers the connection id, so this parse reads the same DATAGEN_LLM_CONN_ID)
    monkeypatch.setenv("DATAGEN_LLM_CONN_ID", "my_llm")
    try:
        assert out["plan_version"] == importlib.reload(datagen_llm).translate.version  # type: ignore[attr-defined]
    finally:
        monkeypatch.undo()
        importlib.reload(datagen_llm)


def test_the_examples_step_translates_through_any_openai_compatible_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_provider_datagen.example_dags import datagen_llm

    fake = openai_server.start(tool_args={"french": "Le train part à l'aube (0).", "formality": "formal"})
    try:
        # the connection a user would add for a local vLLM server
        conn = {"conn_type": "pydanticai", "host": fake.base_url, "extra": {"model": "vllm:Qwen/Qwen2.5-7B-Instruct"}}
        monkeypatch.setenv(f"AIRFLOW_CONN_{datagen_llm.CONN_ID.upper()}", json.dumps(conn))
        [item] = datagen_llm.sentences(1)
        ctx = RecordingContext(item["id"])
        fields = asyncio.run(datagen_llm.translate(item, ctx))
    finally:
        fake.stop()
    assert fields == {"french": "Le train part à l'aube (0).", "formality": "formal"}
    [request] = fake.requests
    assert request.body["model"] == "Qwen/Qwen2.5-7B-Instruct"
    # the default engine: the OpenAI SDK with the JSON-schema response format, not pydantic-ai's output tool
    assert request.body["response_format"]["type"] == "json_schema" and "tools" not in request.body
    assert request.text == "Translate into French: The train leaves at dawn (0)."
    assert request.usage is not None
    tokens = {"input_tokens": request.usage["prompt_tokens"], "output_tokens": request.usage["completion_tokens"]}
    assert ctx.usage == [{"model": "vllm:Qwen/Qwen2.5-7B-Instruct", **tokens, "cost_usd": None, "calls": 1}]
