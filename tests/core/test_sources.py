"""Source items: prepare_items' fast path, the value types and formats a source may have, source paths.

The reference below is prepare_items as it was before the fast path, item by item through
:func:`root_item_id` and :func:`fingerprint_of`; Hypothesis drives both over JSON-ish items with
non-ASCII and surrogate text, keys that need escaping, int and bool keys, NaN, unserializable values,
duplicates and non-dict items, and every id, key, fingerprint, position and error must match.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import math
import pickle
from collections import OrderedDict
from collections.abc import Callable, Mapping
from decimal import Decimal
from pathlib import Path
from types import MappingProxyType
from typing import Any
from unittest import mock

import lance
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_datagen.core import CheckpointLog, run_items, sources
from airflow_provider_datagen.core.events import fingerprint_of
from airflow_provider_datagen.core.ids import MAX_KEY_LENGTH, root_item_id
from airflow_provider_datagen.core.sources import SourceItem, load_source, prepare_items, read_source
from airflow_provider_datagen.exceptions import ConfigurationError, InvalidItemError
from tests._support.profiles import examples


def reference_prepare(items: Any, key_field: str = "id") -> list[tuple[str, str, Any, str, int]]:
    """The slow, obvious prepare_items loop: (item_id, key, data, fingerprint, position) per item."""
    out = []
    seen: dict[str, int] = {}
    for pos, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise InvalidItemError(
                f"item #{pos} is a {type(item).__name__}, not a dict; every source item must be a JSON object"
            )
        if key_field not in item:
            raise InvalidItemError(
                f"item #{pos} has no key field {key_field!r} (it has {sorted(map(str, item))[:8]}); "
                "set key_field= to the name of the unique id column"
            )
        key = item[key_field]
        try:
            iid = root_item_id(key)
        except InvalidItemError as exc:
            raise InvalidItemError(f"item #{pos}: {exc}") from None
        # the key string rule: the key as text, one object with the id when they are equal
        text = key if isinstance(key, str) else str(key)
        key_s = iid if text == iid else text
        if iid in seen:
            raise InvalidItemError(
                f"duplicate key {str(key)[:200]!r} (items #{seen[iid]} and #{pos}); keys must be unique "
                "in one source: de-duplicate the source or choose another key_field"
            )
        seen[iid] = pos
        data = item if isinstance(item, dict) else dict(item)
        try:
            fp = fingerprint_of(data)
        except InvalidItemError:
            raise
        except Exception as exc:
            raise InvalidItemError(f"item {iid!r}: {exc}") from None
        out.append((iid, key_s, data, fp, pos))
    return out


def outcome(prepare: Callable[..., list[Any]], items: list[Any], key_field: str = "id") -> tuple[Any, ...]:
    """What a prepare function did, comparable across implementations: its rows, or its error."""
    try:
        got = prepare(items, key_field)
    except Exception as exc:
        return ("error", type(exc), str(exc))
    rows = []
    for row in got:
        if isinstance(row, SourceItem):
            assert type(row) is SourceItem
            row = (row.item_id, row.key, row._data, row.fingerprint, row.position)
        iid, key, data, fp, pos = row
        given_item = items[pos]
        # a dict is kept as given, any other mapping becomes an equal plain dict
        kept = data is given_item if isinstance(given_item, dict) else type(data) is dict and data == dict(given_item)
        rows.append((iid, key, fp, pos, key is iid, kept))
    return ("ok", rows)


# Text with the characters that matter: reserved in ids, NUL, non-ASCII, JSON escapes; and text with
# a lone surrogate (invalid as a key and in any value).
SPECIAL = '%/:\x00é☃😀\u2028"\\\n\x1f'
texts = st.text(st.one_of(st.characters(max_codepoint=0x7F), st.sampled_from(SPECIAL), st.characters()), max_size=8)
surrogate_texts = st.builds(
    lambda a, s, b: a + s + b, texts, st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), texts
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    texts,
    st.sampled_from([0.0, -0.0, 1e300, 2.5, 10**30]),
)
values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.tuples(children, children),
        st.dictionaries(texts, children, max_size=3),
    ),
    max_leaves=8,
)
# What a JSON encoder refuses or the fingerprint cannot take
BAD_SCALARS = [float("nan"), float("inf"), -math.inf, b"bytes", {1, 2}, complex(1, 2), object()]
bad_scalars = st.one_of(st.sampled_from(BAD_SCALARS), surrogate_texts)
# dict keys that encode as text (ints, None, bools, floats) and so sort against text keys: an error
odd_field_names = st.one_of(st.integers(-5, 5), st.sampled_from([None, True, 1.5]), surrogate_texts)
bad_values = st.recursive(
    bad_scalars,
    lambda children: st.one_of(
        st.lists(st.one_of(children, values), min_size=1, max_size=3).map(lambda v: v[::-1]),
        st.dictionaries(st.one_of(texts, odd_field_names), st.one_of(children, values), min_size=1, max_size=3),
        st.dictionaries(odd_field_names, values, min_size=1, max_size=3),
    ),
    max_leaves=4,
)
# Source keys: a small pool so duplicates happen (5 and "5" are one id), keys that need escaping,
# ints either side of the fast path's bound; and keys refused: bools, other types, empty, NUL, too
# long, a lone surrogate, an int past str()'s digit limit
GOOD_KEYS = ["5", 5, -3, "-3", "a", "a/b", "a%2Fb", "x:y", "%", "é", "☃/😀", 0, 10**18, 10**18 - 1, -(10**18)]
GOOD_KEYS += [-(10**18) + 1, str(10**18), 10**400, "k" * MAX_KEY_LENGTH]
BAD_KEYS = [True, False, None, 1.0, "", "a\x00", "k" * (MAX_KEY_LENGTH + 1), 10**4100, 10**5000, b"5", ("t",)]
good_keys = st.one_of(st.sampled_from(GOOD_KEYS), texts.filter(lambda t: t and "\x00" not in t), st.integers())
bad_keys = st.one_of(st.sampled_from(BAD_KEYS), surrogate_texts)


@st.composite
def source_items(draw: Any) -> Any:
    """Mostly good items, so that sources of several get through; now and then one bad in some way."""
    bad = draw(st.integers(0, 11)) == 0
    shape = (
        draw(st.sampled_from(["dict"] * 6 + ["proxy", "ordered", "dict subclass"]))
        if not bad
        else draw(st.sampled_from(BAD))
    )
    if shape == "not a mapping":
        return draw(st.sampled_from([["id", 1], "id", 5, None, ("id", "a")]))
    fields = draw(st.dictionaries(texts, values, max_size=4))
    if shape == "bad value":
        fields[draw(st.one_of(texts, odd_field_names))] = draw(bad_values)
    if shape != "no key":
        fields["id"] = draw(bad_keys if shape == "bad key" else good_keys)
        if draw(st.booleans()):  # the key first or last in the dict
            fields = {"id": fields.pop("id"), **fields}
    if shape == "proxy":
        return MappingProxyType(fields)
    if shape == "ordered":
        return OrderedDict(fields)
    if shape == "dict subclass":
        return Upper(fields)
    return fields


class Upper(dict[str, Any]):
    """A dict whose ``[]`` reads differ from its contents: only the general path may read it."""

    def __getitem__(self, name: Any) -> Any:
        value = super().__getitem__(name)
        return value.upper() if isinstance(value, str) else value


BAD = ["bad value", "bad key", "no key", "not a mapping"]


@settings(max_examples=examples(400), deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(source_items(), max_size=8))
def test_prepare_items_matches_the_public_functions(items: list[Any]) -> None:
    expected = outcome(reference_prepare, items)
    assert outcome(prepare_items, items) == expected
    with mock.patch.object(sources, "_FAST", None):  # no C encoder: the general path alone
        assert outcome(prepare_items, items) == expected


@settings(max_examples=examples(200), deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.one_of(good_keys, good_keys, bad_keys), values), max_size=10))
def test_prepare_items_matches_on_plain_dicts_with_an_other_key_field(pairs: list[tuple[Any, Any]]) -> None:
    items = [{"name": key, "v": value, "id": 1} for key, value in pairs]
    assert outcome(prepare_items, items, "name") == outcome(reference_prepare, items, "name")


@settings(max_examples=examples(400), deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(source_items(), max_size=8))
def test_fingerprint_rows_gives_the_reference_ids_and_fingerprints_or_declines(items: list[Any]) -> None:
    """The planners' bulk path: the same ids and fingerprints as the reference, or None (never a wrong one)."""
    got = sources.fingerprint_rows(items, "id")
    if got is None:
        return
    expected = outcome(reference_prepare, items)
    ids, fps = got
    assert isinstance(fps, pa.StringArray) and len(fps) == len(ids)
    if len(set(ids)) == len(ids):  # uniqueness is the caller's to check
        assert expected[0] == "ok"
        assert (ids, fps.to_pylist()) == ([r[0] for r in expected[1]], [r[2] for r in expected[1]])


