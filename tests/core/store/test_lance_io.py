"""lance_io.overwrite_setting: the one-row settings beside the log (budget, source record) under write races."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest

from airflow_provider_datagen.core.store import lance_io
from airflow_provider_datagen.exceptions import DatagenError

if TYPE_CHECKING:
    from pathlib import Path


def _losing(monkeypatch: pytest.MonkeyPatch, losses: int) -> list[int]:
    """Make the first ``losses`` overwrites fail as a lost commit race does; returns the attempts seen."""
    real = lance_io.overwrite_dataset
    attempts: list[int] = []

    def overwrite(table: Any, uri: str, storage_options: Any) -> Any:
        attempts.append(1)
        if len(attempts) <= losses:
            raise OSError("Commit conflict for version 3: another writer committed first")
        return real(table, uri, storage_options)

    monkeypatch.setattr(lance_io, "overwrite_dataset", overwrite)
    return attempts


def test_a_lost_race_is_retried_and_the_later_write_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    uri = str(tmp_path / "setting.lance")
    attempts = _losing(monkeypatch, 2)
    assert lance_io.overwrite_setting(pa.table({"v": [7]}), uri, None, "recording v") is True
    assert len(attempts) == 3
    assert lance_io.open_dataset(uri, None).to_table().to_pylist() == [{"v": 7}]


def test_a_race_lost_to_the_same_value_stops_without_writing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    uri = str(tmp_path / "setting.lance")
    attempts = _losing(monkeypatch, 99)
    assert lance_io.overwrite_setting(pa.table({"v": [7]}), uri, None, "recording v", settled=lambda: True) is False
    assert len(attempts) == 1


def test_every_attempt_lost_raises_naming_the_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    uri = str(tmp_path / "setting.lance")
    attempts = _losing(monkeypatch, 99)
    with pytest.raises(DatagenError, match=r"recording v .*Commit conflict"):
        lance_io.overwrite_setting(pa.table({"v": [7]}), uri, None, "recording v", settled=lambda: False)
    assert len(attempts) == lance_io.SETTING_WRITE_ATTEMPTS
