"""The batch operator in real Airflow: the triggerer polls the provider's batches while no worker holds the task.

One run of ``tests/e2e/dags/datagen_batch_dag.py`` (12 items in chunks of 6, deferrable) against a
:class:`~dev.batch_server.FakeBatchServer` in this test process on 127.0.0.1, whose batches end on their
tenth retrieve. The connection (the fake's URL and key) is created through the REST API. While the
mapped task instances are ``deferred`` (no worker runs them) the fake's poll counters grow: the
triggerer is polling (with the key read from the connection there). Then every task succeeds, each chunk
recorded whole from one batch, and nothing was submitted twice.

A second run of the same DAG (its own experiment and connection) has batches that never end on their
own: once both task instances are deferred, the first is marked failed through the REST API, and the
trigger's ``on_kill`` on the triggerer asks the fake to cancel that chunk's batch and no other. The
submissions record keeps it open (cancelling asks, records nothing); the other chunk then ends and
succeeds, and clearing the killed one makes its rerun read the batch back, recorded ``cancelled``, its
unrun rows failed attempts of their items.

Run alone (it starts the Airflow stack): ``pytest -s tests/e2e/test_batch_airflow.py``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from airflow_provider_datagen.core import CheckpointLog
from airflow_provider_datagen.core.batch import custom_id
from airflow_provider_datagen.core.sources import prepare_items
from airflow_provider_datagen.core.store import batches
from dev.batch_server import serving

if TYPE_CHECKING:
    from dev.batch_server import FakeBatchServer, SubmittedBatch
    from tests.e2e.harness import AirflowClient

pytestmark = pytest.mark.e2e

TEMPLATE = Path(__file__).parent / "dags" / "datagen_batch_dag.py"
DAG_ID = "datagen_batch_e2e"
CONN_ID = "batch_e2e_llm"
API_KEY = "sk-e2e-secret"
N_ITEMS, CHUNK = 12, 6
KILL_DAG_ID, KILL_CONN_ID = "datagen_batch_kill_e2e", "batch_kill_e2e_llm"
PIPELINE = "batch_e2e"
TRIGGER_PATH = "airflow_provider_datagen.triggers.batch.DatagenBatchTrigger"
#: the run takes about 30 s on an idle machine (the batches end after about 3 s of polling)
RUN_TIMEOUT = 150.0


def _custom_ids(item_ids: list[str]) -> set[str]:
    """The custom_ids of the first submission of these items of the DAG's source."""
    items = prepare_items([{"id": i, "text": f"item number {i}"} for i in item_ids])
    return {custom_id(it.item_id, it.fingerprint, 1) for it in items}


def install(client: AirflowClient, base_url: str, dag_id: str = DAG_ID, conn_id: str = CONN_ID) -> None:
    client.post(
        "/connections",
        json={
            "connection_id": conn_id,
            "conn_type": "pydanticai",
            "host": base_url,
            "password": API_KEY,
            "extra": json.dumps({"model": "openai:gpt-4o-mini"}),
        },
        expect=(200, 201),
    )
    config = {
        "dag_id": dag_id,
        "pipeline": PIPELINE,
        "experiment": dag_id,
        "items": N_ITEMS,
        "chunk": CHUNK,
        "llm_conn_id": conn_id,
        "poll_interval": 0.5,
    }
    (client.dags_folder / f"{dag_id}.json").write_text(json.dumps(config, indent=1))
    client.add_dag_file(TEMPLATE, f"{dag_id}.py")
    client.wait_dag_parsed(dag_id, timeout=180)
    client.unpause(dag_id)


