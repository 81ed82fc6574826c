"""Event records, canonical value encoding and deterministic event ids.

An event id hashes what the event *is* (item, sequence, type, coordinates, field, value digest), never
who wrote it or when, so a retried batch writes the same ids and the read path can de-duplicate, while
two different events at one ``item_seq`` get different ids and surface as a fencing violation.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import math
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import orjson
import pyarrow as pa

from airflow_provider_datagen.core.schema import (
    DEFAULT_BLOB_THRESHOLD,
    VALUE_KIND_BYTES,
    VALUE_KIND_JSON,
    EventType,
)
from airflow_provider_datagen.exceptions import InvalidValueError

if TYPE_CHECKING:
    from collections.abc import Callable

#: Joins the parts of an event's identity before hashing (see :func:`event_id_for`).
ID_SEP = "\x1f"
#: Event ids are the hex of a BLAKE2b digest of this many bytes (128 bits).
ID_DIGEST_SIZE = 16
# One encoder instance: json.dumps with keyword options builds a new encoder on every call.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _c_encoder() -> Any:
    """The C encoder ``_CANONICAL.encode`` builds on every call, built once (None if unavailable).

    Built without circular-reference markers: a shared marker map is neither thread-safe nor clean
    after an error. A cycle then ends in RecursionError, and any error re-encodes with
    ``_CANONICAL`` to raise its exact error. Used only if it agrees with ``_CANONICAL`` on a sample.
    """
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return None
    try:
        enc = make(None, _CANONICAL.default, json.encoder.encode_basestring, None, ":", ",", True, False, False)
        sample = {"b": [1, 2.5, -0.0, 1e300, None, True, "é\n\u2028"], "a": {"z": "", "y": 10**30}, "": "x"}
        if "".join(enc(sample, 0)) != _CANONICAL.encode(sample):
            return None
    except Exception:
        return None
    return enc


_FAST = _c_encoder()

# orjson writes the same canonical bytes as ``_CANONICAL`` for the values :func:`orjson_plain` admits
# (tests/core/test_events_orjson.py checks it on a property-based corpus) at about twice the speed.
# Where they can differ it is never asked: floats under 1e-4 in magnitude (orjson writes 0.00001 and
# 1e-7 where Python writes 1e-05 and 1e-07), NaN and Infinity (orjson writes null), and types orjson
# encodes natively but the stdlib refuses (UUID, Enum, dataclass, numpy, datetime) or encodes its own
# way (subclasses of str, int, dict, list; tuples); ints past 64 bits and lone surrogates make orjson
# raise, and the stdlib path then runs. So no fingerprint changes (docs/adr/0007).
ORJSON_OPTIONS = (
    orjson.OPT_SORT_KEYS
    | orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_SUBCLASS
)
_SCALARS = frozenset((str, int, bool, type(None)))
_TINY = 1e-4


def orjson_plain(value: Any) -> bool:
    """Whether ``value`` is made only of exact JSON types orjson encodes exactly as the stdlib does."""
    kind = type(value)
    if kind is dict:
        for k, v in value.items():
            if type(k) is not str:
                return False
            kind = type(v)
            if kind in _SCALARS:
                continue
            if kind is float:
                if not (_TINY <= abs(v) < math.inf or v == 0.0):
                    return False
            elif not orjson_plain(v):
                return False
        return True
    if kind in _SCALARS:
        return True
    if kind is float:
        return _TINY <= abs(value) < math.inf or value == 0.0
    if kind is list:
        return all(orjson_plain(v) for v in value)
    return False


def orjson_canonical(value: Any) -> bytes | None:
    """The canonical JSON bytes of ``value`` by orjson, or None where the stdlib path must decide."""
    try:
        if orjson_plain(value):
            return orjson.dumps(value, option=ORJSON_OPTIONS)
    except (orjson.JSONEncodeError, RecursionError):
        pass  # an int past 64 bits, a lone surrogate, deep nesting: the stdlib path raises or encodes
    return None


def _encode(value: Any, what: str, bytes_hint: str) -> str:
    """Canonical JSON text of a JSON-like value; a TypeError (a value JSON has no type for) propagates."""
    text = None
    raw = orjson_canonical(value)
    if raw is not None:
        return raw.decode("utf-8")
    if _FAST is not None and type(value) is not str:
        try:
            text = "".join(_FAST(value, 0))
        except TypeError:
            raise  # the same error the slow path would raise (a type or key JSON has not), without its cost
        except Exception:
            text = None  # the slow path below raises the error it explains
    try:
        if text is None:
            text = _CANONICAL.encode(value)
    except ValueError as exc:
        if "circular" in str(exc).lower():
            raise InvalidValueError(
                f"{what} contains a reference cycle (a container inside itself); JSON cannot encode it"
            ) from exc
        raise InvalidValueError(
            f"{what} contains NaN or Infinity, which JSON cannot represent; replace it with null or a string"
        ) from exc
    except RecursionError as exc:
        raise InvalidValueError(f"{what} is nested too deeply to encode as JSON; flatten it {bytes_hint}") from exc
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidValueError(
                f"{what} contains a lone surrogate ({exc.object[exc.start : exc.end]!r}), which is not valid "
                f"Unicode text; decode the source text properly {bytes_hint}"
            ) from None
    return text


# What a value that JSON cannot encode may become instead, in each of the two encodings' messages.
_VALUE_BYTES_HINT = "or make the whole field value bytes (stored as a blob)"
_SOURCE_BYTES_HINT = "or give it as bytes"


def canonical_json(value: Any, *, what: str = "value") -> str:
    """Canonical JSON text of a JSON-like value: sorted keys, no whitespace, no NaN/Infinity.

    Canonical text makes digests (value digests, export fingerprints) depend on content only; NaN is
    refused because it does not round-trip through JSON and is not equal to itself. A field value takes
    JSON types only (bytes only as the whole value, see :func:`encode_value`); a source item takes more
    types, see :func:`canonical_source_json`.
    """
    try:
        return _encode(value, what, _VALUE_BYTES_HINT)
    except TypeError as exc:
        raise InvalidValueError(
            f"{what} is not JSON-serializable ({exc}); convert it to dicts, lists, str, int, float, bool or "
            "None, or make the whole field value bytes (bytes inside a dict or list are not stored)"
        ) from exc


#: Starts the canonical text of a source item holding a value JSON has no type for; never the start of
#: JSON text, so such an item's text (and fingerprint) can never equal a JSON-native item's.
TAGGED_PREFIX = "tagged:"
# The tags of the values a source item may hold beyond JSON (docs/adr/0007): each is a one-key dict.
_TAG_DATETIME = "$datetime"
_TAG_DATE = "$date"
_TAG_TIME = "$time"
_TAG_DECIMAL = "$decimal"
_TAG_BYTES = "$bytes"
_TAGS = frozenset((_TAG_DATETIME, _TAG_DATE, _TAG_TIME, _TAG_DECIMAL, _TAG_BYTES))


def canonical_source_json(item: Any, *, what: str = "source item") -> str:
    """The canonical text of a source item: what its input fingerprint digests and a snapshot stores.

    An item of JSON types only (dict, list, str, int, float, bool, None) is its :func:`canonical_json`
    text, exactly as before these types were accepted, so no existing fingerprint changes. An item that
    also holds a datetime, date, time, Decimal or bytes value (what Parquet and Lance columns give) is
    ``TAGGED_PREFIX`` + the canonical JSON of its tagged form, where each such value becomes a one-key
    dict (``{"$datetime": ISO 8601 with its offset if aware}``, ``{"$date": ...}``, ``{"$time": ...}``,
    ``{"$decimal": its exact str}``, ``{"$bytes": standard base64}``) and every dict key of the item
    that starts with ``$`` gets one more ``$``, so a tag never equals an item's own dict.
    :func:`decode_source_json` is the inverse. See docs/adr/0007-canonical-encoding-of-source-values.md.
    """
    try:
        return _encode(item, what, _SOURCE_BYTES_HINT)
    except TypeError:
        pass  # a value JSON has no type for: the tagged form below, or the error naming it
    try:
        tagged = _tagged(item, what)
    except RecursionError:
        raise InvalidValueError(
            f"{what} is nested too deeply or contains a reference cycle; flatten it {_SOURCE_BYTES_HINT}"
        ) from None
    try:
        return TAGGED_PREFIX + _encode(tagged, what, _SOURCE_BYTES_HINT)
    except TypeError as exc:
        raise InvalidValueError(
            f"{what} is not JSON-serializable ({exc}) and not a datetime, date, time, Decimal or bytes; "
            "convert it to dicts, lists, str, int, float, bool, None or one of those types"
        ) from exc


def _tagged(value: Any, what: str) -> Any:
    """The tagged form of a source value (see :func:`canonical_source_json`); other values as given."""
    if isinstance(value, dict):
        return {("$" + k if type(k) is str and k.startswith("$") else k): _tagged(v, what) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_tagged(v, what) for v in value]
    if isinstance(value, dt.datetime):  # before date: a datetime is a date
        return {_TAG_DATETIME: value.isoformat()}
    if isinstance(value, dt.date):
        return {_TAG_DATE: value.isoformat()}
    if isinstance(value, dt.time):
        return {_TAG_TIME: value.isoformat()}
    if isinstance(value, Decimal):
        if value.is_nan():
            raise InvalidValueError(f"{what} contains a Decimal NaN, which is not equal to itself; use null")
        return {_TAG_DECIMAL: str(value)}
    if isinstance(value, (bytes, bytearray)):
        return {_TAG_BYTES: base64.b64encode(value).decode("ascii")}
    return value


def decode_source_json(text: str) -> Any:
    """The source item whose :func:`canonical_source_json` is ``text`` (datetimes stay datetimes)."""
    if not text.startswith(TAGGED_PREFIX):
        return json.loads(text)
    return _untagged(json.loads(text[len(TAGGED_PREFIX) :]))


def _untagged(value: Any) -> Any:
    if isinstance(value, dict):
        if len(value) == 1:
            ((tag, text),) = value.items()
            if tag in _TAGS:
                return _UNTAG[tag](text)
        return {(k[1:] if k.startswith("$") else k): _untagged(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_untagged(v) for v in value]
    return value


_UNTAG: dict[str, Callable[[str], Any]] = {
    _TAG_DATETIME: dt.datetime.fromisoformat,
    _TAG_DATE: dt.date.fromisoformat,
    _TAG_TIME: dt.time.fromisoformat,
    _TAG_DECIMAL: Decimal,
    _TAG_BYTES: base64.b64decode,
}


def digest(data: bytes) -> str:
    """Hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def canonical_source_bytes(item: Any) -> bytes:
    """:func:`canonical_source_json`'s text of a source item as UTF-8 (by orjson where it encodes alike)."""
    raw = orjson_canonical(item)
    return raw if raw is not None else canonical_source_json(item).encode("utf-8")


