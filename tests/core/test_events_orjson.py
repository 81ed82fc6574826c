"""The orjson path writes exactly the stdlib's canonical bytes, and hands back every value where it might not."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import hashlib
import json
import uuid
from decimal import Decimal

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_datagen.core.events import (
    canonical_json,
    canonical_source_json,
    encode_value,
    fingerprint_of,
    orjson_canonical,
    orjson_plain,
)
from airflow_provider_datagen.core.schema import VALUE_KIND_JSON
from airflow_provider_datagen.exceptions import InvalidValueError
from tests._support.profiles import examples

# The stdlib's canonical form, written out here so the test does not lean on the code under test.
STDLIB = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)

EDGE_FLOATS = [0.0, -0.0, 1e16, -1e16, 1e-7, 1e-5, 9.99e-5, 1e-4, 1.5e-4, 1e15, 1e22, 5e-324, 1.7976931348623157e308]
EDGE_INTS = [0, -1, 2**53 + 1, 2**63 - 1, -(2**63), 2**63, 2**64 - 1, 2**64, -(2**64), 10**40]
EDGE_TEXT = ["", "é", "😀", "\u2028\u2029", "\x7f", "\x00\x1f\b\f\n\r\t", '"\\/', "\ud800", "a\udfffb"]

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from(EDGE_INTS)
    | st.floats()
    | st.sampled_from(EDGE_FLOATS)
    | st.text()
    | st.sampled_from(EDGE_TEXT)
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.dictionaries(st.text(max_size=6) | st.sampled_from(EDGE_TEXT), inner, max_size=5)
    ),
    max_leaves=30,
)


def stdlib_bytes(value: object) -> bytes | None:
    try:
        return STDLIB.encode(value).encode("utf-8")
    except (ValueError, TypeError, UnicodeEncodeError):
        return None


@settings(max_examples=examples(3000), deadline=None, derandomize=True)
@given(values)
def test_orjson_bytes_equal_the_stdlib_canonical_bytes_or_orjson_declines(value: object) -> None:
    fast = orjson_canonical(value)
    if fast is not None:
        assert fast == stdlib_bytes(value)


@settings(max_examples=examples(1000), deadline=None, derandomize=True)
@given(
    st.dictionaries(st.text(max_size=8), st.floats(allow_nan=False, allow_infinity=False) | st.integers(), max_size=6)
)
def test_finite_numbers_of_every_magnitude_fingerprint_as_before(item: dict[str, object]) -> None:
    expected = stdlib_bytes(item)
    assert expected is not None
    assert canonical_json(item).encode("utf-8") == expected
    assert canonical_source_json(item).encode("utf-8") == expected


@pytest.mark.parametrize("value", [*EDGE_FLOATS, *EDGE_INTS, *EDGE_TEXT, {"b": 1e-7, "a": [1e16, -0.0]}])
def test_edge_values_encode_as_the_stdlib_does(value: object) -> None:
    expected = stdlib_bytes(value)
    fast = orjson_canonical(value)
    assert fast is None or fast == expected
    if expected is not None:
        assert canonical_json(value).encode("utf-8") == expected


def test_the_float_ranges_where_orjson_differs_are_declined() -> None:
    # the reason for the guard: orjson's own text differs from the stdlib's for these
    assert orjson.dumps(1e-5) != STDLIB.encode(1e-5).encode()
    assert orjson.dumps(1e-7) != STDLIB.encode(1e-7).encode()
    assert orjson.dumps(float("nan")) == b"null"
    for value in (1e-5, 1e-7, -3e-9, float("nan"), float("inf"), [float("-inf")]):
        assert not orjson_plain(value)
        assert orjson_canonical({"x": value}) is None


class Colour(enum.Enum):
    RED = "red"


class Level(enum.IntEnum):
    ONE = 1


class Text(str):
    pass


@dataclasses.dataclass
class Point:
    x: int


@pytest.mark.parametrize(
    "value",
    [uuid.UUID(int=7), Colour.RED, Level.ONE, Text("a"), Point(1), (1, 2), dt.date(2024, 1, 2), Decimal("1.5"), b"x"],
)
def test_types_orjson_would_encode_its_own_way_take_the_stdlib_path(value: object) -> None:
    assert orjson_canonical({"v": value}) is None
    assert orjson_canonical([value]) is None


def test_non_str_keys_and_wide_ints_take_the_stdlib_path() -> None:
    assert orjson_canonical({1: "a"}) is None
    assert canonical_json({1: "a"}) == '{"1":"a"}'
    assert orjson_canonical({"n": 2**64}) is None
    assert canonical_json({"n": 2**64}) == '{"n":18446744073709551616}'


def test_errors_are_the_stdlib_paths() -> None:
    with pytest.raises(InvalidValueError, match="lone surrogate"):
        fingerprint_of({"id": "a", "t": "\ud800"})
    with pytest.raises(InvalidValueError, match="NaN or Infinity"):
        fingerprint_of({"id": "a", "x": float("nan")})
    with pytest.raises(InvalidValueError, match="not JSON-serializable"):
        fingerprint_of({"id": "a", "u": uuid.UUID(int=1)})


@settings(max_examples=examples(300), deadline=None, derandomize=True)
@given(st.text() | st.sampled_from(EDGE_TEXT))
def test_encode_value_of_a_str_is_the_canonical_encoding(text: str) -> None:
    """encode_value's str fast path (orjson straight away) gives the text, size and digest the general path
    (the stdlib's canonical form) gives; a lone surrogate still raises the general path's error."""
    try:
        expected = STDLIB.encode(text).encode("utf-8")
    except UnicodeEncodeError:
        with pytest.raises(InvalidValueError, match="lone surrogate"):
            encode_value(text, what="field 'x'")
        return
    enc = encode_value(text)
    assert (enc.kind, enc.json_text, enc.blob, enc.size, enc.digest) == (
        VALUE_KIND_JSON,
        expected.decode("utf-8"),
        None,
        len(expected),
        hashlib.sha256(expected).hexdigest(),
    )
    over = encode_value(text, blob_threshold=len(expected) - 1)
    assert (over.json_text, over.blob, over.digest) == (None, expected, enc.digest)
