"""In-place retries in real Airflow (issue 16, "An end-to-end test in real Airflow").

One DAG run of ``tests/e2e/dags/datagen_retries_dag.py`` over 150 prompts in chunks of 30: its fake
model times out on the first attempt of one item in ten (chosen by a hash of the key), and
``DatagenMapOperator(retry=...)`` retries those attempts in place. The run succeeds on its own: no
clear, every task instance on its first try. The log then holds exactly one transient FAILED row
(attempt 1) for each chosen item and nothing else failed; the export equals an uninterrupted run's.
The plugin's pages, fetched from the api-server with the admin's token, show those rows marked
transient, and headless Chromium takes one screenshot of the experiment page.

Run alone (it starts the Airflow stack): ``pytest -s tests/e2e/test_retries_airflow.py``.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from html import unescape
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pyarrow.compute as pc
import pytest

from airflow_provider_datagen.core import CheckpointLog, export_results, run_items
from airflow_provider_datagen.example_dags.fakes import prompts, reliable_fake_model
from airflow_provider_datagen.links import PLUGIN_URL_PREFIX
from tests.e2e.dags.datagen_retries_dag import transient_first
from tests.e2e.test_ui_browser import browser, new_context  # noqa: F401 (browser is a fixture)

if TYPE_CHECKING:
    from playwright.sync_api import Browser

    from tests.e2e.harness import AirflowClient

pytestmark = pytest.mark.e2e

TEMPLATE = Path(__file__).parent / "dags" / "datagen_retries_dag.py"
PIPELINE = "retries"
DAG_ID = "datagen_retries"
N_ITEMS, CHUNK = 150, 30
RUN_TIMEOUT = 240.0


def install(client: AirflowClient, tmp_path: Path, dag_id: str, **knobs: Any) -> Path:
    """Write ``<dag_id>.json`` then ``<dag_id>.py`` into the DAGs folder, wait until parsed, unpause.

    Returns the invocation side file (``item_id, attempt, pid`` per call of the model).
    """
    side = tmp_path / f"{dag_id}-invocations.tsv"
    side.touch()
    config = {
        "dag_id": dag_id,
        "pipeline": PIPELINE,
        "experiment": dag_id,
        "invocation_log": str(side),
        "export_dir": str(tmp_path / f"{dag_id}-exports"),
        **knobs,
    }
    (client.dags_folder / f"{dag_id}.json").write_text(json.dumps(config, indent=1))
    client.add_dag_file(TEMPLATE, f"{dag_id}.py")
    client.wait_dag_parsed(dag_id, timeout=180)
    client.unpause(dag_id)
    return side


def ui_get(client: AirflowClient, path: str) -> httpx.Response:
    """GET a page of the datagen plugin with the admin's token, as the UI's iframe does with its cookie."""
    response = httpx.get(
        client.base_url + PLUGIN_URL_PREFIX + path,
        headers={"Authorization": f"Bearer {client.token()}"},
        timeout=30.0,
    )
    assert response.status_code == 200, f"GET {path} -> {response.status_code}: {response.text[:1000]}"
    return response


def failure_rows(html: str) -> list[str]:
    """The rows of the experiment page's Failures table, as text with the tags stripped."""
    section = html.split("<h2>Failures", 1)[1].split("<h2>Items", 1)[0]
    body = section.split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    rows = re.findall(r"<tr>(.*?)</tr>", body, flags=re.S)
    return [" ".join(unescape(re.sub(r"<[^>]+>", " ", r)).split()) for r in rows]


