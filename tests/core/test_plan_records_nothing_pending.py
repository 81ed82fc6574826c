"""Every plan records the source it read, also when nothing is pending (issue 24, point 6's contract).

A finished source loses one row and gains none: the plan finds nothing pending, yet it records the new
source, so the export and the counts follow it (before, only a plan with pending items had to record
it, and the deleted row would have stayed in the export).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from airflow_provider_datagen.core import export_results, run_items
from airflow_provider_datagen.core.chunks import plan_chunks
from tests._support.engine import open_log

if TYPE_CHECKING:
    from pathlib import Path


def _answer(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
    return {"answer": item["text"].upper()}


@pytest.mark.parametrize("kind", ["inline", "path"])
def test_a_plan_with_nothing_pending_records_the_source_it_read(tmp_path: Path, kind: str) -> None:
    rows = [{"id": f"{i:02d}", "text": f"prompt {i}"} for i in range(20)]

    def source(rows: list[dict[str, Any]], name: str) -> Any:
        if kind == "inline":
            return rows
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return str(path)

    log = open_log(tmp_path / "root", "e")
    plan_chunks(log, source(rows, "first"), chunk_size=100)
    run_items(log, rows, _answer, epoch=log.next_epoch())
    assert export_results(log, str(tmp_path / "a.lance"))["rows"] == 20

    fewer = source([r for r in rows if r["id"] != "07"], "second")
    planned = plan_chunks(log, fewer, chunk_size=100)
    assert planned.chunks == [] and not planned.plan.pending  # nothing to run, and still recorded
    out = export_results(log, str(tmp_path / "b.lance"))
    assert (out["rows"], out["removed"]) == (19, 1)
    status = log.summary()
    assert (status["total"], status["completed"], status["pending"], status["removed"]) == (19, 19, 0, 1)
