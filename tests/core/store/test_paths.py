"""The storage layout: one experiment's files beside its log, the log refused as an export, experiments listed."""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_provider_datagen.core.store.paths import (
    ExperimentRef,
    budget_uri,
    is_log_uri,
    list_experiments,
    log_uri,
    projection_uri,
    snapshot_uri,
)

if TYPE_CHECKING:
    from pathlib import Path


def test_an_experiments_files_sit_beside_its_log() -> None:
    log = log_uri("s3://bucket/root/", "p", "e")
    assert log == "s3://bucket/root/datagen_checkpoints/p/e/log.lance"
    assert projection_uri(log) == "s3://bucket/root/datagen_checkpoints/p/e/state.lance"
    assert budget_uri(log) == "s3://bucket/root/datagen_checkpoints/p/e/budget.lance"
    assert snapshot_uri(log, "ab12") == "s3://bucket/root/datagen_checkpoints/p/e/sources/ab12.lance"


def test_only_a_log_is_a_log() -> None:
    assert is_log_uri("/r/datagen_checkpoints/p/e/log.lance/")
    assert not is_log_uri("/r/exports/log.lance")  # a dataset named so outside the checkpoints tree
    assert not is_log_uri("/r/datagen_checkpoints/p/e/state.lance")


def test_listing_names_the_experiments_with_a_log_and_valid_names(tmp_path: Path) -> None:
    base = tmp_path / "datagen_checkpoints"
    for pipeline, experiment in [("p", "e1"), ("p", "e2"), ("q", "e")]:
        (base / pipeline / experiment / "log.lance").mkdir(parents=True)
    (base / "p" / "no-log").mkdir()  # an experiment directory without a log
    (base / "bad name" / "e" / "log.lance").mkdir(parents=True)  # not a valid pipeline name
    assert list_experiments(str(tmp_path)) == [
        ExperimentRef("p", "e1"),
        ExperimentRef("p", "e2"),
        ExperimentRef("q", "e"),
    ]
    assert list_experiments(str(tmp_path / "nothing-here")) == []
