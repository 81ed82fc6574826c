"""The plan's rule (core/plan/rules.py): how an item matches the state table, and its class."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from airflow_provider_datagen.core import planner
from airflow_provider_datagen.core.fold import STATE_SCHEMA
from airflow_provider_datagen.core.plan import rules
from airflow_provider_datagen.core.plan.rules import (
    CLS_DEMOTED,
    CLS_FRESH,
    CLS_INVALIDATED,
    CLS_REPLAY,
    CLS_SKIP,
    ResumePlan,
    check_redo_completed,
    classes,
    match_states,
)
from airflow_provider_datagen.exceptions import ConfigurationError


def states_of(rows: list[tuple[str, str, str, str | None]]) -> pa.Table:
    """A state table of (item_id, status, fingerprint, processor_version) rows."""
    n = len(rows)
    cols = {
        "item_id": [r[0] for r in rows],
        "status": [r[1] for r in rows],
        "input_fingerprint": [r[2] for r in rows],
        "processor_version": [r[3] for r in rows],
        "created_seq": [0] * n,
        "last_seq": list(range(10, 10 + n)),
        "max_epoch": [0] * n,
        "failures": [0] * n,
        "violations": [0] * n,
    }
    return pa.table(cols, schema=STATE_SCHEMA)


def match(ids: list[str], fps: list[str], states: pa.Table) -> rules.StateMatch:
    held = states["item_id"].to_pylist()
    index = np.array([held.index(i) if i in held else -1 for i in ids], np.int64)
    arr = pa.array(fps, pa.string())
    return match_states(len(ids), lambda rows: arr.take(pa.array(rows)), states, index)


STATES = states_of(
    [
        ("done", "completed", "f", "v1"),
        ("filtered", "filtered", "f", "v1"),
        ("old", "completed", "f", "v0"),
        ("inbox", "running", "f", "v1"),
        ("cursor", "running", "f", "v0"),
        ("edited", "completed", "f", "v1"),
        ("never", "never_started", "f", "v1"),
    ]
)
IDS = ["done", "filtered", "old", "inbox", "cursor", "edited", "never", "new"]
FPS = ["f", "f", "f", "f", "f", "g", "f", "f"]


def test_classes_of_every_kind_of_item() -> None:
    m = match(IDS, FPS, STATES)
    cls, kept = classes(m, STATES, "v1")
    assert cls.tolist() == [
        CLS_SKIP,
        CLS_SKIP,
        CLS_SKIP,
        CLS_REPLAY,
        CLS_DEMOTED,
        CLS_INVALIDATED,
        CLS_FRESH,
        CLS_FRESH,
    ]
    assert kept == {"v0": 1}


def test_redo_other_version_demotes_done_items_of_another_version() -> None:
    m = match(IDS, FPS, STATES)
    cls, kept = classes(m, STATES, "v1", rules.REDO_OTHER_VERSION)
    assert cls[IDS.index("old")] == CLS_DEMOTED
    assert cls[IDS.index("done")] == CLS_SKIP
    assert kept == {}


def test_no_version_demotes_nothing() -> None:
    cls, kept = classes(match(IDS, FPS, STATES), STATES, None)
    assert cls[IDS.index("cursor")] == CLS_REPLAY
    assert cls[IDS.index("old")] == CLS_SKIP
    assert kept == {}


def test_an_empty_state_table_makes_everything_fresh() -> None:
    empty = STATE_SCHEMA.empty_table()
    m = match_states(3, lambda rows: pa.array(["x"] * len(rows)), empty, np.full(3, -1))
    assert not m.found.any()
    cls, _ = classes(m, empty, "v1")
    assert (cls == CLS_FRESH).all()


def test_fingerprints_are_compared_a_bounded_number_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rules, "FP_CHUNK", 2)
    asked: list[int] = []
    arr = pa.array(FPS, pa.string())

    def fps(rows: np.ndarray) -> pa.Array:
        asked.append(len(rows))
        return arr.take(pa.array(rows))

    held = STATES["item_id"].to_pylist()
    index = np.array([held.index(i) if i in held else -1 for i in IDS], np.int64)
    m = match_states(len(IDS), fps, STATES, index)
    assert max(asked) <= 2
    assert m.same_fp.tolist() == [True, True, True, True, True, False, False, False]


def test_redo_completed_is_checked() -> None:
    assert check_redo_completed("x", "never") == "never"
    with pytest.raises(ConfigurationError, match="redo_completed"):
        check_redo_completed("x", "always")


def test_resume_plan_counts_and_pending_order() -> None:
    plan = ResumePlan(skip=["a"], replay=["b"], demoted=["c"], invalidated=["d"], fresh=["e"], failed=["b"])
    assert plan.pending == ["b", "c", "d", "e"]
    assert plan.total == 5
    assert plan.as_dict()["failed"] == 1
    assert ResumePlan(skip_count=7).skipped == 7


def test_the_planner_keeps_the_rules_names() -> None:
    assert planner.ResumePlan is ResumePlan
    assert planner.classes is classes and planner.match_states is match_states
    assert (planner.CLS_SKIP, planner.PENDING_ORDER) == (CLS_SKIP, rules.PENDING_ORDER)
    assert planner.REDO_COMPLETED == rules.REDO_COMPLETED
