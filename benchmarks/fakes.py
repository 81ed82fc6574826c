"""The Airflow-level benchmark's per-item fake work (``benchmarks/airflow_level.py``).

``DATAGEN_FAKE_LATENCY`` (seconds, set by ``benchmarks/run.py`` for each size of work) makes each
call sleep like a model call; the answer is a hash of the prompt, like the example DAGs' fakes.
"""

from __future__ import annotations

import hashlib
import os
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_provider_datagen.core import ItemContext

LATENCY_ENV = "DATAGEN_FAKE_LATENCY"


class TransientBenchError(RuntimeError):
    """A fake item's failed first attempt."""


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def bench_fails_first(item_id: str) -> bool:
    """One item in a hundred fails its first attempt (the benchmark's 99 %-done rerun)."""
    return int(_digest(item_id)[:4], 16) % 100 == 0


def bench_work(item: dict[str, Any]) -> dict[str, Any]:
    """The benchmark's per-item fake work: a short sleep and a hash."""
    latency = float(os.environ.get(LATENCY_ENV, "0") or 0)
    if latency > 0:
        time.sleep(latency)
    h = _digest(str(item.get("prompt", "")))
    return {"answer": f"answer-{h[:12]}"}


def bench_model(item: dict[str, Any], ctx: ItemContext) -> dict[str, Any]:
    """:func:`bench_work` as a datagen process; 1 % of items fail their first attempt."""
    if ctx.attempt == 1 and bench_fails_first(ctx.item_id):
        raise TransientBenchError(f"fake transient error for {ctx.item_id}")
    return bench_work(item)
