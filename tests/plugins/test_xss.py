"""Ids, field values, messages and coordinates are user data: every page renders them as text."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from airflow_provider_datagen.core import root_item_id
from tests.plugins.util import escaped

if TYPE_CHECKING:
    from fastapi.testclient import TestClient

SCRIPT = "<script>alert(1)</script>"
IMG = "<img src=x onerror=alert(2)>"
ATTR = "' onmouseover='alert(3)"
# The raw string as an item id (its "/" makes it a fan-out child id of "<script>alert(1)<") and the
# same string as a source key, escaped into a root id the way the planner does.
RAW_ID = SCRIPT
ROOT_ID = root_item_id(SCRIPT)
HOSTILE_RUN = f"run{SCRIPT}"


@pytest.fixture(scope="module")
def hostile(ui_log: Any) -> Any:
    lg = ui_log("xss", "e1")
    af = {"dag_id": "dgx", "run_id": HOSTILE_RUN, "task_id": "map", "map_index": 0, "try_number": 1}
    w = lg.writer(f"writer{IMG}", 1, processor_version=ATTR, airflow=af)
    with w.batch() as b:
        for item in (RAW_ID, ROOT_ID, ATTR):
            b.item_created(item, input_fingerprint=SCRIPT)
            b.field_set(item, IMG, SCRIPT)
            b.field_append(item, "list", {"k": SCRIPT})
            b.failed(item, error=ValueError(SCRIPT), traceback=f"Traceback {SCRIPT}")
        b.terminal(ROOT_ID, status="filtered", reason={"why": SCRIPT})
    return lg


def _assert_inert(html: str) -> None:
    assert SCRIPT not in html
    assert IMG not in html
    assert "onmouseover='alert" not in html
    assert "<script" not in html.lower()


def _pages(client: TestClient) -> dict[str, str]:
    exp = "/datagen/experiments/xss/e1"
    out = {
        "index": client.get("/datagen/").text,
        "experiment": client.get(exp, params={"scope": "all"}).text,
        "search": client.get(exp, params={"scope": "all", "q": SCRIPT}).text,
        "failed": client.get(exp, params={"scope": "all", "status": "failed"}).text,
        "ti": client.get(f"/datagen/ti/dgx/{HOSTILE_RUN.replace('/', '%2F')}/map/0").text,
    }
    for item in (RAW_ID, ROOT_ID, ATTR):
        r = client.get(f"{exp}/item", params={"id": item})
        assert r.status_code == 200, (item, r.text[:300])
        out[f"item {item}"] = r.text
    return out


def test_hostile_values_render_as_text(client: TestClient, hostile: Any) -> None:
    pages = _pages(client)
    for name, html in pages.items():
        _assert_inert(html)
        assert html.startswith("<!doctype html>"), name
    item = pages[f"item {RAW_ID}"]
    # The id, the field name, the value, the error message and the traceback are all there, escaped.
    assert escaped(RAW_ID) in item
    assert escaped(IMG) in item
    assert escaped(SCRIPT) in item
    assert f"Traceback {escaped(SCRIPT)}" in item
    assert escaped(f"writer{IMG}") in item
    assert escaped(ROOT_ID) in pages["experiment"]
    assert escaped(ATTR) in pages["experiment"]
    # The search string is echoed into the form, escaped.
    assert f"value='{escaped(SCRIPT)}'" in pages["search"]
    assert "3 items" in pages["ti"] and escaped(HOSTILE_RUN) in pages["ti"]


def test_item_links_round_trip_any_id(client: TestClient, hostile: Any) -> None:
    # Links carry the id percent-encoded in the query string; following them reaches the same item.
    import re

    html = client.get("/datagen/experiments/xss/e1", params={"scope": "all"}).text
    hrefs = re.findall(r"href='(/datagen/experiments/xss/e1/item\?id=[^']+)'", html)
    reached = set()
    for href in hrefs:
        r = client.get(href.replace("&amp;", "&"))
        assert r.status_code == 200
        reached.add(
            client.get(href.replace("/experiments/", "/api/experiments/", 1).replace("&amp;", "&")).json()["item_id"]
        )
    assert {RAW_ID, ROOT_ID, ATTR} <= reached


def test_json_keeps_raw_values(client: TestClient, hostile: Any) -> None:
    data = client.get("/datagen/api/experiments/xss/e1/item", params={"id": RAW_ID}).json()
    assert data["item_id"] == RAW_ID
    assert data["fields"][IMG] == SCRIPT
    assert data["failures"][0]["message"] == SCRIPT


@pytest.fixture(scope="module")
def hostile_exchange(ui_log: Any, ui_root: Any) -> Any:
    """An attempt whose request, reply and stored origin are hostile text, reused from the store."""
    import json

    from airflow_provider_datagen.core import ResponseStore
    from airflow_provider_datagen.core.store.responses import ResponseEntry

    key = "ab" * 32
    request = {
        "messages": [{"role": f"user{ATTR}", "content": SCRIPT}, {"role": "user", "content": [{"text": IMG}]}],
        "settings": {IMG: SCRIPT},
        "schema": {"properties": {SCRIPT: {"type": "string", "description": ATTR}}},
        "model": f"m{SCRIPT}",
        "provider": IMG,
        "base_url": ATTR,
        "sample": SCRIPT,
    }
    reply = {"choices": [{"message": {"content": SCRIPT}}], "model": IMG}
    entry = ResponseEntry(
        key=key,
        reply_json=json.dumps(reply),
        model=f"openai:{IMG}",
        request_json=json.dumps(request),
        pipeline=f"p{SCRIPT}",
        experiment=ATTR,
    )
    ResponseStore.open(str(ui_root)).put_many([entry])
    lg = ui_log("xss", "exchange")
    usage = {"model": f"openai:{IMG}", "calls": 1, "input_tokens": 1, "output_tokens": 1, "cost_usd": 0.0}
    with lg.writer("w1", 1).batch() as b:
        b.item_created(RAW_ID, input_fingerprint="fp")
        value = {"attempt": 1, "usage": [{**usage, "reused": True, "saved_usd": None, "request_keys": [key]}]}
        b.step_completed(RAW_ID, step="gen", value=value)
        b.terminal(RAW_ID)
    return lg


def test_a_hostile_exchange_renders_as_text(client: TestClient, hostile_exchange: Any) -> None:
    r = client.get("/datagen/experiments/xss/exchange/item", params={"id": RAW_ID})
    assert r.status_code == 200, r.text[:300]
    html = r.text
    _assert_inert(html)
    section = html[html.index("<h2 id='exchanges'>") : html.index("<h2>Failures</h2>")]
    assert f"<pre>{escaped(SCRIPT)}</pre>" in section  # the user message, as text
    assert f"reused from <b>{escaped(f'p{SCRIPT}')}/{escaped(ATTR)}</b>" in section
    assert escaped(f'"content": "{SCRIPT}"') in section  # the reply, pretty-printed
    assert escaped(f'"{IMG}": "{SCRIPT}"') in section  # the settings
    assert escaped(f"user{ATTR}") in section and escaped(f"openai:{IMG}") in section
