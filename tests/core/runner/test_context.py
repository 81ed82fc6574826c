"""ItemContext.fields is a read-only view: fields change only through set/append (checkpointed)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_provider_datagen.core import CheckpointLog, Sequence, Step, run_items

if TYPE_CHECKING:
    from pathlib import Path


def test_assigning_into_ctx_fields_fails_the_item_not_the_resume_contract(tmp_path: Path) -> None:
    log = CheckpointLog.open(tmp_path, pipeline="ctx", experiment="e")

    def sneaky(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        ctx.fields["sneaky"] = 1
        return {"a": 1}

    def reader(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        return {"seen": sorted(ctx.fields)}

    report = run_items(log, [{"id": "1"}], Sequence("s", [Step("a", sneaky), Step("b", reader)]))
    assert report.failed == ["1"]
    assert "does not support item assignment" in report.errors["1"]
    ok = run_items(
        log, [{"id": "2"}], Sequence("t", [Step("a2", lambda it, ctx: {"a": 1}), Step("b2", reader)]), epoch=2
    )
    assert ok.processed == ["2"]
    assert log.item_state("2").fields == {"a": 1, "seen": ["a"]}
