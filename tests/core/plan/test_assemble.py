"""One assembler from a classification to a ResumePlan (core/plan/assemble.py), and the status counts."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest

from airflow_provider_datagen.core import partitioned_plan
from airflow_provider_datagen.core.fold import STATE_SCHEMA
from airflow_provider_datagen.core.plan.assemble import assemble, part_of, source_counts
from airflow_provider_datagen.core.plan.rules import (
    CLASS_FIELDS,
    CLS_REPLAY,
    CLS_SKIP,
    PENDING_ORDER,
    StateMatch,
    classes,
    match_states,
)
from airflow_provider_datagen.core.status import NO_VERSION

STATUSES = ["completed", "filtered", "running", "never_started"]


def _world(seed: int, n: int = 60) -> tuple[list[str], pa.Array, pa.Table, StateMatch]:
    """``n`` source items, about two thirds with a state of random status, fingerprint and version."""
    rnd = random.Random(seed)
    ids = [f"item-{i:03d}" for i in range(n)]
    fps = [rnd.choice("ab") for _ in ids]
    held = [i for i in range(n) if rnd.random() < 0.7]
    rnd.shuffle(held)
    rows = {
        "item_id": [ids[i] for i in held] + ["gone"],
        "status": [rnd.choice(STATUSES) for _ in held] + ["completed"],
        "input_fingerprint": [rnd.choice("ab") for _ in held] + ["a"],
        "processor_version": [rnd.choice(["v1", "v2", None]) for _ in held] + ["v1"],
        "created_seq": [0] * (len(held) + 1),
        "last_seq": [rnd.randrange(100) for _ in held] + [5],
        "max_epoch": [0] * (len(held) + 1),
        "failures": [rnd.choice([0, 0, 1, 2]) for _ in held] + [0],
        "violations": [0] * (len(held) + 1),
    }
    states = pa.table(rows, schema=STATE_SCHEMA)
    where = {ids[i]: r for r, i in enumerate(held)}
    index = np.array([where.get(i, -1) for i in ids], np.int64)
    fp_arr = pa.array(fps, pa.string())
    m = match_states(n, lambda r: fp_arr.take(pa.array(r)), states, index)
    return ids, pa.array(ids, pa.string()), states, m


def _reference(ids: list[str], cls: np.ndarray, states: pa.Table, m: StateMatch) -> dict[str, object]:
    """The plan's lists written out item by item, as the three paths each wrote them before."""
    seqs, fails = states["last_seq"].to_pylist(), states["failures"].to_pylist()
    out: dict[str, object] = {name: [i for i, c in zip(ids, cls) if c == k] for k, name in CLASS_FIELDS.items()}
    out["failed"] = [i for j, i in enumerate(ids) if cls[j] == CLS_REPLAY and fails[m.pick[j]] > 0]
    out["last_seq"] = {i: seqs[m.pick[j]] for j, i in enumerate(ids) if m.found[j] and cls[j] != CLS_SKIP}
    return out


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("version", ["v1", None])
def test_one_part_lists_what_the_item_by_item_plan_lists(seed: int, version: str | None) -> None:
    ids, id_arr, states, m = _world(seed)
    cls, kept = classes(m, states, version)
    want = _reference(ids, cls, states, m)
    for given in (id_arr, np.array(ids, dtype=object)):
        plan = assemble([part_of(cls, m, states, given, kept=kept, list_skip=True)], log_version=3, list_skip=True)
        got = plan.plan
        assert {name: getattr(got, name) for name in CLASS_FIELDS.values()} == {
            k: want[k] for k in CLASS_FIELDS.values()
        }
        assert got.failed == want["failed"] and got.last_seq == want["last_seq"]
        assert got.kept_other_version == kept and got.skip_count is None and got.log_version == 3
        assert [ids[p] for p in plan.pending_pos] == got.pending


@pytest.mark.parametrize("seed", range(8))
def test_buckets_assemble_to_the_plan_of_the_whole(seed: int) -> None:
    ids, id_arr, states, m = _world(seed)
    cls, kept = classes(m, states, "v1")
    offs = np.arange(len(ids), dtype=np.int64) * 7
    whole = assemble([part_of(cls, m, states, id_arr, kept=kept, offs=offs)], log_version=1)
    rnd = random.Random(seed)
    bucket = np.array([rnd.randrange(4) for _ in ids])
    parts = []
    for b in rnd.sample(range(4), 4):  # buckets in any order: the assembler sorts by source position
        rows = np.flatnonzero(bucket == b)
        sub = StateMatch(m.found[rows], m.pick[rows], m.started[rows], m.running[rows], m.same_fp[rows])
        sub_cls, sub_kept = classes(sub, states, "v1")
        parts.append(
            part_of(sub_cls, sub, states, id_arr.take(pa.array(rows)), kept=sub_kept, pos=rows, offs=offs[rows])
        )
    merged = assemble(parts, log_version=1)
    assert merged.plan == whole.plan
    assert merged.plan.skip_count == int(np.count_nonzero(cls == CLS_SKIP)) and merged.plan.skip == []
    assert merged.pending_pos.tolist() == whole.pending_pos.tolist()
    assert merged.pending_offsets is not None and whole.pending_offsets is not None
    assert merged.pending_offsets.tolist() == (whole.pending_pos * 7).tolist()
    assert merged.pending_offsets.tolist() == whole.pending_offsets.tolist()


def test_no_parts_is_an_empty_plan() -> None:
    got = assemble([], log_version=4)
    assert got.plan.pending == [] and got.plan.skipped == 0 and got.plan.log_version == 4
    assert got.pending_pos.tolist() == [] and got.pending_offsets is None


@pytest.mark.parametrize("seed", range(8))
def test_status_counts_are_the_item_by_item_counts(seed: int) -> None:
    ids, _, states, m = _world(seed)
    cls, _ = classes(m, states, None)
    statuses, versions = states["status"].to_pylist(), states["processor_version"].to_pylist()
    done = [j for j in range(len(ids)) if cls[j] == CLS_SKIP]
    completed = [j for j in done if statuses[m.pick[j]] == "completed"]
    by_version: dict[str, int] = {}
    for j in completed:
        v = versions[m.pick[j]] or NO_VERSION
        by_version[v] = by_version.get(v, 0) + 1
    counts = source_counts(states, m)
    running = sum(1 for c in cls if c == CLS_REPLAY)
    fresh, invalidated = (sum(1 for c in cls if c == k) for k in (PENDING_ORDER[3], PENDING_ORDER[2]))
    assert counts["total"] == len(ids)
    assert counts["completed"] == len(completed)
    assert counts["filtered"] == sum(1 for j in done if statuses[m.pick[j]] == "filtered")
    assert counts["running"] == running and counts["never_started"] == fresh
    assert counts["invalidated"] == invalidated
    assert counts["pending"] == running + fresh + invalidated
    assert counts["completed_by_version"] == dict(sorted(by_version.items()))
    assert partitioned_plan.source_counts is source_counts  # one home: the partitioned plan counts with it too


def test_no_version_key_is_named_as_the_status_names_it() -> None:
    _, _, states, m = _world(1)
    counts = source_counts(states, m)
    assert all(isinstance(k, str) for k in counts["completed_by_version"])
    assert set(counts["completed_by_version"]) <= {"v1", "v2", NO_VERSION}