def fingerprint_of(item: Any) -> str:
    """The input fingerprint of a source item: a digest of its :func:`canonical_source_json` text."""
    return hashlib.sha256(canonical_source_bytes(item)).hexdigest()[:32]


#: Bytes of a SHA-256 digest an input fingerprint keeps (its 32 hex characters).
FINGERPRINT_BYTES = 16
#: Items per chunk of a fingerprint array: keeps its int32 offsets in range.
_FP_ARRAY_CHUNK = 1 << 25


def fingerprint_array(digests: list[bytes]) -> pa.Array:
    """The input fingerprints of many items at once from their SHA-256 digests, as a string array.

    Each entry equals :func:`fingerprint_of`'s ``hexdigest()[:32]``: one hex conversion of the kept
    bytes instead of a hex string and a slice per item.
    """
    n = len(digests)
    if n > _FP_ARRAY_CHUNK:
        return pa.chunked_array(
            [fingerprint_array(digests[lo : lo + _FP_ARRAY_CHUNK]) for lo in range(0, n, _FP_ARRAY_CHUNK)]
        )
    kept = np.frombuffer(b"".join(digests), dtype=np.uint8).reshape(n, 32)[:, :FINGERPRINT_BYTES]
    width = 2 * FINGERPRINT_BYTES
    offsets = pa.py_buffer(np.arange(0, width * (n + 1), width, dtype=np.int32))
    return pa.StringArray.from_buffers(n, offsets, pa.py_buffer(kept.tobytes().hex().encode("ascii")))