def test_transient_errors_retried_in_place_complete_in_one_run(
    airflow_stack: AirflowClient,
    browser: Browser,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
) -> None:
    client = airflow_stack
    started = time.monotonic()
    ids = [p["id"] for p in prompts(N_ITEMS)]
    chosen = {i for i in ids if transient_first(i)}
    assert 0 < len(chosen) <= 20, "the page lists the 20 newest failures: keep every transient row on it"
    side = install(client, tmp_path, DAG_ID, items=N_ITEMS, chunk=CHUNK, concurrency=4)

    baseline = CheckpointLog.open(tmp_path / "baseline", pipeline=PIPELINE, experiment="uninterrupted")
    assert not run_items(baseline, prompts(N_ITEMS), reliable_fake_model).failed
    expected = export_results(baseline, str(tmp_path / "baseline.lance"))

    # -- one run, no clear: success, every task instance on its first try ------------------------------
    run_id = client.trigger(DAG_ID)
    client.wait_success(DAG_ID, run_id, timeout=RUN_TIMEOUT)
    tis = client.task_instances(DAG_ID, run_id)
    assert sorted((t["task_id"], t["map_index"]) for t in tis) == [
        ("export", -1),
        *(("generate", i) for i in range(N_ITEMS // CHUNK)),
        ("plan", -1),
    ]
    assert {(t["state"], t["try_number"]) for t in tis} == {("success", 1)}, [
        (t["task_id"], t["map_index"], t["state"], t["try_number"]) for t in tis
    ]
    reports = [client.xcom(DAG_ID, run_id, "generate", map_index=i) for i in range(N_ITEMS // CHUNK)]
    assert sum(r["processed"] for r in reports) == N_ITEMS
    assert sum(r["failed"] for r in reports) == 0
    assert client.xcom(DAG_ID, run_id, "export") == expected, "the export differs from an uninterrupted run's"

    # -- the model's calls: every item once, the chosen ones exactly twice (attempts 1 and 2) ----------
    calls = [line.split("\t") for line in side.read_text().splitlines()]
    per_item = Counter(c[0] for c in calls)
    assert set(per_item) == set(ids)
    assert {i for i, n in per_item.items() if n == 2} == chosen
    assert sum(per_item.values()) == N_ITEMS + len(chosen)
    assert sorted((c[0], c[1]) for c in calls if c[0] in chosen) == sorted((i, a) for i in chosen for a in ("1", "2"))

    # -- the log: exactly one transient FAILED row (attempt 1) per chosen item, nothing failed --------
    log = CheckpointLog.open(client.stack.settings.home / "datagen", pipeline=PIPELINE, experiment=DAG_ID)
    states = log.states()
    assert states.num_rows == N_ITEMS
    assert set(states["status"].to_pylist()) == {"completed"}
    assert pc.sum(states["failures"]).as_py() == 0
    records = log.failures()
    assert Counter(r.item_id for r in records) == dict.fromkeys(chosen, 1)
    assert {(r.transient, r.attempt, r.error_type, r.try_number) for r in records} == {
        (True, 1, "TransientModelError", 1)
    }
    assert all(r.wait == pytest.approx(0.05) for r in records), [r.wait for r in records]
    summary = log.summary()
    assert (summary["completed"], summary["failed_items"], summary["pending"]) == (N_ITEMS, 0, 0)

    # -- the failure lens in the UI: the same rows, marked transient -----------------------------------
    status = ui_get(client, f"/api/experiments/{PIPELINE}/{DAG_ID}").json()
    assert status["failure_rows"] == len(chosen) and status["failed_items"] == 0
    assert {(f["item_id"], f["transient"], f["attempt"], f["resolved"]) for f in status["recent_failures"]} == {
        (i, True, 1, True) for i in chosen
    }
    page = ui_get(client, f"/experiments/{PIPELINE}/{DAG_ID}").text
    assert f"({len(chosen)} rows; newest first)" in page
    rows = failure_rows(page)
    assert len(rows) == len(chosen)
    for row in rows:
        assert row.split(" ", 1)[0] in chosen, row
        assert "resolved" in row and "TransientModelError" in row, row
        assert re.search(r"transient attempt 1, then waited 0\.05 s", row), row
    one = min(chosen)
    item = ui_get(client, f"/api/experiments/{PIPELINE}/{DAG_ID}/item?id={one}").json()
    assert item["state"]["status"] == "completed" and item["state"]["failures"] == 0
    assert [(f["error_type"], f["transient"], f["attempt"]) for f in item["failures"]] == [
        ("TransientModelError", True, 1)
    ]
    item_page = ui_get(client, f"/experiments/{PIPELINE}/{DAG_ID}/item?id={one}").text
    assert "s-transient" in item_page and "attempt 1, then waited 0.05 s" in item_page

    # -- one screenshot of the experiment page in headless Chromium (the admin's token as a cookie) ----
    context, offsite, plugin_errors = new_context(browser, client.base_url)
    context.add_cookies([{"name": "_token", "value": client.token(), "url": client.base_url}])
    shot = context.new_page()
    response = shot.goto(f"{client.base_url}{PLUGIN_URL_PREFIX}/experiments/{PIPELINE}/{DAG_ID}")
    assert response is not None and response.status == 200
    shot.locator(".badge.s-transient").first.wait_for()
    assert shot.locator("h2:has-text('Failures') + table .badge.s-transient").count() == len(chosen)
    path = tmp_path / "experiment-transient-failures.png"
    shot.screenshot(path=str(path), full_page=True)
    assert not plugin_errors and not offsite, (plugin_errors, offsite)
    context.close()
    print(
        f"\nretries: {N_ITEMS} items in {N_ITEMS // CHUNK} chunks, {len(chosen)} transient first attempts, "
        f"{sum(per_item.values())} calls, run success on try 1, {time.monotonic() - started:.1f} s; "
        f"screenshot: {path}"
    )


def test_pool_slots_above_the_pool_size_fail_the_run_at_once(airflow_stack: AirflowClient, tmp_path: Path) -> None:
    """Airflow would leave ``generate`` scheduled forever; the provider's listener fails the run as it starts."""
    client = airflow_stack
    dag_id = "datagen_retries_pool"
    client.post("/pools", json={"name": "datagen_tiny", "slots": 2}, expect=(201,))
    install(client, tmp_path, dag_id, items=10, chunk=5, pool="datagen_tiny", pool_slots=3)
    run_id = client.trigger(dag_id)
    assert client.wait_run(dag_id, run_id, timeout=60) == "failed"
    run = client.get(f"/dags/{dag_id}/dagRuns/{run_id}")
    assert run["note"] == (
        "Refused by the datagen provider before any task ran: DatagenMapOperator(task_id='generate'): "
        "pool_slots=3 is more than pool 'datagen_tiny' has (2 slot(s)), so Airflow would never schedule the "
        "task; give pool_slots <= 2, or raise the pool's size to at least 3 (`airflow pools set datagen_tiny 3 ''`)"
    )
    assert {(t["task_id"], t["state"]) for t in client.task_instances(dag_id, run_id)} == {
        ("plan", None),
        ("generate", None),
        ("export", None),
    }
