"""A new reader refuses a log rolled back behind a finished run (issue 24, point 13).

Before, a log object remembered the versions it had read, and the state projection the one it folds,
but a new process reading a small log (no projection) after its newest manifest was deleted folded
the older version silently: acknowledged items were invoked again.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import TYPE_CHECKING, Any

import pytest

from airflow_provider_datagen.core import run_items
from airflow_provider_datagen.core.store import lance_io, version_mark
from airflow_provider_datagen.core.store.paths import local_path, projection_uri, version_mark_uri
from airflow_provider_datagen.exceptions import LogCorruptedError
from tests._support.engine import make_items, open_log

if TYPE_CHECKING:
    from pathlib import Path


def _calls() -> tuple[list[str], Any]:
    calls: list[str] = []

    def process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        calls.append(ctx.item_id)
        return {"ok": True}

    return calls, process


def test_a_new_reader_of_a_log_rolled_back_behind_a_run_is_refused_and_nothing_runs(tmp_path: Path) -> None:
    log = open_log(tmp_path, "back")
    run_items(log, make_items(10), _calls()[1])
    newest = log.version
    os.remove(lance_io.manifest_path(log.uri, newest))
    assert not os.path.exists(local_path(projection_uri(log.uri)))  # a small log: no projection to tell
    message = rf"is at version {newest - 1} but a run of this same log ended at version {newest}.*delete .*\.version"
    calls, process = _calls()
    with pytest.raises(LogCorruptedError, match=message):  # a new process opening it: before, it read version 1
        run_items(open_log(tmp_path, "back"), make_items(10), process, epoch=2)
    assert calls == []  # before: the items acknowledged in the lost version were invoked again
    with pytest.raises(LogCorruptedError, match=message):  # refused again, not forgotten
        open_log(tmp_path, "back").summary()
    # restored on purpose: deleting the mark, as the message says, lets it be read
    os.remove(local_path(version_mark_uri(log.uri)))
    assert open_log(tmp_path, "back").version == newest - 1


def test_the_mark_follows_the_runs_and_ignores_an_experiment_created_again(tmp_path: Path) -> None:
    log = open_log(tmp_path, "again")
    run_items(log, make_items(5), _calls()[1])
    first = version_mark.read_mark(log.uri, None)
    assert first == (log.log_id, log.version)
    run_items(log, make_items(8), _calls()[1], epoch=2)
    assert version_mark.read_mark(log.uri, None) == (log.log_id, log.version) and log.version > first[1]
    # deleted and created again, with the old mark put back: another log id, so never refused
    mark = local_path(version_mark_uri(log.uri))
    with open(mark, "rb") as fh:
        saved = fh.read()
    shutil.rmtree(os.path.dirname(log.uri))
    other = open_log(tmp_path, "again")
    run_items(other, make_items(1), _calls()[1])
    with open(mark, "wb") as fh:
        fh.write(saved)
    assert open_log(tmp_path, "again").summary()["completed"] == 1
    # a lower version never lowers the mark
    version_mark.raise_mark(other.uri, None, other.log_id, 1)
    version_mark.raise_mark(other.uri, None, json.loads(saved)["log_id"], 99)  # another dataset's: replaces it
    assert version_mark.read_mark(other.uri, None) == (json.loads(saved)["log_id"], 99)


@pytest.mark.parametrize("raw", [b"", b"not json", b'{"log_id": 3, "version": 1}', b'{"version": -1, "log_id": "x"}'])
def test_a_damaged_mark_is_ignored(tmp_path: Path, raw: bytes) -> None:
    log = open_log(tmp_path, "damaged")
    run_items(log, make_items(3), _calls()[1])
    with open(local_path(version_mark_uri(log.uri)), "wb") as fh:
        fh.write(raw)
    assert open_log(tmp_path, "damaged").summary()["completed"] == 3


def test_a_run_that_ends_between_opening_the_log_and_reading_the_mark_is_no_rollback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen in CI with eight writers: one opened the log at version 3, and before it read the mark
    another writer committed three times and ended its run at version 6; the first writer refused
    a log that had lost nothing. Only a version read after the mark counts."""
    log = open_log(tmp_path, "race")
    run_items(log, make_items(3), _calls()[1])
    real_read = version_mark.read_mark
    raced: list[int] = []

    def read_after_a_run_ends(uri: str, options: Any) -> Any:
        if not raced:  # the first read of the mark by the new reader: another run ends just before it
            run_items(log, make_items(6), _calls()[1], epoch=2)
            raced.append(log.version)
        return real_read(uri, options)

    monkeypatch.setattr(version_mark, "read_mark", read_after_a_run_ends)
    other = open_log(tmp_path, "race")
    opened_at = other.version  # opens the log, then reads the mark, which is now ahead of what it opened
    assert raced and opened_at == raced[0] == version_mark.read_mark(log.uri, None)[1]  # type: ignore[index]
    assert other.summary()["completed"] == 6
