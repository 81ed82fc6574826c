"""Scenarios 3 and 4: a REST clear beside a busy second run of the experiment; maintenance beside writers.

3. A run on ``host-a`` fails two chunks (injected first-attempt failures). While ``host-b`` is busy with a
   run of a second DAG on the same experiment (a superset of the items), the failed map indexes are
   cleared over REST (``clearTaskInstances``, ``dry_run: false``, ``[task_id, map_index]``). Both runs
   finish, every item is completed once, and the only fencing violations are those of a zombie: the
   failed attempt's writer as it was in memory, writing after its successor took the items over.
4. ``DatagenMaintenanceOperator`` on ``host-a`` and on ``host-b`` race for the experiment's lease (an
   object on S3) while both hosts write: exactly one maintains, the other is a no-op, nothing is lost.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import TYPE_CHECKING

from airflow_provider_datagen.core import EventType, export_results
from tests.e2e.celery.support import (
    RUN_TIMEOUT,
    CeleryClient,
    baseline_fingerprint,
    event_counts,
    generate_tis,
    install,
    item_ids,
    report,
    when,
)

if TYPE_CHECKING:
    from pathlib import Path

FAIL_ONCE = ["p0003", "p0005", "p0045"]  # chunk 0 (twice) and chunk 2 of 20-item chunks


def test_clear_failed_map_indexes_over_rest_while_another_host_runs_the_same_experiment(
    celery_stack: CeleryClient, tmp_path: Path
):
    client = celery_stack
    started = time.monotonic()
    experiment = "s3_shared"
    first = install(
        client,
        "datagen_celery_s3_first",
        experiment=experiment,
        items=60,
        chunk=20,
        latency=0.05,
        checkpoint_every=5,
        concurrency=2,
        fail_once=FAIL_ONCE,
        queue="host-a",
    )
    second = install(
        client,
        "datagen_celery_s3_second",
        experiment=experiment,
        items=120,
        chunk=30,
        latency=0.25,
        checkpoint_every=5,
        concurrency=2,
        queue="host-b",
    )
    expected = baseline_fingerprint(tmp_path, 120)

    run1 = client.trigger(first.dag_id)
    assert client.wait_run(first.dag_id, run1, timeout=RUN_TIMEOUT) == "failed"
    tis = {t["map_index"]: t["state"] for t in generate_tis(client, first.dag_id, run1)}
    assert tis == {0: "failed", 1: "success", 2: "failed"}
    log = first.log()
    assert sorted(r.item_id for r in log.failures()) == FAIL_ONCE

    # The zombie: attempt 1 of generate[0] as it was in memory (its writer, epoch and item sequences).
    targets = ["p0003", "p0005"]
    old = log.events("p0003")[0]
    assert old.writer_id == first.writer_id(run1, 0)
    zombie = log.writer(old.writer_id, old.writer_epoch, processor_version="v1")
    for iid, st in log.item_states(targets).items():
        zombie.prime(iid, last_seq=st.last_seq, input_fingerprint=st.input_fingerprint, field_modes=st.field_modes)

    run2 = client.trigger(second.dag_id)
    deadline = time.monotonic() + RUN_TIMEOUT
    while sum(1 for c in second.invocations() if c.host == "host-b") < 5:
        assert time.monotonic() < deadline, "the second run never got busy on host-b"
        time.sleep(0.1)
    cleared = client.clear(first.dag_id, run1, [("generate", 0), ("generate", 2)], include_downstream=True)
    assert sorted((t["task_id"], t["map_index"]) for t in cleared) == [("export", -1), ("generate", 0), ("generate", 2)]
    assert client.run_state(second.dag_id, run2) == "running", "the second run was not busy during the clear"

    client.wait_success(first.dag_id, run1, timeout=RUN_TIMEOUT)
    client.wait_success(second.dag_id, run2, timeout=RUN_TIMEOUT)
    reruns = {t["map_index"]: t for t in generate_tis(client, first.dag_id, run1) if t["try_number"] == 2}
    assert sorted(reruns) == [0, 2]
    busy = generate_tis(client, second.dag_id, run2)
    overlaps = sum(
        1
        for a in reruns.values()
        for b in busy
        if max(when(a["start_date"]), when(b["start_date"])) < min(when(a["end_date"]), when(b["end_date"]))
    )

    # Each item once: one ITEM_CREATED, one TERMINAL; the acknowledged items of run 1 never ran again.
    log = first.log()
    assert event_counts(log, EventType.TERMINAL) == Counter(item_ids(120))
    assert event_counts(log, EventType.ITEM_CREATED) == Counter(item_ids(120))
    calls = Counter(c.item_id for c in first.invocations()) + Counter(c.item_id for c in second.invocations())
    assert {i: c for i, c in calls.items() if i not in FAIL_ONCE} == dict.fromkeys(
        set(item_ids(120)) - set(FAIL_ONCE), 1
    )
    assert all(2 <= calls[i] <= 3 for i in FAIL_ONCE), {i: calls[i] for i in FAIL_ONCE}
    summary = log.summary()
    assert (summary["completed"], summary["pending"], summary["failed_items"]) == (120, 0, 0)
    assert summary["fencing_violations"] == 0

    # The zombie writes after its successors acknowledged the items: refused, counted, harmless.
    with zombie.batch() as b:
        for iid in targets:
            b.field_set(iid, "answer", "ZOMBIE")
    log = first.log()
    summary = log.summary()
    assert summary["fencing_violations"] == zombie.events_written == len(targets)
    lens = [r for r in log.failures() if r.error_type == "FencingViolation"]
    assert sorted(r.item_id for r in lens) == targets
    assert {(r.writer_id, r.epoch) for r in lens} == {(old.writer_id, old.writer_epoch)}
    assert export_results(log, str(tmp_path / "after.lance"))["fingerprint"] == expected
    report(
        "scenario 3",
        seconds=round(time.monotonic() - started, 1),
        invocations=sum(calls.values()),
        failed_items_invocations={i: calls[i] for i in FAIL_ONCE},
        rerun_overlapping_second_run_tasks=overlaps,
        fencing_violations=summary["fencing_violations"],
        fingerprint=expected[:16],
    )


def test_maintenance_races_on_two_hosts_while_both_write_one_wins_nothing_lost(
    celery_stack: CeleryClient, tmp_path: Path
):
    client = celery_stack
    started = time.monotonic()
    n = 200
    dag = install(
        client,
        "datagen_celery_s4",
        items=n,
        chunk=25,
        latency=0.2,
        checkpoint_every=3,
        concurrency=2,
        maintenance=True,
        barrier_invocations=20,
    )
    expected = baseline_fingerprint(tmp_path, n)
    run_id = client.trigger(dag.dag_id)
    client.wait_success(dag.dag_id, run_id, timeout=RUN_TIMEOUT)

    results = {host: client.xcom(dag.dag_id, run_id, f"maintain_{host}") for host in ("a", "b")}
    winners = [h for h, r in results.items() if not r["skipped"]]
    assert len(winners) == 1, f"exactly one maintenance must win the lease: {results}"
    (winner,) = winners
    (loser,) = {"a", "b"} - {winner}
    assert results[loser] == {"skipped": True, "reason": "another maintenance worker holds the lease"}
    assert results[winner]["fragments_after"] < results[winner]["fragments_before"]

    # It maintained while the other host wrote: that host invoked items inside the winner's window.
    tis = {t["task_id"]: t for t in client.task_instances(dag.dag_id, run_id)}
    maintained = tis[f"maintain_{winner}"]
    window = (when(maintained["start_date"]).timestamp(), when(maintained["end_date"]).timestamp())
    # Which host's generate tasks run inside the window is the Celery queue's choice (both hosts
    # take the default queue), so the writes during maintenance are counted over both hosts.
    calls = dag.invocations()
    during = [c for c in calls if window[0] <= c.at <= window[1]]
    assert during, f"nothing was written while host-{winner} maintained"

    log = dag.log()
    assert Counter(c.item_id for c in calls) == Counter(item_ids(n))
    assert event_counts(log, EventType.TERMINAL) == Counter(item_ids(n))
    summary = log.summary()
    assert (summary["completed"], summary["pending"], summary["failed_items"]) == (n, 0, 0)
    assert summary["fencing_violations"] == 0
    assert client.xcom(dag.dag_id, run_id, "export")["fingerprint"] == expected
    report(
        "scenario 4",
        seconds=round(time.monotonic() - started, 1),
        winner=f"host-{winner}",
        loser=results[loser],
        fragments=(results[winner]["fragments_before"], results[winner]["fragments_after"]),
        invocations_during_maintenance=len(during),
        hosts_writing_during_maintenance=sorted({c.host for c in during}),
        fingerprint=expected[:16],
    )
