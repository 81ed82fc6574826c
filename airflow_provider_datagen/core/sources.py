"""Source items: validation, identity (key -> item id) and input fingerprints, and file readers.

An item's identity is its source key plus its input fingerprint (a digest of the whole item's
canonical text, see ``events.canonical_source_json``), never its position, so reordering a source
changes nothing, an edited item is pending again and a renamed key is a new item.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Iterator, Mapping
from itertools import chain
from operator import itemgetter
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from airflow_provider_datagen.core import jsonl
from airflow_provider_datagen.core.events import (
    _FAST,
    ORJSON_OPTIONS,
    canonical_source_bytes,
    fingerprint_array,
    orjson_canonical,
    orjson_plain,
)
from airflow_provider_datagen.core.ids import root_item_id
from airflow_provider_datagen.core.key_ids import INT_KEY_MAX, INT_KEY_MIN, all_own_ids, own_id, own_id_array
from airflow_provider_datagen.core.store.lance_io import read_lance_table
from airflow_provider_datagen.core.store.paths import open_input_file
from airflow_provider_datagen.core.uri import has_scheme
from airflow_provider_datagen.exceptions import InvalidItemError, bad_argument


class SourceItem:
    """One validated source item: its id, key, input fingerprint and position in the source.

    The item's dict is held as given, not copied: a 1M-item source would otherwise keep a second
    million dicts alive through planning (about 190 MB). :attr:`data` hands out a fresh shallow copy
    on each read instead, so a processing function that edits its input never touches the caller's
    dicts, as before; only the items a run actually processes pay for a copy.
    """

    __slots__ = ("_data", "fingerprint", "item_id", "key", "position")

    item_id: str
    key: str
    fingerprint: str
    position: int
    _data: Mapping[str, Any]

    def __init__(self, item_id: str, key: str, data: Mapping[str, Any], fingerprint: str, position: int) -> None:
        # the slots' own setters: half the cost of object.__setattr__ (bound after the class, below)
        _set_item_id(self, item_id)
        _set_key(self, key)
        _set_data(self, data)
        _set_fingerprint(self, fingerprint)
        _set_position(self, position)

    @property
    def data(self) -> dict[str, Any]:
        """A shallow copy of the item's dict (the fingerprint was taken of this content)."""
        return dict(self._data)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"SourceItem is immutable; cannot set {name!r}")

    def __reduce__(self) -> tuple[Any, ...]:
        # pickle and copy rebuild through __init__ (slot-by-slot restore would hit __setattr__)
        return (SourceItem, (self.item_id, self.key, self._data, self.fingerprint, self.position))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SourceItem):
            return NotImplemented
        return (self.item_id, self.key, self.fingerprint, self.position, dict(self._data)) == (
            other.item_id,
            other.key,
            other.fingerprint,
            other.position,
            other.data,  # a copy already
        )

    __hash__ = None  # type: ignore[assignment]  # equal by content, like the dataclass it replaced

    def __repr__(self) -> str:
        return (
            f"SourceItem(item_id={self.item_id!r}, key={self.key!r}, data={dict(self._data)!r}, "
            f"fingerprint={self.fingerprint!r}, position={self.position!r})"
        )


_set_item_id, _set_key, _set_data, _set_fingerprint, _set_position = (
    SourceItem.__dict__[name].__set__ for name in ("item_id", "key", "_data", "fingerprint", "position")
)


class _DraftItem(SourceItem):
    """How :func:`prepare_items` builds a :class:`SourceItem` cheaply: plain slot stores, then it becomes one.

    Same slots, no ``__dict__``, so the instance can take ``SourceItem`` as its class as the last step
    of ``__init__``; from then on it is an ordinary, immutable ``SourceItem`` (``type(x) is SourceItem``)
    and no ``_DraftItem`` ever escapes. About half the cost of ``SourceItem(...)``, which has to store
    through the slot descriptors around its own raising ``__setattr__`` (and a third of ``object.__setattr__``).
    """

    __slots__ = ()
    __setattr__ = object.__setattr__  # type: ignore[assignment]  # plain stores while a draft

    def __init__(self, item_id: str, key: str, data: Mapping[str, Any], fingerprint: str, position: int) -> None:
        self.item_id = item_id
        self.key = key
        self._data = data
        self.fingerprint = fingerprint
        self.position = position
        self.__class__ = SourceItem  # type: ignore[assignment]


