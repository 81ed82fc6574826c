"""Item ids as materialized paths, reversible escaping of source keys, and name validation."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_datagen.core.ids import (
    MAX_KEY_LENGTH,
    check_name,
    child_item_id,
    depth_of,
    escape_key,
    key_of,
    parent_of,
    root_item_id,
    root_of,
    unescape_key,
)
from airflow_provider_datagen.exceptions import DatagenError, InvalidItemError, InvalidNameError

# Any valid key: non-empty text without NUL (refused on purpose), within the length limit.
keys = st.text(min_size=1, max_size=200).filter(lambda s: "\x00" not in s)


def test_root_and_child_ids_compose_as_paths() -> None:
    assert root_item_id("5") == "5"
    assert root_item_id(5) == "5"
    child = child_item_id("5", "solve_twice", 0)
    assert child == "5/solve_twice:0"
    grandchild = child_item_id(child, "vote", 12)
    assert grandchild == "5/solve_twice:0/vote:12"
    assert parent_of(grandchild) == child
    assert parent_of(child) == "5"
    assert parent_of("5") is None
    assert root_of(grandchild) == "5"
    assert depth_of("5") == 0
    assert depth_of(grandchild) == 2
    assert key_of(grandchild) == "5"


def test_a_path_key_is_one_root_item() -> None:
    rid = root_item_id("a/b.txt")
    assert rid == "a%2Fb.txt"
    assert "/" not in rid
    assert depth_of(rid) == 0
    assert parent_of(rid) is None
    assert root_of(rid) == rid
    assert key_of(rid) == "a/b.txt"
    child = child_item_id(rid, "split", 3)
    assert root_of(child) == rid
    assert parent_of(child) == rid
    assert key_of(child) == "a/b.txt"


@pytest.mark.parametrize(
    ("key", "escaped"),
    [
        ("%", "%25"),
        ("%2F", "%252F"),
        ("a:b", "a%3Ab"),
        ("s3://bucket/x", "s3%3A%2F%2Fbucket%2Fx"),
        ("100%/done", "100%25%2Fdone"),
    ],
)
def test_escaping_of_reserved_characters(key: str, escaped: str) -> None:
    assert root_item_id(key) == escaped
    assert key_of(escaped) == key


@given(keys)
def test_escaping_round_trips_any_text_key(key: str) -> None:
    rid = root_item_id(key)
    assert key_of(rid) == key
    assert unescape_key(escape_key(key)) == key
    assert "/" not in rid
    assert ":" not in rid
    assert depth_of(rid) == 0
    assert root_of(child_item_id(rid, "s", 1)) == rid


@given(keys, keys)
def test_escaping_is_injective(a: str, b: str) -> None:
    if a != b:
        assert root_item_id(a) != root_item_id(b)


@pytest.mark.parametrize("bad", ["", "a\x00b", True, None, 1.5, b"bytes", ["x"], "x" * (MAX_KEY_LENGTH + 1), "a\ud800"])
def test_bad_keys_are_refused(bad: object) -> None:
    with pytest.raises(InvalidItemError) as info:
        root_item_id(bad)
    assert isinstance(info.value, DatagenError)
    assert "key" in str(info.value)


def test_longest_key_is_accepted() -> None:
    assert key_of(root_item_id("k" * MAX_KEY_LENGTH)) == "k" * MAX_KEY_LENGTH


@pytest.mark.parametrize("index", [-1, True, 1.0, "0", None])
def test_bad_fanout_index_is_refused(index: object) -> None:
    with pytest.raises(InvalidItemError, match="fan-out index"):
        child_item_id("5", "s", index)  # type: ignore[arg-type]


def test_child_step_name_is_validated() -> None:
    with pytest.raises(InvalidNameError):
        child_item_id("5", "a/b", 0)
    with pytest.raises(InvalidNameError):
        child_item_id("5", "a:b", 0)


@pytest.mark.parametrize(
    "name",
    ["qa", "e1", "my-pipeline", "exp_2024.01", "A", "0", "x" * 128, "v1.2-rc_3"],
)
def test_good_names_pass(name: str) -> None:
    assert check_name(name, "pipeline") == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        "a/b",
        "/abs",
        "/",
        "C:\\dir",
        "a\\b",
        "..",
        ".",
        "a..b",
        "../etc",
        ".hidden",
        "-flag",
        "_private",
        "a b",
        "qa\n",  # a trailing newline must not slip through a `$` anchor
        "\nqa",
        "qa\r",
        "q\ta",
        "qa\x00",
        "\x00",
        "qa\x7f",
        "qa\x1b[31m",
        "ｑａ",  # fullwidth letters
        "qa\u0301",  # combining acute accent
        "q\u200ba",  # zero-width space
        "\u0430bc",  # Cyrillic a
        "ℌ",  # NFKC folds to H
        "ﬁle",  # ligature
        "x" * 129,
        "s3:bucket",
        "a%2Fb",
        "a*",
    ],
)
def test_bad_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidNameError) as info:
        check_name(name, "experiment")
    message = str(info.value)
    assert "experiment name" in message
    # the message tells how to fix it and never echoes raw control characters
    assert "use" in message
    assert "\n" not in message
    assert "\x00" not in message


@pytest.mark.parametrize("name", [None, 3, b"qa", ["qa"]])
def test_non_string_names_are_refused(name: object) -> None:
    with pytest.raises(InvalidNameError, match="must be a string"):
        check_name(name, "pipeline")


@given(st.text(min_size=1, max_size=40))
def test_accepted_names_are_safe_path_segments(name: str) -> None:
    try:
        check_name(name, "pipeline")
    except InvalidNameError:
        return
    assert name.isascii()
    assert name.isprintable()
    assert "/" not in name and "\\" not in name and ":" not in name
    assert ".." not in name
    assert not name.startswith(".")
    assert len(name) <= 128
