"""The fast key-to-id rule (core/key_ids.py) answers as root_item_id does, for one key and for a column."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_datagen.core.ids import MAX_KEY_LENGTH, root_item_id
from airflow_provider_datagen.core.key_ids import INT_KEY_MAX, INT_KEY_MIN, all_own_ids, own_id, own_id_array
from airflow_provider_datagen.exceptions import InvalidItemError

# keys near every edge: the escaped and refused characters, lone surrogates, the length and int bounds
_TEXT = st.text(alphabet=st.sampled_from(["a", "Z", "0", "%", "/", ":", "\x00", "é", "\ud800", " "]), max_size=6)
_KEYS = st.one_of(
    _TEXT,
    st.integers(min_value=INT_KEY_MIN - 2, max_value=INT_KEY_MAX + 2),
    st.sampled_from([INT_KEY_MIN, INT_KEY_MAX, INT_KEY_MIN + 1, INT_KEY_MAX - 1, 2**70, True, False, None, 1.5]),
    st.just("k" * MAX_KEY_LENGTH),
    st.just("k" * (MAX_KEY_LENGTH + 1)),
)


def _general(key: Any) -> str | None:
    try:
        return root_item_id(key)
    except InvalidItemError:
        return None


@given(_KEYS)
def test_a_key_that_is_its_own_id_is_what_root_item_id_gives(key: Any) -> None:
    got = own_id(key)
    if got is not None:
        assert got == root_item_id(key)
    if type(key) is str:
        # its own id exactly when the general rule leaves it as it is (no escape, no refusal)
        assert (got is not None) == (_general(key) == key)
    elif type(key) is int:
        assert (got is not None) == (INT_KEY_MIN < key < INT_KEY_MAX)
    else:
        assert got is None  # bool, None, float: the general path names the refusal


@given(st.lists(_KEYS, min_size=1, max_size=8))
def test_a_key_column_is_its_own_ids_exactly_when_every_key_is(keys: list[Any]) -> None:
    kinds = {type(k) for k in keys}
    if kinds not in ({str}, {int}) or any(own_id(k) is None and type(k) is str and _surrogate(k) for k in keys):
        return  # Arrow holds one type per column, and no lone surrogate
    if kinds == {int} and not all(-(2**63) <= k < 2**63 for k in keys):
        return
    column = pa.array(keys)
    got = own_id_array(column)
    scalar = [own_id(k) for k in keys]
    if got is None:
        assert None in scalar
    else:
        assert None not in scalar
        assert got.to_pylist() == scalar == [root_item_id(k) for k in keys]
    if kinds == {str}:
        assert all_own_ids(keys) == (got is not None)


def _surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("plain", "plain"),
        (7, "7"),
        ("a/b", None),
        ("50%", None),
        ("x:y", None),
        ("", None),
        (True, None),
        (10**18, None),
    ],
)
def test_the_rule_on_named_keys(key: Any, expected: str | None) -> None:
    assert own_id(key) == expected
