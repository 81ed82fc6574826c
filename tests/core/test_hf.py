"""Hugging Face datasets: a Parquet export loads with ``load_dataset("parquet")`` and ``Dataset.from_parquet``
with the export's features (strings, numbers, lists, structs, binary), and ``to_hf_dataset`` gives the
same rows and features in memory without writing a file. Offline: no hub is reached."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import pytest

from airflow_provider_datagen.core import export_results, run_items
from airflow_provider_datagen.core.export_files import part_uris
from airflow_provider_datagen.core.hf import to_hf_dataset
from airflow_provider_datagen.exceptions import ConfigurationError, ExperimentNotFoundError
from tests._support.engine import open_log

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from airflow_provider_datagen.core import CheckpointLog

ITEMS = [{"id": str(i), "text": f"prompt {i}", "n": i} for i in range(4)]


def _generate(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
    n = item["n"]
    return {
        "answer": item["text"].upper(),
        "tokens": n * 10,
        "score": n / 4,
        "ok": n % 2 == 0,
        "tags": [f"t{n}", "x"],
        "meta": {"len": len(item["text"]), "model": "fake"},
        "image": bytes([n]) * (n + 1),
    }


@pytest.fixture(autouse=True)
def _offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    yield


def _log(tmp_path: Path) -> CheckpointLog:
    log = open_log(tmp_path, "e")
    run_items(log, ITEMS, _generate)
    return log


def _expected_features() -> Any:
    import datasets

    return datasets.Features(
        {
            "item_id": datasets.Value("string"),
            "key": datasets.Value("string"),
            "answer": datasets.Value("string"),
            "image": datasets.Value("large_binary"),
            "meta": {"len": datasets.Value("int64"), "model": datasets.Value("string")},
            "ok": datasets.Value("bool"),
            "score": datasets.Value("float64"),
            "tags": datasets.List(datasets.Value("string")),
            "tokens": datasets.Value("int64"),
        }
    )


def test_load_dataset_reads_a_parquet_export_with_its_features(tmp_path: Path) -> None:
    import datasets

    dest = tmp_path / "out"
    export_results(_log(tmp_path), str(dest), format="parquet")
    loaded = datasets.load_dataset(
        "parquet", data_files=part_uris(str(dest)), split="train", cache_dir=str(tmp_path / "cache")
    )
    assert loaded.features == _expected_features()
    assert loaded.num_rows == 4
    row = loaded[2]
    assert row["image"] == b"\x02\x02\x02" and row["tags"] == ["t2", "x"] and row["meta"] == {"len": 8, "model": "fake"}
    assert row["ok"] is True and row["score"] == 0.5 and row["tokens"] == 20 and row["key"] == "2"

    # the folder glob a user would write picks the parts only (not the manifest)
    globbed = datasets.load_dataset(
        "parquet", data_files=str(dest / "*.parquet"), split="train", cache_dir=str(tmp_path / "cache")
    )
    assert globbed.to_list() == loaded.to_list()
    from_parquet = datasets.Dataset.from_parquet(part_uris(str(dest)), cache_dir=str(tmp_path / "cache2"))
    assert from_parquet.features == _expected_features()
    assert from_parquet.to_list() == loaded.to_list()


def test_to_hf_dataset_holds_the_exports_rows_without_writing(tmp_path: Path) -> None:
    import datasets

    log = _log(tmp_path)
    before = sorted(os.listdir(tmp_path))
    ds = to_hf_dataset(log)
    assert isinstance(ds, datasets.Dataset)
    assert sorted(os.listdir(tmp_path)) == before
    assert ds.features == _expected_features()
    export_results(log, str(tmp_path / "out"), format="parquet")
    from_export = datasets.Dataset.from_parquet(part_uris(str(tmp_path / "out")), cache_dir=str(tmp_path / "cache"))
    assert ds.to_list() == from_export.to_list()


def test_to_hf_dataset_with_inputs_and_digests(tmp_path: Path) -> None:
    ds = to_hf_dataset(_log(tmp_path), include_input=True, source=ITEMS, include_blobs=False)
    assert ds[1]["input"] == {"id": "1", "n": 1, "text": "prompt 1"}
    assert set(ds[1]["image"]) == {"$bytes_sha256", "size"}
    with pytest.raises(ConfigurationError, match="include_input=True needs the items' inputs"):
        to_hf_dataset(_log(tmp_path), include_input=True)


def test_to_hf_dataset_of_a_missing_experiment_names_it(tmp_path: Path) -> None:
    with pytest.raises(ExperimentNotFoundError, match=r"experiment .* does not exist"):
        to_hf_dataset(open_log(tmp_path, "nope"))
