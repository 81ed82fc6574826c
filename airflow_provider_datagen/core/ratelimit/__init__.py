"""Shared rate limits: a :class:`RateLimit` budget per key, drawn by every process and host that names it.

``spec`` holds the serialisable budget, ``sqlite`` the embedded cross-process storage, ``limiter``
the limiter built on ``limits``' moving window. See docs/adr/0009-shared-rate-limits.md.
"""

from __future__ import annotations

from airflow_provider_datagen.core.ratelimit.limiter import (
    REDIS_SCHEMES,
    STORAGE_SCHEMES,
    SharedLimiter,
    check_storage_uri,
    default_storage_path,
    open_limiter,
    redact_storage_uri,
)
from airflow_provider_datagen.core.ratelimit.spec import RateLimit
from airflow_provider_datagen.core.ratelimit.sqlite import SQLiteStorage

__all__ = [
    "REDIS_SCHEMES",
    "STORAGE_SCHEMES",
    "RateLimit",
    "SQLiteStorage",
    "SharedLimiter",
    "check_storage_uri",
    "default_storage_path",
    "open_limiter",
    "redact_storage_uri",
]
