"""Batch mode: pending items through a provider's batch API, recorded per item exactly once (see :mod:`.run`).

No provider SDK and no Airflow here: the step and the client come from ``airflow_provider_datagen.llm.batch``
(or any object keeping the protocols of :mod:`.protocol`).
"""

from __future__ import annotations

from airflow_provider_datagen.core.batch.run import BatchReport, BatchRun, custom_id, run_batch

__all__ = ["BatchReport", "BatchRun", "custom_id", "run_batch"]