def test_fingerprint_rows_declines_every_key_that_needs_escaping_or_is_refused() -> None:
    for key in ["a/b", "a%2Fb", "x:y", "%", "", "a\x00", "k" * (MAX_KEY_LENGTH + 1), True, 1.0, 10**18]:
        assert sources.fingerprint_rows([{"id": "ok"}, {"id": key}], "id") is None, key
    ids, fps = sources.fingerprint_rows([{"id": "ok"}, {"id": "k" * MAX_KEY_LENGTH}, {"id": -5}], "id")
    assert ids == ["ok", "k" * MAX_KEY_LENGTH, "-5"]
    assert fps.to_pylist() == [
        fingerprint_of({"id": "ok"}),
        fingerprint_of({"id": "k" * MAX_KEY_LENGTH}),
        fingerprint_of({"id": -5}),
    ]


# Column values that a column-wise encoding could split wrongly: quotes, commas, backslashes, escapes.
arrow_texts = st.text(
    st.one_of(st.sampled_from('",\\:/%\x00\x1f\u2028é😀'), st.characters(blacklist_categories=("Cs",))), max_size=6
)


@st.composite
def arrow_batches(draw: Any) -> pa.RecordBatch:
    """A batch of string, integer and boolean columns (sometimes a null), keyed by ``id``."""
    n = draw(st.integers(1, 12))
    keys = draw(
        st.one_of(
            st.lists(st.from_regex(r"[a-z0-9_\-é]{1,6}", fullmatch=True), min_size=n, max_size=n, unique=True),
            st.lists(st.integers(-(10**18) + 1, 10**18 - 1), min_size=n, max_size=n, unique=True),
            st.lists(arrow_texts, min_size=n, max_size=n),
        )
    )
    columns = {"id": keys}
    for name in draw(st.lists(st.one_of(arrow_texts, st.just("a")), max_size=3, unique=True)):
        if name == "id":
            continue
        kind = draw(st.sampled_from(["text", "int", "bool"]))
        value = {"text": arrow_texts, "int": st.integers(-(2**63), 2**63 - 1), "bool": st.booleans()}[kind]
        columns[name] = draw(st.lists(st.one_of(value, value, value, st.none()), min_size=n, max_size=n))
    return pa.RecordBatch.from_pydict(columns)


