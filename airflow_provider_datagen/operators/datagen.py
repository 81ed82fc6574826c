"""Operators: plan pending work, run it resumably per item in mapped chunks, export, maintain.

Each operator is a thin adapter: ``__init__`` stores and checks cheap keyword arguments, the hook is a
``cached_property``, and ``execute`` calls one function of :mod:`airflow_provider_datagen.core`. One
module per operator (``plan``, ``map``, ``batch``, ``export``, ``maintenance``, on ``base``); this module is the
public import path and names them all.
"""

from __future__ import annotations

from airflow_provider_datagen.exceptions import ItemsFailedError
from airflow_provider_datagen.links import DatagenStatusLink
from airflow_provider_datagen.operators.base import REPORT_XCOM_KEY, STATUS_XCOM_KEY
from airflow_provider_datagen.operators.batch import DatagenBatchOperator
from airflow_provider_datagen.operators.export import DatagenExportOperator, asset_uri
from airflow_provider_datagen.operators.maintenance import DatagenMaintenanceOperator
from airflow_provider_datagen.operators.map import DatagenMapOperator
from airflow_provider_datagen.operators.plan import DatagenPlanOperator
from airflow_provider_datagen.operators.process import resolve_process

__all__ = [
    "REPORT_XCOM_KEY",
    "STATUS_XCOM_KEY",
    "DatagenBatchOperator",
    "DatagenExportOperator",
    "DatagenMaintenanceOperator",
    "DatagenMapOperator",
    "DatagenPlanOperator",
    "DatagenStatusLink",
    "ItemsFailedError",
    "asset_uri",
    "resolve_process",
]
