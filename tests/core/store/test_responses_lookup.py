"""The response store's lookups through its in-memory index: whole keys, earliest entries, deletions."""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
from typing import TYPE_CHECKING

import lance
import numpy as np
import pyarrow as pa
import pytest

from airflow_provider_datagen.core import ResponseStore
from airflow_provider_datagen.core.store import response_index, responses
from airflow_provider_datagen.core.store.response_index import hashes_of, key_words
from airflow_provider_datagen.core.store.responses import RESPONSES_DIR, ResponseEntry, key_hash
from airflow_provider_datagen.exceptions import ResponseStoreError

if TYPE_CHECKING:
    from pathlib import Path


def _key(i: int) -> str:
    return hashlib.sha256(f"k{i}".encode()).hexdigest()


def test_keys_with_one_hash_are_told_apart_by_the_whole_key(tmp_path: Path) -> None:
    # three keys sharing their first 16 characters (one key_hash): each answers with its own entry, and a
    # fourth with that hash that is not stored is a miss, not another key's reply
    head = "0123456789abcdef"
    a, b, c, absent = (head + ch * 48 for ch in "abcd")
    store = ResponseStore.open(tmp_path)
    store.put_many([ResponseEntry(b, '"b"', "m"), ResponseEntry(a, '"a"', "m")])
    store.put_many([ResponseEntry(c, '"c"', "m")])
    for reader in (store, ResponseStore.open(tmp_path)):
        got = reader.get_many([a, b, c, absent])
        assert {k: e.reply_json for k, e in got.items()} == {a: '"a"', b: '"b"', c: '"c"'}
        assert reader.get(absent) is None
        assert reader.find([c, a]).column("key").to_pylist() == [a, c]  # in the store's order


def test_the_earliest_entry_answers_within_one_append_and_across_them(tmp_path: Path) -> None:
    store = ResponseStore.open(tmp_path)
    store.put_many([ResponseEntry(_key(1), '"first"', "m"), ResponseEntry(_key(1), '"second"', "m")])
    store.put_many([ResponseEntry(_key(2), '"first"', "m")])
    store.put_many([ResponseEntry(_key(2), '"second"', "m"), ResponseEntry(_key(1), '"third"', "m")])
    for reader in (store, ResponseStore.open(tmp_path)):
        got = reader.get_many([_key(1), _key(2), _key(1)])
        assert {k: e.reply_json for k, e in got.items()} == {_key(1): '"first"', _key(2): '"first"'}
        assert reader.find([_key(1), _key(2)]).num_rows == 2


def test_an_entry_read_back_equals_the_one_put(tmp_path: Path) -> None:
    made = dt.datetime(2026, 12, 4, 5, 6, 7, 891011, tzinfo=dt.UTC)
    entry = ResponseEntry(_key(1), '{"r": 1}', "openai:m", 3, 4, 0.25, '{"q": 1}', "p", "e", made)
    ResponseStore.open(tmp_path).put_many([entry, ResponseEntry(_key(2), "{}", "m", created_at=made)])
    store = ResponseStore.open(tmp_path)
    assert store.get_many([_key(1)]) == {_key(1): entry}
    light = store.get_many([_key(1)], request_json=False)[_key(1)]
    assert light.request_json is None and light == ResponseEntry(**{**entry.__dict__, "request_json": None})
    hot = store.get_many([_key(1)], request_json=False, provenance=False)[_key(1)]
    assert hot == ResponseEntry(_key(1), '{"r": 1}', "openai:m", 3, 4, 0.25)
    assert store.get_many([_key(1)], provenance=False)[_key(1)].request_json == '{"q": 1}'
    assert store.get_many([_key(1), _key(2)])[_key(2)].created_at == made  # one instant, read once, both right
    # get_many sets the fields by name, in this order, without the dataclass's __init__
    assert [f.name for f in dataclasses.fields(ResponseEntry)] == responses._ENTRY_COLUMNS


