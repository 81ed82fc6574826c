"""Batch mode: pending items through a provider's batch API, recorded per item exactly once (see :mod:`.run`).

No provider SDK and no Airflow here: the step and the client come from ``airflow_provider_datagen.llm.batch``
(or any object keeping the protocols of :mod:`.protocol`). The names below load on first use (PEP 562), so
a DAG file that builds an ``llm_batch`` step (which imports :mod:`.protocol`) does not import Lance.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_provider_datagen.core.batch.config import BatchConfig
    from airflow_provider_datagen.core.batch.report import BatchReport
    from airflow_provider_datagen.core.batch.run import BatchRun, custom_id, run_batch

__all__ = ["BatchConfig", "BatchReport", "BatchRun", "custom_id", "run_batch"]


def __getattr__(name: str) -> Any:
    if name == "BatchConfig":
        return importlib.import_module("airflow_provider_datagen.core.batch.config").BatchConfig
    if name in __all__:
        return getattr(importlib.import_module("airflow_provider_datagen.core.batch.run"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