def test_the_triggerer_polls_the_batches_while_the_task_is_deferred(airflow_stack: AirflowClient) -> None:
    client = airflow_stack
    with serving(complete_after_polls=10) as fake:
        install(client, fake.base_url)
        run_id = client.trigger(DAG_ID)
        started = time.monotonic()
        #: per map index, its batch's poll count at each sight of the task instance deferred (only the
        #: trigger polls a batch while its task is deferred: no worker runs the task then)
        deferred_polls: dict[int, list[int]] = {}
        triggers: list[dict[str, Any]] = []
        chunk_cids: list[set[str]] = []
        deadline = time.monotonic() + RUN_TIMEOUT
        while client.run_state(DAG_ID, run_id) not in ("success", "failed"):
            assert time.monotonic() < deadline, [
                (t["task_id"], t["map_index"], t["state"]) for t in client.task_instances(DAG_ID, run_id)
            ]
            for ti in client.task_instances(DAG_ID, run_id):
                if ti["task_id"] != "generate" or ti["state"] != "deferred" or not ti.get("trigger"):
                    continue
                triggers.append(ti["trigger"])
                if not chunk_cids:  # the REST API redacts a trigger's kwargs: find its batch by the chunk's rows
                    chunk_cids = [_custom_ids(c["chunk"]["item_ids"]) for c in client.xcom(DAG_ID, run_id, "plan")]
                with fake.lock:
                    polls = [b.polls for b in fake.batches if set(b.custom_ids) == chunk_cids[ti["map_index"]]]
                if polls:
                    deferred_polls.setdefault(ti["map_index"], []).append(polls[0])
            time.sleep(0.2)
        client.wait_success(DAG_ID, run_id, timeout=10)
        print(f"\nbatch e2e: run took {time.monotonic() - started:.0f} s; polls seen while deferred: {deferred_polls}")

        # the triggerer polled: a batch's poll count grew between two sights of its task instance deferred
        assert any(seen[-1] > seen[0] for seen in deferred_polls.values()), (deferred_polls, triggers[:1])
        assert triggers and {t["classpath"] for t in triggers} == {TRIGGER_PATH}
        assert fake.creates == N_ITEMS // CHUNK  # one batch per chunk, none submitted twice
        assert set(fake.requests_per_custom_id_base.values()) == {1}
        assert all(b.ended_at is not None and b.count("succeeded") == CHUNK for b in fake.batches)
        statuses = []
        for map_index in range(N_ITEMS // CHUNK):
            result = client.xcom(DAG_ID, run_id, "generate", map_index=map_index)
            assert (result["processed"], result["failed"], result["in_batch"]) == (CHUNK, 0, 0), result
            statuses.append(client.xcom(DAG_ID, run_id, "generate", key="datagen_status", map_index=map_index))
        assert max(s["completed"] for s in statuses) == N_ITEMS and {s["failed_items"] for s in statuses} == {0}


def _generate(client: AirflowClient, dag_id: str, run_id: str) -> dict[int, dict[str, Any]]:
    return {t["map_index"]: t for t in client.task_instances(dag_id, run_id) if t["task_id"] == "generate"}


def _chunk_batches(client: AirflowClient, fake: FakeBatchServer, dag_id: str, run_id: str) -> list[SubmittedBatch]:
    """Each chunk's batch at the fake, by map index (found by the custom_ids of the chunk's rows)."""
    chunks = [_custom_ids(c["chunk"]["item_ids"]) for c in client.xcom(dag_id, run_id, "plan")]
    with fake.lock:
        found = [[b for b in fake.batches if set(b.custom_ids) == cids] for cids in chunks]
    assert all(len(f) == 1 for f in found), [[b.id for b in f] for f in found]
    return [f[0] for f in found]


def _wait(what: str, done: Any, timeout: float, why: Any) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:.0f} s for {what}: {why()}")
        time.sleep(0.2)


