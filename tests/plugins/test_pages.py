"""The pages and their JSON twins show the folded log: counts, items, trajectories, tries, blobs."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

import pytest

from airflow_provider_datagen.core import child_item_id
from tests.plugins.util import airflow_coords, card, escaped

if TYPE_CHECKING:
    from fastapi.testclient import TestClient

P, E = "qa", "main"
EXP = f"/datagen/experiments/{P}/{E}"
API = f"/datagen/api/experiments/{P}/{E}"
RAW = bytes(range(256)) * 100  # 25.6 kB, over the blob threshold
BIG_DOC = {"text": "x" * 20_000}


def iid(i: int) -> str:
    return f"item-{i:03d}"


@pytest.fixture(scope="module")
def main_log(ui_log) -> Any:
    """120 source items written by two map indexes over two tries.

    - map 0, try 1: items 0-59 completed, 60-79 filtered; item 0 fans out to two children; item 2
      holds a bytes blob and a large JSON blob.
    - map 1, try 1: items 80-89 fail at step "gen"; try 2 (epoch 2) completes 80-84.
    - map 2, try 1: items 90-119 created only (running); item 119 then gets a new input version.
    Folded: 65 completed, 20 filtered, 35 running of which 5 have failures, 2 children.
    """
    lg = ui_log(P, E)
    w0 = lg.writer("map0-try1", 1, processor_version="v1", airflow=airflow_coords(map_index=0))
    with w0.batch() as b:
        for i in range(80):
            b.item_created(iid(i), input_fingerprint=f"fp{i}")
            b.step_started(iid(i), step="gen")
            b.field_set(iid(i), "answer", {"n": i})
            b.step_completed(iid(i), step="gen")
        for c in range(2):
            cid = child_item_id(iid(0), "solve", c)
            b.item_created(cid, input_fingerprint=f"c{c}", step="solve", step_kind="MapReduce", fanout_index=c)
            b.field_set(cid, "part", c)
        b.terminal(child_item_id(iid(0), "solve", 0))
        b.field_set(iid(2), "raw", RAW)
        b.field_set(iid(2), "doc", BIG_DOC)
    with w0.batch() as b:
        for i in range(60):
            b.terminal(iid(i))
        for i in range(60, 80):
            b.terminal(iid(i), status="filtered", reason={"why": "short"})
    w1 = lg.writer("map1-try1", 1, airflow=airflow_coords(map_index=1))
    with w1.batch() as b:
        for i in range(80, 90):
            b.item_created(iid(i), input_fingerprint=f"fp{i}")
            b.step_started(iid(i), step="gen")
            try:
                raise RuntimeError(f"model timeout on {iid(i)}")
            except RuntimeError as exc:
                b.failed(iid(i), error=exc, step="gen")
    w2 = lg.writer("map1-try2", 2, airflow=airflow_coords(map_index=1, try_number=2))
    with w2.batch() as b:
        for i in range(80, 85):
            b.step_started(iid(i), step="gen")
            b.field_set(iid(i), "answer", {"n": i})
            b.step_completed(iid(i), step="gen")
            b.terminal(iid(i))
    w3 = lg.writer("map2-try1", 1, airflow=airflow_coords(map_index=2))
    with w3.batch() as b:
        for i in range(90, 120):
            b.item_created(iid(i), input_fingerprint=f"fp{i}")
    with w3.batch() as b:
        b.item_created(iid(119), input_fingerprint="fp119-v2")
    return lg


def test_index_lists_experiments_with_counts(client: TestClient, main_log: Any) -> None:
    data = client.get("/datagen/api/experiments").json()
    exp = next(x for x in data["experiments"] if (x["pipeline"], x["experiment"]) == (P, E))
    s = exp["summary"]
    assert (s["total"], s["completed"], s["filtered"], s["running"], s["failed_items"]) == (120, 65, 20, 35, 5)
    assert exp["progress"] == pytest.approx(85 / 120)
    page = client.get("/datagen/").text
    assert f"href='{EXP}'" in page
    assert "70.8%" in page  # 85 of 120 done
    assert "class='bar'" in page


def test_experiment_status_json(client: TestClient, main_log: Any) -> None:
    s = client.get(API).json()
    assert (s["total"], s["completed"], s["filtered"], s["running"], s["never_started"]) == (120, 65, 20, 35, 0)
    assert s["failed_items"] == 5
    assert s["failed_item_ids"] == [iid(i) for i in range(85, 90)]
    assert s["children"] == 2 and s["items_all"] == 122
    assert s["log_version"] == main_log.version == s["stats"]["version"]
    assert s["stats"]["events"] > 0 and s["stats"]["size_bytes"] > 0
    assert s["failure_rows"] == 10
    assert s["completed_by_version"] == {"(none)": 5, "v1": 60}  # map1's writer recorded no version
    assert {f["item_id"] for f in s["recent_failures"]} == {iid(i) for i in range(80, 90)}
    assert all(f["error_type"] == "RuntimeError" and f["try_number"] == 1 for f in s["recent_failures"])


def _index_row(page: str, experiment_url: str) -> list[str]:
    row = page.split(f"href='{experiment_url}'>", 1)[1].split("</tr>", 1)[0]
    return re.findall(r"<td class='num'>([^<]*)</td>", row)


def test_index_shows_running_and_failed_apart(client: TestClient, main_log: Any) -> None:
    """35 started and unfinished items: 5 failed (is_failed), 30 still running without a failure."""
    exp = next(x for x in client.get("/datagen/api/experiments").json()["experiments"] if x["experiment"] == E)
    assert exp["running_not_failed"] == 30 and exp["summary"]["failed_items"] == 5
    page = client.get("/datagen/").text
    _done, items, completed, filtered, running, failed, _version = _index_row(page, EXP)
    assert (items, completed, filtered, running, failed) == ("120", "65", "20", "30", "5")
    assert "Running: started, not finished, no failed attempt." in page


def test_failures_resolved_by_a_later_attempt_are_marked(client: TestClient, main_log: Any) -> None:
    # items 80-84 failed in try 1 and completed in try 2; 85-89 are still failed
    failures = client.get(API).json()["recent_failures"]
    assert {f["item_id"] for f in failures if f["resolved"]} == {iid(i) for i in range(80, 85)}
    assert {f["item_id"] for f in failures if not f["resolved"]} == {iid(i) for i in range(85, 90)}
    page = client.get(EXP).text
    table = page.split("<h2>Failures", 1)[1].split("<h2>Items</h2>", 1)[0]
    marked = re.findall(r"class='mono'>(item-\d{3})</a></td><td><span class='badge s-resolved'>resolved</span>", table)
    assert sorted(marked) == [iid(i) for i in range(80, 85)]
    assert "A failure is <i>resolved</i> when its item is now completed or filtered" in table

    done = client.get(f"{API}/item", params={"id": iid(82)}).json()
    assert [f["resolved"] for f in done["failures"]] == [True]
    assert "<span class='badge s-resolved'>resolved</span> <b" in client.get(f"{EXP}/item", params={"id": iid(82)}).text
    still = client.get(f"{API}/item", params={"id": iid(88)}).json()
    assert [f["resolved"] for f in still["failures"]] == [False]
    assert "class='badge s-resolved'" not in client.get(f"{EXP}/item", params={"id": iid(88)}).text


def test_items_show_and_filter_their_processor_version(client: TestClient, ui_log: Any) -> None:
    lg = ui_log("qa", "versions")
    for writer, version, items in (("w1", "v1", "abc"), ("w2", "v2", "de")):
        w = lg.writer(writer, 1 if version == "v1" else 2, processor_version=version)
        with w.batch() as b:
            for item in items:
                b.item_created(item, input_fingerprint=f"f{item}")
                if item != "e":
                    b.terminal(item)
    url = "/datagen/experiments/qa/versions"
    r = client.get("/datagen/api/experiments/qa/versions/items", params={"version": "v2"})
    assert _ids(r) == ["d", "e"] and r.json()["version"] == "v2"
    assert _ids(client.get("/datagen/api/experiments/qa/versions/items", params={"version": "v9"})) == []
    page = client.get(url).text
    assert "<th>Processor version</th>" in page
    assert page.count(f"<a href='{url}?scope=roots&amp;version=v1'>v1</a>") == 3
    assert page.count(f"<a href='{url}?scope=roots&amp;version=v2'>v2</a>") == 2
    filtered = client.get(url, params={"version": "v1"}).text
    assert re.findall(r"class='mono'>([a-e])</a></td>", filtered) == ["a", "b", "c"]
    assert "value='v1'" in filtered  # the form keeps the filter
    item = client.get(f"{url}/item", params={"id": "d"}).text
    assert "<dt>processor version</dt><dd>v2 " in item


def test_experiment_page_counts(client: TestClient, main_log: Any) -> None:
    page = client.get(EXP).text
    assert card(page, "items") == 120
    assert card(page, "completed") == 65
    assert card(page, "filtered") == 20
    assert card(page, "running") == 30  # running and not failed: the failed five are their own card
    assert card(page, "failed items") == 5
    assert card(page, "fan-out children") == 2
    assert f"Log version <b>{main_log.version}</b>" in page
    assert "Completed by processor version: <b>(none)</b> 5 · <b>v1</b> 60</p>" in page
    assert "model timeout on item-089" in page
    assert "1–50 of 120" in page


def _ids(r: Any) -> list[str]:
    return [row["item_id"] for row in r.json()["items"]]


def test_pagination(client: TestClient, main_log: Any) -> None:
    pages = [client.get(f"{API}/items", params={"offset": off, "limit": 50}) for off in (0, 50, 100)]
    ids = [i for r in pages for i in _ids(r)]
    assert ids == sorted(iid(i) for i in range(120))
    assert [len(_ids(r)) for r in pages] == [50, 50, 20]
    assert all(r.json()["total"] == 120 for r in pages)
    html = client.get(EXP, params={"offset": 50, "limit": 50}).text
    assert "51–100 of 120" in html
    assert "offset=0" in html and "offset=100" in html  # previous and next links
    last = client.get(EXP, params={"offset": 100, "limit": 50}).text
    assert "101–120 of 120" in last and "next →" not in last
    assert client.get(f"{API}/items", params={"limit": 10_000}).status_code == 422


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"status": "completed"}, [*range(60), *range(80, 85)]),
        ({"status": "filtered"}, list(range(60, 80))),
        ({"status": "running"}, list(range(90, 120))),  # the failed 85-89 are not "running" on the page
        ({"status": "failed"}, list(range(85, 90))),
        ({"q": "item-11"}, list(range(110, 120))),
        ({"q": "ITEM-08", "status": "completed"}, list(range(80, 85))),
    ],
)
def test_filter_and_search(client: TestClient, main_log: Any, params: dict[str, str], expected: list[int]) -> None:
    r = client.get(f"{API}/items", params={**params, "limit": 500})
    assert _ids(r) == [iid(i) for i in expected]
    assert r.json()["total"] == len(expected)
    html = client.get(EXP, params=params).text
    items_table = html.split("<h2>Items</h2>", 1)[1]
    shown = re.findall(r"class='mono'>(item-\d{3})</a></td>", items_table)
    assert shown == [iid(i) for i in expected][:50]


def test_children_scope_and_bad_filters(client: TestClient, main_log: Any) -> None:
    r = client.get(f"{API}/items", params={"scope": "children"})
    assert _ids(r) == [child_item_id(iid(0), "solve", 0), child_item_id(iid(0), "solve", 1)]
    assert client.get(f"{API}/items", params={"scope": "all"}).json()["total"] == 122
    bad = client.get(f"{API}/items", params={"status": "exploded"})
    assert bad.status_code == 400 and "unknown status filter" in bad.json()["detail"]
    assert client.get(EXP, params={"status": "exploded"}).status_code == 400


def test_item_page_trajectory(client: TestClient, main_log: Any) -> None:
    item = client.get(f"{API}/item", params={"id": iid(0)}).json()
    assert item["state"]["status"] == "completed"
    assert item["state"]["cursor"]["step"] == "gen"
    assert item["fields"] == {"answer": {"n": 0}}
    assert [e["event_type"] for e in item["events"]] == [
        "ITEM_CREATED",
        "STEP_STARTED",
        "FIELD_SET",
        "STEP_COMPLETED",
        "TERMINAL",
    ]
    assert [e["item_seq"] for e in item["events"]] == [0, 1, 2, 3, 4]
    ev = item["events"][1]
    assert (ev["step"], ev["step_kind"], ev["writer_id"], ev["writer_epoch"]) == ("gen", "Sequence", "map0-try1", 1)
    assert (ev["dag_id"], ev["run_id"], ev["task_id"], ev["map_index"], ev["try_number"]) == ("dg", "run1", "map", 0, 1)
    assert [(c["item_id"], c["status"]) for c in item["children"]] == [
        (child_item_id(iid(0), "solve", 0), "completed"),
        (child_item_id(iid(0), "solve", 1), "running"),
    ]
    html = client.get(f"{EXP}/item", params={"id": iid(0)}).text
    # the writing task is named by its chunk's key range (map 0 wrote items 0-79)
    label = "dg · map[0] · item-000 … item-079 (80 items) · try 1"
    for text in ("STEP_COMPLETED", "map0-try1@1", "Fan-out children (2)", "item-000/solve:0", label):
        assert escaped(text) in html, text
    assert "/datagen/ti/dg/run1/map/0" in html


def test_item_failures_tries_and_versions(client: TestClient, main_log: Any) -> None:
    item = client.get(f"{API}/item", params={"id": iid(82)}).json()
    assert item["state"]["status"] == "completed" and item["state"]["failures"] == 1
    (failure,) = item["failures"]
    assert failure["message"] == "model timeout on item-082" and "Traceback" in failure["traceback"]
    assert {e["try_number"] for e in item["events"]} == {1, 2}
    html = client.get(f"{EXP}/item", params={"id": iid(82)}).text
    assert "<details><summary>traceback</summary><pre>Traceback" in html

    versions = client.get(f"{API}/item", params={"id": iid(119)}).json()["input_versions"]
    assert [(v["input_fingerprint"], v["current"]) for v in versions] == [("fp119", False), ("fp119-v2", True)]
    assert "fp119-v2" in client.get(f"{EXP}/item", params={"id": iid(119)}).text


def test_blobs_are_links_and_download_on_click(client: TestClient, main_log: Any) -> None:
    item = client.get(f"{API}/item", params={"id": iid(2)}).json()
    raw, doc = item["fields"]["raw"]["blob"], item["fields"]["doc"]["blob"]
    assert raw["kind"] == "bytes" and raw["size"] == len(RAW)
    html = client.get(f"{EXP}/item", params={"id": iid(2)}).text
    # The page carries only the links, never the bytes.
    assert f"href='{escaped(raw['url'])}' download" in html
    assert "x" * 1000 not in html
    r = client.get(raw["url"])
    assert r.status_code == 200 and r.content == RAW
    assert r.headers["content-type"] == "application/octet-stream"
    assert r.headers["x-content-type-options"] == "nosniff"
    assert "attachment" in r.headers["content-disposition"]
    d = client.get(doc["url"])
    assert d.headers["content-type"] == "application/json" and json.loads(d.content) == BIG_DOC


def test_task_instance_view(client: TestClient, main_log: Any) -> None:
    data = client.get("/datagen/api/ti/dg/run1/map/1").json()
    (exp,) = data["experiments"]
    assert (exp["pipeline"], exp["experiment"]) == (P, E)
    assert exp["tries"] == [1, 2] and exp["items_total"] == 10
    by_id = {it["item_id"]: it for it in exp["items"]}
    assert set(by_id) == {iid(i) for i in range(80, 90)}
    done = by_id[iid(80)]
    assert done["current_status"] == "completed"
    t1, t2 = done["attempts"]
    assert t1["try_number"] == 1 and t1["by_type"] == {"ITEM_CREATED": 1, "STEP_STARTED": 1, "FAILED": 1}
    assert t1["errors"][0]["message"] == "model timeout on item-080"
    assert t2["try_number"] == 2 and t2["terminal"] == "completed" and t2["fields"] == ["answer"]
    assert t2["writer_epoch"] == 2
    still = by_id[iid(88)]
    assert still["current_status"] == "running" and [a["try_number"] for a in still["attempts"]] == [1]

    html = client.get("/datagen/ti/dg/run1/map/1").text
    assert "<th>Try 1</th><th>Try 2</th>" in html
    assert "10 items" in html and "model timeout on item-088" in html
    # Other map indexes are not this task instance's chunk; map 0 wrote items 0-79 and two children.
    map0 = client.get("/datagen/api/ti/dg/run1/map/0").json()["experiments"]
    assert [e["items_total"] for e in map0 if e["experiment"] == E] == [82]


def test_task_instance_without_events(client: TestClient, main_log: Any) -> None:
    assert client.get("/datagen/api/ti/dg/run1/plan/-1").json()["experiments"] == []
    html = client.get("/datagen/ti/dg/run1/plan/-1").text
    assert "wrote no datagen events" in html
    # An unsubstituted {MAP_INDEX} placeholder is read as an unmapped task, not an error.
    assert client.get("/datagen/ti/dg/run1/plan/%7BMAP_INDEX%7D").status_code == 200


def test_unmapped_task_matches_null_map_index(client: TestClient, ui_log: Any) -> None:
    lg = ui_log("qa", "unmapped")
    w = lg.writer("w", 1, airflow={"dag_id": "dg2", "run_id": "r", "task_id": "t", "try_number": 1})
    with w.batch() as b:
        b.item_created("solo", input_fingerprint="f")
    (exp,) = client.get("/datagen/api/ti/dg2/r/t/-1").json()["experiments"]
    assert exp["experiment"] == "unmapped" and exp["items"][0]["item_id"] == "solo"


def test_not_found_messages(client: TestClient, main_log: Any) -> None:
    r = client.get("/datagen/api/experiments/qa/nope")
    assert r.status_code == 404
    assert "no experiment 'qa'/'nope'" in r.json()["detail"] and "has no log yet" in r.json()["detail"]
    page = client.get("/datagen/experiments/qa/nope")
    assert page.status_code == 404 and "no experiment" in page.text and "<h1>Not found</h1>" in page.text
    bad = client.get("/datagen/api/experiments/qa/bad%20name")
    assert bad.status_code == 404 and "not allowed" in bad.json()["detail"]
    item = client.get(f"{API}/item", params={"id": "item-999"})
    assert item.status_code == 404 and "no item 'item-999' in qa/main" in item.json()["detail"]
    assert client.get(f"{EXP}/item", params={"id": "item-999"}).status_code == 404
    blob = client.get(f"{API}/blob/0123456789abcdef")
    assert blob.status_code == 404 and "no blob" in blob.json()["detail"]


def test_pages_follow_new_commits(client: TestClient, ui_log: Any) -> None:
    # The fold is cached per log version: a new commit must show on the next request.
    lg = ui_log("qa", "live")
    w = lg.writer("w", 1)
    with w.batch() as b:
        b.item_created("a", input_fingerprint="f")
    assert client.get("/datagen/api/experiments/qa/live").json()["completed"] == 0
    with w.batch() as b:
        b.terminal("a")
    s = client.get("/datagen/api/experiments/qa/live").json()
    assert s["completed"] == 1 and s["log_version"] == lg.version


def test_transient_attempts_are_marked_in_the_failure_lens(client: TestClient, ui_log: Any) -> None:
    """An attempt a retry policy retried in place shows as transient (attempt, wait); a plain failure does not."""
    lg = ui_log("qa", "retried")
    w = lg.writer("w", 1, airflow=airflow_coords())
    with w.batch() as b:
        for item in ("a", "b"):
            b.item_created(item, input_fingerprint=f"f-{item}")
        b.failed("a", error=TimeoutError("model timed out"), step="gen", attempt=1, transient=True, wait=0.25)
        b.terminal("a")
        b.failed("b", error=ValueError("refused"), step="gen")
    api = "/datagen/api/experiments/qa/retried"
    failures = {f["item_id"]: f for f in client.get(api).json()["recent_failures"]}
    assert {k: (f["transient"], f["attempt"], f["wait"], f["resolved"]) for k, f in failures.items()} == {
        "a": (True, 1, 0.25, True),
        "b": (False, None, None, False),
    }
    assert client.get(api).json()["failed_items"] == 1
    table = client.get("/datagen/experiments/qa/retried").text.split("<h2>Failures", 1)[1].split("<h2>Items", 1)[0]
    rows = {re.search(r"item\?id=(\w+)", r).group(1): r.split("</tr>")[0] for r in table.split("<tr>")[2:]}  # type: ignore[union-attr]
    assert "s-transient" in rows["a"] and "attempt 1, then waited 0.25 s" in rows["a"]
    assert "s-transient" not in rows["b"] and "attempt" not in rows["b"]
    item = client.get(f"{api}/item?id=a").json()
    assert [(f["error_type"], f["transient"], f["attempt"], f["wait"]) for f in item["failures"]] == [
        ("TimeoutError", True, 1, 0.25)
    ]
    page = client.get("/datagen/experiments/qa/retried/item?id=a").text
    assert "s-transient" in page and "attempt 1, then waited 0.25 s" in page