def prepare_items(
    items: Iterable[Any], key_field: str = "id", start: int = 0, *, texts: list[bytes] | None = None
) -> list[SourceItem]:
    """Validate every item before anything is written: dicts, keyed, unique keys, of encodable source values.

    ``start``: the position of the first item in its whole source (a streamed batch's), so an error
    names an item by its place in the source, as an unstreamed read would. ``texts``: a list that
    gets each item's canonical text (UTF-8, what its fingerprint digests), in order, so a caller that
    stores it (an inline source's snapshot) does not encode the items a second time.
    """
    if isinstance(items, (str, bytes, Mapping)):
        raise InvalidItemError(
            f"items must be an iterable of dicts, got a {type(items).__name__}; wrap a single item in a list"
        )
    if not isinstance(key_field, str) or not key_field:
        raise InvalidItemError(f"key_field {key_field!r} must be a non-empty string")
    out: list[SourceItem] = []
    seen: dict[str, int] = {}
    if _FAST is None:  # no C encoder: every item takes the general path
        for pos, item in enumerate(items, start):
            out.append(_prepare_one(pos, item, key_field, seen, texts))
        return out
    # The common case inline: a plain dict keyed by a str or a small int that needs no escaping, encoded
    # by the C encoder. It computes exactly what the general path would (the same encoder call as
    # canonical_json, the same digest as fingerprint_of, the key as its own id as root_item_id gives it)
    # and records nothing until the item is known good; anything else (another mapping, a missing,
    # escaped, long or odd key, a duplicate, any encoding error or lone surrogate, a datetime, date,
    # time, Decimal or bytes value, whose tagged text only fingerprint_of builds) goes to
    # _prepare_one, which redoes the item with the public functions and raises their errors, so results
    # and errors, and the item that raises first, are the same as on the general path alone.
    append = out.append
    encode = _FAST
    sha256 = hashlib.sha256
    draft = _DraftItem
    missing = _MISSING
    for pos, item in enumerate(items, start):
        if type(item) is dict:
            iid = own_id(item.get(key_field, missing))  # None: the general path checks and escapes the key
            if iid is not None and iid not in seen:
                raw = orjson_canonical(item)
                if raw is None:
                    try:
                        raw = "".join(encode(item, 0)).encode("utf-8")
                    except Exception:
                        raw = None  # _prepare_one re-encodes through canonical_json and raises its error
                if raw is not None:
                    seen[iid] = pos
                    append(draft(iid, iid, item, sha256(raw).hexdigest()[:32], pos))
                    if texts is not None:
                        texts.append(raw)
                    continue
        append(_prepare_one(pos, item, key_field, seen, texts))
    return out


_MISSING = object()
_PLAIN = frozenset((str, int, bool, type(None)))


def row_ids(rows: list[Any], key_field: str) -> list[str] | None:
    """The item ids :func:`fingerprint_rows` gives plain dict rows, before it checks their characters.

    A str key as it is and an int key inside +-10**18 as its digits; None for a row that is not a
    dict (another mapping's ``[]`` may not be its content), a missing key, or a key of another type.
    One C-level pass each over the rows' types, the keys and the keys' types.
    """
    if set(map(type, rows)) - {dict}:
        return None
    try:
        keys = list(map(itemgetter(key_field), rows))
    except KeyError:
        return None
    kinds = set(map(type, keys))
    if not kinds <= _KEY_TYPES:
        return None
    if int in kinds:
        ints = [key for key in keys if type(key) is int]
        if not (min(ints) > INT_KEY_MIN and max(ints) < INT_KEY_MAX):
            return None
        return list(map(str, keys))  # str() of a str is the str itself
    return keys


