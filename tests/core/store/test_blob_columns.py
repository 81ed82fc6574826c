"""The response store's replies and requests sliced from its data files equal what Lance reads, in every layout.

A reply or request is read where Lance wrote it (the blob column's position and size, the fragment's
data file mapped in memory); these tests hold that equal to Lance's own blob reader across appends, a
compaction, deletions, null requests, a store made before the blob columns, an object store (moto on
127.0.0.1, stopped by its PID) and a damaged or missing data file.
"""

from __future__ import annotations

import hashlib
import os
from typing import TYPE_CHECKING

import lance
import numpy as np
import pyarrow as pa
import pytest

from airflow_provider_datagen.core import ResponseStore
from airflow_provider_datagen.core.store import lance_io
from airflow_provider_datagen.core.store.blob_columns import BlobLocations, read_by_lance, read_located
from airflow_provider_datagen.core.store.responses import (
    RESPONSES_DIR,
    SCHEMA,
    STRING_SCHEMA,
    ResponseEntry,
    key_hash,
)
from airflow_provider_datagen.exceptions import ResponseStoreError
from dev.moto import MotoServer

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

BUCKET = "responses"
#: replies of every shape a provider sends: empty, multi-byte UTF-8, escapes, large
REPLIES = ["", '{"content": "héllo wörld ✓ 日本"}', '{"a": "\\n\\t\\"q\\""}', "x" * 300_000, '{"n": 1}']


def _key(i: int) -> str:
    return hashlib.sha256(f"b{i}".encode()).hexdigest()


def _entries(start: int, n: int) -> list[ResponseEntry]:
    """Entries with replies of every shape, and requests (every third one None: a batch row's may be)."""
    return [
        ResponseEntry(
            _key(i),
            REPLIES[i % len(REPLIES)] + str(i),
            "m",
            i,
            i + 1,
            request_json=None if i % 3 == 0 else f'{{"messages": ["ask ✓ {i}"]}}',
        )
        for i in range(start, start + n)
    ]


def _lance_read(store: ResponseStore, keys: list[str], column: str) -> dict[str, str | None]:
    """Lance's own reading of the keys' ``column`` (its planned blob reader), by key."""
    ds = lance.dataset(store.uri)
    table = ds.to_table(columns=["key"])
    where = {k: i for i, k in reversed(list(enumerate(table["key"].to_pylist())))}  # the earliest row
    rows = np.array([where[k] for k in keys], np.int64)
    return dict(zip(keys, read_by_lance(ds, rows, column)))


def _assert_equal_to_lance(store: ResponseStore, keys: list[str]) -> None:
    got = store.get_many(keys)
    table = store.find(keys, columns=["reply_json", "request_json"])
    for column in ("reply_json", "request_json"):
        lances = _lance_read(store, keys, column)
        assert {k: getattr(e, column) for k, e in got.items()} == lances
        assert dict(zip(table["key"].to_pylist(), table[column].to_pylist())) == lances
        assert table.schema.field(column).type == pa.string()


def test_a_new_store_keeps_replies_and_requests_as_blob_columns(tmp_path: Path) -> None:
    store = ResponseStore.open(tmp_path)
    store.put_many(_entries(0, 3))
    for column in ("reply_json", "request_json"):
        field = lance.dataset(store.uri).schema.field(column)
        assert field.type == pa.large_binary() and field.metadata == {b"lance-encoding:blob": b"true"}
    assert set(store._located) == {"reply_json", "request_json"}  # a local store: sliced from the files
    assert store.get(_key(0)).request_json is None  # type: ignore[union-attr]
    assert store.get(_key(1)).request_json == '{"messages": ["ask ✓ 1"]}'  # type: ignore[union-attr]


