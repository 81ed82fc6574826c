"""The experiment page's spend, throughput and next-run panels and the item page's input and usage.

Logs are written by ``run_items`` (and a plan over an inline source, which stores the source beside
the log), at controlled write times so the throughput chart has known bars. Usage comes from the
ledger's read API (``log.usage()``, ``log.item_usage()``, ``log.budget()``), stubbed here.
"""

from __future__ import annotations

import datetime as dt
import re
import types
from typing import TYPE_CHECKING, Any

import pytest

from airflow_provider_datagen.core import CheckpointLog, run_items
from airflow_provider_datagen.core.chunks import plan_chunks
from airflow_provider_datagen.core.store import writer as writer_module
from tests.plugins.util import escaped

if TYPE_CHECKING:
    from fastapi.testclient import TestClient

P = "ins"
T0 = dt.datetime(2026, 3, 1, 12, 0, 10, tzinfo=dt.UTC)

# fixed ledger figures, so the page's formatting is checked exactly (test_spend_from_the_real_ledger
# runs the same panels on usage recorded through ctx)
USAGE = {
    "calls": 9,
    "input_tokens": 9000,
    "output_tokens": 1000,
    "cost_usd": 1.5,
    "unpriced_calls": 2,
    "by_model": {
        "openai:gpt-5-mini": {
            "calls": 7,
            "input_tokens": 7000,
            "output_tokens": 800,
            "cost_usd": 1.5,
            "unpriced_calls": 0,
        },
        "local:<b>llama</b>": {
            "calls": 2,
            "input_tokens": 2000,
            "output_tokens": 200,
            "cost_usd": 0.0,
            "unpriced_calls": 2,
        },
    },
    "failed_attempts_cost_usd": 0.25,
}
# fixed ledger figures, so the page's formatting is checked exactly (test_spend_from_the_real_ledger
# runs the same panels on usage recorded through ctx)
ZERO_USAGE = {
    "calls": 0,
    "input_tokens": 0,
    "output_tokens": 0,
    "cost_usd": 0.0,
    "unpriced_calls": 0,
    "by_model": {},
    "failed_attempts_cost_usd": 0.0,
}
# fixed ledger figures, so the page's formatting is checked exactly (test_spend_from_the_real_ledger
# runs the same panels on usage recorded through ctx)
ATTEMPTS = [
    {
        "attempt": 1,
        "step": "process",
        "status": "failed",
        "model": "openai:gpt-5-mini",
        "input_tokens": 800,
        "output_tokens": 100,
        "cost_usd": 0.25,
        "calls": 1,
    },
    {
        "attempt": 2,
        "step": "process",
        "status": "completed",
        "model": "openai:gpt-5-mini",
        "input_tokens": 812,
        "output_tokens": 240,
        "cost_usd": 0.0123,
        "calls": 1,
    },
]


def _stub_ledger(mp: pytest.MonkeyPatch, usage: dict[str, Any], budget: dict[str, Any], attempts: list[Any]) -> None:
    item_totals = {**ZERO_USAGE, "calls": len(attempts), "cost_usd": sum(a["cost_usd"] for a in attempts)}
    mp.setattr(CheckpointLog, "usage", lambda self: usage, raising=False)
    mp.setattr(CheckpointLog, "budget", lambda self: budget, raising=False)
    mp.setattr(CheckpointLog, "item_usage", lambda self, item_id: {**item_totals, "attempts": attempts}, raising=False)


@pytest.fixture(autouse=True)
def fresh_reader() -> Any:
    # Panels are cached per log version: each test's stubs must meet an empty cache.
    from airflow_provider_datagen.plugins.data import reset_reader

    reset_reader()
    yield
    reset_reader()


