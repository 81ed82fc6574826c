"""Results follow the current source (issue 24, point 6): a deleted row leaves the export and the counts.

A finished 300-row source; edit 5 rows, add 2, delete 1; rerun: the export holds the 301 items of the
new source, equal to a fresh run's over it, with the deleted one counted in ``removed``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from airflow_provider_datagen.core import export_results, run_items
from airflow_provider_datagen.core.chunks import plan_chunks
from airflow_provider_datagen.exceptions import ConfigurationError
from tests._support.engine import fields_of_export, open_log

if TYPE_CHECKING:
    from airflow_provider_datagen.core import CheckpointLog


def _answer(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
    return {"answer": item["text"].upper()}


def _rows(n: int = 300) -> list[dict[str, Any]]:
    return [{"id": f"{i:03d}", "text": f"prompt {i}"} for i in range(n)]


def _edited(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """5 rows edited, 2 added, 1 deleted (row 007): 301 rows."""
    out = [dict(r) for r in rows if r["id"] != "007"]
    for r in out[:5]:
        r["text"] += " (edited)"
    return [*out, {"id": "300", "text": "prompt 300"}, {"id": "301", "text": "prompt 301"}]


def _run(log: CheckpointLog, source: Any, version: str = "v1", redo: str = "never") -> None:
    """What the plan and map tasks do: plan (plan_chunks records the source), then run the pending items."""
    planned = plan_chunks(log, source, chunk_size=1000, processor_version=version, redo_completed=redo)
    rows = source if isinstance(source, list) else [json.loads(line) for line in Path(source).read_text().splitlines()]
    pending = set(planned.plan.pending)
    todo = [r for r in rows if r["id"] in pending]
    if todo:
        run_items(log, todo, _answer, processor_version=version, epoch=log.next_epoch(), redo_completed=redo)


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.mark.parametrize("kind", ["inline", "path"])
def test_a_deleted_row_leaves_the_export_and_the_counts(tmp_path: Path, kind: str) -> None:
    def source(rows: list[dict[str, Any]], name: str) -> Any:
        return rows if kind == "inline" else _jsonl(tmp_path / f"{name}.jsonl", rows)

    log = open_log(tmp_path / "root", "e")
    _run(log, source(_rows(), "first"))
    new = source(_edited(_rows()), "second")
    _run(log, new)
    out = export_results(log, str(tmp_path / "out.lance"))
    assert (out["rows"], out["removed"]) == (301, 1)
    fresh_log = open_log(tmp_path / "root", "fresh")
    _run(fresh_log, new)
    fresh = export_results(fresh_log, str(tmp_path / "fresh.lance"))
    assert (fresh["rows"], fresh["removed"]) == (301, 0)
    assert out["fingerprint"] == fresh["fingerprint"]
    status = log.summary()
    assert (status["total"], status["completed"], status["pending"], status["removed"]) == (301, 301, 0, 1)
    # include_removed: every completed item, as before sources were recorded
    everything = export_results(log, str(tmp_path / "all.lance"), include_removed=True)
    assert (everything["rows"], everything["removed"]) == (302, 0)
    # a regeneration under v2 regenerates the source's items only; the deleted one stays out
    _run(log, new, version="v2", redo="other_version")
    again = export_results(log, str(tmp_path / "v2.lance"))
    assert (again["rows"], again["removed"]) == (301, 1)
    exported = fields_of_export(str(tmp_path / "v2.lance"))
    assert "007" not in {key for key in exported} and len(exported) == 301
    assert log.summary()["completed_by_version"] == {"v2": 301}


def test_source_given_overrides_the_recorded_one(tmp_path: Path) -> None:
    log = open_log(tmp_path / "root", "e")
    rows = _rows(10)
    _run(log, rows)
    out = export_results(log, str(tmp_path / "out.lance"), source=rows[:4])
    assert (out["rows"], out["removed"]) == (4, 6)
    # with its inputs: the items of that source, each with its own input
    with_input = export_results(log, str(tmp_path / "in.lance"), source=rows[:4], include_input=True)
    assert (with_input["rows"], with_input["removed"]) == (4, 6)


def test_no_recorded_source_exports_every_completed_item(tmp_path: Path) -> None:
    log = open_log(tmp_path / "root", "e")
    run_items(log, _rows(10), _answer)  # no plan: nothing recorded beside the log
    out = export_results(log, str(tmp_path / "out.lance"))
    assert (out["rows"], out["removed"]) == (10, 0)
    assert (log.summary()["total"], log.summary()["removed"]) == (10, 0)


def test_include_removed_must_be_a_bool(tmp_path: Path) -> None:
    log = open_log(tmp_path / "root", "e")
    run_items(log, _rows(2), _answer)
    with pytest.raises(ConfigurationError, match=r"include_removed.*is not a bool.*pass True to export"):
        export_results(log, str(tmp_path / "out.lance"), include_removed="yes")  # type: ignore[arg-type]


def test_status_after_a_budget_stop_counts_the_never_pulled_items(tmp_path: Path) -> None:
    """Point 10: a plan of 300 items, 200 of them started: total 300, the rest never_started."""
    log = open_log(tmp_path / "root", "e")
    rows = _rows()
    plan_chunks(log, rows, chunk_size=1000)  # records the source beside the log
    run_items(log, rows[:200], _answer)
    status = log.summary()
    assert (status["total"], status["completed"], status["running"], status["never_started"]) == (300, 200, 0, 100)
    assert status["pending"] == 100 and status["removed"] == 0