def fingerprint_rows(
    rows: list[Any], key_field: str, *, plain: bool = False, ids: list[str] | None = None
) -> tuple[list[str], pa.Array] | None:
    """Item ids and input fingerprints of plain rows, fast; None as soon as a row needs :func:`prepare_items`.

    Plain: a dict keyed by a str needing no escaping or a small int, of values orjson encodes as the
    stdlib does (``events.orjson_plain``). The ids and fingerprints (a string array) are exactly what
    ``prepare_items`` would give, without building an item per row; uniqueness is the caller's to check
    (a streamed plan checks it once over the whole source). Anything else, valid or not, is for
    ``prepare_items``, which builds it or raises the error naming it. ``plain=True`` says every value
    is already known plain (an Arrow batch of string, integer and boolean columns), so none is checked.
    ``ids``: what :func:`row_ids` gave for these rows, when the caller already asked it.
    """
    # Per row only what must be, the encoding and its digest, in one comprehension (the checks and
    # appends of a loop per row were a fifth of the time). The keys' characters and lengths are
    # checked once over all of them (key_ids.all_own_ids), and the digests turned to hex text in one call
    # (events.fingerprint_array).
    if ids is None:
        ids = row_ids(rows, key_field)
        if ids is None:
            return None
    if not plain:
        kinds = set(map(type, chain.from_iterable(map(dict.values, rows))))
        if not kinds <= _PLAIN and (
            kinds - _NESTED or not all(map(orjson_plain, chain.from_iterable(map(dict.values, rows))))
        ):
            return None  # a float outside the range both encoders print alike, or a non-JSON type
    dumps, options, sha256 = orjson.dumps, ORJSON_OPTIONS, hashlib.sha256
    try:
        digests = [sha256(dumps(row, option=options)).digest() for row in rows]
    except orjson.JSONEncodeError:
        return None  # a lone surrogate, an int past 64 bits, a non-str dict key
    if not all_own_ids(ids):
        return None
    return ids, fingerprint_array(digests)


_KEY_TYPES = frozenset((str, int))
_NESTED = _PLAIN | {float, list, dict}


def fingerprint_batch(batch: pa.RecordBatch, key_field: str) -> tuple[pa.Array, pa.Array] | None:
    """:func:`fingerprint_rows` of an Arrow batch of string, integer and boolean columns, a column at a time.

    Each row's canonical JSON is assembled from its columns' encodings instead of from a dict per row:
    orjson encodes a whole column in one call, numpy finds where each value's encoding starts, and
    Arrow joins the columns row by row, so per row only the digest is left to Python. The bytes are
    those of ``orjson_canonical(row)`` (held equal by a property test). None (take the row path) when
    a column is not of those types or has a null, a name repeats, or a key needs escaping or is refused.
    """
    names = batch.schema.names
    n = batch.num_rows
    if key_field not in names or len(set(names)) != len(names) or not n:
        return None
    ids = own_id_array(batch.column(key_field))  # first: a refused key makes the encodings wasted work
    if ids is None:
        return None
    args: list[Any] = []
    ordered = sorted(names)
    for j, name in enumerate(ordered):
        column = batch.column(name)
        if column.null_count:
            return None
        pieces = _encoded_column(column, n)
        if pieces is None:
            return None
        if j == len(ordered) - 1:
            pieces = pc.binary_slice(pieces, 0, -1)  # each piece ends with its separator: not the last column's
        args += [pa.scalar((b"{" if j == 0 else b"") + orjson.dumps(name) + b":", pa.binary()), pieces]
    args += [pa.scalar(b"}", pa.binary()), pa.scalar(b"", pa.binary())]
    rows = pc.binary_join_element_wise(*args)
    sha256 = hashlib.sha256
    return ids, fingerprint_array([sha256(raw).digest() for raw in rows.to_pylist()])


_QUOTE, _COMMA = ord('"'), ord(",")


def _encoded_column(column: pa.Array, n: int) -> pa.Array | None:
    """Each value's JSON encoding followed by a comma, as a binary array; None for another type."""
    kind = column.type
    quoted = pa.types.is_string(kind) or pa.types.is_large_string(kind)
    if not (quoted or pa.types.is_integer(kind) or pa.types.is_boolean(kind)):
        return None
    data = bytearray(orjson.dumps(column.to_pylist()))  # '[v0,v1,...]': one copy, to end the last value with ','
    data[-1] = _COMMA
    codes = np.frombuffer(data, dtype=np.uint8)
    commas = np.flatnonzero(codes[1:-1] == _COMMA) + 1  # not the last: it ends the last value
    if quoted:
        # A quote inside a string is escaped, so '","' is a comma between two values or a value's whole
        # text (the string ","): the count below tells them apart, as every separator is found.
        commas = commas[(codes[commas - 1] == _QUOTE) & (codes[commas + 1] == _QUOTE)]
    if len(commas) != n - 1 or len(data) >= 1 << 31:
        return None
    offsets = np.empty(n + 1, dtype=np.int32)
    offsets[0], offsets[n] = 1, len(data)  # after the '['
    offsets[1:n] = commas + 1
    return pa.BinaryArray.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _prepare_one(
    pos: int, item: Any, key_field: str, seen: dict[str, int], texts: list[bytes] | None = None
) -> SourceItem:
    """Validate and build one item through the public functions (the general path of prepare_items)."""
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
    # one str object for id and key when they are equal (no reserved characters): an int key
    # would otherwise be formatted twice, a second string per item
    text = key if isinstance(key, str) else str(key)
    key_s = iid if text == iid else text
    if iid in seen:
        raise InvalidItemError(
            f"duplicate key {str(key)[:200]!r} (items #{seen[iid]} and #{pos}); keys must be unique "
            "in one source: de-duplicate the source or choose another key_field"
        )
    seen[iid] = pos
    # a dict is kept as given (see SourceItem); other mappings become one, as JSON needs
    data = item if isinstance(item, dict) else dict(item)
    try:
        raw = canonical_source_bytes(data)
    except InvalidItemError:
        raise
    except Exception as exc:
        raise InvalidItemError(f"item {iid!r}: {exc}") from None
    if texts is not None:
        texts.append(raw)
    return SourceItem(iid, key_s, data, hashlib.sha256(raw).hexdigest()[:32], pos)


