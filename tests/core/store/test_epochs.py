"""Epoch claims (issue 24 point 7): no two callers of ``next_epoch`` get the same epoch.

Two DAG runs over the same pending items used to read the same "highest epoch + 1" before either
wrote; fencing then kept events of both per sequence number and an item could end with fields of two
generations. The processes here are real (``spawn``) and start their claims behind a barrier.
"""

from __future__ import annotations

import multiprocessing as mp
import traceback
from typing import TYPE_CHECKING, Any

import pytest

from airflow_provider_datagen.core import CheckpointLog
from airflow_provider_datagen.core.store import epochs
from airflow_provider_datagen.exceptions import FencingError, LogCorruptedError, LogWriteError

if TYPE_CHECKING:
    from pathlib import Path

PROCESSES = 8
CLAIMS = 20
TIMEOUT = 120


def _open(root: str | Path) -> CheckpointLog:
    return CheckpointLog.open(root, pipeline="ep", experiment="e1")


def _claimer(root: str, barrier: Any, results: Any) -> None:
    try:
        lg = _open(root)
        barrier.wait(TIMEOUT)
        results.put(("ok", [lg.next_epoch() for _ in range(CLAIMS)]))
    except BaseException:
        results.put(("error", traceback.format_exc()))


def _seed(root: Path, epoch: int) -> CheckpointLog:
    lg = _open(root)
    with lg.writer("seed", epoch).batch() as b:
        b.item_created("seed", input_fingerprint="fp")
    return lg


@pytest.mark.slow  # `make test` runs it; `make unit`, the inner loop, leaves it out
def test_many_processes_claiming_at_once_get_distinct_epochs_above_the_log(tmp_path: Path) -> None:
    _seed(tmp_path, 7)  # a log written before claims existed: its epoch is the floor
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(PROCESSES), ctx.Queue()
    procs = [ctx.Process(target=_claimer, args=(str(tmp_path), barrier, results)) for _ in range(PROCESSES)]
    for p in procs:
        p.start()
    got = [results.get(timeout=TIMEOUT) for _ in procs]
    for p in procs:
        p.join(TIMEOUT)
    errors = [detail for kind, detail in got if kind != "ok"]
    assert not errors, errors[0]
    claimed = [e for _, batch in got for e in batch]
    assert len(claimed) == PROCESSES * CLAIMS
    assert sorted(claimed) == list(range(8, 8 + PROCESSES * CLAIMS))  # distinct, dense, above epoch 7
    for _, batch in got:
        assert batch == sorted(batch)  # one caller's claims only grow


def test_a_claim_is_above_an_epoch_written_after_the_counter(tmp_path: Path) -> None:
    lg = _seed(tmp_path, 1)
    assert lg.next_epoch() == 2
    with lg.writer("explicit", 40).batch() as b:  # a writer given an epoch by hand
        b.item_created("x", input_fingerprint="fp")
    assert lg.next_epoch() == 41
    assert lg.next_epoch() == 42


def test_two_writers_that_claim_before_either_writes_never_mix_generations(tmp_path: Path) -> None:
    items = [f"i{n}" for n in range(20)]
    _seed(tmp_path, 1)
    a_log, b_log = _open(tmp_path), _open(tmp_path)
    # two DAG runs over the same pending items: both claim before either has written anything
    writers = {"a": a_log.writer("run-a", a_log.next_epoch()), "b": b_log.writer("run-b", b_log.next_epoch())}
    assert writers["a"].epoch != writers["b"].epoch
    refused: list[str] = []

    def step(name: str, item: str, stage: int) -> None:
        # the output varies per writer, as an LLM's does at temperature > 0
        try:
            with writers[name].batch() as b:
                if stage == 0:
                    b.item_created(item, input_fingerprint=f"fp-{item}")
                    b.step_started(item, step="gen")
                    b.field_set(item, "answer", f"{name}-answer-{item}")
                else:
                    b.field_set(item, "score", f"{name}-score-{item}")
                    b.step_completed(item, step="gen")
                    b.terminal(item, status="completed")
        except FencingError:
            refused.append(name)  # the older epoch is fenced out: it must not write over the newer one

    for item in items:  # interleaved, batch by batch
        step("a", item, 0)
        step("b", item, 0)
        step("a", item, 1)
        step("b", item, 1)
    states = _open(tmp_path).item_states(items)
    for item in items:
        fields = states[item].fields
        owners = {str(fields.get(name, "missing-")).split("-")[0] for name in ("answer", "score")}
        assert owners in ({"a"}, {"b"}), (item, fields)  # both fields, of one generation
    assert set(refused) <= {"a"}  # only the older claim is ever refused


def test_a_damaged_counter_is_a_typed_error_naming_the_file_and_the_fix(tmp_path: Path) -> None:
    lg = _seed(tmp_path, 1)
    lg.next_epoch()
    path = tmp_path / "datagen_checkpoints" / "ep" / "e1" / ".epoch"
    path.write_text("not an epoch")
    with pytest.raises(LogCorruptedError, match=r"\.epoch holds 'not an epoch'.*Delete it"):
        lg.next_epoch()


def test_the_epoch_never_exceeds_int32(tmp_path: Path) -> None:
    lg = _seed(tmp_path, 1)
    lg.next_epoch()
    (tmp_path / "datagen_checkpoints" / "ep" / "e1" / ".epoch").write_text(str(epochs.MAX_EPOCH))
    with pytest.raises(LogWriteError, match=r"exceeds 2147483647.*Start a new experiment"):
        lg.next_epoch()