def _at(mp: pytest.MonkeyPatch, when: dt.datetime) -> None:
    """Make the log's writers stamp ``created_at`` with ``when``."""

    class _Clock(dt.datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Any:  # type: ignore[override]
            return when

    mp.setattr(writer_module, "dt", types.SimpleNamespace(datetime=_Clock, UTC=dt.UTC))


def _items(n: int) -> list[dict[str, Any]]:
    return [{"id": f"k{i}", "text": f"text {i}"} for i in range(n)]


def _flaky(bad: set[str]):
    def process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        if item["id"] in bad:
            raise RuntimeError(f"model timeout on {item['id']}")
        return {"answer": item["text"].upper()}

    return process


@pytest.fixture(scope="module")
def timed_log(ui_log) -> CheckpointLog:
    """Planned from an inline source, run twice at known times, plus two items the log alone knows.

    12:00: k0-k2 complete, k3 and k4 fail; 12:02: k3 completes, k4 fails again.
    Then a script creates k5 and starts k6 at processor version v0 (both replays for the next run).
    """
    lg = ui_log(P, "timed")
    items = _items(5)
    with pytest.MonkeyPatch.context() as mp:
        _at(mp, T0)
        plan_chunks(lg, items, key_field="id", record=False)  # a snapshot beside the log, no source record
        run_items(lg, items, _flaky({"k3", "k4"}), epoch=1)
        _at(mp, T0 + dt.timedelta(minutes=2, seconds=20))
        run_items(lg, items, _flaky({"k4"}), epoch=2)
    w = lg.writer("script", 3, processor_version="v0")
    with w.batch() as b:
        b.item_created("k5", input_fingerprint="f5")
        b.item_created("k6", input_fingerprint="f6")
        b.step_started("k6", step="process")
    return lg


def test_throughput_chart_bars_per_minute(client: TestClient, timed_log: CheckpointLog) -> None:
    page = client.get(f"/datagen/experiments/{P}/timed").text
    svg = re.search(r"<svg class='chart'.*?</svg>", page)
    assert svg, "no inline chart"
    bars = re.findall(r"<rect class='(\w+)'[^>]*><title>([^<]*)</title></rect>", svg.group(0))
    assert bars == [
        ("completed", "2026-03-01T12:00:00.000000Z: 3 completed per minute"),
        ("failed", "2026-03-01T12:00:00.000000Z: 2 failed per minute"),
        ("completed", "2026-03-01T12:02:00.000000Z: 1 completed per minute"),
        ("failed", "2026-03-01T12:02:00.000000Z: 1 failed per minute"),
    ]
    assert "4 completed, 3 failed attempts from 2026-03-01T12:00:00.000000Z to 2026-03-01T12:02:30.000000Z" in page
    # nothing fetched from elsewhere: no script, no external URL
    assert "<script" not in page and "http://" not in page and "https://" not in page
    api = client.get(f"/datagen/api/experiments/{P}/timed").json()["throughput"]
    assert [(b["completed_per_minute"], b["failures_per_minute"]) for b in api["buckets"]] == [
        (3.0, 2.0),
        (0.0, 0.0),
        (1.0, 1.0),
    ]


def test_next_run_counts_what_the_log_knows(client: TestClient, timed_log: CheckpointLog) -> None:
    page = client.get(f"/datagen/experiments/{P}/timed").text
    rows = dict(re.findall(r"<tr><td>(\w+): [^<]*</td><td class='num'>(\d+)</td></tr>", page))
    # k5 and k6 (created by the script, never finished) are replays: the fold counts a created item
    # as started; only the plan knows the source items the log has never seen (fresh)
    assert rows == {"replay": "2", "failed": "1", "fresh": "0", "skip": "4"}
    assert "Started items by processor version: <b>v0</b> 2 · <b>v1</b> 1." in page
    # plan_chunks alone (not the plan task) records no source: the panel says so
    assert "No plan recorded the source it read" in page
    nr = client.get(f"/datagen/api/experiments/{P}/timed").json()["next_run"]
    assert nr == {
        "replay": 2,
        "failed": 1,
        "never_started": 0,
        "done": 4,
        "running_by_version": {"v0": 2, "v1": 1},
        "source_known": False,
        "source": None,
        "classes": None,
        "unreachable": None,
        "not_classified": None,
    }


def test_spend_budget_and_estimate(client: TestClient, timed_log: CheckpointLog, monkeypatch) -> None:
    _stub_ledger(monkeypatch, USAGE, {"budget_usd": 5.0, "budget_tokens": None}, [])
    page = client.get(f"/datagen/experiments/{P}/timed").text
    cards = dict(re.findall(r"<div class='card'><span class='muted'>([^<]+)</span><b>([^<]+)</b></div>", page))
    assert cards["spent"] == "$1.50"
    assert cards["tokens"] == "10,000"
    assert cards["failed attempts"] == "$0.25"
    assert cards["budget"] == "$5.00"
    assert cards["left"] == "$3.50"
    # 4 completed source items for $1.50: $0.375 each; 3 pending (k4 failed, k5 never started, k6 running)
    assert cards["estimate for pending"] == "$1.125"
    assert "Mean $0.375 and 2500.0 tokens per completed source item (4 completed" in page
    assert "3 pending source items would cost about $1.125 and 7,500 tokens" in page
    assert "2 calls have no known price and are not in the dollar amounts" in page
    # the by-model table, model names escaped like any log value
    assert "<td class='mono'>openai:gpt-5-mini</td><td class='num'>7</td><td class='num'>7,000</td>" in page
    assert escaped("local:<b>llama</b>") in page and "<b>llama</b>" not in page
    spend = client.get(f"/datagen/api/experiments/{P}/timed").json()["spend"]
    assert spend["estimate_pending_usd"] == pytest.approx(1.125)
    assert spend["left_usd"] == pytest.approx(3.5)


def test_no_usage_recorded(client: TestClient, timed_log: CheckpointLog, monkeypatch) -> None:
    _stub_ledger(monkeypatch, ZERO_USAGE, {"budget_usd": None, "budget_tokens": 20_000}, [])
    page = client.get(f"/datagen/experiments/{P}/timed").text
    spend = page[page.index("<h2 id='spend'>") : page.index("<h2 id='throughput'>")]
    assert "No usage recorded. Budget: 20,000 tokens." in spend
    assert "<table>" not in spend
    item = client.get(f"/datagen/experiments/{P}/timed/item?id=k0").text
    assert "<h2 id='usage'>Usage</h2><p class='muted'>No usage recorded.</p>" in item


def test_item_page_input_beside_output_and_usage_per_attempt(
    client: TestClient, timed_log: CheckpointLog, monkeypatch
) -> None:
    _stub_ledger(monkeypatch, USAGE, {"budget_usd": None, "budget_tokens": None}, ATTEMPTS)
    page = client.get(f"/datagen/experiments/{P}/timed/item?id=k3").text
    cols = page[page.index("<div class='cols'>") : page.index("<h2 id='usage'>")]
    inp = cols[cols.index("<div id='input'>") : cols.index("<div id='output'>")]
    out = cols[cols.index("<div id='output'>") :]
    assert escaped('"text": "text 3"') in inp and "source snapshot" in inp
    assert escaped('"TEXT 3"') in out
    usage = page[page.index("<h2 id='usage'>") : page.index("<h2>Failures</h2>")]
    rows = re.findall(
        r"<tr><td class='num'>(\d)</td><td>process</td><td>.*?</td><td class='mono'>([^<]+)</td>"
        r"<td class='num'>(\d+)</td><td class='num'>([\d,]+)</td><td class='num'>([\d,]+)</td>"
        r"<td class='num'>([^<]+)</td>\s*<td class='mono batch-attempt'>([^<]*)</td></tr>",
        usage,
    )
    assert rows == [  # online attempts: no batch
        ("1", "openai:gpt-5-mini", "1", "800", "100", "$0.25", "—"),
        ("2", "openai:gpt-5-mini", "1", "812", "240", "$0.0123", "—"),
    ]
    assert "s-failed'>failed</span>" in usage and "s-completed'>completed</span>" in usage
    api = client.get(f"/datagen/api/experiments/{P}/timed/item?id=k3").json()
    assert api["input"] == {
        "found": True,
        "value": {"id": "k3", "text": "text 3"},
        "from": "source snapshot",
        "message": None,
    }
    assert api["usage"]["attempts"] == ATTEMPTS


def test_item_input_not_stored(client: TestClient, timed_log: CheckpointLog) -> None:
    # k6 was written by a script, not planned: no stored input carries its fingerprint
    page = client.get(f"/datagen/experiments/{P}/timed/item?id=k6").text
    assert "Not stored: the log keeps only the input's fingerprint <code>f6</code>" in page
    assert client.get(f"/datagen/api/experiments/{P}/timed/item?id=k6").json()["input"]["found"] is False


def test_an_edited_source_is_not_shown_as_the_input(client: TestClient, ui_log) -> None:
    lg = ui_log(P, "edited")
    plan_chunks(lg, [{"id": "k0", "text": "old"}], key_field="id")
    run_items(lg, [{"id": "k0", "text": "old"}], _flaky(set()))
    # the source is edited and planned again: a second snapshot holds the new text, not yet generated
    plan_chunks(lg, [{"id": "k0", "text": "new"}], key_field="id")
    item = client.get(f"/datagen/api/experiments/{P}/edited/item?id=k0").json()
    assert item["input"]["value"] == {"id": "k0", "text": "old"}
    assert item["fields"] == {"answer": "OLD"}


def test_spend_from_the_real_ledger(client: TestClient, ui_log) -> None:
    """The panels on usage recorded through ``ctx.record_usage`` and a budget set by ``run_items``."""
    lg = ui_log(P, "paid")
    items = _items(4)

    def paid(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        ctx.record_usage(model="m:<fake>", input_tokens=100, output_tokens=20, cost_usd=0.25 * ctx.attempt)
        if item["id"] == "k1":
            raise RuntimeError("the answer did not parse")
        return {"answer": item["text"].upper()}

    plan_chunks(lg, items, key_field="id")
    run_items(lg, items, paid, budget_usd=10.0)
    page = client.get(f"/datagen/experiments/{P}/paid").text
    cards = dict(re.findall(r"<div class='card'><span class='muted'>([^<]+)</span><b>([^<]+)</b></div>", page))
    assert cards["spent"] == "$1.00"
    assert cards["tokens"] == "480"
    assert cards["failed attempts"] == "$0.25"
    assert cards["budget"] == "$10.00"
    assert cards["left"] == "$9.00"
    assert escaped("m:<fake>") in page and "m:<fake>" not in page
    item = client.get(f"/datagen/api/experiments/{P}/paid/item?id=k1").json()
    assert [(a["attempt"], a["status"], a["model"], a["cost_usd"]) for a in item["usage"]["attempts"]] == [
        (1, "failed", "m:<fake>", 0.25)
    ]


def _svg_texts(page: str, cls: str) -> list[str]:
    svg = re.search(r"<svg class='chart'.*?</svg>", page)
    assert svg, "no inline chart"
    return re.findall(r"<text class='" + cls + r"'[^>]*>([^<]*)</text>", svg.group(0))


def test_throughput_chart_has_labelled_axes(client: TestClient, timed_log: CheckpointLog) -> None:
    page = client.get(f"/datagen/experiments/{P}/timed").text
    # y: rates per minute up to the peak (3), in whole steps; x: the edges of the run's three minutes, in UTC
    assert _svg_texts(page, "tick") == ["0", "1", "2", "3", "12:00", "12:01", "12:02", "12:03"]
    assert _svg_texts(page, "axis-title") == ["time (UTC)", "per minute"]
    chart = client.get(f"/datagen/api/experiments/{P}/timed").json()["throughput"]["chart"]
    assert chart["y_max"] == 3.0 and chart["plot"] == {"left": 52, "top": 10, "width": 720, "height": 140}
    # each tick sits where its value is: 0 at the bottom of the plot, the top value at its top
    assert [(t["label"], t["y"]) for t in chart["y_ticks"]] == [("0", 140.0), ("1", 93.33), ("2", 46.67), ("3", 0.0)]
    assert [(t["label"], t["x"]) for t in chart["x_ticks"]] == [
        ("12:00", 0.0),
        ("12:01", 240.0),
        ("12:02", 480.0),
        ("12:03", 720.0),
    ]
    # the tallest bar (3 completed at 12:00) reaches the top of the axis
    top_bar = max(chart["bars"], key=lambda b: b["h"])
    assert (top_bar["kind"], top_bar["y"], top_bar["h"]) == ("completed", 0.0, 140.0)


def test_costs_show_six_significant_digits(client: TestClient, timed_log: CheckpointLog, monkeypatch) -> None:
    # A call of a small model costs a fraction of a cent: $0.0001 (four decimals) misstates it by 19%.
    usage = {
        **USAGE,
        "cost_usd": 1.2345678,
        "failed_attempts_cost_usd": 0.000123,
        "by_model": {"m:small": {**USAGE["by_model"]["openai:gpt-5-mini"], "cost_usd": 0.00045678}},
    }
    attempts = [{**ATTEMPTS[1], "cost_usd": 0.000123}]
    _stub_ledger(monkeypatch, usage, {"budget_usd": 2.0, "budget_tokens": None}, attempts)
    page = client.get(f"/datagen/experiments/{P}/timed").text
    cards = dict(re.findall(r"<div class='card'><span class='muted'>([^<]+)</span><b>([^<]+)</b></div>", page))
    assert (cards["spent"], cards["failed attempts"], cards["left"]) == ("$1.23457", "$0.000123", "$0.765432")
    assert "<td class='num'>$0.00045678</td>" in page
    item = client.get(f"/datagen/experiments/{P}/timed/item?id=k3").text
    usage_html = item[item.index("<h2 id='usage'>") : item.index("<h2>Failures</h2>")]
    assert "<td class='num'>$0.000123</td><td class='mono batch-attempt'>" in usage_html
    assert "$0.0001<" not in usage_html


def test_requests_are_shown_when_the_ledger_counts_them(
    client: TestClient, timed_log: CheckpointLog, monkeypatch
) -> None:
    _stub_ledger(monkeypatch, {**USAGE, "requests": 12}, {"budget_usd": None, "budget_tokens": None}, ATTEMPTS)
    monkeypatch.setattr(
        CheckpointLog,
        "item_usage",
        lambda self, item_id: {**ZERO_USAGE, "calls": 2, "requests": 3, "attempts": ATTEMPTS},
        raising=False,
    )
    page = client.get(f"/datagen/experiments/{P}/timed").text
    cards = dict(re.findall(r"<div class='card'[^>]*><span class='muted'>([^<]+)</span><b>([^<]+)</b></div>", page))
    assert cards["requests"] == "12" and cards["calls"] == "9"
    assert client.get(f"/datagen/api/experiments/{P}/timed").json()["spend"]["requests"] == 12
    item = client.get(f"/datagen/experiments/{P}/timed/item?id=k3").text
    assert "2 calls · 3 model requests (failed ones included) · " in item


def test_a_ledger_without_requests_shows_no_requests_card(
    client: TestClient, timed_log: CheckpointLog, monkeypatch
) -> None:
    _stub_ledger(monkeypatch, USAGE, {"budget_usd": None, "budget_tokens": None}, [])
    page = client.get(f"/datagen/experiments/{P}/timed").text
    assert "<span class='muted'>requests</span>" not in page
    assert client.get(f"/datagen/api/experiments/{P}/timed").json()["spend"]["requests"] is None


def test_budget_stop_banner_and_removed_items(client: TestClient, timed_log: CheckpointLog, monkeypatch) -> None:
    page = client.get(f"/datagen/experiments/{P}/timed").text
    assert "stopped-by-budget" not in page and "<span class='muted'>removed</span>" not in page
    summary = CheckpointLog.summary

    def with_new_keys(self: CheckpointLog, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {**summary(self, *args, **kwargs), "stopped_by_budget": True, "removed": 2}

    monkeypatch.setattr(CheckpointLog, "summary", with_new_keys)
    from airflow_provider_datagen.plugins.data import reset_reader

    reset_reader()
    page = client.get(f"/datagen/experiments/{P}/timed").text
    banner = re.search(r"<p class='banner' id='stopped-by-budget'>(.*?)</p>", page)
    assert banner, "no budget banner"
    assert "Stopped by the budget: 3 source items are still pending." in banner.group(1)
    assert "Raise <code>budget_usd</code> (or <code>budget_tokens</code>) and trigger again." in banner.group(1)
    cards = dict(re.findall(r"<div class='card'[^>]*><span class='muted'>([^<]+)</span><b>([^<]+)</b></div>", page))
    assert cards["removed"] == "2"
    status = client.get(f"/datagen/api/experiments/{P}/timed").json()
    assert (status["stopped_by_budget"], status["removed"]) == (True, 2)
    index = client.get("/datagen/").text
    row = index.split(f"/datagen/experiments/{P}/timed'>timed</a>", 1)[1].split("</td>", 1)[0]
    assert row == " <span class='badge s-stopped_by_budget'>stopped by budget</span>"


def test_the_spend_panel_shows_reused_calls_and_the_money_they_saved(client: TestClient, ui_log) -> None:
    """Answers read from the response store (``ctx.record_reused``): their count and their stored cost."""
    lg = ui_log(P, "reused")
    items = _items(3)

    def reusing(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        ctx.record_reused("m:cached", input_tokens=100, output_tokens=20, saved_usd=0.5)
        return {"answer": item["text"].upper()}

    plan_chunks(lg, items, key_field="id")
    run_items(lg, items, reusing)
    page = client.get(f"/datagen/experiments/{P}/reused").text
    assert "<b id='reused-calls'>3</b>" in page
    assert "<b id='saved-usd'>$1.50</b>" in page
    cards = dict(re.findall(r"<div class='card'><span class='muted'>([^<]+)</span><b>([^<]+)</b></div>", page))
    assert cards["spent"] == "$0.00"
