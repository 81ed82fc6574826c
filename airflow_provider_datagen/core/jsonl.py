"""JSON Lines sources, read one way everywhere: the byte lines of a file and one row per line.

The plan's scan, the mapped tasks' row reads, a whole-source read and the item page's look-up of one
row all split a file into ``\\n``-ended byte lines with :func:`lines` and parse each with :func:`loads`
(orjson, then the stdlib for what orjson refuses), so they see the same rows. Text mode would also split
on a lone ``\\r``; a JSON line holds no raw ``\\r`` or ``\\n``, so the rows are the same (both parsers
take a trailing ``\\r`` as whitespace).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import orjson
import pyarrow as pa

from airflow_provider_datagen.exceptions import InvalidItemError

if TYPE_CHECKING:
    from collections.abc import Iterator

#: bytes read at a time from an Arrow file (an object store's)
_BLOCK = 1 << 20


def lines(fh: Any) -> Iterator[bytes]:
    """The lines of a binary file (a Python file or an Arrow ``NativeFile``), each with its ``\\n``."""
    if not isinstance(fh, pa.NativeFile):
        # not ``yield from fh``: closing this generator early would close the file too
        for line in fh:
            yield line
        return
    buf = b""
    while True:
        block = fh.read(_BLOCK)
        if not block:
            break
        buf += block
        *complete, buf = buf.split(b"\n")
        for line in complete:
            yield line + b"\n"
    if buf:
        yield buf


def loads(line: bytes) -> Any:
    """The JSON value of one line; ``ValueError`` (or ``UnicodeDecodeError``) when it is not JSON.

    orjson first; what it refuses but the stdlib takes (NaN, lone surrogates) from ``json``, whose error
    is the one raised. An integer past 64 bits comes back a float, as orjson reads it: every reader of
    a source reads it so, the plan's fingerprints included (a source that needs it exact holds it as a
    string). Checking every line for such a literal would cost five times the parse.
    """
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        pass
    return json.loads(line.decode("utf-8"))


def source_row(line: bytes, path: str, n: int) -> Any:
    """:func:`loads` of line ``n`` of the source at ``path``; an ``InvalidItemError`` naming both."""
    try:
        return loads(line)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidItemError(f"source {path!r} line {n} is not JSON: {exc}") from None