@settings(max_examples=examples(300), deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(arrow_batches())
def test_fingerprint_batch_gives_the_row_paths_ids_and_fingerprints_or_declines(batch: pa.RecordBatch) -> None:
    got = sources.fingerprint_batch(batch, "id")
    rows = batch.to_pylist()
    expected = sources.fingerprint_rows(rows, "id", plain=True)
    if got is None:
        return
    assert expected is not None, "the column path took a batch the row path refuses"
    ids, fps = got
    assert ids.type == pa.string() and ids.to_pylist() == expected[0]
    assert fps.to_pylist() == expected[1].to_pylist()
    assert fps.to_pylist() == [fingerprint_of(r) for r in rows]


def test_fingerprint_batch_takes_the_common_batch_and_declines_what_it_cannot_split() -> None:
    plain = pa.RecordBatch.from_pylist(
        [{"id": f"k{i}", "text": f'say "{i}", \\ é', "n": i, "ok": True} for i in range(5)]
    )
    _, fps = sources.fingerprint_batch(plain, "id")
    assert fps.to_pylist() == [fingerprint_of(r) for r in plain.to_pylist()]
    # a value whose encoding holds '","' (here the one-character string ","), a null, a nested column
    for rows in (
        [{"id": "a", "text": ","}, {"id": "b", "text": "x"}],
        [{"id": "a", "text": None}, {"id": "b", "text": "x"}],
        [{"id": "a", "tags": ["x"]}],
    ):
        assert sources.fingerprint_batch(pa.RecordBatch.from_pylist(rows), "id") is None, rows


def test_common_items_take_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    items = [
        {"id": "item-0000001", "v": 1},
        {"id": 7, "text": "é ☃ 😀 \u2028", "nested": {"b": [1, 2.5, None, True], "a": {}}},
        {"v": -0.0, "id": -(10**18) + 1},
        {"id": "k" * MAX_KEY_LENGTH},
    ]
    expected = outcome(reference_prepare, items)

    def general_path(*args: Any) -> Any:
        raise AssertionError(f"took the general path for {args[:2]}")

    monkeypatch.setattr(sources, "_prepare_one", general_path)
    assert outcome(prepare_items, items) == expected


def test_a_reference_cycle_is_the_same_error() -> None:
    item: dict[str, Any] = {"id": "c"}
    item["self"] = item
    items = [{"id": "a"}, item]
    expected = outcome(reference_prepare, items)
    assert expected[0] == "error" and "reference cycle" in expected[2]
    assert outcome(prepare_items, items) == expected


def test_the_first_bad_item_in_source_order_raises() -> None:
    nan, dup, no_key = {"id": "n", "v": float("nan")}, {"id": 1}, {"v": 1}
    for items in ([{"id": "1"}, dup, nan], [nan, {"id": "1"}, dup], [{"id": "1"}, no_key, dup, nan]):
        expected = outcome(reference_prepare, items)
        assert expected[0] == "error"
        assert outcome(prepare_items, items) == expected


def test_fast_built_items_are_ordinary_immutable_source_items() -> None:
    (item,) = prepare_items([{"id": "x", "tags": ["a"]}])
    assert type(item) is SourceItem
    with pytest.raises(AttributeError, match="immutable"):
        item.key = "y"
    with pytest.raises(AttributeError, match="immutable"):
        item.__class__ = sources._DraftItem
    assert not hasattr(item, "__dict__")
    built = SourceItem("x", "x", {"id": "x", "tags": ["a"]}, item.fingerprint, 0)
    assert item == built and repr(item) == repr(built)
    assert pickle.loads(pickle.dumps(item)) == item == copy.deepcopy(item) == copy.copy(item)
    assert type(pickle.loads(pickle.dumps(item))) is SourceItem


# --- source value types, formats and paths --------------------------------------------------------

UTC = dt.UTC
IST = dt.timezone(dt.timedelta(hours=5, minutes=30))


def typed_items() -> list[dict[str, Any]]:
    """Items of every non-JSON type a Parquet or Lance column gives, at the top level and nested."""
    return [
        {
            "id": f"t{n}",
            "at": dt.datetime(2024, 1, 1 + n, 12, 30, 15, 250 * n, tzinfo=UTC),
            "local": dt.datetime(2024, 2, 29, 23, 59, 59, 999_999 - n, tzinfo=IST),
            "naive": dt.datetime(2023, 12, 31, n, 0),
            "day": dt.date(2024, 1, 1 + n),
            "clock": dt.time(n, 2, 3, 4),
            "price": Decimal(f"{n}.50"),
            "blob": bytes([n, 0, 255]),
            "meta": {"seen": dt.datetime(2024, 3, 1, n, tzinfo=UTC), "note": f"n{n}"},
            "days": [dt.date(2024, 5, 1 + n), dt.date(2024, 5, 2 + n)],
        }
        for n in range(3)
    ]


def json_items() -> list[dict[str, Any]]:
    """JSON-native items as a tabular format holds them: the same keys in every row, one type per column."""
    return [
        {
            "id": f"j{n}",
            "n": [7, -3, 10**15][n],
            "x": [1.0, 0.1, -0.0][n],
            "ok": n % 2 == 0,
            "text": ["é ☃ 😀", "line\nbreak \u2028", ""][n],
            "maybe": [None, "set", None][n],
            "meta": {"tags": [["a", "b"], [], ["c"]][n], "score": [0.5, 2.0, 1e300][n], "depth": {"k": n}},
            "ints": [[1, 2], [], [3]][n],
        }
        for n in range(3)
    ]


def _write_source(fmt: str, items: list[dict[str, Any]], tmp_path: Path) -> Any:
    """The items as a source of format ``fmt``: the list itself, or an absolute path to a file of it."""
    if fmt == "inline":
        return items
    path = tmp_path / f"source.{fmt}"
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(i) + "\n" for i in items), encoding="utf-8")
    elif fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(items), path)
    else:
        lance.write_dataset(pa.Table.from_pylist(items), str(path), mode="overwrite")
    return str(path)