class EncodedValue(NamedTuple):
    """A field value ready for a row: inline JSON text, or bytes bound for ``value_blob``.

    Built once per field event on a run's hot path: a NamedTuple costs a third of a frozen dataclass
    (whose fields are set one ``object.__setattr__`` at a time).
    """

    kind: str
    json_text: str | None
    blob: bytes | None
    size: int
    digest: str


def encode_value(value: Any, *, blob_threshold: int = DEFAULT_BLOB_THRESHOLD, what: str = "value") -> EncodedValue:
    """Encode a field value: bytes always go to the blob column, JSON over the threshold too."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        return EncodedValue(VALUE_KIND_BYTES, None, raw, len(raw), digest(raw))
    if type(value) is str:
        # the commonest field value (a model's answer): orjson's text of a str is the canonical one
        # (see ORJSON_OPTIONS); a lone surrogate makes it raise, and the general path names the error
        try:
            raw = orjson.dumps(value)
        except orjson.JSONEncodeError:
            pass
        else:
            if len(raw) > blob_threshold:
                return EncodedValue(VALUE_KIND_JSON, None, raw, len(raw), digest(raw))
            return EncodedValue(VALUE_KIND_JSON, raw.decode("utf-8"), None, len(raw), digest(raw))
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidValueError(f"{what} is {value!r}, which JSON cannot represent; use null or a string")
    text = canonical_json(value, what=what)
    raw = text.encode("utf-8")
    if len(raw) > blob_threshold:
        return EncodedValue(VALUE_KIND_JSON, None, raw, len(raw), digest(raw))
    return EncodedValue(VALUE_KIND_JSON, text, None, len(raw), digest(raw))


def event_id_for(
    item_id: str,
    item_seq: int,
    event_type: str,
    *parts: object,
) -> str:
    """Deterministic id of an event: a digest of its identity, never of its writer or time."""
    text = ID_SEP.join((item_id, str(item_seq), event_type, *["" if p is None else str(p) for p in parts]))
    # BLAKE2b: as collision-resistant as SHA-256 for 128-bit ids and faster on the commit hot path.
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=ID_DIGEST_SIZE).hexdigest()


def event_key_of(event_id: str) -> int:
    """A signed 64-bit integer from an event id: the vectorized fold's cheap tie-breaker."""
    return int.from_bytes(bytes.fromhex(event_id[:16]), "big", signed=True)


