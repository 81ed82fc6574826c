"""A model step on Airflow's common.ai provider (the ``[llm]`` extra): :func:`llm_process`, :func:`llm_step`.

Importing this package needs neither pydantic-ai nor the common.ai provider: they are imported when a
step first runs, on the worker, so a DAG file using it parses where the extra is not installed.
"""

from __future__ import annotations

from airflow_provider_datagen.llm.errors import RETRYABLE_ERRORS
from airflow_provider_datagen.llm.process import LLMProcess, llm_process, llm_step

__all__ = ["RETRYABLE_ERRORS", "LLMProcess", "llm_process", "llm_step"]
