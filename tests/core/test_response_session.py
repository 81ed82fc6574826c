"""A run's response session: write-behind puts, flush, this run's puts answered without a read, errors."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

from airflow_provider_datagen.core import ResponseStore
from airflow_provider_datagen.core.response_session import (
    ResponseSession,
    activate,
    current_session,
    deactivate,
    uses_response_store,
)
from airflow_provider_datagen.core.steps import Sequence, Step
from airflow_provider_datagen.core.store.responses import ResponseEntry
from airflow_provider_datagen.exceptions import ResponseStoreError

if TYPE_CHECKING:
    from pathlib import Path


def _entry(k: str) -> ResponseEntry:
    return ResponseEntry(k * 64, "{}", "openai:gpt-4o-mini", 1, 1)


def test_puts_are_written_behind_and_flushed(tmp_path: Path) -> None:
    session = ResponseSession(ResponseStore.open(tmp_path), "p", "e")
    session.put(_entry("a"))
    session.put(_entry("a"))  # once per key
    assert session.lookup("a" * 64) is not None  # this run's put, before any write
    deadline = time.monotonic() + 10
    while ResponseStore.open(tmp_path).stats()["entries"] == 0 and time.monotonic() < deadline:
        time.sleep(0.02)  # the write-behind thread appends within FLUSH_SECONDS
    session.put(_entry("b"))
    session.flush()
    stored = ResponseStore.open(tmp_path).get_many(["a" * 64, "b" * 64])
    assert set(stored) == {"a" * 64, "b" * 64}
    session.close()
    assert session.puts == 2


def test_a_failed_append_raises_at_the_next_flush(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = ResponseStore.open(tmp_path)
    session = ResponseSession(store)

    def refuse(entries: object) -> int:
        raise ResponseStoreError("the store refused")

    monkeypatch.setattr(store, "put_many", refuse)
    session.put(_entry("c"))
    with pytest.raises(ResponseStoreError, match="refused"):
        session.flush()


def test_the_current_session_is_the_latest_activated() -> None:
    a, b = object.__new__(ResponseSession), object.__new__(ResponseSession)
    assert current_session() is None
    activate(a)
    activate(b)
    assert current_session() is b
    deactivate(b)
    assert current_session() is a
    deactivate(a)
    assert current_session() is None


def test_uses_response_store_looks_through_the_pipeline() -> None:
    def plain(item: dict[str, object], ctx: object) -> None:
        return None

    def model(item: dict[str, object], ctx: object) -> None:
        return None

    model.uses_response_store = True  # type: ignore[attr-defined]
    assert not uses_response_store(Step("a", plain))
    assert uses_response_store(Sequence("s", [Step("a", plain), Step("b", model)]))
