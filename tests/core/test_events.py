"""Canonical JSON, the canonical text of source items, value encoding (inline vs blob), event ids."""

from __future__ import annotations

import datetime as dt
import math
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_datagen.core.events import (
    BlobRef,
    canonical_json,
    canonical_source_json,
    decode_source_json,
    digest,
    encode_value,
    event_id_for,
    event_key_of,
    fingerprint_of,
)
from airflow_provider_datagen.core.schema import DEFAULT_BLOB_THRESHOLD, VALUE_KIND_BYTES, VALUE_KIND_JSON
from airflow_provider_datagen.exceptions import DatagenError, InvalidValueError
from tests._support.engine import open_log
from tests._support.profiles import examples

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    import pyarrow as pa

    from airflow_provider_datagen.core import Batch

json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
json_values = st.recursive(
    json_scalars | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=20,
)


# --- canonical JSON --------------------------------------------------------------------------


def test_canonical_json_is_compact_and_sorted() -> None:
    assert canonical_json({"b": 1, "a": [1, 2, {"d": None, "c": True}]}) == ('{"a":[1,2,{"c":true,"d":null}],"b":1}')
    assert canonical_json("é") == '"é"'  # UTF-8, not \\u escapes


@given(st.dictionaries(st.text(max_size=8), json_values, max_size=8), st.randoms())
def test_canonical_json_ignores_key_order(d: dict[str, Any], rnd: Any) -> None:
    items = list(d.items())
    rnd.shuffle(items)
    assert canonical_json(dict(items)) == canonical_json(d)
    assert fingerprint_of(dict(items)) == fingerprint_of(d)


def test_fingerprint_depends_on_content() -> None:
    assert fingerprint_of({"q": 1}) == fingerprint_of({"q": 1})
    assert fingerprint_of({"q": 1}) != fingerprint_of({"q": 2})
    assert fingerprint_of({"q": 1}) != fingerprint_of({"q": "1"})
    assert len(fingerprint_of({})) == 32


def _cycle() -> list[Any]:
    a: list[Any] = []
    a.append(a)
    return a


def _deep(n: int) -> Any:
    v: Any = 0
    for _ in range(n):
        v = [v]
    return v


@pytest.mark.parametrize(
    ("value", "hint"),
    [
        (math.nan, "JSON cannot represent"),
        (math.inf, "JSON cannot represent"),
        (-math.inf, "JSON cannot represent"),
        ({"x": [1.0, math.nan]}, "NaN"),
        ({1, 2}, "not JSON-serializable"),
        (object(), "not JSON-serializable"),
        (Decimal("1.5"), "not JSON-serializable"),
        (dt.datetime(2024, 1, 1), "not JSON-serializable"),
        ({"k": b"bytes inside json"}, "not JSON-serializable"),
        ({(1, 2): "tuple key"}, "not JSON-serializable"),
        (_cycle(), "cycle"),
        (_deep(100_000), "nested too deeply"),
        ("lone \ud800 surrogate", "surrogate"),
        ({"\udfff": 1}, "surrogate"),
    ],
)
def test_unencodable_values_raise_invalid_value_error(value: Any, hint: str) -> None:
    with pytest.raises(InvalidValueError) as info:
        encode_value(value, what="field 'answer'")
    assert isinstance(info.value, DatagenError)
    assert hint in str(info.value)
    assert "field 'answer'" in str(info.value)
    with pytest.raises(InvalidValueError):
        canonical_json(value)


def test_a_field_value_error_never_contradicts_itself() -> None:
    with pytest.raises(InvalidValueError) as info:
        encode_value({"k": b"bytes inside json"}, what="field 'answer'")
    assert str(info.value) == (
        "field 'answer' is not JSON-serializable (Object of type bytes is not JSON serializable); convert it "
        "to dicts, lists, str, int, float, bool or None, or make the whole field value bytes (bytes inside a "
        "dict or list are not stored)"
    )
    assert encode_value(b"bytes inside json").kind == VALUE_KIND_BYTES  # as the message says


# --- the canonical text of source items --------------------------------------------------------

UTC = dt.UTC


