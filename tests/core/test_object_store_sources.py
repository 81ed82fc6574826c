"""JSONL and Parquet sources on an S3-compatible store, read with the datagen connection's storage options.

A moto server on 127.0.0.1 (stopped by its PID) that checks credentials: once the sources are written,
moto's ``/moto-api/reset-auth`` makes it authenticate every request against its IAM users, so a wrong
secret is refused as a real store refuses it. Every read of a source (the streamed plan, in memory and
in buckets; a mapped chunk's rows; one item by its key; the whole source) must give what the same file
gives from a local copy, and a missing object or a refused one a typed error naming the URI and the fix.
"""

from __future__ import annotations

import json
import urllib.request
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_datagen.core import CheckpointLog, run_items
from airflow_provider_datagen.core import partitioned_plan as part_mod
from airflow_provider_datagen.core import source_scan as scan_mod
from airflow_provider_datagen.core.chunks import chunk_items, plan_chunks, record_plan_source
from airflow_provider_datagen.core.ids import root_item_id
from airflow_provider_datagen.core.next_run import source_input, source_item
from airflow_provider_datagen.core.source_scan import read_rows
from airflow_provider_datagen.core.sources import load_source, read_source, source_path
from airflow_provider_datagen.core.store import paths
from airflow_provider_datagen.core.store.paths import file_size, object_store_fs, open_input_file
from airflow_provider_datagen.exceptions import InvalidItemError
from dev.moto import MotoServer

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = pytest.mark.timeout(180)

BUCKET = "sources"
N = 300
FORMATS = ("jsonl", "parquet")
WRONG_SECRET = "wrong-secret-0bjsrc-Zq8wXv2y-not-the-key"


def source_rows() -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = [
        {"id": f"item-{i:04d}", "prompt": f'Write about topic {i}\n"quoted" é', "n": i} for i in range(N)
    ]
    rows[7]["id"] = "café/7"  # a key escaped in its item id
    return rows


def write_local(tmp: Path, rows: list[dict[str, Any]]) -> dict[str, str]:
    local = {fmt: str(tmp / f"src.{fmt}") for fmt in FORMATS}
    with open(local["jsonl"], "w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")
            if r["n"] % 50 == 0:
                fh.write("\n")  # blank lines are not rows: positions and byte offsets skip them
    pq.write_table(pa.Table.from_pylist(rows), local["parquet"], row_group_size=70)
    return local