def event_ids_of(digests: bytes) -> tuple[pa.StringArray, np.ndarray]:
    """The ids and keys of many events at once from their concatenated 16-byte BLAKE2b digests.

    The bulk form of :func:`event_id_for`'s hex digest and :func:`event_key_of`: one hex conversion
    and one array view instead of two Python calls per event on the commit hot path.
    """
    n = len(digests) // ID_DIGEST_SIZE
    width = 2 * ID_DIGEST_SIZE
    offsets = pa.py_buffer(np.arange(0, width * (n + 1), width, dtype=np.int32))
    ids = pa.StringArray.from_buffers(n, offsets, pa.py_buffer(digests.hex().encode("ascii")))
    keys = np.frombuffer(digests, dtype=">i8")[::2].astype(np.int64)
    return ids, keys


@dataclass(frozen=True)
class StepCoord:
    """Structured step coordinates: enough to rebuild where an item was, never an opaque blob."""

    step: str | None = None
    step_kind: str | None = None
    enclosing_step: str | None = None
    iteration: int | None = None
    fanout_index: int | None = None
    selector_step: str | None = None

    @property
    def frame_key(self) -> tuple[str | None, str | None, int | None, int | None]:
        return (self.enclosing_step, self.step, self.iteration, self.fanout_index)


