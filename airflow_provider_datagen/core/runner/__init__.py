"""The resume engine: drives source items through a pipeline with inbox/ack semantics and group commit.

Modules, by job: ``context`` (what a step sees), ``interpreter`` (steps to events), ``contract``
(what a step may return and write), ``commit`` (the inbox and group commit), ``failures``, ``driver``
(the main thread's runner), ``threads`` (``concurrency=N``), ``shared`` (what the runner and its
workers share), ``run`` (``run_items``).
See docs/design.md, Resume.
"""

from __future__ import annotations

from airflow_provider_datagen.core.runner.commit import MIN_PULL
from airflow_provider_datagen.core.runner.context import ItemContext
from airflow_provider_datagen.core.runner.report import RunReport
from airflow_provider_datagen.core.runner.run import run_items
from airflow_provider_datagen.core.runner.shared import DEFAULT_GROUP_ITEMS, DEFAULT_GROUP_SECONDS
from airflow_provider_datagen.exceptions import ItemFailedError, ProcessInterrupted

__all__ = [
    "DEFAULT_GROUP_ITEMS",
    "DEFAULT_GROUP_SECONDS",
    "MIN_PULL",
    "ItemContext",
    "ItemFailedError",
    "ProcessInterrupted",
    "RunReport",
    "run_items",
]