def test_marking_a_deferred_batch_task_failed_cancels_its_batch_from_the_triggerer(
    airflow_stack: AirflowClient,
) -> None:
    client = airflow_stack
    with serving(complete_after_polls=10**6) as fake:  # no batch ends on its own: only a cancel ends one
        install(client, fake.base_url, KILL_DAG_ID, KILL_CONN_ID)
        run_id = client.trigger(KILL_DAG_ID)

        def states() -> list[tuple[int, str, int]]:
            return [(i, t["state"], t["try_number"]) for i, t in sorted(_generate(client, KILL_DAG_ID, run_id).items())]

        def both_deferred_and_polled() -> bool:
            tis = _generate(client, KILL_DAG_ID, run_id)
            if len(tis) != N_ITEMS // CHUNK or any(t["state"] != "deferred" for t in tis.values()):
                return False
            with fake.lock:
                return len(fake.batches) == N_ITEMS // CHUNK and all(b.polls >= 2 for b in fake.batches)

        _wait("both batch task instances deferred, their batches polled", both_deferred_and_polled, RUN_TIMEOUT, states)
        killed, other = _chunk_batches(client, fake, KILL_DAG_ID, run_id)
        client.patch(f"/dags/{KILL_DAG_ID}/dagRuns/{run_id}/taskInstances/generate/0", json={"new_state": "failed"})

        def cause() -> str:
            # the trigger's log (where on_kill says what it cancelled) and the triggerer's
            try:
                trigger_log = client.task_log(KILL_DAG_ID, run_id, "generate", 1, map_index=0)[-3000:]
            except AssertionError as err:
                trigger_log = f"(no task log: {err})"
            return (
                f"the fake saw no cancel of chunk 0's batch {killed.id} after its deferred task instance was marked "
                "failed: DatagenBatchTrigger.on_kill did not run on the triggerer, or did not reach the provider. "
                f"Task instances {states()}.\n--- task log ---\n{trigger_log}\n{client.stack.log_tails(lines=40)}"
            )

        _wait("the killed chunk's batch cancelled", lambda: killed.cancel_requested_at is not None, 60, cause)
        assert _generate(client, KILL_DAG_ID, run_id)[0]["state"] == "failed", states()
        said = f"asked openai to cancel 1 of its 1 open batches: ['{killed.id}']"

        def try_log() -> str:
            return client.task_log(KILL_DAG_ID, run_id, "generate", 1, map_index=0)

        # the trigger's own lines land in the killed try's log, where the user who killed it reads them
        _wait("on_kill's line in the killed try's log", lambda: said in try_log(), 30, lambda: try_log()[-3000:])
        # only the killed task's chunk: the other task instance's batch runs on, still polled by its trigger
        polls = other.polls
        _wait("the other chunk's batch still polled", lambda: other.polls > polls, 30, states)
        assert other.cancel_requested_at is None, f"on_kill of chunk 0 also cancelled chunk 1's batch {other.id}"

        log = CheckpointLog.open(client.stack.settings.home / "datagen", pipeline=PIPELINE, experiment=KILL_DAG_ID)

        def submission(batch: SubmittedBatch) -> batches.Submission:
            (sub,) = [s for s in batches.read(log).values() if s.batch_id == batch.id]
            return sub

        # cancelling asks the provider and records nothing: the submission stays open, for a rerun to read
        assert submission(killed).kind == "submitted", submission(killed)

        # the other chunk is untouched: its batch ends now and its task resumes and succeeds
        fake.complete_after_polls = 1
        _wait("chunk 1 succeeded", lambda: _generate(client, KILL_DAG_ID, run_id)[1]["state"] == "success", 60, states)
        assert other.cancel_requested_at is None and other.count("succeeded") == CHUNK

        # clearing the killed task instance: its rerun reads the cancelled batch back and records it
        client.clear(KILL_DAG_ID, run_id, [("generate", 0)])

        def rerun_ended() -> bool:
            ti = _generate(client, KILL_DAG_ID, run_id)[0]
            return ti["try_number"] == 2 and ti["state"] in ("success", "failed")

        _wait("the cleared task instance's rerun ended", rerun_ended, RUN_TIMEOUT, states)
        record = submission(killed)
        assert (record.kind, record.status) == ("recorded", "cancelled"), (
            f"the rerun did not record chunk 0's batch {killed.id} as cancelled at the provider: {record.describe()}"
        )
        assert {row.outcome for row in killed.rows} == {"cancelled"}  # none of its rows had run
        # its rows that never ran failed their items' attempt (retry=None: once), so the rerun fails naming them
        # and submits nothing: the next clear resubmits exactly them
        assert states()[0][1] == "failed" and fake.creates == N_ITEMS // CHUNK, (states(), fake.creates)
        chunk0 = client.xcom(KILL_DAG_ID, run_id, "plan")[0]["chunk"]["item_ids"]
        assert all(" cancelled: " in log.failures(i)[-1].message for i in chunk0), [log.failures(i) for i in chunk0]
        print(f"\nbatch kill e2e: {killed.id} cancelled by on_kill, {other.id} succeeded; task instances {states()}")
