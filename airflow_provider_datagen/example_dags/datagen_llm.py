"""A model step: plan -> translate each sentence with a model (retries, a shared rate limit, calls in flight) -> export.

Works with any ``pydanticai`` connection of Airflow's common.ai provider (install the ``[llm]`` extra on
the workers); the step runs on the default engine, the provider's own async SDK client (OpenAI's for
every OpenAI-compatible server, Anthropic's). For example, a local Ollama or vLLM server, or OpenAI::

    airflow connections add datagen_llm --conn-type pydanticai \\
        --conn-host http://127.0.0.1:11434/v1 --conn-extra '{"model": "ollama:llama3.2"}'
    airflow connections add datagen_llm --conn-type pydanticai \\
        --conn-host http://127.0.0.1:8000/v1 --conn-extra '{"model": "vllm:Qwen/Qwen2.5-7B-Instruct"}'
    airflow connections add datagen_llm --conn-type pydanticai \\
        --conn-password "$OPENAI_API_KEY" --conn-extra '{"model": "openai:gpt-5-mini"}'

Each item is one request: its tokens are recorded in the log (the usage ledger), the client's own
retries are off and ``retry=`` retries the transient errors (429s after their Retry-After, timeouts,
5xx) in place, ``rate_limit=`` keeps every mapped task under one budget, and ``concurrency=`` requests
are in flight per task. ``processor_version`` is the step's digest, so editing the prompt, the
instructions or the output type reruns every item; the plan of a later run finds nothing else to do.

The file parses without the ``[llm]`` extra: the SDKs are imported when the step first runs.

Environment knobs: ``DATAGEN_LLM_CONN_ID`` (default ``datagen_llm``), ``DATAGEN_LLM_MODEL`` (default:
the connection's model), ``DATAGEN_LLM_EXPERIMENT`` (default ``demo``), ``DATAGEN_LLM_ITEMS`` (default
20), ``DATAGEN_LLM_RPM`` (requests per minute, default 60), ``DATAGEN_EXPORT_DIR``.
"""

from __future__ import annotations

import os
from typing import Literal

import pendulum
from airflow.sdk import DAG
from pydantic import BaseModel, Field

from airflow_provider_datagen.llm import RETRYABLE_ERRORS, llm_process
from airflow_provider_datagen.operators.datagen import (
    DatagenExportOperator,
    DatagenMapOperator,
    DatagenPlanOperator,
)

CONN_ID = os.environ.get("DATAGEN_LLM_CONN_ID", "datagen_llm")
MODEL = os.environ.get("DATAGEN_LLM_MODEL") or None
EXPERIMENT = os.environ.get("DATAGEN_LLM_EXPERIMENT", "demo")
N_ITEMS = int(os.environ.get("DATAGEN_LLM_ITEMS", "20"))
EXPORT_DIR = os.environ.get(
    "DATAGEN_EXPORT_DIR",
    os.path.join(os.environ.get("AIRFLOW_HOME", os.path.expanduser("~/airflow")), "datagen_exports"),
)

SUBJECTS = ("The train", "My neighbour", "The old library", "A small cat", "The committee")
ACTIONS = ("leaves at dawn", "has repainted the fence", "opens late on Thursdays", "sleeps in the sun", "meets again")


def sentences(n: int) -> list[dict[str, str]]:
    """``n`` deterministic English sentences keyed ``s000``, ``s001``, ..."""
    return [{"id": f"s{i:03d}", "text": f"{SUBJECTS[i % 5]} {ACTIONS[(i // 5) % 5]} ({i})."} for i in range(n)]


class Translation(BaseModel):
    """What the model answers per sentence: both fields become the item's output fields."""

    french: str = Field(description="the sentence in French")
    formality: Literal["formal", "informal"] = Field(description="the register of the translation")


translate = llm_process(
    "Translate into French: {{ text }}",
    llm_conn_id=CONN_ID,
    model_id=MODEL,
    instructions="You are a careful translator. Keep numbers and punctuation as they are.",
    output_type=Translation,
    timeout=120,
)

with DAG(
    dag_id="datagen_llm",
    schedule=None,
    start_date=pendulum.datetime(2025, 1, 1, tz="UTC"),
    catchup=False,
    tags=["datagen", "example", "llm"],
    doc_md=__doc__,
):
    plan = DatagenPlanOperator(
        task_id="plan",
        pipeline="translate",
        experiment=EXPERIMENT,
        source=sentences(N_ITEMS),
        key_field="id",
        chunk_size=10,
        processor_version=translate.version,  # type: ignore[attr-defined]
    )
    generate = DatagenMapOperator.partial(
        task_id="generate",
        pipeline="translate",
        experiment=EXPERIMENT,
        process=translate,
        processor_version=translate.version,  # type: ignore[attr-defined]
        # 429s, timeouts and 5xx: up to 5 requests per item, at least the server's Retry-After apart
        retry={"attempts": 5, "retry_on": list(RETRYABLE_ERRORS), "backoff": 2.0, "max_backoff": 60.0},
        # one budget for every mapped task that names this key (and every other DAG that does)
        rate_limit={"requests_per_minute": int(os.environ.get("DATAGEN_LLM_RPM", "60")), "key": CONN_ID},
        concurrency=8,
    ).expand_kwargs(plan.output)
    export = DatagenExportOperator(
        task_id="export",
        pipeline="translate",
        experiment=EXPERIMENT,
        destination=os.path.join(EXPORT_DIR, f"translate_{EXPERIMENT}.lance"),
        trigger_rule="none_failed",
    )
    plan >> generate >> export
