"""The fast key-to-id rule, for one key and for a column of keys: when a source key is its own item id.

:func:`~airflow_provider_datagen.core.ids.root_item_id` is the rule (check the key, escape it into one
path segment). Most keys need neither: an int inside +-10**18, or a str of 1 to ``MAX_KEY_LENGTH``
characters with no NUL, ``%``, ``/`` or ``:`` (and no lone surrogate) is its own id. The planners'
fast paths take those keys as they are, one at a time (:func:`own_id`) or a column at a time
(:func:`own_id_array`), and send any other key to the general path, which applies ``root_item_id``
and raises its errors. A property test holds both forms to ``root_item_id`` wherever they answer.

Not in :mod:`~airflow_provider_datagen.core.ids` because this module needs pyarrow, which DAG parsing
(that imports ``ids`` for its name checks) must not pay for.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_datagen.core.ids import MAX_KEY_LENGTH, escape_key

#: An int key strictly inside these bounds is its own id (its digits); beyond them, the general path.
INT_KEY_MIN = -(10**18)
INT_KEY_MAX = 10**18

#: The characters a str key must not hold to be its own id: NUL (refused) and what escape_key escapes.
_ESCAPED_OR_REFUSED = "[\\x00%/:]"


def own_id(key: object) -> str | None:
    """``root_item_id(key)`` when ``key`` is its own id (see the module doc), else None."""
    kind = type(key)
    if kind is str:
        text: str = key  # type: ignore[assignment]  # narrowed by the exact type test
        if not (0 < len(text) <= MAX_KEY_LENGTH) or "\x00" in text or escape_key(text) is not text:
            return None
        if not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                return None  # a lone surrogate: root_item_id refuses it
        return text
    if kind is int and INT_KEY_MIN < key < INT_KEY_MAX:  # type: ignore[operator]  # an int, by the test
        return str(key)
    return None


def own_id_array(keys: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray | None:
    """The item ids of a key column when every key is its own id (a string column), else None."""
    kind = keys.type
    if pa.types.is_integer(kind):
        bounds = pc.min_max(keys)
        low, high = bounds["min"].as_py(), bounds["max"].as_py()
        if low is None or not INT_KEY_MIN < low <= high < INT_KEY_MAX:
            return None
        return pc.cast(keys, pa.string())
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        return None
    keys = pc.cast(keys, pa.string())
    lengths = pc.min_max(pc.utf8_length(keys))
    low, high = lengths["min"].as_py(), lengths["max"].as_py()
    if low is None or low == 0 or high > MAX_KEY_LENGTH:
        return None
    if keys.null_count or pc.any(pc.match_substring_regex(keys, _ESCAPED_OR_REFUSED)).as_py():
        return None
    return keys


def all_own_ids(ids: list[str]) -> bool:
    """Whether every str of ``ids`` is its own id: :func:`own_id_array`'s rule over the whole list at once."""
    return not ids or own_id_array(pa.array(ids, pa.string())) is not None
