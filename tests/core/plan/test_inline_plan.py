"""An inline list's plan and status from one match of it to the log's states (issue 25.1)."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_datagen.core import planner, run_items, status_of
from airflow_provider_datagen.core.chunks import plan_chunks
from airflow_provider_datagen.core.planner import as_source, classify, classify_with_status
from tests._support.engine import flat_output, make_items, open_log


@pytest.fixture
def log(tmp_path: Any) -> Any:
    """Items 0-5 under v1: 0-3 completed, 4 filtered, 5 running (a v1 attempt that failed)."""
    lg = open_log(tmp_path, "main")

    def process(item: dict[str, Any], ctx: Any) -> dict[str, Any] | None:
        if item["id"] == 4:
            ctx.filter(reason="short")
            return None
        if item["id"] == 5:
            raise ValueError("flaky model")
        return flat_output(item)

    run_items(lg, make_items(6), process, processor_version="v1")
    return lg


def _edited() -> list[dict[str, Any]]:
    """Items 1-7 of the log's source, item 2 edited: one removed, one invalidated, two new."""
    items = make_items(8)[1:]
    items[1] = {**items[1], "text": "edited"}
    return items


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("redo", ["never", "other_version"])
def test_classify_with_status_is_classify_and_status_of(log: Any, version: str, redo: str) -> None:
    source = as_source(_edited(), "id")
    states = log.states()
    plan, status = classify_with_status(log, source, states, version, redo_completed=redo)
    assert plan == classify(source, states, version, log.version, redo_completed=redo)
    want = status_of(log, source, states=states)
    assert status == want and list(status) == list(want)
    assert (status["removed"], status["invalidated"], status["never_started"]) == (1, 1, 2)


def test_plan_chunks_matches_an_inline_list_to_the_states_once(log: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    match = planner.match_states

    def counted(n: int, *args: Any) -> Any:
        calls.append(n)
        return match(n, *args)

    monkeypatch.setattr(planner, "match_states", counted)
    planned = plan_chunks(log, _edited(), chunk_size=2, processor_version="v2", record=False)
    assert calls == [7]
    assert planned.plan.demoted == ["5"] and planned.plan.invalidated == ["2"]
    assert planned.status["pending"] == len(planned.plan.pending) == 4
