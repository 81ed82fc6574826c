"""The batch submissions record beside the log (core/store/batches.py): its fold, its round trip, racing writers."""

from __future__ import annotations

import datetime as dt
import multiprocessing as mp
import traceback
from typing import TYPE_CHECKING, Any

from airflow_provider_datagen.core import CheckpointLog
from airflow_provider_datagen.core.store import batches

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

WORKERS = 4
ROUNDS = 3
TIMEOUT = 120
T0 = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)


def _row(key: str, kind: str, second: int, **extra: Any) -> dict[str, Any]:
    return {"submission_key": key, "kind": kind, "at": T0 + dt.timedelta(seconds=second), **extra}


def test_fold_follows_a_submission_through_its_life() -> None:
    rows = [
        _row("k", batches.INTENT, 0, provider="openai", custom_ids=["a-1", "b-1"], item_ids=["a", "b"]),
        _row("k", batches.SUBMITTED, 1, batch_id="batch_1", writer_id="w", writer_epoch=3),
        _row("k", batches.ENDED, 2, status="completed", counts_json='{"succeeded": 2}'),
    ]
    (sub,) = batches.fold(rows).values()
    assert (sub.submission_key, sub.provider, sub.batch_id, sub.kind) == ("k", "openai", "batch_1", batches.ENDED)
    assert (sub.custom_ids, sub.item_ids) == (["a-1", "b-1"], ["a", "b"])
    assert (sub.status, sub.counts, sub.writer_id, sub.writer_epoch) == ("completed", {"succeeded": 2}, "w", 3)
    assert sub.intent_at == T0.timestamp() and sub.updated_at == T0.timestamp() + 2
    assert sub.is_open
    shown = sub.describe()
    assert shown["state"] == "ended" and shown["requests"] == 2 and shown["submitted_at"] == T0.isoformat()


def test_a_closed_submission_stays_closed_whatever_a_late_row_says() -> None:
    for closing in sorted(batches.CLOSED):
        rows = [
            _row("k", batches.INTENT, 0, custom_ids=["a-1"], item_ids=["a"]),
            _row("k", batches.SUBMITTED, 1, batch_id="batch_1"),
            _row("k", closing, 2),
            _row("k", batches.ENDED, 3, status="completed"),  # a zombie writer's late poll
            _row("k", batches.SUBMITTED, 4),
        ]
        (sub,) = batches.fold(rows).values()
        assert sub.kind == closing and not sub.is_open, closing


def test_rows_fold_in_the_order_they_were_written_not_as_listed() -> None:
    rows = [
        _row("k", batches.RECORDED, 3),
        _row("k", batches.SUBMITTED, 1, batch_id="batch_1"),
        _row("k", batches.INTENT, 0, custom_ids=["a-1"], item_ids=["a"]),
        _row("k", batches.ENDED, 2, status="completed"),
    ]
    (sub,) = batches.fold(rows).values()
    assert (sub.kind, sub.batch_id, sub.status, sub.custom_ids) == (batches.RECORDED, "batch_1", "completed", ["a-1"])
    # a row written later overwrites what it says; an empty value keeps the earlier one
    rows = [
        _row("k", batches.INTENT, 0, custom_ids=["a-1"], item_ids=["a"]),
        _row("k", batches.SUBMITTED, 1, batch_id="batch_1", status="validating"),
        _row("k", batches.SUBMITTED, 2, batch_id=None, status="in_progress"),
    ]
    (sub,) = batches.fold(rows).values()
    assert (sub.batch_id, sub.status) == ("batch_1", "in_progress")


def test_fold_keeps_submissions_apart() -> None:
    rows = [
        _row("a", batches.INTENT, 0, custom_ids=["x-1"], item_ids=["x"]),
        _row("b", batches.INTENT, 1, custom_ids=["y-1"], item_ids=["y"]),
        _row("a", batches.SUBMITTED, 2, batch_id="batch_a"),
    ]
    subs = batches.fold(rows)
    assert {k: (s.kind, s.batch_id, s.item_ids) for k, s in subs.items()} == {
        "a": (batches.SUBMITTED, "batch_a", ["x"]),
        "b": (batches.INTENT, None, ["y"]),
    }


def test_append_and_read_round_trip_and_open_submissions_oldest_first(
    checkpoint_log: Callable[..., CheckpointLog],
) -> None:
    log = checkpoint_log()
    assert batches.read(log) == {} and batches.open_submissions(log) == []
    batches.append(log, [])  # nothing to write: no dataset either
    assert batches.read(log) == {}
    batches.append(log, [{"submission_key": "old", "kind": batches.INTENT, "custom_ids": ["a-1"], "item_ids": ["a"]}])
    batches.append(
        log,
        [
            {"submission_key": "new", "kind": batches.INTENT, "custom_ids": ["b-1"], "item_ids": ["b"]},
            {"submission_key": "new", "kind": batches.SUBMITTED, "batch_id": "batch_b", "provider": "openai"},
        ],
    )
    batches.append(log, [{"submission_key": "done", "kind": batches.INTENT, "custom_ids": ["c-1"], "item_ids": ["c"]}])
    batches.append(log, [{"submission_key": "done", "kind": batches.RECORDED}])
    assert batches.batches_uri(log.uri).endswith("/" + batches.BATCHES_DIR)
    subs = batches.read(log)
    assert {k: s.kind for k, s in subs.items()} == {
        "old": batches.INTENT,
        "new": batches.SUBMITTED,
        "done": batches.RECORDED,
    }
    assert subs["new"].batch_id == "batch_b" and subs["new"].provider == "openai" and subs["new"].custom_ids == ["b-1"]
    assert [s.submission_key for s in batches.open_submissions(log)] == ["old", "new"]
    # another handle (another task) reads the same
    assert set(batches.read(checkpoint_log())) == {"old", "new", "done"}


def _append_intents(root: str, worker: int, barrier: Any, results: Any) -> None:
    try:
        for r in range(ROUNDS):
            log = CheckpointLog.open(root, pipeline="race", experiment=f"e{r}")
            barrier.wait(TIMEOUT)  # every worker finds no dataset, then all create it at once
            key = f"w{worker}"
            batches.append(log, [{"submission_key": key, "kind": batches.INTENT, "item_ids": [key]}])
        results.put((worker, "ok", ""))
    except BaseException:
        results.put((worker, "error", traceback.format_exc()))


def test_four_processes_appending_intents_to_a_fresh_experiment_lose_none(tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(WORKERS)
    results = ctx.Queue()
    procs = [ctx.Process(target=_append_intents, args=(str(tmp_path), i, barrier, results)) for i in range(WORKERS)]
    for p in procs:
        p.start()
    try:
        out = [results.get(timeout=TIMEOUT) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=TIMEOUT)
            if p.is_alive():
                p.kill()  # by its own handle (its PID)
    errors = [text for _, status, text in out if status != "ok"]
    assert not errors, "\n".join(errors)
    for r in range(ROUNDS):
        log = CheckpointLog.open(tmp_path, pipeline="race", experiment=f"e{r}")
        subs = batches.read(log)
        assert sorted(subs) == [f"w{i}" for i in range(WORKERS)], f"round {r}"
        assert all(s.kind == batches.INTENT and s.item_ids == [k] for k, s in subs.items())
