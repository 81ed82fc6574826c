"""Reused answers in the usage lens: their own entries, summed as reused_calls and saved_usd only."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_provider_datagen.core import CheckpointLog, run_items
from airflow_provider_datagen.core.fold.usage import usage_of_events

if TYPE_CHECKING:
    from pathlib import Path


def _proc(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
    ctx.take_request_slot()
    ctx.record_usage("openai:gpt-4o-mini", 100, 10, cost_usd=0.01)
    ctx.record_reused("openai:gpt-4o-mini", 50, 5, saved_usd=0.02)
    ctx.record_reused("openai:gpt-4o-mini", 7, 1, saved_usd=None)  # an unpriced original saves nothing
    return {"x": 1}


def _strip(usage: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in usage.items() if k != "attempts"}


def test_reused_answers_count_as_reused_calls_and_savings_only(tmp_path: Path) -> None:
    log = CheckpointLog.open(tmp_path, pipeline="p", experiment="e")
    run_items(log, [{"id": str(i)} for i in range(3)], _proc)
    usage = log.usage()
    assert (usage["calls"], usage["input_tokens"], usage["output_tokens"], usage["requests"]) == (3, 300, 30, 3)
    assert usage["cost_usd"] == 0.03
    assert (usage["reused_calls"], usage["saved_usd"]) == (6, 0.06)
    assert usage["by_model"] == {
        "openai:gpt-4o-mini": {
            "calls": 3,
            "input_tokens": 300,
            "output_tokens": 30,
            "cost_usd": 0.03,
            "unpriced_calls": 0,
        }
    }
    assert log.usage_spend() == (30_000_000, 330)  # reused tokens and savings are no spend
    # the vectorized read and the reference fold agree
    events = [ev for i in range(3) for ev in log.events(str(i))]
    assert _strip(usage_of_events(events)) == _strip(usage)


def test_an_items_attempts_show_the_reused_entry(tmp_path: Path) -> None:
    log = CheckpointLog.open(tmp_path, pipeline="p", experiment="e")
    run_items(log, [{"id": "a"}], _proc)
    attempts = log.item_usage("a")["attempts"]
    sent = [a for a in attempts if not a.get("reused")]
    reused = [a for a in attempts if a.get("reused")]
    assert len(sent) == 1 and sent[0]["cost_usd"] == 0.01
    assert len(reused) == 1
    assert (reused[0]["calls"], reused[0]["input_tokens"], reused[0]["cost_usd"], reused[0]["saved_usd"]) == (
        2,
        57,
        0.0,
        0.02,
    )
