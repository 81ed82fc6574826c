"""Scenario 1: 2,000 items in 20 chunks across both worker hosts, each completed exactly once.

The same DAG runs three times on the same stack (same PostgreSQL, same S3 store), each run on an
experiment of its own: on both Celery workers, on one (``generate`` pinned to ``host-a``'s queue), and
on the LocalExecutor (the scheduler's own processes; the stack runs ``CeleryExecutor,LocalExecutor``).
Their exports must equal each other and an uninterrupted in-process run. Throughput is reported as
items/s over the generation window (first ``generate`` start to last ``generate`` end).
"""

from __future__ import annotations

import time
from collections import Counter
from typing import TYPE_CHECKING

import pytest

from airflow_provider_datagen.core import EventType
from tests.e2e.celery.support import (
    RUN_TIMEOUT,
    CeleryClient,
    baseline_fingerprint,
    event_counts,
    generate_tis,
    install,
    item_ids,
    report,
    span_seconds,
)

if TYPE_CHECKING:
    from pathlib import Path

N, CHUNK = 2000, 100
KNOBS = {"items": N, "chunk": CHUNK, "latency": 0.005, "checkpoint_every": 50, "concurrency": 4}
MODES = {
    "two_workers": ({}, {"host-a", "host-b"}),
    "one_worker": ({"queue": "host-a"}, {"host-a"}),
    "local_executor": ({"executor": "LocalExecutor"}, {"control"}),
}


def test_2000_items_in_20_chunks_complete_exactly_once_on_two_hosts(celery_stack: CeleryClient, tmp_path: Path):
    client = celery_stack
    started = time.monotonic()
    expected = baseline_fingerprint(tmp_path, N)
    fingerprints: dict[str, str] = {}
    rates: dict[str, float] = {}
    for mode, (knobs, hosts) in MODES.items():
        dag = install(client, f"datagen_celery_s1_{mode}", **KNOBS, **knobs)
        run_id = client.trigger(dag.dag_id)
        client.wait_success(dag.dag_id, run_id, timeout=RUN_TIMEOUT)

        tis = generate_tis(client, dag.dag_id, run_id)
        assert len(tis) == N // CHUNK
        assert all(t["state"] == "success" and t["try_number"] == 1 for t in tis), tis
        results = [client.xcom(dag.dag_id, run_id, "generate", map_index=t["map_index"]) for t in tis]
        assert [(r["processed"], r["invocations"], r["skipped"], r["failed"]) for r in results] == [
            (CHUNK, CHUNK, 0, 0)
        ] * (N // CHUNK)

        # Invocation records (written by the process on whichever host ran it): each item exactly once.
        calls = dag.invocations()
        assert Counter(c.item_id for c in calls) == Counter(item_ids(N))
        assert {c.host for c in calls} == hosts, f"{mode}: ran on {Counter(c.host for c in calls)}"

        # The log on S3: every item completed, one ITEM_CREATED and one TERMINAL each, no violation.
        log = dag.log()
        summary = log.summary()
        assert (summary["completed"], summary["pending"], summary["failed_items"]) == (N, 0, 0)
        assert summary["fencing_violations"] == 0
        assert event_counts(log, EventType.TERMINAL) == Counter(item_ids(N))
        assert event_counts(log, EventType.ITEM_CREATED) == Counter(item_ids(N))

        fingerprints[mode] = client.xcom(dag.dag_id, run_id, "export")["fingerprint"]
        rates[mode] = round(N / span_seconds(tis), 1)
        if mode == "two_workers":
            by_host = Counter(c.host for c in calls)
            report("scenario 1 two workers", items_per_host=dict(by_host))

    assert fingerprints == dict.fromkeys(MODES, expected), "an executor's export differs from the uninterrupted run"
    report(
        "scenario 1",
        seconds=round(time.monotonic() - started, 1),
        items=N,
        chunks=N // CHUNK,
        items_per_s=rates,
        fingerprint=expected[:16],
    )


@pytest.fixture(autouse=True)
def _stack_alive(celery_stack: CeleryClient):
    yield
    celery_stack.cluster.check_alive()