def source_path(source: Any) -> str:
    """The path or URI of a path source, checked: absolute, existing (when local), of a known format."""
    if not isinstance(source, (str, os.PathLike)):
        raise InvalidItemError(
            f"source must be a list of dicts or a path/URI to .jsonl, .parquet or .lance, got {type(source).__name__}"
        )
    path = os.fspath(source)
    lower = path.rstrip("/").lower()
    local = not has_scheme(path)
    if local and not os.path.isabs(path):
        # Each Airflow component runs in its own working directory: the rule the export's destination
        # and the connection's root follow.
        raise bad_argument(
            "read_source",
            "source",
            path,
            "is a relative path",
            "give an absolute path or a URI (each Airflow component has its own working directory)",
        )
    if local and not os.path.exists(path):
        raise InvalidItemError(f"source {path!r} does not exist; check the path")
    if not lower.endswith((".jsonl", ".ndjson", ".parquet", ".lance")):
        raise InvalidItemError(f"source {path!r}: unknown format; use a .jsonl, .parquet or .lance path")
    return path


def read_source(source: Any, *, storage_options: dict[str, str] | None = None) -> Iterator[dict[str, Any]]:
    """Iterate the dicts of a source: a list of dicts, or an absolute ``.jsonl``/``.parquet``/``.lance`` path or URI.

    Rows come as the format gives them (Arrow's ``to_pylist``: a timestamp column gives datetimes, a
    decimal column Decimals, a binary column bytes, a struct column dicts); see :func:`fingerprint_of`
    for how such values are fingerprinted. ``storage_options``: the datagen connection's, for a source
    on an object store (any format).
    """
    if isinstance(source, (list, tuple)):
        yield from source
        return
    path = source_path(source)
    lower = path.rstrip("/").lower()
    if lower.endswith(".jsonl") or lower.endswith(".ndjson"):
        # the plan's scan reads the same lines the same way (core/jsonl.py)
        with open_input_file(path, storage_options) as fh:
            for n, line in enumerate(jsonl.lines(fh), 1):
                if line.strip():
                    yield jsonl.source_row(line, path, n)
    elif lower.endswith(".parquet"):
        if not has_scheme(path):
            yield from _table_rows(pq.read_table(path))
        else:
            with open_input_file(path, storage_options) as fh:
                table = pq.read_table(fh)
            yield from _table_rows(table)
    elif lower.endswith(".lance"):
        yield from _table_rows(read_lance_table(path, storage_options))
    else:
        raise InvalidItemError(f"source {path!r}: unknown format; use a .jsonl, .parquet or .lance path")


def _table_rows(table: pa.Table) -> Iterator[dict[str, Any]]:
    for batch in table.to_batches(max_chunksize=10_000):
        yield from batch.to_pylist()


def load_source(
    source: Any,
    key_field: str = "id",
    *,
    storage_options: dict[str, str] | None = None,
    texts: list[bytes] | None = None,
) -> list[SourceItem]:
    """Read and validate a whole source (``storage_options``: see :func:`read_source`; ``texts``: see
    :func:`prepare_items`)."""
    return prepare_items(read_source(source, storage_options=storage_options), key_field, texts=texts)


def snapshot_digest(items: list[SourceItem]) -> str:
    """Content address of an inline source snapshot: its item ids and input fingerprints, in order."""
    h = hashlib.sha256()
    for s in items:
        h.update(s.item_id.encode("utf-8", "surrogatepass"))
        h.update(b"\x1f")
        h.update(s.fingerprint.encode())
        h.update(b"\n")
    return h.hexdigest()[:32]