def _fingerprints(source: Any) -> dict[str, str]:
    return {s.item_id: s.fingerprint for s in load_source(source)}


@pytest.mark.parametrize("fmt", ["inline", "parquet", "lance"])
def test_typed_values_reach_the_process_as_the_source_gave_them(
    fmt: str, tmp_path: Path, checkpoint_log: Callable[..., CheckpointLog]
) -> None:
    items = typed_items()
    seen: dict[str, dict[str, Any]] = {}

    def process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        seen[item["id"]] = item
        return {"ok": True}

    log = checkpoint_log(fmt, root=tmp_path / "root")
    report = run_items(log, load_source(_write_source(fmt, items, tmp_path)), process)
    assert report.processed == ["t0", "t1", "t2"] and not report.failed
    for want in items:
        got = seen[want["id"]]
        assert got == want
        assert {k: type(v) for k, v in got.items()} == {k: type(v) for k, v in want.items()}
        assert type(got["meta"]["seen"]) is dt.datetime and type(got["days"][0]) is dt.date
        assert got["at"].utcoffset() == dt.timedelta(0) and got["local"].utcoffset() == IST.utcoffset(None)
        assert got["naive"].tzinfo is None and str(got["price"]) == str(want["price"])
    assert run_items(log, load_source(_write_source(fmt, items, tmp_path)), process).skipped == ["t0", "t1", "t2"]