@pytest.mark.parametrize(
    ("value", "tagged"),
    [
        (dt.datetime(2024, 1, 2, 3, 4, 5), '{"$datetime":"2024-01-02T03:04:05"}'),
        (dt.datetime(2024, 1, 2, 3, 4, 5, 600, tzinfo=UTC), '{"$datetime":"2024-01-02T03:04:05.000600+00:00"}'),
        (
            dt.datetime(2024, 1, 2, 3, 4, tzinfo=dt.timezone(dt.timedelta(hours=-5, minutes=-30))),
            '{"$datetime":"2024-01-02T03:04:00-05:30"}',
        ),
        (dt.date(2024, 1, 1), '{"$date":"2024-01-01"}'),
        (dt.time(23, 59, 1), '{"$time":"23:59:01"}'),
        (dt.time(0, 0, 0, 5), '{"$time":"00:00:00.000005"}'),
        (Decimal("1.50"), '{"$decimal":"1.50"}'),  # its exact str: the scale is kept
        (Decimal("-1E+3"), '{"$decimal":"-1E+3"}'),
        (b"\x00\xff hi", '{"$bytes":"AP8gaGk="}'),  # standard base64
        (bytearray(b""), '{"$bytes":""}'),
    ],
)
def test_each_source_type_has_one_tagged_text(value: Any, tagged: str) -> None:
    item = {"id": "k", "v": value}
    assert canonical_source_json(item) == f'tagged:{{"id":"k","v":{tagged}}}'
    assert fingerprint_of(item) == digest(canonical_source_json(item).encode())[:32]
    assert decode_source_json(canonical_source_json(item)) == {"id": "k", "v": value}


def test_a_tagged_item_escapes_its_own_dollar_keys() -> None:
    item = {"$date": "2024-01-01", "$$x": {"$bytes": 1}, "at": dt.date(2024, 1, 1)}
    text = canonical_source_json(item)
    assert text == 'tagged:{"$$$x":{"$$bytes":1},"$$date":"2024-01-01","at":{"$date":"2024-01-01"}}'
    assert decode_source_json(text) == item
    # an int key becomes text, as in canonical_json
    assert decode_source_json(canonical_source_json({1: dt.date(2024, 1, 1)})) == {"1": dt.date(2024, 1, 1)}


def test_json_native_items_keep_their_canonical_json() -> None:
    item = {"id": "k", "$date": "2024-01-01", "v": [1, 1.0, None, {"$bytes": "AP8="}]}
    assert canonical_source_json(item) == canonical_json(item)
    assert decode_source_json(canonical_source_json(item)) == item


def test_no_type_collides_with_its_text() -> None:
    day = dt.date(2024, 1, 1)
    looks_alike = [
        {"d": "2024-01-01"},  # the string
        {"d": {"$date": "2024-01-01"}},  # the string in a dict shaped like the tag
        {"d": {"$date": "2024-01-01"}, "e": day},  # ... beside a tagged value (escaped)
        {"d": day, "e": day},
        {"d": day},
        {"d": dt.datetime(2024, 1, 1)},
        {"d": "AP8="},
        {"d": b"\x00\xff"},
        {"d": "1.5"},
        {"d": 1.5},
        {"d": Decimal("1.5")},
        {"d": Decimal("1.50")},
        {"d": dt.time(1)},
        {"d": "01:00:00"},
    ]
    texts = [canonical_source_json(v) for v in looks_alike]
    assert len(set(texts)) == len(texts)
    assert len({fingerprint_of(v) for v in looks_alike}) == len(looks_alike)
    assert fingerprint_of({"d": "2024-01-01"}) != fingerprint_of({"d": dt.date(2024, 1, 1)})
    assert [decode_source_json(t) for t in texts] == looks_alike


OFFSETS = [UTC, dt.timezone(dt.timedelta(hours=5, minutes=30)), dt.timezone(dt.timedelta(hours=-11))]
source_scalars = (
    json_scalars
    | st.text(max_size=6)
    | st.datetimes(timezones=st.none() | st.sampled_from(OFFSETS))
    | st.dates()
    | st.times()
    | st.decimals(allow_nan=False)
    | st.binary(max_size=6)
)
source_values = st.recursive(
    source_scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["a", "$a", "$$a", "$date", "b"]), inner, max_size=3)
    ),
    max_leaves=12,
)


