"""The batch operator in real Airflow: the triggerer polls the provider's batches while no worker holds the task.

One run of ``tests/e2e/dags/datagen_batch_dag.py`` (12 items in chunks of 6, deferrable) against a
:class:`~dev.batch_server.FakeBatchServer` in this test process on 127.0.0.1, whose batches end on their
tenth retrieve. The connection (the fake's URL and key) is created through the REST API. While the
mapped task instances are ``deferred`` (no worker runs them) the fake's poll counters grow: the
triggerer is polling (with the key read from the connection there). Then every task succeeds, each chunk
recorded whole from one batch, and nothing was submitted twice.

Run alone (it starts the Airflow stack): ``pytest -s tests/e2e/test_batch_airflow.py``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from airflow_provider_datagen.core.batch import custom_id
from airflow_provider_datagen.core.sources import prepare_items
from dev.batch_server import serving

if TYPE_CHECKING:
    from tests.e2e.harness import AirflowClient

pytestmark = pytest.mark.e2e

TEMPLATE = Path(__file__).parent / "dags" / "datagen_batch_dag.py"
DAG_ID = "datagen_batch_e2e"
CONN_ID = "batch_e2e_llm"
API_KEY = "sk-e2e-secret"
N_ITEMS, CHUNK = 12, 6
TRIGGER_PATH = "airflow_provider_datagen.triggers.batch.DatagenBatchTrigger"
#: the run takes about 30 s on an idle machine (the batches end after about 3 s of polling)
RUN_TIMEOUT = 150.0


def _custom_ids(item_ids: list[str]) -> set[str]:
    """The custom_ids of the first submission of these items of the DAG's source."""
    items = prepare_items([{"id": i, "text": f"item number {i}"} for i in item_ids])
    return {custom_id(it.item_id, it.fingerprint, 1) for it in items}


def install(client: AirflowClient, base_url: str) -> None:
    client.post(
        "/connections",
        json={
            "connection_id": CONN_ID,
            "conn_type": "pydanticai",
            "host": base_url,
            "password": API_KEY,
            "extra": json.dumps({"model": "openai:gpt-4o-mini"}),
        },
        expect=(200, 201),
    )
    config = {
        "dag_id": DAG_ID,
        "pipeline": "batch_e2e",
        "experiment": DAG_ID,
        "items": N_ITEMS,
        "chunk": CHUNK,
        "llm_conn_id": CONN_ID,
        "poll_interval": 0.5,
    }
    (client.dags_folder / f"{DAG_ID}.json").write_text(json.dumps(config, indent=1))
    client.add_dag_file(TEMPLATE, f"{DAG_ID}.py")
    client.wait_dag_parsed(DAG_ID, timeout=180)
    client.unpause(DAG_ID)


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