def test_json_native_items_have_the_same_fingerprint_in_every_format(tmp_path: Path) -> None:
    items = json_items()
    expected = {i["id"]: fingerprint_of(i) for i in items}
    for fmt in ("inline", "jsonl", "parquet", "lance"):
        rows = list(read_source(_write_source(fmt, items, tmp_path)))
        assert rows == items, fmt  # ints stay ints, floats floats, structs dicts
        assert _fingerprints(_write_source(fmt, items, tmp_path)) == expected, fmt


def test_typed_items_have_the_same_fingerprint_inline_in_parquet_and_in_lance(tmp_path: Path) -> None:
    items = typed_items()
    expected = _fingerprints(items)
    assert len(set(expected.values())) == 3
    assert _fingerprints(_write_source("parquet", items, tmp_path)) == expected
    assert _fingerprints(_write_source("lance", items, tmp_path)) == expected
    # what a format cannot hold is another value: JSONL has the dates' text, not dates
    as_text = [json.loads(json.dumps(i, default=str)) for i in items]
    assert not set(_fingerprints(_write_source("jsonl", as_text, tmp_path)).values()) & set(expected.values())


#: Fingerprints of JSON-native items, computed on the code before source items could hold other types:
#: every existing log holds these, so they must never change (no mass invalidation).
PINNED = [
    ({"id": 1, "q": "What is 2+2?"}, "9c549fc46df0fa571283c340fdb4a0de"),
    (
        {
            "id": "a/b",
            "text": "é\u2028",
            "n": -3,
            "x": 1.5,
            "f": 1.0,
            "z": -0.0,
            "big": 10**30,
            "ok": True,
            "none": None,
        },
        "27b10e7f5860fdbf4cc1c28d3a1cce24",
    ),
    (
        {
            "id": "nested",
            "meta": {"tags": ["x", "y"], "score": 0.1, "deep": {"$date": "2024-01-01"}},
            "when": "2024-01-01T00:00:00+00:00",
        },
        "c0dab72e244fdcdbcb510c17650a9437",
    ),
    ({"id": "e", "l": [], "d": {}}, "bc7b86b23b6a12b2a181bf317368c194"),
]


def test_json_native_fingerprints_are_those_of_existing_logs() -> None:
    items = [item for item, _ in PINNED]
    assert [fingerprint_of(item) for item in items] == [fp for _, fp in PINNED]
    assert [s.fingerprint for s in prepare_items(items)] == [fp for _, fp in PINNED]
    with mock.patch.object(sources, "_FAST", None):
        assert [s.fingerprint for s in prepare_items(items)] == [fp for _, fp in PINNED]


def test_an_unsupported_source_value_names_the_item_and_the_types() -> None:
    with pytest.raises(InvalidItemError, match=r"^item 'x': source item is not JSON-serializable \(Object of type set"):
        prepare_items([{"id": "x", "at": dt.date(2024, 1, 1), "s": {1}}])
    with pytest.raises(InvalidItemError, match=r"and not a datetime, date, time, Decimal or bytes; convert it"):
        prepare_items([{"id": "x", "s": {1}}])
    with pytest.raises(InvalidItemError, match=r"^item 'x': source item contains a Decimal NaN"):
        prepare_items([{"id": "x", "d": Decimal("NaN")}])


@pytest.mark.parametrize("name", ["items.jsonl", "data/items.parquet", "./items.lance", "items.ndjson"])
def test_a_relative_source_path_is_refused(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    _write_source("parquet", json_items(), tmp_path)
    (tmp_path / "source.parquet").rename(tmp_path / name)  # it exists, relative to this process's cwd
    for source in (name, Path(name)):
        with pytest.raises(ConfigurationError) as info:
            load_source(source)
        assert str(info.value) == (
            f"read_source: source={str(source)!r} is a relative path; give an absolute path or a URI "
            "(each Airflow component has its own working directory)"
        )
    assert len(load_source(json_items())) == 3  # an inline list has no path; absolute paths: the tests above
