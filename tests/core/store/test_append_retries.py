"""An append that Lance gave up on for commit conflicts ("Too many concurrent writers") is tried again."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_datagen.core.store import lance_io
from airflow_provider_datagen.exceptions import LogWriteError
from tests._support.engine import open_log


def _flaky(monkeypatch: pytest.MonkeyPatch, message: str, failures: int) -> list[int]:
    real = lance_io.append_table
    calls: list[int] = []

    def append(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) <= failures:
            raise OSError(message)
        return real(*args, **kwargs)

    monkeypatch.setattr(lance_io, "append_table", append)
    monkeypatch.setattr("tenacity.nap.time.sleep", lambda s: None)
    return calls


def test_an_append_lance_gave_up_on_for_conflicts_is_tried_again(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = open_log(tmp_path, "retries")
    with log.writer("w", 1).batch() as b:
        b.item_created("a", input_fingerprint="fp")
    calls = _flaky(monkeypatch, "Too many concurrent writers. Attempted 6 times", failures=2)
    with log.writer("w", 1).batch() as b:
        b.item_created("b", input_fingerprint="fp")
    assert len(calls) == 3
    assert sorted(log.states()["item_id"].to_pylist()) == ["a", "b"]


def test_other_append_errors_are_not_retried(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    log = open_log(tmp_path, "no-retries")
    with log.writer("w", 1).batch() as b:
        b.item_created("a", input_fingerprint="fp")
    calls = _flaky(monkeypatch, "No space left on device", failures=5)
    with pytest.raises(LogWriteError, match="no space left on device"), log.writer("w", 1).batch() as b:
        b.item_created("b", input_fingerprint="fp")
    assert len(calls) == 1
