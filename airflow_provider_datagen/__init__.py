"""airflow-provider-datagen: resumable per-item data generation for Apache Airflow 3."""

from __future__ import annotations

__version__ = "0.1.0"
