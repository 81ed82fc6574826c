"""Exports to an S3-compatible store (moto's server on 127.0.0.1, stopped by its PID), in every format.

Each format written to the store reads back as the same rows as its local export and with the same
fingerprint; a second identical export writes no object; a destination on the store holding another
format is refused before any write.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from typing import TYPE_CHECKING, Any

import lance
import pyarrow as pa
import pytest

from airflow_provider_datagen.core import export_results, run_items
from airflow_provider_datagen.core.export_files import MANIFEST_NAME, read_files_export
from airflow_provider_datagen.core.store.paths import object_store_fs
from airflow_provider_datagen.exceptions import ConfigurationError
from dev.moto import MotoServer
from tests._support.engine import open_log

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from airflow_provider_datagen.core import CheckpointLog

pytestmark = pytest.mark.timeout(180)

BUCKET = "exports"
FORMATS = ("lance", "parquet", "jsonl")
WHEN = dt.datetime(2026, 1, 2, 3, 4, 5)
ITEMS = [{"id": f"item-{i:02d}", "text": f"prompt {i}", "n": i, "at": WHEN + dt.timedelta(days=i)} for i in range(7)]


def _generate(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
    n = item["n"]
    return {
        "answer": item["text"].upper(),
        "tokens": n * 10,
        "score": n / 4,
        "tags": [f"t{n}"],
        "meta": {"len": len(item["text"])},
        "image": bytes([n]) * (n + 1),
        "mixed": n if n % 2 else f"n{n}",
    }


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    with MotoServer(tmp_path_factory.mktemp("moto") / "moto.log", buckets=(BUCKET,)) as s:
        yield s


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> CheckpointLog:
    log = open_log(tmp_path_factory.mktemp("logs"), "e")
    run_items(log, ITEMS, _generate)
    return log


def _objects(server: MotoServer, prefix: str) -> dict[str, tuple[str, Any]]:
    """Every object under ``prefix``: key -> (ETag, LastModified); a rewrite changes one or both."""
    s3 = server.client("s3")
    out: dict[str, tuple[str, Any]] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        for obj in page.get("Contents", []):
            out[obj["Key"]] = (obj["ETag"], obj["LastModified"])
    return out


def _rows(uri: str, fmt: str, options: dict[str, str] | None) -> list[dict[str, Any]]:
    """The export at ``uri`` read back: Lance and Parquet as Arrow rows, JSONL lines with bytes decoded."""
    if fmt == "lance":
        return list(lance.dataset(uri, storage_options=options).to_table(blob_handling="all_binary").to_pylist())
    if fmt == "parquet":
        return list(read_files_export(uri, options).to_pylist())
    fs, path = object_store_fs(uri, options) if options else (None, uri)
    if fs is None:
        with open(f"{path}/{MANIFEST_NAME}", encoding="utf-8") as fh:
            manifest = json.load(fh)
        texts = [open(f"{path}/{e['name']}", encoding="utf-8").read() for e in manifest["files"]]  # noqa: SIM115
    else:
        with fs.open_input_stream(f"{path}/{MANIFEST_NAME}") as fh:
            manifest = json.loads(fh.read())
        texts = []
        for entry in manifest["files"]:
            with fs.open_input_stream(f"{path}/{entry['name']}") as fh:
                texts.append(fh.read().decode("utf-8"))
    rows = [json.loads(line) for text in texts for line in text.splitlines()]
    for row in rows:
        row["image"] = base64.b64decode(row["image"])
    return rows


def _export(log: CheckpointLog, uri: str, fmt: str, options: dict[str, str] | None) -> dict[str, Any]:
    return export_results(log, uri, storage_options=options, format=fmt, include_input=True, source=ITEMS)


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_export_on_the_store_reads_back_as_the_local_one(
    server: MotoServer, log: CheckpointLog, tmp_path: Path, fmt: str
) -> None:
    options = server.storage_options()
    local = _export(log, str(tmp_path / "local"), fmt, None)
    uri = f"s3://{BUCKET}/roundtrip/{fmt}"
    remote = _export(log, uri, fmt, options)
    assert remote["changed"] and remote["rows"] == len(ITEMS)
    assert remote["fingerprint"] == local["fingerprint"]
    assert {k: v for k, v in remote.items()} == local
    rows = _rows(uri, fmt, options)
    assert rows == _rows(str(tmp_path / "local"), fmt, None)
    assert [r["item_id"] for r in rows] == sorted(i["id"] for i in ITEMS)
    assert rows[3]["image"] == b"\x03" * 4 and rows[3]["answer"] == "PROMPT 3" and rows[3]["mixed"] == "3"

    # the same export again writes no object (and, for Lance, no version)
    before = _objects(server, f"roundtrip/{fmt}/")
    assert before
    again = _export(log, uri, fmt, options)
    assert again == {**remote, "changed": False}
    assert _objects(server, f"roundtrip/{fmt}/") == before
    if fmt == "lance":
        assert lance.dataset(uri, storage_options=options).version == 1


@pytest.mark.parametrize(("first", "then"), [("lance", "parquet"), ("parquet", "lance"), ("jsonl", "parquet")])
def test_a_destination_on_the_store_holding_another_format_is_refused(
    server: MotoServer, log: CheckpointLog, first: str, then: str
) -> None:
    options = server.storage_options()
    uri = f"s3://{BUCKET}/other/{first}-{then}"
    export_results(log, uri, storage_options=options, format=first)
    before = _objects(server, f"other/{first}-{then}/")
    with pytest.raises(ConfigurationError, match=rf"holds a {first} export, not a {then} one; pass format='{first}'"):
        export_results(log, uri, storage_options=options, format=then)
    assert _objects(server, f"other/{first}-{then}/") == before


def test_a_changed_export_on_the_store_replaces_its_parts(
    server: MotoServer, log: CheckpointLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    options = server.storage_options()
    uri = f"s3://{BUCKET}/changed/parquet"
    monkeypatch.setattr("airflow_provider_datagen.core.export_files.FILE_BYTES", 1)  # one row per part
    export_results(log, uri, storage_options=options, format="parquet")
    parts = sorted(k for k in _objects(server, "changed/parquet/") if k.endswith(".parquet"))
    assert len(parts) == len(ITEMS)
    monkeypatch.setattr("airflow_provider_datagen.core.export_files.FILE_BYTES", 2**30)
    assert export_results(log, uri, storage_options=options, format="parquet", include_blobs=False)["changed"]
    # pyarrow keeps an empty "changed/parquet/" object (its folder marker on S3) once a file is moved or deleted
    keys = sorted(k.rsplit("/", 1)[1] for k in _objects(server, "changed/parquet/") if k != "changed/parquet/")
    assert keys == [MANIFEST_NAME, "part-00000.parquet"]  # no stale part, no temporary object
    table = read_files_export(uri, options)
    assert table.num_rows == len(ITEMS) and pa.types.is_struct(table.schema.field("image").type)