@settings(max_examples=examples(300), deadline=None, derandomize=True)
@given(source_values)
def test_the_canonical_text_of_a_source_value_decodes_to_the_same_value(value: Any) -> None:
    text = canonical_source_json(value)
    back = decode_source_json(text)
    assert canonical_source_json(back) == text  # so the same fingerprint after a snapshot
    assert _exactly(back) == _exactly(value)


def _exactly(value: Any) -> Any:
    """What equality does not see: each value's type and exact text (a Decimal's scale, a float's sign)."""
    if isinstance(value, dict):
        return sorted((k, _exactly(v)) for k, v in value.items())
    if isinstance(value, list):
        return [_exactly(v) for v in value]
    text = value.isoformat() if isinstance(value, (dt.date, dt.time)) else repr(value)
    return (type(value).__name__, text)


def test_a_source_value_of_no_supported_type_is_named() -> None:
    with pytest.raises(InvalidValueError) as info:
        canonical_source_json({"at": dt.date(2024, 1, 1), "s": {1}})
    assert str(info.value) == (
        "source item is not JSON-serializable (Object of type set is not JSON serializable) and not a "
        "datetime, date, time, Decimal or bytes; convert it to dicts, lists, str, int, float, bool, None or "
        "one of those types"
    )
    with pytest.raises(InvalidValueError, match="Decimal NaN"):
        canonical_source_json({"d": [Decimal("sNaN")]})
    with pytest.raises(InvalidValueError, match="contains NaN or Infinity"):
        canonical_source_json({"d": dt.date(2024, 1, 1), "x": math.nan})
    cyclic: list[Any] = [dt.date(2024, 1, 1)]
    cyclic.append(cyclic)
    with pytest.raises(InvalidValueError, match="reference cycle"):
        canonical_source_json(cyclic)


# --- value encoding --------------------------------------------------------------------------


@pytest.mark.parametrize("raw", [b"", b"\x00\xff", bytearray(b"abc"), memoryview(b"xyz")])
def test_bytes_always_go_to_the_blob(raw: Any) -> None:
    enc = encode_value(raw)
    assert enc.kind == VALUE_KIND_BYTES
    assert enc.json_text is None
    assert enc.blob == bytes(raw)
    assert enc.size == len(bytes(raw))


def test_threshold_is_measured_in_utf8_bytes_and_is_inclusive() -> None:
    # '"' + n chars + '"' is n + 2 bytes of canonical JSON
    at = encode_value("x" * 98, blob_threshold=100)
    assert (at.kind, at.size, at.blob) == (VALUE_KIND_JSON, 100, None)
    assert at.json_text == '"' + "x" * 98 + '"'
    over = encode_value("x" * 99, blob_threshold=100)
    assert over.kind == VALUE_KIND_JSON
    assert over.json_text is None
    assert over.blob == ('"' + "x" * 99 + '"').encode()
    assert over.size == 101
    # 'é' is two bytes in UTF-8: 49 of them are 100 bytes with the quotes, 50 are 102
    assert encode_value("é" * 49, blob_threshold=100).json_text is not None
    assert encode_value("é" * 50, blob_threshold=100).json_text is None


def test_default_threshold_is_16_kib() -> None:
    assert DEFAULT_BLOB_THRESHOLD == 16 * 1024
    assert encode_value("x" * (16 * 1024 - 2)).json_text is not None
    assert encode_value("x" * (16 * 1024 - 1)).json_text is None


def test_digest_identifies_content_not_representation() -> None:
    assert encode_value({"a": 1, "b": 2}).digest == encode_value({"b": 2, "a": 1}).digest
    assert encode_value({"a": 1}).digest != encode_value({"a": 2}).digest
    # the digest of a large value is the same whether it is inline or in the blob
    big = {"text": "y" * 500}
    assert encode_value(big, blob_threshold=10).digest == encode_value(big).digest


