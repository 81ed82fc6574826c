"""The index finds ``<root>/datagen_checkpoints/<pipeline>/<experiment>/log.lance`` locally and on S3."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from airflow_provider_datagen.core import CheckpointLog
from airflow_provider_datagen.core.store.paths import ExperimentRef, list_experiments
from airflow_provider_datagen.plugins.data import Reader

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path


def _write(root: str, pipeline: str, experiment: str, options: dict[str, str] | None = None) -> None:
    lg = CheckpointLog.open(root, pipeline=pipeline, experiment=experiment, storage_options=options)
    with lg.writer("w", 1).batch() as b:
        b.item_created("a", input_fingerprint="f")
        b.terminal("a")


def test_local_listing_skips_what_is_not_a_log(tmp_path: Path) -> None:
    _write(str(tmp_path), "p1", "e1")
    _write(str(tmp_path), "p1", "e2")
    _write(str(tmp_path), "p0", "x")
    base = tmp_path / "datagen_checkpoints"
    (base / "p1" / "empty").mkdir()  # an experiment directory without a log
    (base / "bad name").mkdir()  # not a valid pipeline name
    (base / "stray.txt").write_text("")
    assert list_experiments(str(tmp_path)) == [
        ExperimentRef("p0", "x"),
        ExperimentRef("p1", "e1"),
        ExperimentRef("p1", "e2"),
    ]
    assert list_experiments(str(tmp_path / "nothing-here")) == []


@pytest.fixture
def s3() -> Iterator[dict[str, str]]:
    boto3 = pytest.importorskip("boto3")
    moto_server = pytest.importorskip("moto.server")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        options = {
            "aws_access_key_id": "testing",
            "aws_secret_access_key": "testing",
            "aws_region": "us-east-1",
            "aws_endpoint": endpoint,
            "allow_http": "true",
        }
        boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        ).create_bucket(Bucket="datagen-ui")
        yield options
    finally:
        server.stop()


def test_object_store_listing_and_reads(s3: dict[str, Any]) -> None:
    root = "s3://datagen-ui/prefix"
    _write(root, "qa", "e1", s3)
    _write(root, "qa", "e2", s3)
    assert list_experiments(root, s3) == [ExperimentRef("qa", "e1"), ExperimentRef("qa", "e2")]
    reader = Reader(root, s3)
    assert reader.status("qa", "e2")["completed"] == 1
    assert reader.item("qa", "e1", "a")["state"]["status"] == "completed"
