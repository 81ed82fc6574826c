"""The suite's own fixtures and helpers: ``checkpoint_log`` (tests/conftest.py) and the Hypothesis profiles."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests._support import profiles

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from airflow_provider_datagen.core import CheckpointLog


def test_checkpoint_log_opens_under_the_tests_own_directory(
    checkpoint_log: Callable[..., CheckpointLog], tmp_path: Path
) -> None:
    log = checkpoint_log()
    assert (log.root, log.pipeline, log.experiment) == (str(tmp_path), "p", "e")
    assert not log.exists()  # opening is lazy: nothing is written until a writer commits


def test_checkpoint_log_passes_its_root_and_options_on(
    checkpoint_log: Callable[..., CheckpointLog], tmp_path: Path
) -> None:
    log = checkpoint_log("x1", pipeline="q", root=tmp_path / "root", blob_threshold=16, remember_fold=False)
    assert (log.root, log.pipeline, log.experiment) == (str(tmp_path / "root"), "q", "x1")
    assert (log.blob_threshold, log.remember_fold) == (16, False)
    assert checkpoint_log("x1", pipeline="q", root=tmp_path / "root") is not log  # a fresh handle per call


@pytest.mark.parametrize(("profile", "asked", "given"), [("quick", 300, 20), ("quick", 8, 8), ("full", 300, 300)])
def test_examples_keeps_the_full_count_only_under_the_full_profile(
    monkeypatch: pytest.MonkeyPatch, profile: str, asked: int, given: int
) -> None:
    monkeypatch.setenv(profiles.PROFILE_ENV, profile)
    assert profiles.examples(asked) == given