def test_blob_ref_loads_lazily() -> None:
    calls: list[str] = []

    def loader(event_id: str) -> bytes:
        calls.append(event_id)
        return b'{"a":[1,2]}'

    ref = BlobRef("e1", VALUE_KIND_JSON, 11, "d", loader)
    assert calls == []
    assert ref.load() == {"a": [1, 2]}
    assert calls == ["e1"]
    raw = BlobRef("e2", VALUE_KIND_BYTES, 3, "d", lambda _: b"\x00\x01\x02")
    assert raw.load() == b"\x00\x01\x02"
    with pytest.raises(InvalidValueError, match="load_blob"):
        BlobRef("e3", VALUE_KIND_BYTES, 3, "d").load()


# --- event ids -------------------------------------------------------------------------------

BASE_PARTS: tuple[object, ...] = ("fp1", "v1", "running", "Sequence", "gen", None, None, 0, None, "f", "d")


def test_event_id_is_deterministic_and_well_formed() -> None:
    a = event_id_for("5", 3, "FIELD_SET", *BASE_PARTS)
    assert a == event_id_for("5", 3, "FIELD_SET", *BASE_PARTS)
    assert len(a) == 32
    int(a, 16)
    key = event_key_of(a)
    assert -(2**63) <= key < 2**63
    assert key == event_key_of(a)
    assert event_key_of("ffffffffffffffff" + "0" * 16) == -1
    assert event_key_of("7fffffffffffffff" + "0" * 16) == 2**63 - 1


@pytest.mark.parametrize("index", range(len(BASE_PARTS)))
def test_event_id_is_sensitive_to_every_part(index: int) -> None:
    base = event_id_for("5", 3, "FIELD_SET", *BASE_PARTS)
    changed = list(BASE_PARTS)
    changed[index] = "other" if changed[index] is None else None
    assert event_id_for("5", 3, "FIELD_SET", *changed) != base


def test_event_id_is_sensitive_to_item_seq_and_type() -> None:
    base = event_id_for("5", 3, "FIELD_SET", *BASE_PARTS)
    assert event_id_for("6", 3, "FIELD_SET", *BASE_PARTS) != base
    assert event_id_for("5", 4, "FIELD_SET", *BASE_PARTS) != base
    assert event_id_for("5", 3, "FIELD_APPEND", *BASE_PARTS) != base


def test_event_id_parts_do_not_run_together() -> None:
    # a separator keeps ("ab", "c") and ("a", "bc") apart
    assert event_id_for("5", 1, "T", "ab", "c") != event_id_for("5", 1, "T", "a", "bc")
    assert event_id_for("5", 1, "T", "a", None) != event_id_for("5", 1, "T", None, "a")


# --- ids as the writer builds them -----------------------------------------------------------


def _rows(
    tmp_path: Path,
    build: Callable[[Batch], None],
    *,
    writer_id: str = "w1",
    epoch: int = 1,
    airflow: dict[str, Any] | None = None,
    processor_version: str | None = None,
) -> list[dict[str, Any]]:
    """The rows one batch would append, captured before they reach Lance (the log stays empty)."""
    log = open_log(tmp_path, "e", pipeline="p")
    captured: list[pa.Table] = []
    log.append = captured.append  # type: ignore[method-assign]
    w = log.writer(writer_id, epoch, airflow=airflow, processor_version=processor_version)
    with w.batch() as b:
        build(b)
    assert len(captured) == 1
    return captured[0].to_pylist()


def _ids(tmp_path: Path, build: Callable[[Batch], None], **kw: Any) -> list[str]:
    return [r["event_id"] for r in _rows(tmp_path, build, **kw)]


def _lifecycle(b: Batch, *, fp: str = "f1", value: Any = None, step: str = "gen") -> None:
    b.item_created("5", input_fingerprint=fp)
    b.step_started("5", step=step)
    b.field_set("5", "answer", {"text": "hi"} if value is None else value)
    b.field_append("5", "votes", 3)
    b.failed("5", error=ValueError("boom"), step=step)
    b.step_completed("5", step=step)
    b.terminal("5", status="completed")


