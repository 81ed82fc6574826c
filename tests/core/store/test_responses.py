"""The response store's dataset: put, get, concurrent writers, bad stores, stats and maintenance."""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import threading
from typing import TYPE_CHECKING

import pytest

from airflow_provider_datagen.core import ResponseStore
from airflow_provider_datagen.core.store.responses import RESPONSES_DIR, ResponseEntry
from airflow_provider_datagen.exceptions import ResponseStoreError

if TYPE_CHECKING:
    from pathlib import Path


def _key(i: int) -> str:
    return hashlib.sha256(f"k{i}".encode()).hexdigest()


def _entry(i: int, **kw: object) -> ResponseEntry:
    return ResponseEntry(
        key=_key(i), reply_json=f'{{"n": {i}}}', model="openai:gpt-4o-mini", input_tokens=i, output_tokens=1, **kw
    )  # type: ignore[arg-type]


def test_an_entry_put_is_got_back_by_its_key(tmp_path: Path) -> None:
    store = ResponseStore.open(tmp_path)
    assert store.get_many([_key(1)]) == {}  # no store yet: nothing is made by a lookup
    assert not (tmp_path / RESPONSES_DIR).exists()
    assert store.put_many([_entry(i, pipeline="p", experiment="e", cost_usd=0.5) for i in range(5)]) == 5
    got = ResponseStore.open(tmp_path).get_many([_key(3), _key(9)])
    assert set(got) == {_key(3)}
    e = got[_key(3)]
    assert (e.reply_json, e.input_tokens, e.cost_usd, e.pipeline, e.experiment) == ('{"n": 3}', 3, 0.5, "p", "e")
    assert e.created_at is not None
    assert (tmp_path / RESPONSES_DIR / "_versions").is_dir()


def test_the_earliest_entry_of_a_key_answers(tmp_path: Path) -> None:
    store = ResponseStore.open(tmp_path)
    store.put_many([ResponseEntry(_key(1), '"first"', "m")])
    store.put_many([ResponseEntry(_key(1), '"second"', "m")])
    assert ResponseStore.open(tmp_path).get(_key(1)).reply_json == '"first"'  # type: ignore[union-attr]


def test_a_lookup_sees_what_another_writer_appended_since(tmp_path: Path) -> None:
    reader, writer = ResponseStore.open(tmp_path), ResponseStore.open(tmp_path)
    writer.put_many([_entry(1)])
    assert set(reader.get_many([_key(1)])) == {_key(1)}
    writer.put_many([_entry(2)])
    assert set(reader.get_many([_key(1), _key(2)])) == {_key(1), _key(2)}


def test_concurrent_writers_lose_no_entry(tmp_path: Path) -> None:
    # four writers racing to create the store, then to append: every entry is kept
    barrier = threading.Barrier(4)

    def write(w: int) -> None:
        store = ResponseStore.open(tmp_path)
        barrier.wait()
        for b in range(3):
            store.put_many([_entry(w * 100 + b * 10 + i) for i in range(5)])

    threads = [threading.Thread(target=write, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    keys = [_key(w * 100 + b * 10 + i) for w in range(4) for b in range(3) for i in range(5)]
    assert set(ResponseStore.open(tmp_path).get_many(keys)) == set(keys)
    assert ResponseStore.open(tmp_path).stats()["entries"] == 60


def test_a_directory_that_is_not_a_store_is_refused_naming_it(tmp_path: Path) -> None:
    (tmp_path / RESPONSES_DIR).mkdir()
    (tmp_path / RESPONSES_DIR / "notes.txt").write_text("mine")
    with pytest.raises(ResponseStoreError, match=f"{tmp_path}/{RESPONSES_DIR}.*not a Lance dataset.*reuse=False"):
        ResponseStore.open(tmp_path)


def test_a_file_in_the_stores_place_is_refused(tmp_path: Path) -> None:
    (tmp_path / RESPONSES_DIR).write_text("x")
    with pytest.raises(ResponseStoreError, match="not a Lance dataset"):
        ResponseStore.open(tmp_path)


def test_another_lance_dataset_is_not_a_store(tmp_path: Path) -> None:
    import lance
    import pyarrow as pa

    lance.write_dataset(pa.table({"x": [1]}), str(tmp_path / RESPONSES_DIR))
    with pytest.raises(ResponseStoreError, match=r"without the columns.*not a response store"):
        ResponseStore.open(tmp_path)


def test_a_damaged_store_is_refused_naming_it(tmp_path: Path) -> None:
    ResponseStore.open(tmp_path).put_many([_entry(1)])
    versions = tmp_path / RESPONSES_DIR / "_versions"
    for name in os.listdir(versions):
        (versions / name).write_bytes(b"garbage")
    with pytest.raises(ResponseStoreError, match=f"{RESPONSES_DIR}"):
        ResponseStore.open(tmp_path)


def test_stats_and_maintain_drop_old_entries(tmp_path: Path) -> None:
    store = ResponseStore.open(tmp_path)
    old = dt.datetime.now(dt.UTC) - dt.timedelta(days=10)
    store.put_many([_entry(1, created_at=old), _entry(2, created_at=old)])
    store.put_many([_entry(3)])
    stats = store.stats()
    assert stats["entries"] == 3 and stats["bytes"] > 0
    out = store.maintain(older_than=dt.timedelta(days=1))
    assert out["dropped"] == 2 and out["entries"] == 1
    assert set(ResponseStore.open(tmp_path).get_many([_key(1), _key(2), _key(3)])) == {_key(3)}
    assert set(store.get_many([_key(1), _key(3)])) == {_key(3)}  # the index follows the compaction
    with pytest.raises(ResponseStoreError, match="timedelta"):
        store.maintain(older_than=5)  # type: ignore[arg-type]


def test_compact_rewrites_many_small_fragments_and_keeps_every_entry(tmp_path: Path) -> None:
    store = ResponseStore.open(tmp_path)
    for i in range(5):
        store.put_many([_entry(i)])
    assert store.stats()["fragments"] == 5
    assert store.compact(above_fragments=10) is False
    assert store.compact() is True
    assert store.stats()["fragments"] == 1
    assert set(store.get_many([_key(i) for i in range(5)])) == {_key(i) for i in range(5)}
