"""Fixtures of the operator suites."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pathlib import Path


@pytest.fixture
def calls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "calls.tsv"
    monkeypatch.setenv("DATAGEN_TEST_CALLS", str(path))
    return path
