"""The task-instance tab: retried transient errors are not shown as failures, chunks are named by key range."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from tests.plugins.util import airflow_coords

if TYPE_CHECKING:
    from fastapi.testclient import TestClient


def _row(page: str, item_id: str) -> str:
    """The tab's table row of ``item_id``."""
    m = re.search(r"<tr><td><a class='mono' href='[^']*id=" + re.escape(item_id) + r"'>.*?</tr>", page)
    assert m, f"no row for {item_id!r}"
    return m.group(0)


def test_a_retried_transient_error_is_not_a_failure_of_the_task_instance(client: TestClient, ui_log: Any) -> None:
    lg = ui_log("ti", "transient")
    w = lg.writer("dgt/r1/map/0", 1, airflow=airflow_coords(dag_id="dgt", run_id="r1", map_index=0))
    with w.batch() as b:
        for item in ("a", "b"):
            b.item_created(item, input_fingerprint=f"f-{item}")
        # a: a 429 retried in place by the retry policy, then completed; b: failed for good
        b.failed("a", error=TimeoutError("rate limited"), step="gen", attempt=1, transient=True, wait=0.5)
        b.terminal("a")
        b.failed("b", error=ValueError("refused"), step="gen")
    (exp,) = client.get("/datagen/api/ti/dgt/r1/map/0").json()["experiments"]
    errors = {it["item_id"]: it["attempts"][0]["errors"] for it in exp["items"]}
    assert errors == {
        "a": [{"error_type": "TimeoutError", "message": "rate limited", "transient": True, "attempt": 1, "wait": 0.5}],
        "b": [{"error_type": "ValueError", "message": "refused", "transient": False, "attempt": None, "wait": None}],
    }
    page = client.get("/datagen/ti/dgt/r1/map/0").text
    a, b = _row(page, "a"), _row(page, "b")
    assert "s-failed" not in a
    assert "<span class='badge s-transient'>transient</span>" in a and "retried: <b>TimeoutError</b>" in a
    assert "attempt 1, then waited 0.50 s" in a
    assert "<span class='badge s-failed'>failed</span> <b>ValueError</b>: refused" in b


def test_a_killed_task_is_labelled_by_the_key_range_it_wrote(client: TestClient, ui_log: Any) -> None:
    # A task killed mid-chunk wrote ITEM_CREATED and steps but no terminal row: its map index alone
    # ("1") names nothing; the tab names the chunk by its key range, as the map operator's label does.
    lg = ui_log("ti", "killed")
    w = lg.writer("dgk/r1/map/1", 1, airflow=airflow_coords(dag_id="dgk", run_id="r1", map_index=1))
    with w.batch() as b:
        for item in ("k-010", "k-011", "k-012"):
            b.item_created(item, input_fingerprint=f"f-{item}")
        b.step_started("k-010", step="gen")
    (exp,) = client.get("/datagen/api/ti/dgk/r1/map/1").json()["experiments"]
    assert exp["label"] == "k-010 … k-012 (3 items)"
    page = client.get("/datagen/ti/dgk/r1/map/1").text
    assert "<h1>map [1] · k-010 … k-012 (3 items)</h1>" in page
    # the experiment page's failure list names the writing task by the same range
    with lg.writer("dgk/r1/map/1", 2, airflow=airflow_coords(dag_id="dgk", run_id="r1", map_index=1)).batch() as b:
        b.failed("k-011", error=ValueError("bad"), step="gen")
    (f,) = client.get("/datagen/api/experiments/ti/killed").json()["recent_failures"]
    assert f["chunk_label"] == "k-010 … k-012 (3 items)"
    failures = client.get("/datagen/experiments/ti/killed").text.split("<h2>Failures", 1)[1].split("<h2>Items", 1)[0]
    assert "<td>1 · k-010 … k-012 (3 items)</td>" in failures
    # and so does the item page, wherever it names the task that wrote a row
    item = client.get("/datagen/experiments/ti/killed/item?id=k-011").text
    assert "title='r1'>dgk · map[1] · k-010 … k-012 (3 items) · try 1</a>" in item
