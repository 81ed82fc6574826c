"""The item page shows each attempt's exchanges: the request as sent, the reply as received, and where a
reused reply came from (real runs of the model step against tests/_support/openai_server.py)."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

import pytest
from pydantic import BaseModel

from airflow_provider_datagen.core import run_items
from airflow_provider_datagen.llm import llm_process
from airflow_provider_datagen.plugins.data import Reader
from airflow_provider_datagen.plugins.exchange_view import MAX_TEXT, capped
from airflow_provider_datagen.plugins.pages import Urls, item_page
from tests._support import openai_server
from tests.plugins.util import escaped

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from fastapi.testclient import TestClient

P = "xch"
ITEMS = [
    {"id": "q0", "text": "capital of France"},
    {"id": "q1", "text": "capital of Peru [invalid once]"},  # a first answer that fails validation
    {"id": "q2", "text": "capital of " + "Long " * 14_000},  # a prompt longer than a page shows
]


class Capital(BaseModel):
    city: str


def _process() -> Any:
    return llm_process(
        "Name the {{ text }}",
        llm_conn_id="llm_exchanges",
        instructions="Answer with the city only.",
        output_type=Capital,
        model_settings={"temperature": 0.25},
    )


@pytest.fixture(scope="module")
def runs(ui_log: Any) -> Iterator[dict[str, int]]:
    """Two experiments over the same prompts: ``first`` sends every request, ``second`` reuses them all."""
    server = openai_server.start(tool_args={"city": "Paris"})
    conn = {"conn_type": "pydanticai", "host": server.base_url, "password": "sk-fake"}
    conn["extra"] = {"model": "openai-chat:gpt-4o-mini"}  # type: ignore[assignment]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AIRFLOW_CONN_LLM_EXCHANGES", json.dumps(conn))
        try:
            process = _process()
            for experiment in ("first", "second"):
                report = run_items(ui_log(P, experiment), ITEMS, process, processor_version=process.version)
                assert report.failed == [], report.errors
            yield {"sent": sum(1 for r in server.requests if r.status == 200)}
        finally:
            server.stop()


def _page(client: TestClient, experiment: str, item: str) -> str:
    r = client.get(f"/datagen/experiments/{P}/{experiment}/item", params={"id": item})
    assert r.status_code == 200, r.text[:500]
    return r.text


def _api(client: TestClient, experiment: str, item: str) -> dict[str, Any]:
    r = client.get(f"/datagen/api/experiments/{P}/{experiment}/item", params={"id": item})
    assert r.status_code == 200, r.text[:500]
    return r.json()


def test_the_page_shows_the_request_as_sent_and_the_reply_as_received(client: TestClient, runs: Any) -> None:
    assert runs["sent"] == 4  # q0 and q2 once, q1 twice (its first answer did not validate); none by "second"
    html = _page(client, "first", "q0")
    section = html[html.index("<h2 id='exchanges'>") : html.index("<h2>Failures</h2>")]
    assert "attempt 1 · step" in section
    assert section.count("class='card exchange'") == 1
    # the messages, the settings and the output schema of the request, escaped
    assert escaped("Answer with the city only.") in section
    assert escaped("Name the capital of France") in section
    assert escaped('"temperature": 0.25') in section
    assert escaped('"city": {') in section  # the schema, pretty-printed
    # the reply as the server sent it, pretty-printed (the answer is its content's JSON text)
    assert escaped('"choices": [') in section
    assert escaped('"content": "{\\"city\\": \\"Paris\\"}"') in section
    assert "reused from" not in section


def test_a_validation_retry_shows_both_requests_the_second_with_the_earlier_turns(
    client: TestClient, runs: Any
) -> None:
    data = _api(client, "first", "q1")
    (attempt,) = data["exchanges"]["attempts"]
    assert (attempt["attempt"], attempt["status"]) == (1, "completed")
    first, second = attempt["exchanges"]
    assert [x["reused"] for x in (first, second)] == [False, False] and first["key"] != second["key"]
    assert [m["role"] for m in first["request"]["messages"]] == ["system", "user"]
    # the retry sends the invalid answer back with what was wrong with it
    assert [m["role"] for m in second["request"]["messages"]] == ["system", "user", "assistant", "user"]
    assert "Fix the errors" in second["request"]["messages"][-1]["content"]["text"]
    assert json.loads(second["reply"]["text"])["choices"][0]["message"]["content"] == '{"city": "Paris"}'


def test_a_reused_reply_says_where_it_came_from(client: TestClient, runs: Any) -> None:
    html = _page(client, "second", "q0")
    made = _api(client, "first", "q0")["exchanges"]["attempts"][0]["exchanges"][0]
    m = re.search(r"<p class='reused-from'>reused from <b>xch/first</b>, ([^<]+)</p>", html)
    assert m, html[html.index("<h2 id='exchanges'>") :][:2000]
    assert m.group(1) == made["made_by"]["created_at"]  # the date the first experiment stored it
    x = _api(client, "second", "q0")["exchanges"]["attempts"][0]["exchanges"][0]
    assert x["reused"] is True and x["key"] == made["key"]
    assert x["made_by"] == {"pipeline": P, "experiment": "first", "created_at": made["made_by"]["created_at"]}
    assert x["reply"] == made["reply"] and x["request"] == made["request"]  # the same exchange, read again
    assert escaped("Name the capital of France") in html and escaped('"choices": [') in html
    assert "saved" in html


def test_the_log_records_each_attempts_request_keys(ui_log: Any, runs: Any) -> None:
    from airflow_provider_datagen.core import ResponseStore

    first, second = ui_log(P, "first"), ui_log(P, "second")
    sent = [e for e in first.events("q1") if e.event_type.value == "STEP_COMPLETED"]
    (entry,) = json.loads(sent[0].value_json)["usage"]
    assert entry["calls"] == 2 and len(entry["request_keys"]) == 2 and "reused" not in entry
    reused = [e for e in second.events("q0") if e.event_type.value == "STEP_COMPLETED"]
    (r_entry,) = json.loads(reused[0].value_json)["usage"]
    assert r_entry["reused"] is True
    # the key names the entry the first experiment stored for q0's request
    (key,) = r_entry["request_keys"]
    stored = ResponseStore.open(first.root).get_many([key])[key]
    assert stored.experiment == "first" and "Name the capital of France" in (stored.request_json or "")
    first_q0 = [e for e in first.events("q0") if e.event_type.value == "STEP_COMPLETED"]
    assert json.loads(first_q0[0].value_json)["usage"][0]["request_keys"] == [key]
    # the keys change no sum: the second experiment reused everything and paid nothing
    usage = second.usage()
    assert (usage["calls"], usage["requests"], usage["reused_calls"]) == (0, 0, 4)
    assert first.usage()["calls"] == first.usage()["requests"] == 4


def test_an_unreachable_store_does_not_break_the_page(runs: Any, ui_root: Path, tmp_path: Path) -> None:
    import shutil

    # a copy of the root whose response store is a file: not a store at all
    root = tmp_path / "root"
    shutil.copytree(ui_root / "datagen_checkpoints" / P, root / "datagen_checkpoints" / P)
    (root / "datagen_responses").write_text("not a store")
    data = Reader(str(root)).item(P, "second", "q0")
    xs = data["exchanges"]
    assert xs["available"] is False and xs["message"].startswith("response store unavailable: ")
    assert "is not a Lance dataset" in xs["message"]
    (x,) = xs["attempts"][0]["exchanges"]
    assert x["stored"] is False and x["reused"] is True
    html = item_page(data, Urls("/datagen"))
    assert f"<p class='muted' id='store-unavailable'>{escaped(xs['message'])}</p>" in html
    assert "not in the response store" in html
    # no store under the root at all
    (root / "datagen_responses").unlink()
    data = Reader(str(root)).item(P, "second", "q0")
    assert data["exchanges"]["message"].startswith("response store unavailable: there is no response store at ")
    assert "q0" in item_page(data, Urls("/datagen"))


def test_an_old_log_without_keys_still_renders(client: TestClient, ui_log: Any) -> None:
    lg = ui_log(P, "old")
    usage = {"model": "openai:gpt-4o-mini", "calls": 1, "input_tokens": 5, "output_tokens": 2}
    with lg.writer("w-old", 1).batch() as b:
        b.item_created("a", input_fingerprint="fp")
        b.step_completed("a", step="gen", value={"attempt": 1, "usage": [{**usage, "cost_usd": None}]})
        b.terminal("a")
    html = _page(client, "old", "a")
    assert "No exchanges recorded" in html and "(or the log predates request keys)" in html
    data = _api(client, "old", "a")
    assert data["exchanges"]["attempts"] == [] and data["exchanges"]["available"] is True
    assert data["usage"]["calls"] == 1


def test_a_long_prompt_is_cut_with_a_note(client: TestClient, runs: Any) -> None:
    html = _page(client, "first", "q2")
    prompt = "Name the capital of " + "Long " * 14_000
    assert escaped(prompt[:1000]) in html and escaped(prompt) not in html
    assert f"truncated: {MAX_TEXT:,} of {len(prompt):,} characters shown" in html
    data = _api(client, "first", "q2")
    user = data["exchanges"]["attempts"][0]["exchanges"][0]["request"]["messages"][1]["content"]
    assert user == {"text": prompt[:MAX_TEXT], "truncated": True, "chars": len(prompt)}


def test_long_texts_are_cut_with_a_note() -> None:
    shown = capped("x" * (MAX_TEXT + 10))
    assert shown["truncated"] is True and len(shown["text"]) == MAX_TEXT and shown["chars"] == MAX_TEXT + 10
    assert capped("short") == {"text": "short", "truncated": False, "chars": 5}


def _row(key: str, attempt: int = 1, reused: bool = False) -> dict[str, Any]:
    return {"attempt": attempt, "step": "gen", "status": "completed", "model": "m", "key": key, "reused": reused}


def test_a_sent_request_whose_key_another_experiment_stored_says_whose_reply_is_shown() -> None:
    from airflow_provider_datagen.core.store.responses import ResponseEntry
    from airflow_provider_datagen.plugins.exchange_view import item_exchanges

    mine, theirs = "a" * 64, "b" * 64
    entries = {
        mine: ResponseEntry(key=mine, reply_json="{}", model="m", pipeline=P, experiment="e"),
        theirs: ResponseEntry(key=theirs, reply_json="{}", model="m", pipeline=P, experiment="other"),
    }
    asked: list[list[str]] = []

    def lookup(keys: list[str]) -> dict[str, Any]:
        asked.append(keys)
        return {k: entries[k] for k in keys if k in entries}

    out = item_exchanges([_row(mine), _row(theirs), _row(mine, attempt=2), _row("c" * 64, 2)], lookup, P, "e")
    assert asked == [[mine, theirs, "c" * 64]]  # one lookup, each key once
    first, second = out["attempts"]
    assert [x["other_reply"] for x in first["exchanges"]] == [False, True]
    assert [x["stored"] for x in second["exchanges"]] == [True, False]


def test_a_page_shows_at_most_max_exchanges() -> None:
    from airflow_provider_datagen.plugins.exchange_view import MAX_EXCHANGES, item_exchanges

    rows = [_row(f"{i:064x}") for i in range(MAX_EXCHANGES + 5)]
    out = item_exchanges(rows, lambda keys: {}, P, "e")
    assert (out["total"], out["shown"]) == (MAX_EXCHANGES + 5, MAX_EXCHANGES)
    assert sum(len(a["exchanges"]) for a in out["attempts"]) == MAX_EXCHANGES
    # a lookup that raises is the page's "unavailable" note, never an error
    broken = item_exchanges(rows[:1], lambda keys: 1 / 0, P, "e")
    assert broken["message"] == "response store unavailable: ZeroDivisionError: division by zero"
    assert broken["attempts"][0]["exchanges"][0]["stored"] is False