def require_credentials(server: MotoServer) -> dict[str, str]:
    """An IAM user allowed everything, then moto authenticates every request; that user's storage options."""
    iam = server.client("iam")
    iam.create_user(UserName="datagen")
    policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
    iam.put_user_policy(UserName="datagen", PolicyName="all", PolicyDocument=json.dumps(policy))
    key = iam.create_access_key(UserName="datagen")["AccessKey"]
    request = urllib.request.Request(
        f"{server.endpoint}/moto-api/reset-auth", data=b"0", method="POST", headers={"Content-Type": "text/plain"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert json.loads(response.read())["status"] == "ok"
    return dict(
        server.storage_options(), aws_access_key_id=key["AccessKeyId"], aws_secret_access_key=key["SecretAccessKey"]
    )


class Store:
    """The moto server, the storage options of its one user, and each source locally and on it."""

    def __init__(self, server: MotoServer, options: dict[str, str], local: dict[str, str], rows: list[Any]) -> None:
        self.server, self.options, self.local, self.rows = server, options, local, rows
        self.remote = {fmt: f"s3://{BUCKET}/data/src.{fmt}" for fmt in FORMATS}

    def bad_options(self) -> dict[str, str]:
        return dict(self.options, aws_secret_access_key=WRONG_SECRET)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    tmp = tmp_path_factory.mktemp("objsrc")
    rows = source_rows()
    local = write_local(tmp, rows)
    with MotoServer(tmp / "moto.log", buckets=(BUCKET,)) as server:
        fs, _ = object_store_fs(f"s3://{BUCKET}", server.storage_options())
        for fmt, path in local.items():
            with open(path, "rb") as src, fs.open_output_stream(f"{BUCKET}/data/src.{fmt}") as dst:
                dst.write(src.read())
        yield Store(server, require_credentials(server), local, rows)


def test_a_source_object_opens_with_the_connections_options(store: Store) -> None:
    for fmt in FORMATS:
        with open(store.local[fmt], "rb") as fh:
            expected = fh.read()
        with open_input_file(store.remote[fmt], store.options) as fh:
            assert fh.read() == expected
        assert file_size(store.remote[fmt], store.options) == len(expected)


def _without_source(chunk: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in chunk.items() if k != "source"}


@pytest.mark.parametrize("partitioned", [False, True], ids=["in_memory", "buckets"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_plan_from_the_store_is_the_plan_from_a_local_copy(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str, partitioned: bool
) -> None:
    if partitioned:  # past PARTITION_ROWS the plan goes by buckets and estimates a JSONL's rows from its size
        monkeypatch.setattr(part_mod, "PARTITION_ROWS", 100)
        monkeypatch.setattr(part_mod, "ITEMS_PER_BUCKET", 64)
        monkeypatch.setattr(scan_mod, "SCAN_BATCH", 64)
    experiment = f"plan-{fmt}-{int(partitioned)}"
    logs = {
        "local": CheckpointLog.open(tmp_path / "root", pipeline="p", experiment=experiment),
        "s3": CheckpointLog.open(
            f"s3://{BUCKET}/root", pipeline="p", experiment=experiment, storage_options=store.options
        ),
    }
    # the same history in both logs: a third of the items done, some of them edited in the source since
    done = [dict(r, prompt=r["prompt"] + " (before)") if r["n"] % 9 == 0 else r for r in store.rows[:100]]
    for log in logs.values():
        run_items(log, done, lambda item, ctx: {"len": len(item["prompt"])})
    sources = {"local": store.local[fmt], "s3": store.remote[fmt]}
    planned = {
        where: plan_chunks(log, sources[where], chunk_size=40, processor_version="v1") for where, log in logs.items()
    }
    local, remote = planned["local"], planned["s3"]
    assert remote.plan.as_dict() == local.plan.as_dict()
    assert remote.plan.invalidated and remote.plan.fresh  # the edited items and the undone ones
    assert len(remote.chunks) == len(local.chunks) > 1
    for mine, theirs in zip(remote.chunks, local.chunks, strict=True):
        assert mine["source"] == store.remote[fmt]
        assert _without_source(mine) == _without_source(theirs)
        assert mine["rows"]  # the rows (and JSONL byte offsets) a mapped task reads
        # the mapped task's read: the chunk's rows from the store, as from the local copy
        got = chunk_items(
            mine, pipeline="p", experiment=experiment, processor_version="v1", storage_options=store.options
        )
        want = chunk_items(theirs, pipeline="p", experiment=experiment, processor_version="v1")
        assert [(s.item_id, s.fingerprint, s.data) for s in got] == [(s.item_id, s.fingerprint, s.data) for s in want]
        assert [s.item_id for s in got] == mine["item_ids"]
        assert read_rows(store.remote[fmt], mine["rows"], store.options) == read_rows(theirs["source"], theirs["rows"])
    # the record the UI's next-run panel and item view read from, and one item's input found by its key
    ref = record_plan_source(
        logs["s3"], store.remote[fmt], remote, key_field="id", processor_version="v1", redo_completed="never"
    )
    for row in (store.rows[0], store.rows[7], store.rows[-1]):
        assert source_item(ref, root_item_id(row["id"]), store.options) == row
    assert source_item(ref, "item-9999", store.options) is None
    first = logs["s3"].item_state("item-0001")
    assert source_input(ref, "item-0001", first.input_fingerprint, store.options)["found"] is True


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_whole_source_loads_from_the_store_as_from_a_local_copy(store: Store, fmt: str) -> None:
    remote = load_source(store.remote[fmt], "id", storage_options=store.options)
    assert remote == load_source(store.local[fmt], "id")
    assert [s.data for s in remote] == store.rows
    assert list(read_source(store.remote[fmt], storage_options=store.options)) == store.rows


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_missing_object_is_named_as_a_missing_local_file_is(store: Store, tmp_path: Path, fmt: str) -> None:
    uri = f"s3://{BUCKET}/data/gone.{fmt}"
    expected = f"source {uri!r} does not exist; check the path"
    # the wording of a missing local source, whatever the store
    gone = str(tmp_path / f"gone.{fmt}")
    with pytest.raises(InvalidItemError) as local:
        source_path(gone)
    assert str(local.value) == f"source {gone!r} does not exist; check the path"
    log = CheckpointLog.open(
        f"s3://{BUCKET}/root", pipeline="p", experiment=f"gone-{fmt}", storage_options=store.options
    )
    reads = {
        "plan": lambda: plan_chunks(log, uri),
        "load": lambda: load_source(uri, storage_options=store.options),
        "rows": lambda: read_rows(uri, [[0, 1, 0]] if fmt == "jsonl" else [[0, 1]], store.options),
        "size": lambda: file_size(uri, store.options),
    }
    for name, read in reads.items():
        with pytest.raises(InvalidItemError) as got:
            read()
        assert str(got.value) == expected, name


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_wrong_secret_is_a_typed_error_naming_the_uri_and_never_the_secret(store: Store, fmt: str) -> None:
    uri, bad = store.remote[fmt], store.bad_options()
    reads = {
        "load": lambda: load_source(uri, storage_options=bad),
        "rows": lambda: read_rows(uri, [[0, 1, 0]] if fmt == "jsonl" else [[0, 1]], bad),
        "size": lambda: file_size(uri, bad),
        "open": lambda: open_input_file(uri, bad),
    }
    for name, read in reads.items():
        with pytest.raises(InvalidItemError) as got:
            read()
        message = str(got.value)
        assert message.startswith(f"source {uri!r} cannot be read: "), name
        assert "ACCESS_DENIED" in message, name  # the store's own reason
        assert "check the connection's storage_options" in message, name
        assert WRONG_SECRET not in message and store.options["aws_secret_access_key"] not in message, name


def test_an_error_masks_every_option_but_the_endpoint_and_region() -> None:
    options = {
        "aws_endpoint": "http://127.0.0.1:9",
        "aws_region": "eu-west-3",
        "aws_access_key_id": "AKIAOBJSRCKEYID00001",
        "aws_secret_access_key": WRONG_SECRET,
        "aws_session_token": "token-objsrc-123456",
    }
    cause = OSError(" ".join(options.values()))
    message = str(paths._unreadable("s3://b/x.jsonl", cause, options))
    assert "http://127.0.0.1:9 eu-west-3 *** *** ***" in message