def test_replies_across_appends_compaction_and_deletion_equal_lances(tmp_path: Path) -> None:
    store = ResponseStore.open(tmp_path)
    for at in range(0, 60, 12):  # five appends: five fragments, five data files
        store.put_many(_entries(at, 12))
    keys = [_key(i) for i in range(60)]
    _assert_equal_to_lance(store, keys)
    assert store.get(_key(3)).reply_json == "x" * 300_000 + "3"  # type: ignore[union-attr]
    assert store.get(_key(1)).reply_json == '{"content": "héllo wörld ✓ 日本"}1'  # type: ignore[union-attr]
    reader = ResponseStore.open(tmp_path)  # another process's index, built from the files
    _assert_equal_to_lance(reader, keys)
    store.compact()
    assert store.stats()["fragments"] == 1
    _assert_equal_to_lance(store, keys)
    _assert_equal_to_lance(reader, keys)  # the other reader follows the compaction (new files, new positions)
    lance.dataset(store.uri).delete(f"key = '{_key(0)}' OR key = '{_key(30)}'")  # rows shift, no compaction
    rest = [k for k in keys if k not in (_key(0), _key(30))]
    assert set(reader.get_many(keys)) == set(rest)
    _assert_equal_to_lance(reader, rest)


def test_a_fragment_the_index_cannot_slice_is_read_by_lance(tmp_path: Path) -> None:
    # a fragment of more than one data file (never written by the store, but Lance allows it) is read
    # through Lance's blob reader, row for row with the sliced ones
    store = ResponseStore.open(tmp_path)
    store.put_many(_entries(0, 5))
    store.put_many(_entries(5, 5))
    ds = lance.dataset(store.uri)
    frags = ds.get_fragments()
    locations = BlobLocations("reply_json", os.path.join(store.uri, "data"))
    locations.extend(
        [
            (frags[0].metadata.files[0].path, frags[0].to_table(columns=["reply_json"])["reply_json"]),
            (None, frags[1].to_table(columns=["reply_json"])["reply_json"]),
        ]
    )
    rows = np.array([9, 0, 7, 2, 5], np.int64)
    got = read_located(locations.view(), rows, ds)
    assert got == read_by_lance(ds, rows, "reply_json") == [_entries(0, 10)[i].reply_json for i in rows.tolist()]


def test_a_store_made_with_replies_as_strings_is_read_and_appended_to(tmp_path: Path) -> None:
    # a store written before the blob columns (replies and requests as strings): read, appended to as it is
    uri = str(tmp_path / RESPONSES_DIR)
    keys = [_key(i) for i in range(4)]
    old = pa.table(
        {
            "key": keys[:2],
            "key_hash": [key_hash(k) for k in keys[:2]],
            "created_at": pa.array([0, 0], pa.timestamp("us", tz="UTC")),
            "pipeline": ["p", "p"],
            "experiment": ["e", "e"],
            "model": ["m", "m"],
            "request_json": ["{}", "{}"],
            "reply_json": ['"old 0"', '"old ✓ 1"'],
            "input_tokens": [1, 2],
            "output_tokens": [3, 4],
            "cost_usd": [None, 0.5],
        },
        schema=STRING_SCHEMA,
    )
    lance.write_dataset(old, uri, schema=STRING_SCHEMA, data_storage_version=lance_io.STORAGE_VERSION)
    store = ResponseStore.open(tmp_path)
    assert store._located == {}
    store.put_many([ResponseEntry(keys[2], '"new 2"', "m", request_json="{2}"), ResponseEntry(keys[3], '"new 3"', "m")])
    assert lance.dataset(uri).schema == STRING_SCHEMA  # its schema kept
    for reader in (store, ResponseStore.open(tmp_path)):
        got = reader.get_many(keys, request_json=False, provenance=False)
        assert {k: e.reply_json for k, e in got.items()} == {
            keys[0]: '"old 0"',
            keys[1]: '"old ✓ 1"',
            keys[2]: '"new 2"',
            keys[3]: '"new 3"',
        }
        assert reader.find(keys[:1])["reply_json"].to_pylist() == ['"old 0"']
        requests = {k: e.request_json for k, e in reader.get_many(keys).items()}
        assert requests == {keys[0]: "{}", keys[1]: "{}", keys[2]: "{2}", keys[3]: None}


