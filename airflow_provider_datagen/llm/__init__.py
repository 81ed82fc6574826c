"""A model step (the ``[llm]`` extra): :func:`llm_process`, :func:`llm_step`, :func:`llm_batch`.

Importing this package needs neither the provider SDKs, pydantic-ai nor the common.ai provider: they
are imported when a step first runs, on the worker, so a DAG file using it parses where the extra is
not installed. Every request is an :class:`~airflow_provider_datagen.llm.request.LLMRequest`.
"""

from __future__ import annotations

from airflow_provider_datagen.llm.batch.step import LLMBatchStep, llm_batch
from airflow_provider_datagen.llm.errors import RETRYABLE_ERRORS
from airflow_provider_datagen.llm.process import LLMProcess, llm_process, llm_step
from airflow_provider_datagen.llm.request import LLMRequest


def __getattr__(name: str) -> object:
    # run_batch lives in core (it imports Lance): loaded on first use, so a DAG file importing llm_batch
    # does not pay for it at parse time
    if name == "run_batch":
        from airflow_provider_datagen.core.batch import run_batch

        return run_batch
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "RETRYABLE_ERRORS",
    "LLMBatchStep",
    "LLMProcess",
    "LLMRequest",
    "llm_batch",
    "llm_process",
    "llm_step",
    "run_batch",
]