def test_writer_ids_ignore_writer_epoch_time_and_forensics(tmp_path: Path) -> None:
    first = _rows(tmp_path, _lifecycle)
    again = _rows(
        tmp_path,
        _lifecycle,
        writer_id="another-writer",
        epoch=7,
        airflow={"dag_id": "d", "run_id": "r", "task_id": "t", "map_index": 3, "try_number": 2},
    )
    assert [r["event_id"] for r in first] == [r["event_id"] for r in again]
    assert [r["event_key"] for r in first] == [event_key_of(r["event_id"]) for r in first]
    assert [r["item_seq"] for r in first] == list(range(7))
    assert len({r["event_id"] for r in first}) == 7
    assert again[0]["writer_id"] == "another-writer" and again[0]["dag_id"] == "d"


def test_writer_ids_ignore_tracebacks(tmp_path: Path) -> None:
    a = _ids(tmp_path, lambda b: b.failed("5", error="boom", traceback="tb one"))
    assert a == _ids(tmp_path, lambda b: b.failed("5", error="boom", traceback="tb two"))
    assert a != _ids(tmp_path, lambda b: b.failed("5", error="bang", traceback="tb one"))
    assert a != _ids(tmp_path, lambda b: b.failed("5", error=RuntimeError("boom")))


def test_writer_ids_change_exactly_where_identity_changes(tmp_path: Path) -> None:
    base = _ids(tmp_path, _lifecycle)
    # the fingerprint is part of every event of the generation
    assert not set(base) & set(_ids(tmp_path, lambda b: _lifecycle(b, fp="f2")))
    # a different value changes only the FIELD_SET event
    other_value = _ids(tmp_path, lambda b: _lifecycle(b, value={"text": "other"}))
    assert [i for i, (x, y) in enumerate(zip(base, other_value)) if x != y] == [2]
    # a different step changes the events that carry it: started, failed, completed
    other_step = _ids(tmp_path, lambda b: _lifecycle(b, step="gen2"))
    assert [i for i, (x, y) in enumerate(zip(base, other_step)) if x != y] == [1, 4, 5]


@pytest.mark.parametrize(
    ("one", "two"),
    [
        (lambda b: b.field_set("5", "a", 1), lambda b: b.field_set("5", "b", 1)),
        (lambda b: b.field_set("5", "a", 1), lambda b: b.field_append("5", "a", 1)),
        (lambda b: b.field_set("5", "a", 1), lambda b: b.field_set("5", "a", 1, step="s")),
        (lambda b: b.field_set("5", "a", "x"), lambda b: b.field_set("5", "a", b'"x"')),
        (lambda b: b.terminal("5", status="completed"), lambda b: b.terminal("5", status="filtered")),
        (
            lambda b: b.terminal("5", status="filtered", reason="short"),
            lambda b: b.terminal("5", status="filtered", reason="empty"),
        ),
        (lambda b: b.step_started("5", step="s"), lambda b: b.step_started("5", step="s", iteration=1)),
        (lambda b: b.step_started("5", step="s"), lambda b: b.step_started("5", step="s", step_kind="Loop")),
        (
            lambda b: b.step_completed("5", step="s"),
            lambda b: b.step_completed("5", step="s", enclosing_step="outer"),
        ),
        (
            lambda b: b.step_completed("5", step="s"),
            lambda b: b.step_completed("5", step="s", selector_step="route"),
        ),
        (
            lambda b: b.step_completed("5", step="s"),
            lambda b: b.step_completed("5", step="s", fanout_index=2),
        ),
        (
            lambda b: b.step_completed("5", step="s", processor_version="v1"),
            lambda b: b.step_completed("5", step="s", processor_version="v2"),
        ),
        (
            lambda b: b.item_created("5", input_fingerprint="f", processor_version="v1"),
            lambda b: b.item_created("5", input_fingerprint="f", processor_version="v2"),
        ),
        (lambda b: b.item_created("5", input_fingerprint="f"), lambda b: b.item_created("6", input_fingerprint="f")),
    ],
)
def test_each_identity_part_changes_the_writer_id(
    tmp_path: Path, one: Callable[[Batch], None], two: Callable[[Batch], None]
) -> None:
    assert _ids(tmp_path, one) != _ids(tmp_path, two)


