"""What the batch-run tests share: items, a step on the fake server, a run with small polls, ledger reads."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_provider_datagen.core import run_batch
from airflow_provider_datagen.core.batch import custom_id
from airflow_provider_datagen.core.sources import prepare_items
from airflow_provider_datagen.llm import llm_batch
from tests._support.engine import open_log

if TYPE_CHECKING:
    import os

    from airflow_provider_datagen.core import CheckpointLog
    from airflow_provider_datagen.core.batch import BatchReport
    from airflow_provider_datagen.llm import LLMBatchStep

OPENAI_MODEL = "openai:gpt-4o-mini"
ANTHROPIC_MODEL = "anthropic:claude-3-5-haiku-latest"
PROMPT = "Say: {{ text }}"


def open_experiment(root: str | os.PathLike[str], experiment: str) -> CheckpointLog:
    """The log the ``checkpoint_log`` fixture opens (pipeline "p"), from a worker process too."""
    return open_log(root, experiment, "p")


def make_items(n: int, prefix: str = "i") -> list[dict[str, Any]]:
    return [{"id": f"{prefix}{k:05d}", "text": f"hello {k:05d}"} for k in range(n)]


def bases(items: list[dict[str, Any]]) -> dict[str, str]:
    """item id -> the custom_id base its requests carry (the fake server's requests_per_custom_id_base key)."""
    return {it.item_id: custom_id(it.item_id, it.fingerprint, 0).rsplit("-", 1)[0] for it in prepare_items(items, "id")}


def openai_step(base_url: str, **kw: Any) -> LLMBatchStep:
    # the batch-run tests count submissions across experiments of one root: the response store would
    # answer their repeated prompts (its own tests pass reuse=True)
    kw.setdefault("reuse", False)
    return llm_batch(
        kw.pop("prompt", PROMPT), model_id=kw.pop("model_id", OPENAI_MODEL), base_url=base_url, api_key="k", **kw
    )


def anthropic_step(base_url: str, **kw: Any) -> LLMBatchStep:
    kw.setdefault("reuse", False)
    return llm_batch(
        kw.pop("prompt", PROMPT), model_id=kw.pop("model_id", ANTHROPIC_MODEL), base_url=base_url, api_key="k", **kw
    )


def run(log: CheckpointLog, items: list[dict[str, Any]], step: LLMBatchStep, **kw: Any) -> BatchReport:
    return run_batch(
        log,
        items,
        step,
        processor_version=kw.pop("processor_version", step.version),
        writer_id=kw.pop("writer_id", "w"),
        epoch=kw.pop("epoch", None) or log.next_epoch(),
        poll_interval=kw.pop("poll_interval", 0.0),
        **kw,
    )


def attempts(log: CheckpointLog, item_id: str) -> list[dict[str, Any]]:
    return list(log.item_usage(item_id)["attempts"])