def test_a_truncated_data_file_is_refused_naming_the_store(tmp_path: Path) -> None:
    # a reply past the end of its data file is a damaged store, never a shortened reply
    store = ResponseStore.open(tmp_path)
    store.put_many(_entries(0, 5))
    reader = ResponseStore.open(tmp_path)
    path = os.path.join(store.uri, "data", lance.dataset(store.uri).get_fragments()[0].metadata.files[0].path)
    with open(path, "r+b") as f:
        f.truncate(1000)
    with pytest.raises(ResponseStoreError) as raised:
        reader.get_many([_key(3)], request_json=False, provenance=False)
    assert store.uri in str(raised.value) and "damaged" in str(raised.value)
    ds, _, offsets, located = reader._locate([_key(3)], refresh=False)
    with pytest.raises(ValueError, match="ends before the values it holds"):  # the slice's own check
        read_located(located["reply_json"], offsets, ds)


def test_a_missing_data_file_is_refused_naming_the_store(tmp_path: Path) -> None:
    store = ResponseStore.open(tmp_path)
    store.put_many(_entries(0, 5))
    reader = ResponseStore.open(tmp_path)
    os.remove(os.path.join(store.uri, "data", lance.dataset(store.uri).get_fragments()[0].metadata.files[0].path))
    with pytest.raises(ResponseStoreError) as raised:
        reader.get_many([_key(2)])
    assert store.uri in str(raised.value)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    with MotoServer(tmp_path_factory.mktemp("moto") / "moto.log", buckets=(BUCKET,)) as s:
        yield s


@pytest.mark.timeout(180)
def test_an_object_store_reads_replies_through_lance(server: MotoServer) -> None:
    root = f"s3://{BUCKET}/blobs"
    store = ResponseStore.open(root, server.storage_options())
    store.put_many(_entries(0, 10))
    store.put_many(_entries(10, 10))
    assert store._located == {}  # no file to map: Lance's blob reader
    keys = [_key(i) for i in range(20)]
    reader = ResponseStore.open(root, server.storage_options())
    got = reader.get_many(keys)
    assert {k: e.reply_json for k, e in got.items()} == {e.key: e.reply_json for e in _entries(0, 20)}
    assert {k: e.request_json for k, e in got.items()} == {e.key: e.request_json for e in _entries(0, 20)}
    assert lance.dataset(store.uri, storage_options=server.storage_options()).schema == SCHEMA


def _described(positions: list[int], sizes: list[int | None]) -> pa.StructArray:
    values = [None if n is None else {"position": p, "size": n} for p, n in zip(positions, sizes)]
    return pa.array(values, pa.struct([("position", pa.uint64()), ("size", pa.uint64())]))


def test_a_view_is_unchanged_by_later_appends_across_a_growth() -> None:
    # appends write past every view's end, and a growth copies: an earlier view reads what it located
    locations = BlobLocations("reply_json", "/nowhere")
    locations.extend([("f0", _described(list(range(600)), [1] * 599 + [None]))])
    first = locations.view()
    locations.extend([("f1", _described([7] * 600, [2] * 600)), (None, _described([9] * 600, [3] * 600))])
    second = locations.view()
    assert len(first[1]) == 600 and len(second[1]) == 1800
    assert first[1].tolist() == [0] * 600 and first[2].tolist() == [*range(599), 0]  # a null's position: 0
    assert first[3].tolist() == [1] * 599 + [-1]  # the null value's size
    assert second[1].tolist() == [0] * 600 + [1] * 600 + [-1] * 600  # -1: a fragment Lance reads
    assert second[2][600:].tolist() == [7] * 600 + [9] * 600 and second[3][600:].tolist() == [2] * 600 + [3] * 600
    assert second[2][:600].tolist() == [*range(599), 0]