def test_non_identity_processor_version_is_not_part_of_field_ids(tmp_path: Path) -> None:
    # only ITEM_CREATED and STEP_COMPLETED carry the processor version in their identity
    a = _ids(tmp_path, lambda b: b.field_set("5", "a", 1), processor_version="v1")
    assert a == _ids(tmp_path, lambda b: b.field_set("5", "a", 1), processor_version="v2")


def test_bytes_and_large_json_rows(tmp_path: Path) -> None:
    big = {"text": "z" * (DEFAULT_BLOB_THRESHOLD + 10)}

    def build(b: Batch) -> None:
        b.field_set("5", "small", {"a": 1})
        b.field_set("5", "big", big)
        b.field_set("5", "raw", b"\x00\x01")

    small, large, raw = _rows(tmp_path, build)
    assert small["value_json"] == '{"a":1}' and small["value_blob"] is None
    assert large["value_json"] is None and large["value_kind"] == VALUE_KIND_JSON
    assert large["value_blob"] == canonical_json(big).encode()
    assert large["value_size"] == len(large["value_blob"])
    assert raw["value_json"] is None and raw["value_kind"] == VALUE_KIND_BYTES
    assert raw["value_blob"] == b"\x00\x01"


def _rich(b: Batch) -> None:
    _lifecycle(b)
    b.item_created("5/fan:0", input_fingerprint="f2", step="fan", step_kind="MapReduce", fanout_index=0)
    b.item_created("7", input_fingerprint="f3", parent_item_id="elsewhere", processor_version="v9")
    b.step_started("7", step="lp", step_kind="Loop", enclosing_step="a/b", iteration=2, selector_step="sel")
    b.field_set("7", "blob", b"\x00\x01")
    b.step_completed("7", step="lp", step_kind="Loop", enclosing_step="a/b", iteration=2, selector_step="sel")
    b.terminal("7", status="filtered", reason={"why": "short"})
    b.terminal("5/fan:0")


def test_writer_ids_are_event_id_for_of_the_stored_columns(tmp_path: Path) -> None:
    # The writer hashes precomputed id parts in bulk; the ids must stay those of event_id_for, which
    # is what retried batches and existing logs were written with.
    rows = _rows(tmp_path, _rich, processor_version="pv")
    sequenced = ("ITEM_CREATED", "STEP_COMPLETED")
    for r in rows:
        value = f"{r['value_kind']}:{r['value_digest']}" if r["value_kind"] is not None else None
        parts = (
            r["input_fingerprint"],
            r["processor_version"] if r["event_type"] in sequenced else None,
            r["status"],
            r["step_kind"],
            r["step"],
            r["enclosing_step"],
            r["selector_step"],
            r["iteration"],
            r["fanout_index"],
            r["field"],
            value,
            r["error_type"],
            r["error_message"],
        )
        assert r["event_id"] == event_id_for(r["item_id"], r["item_seq"], r["event_type"], *parts)
        assert r["event_key"] == event_key_of(r["event_id"])
    created = {r["item_id"]: r for r in rows if r["event_type"] == "ITEM_CREATED"}
    assert created["5/fan:0"]["parent_item_id"] == "5" and created["5/fan:0"]["root_item_id"] == "5"
    assert created["7"]["parent_item_id"] == "elsewhere" and created["5"]["parent_item_id"] is None
    assert {r["processor_version"] for r in rows if r["item_id"] == "7"} == {"v9", "pv"}


def test_writer_ids_hash_the_text_of_str_subclasses(tmp_path: Path) -> None:
    class Shouty(str):
        def __str__(self) -> str:
            return self.upper()

    plain = _ids(tmp_path, lambda b: b.item_created("abc", input_fingerprint="fp"))
    assert _ids(tmp_path, lambda b: b.item_created(Shouty("abc"), input_fingerprint=Shouty("fp"))) == plain