@dataclass(frozen=True)
class BlobRef:
    """A lazy reference to a value stored in ``value_blob``; bytes are read only by :meth:`load`."""

    event_id: str
    kind: str
    size: int
    digest: str
    _loader: Any = field(default=None, repr=False, compare=False)

    def load(self) -> Any:
        """Read the blob: bytes for a bytes value, the decoded object for a large JSON value."""
        if self._loader is None:
            raise InvalidValueError(f"blob {self.event_id} has no log attached; use CheckpointLog.load_blob")
        raw = self._loader(self.event_id)
        return raw if self.kind == VALUE_KIND_BYTES else json.loads(raw)


@dataclass(frozen=True)
class Event:
    """One immutable row of the log (all columns but the blob bytes)."""

    event_id: str
    item_id: str
    root_item_id: str
    parent_item_id: str | None
    item_seq: int
    event_type: EventType
    status: str | None
    coord: StepCoord
    field: str | None
    value_kind: str | None
    value_json: str | None
    value_size: int | None
    value_digest: str | None
    input_fingerprint: str | None
    processor_version: str | None
    writer_id: str
    writer_epoch: int
    error_type: str | None = None
    error_message: str | None = None
    error_traceback: str | None = None
    dag_id: str | None = None
    run_id: str | None = None
    task_id: str | None = None
    map_index: int | None = None
    try_number: int | None = None
    created_at: dt.datetime | None = None
    schema_version: int = 2

    @property
    def event_key(self) -> int:
        return event_key_of(self.event_id)

    @property
    def step(self) -> str | None:
        return self.coord.step

    @property
    def epoch(self) -> int:
        return self.writer_epoch

    def value(self, loader: Any = None) -> Any:
        """The event's value: decoded inline JSON, or a :class:`BlobRef` for blob-stored values."""
        if self.value_kind is None:
            return None
        if self.value_json is not None:
            return json.loads(self.value_json)
        return BlobRef(self.event_id, self.value_kind, self.value_size or 0, self.value_digest or "", loader)


def events_from_table(table: pa.Table) -> list[Event]:
    """Decode rows of the log (every light column) into :class:`Event` objects, in row order."""
    out = []
    for r in table.to_pylist():
        out.append(
            Event(
                event_id=r["event_id"],
                item_id=r["item_id"],
                root_item_id=r["root_item_id"],
                parent_item_id=r["parent_item_id"],
                item_seq=r["item_seq"],
                event_type=EventType(r["event_type"]),
                status=r["status"],
                coord=StepCoord(
                    r["step"],
                    r["step_kind"],
                    r["enclosing_step"],
                    r["iteration"],
                    r["fanout_index"],
                    r["selector_step"],
                ),
                field=r["field"],
                value_kind=r["value_kind"],
                value_json=r["value_json"],
                value_size=r["value_size"],
                value_digest=r["value_digest"],
                input_fingerprint=r["input_fingerprint"],
                processor_version=r["processor_version"],
                writer_id=r["writer_id"],
                writer_epoch=r["writer_epoch"],
                error_type=r["error_type"],
                error_message=r["error_message"],
                error_traceback=r["error_traceback"],
                dag_id=r["dag_id"],
                run_id=r["run_id"],
                task_id=r["task_id"],
                map_index=r["map_index"],
                try_number=r["try_number"],
                created_at=r["created_at"],
                schema_version=r["schema_version"],
            )
        )
    return out
