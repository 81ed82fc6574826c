"""Item ids as materialized paths: a root id is the escaped source key, a child appends ``/step:idx``.

Ids compose on the client with no store round-trip (see docs/design.md, Item ids). Source keys are
arbitrary strings (file paths contain ``/``), so the three reserved characters are percent-escaped
reversibly: a key ``a/b.txt`` stays one root item.
"""

from __future__ import annotations

import re
import unicodedata

from airflow_provider_datagen.exceptions import DatagenError, InvalidEventError, InvalidItemError, InvalidNameError

_ESCAPES = {"%": "%25", "/": "%2F", ":": "%3A"}
_UNESCAPE_RE = re.compile(r"%(25|2F|3A)")
_UNESCAPES = {"25": "%", "2F": "/", "3A": ":"}
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}")

#: Keys longer than this are refused: ids are written on every row and shown in the UI.
MAX_KEY_LENGTH = 4096

#: Field names longer than this are refused (they are written on every field event).
MAX_FIELD_NAME = 256


_ESCAPE_TABLE = str.maketrans(_ESCAPES)


def escape_key(key: str) -> str:
    """Escape ``%``, ``/`` and ``:`` so a key is one path segment."""
    if "%" not in key and "/" not in key and ":" not in key:
        return key  # the common case costs three scans, no copy
    return key.translate(_ESCAPE_TABLE)


def unescape_key(segment: str) -> str:
    """Invert :func:`escape_key`."""
    return _UNESCAPE_RE.sub(lambda m: _UNESCAPES[m.group(1)], segment)


def _check_key(key: object) -> str:
    if isinstance(key, bool) or not isinstance(key, (str, int)):
        raise InvalidItemError(
            f"item key {key!r} has type {type(key).__name__}; keys must be strings or integers "
            "(convert the key field to str in the source)"
        )
    text = str(key)
    if text == "":
        raise InvalidItemError("item key is empty; give every item a non-empty key")
    if "\x00" in text:
        raise InvalidItemError(f"item key {text[:80]!r} contains a NUL byte; remove it from the source key")
    try:
        if not text.isascii():
            text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidItemError(
            f"item key {text[:80]!r} contains a lone surrogate and is not valid Unicode text; decode "
            "the source key properly (or key the item by its escaped form)"
        ) from None
    if len(text) > MAX_KEY_LENGTH:
        raise InvalidItemError(
            f"item key starting {text[:40]!r} is {len(text)} characters long; keys are limited to "
            f"{MAX_KEY_LENGTH}: key the item by a shorter id or a digest of the long one"
        )
    return text


def root_item_id(key: object) -> str:
    """The item id of a source item: its key, escaped into one path segment."""
    return escape_key(_check_key(key))


def child_item_id(parent_id: str, step: str, index: int) -> str:
    """The id of fan-out child ``index`` of ``parent_id`` created by ``step``."""
    check_name(step, "step")
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise InvalidItemError(f"fan-out index {index!r} of step {step!r} must be a non-negative int")
    return f"{parent_id}/{step}:{index}"


def parent_of(item_id: str) -> str | None:
    """The parent id of a child id, or None for a root id."""
    head, sep, _ = item_id.rpartition("/")
    return head if sep else None


def root_of(item_id: str) -> str:
    """The root id of any item id."""
    return item_id.split("/", 1)[0]


def key_of(item_id: str) -> str:
    """The original source key of a root (or any) item id."""
    return unescape_key(root_of(item_id))


def depth_of(item_id: str) -> int:
    """0 for a root item, 1 for its children, and so on."""
    return item_id.count("/")


def check_name(name: object, what: str) -> str:
    """Validate a pipeline, experiment or step name: it becomes a path segment or an id segment.

    Names are restricted to a small portable alphabet so that no name can escape its directory
    (``..``, ``/``, absolute paths), hide characters (control, NUL, unicode look-alikes) or collide on
    case-insensitive object stores in surprising ways.
    """
    if not isinstance(name, str):
        raise InvalidNameError(f"{what} name must be a string, got {type(name).__name__}")
    if name == "":
        raise InvalidNameError(f"{what} name is empty; use letters, digits, '_', '-' or '.'")
    normalized = unicodedata.normalize("NFKC", name)
    if normalized != name or not _NAME_RE.fullmatch(name) or name in {".", ".."} or ".." in name:
        shown = name.encode("unicode_escape").decode("ascii")[:80]
        raise InvalidNameError(
            f"{what} name {shown!r} is not allowed: use 1-128 ASCII letters, digits, '_', '-' or '.', "
            "starting with a letter or digit, with no '/', '..', control or unicode characters"
        )
    return name


def check_field_name(name: object, error: type[DatagenError] = InvalidEventError, where: str = "") -> str:
    """The one rule for field names: a non-empty string of at most 256 characters without NUL.

    The log applies it at write time (``InvalidEventError``); a step's context applies it while the
    step can still fail alone (``ProcessError``, with ``where`` naming the call that broke it).
    """
    if isinstance(name, str) and name and "\x00" not in name and len(name) <= MAX_FIELD_NAME:
        return name
    prefix = f"{where} the field name" if where else "field name"
    raise error(
        f"{prefix} {str(name)[:80]!r} is not usable; field names must be non-empty strings of at most "
        f"{MAX_FIELD_NAME} characters without NUL"
    )
