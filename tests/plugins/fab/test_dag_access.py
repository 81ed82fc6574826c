"""Per-Dag access with FAB: a user sees exactly the experiments of the Dags they may read.

Real logs written by ``run_items`` under each Dag's Airflow coordinates (the map operator's writer
id and coordinates), real FAB users whose roles grant ``can_read`` on ``DAG:<dag_id>`` (or on all
Dags), real JWTs resolved by the FAB auth manager on each request.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import pytest

from airflow_provider_datagen.core import CheckpointLog, run_items

if TYPE_CHECKING:
    from pathlib import Path

    from fastapi import FastAPI
    from fastapi.testclient import TestClient

#: experiment -> the Dags whose tasks write it (None: a script outside any Dag)
EXPERIMENTS: dict[tuple[str, str], list[str | None]] = {
    ("shop", "a1"): ["dag_a"],
    ("shop", "b1"): ["dag_b"],
    ("shop", "ab"): ["dag_a", "dag_b"],
    ("lab", "script"): [None],
    ("shop", "a_and_script"): ["dag_a", None],
}

#: user -> the experiments they must see (and no other)
VISIBLE = {
    "reader_a": {("shop", "a1")},
    "reader_ab": {("shop", "a1"), ("shop", "b1"), ("shop", "ab")},
    "all_reader": set(EXPERIMENTS),
    "admin": set(EXPERIMENTS),
}


def _process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
    return {"answer": item["text"].upper()}


@pytest.fixture(scope="module", autouse=True)
def logs(fab_root: Path) -> None:
    for (pipeline, experiment), dags in EXPERIMENTS.items():
        lg = CheckpointLog.open(str(fab_root), pipeline=pipeline, experiment=experiment)
        for n, dag_id in enumerate(dags):
            items = [{"id": f"{n}-{i}", "text": f"item {n}-{i}"} for i in range(3)]
            if dag_id is None:
                run_items(lg, items, _process, writer_id="notebook", epoch=lg.next_epoch())
                continue
            coords = {"dag_id": dag_id, "run_id": "r1", "task_id": "map", "map_index": n, "try_number": 1}
            run_items(lg, items, _process, writer_id=f"{dag_id}/r1/map/{n}", epoch=lg.next_epoch(), airflow=coords)


@pytest.fixture
def as_user(fab_app: FastAPI, fab_tokens: dict[str, str]):
    from fastapi.testclient import TestClient

    def _client(name: str) -> TestClient:
        c = TestClient(fab_app)
        c.headers["Authorization"] = f"Bearer {fab_tokens[name]}"
        return c

    return _client


def _listed(client: TestClient) -> set[tuple[str, str]]:
    r = client.get("/datagen/api/experiments")
    assert r.status_code == 200, r.text
    return {(e["pipeline"], e["experiment"]) for e in r.json()["experiments"]}


@pytest.mark.parametrize("user", sorted(VISIBLE))
def test_listing_shows_exactly_the_readable_experiments(as_user, user: str) -> None:
    client = as_user(user)
    assert _listed(client) == VISIBLE[user]
    page = client.get("/datagen/").text
    shown = set(re.findall(r"href='/datagen/experiments/([^/']+)/([^/'?]+)'", page))
    assert shown == VISIBLE[user]


@pytest.mark.parametrize("user", sorted(VISIBLE))
def test_every_route_of_an_experiment_follows_the_listing(as_user, user: str) -> None:
    client = as_user(user)
    for p, e in EXPERIMENTS:
        base = f"/datagen/experiments/{p}/{e}"
        api = f"/datagen/api/experiments/{p}/{e}"
        routes = [base, api, f"{api}/items", f"{base}/item?id=0-0", f"{api}/item?id=0-0"]
        expected = 200 if (p, e) in VISIBLE[user] else 403
        for route in routes:
            r = client.get(route)
            assert r.status_code == expected, (user, route, r.status_code, r.text[:200])
            if expected == 403:
                # nothing of the experiment in the refusal
                assert "ITEM 0-0" not in r.text and "answer" not in r.text


def test_a_one_dag_reader_cannot_tell_missing_from_forbidden(as_user) -> None:
    client = as_user("reader_a")
    missing = client.get("/datagen/api/experiments/shop/nope")
    forbidden = client.get("/datagen/api/experiments/shop/b1")
    assert missing.status_code == forbidden.status_code == 403
    # an all-Dag reader may learn that it does not exist
    assert as_user("all_reader").get("/datagen/api/experiments/shop/nope").status_code == 404


def test_blobs_follow_the_experiment(as_user, fab_root: Path) -> None:
    lg = CheckpointLog.open(str(fab_root), pipeline="shop", experiment="b1")
    w = lg.writer("dag_b/r2/map/0", lg.next_epoch(), airflow={"dag_id": "dag_b", "run_id": "r2", "task_id": "map"})
    with w.batch() as b:
        b.item_created("blob-item", input_fingerprint="f")
        b.field_set("blob-item", "raw", b"\x02" * 40_000)
    item = as_user("reader_ab").get("/datagen/api/experiments/shop/b1/item?id=blob-item").json()
    url = item["fields"]["raw"]["blob"]["url"]
    assert as_user("reader_ab").get(url).content == b"\x02" * 40_000
    r = as_user("reader_a").get(url)
    assert r.status_code == 403 and b"\x02" not in r.content


def test_a_user_who_may_read_no_dag_is_refused(as_user) -> None:
    client = as_user("no_dags")
    for route in ("/datagen/", "/datagen/api/experiments", "/datagen/api/experiments/shop/a1"):
        r = client.get(route)
        assert r.status_code == 403, (route, r.text)
        assert r.json() == {"detail": "Forbidden: you may not read any Dag"}


def test_a_new_dag_writing_into_an_experiment_narrows_who_sees_it(as_user, fab_root: Path) -> None:
    # Attribution is cached per log version: a commit by another Dag must take effect at once.
    lg = CheckpointLog.open(str(fab_root), pipeline="shop", experiment="a_only")
    coords = {"dag_id": "dag_a", "run_id": "r1", "task_id": "map", "map_index": 0, "try_number": 1}
    run_items(lg, [{"id": "x", "text": "x"}], _process, writer_id="dag_a/r1/map/0", airflow=coords)
    client = as_user("reader_a")
    assert client.get("/datagen/api/experiments/shop/a_only").status_code == 200
    coords_b = {**coords, "dag_id": "dag_c"}
    run_items(lg, [{"id": "y", "text": "y"}], _process, writer_id="dag_c/r1/map/0", epoch=2, airflow=coords_b)
    assert client.get("/datagen/api/experiments/shop/a_only").status_code == 403
    assert ("shop", "a_only") not in _listed(client)


def test_the_task_instance_tab_lists_only_the_experiments_the_user_may_read(as_user) -> None:
    # dag_a's map task 0 wrote a1 (dag_a only), ab (dag_b too) and a_and_script (a script too): the
    # experiment pages refuse ab and a_and_script to a dag_a reader, so the tab must not list them.
    def listed(user: str) -> set[tuple[str, str]]:
        r = as_user(user).get("/datagen/api/ti/dag_a/r1/map/0")
        assert r.status_code == 200, r.text
        return {(x["pipeline"], x["experiment"]) for x in r.json()["experiments"]}

    assert listed("ti_reader_a") == {("shop", "a1")}
    assert listed("admin") >= {("shop", "a1"), ("shop", "ab"), ("shop", "a_and_script")}
    page = as_user("ti_reader_a").get("/datagen/ti/dag_a/r1/map/0").text
    assert "shop / a1" in page and "shop / ab" not in page and "a_and_script" not in page
