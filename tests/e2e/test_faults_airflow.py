"""Proof under faults in real Airflow: a SIGKILLed worker, a zombie attempt, two concurrent runs.

Issue 6, "End to end in real Airflow". Each scenario installs its own copy of
``tests/e2e/dags/datagen_faults_dag.py`` (its knobs in a JSON file beside it) into the session's
stack and drives Airflow only through the REST API. The test reads the experiment's Lance log
in-process at the hook's default root (``$AIRFLOW_HOME/datagen``) to check the folded state. The
uninterrupted baseline is an in-process ``run_items`` of ``reliable_fake_model`` over the same items
on a log of its own.

Each scenario prints one ``faults:`` line with what it measured (``pytest -s`` shows them).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import lance
import psutil
import pyarrow.compute as pc
import pytest

from airflow_provider_datagen.core import CheckpointLog, EventType, export_results, run_items
from airflow_provider_datagen.core.export import collect_results
from airflow_provider_datagen.example_dags.fakes import prompts, reliable_fake_model
from airflow_provider_datagen.exceptions import FencingError

if TYPE_CHECKING:
    from tests.e2e.harness import AirflowClient

pytestmark = pytest.mark.e2e

PIPELINE = "faults"
TEMPLATE = Path(__file__).parent / "dags" / "datagen_faults_dag.py"
RUN_TIMEOUT = 240.0
_CHUNK_DONE = re.compile(r"chunk done: .*\((\d+) commits, (\d+) events\)")


@dataclass(frozen=True)
class Invocation:
    item_id: str
    attempt: int
    pid: int
    at: float


@dataclass
class FaultDag:
    """One scenario's copy of the fault DAG in the stack's DAGs folder, and its side files."""

    client: AirflowClient
    dag_id: str
    experiment: str
    items: int
    invocation_log: Path

    def log(self) -> CheckpointLog:
        root = self.client.stack.settings.home / "datagen"
        return CheckpointLog.open(root, pipeline=PIPELINE, experiment=self.experiment)

    def invocations(self) -> list[Invocation]:
        out = []
        for line in self.invocation_log.read_text().splitlines():
            parts = line.split("\t")
            if len(parts) == 4:
                out.append(Invocation(parts[0], int(parts[1]), int(parts[2]), float(parts[3])))
        return out

    def writer_id(self, run_id: str, map_index: int) -> str:
        return f"{self.dag_id}/{run_id}/generate/{map_index}"


def install(client: AirflowClient, tmp_path: Path, dag_id: str, **knobs: Any) -> FaultDag:
    """Write ``<dag_id>.json`` then ``<dag_id>.py`` into the DAGs folder; wait until parsed; unpause."""
    side = tmp_path / "invocations.tsv"
    side.touch()
    config = {
        "dag_id": dag_id,
        "pipeline": PIPELINE,
        "experiment": dag_id,
        "invocation_log": str(side),
        "export_dir": str(tmp_path / "exports"),
        **knobs,
    }
    (client.dags_folder / f"{dag_id}.json").write_text(json.dumps(config, indent=1))
    client.add_dag_file(TEMPLATE, f"{dag_id}.py")
    client.wait_dag_parsed(dag_id, timeout=180)
    client.unpause(dag_id)
    return FaultDag(client, dag_id, dag_id, int(knobs["items"]), side)


def baseline(tmp_path: Path, n: int) -> tuple[dict[str, Any], dict[str, str]]:
    """The uninterrupted run: export result and folded results of ``prompts(n)`` on a fresh log."""
    log = CheckpointLog.open(tmp_path / "baseline", pipeline=PIPELINE, experiment="uninterrupted")
    report = run_items(log, prompts(n), reliable_fake_model, processor_version="v1")
    assert not report.failed and len(report.processed) == n
    return export_results(log, str(tmp_path / "baseline.lance")), collect_results(log)


def tis_by_key(client: AirflowClient, dag_id: str, run_id: str) -> dict[tuple[str, int], dict]:
    return {(t["task_id"], t["map_index"]): t for t in client.task_instances(dag_id, run_id)}


def scheduler_descendants(client: AirflowClient) -> set[int]:
    (scheduler,) = [p for p in client.stack.processes if p.name == "scheduler"]
    return {child.pid for child in psutil.Process(scheduler.pid).children(recursive=True)}


def ui_get(client: AirflowClient, path: str) -> httpx.Response:
    """GET a page of the datagen plugin (``/datagen/...``) with the admin's token."""
    response = httpx.get(client.base_url + path, headers={"Authorization": f"Bearer {client.token()}"}, timeout=30.0)
    assert response.status_code == 200, f"GET {path} -> {response.status_code}: {response.text[:1000]}"
    return response


