"""A long-lived log follows its experiment (issue 24 points 12 and 13).

Deleted and created again, the experiment is another dataset at the same URI: an old log object
(the UI's reader keeps one per experiment) reads the new one. The same dataset at an older version
(its newest manifest deleted) is damage, never a silent rollback that would redo acknowledged work.
"""

from __future__ import annotations

import os
import shutil
from typing import TYPE_CHECKING

import pytest

from airflow_provider_datagen.core.store import lance_io
from airflow_provider_datagen.exceptions import LogCorruptedError
from tests._support.engine import open_log

if TYPE_CHECKING:
    from pathlib import Path

    from airflow_provider_datagen.core import CheckpointLog


def _write(log: CheckpointLog, prefix: str, n: int, *, done: bool = True) -> None:
    w = log.writer(f"w-{prefix}", log.next_epoch())
    with w.batch() as b:
        for k in range(n):
            b.item_created(f"{prefix}{k}", input_fingerprint=f"fp-{prefix}{k}")
    if done:
        with w.batch() as b:
            for k in range(n):
                b.terminal(f"{prefix}{k}")


def _ids(log: CheckpointLog) -> list[str]:
    return sorted(log.states()["item_id"].to_pylist())


@pytest.mark.parametrize("remember_fold", [True, False])
def test_a_kept_log_reads_its_experiment_deleted_and_created_again(tmp_path: Path, remember_fold: bool) -> None:
    kept = open_log(tmp_path, "again")
    kept.remember_fold = remember_fold
    _write(kept, "old", 3)
    assert _ids(kept) == ["old0", "old1", "old2"]
    assert kept.summary()["completed"] == 3
    shutil.rmtree(os.path.dirname(kept.uri))
    other = open_log(tmp_path, "again")
    _write(other, "new", 4)  # as many commits as before: the same version numbers, another dataset
    assert other.version == kept.version
    assert _ids(kept) == ["new0", "new1", "new2", "new3"]
    summary = kept.summary()
    assert summary["completed"] == 4 and summary["total"] == 4
    assert kept.log_id == other.log_id != None  # noqa: E711 - both read the dataset created last


def test_a_kept_log_of_a_deleted_experiment_reads_as_empty_then_follows_the_new_one(tmp_path: Path) -> None:
    kept = open_log(tmp_path, "gone")
    _write(kept, "old", 2)
    kept.states()
    shutil.rmtree(os.path.dirname(kept.uri))
    assert kept.states().num_rows == 0 and not kept.exists()
    _write(open_log(tmp_path, "gone"), "new", 1, done=False)
    assert _ids(kept) == ["new0"]


def _drop_newest_manifest(log: CheckpointLog) -> int:
    newest = log.version
    os.remove(lance_io.manifest_path(log.uri, newest))
    return newest


def test_a_log_that_went_back_is_an_error_naming_both_versions(tmp_path: Path) -> None:
    log = open_log(tmp_path, "back")
    _write(log, "a", 3)
    assert log.states().num_rows == 3
    newest = _drop_newest_manifest(log)
    message = rf"went back from version {newest} \(read before\) to version {newest - 1}.*Restore the missing"
    with pytest.raises(LogCorruptedError, match=message):
        log.states()
    with pytest.raises(LogCorruptedError, match=message):  # it stays refused, not forgotten
        log.summary()


def test_a_new_reader_of_a_log_behind_its_projection_is_refused(tmp_path: Path) -> None:
    log = open_log(tmp_path, "behind")
    _write(log, "a", 3)
    log.maintain()  # the state projection records the log's version
    folded = log.projection_version()
    assert folded == log.version
    # roll the log back behind the projection: every manifest from the one it folds on
    for version in range(folded, log.version + 1):
        os.remove(lance_io.manifest_path(log.uri, version))
    fresh = open_log(tmp_path, "behind")  # a new process: only the projection remembers
    with pytest.raises(LogCorruptedError, match=rf"records version {folded} of this same log.*delete .*state\.lance"):
        fresh.states()
