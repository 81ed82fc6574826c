"""Scenario 2: a worker host dies mid-run (SIGKILL of its whole process tree); the survivor finishes.

Airflow notices the dead host by its missing task heartbeats (the stack's
``task_instance_heartbeat_timeout`` is 30 s), fails its task instances into a retry, and the retry runs
on the surviving host. The rerun of a killed chunk skips what was acknowledged before the kill and
redoes only the invoked-but-unacknowledged items; nothing acknowledged runs again. Repeated with the
kill after a different number of the victim's invocations, drawn from a seeded RNG (the seed is
printed; ``DATAGEN_CELERY_SEED`` sets it).
"""

from __future__ import annotations

import os
import random
import time
from collections import Counter
from typing import TYPE_CHECKING

import pyarrow.compute as pc
import pytest

from airflow_provider_datagen.core import EventType
from dev.celery_stack import HOSTS
from tests.e2e.celery.support import (
    CeleryClient,
    CeleryDag,
    event_counts,
    generate_tis,
    install,
    item_ids,
    report,
)

if TYPE_CHECKING:
    from tests.e2e.celery.support import Invocation

SEED = int(os.environ.get("DATAGEN_CELERY_SEED", "18"))
REPETITIONS = 5
N, CHUNK = 60, 20
_RNG = random.Random(SEED)
#: The kill lands after this many invocations on the victim host (its first chunks are 20 items each).
KILL_POINTS = [_RNG.randint(2, 16) for _ in range(REPETITIONS)]


def wait_victim(dag: CeleryDag, kill_after: int, timeout: float = 300.0) -> str:
    """The first host with ``kill_after`` invocations of this DAG."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        per_host = Counter(c.host for c in dag.invocations())
        ready = [h for h in HOSTS if per_host[h] >= kill_after]
        if ready:
            return ready[0]
        time.sleep(0.02)
    raise AssertionError(f"no host reached {kill_after} invocations within {timeout:.0f} s")


def completed(dag: CeleryDag) -> set[str]:
    states = dag.log().states()
    return set(states.filter(pc.equal(states["status"], "completed"))["item_id"].to_pylist())


def chunks_of(client: CeleryClient, dag: CeleryDag, run_id: str) -> dict[int, set[str]]:
    return {i: set(c["chunk"]["item_ids"]) for i, c in enumerate(client.xcom(dag.dag_id, run_id, "plan"))}


@pytest.mark.parametrize("repetition", range(REPETITIONS))
def test_a_dead_host_is_rescheduled_onto_the_survivor_and_redoes_only_unacknowledged_items(
    celery_stack: CeleryClient, repetition: int
):
    client, cluster = celery_stack, celery_stack.cluster
    started = time.monotonic()
    kill_after = KILL_POINTS[repetition]
    print(f"\nscenario 2: seed {SEED}, repetition {repetition}, kill after {kill_after} invocations (of {KILL_POINTS})")
    dag = install(
        client,
        f"datagen_celery_s2_r{repetition}",
        items=N,
        chunk=CHUNK,
        latency=0.3,
        checkpoint_every=4,
        concurrency=2,
        retries=2,
    )
    run_id = client.trigger(dag.dag_id)
    victim = wait_victim(dag, kill_after)
    (survivor,) = [h for h in HOSTS if h != victim]
    killed_pids = cluster.kill_host(victim)
    killed_at = time.time()
    time.sleep(1.0)  # a request already on the wire when the host froze may still land
    acked = completed(dag)
    before: list[Invocation] = dag.invocations()
    chunks = chunks_of(client, dag, run_id)
    victim_items = {c.item_id for c in before if c.host == victim}
    killed_chunks = {i for i, ids in chunks.items() if ids & victim_items}
    in_flight = victim_items - acked  # invoked on the dead host, never acknowledged
    assert killed_chunks and any(chunks[i] - acked for i in killed_chunks), "the kill did not land mid-chunk"

    # The dead host's task instances are retried on the survivor; the victim comes back meanwhile for
    # the next repetition, but only once every retry is running (so none of them can land on it).
    deadline = time.monotonic() + 240
    while True:
        tis = {t["map_index"]: t for t in generate_tis(client, dag.dag_id, run_id)}
        retried = {i for i in killed_chunks if tis[i]["try_number"] >= 2 and tis[i]["state"] in ("running", "success")}
        if retried == killed_chunks:
            break
        assert time.monotonic() < deadline, f"the dead host's chunks were not retried: {tis}"
        time.sleep(0.5)
    noticed = time.time() - killed_at
    cluster.start_worker(cluster.worker(victim))
    client.wait_success(dag.dag_id, run_id, timeout=300)
    cluster.wait_ready(components=False)

    tis = {t["map_index"]: t for t in generate_tis(client, dag.dag_id, run_id)}
    # A chunk the dead host had taken but not yet started invoking is retried too (with nothing to skip).
    retried = {i for i, t in tis.items() if t["try_number"] > 1}
    assert killed_chunks <= retried
    assert {tis[i]["try_number"] for i in retried} == {2}
    for i in retried:
        rerun = client.xcom(dag.dag_id, run_id, "generate", map_index=i)
        assert rerun["skipped"] == len(chunks[i] & acked)
        assert rerun["processed"] == rerun["invocations"] == len(chunks[i] - acked)
        assert rerun["failed"] == 0

    calls = dag.invocations()
    after = calls[len(before) :]
    rerun_items = {c.item_id for c in after if any(c.item_id in chunks[i] for i in killed_chunks)}
    assert {c.host for c in after if c.item_id in rerun_items} == {survivor}
    assert rerun_items == set().union(*(chunks[i] for i in killed_chunks)) - acked
    assert rerun_items >= in_flight
    assert not (rerun_items & acked), "an acknowledged item ran again"
    counts = Counter(c.item_id for c in calls)
    assert set(counts) == set(item_ids(N))
    twice = {i for i, c in counts.items() if c == 2}
    assert max(counts.values()) <= 2 and twice == in_flight
    assert sum(counts.values()) == N + len(in_flight)
    assert all(counts[i] == 1 for i in acked), "an acknowledged item ran again"

    log = dag.log()
    summary = log.summary()
    assert (summary["completed"], summary["pending"], summary["failed_items"]) == (N, 0, 0)
    assert summary["fencing_violations"] == 0  # the dead host's processes are gone: no zombie wrote
    assert event_counts(log, EventType.TERMINAL) == Counter(item_ids(N))
    report(
        f"scenario 2 repetition {repetition}",
        seconds=round(time.monotonic() - started, 1),
        seed=SEED,
        kill_after=kill_after,
        victim=victim,
        killed_processes=len(killed_pids),
        killed_chunks=sorted(killed_chunks),
        retried_chunks=sorted(retried),
        acked_in_killed_chunks=sum(len(chunks[i] & acked) for i in killed_chunks),
        in_flight=len(in_flight),
        seconds_until_retry_running=round(noticed, 1),
        invocations=sum(counts.values()),
        max_invocations_per_item=max(counts.values()),
        items_run_twice=len(twice),
    )