def when(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def report(scenario: str, **measures: Any) -> None:
    print(f"\nfaults: {scenario}: " + ", ".join(f"{k}={v}" for k, v in measures.items()))


# -- 1. SIGKILL the worker mid-chunk --------------------------------------------------------------

# Invocations of the victim's chunk before the kill: past its first ack (group commit: every 10 items or
# 2 s), well before its last.
KILL_AFTER = 13


def wait_victim(client: AirflowClient, fd: FaultDag, run_id: str, timeout: float = 180.0) -> tuple[int, int]:
    """The PID and map index of a running ``generate`` instance that is mid-chunk.

    Airflow records the PID of the task's own process (the one running the user function) on the
    task instance; it must match the PID in the invocation side file and be a descendant of this
    stack's scheduler (LocalExecutor worker -> task supervisor -> task), so nothing else is killed.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        calls = Counter(inv.pid for inv in fd.invocations())
        busy = {pid for pid, n in calls.items() if n >= KILL_AFTER}
        if busy:
            for ti in client.task_instances(fd.dag_id, run_id):
                if ti["task_id"] == "generate" and ti["state"] == "running" and ti.get("pid") in busy:
                    pid = int(ti["pid"])
                    assert pid in scheduler_descendants(client), f"pid {pid} is not a task of this stack's scheduler"
                    return pid, int(ti["map_index"])
        time.sleep(0.05)
    raise AssertionError(f"no generate task reached {KILL_AFTER} invocations within {timeout:.0f} s")


def test_sigkill_worker_mid_chunk_then_clear_resumes_only_pending(airflow_stack: AirflowClient, tmp_path: Path):
    client = airflow_stack
    started = time.monotonic()
    n, chunk = 40, 20
    fd = install(client, tmp_path, "datagen_faults_kill", items=n, chunk=chunk, latency=0.2, checkpoint_every=10)
    expected, _ = baseline(tmp_path, n)

    run_id = client.trigger(fd.dag_id)
    pid, map_index = wait_victim(client, fd, run_id)
    os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    with contextlib.suppress(psutil.NoSuchProcess):
        psutil.Process(pid).wait(timeout=30)

    assert client.wait_run(fd.dag_id, run_id, timeout=RUN_TIMEOUT) == "failed"
    noticed = time.monotonic() - killed_at
    tis = tis_by_key(client, fd.dag_id, run_id)
    assert tis[("generate", map_index)]["state"] == "failed"
    assert tis[("export", -1)]["state"] == "upstream_failed"
    chunks = client.xcom(fd.dag_id, run_id, "plan")
    assert len(chunks) == n // chunk
    victim_items = set(chunks[map_index]["chunk"]["item_ids"])

    log = fd.log()
    states = log.states()
    completed = set(states.filter(pc.equal(states["status"], "completed"))["item_id"].to_pylist())
    invoked_by_victim = {inv.item_id for inv in fd.invocations() if inv.pid == pid}
    assert invoked_by_victim <= victim_items
    in_flight = invoked_by_victim - completed  # invoked, never acknowledged: the work the kill cost
    acked = victim_items & completed
    assert acked < victim_items, "the kill did not land mid-chunk"
    assert completed == (set(prompts_ids(n)) - victim_items) | acked
    assert not log.failures(), "a SIGKILL leaves no FAILED row: the items are simply unacknowledged"

    cleared = client.clear(fd.dag_id, run_id, [("generate", map_index)], include_downstream=True)
    assert sorted((t["task_id"], t["map_index"]) for t in cleared) == [("export", -1), ("generate", map_index)]
    client.wait_success(fd.dag_id, run_id, timeout=RUN_TIMEOUT)

    tis = tis_by_key(client, fd.dag_id, run_id)
    assert tis[("generate", map_index)]["try_number"] == 2
    assert all(t["try_number"] == 1 for key, t in tis.items() if key not in {("generate", map_index), ("export", -1)})
    rerun = client.xcom(fd.dag_id, run_id, "generate", map_index=map_index)
    assert rerun["skipped"] == len(acked)
    assert rerun["processed"] == rerun["invocations"] == chunk - len(acked)
    assert rerun["failed"] == 0
    assert rerun["replayed"] >= len(in_flight)

    exported = client.xcom(fd.dag_id, run_id, "export")
    assert exported == expected, "the resumed run's export differs from the uninterrupted run's"

    calls = Counter(inv.item_id for inv in fd.invocations())
    assert set(calls) == set(prompts_ids(n)), "every item was invoked"
    for item_id, count in calls.items():
        assert count <= 1 + (item_id in in_flight), f"{item_id} invoked {count} times"
    assert {i for i, c in calls.items() if c == 2} == in_flight
    assert sum(calls.values()) == n + len(in_flight)
    summary = log.summary()
    assert (summary["completed"], summary["pending"], summary["failed_items"]) == (n, 0, 0)
    assert summary["fencing_violations"] == 0

    report(
        "sigkill",
        seconds=round(time.monotonic() - started, 1),
        killed_pid=pid,
        map_index=map_index,
        acked_in_chunk_at_kill=len(acked),
        in_flight_at_kill=len(in_flight),
        seconds_until_failed=round(noticed, 1),
        invocations=sum(calls.values()),
        items=n,
        rerun=rerun,
        fingerprint=exported["fingerprint"][:16],
        baseline=expected["fingerprint"][:16],
    )


def prompts_ids(n: int) -> list[str]:
    return [p["id"] for p in prompts(n)]


# -- 2. A zombie attempt ---------------------------------------------------------------------------


def test_zombie_attempt_late_writes_change_nothing_and_show_as_fencing_violations(
    airflow_stack: AirflowClient, tmp_path: Path
):
    """Attempt 1 stops at an item (fail_fast); Airflow runs attempt 2 with a new epoch. Meanwhile the
    old attempt's writer, with its old epoch and its in-memory item sequences, keeps acknowledging
    poisoned results for the items it had pulled: while attempt 2 is mid-chunk, and after the run."""
    client = airflow_stack
    started = time.monotonic()
    n = 16
    fd = install(
        client,
        tmp_path,
        "datagen_faults_zombie",
        items=n,
        chunk=n,
        latency=0.25,
        checkpoint_every=2,
        fail_fast=True,
        fail_once=["p0005"],
    )
    expected, expected_results = baseline(tmp_path, n)

    run_id = client.trigger(fd.dag_id)
    assert client.wait_run(fd.dag_id, run_id, timeout=RUN_TIMEOUT) == "failed"
    log = fd.log()
    first = log.events("p0000")
    old_epoch, old_writer = first[0].writer_epoch, first[0].writer_id
    assert old_writer == fd.writer_id(run_id, 0)
    done = next(ev for ev in first if ev.event_type is EventType.STEP_COMPLETED)
    step, step_kind = done.coord.step, done.coord.step_kind
    assert [r.error_type for r in log.failures("p0005")] == ["InjectedFailure"]
    summary = log.summary()
    # the fail_fast stop released the items it had pulled and never started (issue 24): only the
    # failed item reads running
    assert (summary["completed"], summary["running"], summary["failed_items"]) == (5, 1, 1)
    assert summary["never_started"] == n - 6

    # The old attempt's writer as it was in memory when Airflow gave up on it: it had pulled every
    # item of the chunk into the inbox and knows each one's last sequence number.
    targets = [f"p{i:04d}" for i in range(5, 10)]
    zombie = log.writer(
        old_writer,
        old_epoch,
        processor_version="v1",
        airflow={"dag_id": fd.dag_id, "run_id": run_id, "task_id": "generate", "map_index": 0, "try_number": 1},
    )
    primed = {}
    for iid, st in log.item_states(targets).items():
        zombie.prime(iid, last_seq=st.last_seq, input_fingerprint=st.input_fingerprint, field_modes=st.field_modes)
        primed[iid] = st.last_seq

    cleared = client.clear(fd.dag_id, run_id, [("generate", 0)], include_downstream=True)
    assert sorted((t["task_id"], t["map_index"]) for t in cleared) == [("export", -1), ("generate", 0)]

    # Wave 1: as soon as attempt 2 has acknowledged its first items, while it is still mid-chunk.
    # The zombie acknowledges poisoned results exactly as the runner would (field deltas, the step's
    # STEP_COMPLETED, TERMINAL), at the sequence numbers it remembers.
    deadline = time.monotonic() + RUN_TIMEOUT
    new_epoch = None
    while new_epoch is None:
        assert time.monotonic() < deadline, "attempt 2 never acknowledged p0006"
        newer = [ev for ev in log.events("p0006") if ev.writer_epoch > old_epoch]
        if any(ev.event_type is EventType.TERMINAL for ev in newer):
            new_epoch = newer[0].writer_epoch
        else:
            time.sleep(0.05)
    owned_at_wave1 = [iid for iid in targets if any(ev.writer_epoch == new_epoch for ev in log.events(iid))]
    ti_state_at_wave1 = tis_by_key(client, fd.dag_id, run_id)[("generate", 0)]["state"]
    with zombie.batch() as b:
        for iid in targets:
            b.field_set(iid, "answer", "ZOMBIE", step=step)
            b.field_set(iid, "tokens", -1, step=step)
            b.step_completed(iid, step=step, step_kind=step_kind)
            b.terminal(iid)

    client.wait_success(fd.dag_id, run_id, timeout=RUN_TIMEOUT)
    exported = client.xcom(fd.dag_id, run_id, "export")
    assert exported == expected, "the zombie's late acknowledgements leaked into the export"
    assert collect_results(log) == expected_results

    def folded() -> dict[str, tuple]:
        st = log.states()
        cols = ("status", "input_fingerprint", "processor_version", "created_seq", "failures", "max_epoch")
        rows = st.select(["item_id", *cols]).to_pylist()
        return {r["item_id"]: tuple(r[c] for c in cols) for r in rows}

    before = folded()

    # Wave 2: after the run succeeded, the zombie still writes (a late failure and another result).
    with zombie.batch() as b:
        for iid in targets:
            b.failed(iid, error=RuntimeError("zombie: late failure after its successor took over"), step=step)
            b.field_set(iid, "answer", "ZOMBIE-2", step=step)
    # A writer that has to look an item up learns that a newer epoch owns it and refuses to write.
    with pytest.raises(FencingError, match="already owns it"), log.writer(old_writer, old_epoch).batch() as b:
        b.field_set("p0005", "answer", "ZOMBIE-3")

    assert folded() == before, "the zombie's late events changed the folded state"
    assert collect_results(log) == expected_results
    assert export_results(log, str(tmp_path / "after_zombie.lance")) == expected
    summary = log.summary()
    assert summary["completed"] == n and summary["pending"] == 0

    # Every late event of the zombie is either a copy of its successor's event (same event id: an
    # identical STEP_COMPLETED or TERMINAL at the same sequence, de-duplicated by the read path) or a
    # fencing violation: the failure lens names each one, with the zombie's writer id and epoch.
    rows = lance.dataset(log.uri).to_table(columns=["item_id", "item_seq", "writer_epoch", "event_id"]).to_pylist()
    late = {
        r["event_id"] for r in rows if r["writer_epoch"] == old_epoch and r["item_seq"] > primed.get(r["item_id"], 1e9)
    }
    successor = {r["event_id"] for r in rows if r["writer_epoch"] == new_epoch}
    assert len(late) == zombie.events_written == 6 * len(targets)
    refused = late - successor
    lens = {iid: [r for r in log.failures(iid) if r.error_type == "FencingViolation"] for iid in targets}
    assert {r.event_id for records in lens.values() for r in records} == refused
    assert all({(r.writer_id, r.epoch) for r in lens[iid]} == {(old_writer, old_epoch)} for iid in targets)
    assert summary["fencing_violations"] == len(refused)

    # The UI shows it: the experiment's counts, the item's JSON and the item's page.
    base = f"/datagen/api/experiments/{PIPELINE}/{fd.experiment}"
    assert ui_get(client, base).json()["fencing_violations"] == len(refused)
    item = ui_get(client, f"{base}/item?id=p0005").json()
    assert item["state"]["status"] == "completed"
    assert item["state"]["violations"] == len(lens["p0005"])
    assert item["fields"]["answer"] == json.loads(expected_results["p0005"])["answer"]
    ui_fencing = [f for f in item["failures"] if f["error_type"] == "FencingViolation"]
    assert {f["event_id"] for f in ui_fencing} == {r.event_id for r in lens["p0005"]}
    assert {(f["writer_id"], f["writer_epoch"]) for f in ui_fencing} == {(old_writer, old_epoch)}
    page = ui_get(client, f"/datagen/experiments/{PIPELINE}/{fd.experiment}/item?id=p0005").text
    assert "FencingViolation" in page

    report(
        "zombie",
        seconds=round(time.monotonic() - started, 1),
        old_epoch=old_epoch,
        new_epoch=new_epoch,
        attempt2_state_at_wave1=ti_state_at_wave1,
        targets_owned_by_attempt2_at_wave1=len(owned_at_wave1),
        zombie_events=len(late),
        identical_to_successor=len(late & successor),
        fencing_violations=summary["fencing_violations"],
        lens_p0005=dict(Counter(r.error_type for r in log.failures("p0005"))),
        fingerprint=exported["fingerprint"][:16],
        baseline=expected["fingerprint"][:16],
    )


# -- 3. Two DAG runs of one experiment at once -----------------------------------------------------


def test_two_concurrent_runs_complete_every_item_once_and_lose_no_event(airflow_stack: AirflowClient, tmp_path: Path):
    client = airflow_stack
    started = time.monotonic()
    n, chunk = 30, 15
    fd = install(
        client,
        tmp_path,
        "datagen_faults_twin",
        items=n,
        chunk=chunk,
        latency=0.15,
        checkpoint_every=5,
        max_active_runs=2,
        # Both runs reach their first invocation before either does any work, so they really write the
        # same items at once (otherwise a slow scheduler can let one run finish before the other plans).
        barrier_runs=2,
        barrier_dir=str(tmp_path / "arrivals"),
    )
    expected, expected_results = baseline(tmp_path, n)

    runs = [client.trigger(fd.dag_id), client.trigger(fd.dag_id)]
    for run_id in runs:
        client.wait_success(fd.dag_id, run_id, timeout=RUN_TIMEOUT)
    for run_id in runs:
        assert client.xcom(fd.dag_id, run_id, "export") == expected

    # Both runs did the work at the same time (the point of the scenario).
    generate = {
        run_id: [t for t in client.task_instances(fd.dag_id, run_id) if t["task_id"] == "generate"] for run_id in runs
    }
    for run_id, tis in generate.items():
        assert tis and all(t["state"] == "success" for t in tis), (run_id, tis)
    overlaps = [
        (a["map_index"], b["map_index"])
        for a in generate[runs[0]]
        for b in generate[runs[1]]
        if max(when(a["start_date"]), when(b["start_date"])) < min(when(a["end_date"]), when(b["end_date"]))
    ]
    assert overlaps, "the two runs' generate tasks did not overlap in time"

    # Every item completed exactly once in the folded state.
    log = fd.log()
    states = log.states()
    assert states.num_rows == n
    assert set(states["status"].to_pylist()) == {"completed"}
    assert pc.sum(states["violations"]).as_py() == 0
    assert collect_results(log) == expected_results
    for iid in prompts_ids(n):
        kinds = Counter(ev.event_type for ev in log.events(iid))
        assert kinds[EventType.ITEM_CREATED] == 1 and kinds[EventType.TERMINAL] == 1, (iid, kinds)

    # No event lost: every event a writer says it committed is a row of the log.
    rows = lance.dataset(log.uri).to_table(columns=["writer_id", "event_id"])
    per_writer = Counter(rows["writer_id"].to_pylist())
    committed: dict[str, int] = {}
    for run_id, tis in generate.items():
        for t in tis:
            text = client.task_log(fd.dag_id, run_id, "generate", t["try_number"], map_index=t["map_index"])
            match = _CHUNK_DONE.search(text)
            assert match, f"no 'chunk done' line in the log of generate[{t['map_index']}] of {run_id}"
            committed[fd.writer_id(run_id, t["map_index"])] = int(match.group(2))
    assert all(committed.values()), f"a writer committed nothing: {committed}"
    assert dict(per_writer) == committed
    distinct = len(set(rows["event_id"].to_pylist()))

    calls = Counter(inv.item_id for inv in fd.invocations())
    assert set(calls) == set(prompts_ids(n)) and max(calls.values()) <= len(runs)
    report(
        "concurrent runs",
        seconds=round(time.monotonic() - started, 1),
        overlapping_generate_pairs=len(overlaps),
        rows=rows.num_rows,
        distinct_events=distinct,
        committed=sum(committed.values()),
        items_invoked_by_both_runs=sum(1 for c in calls.values() if c > 1),
        invocations=sum(calls.values()),
        fingerprint=expected["fingerprint"][:16],
    )