def test_a_deletion_by_another_writer_is_followed_not_read_at_shifted_rows(tmp_path: Path) -> None:
    # another process deletes rows without compacting: the row offsets after them move, and the
    # reader's index, built before, must not answer a key with its neighbour's reply
    store = ResponseStore.open(tmp_path)
    store.put_many([ResponseEntry(_key(i), f'"{i}"', "m") for i in range(6)])
    assert store.get(_key(4)).reply_json == '"4"'  # type: ignore[union-attr]
    lance.dataset(str(tmp_path / RESPONSES_DIR)).delete(f"key = '{_key(1)}' OR key = '{_key(2)}'")
    got = store.get_many([_key(i) for i in range(6)])
    assert {k: e.reply_json for k, e in got.items()} == {_key(i): f'"{i}"' for i in (0, 3, 4, 5)}


def test_a_store_made_again_in_the_same_place_is_read_afresh(tmp_path: Path) -> None:
    # the store moved away and a new one made there (past the old one's version): its first fragment has
    # the old one's id and row count, other keys; an index kept from before would answer _key(1) with row 0
    store = ResponseStore.open(tmp_path)
    store.put_many([ResponseEntry(_key(1), '"old"', "m")])
    assert store.get(_key(1)) is not None
    (tmp_path / RESPONSES_DIR).rename(tmp_path / "moved")
    again = ResponseStore.open(tmp_path)
    again.put_many([ResponseEntry(_key(2), '"new"', "m")])
    again.put_many([ResponseEntry(_key(3), '"newer"', "m")])
    assert store.get(_key(1)) is None
    assert store.get(_key(2)).reply_json == '"new"'  # type: ignore[union-attr]


def test_a_string_that_is_not_a_key_is_refused_before_any_write_and_never_found(tmp_path: Path) -> None:
    store = ResponseStore.open(tmp_path)
    for bad in ("abc", "x" * 64, _key(1) + "0", _key(1)[:63] + "é"):
        with pytest.raises(ResponseStoreError, match=r"not a request's key.*LLMRequest.key\(\)"):
            store.put_many([ResponseEntry(_key(2), "{}", "m"), ResponseEntry(bad, "{}", "m")])
    assert not (tmp_path / RESPONSES_DIR).exists()
    store.put_many([ResponseEntry(_key(2), "{}", "m")])
    assert store.get_many(["abc", "x" * 64, "", _key(2).upper()]) == {}


def test_the_vectorized_hash_is_key_hash() -> None:
    keys = [_key(i) for i in range(200)] + ["f" * 64, "0" * 64, "8" + "0" * 63, _key(7).upper()]
    words, ok = key_words(pa.array(keys))
    assert ok.all()
    assert hashes_of(words).tolist() == [key_hash(k) for k in keys]
    sliced = pa.array(["x", *keys[:3]]).slice(1)  # an array not starting at its buffer's start
    words, ok = key_words(sliced)
    assert ok.all() and (words == key_words(pa.array(keys[:3]))[0]).all()
    assert key_words(pa.array(["short", None, keys[0]]))[1].tolist() == [False, False, True]
    assert np.array_equal(key_words(pa.array([], pa.string()))[1], np.zeros(0, bool))


def test_keys_kept_in_many_parts_are_found_in_each(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # every append its own part of the in-memory keys (as a store read in 8,192-key chunks is)
    monkeypatch.setattr(response_index, "SMALL_PART", 1)
    store = ResponseStore.open(tmp_path)
    for b in range(4):
        store.put_many([ResponseEntry(_key(b * 10 + i), f'"{b * 10 + i}"', "m") for i in range(3)])
    keys = [_key(b * 10 + i) for b in (3, 0, 2) for i in range(3)] + [_key(99)]
    for reader in (store, ResponseStore.open(tmp_path)):
        assert len(reader._keys.view()[0]) == 4
        got = reader.get_many(keys)
        assert {k: e.reply_json for k, e in got.items()} == {
            _key(n): f'"{n}"' for b in (3, 0, 2) for n in range(b * 10, b * 10 + 3)
        }
