"""Parquet and JSON Lines exports: part files under the destination folder, and a manifest beside them.

A file export is a folder of ``part-NNNNN.parquet`` (or ``.jsonl``) files and ``_datagen_export.json``,
the manifest naming the parts with their sizes and recording what was exported (the marker the Lance
export keeps in its schema metadata). Parts are written under hidden temporary names and renamed
once all are written; the manifest is written last, and parts of an earlier export that it does not
name are removed after it. A crash therefore leaves either the old manifest (whose marker no longer
matches, so the next export writes again) or the new one, never a manifest naming a missing or
half-written part. Readers that glob ``*.parquet`` see only whole files.

Parquet row groups hold at most :data:`ROW_GROUP_BYTES` (estimated from the rows' average size) and
parts at most :data:`FILE_BYTES`, so a reader (or ``datasets``) never needs more than one group's
memory at a time. Object-store destinations are written through ``pyarrow.fs`` with the connection's
storage options (see :func:`~airflow_provider_datagen.core.store.paths.object_store_fs`).
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import os
import uuid
from typing import TYPE_CHECKING, Any, Final

import orjson
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from airflow_provider_datagen.core.export_spec import FILE_FORMATS
from airflow_provider_datagen.core.store.paths import is_log_uri, object_store_fs
from airflow_provider_datagen.core.uri import has_scheme, is_local, local_path
from airflow_provider_datagen.exceptions import InvalidNameError, LogWriteError

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

MANIFEST_NAME: Final = "_datagen_export.json"
#: The bytes a Parquet row group (and a JSONL write) aims at; a part file's bound.
ROW_GROUP_BYTES: Final = 128 * 1024 * 1024
FILE_BYTES: Final = 1024 * 1024 * 1024
#: Parquet stores a binary value's length as a 32-bit signed int: a longer value has no Parquet form.
PARQUET_MAX_VALUE_BYTES: Final = 2**31 - 1
_EXT: Final = {"parquet": ".parquet", "jsonl": ".jsonl"}


def filesystem(uri: str, storage_options: dict[str, str] | None) -> tuple[pafs.FileSystem, str]:
    """The ``pyarrow.fs`` filesystem of ``uri`` and the path inside it (local paths made absolute)."""
    if is_local(uri):
        return pafs.LocalFileSystem(), os.path.abspath(local_path(uri))
    return object_store_fs(uri, storage_options or {})


def _exists(fs: pafs.FileSystem, path: str) -> bool:
    return bool(fs.get_file_info(path).type != pafs.FileType.NotFound)


def destination_kind(uri: str, storage_options: dict[str, str] | None) -> str | None:
    """What the destination holds now: ``"lance"``, ``"parquet"``, ``"jsonl"``, ``"other"``, or None (nothing).

    A Lance dataset is known by its ``_versions`` folder, a file export by its manifest; a file, or a
    folder holding neither, is ``"other"`` (an empty folder is nothing).
    """
    if is_log_uri(uri):
        raise InvalidNameError(f"export destination {uri!r} is a checkpoint log; export to another path")
    fs, path = filesystem(uri, storage_options)
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        return None
    if info.type != pafs.FileType.Directory:
        return "other"
    if _exists(fs, f"{path}/_versions"):
        return "lance"
    manifest = _read_manifest(fs, path)
    if manifest is not None and manifest.get("format_name") in FILE_FORMATS:
        return str(manifest["format_name"])
    entries = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    return "other" if entries else None


def _read_manifest(fs: pafs.FileSystem, path: str) -> dict[str, Any] | None:
    try:
        with fs.open_input_stream(f"{path}/{MANIFEST_NAME}") as f:
            manifest = json.loads(f.read())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None


def files_marker(uri: str, storage_options: dict[str, str] | None, format_name: str) -> dict[str, Any] | None:
    """The marker of the ``format_name`` export at ``uri`` when its manifest's parts are all there as written."""
    fs, path = filesystem(uri, storage_options)
    manifest = _read_manifest(fs, path)
    if manifest is None or manifest.get("format_name") != format_name:
        return None
    files = manifest.get("files")
    marker = manifest.get("marker")
    if not isinstance(files, list) or not isinstance(marker, dict):
        return None
    for entry in files:
        info = fs.get_file_info(f"{path}/{entry.get('name')}")
        if info.type != pafs.FileType.File or info.size != entry.get("size"):
            return None  # a part was removed or rewritten since: not what the marker describes
    return marker


def rows_per_group(table: pa.Table, budget: int) -> int:
    """How many rows of ``table`` fit ``budget`` bytes, by their average size (at least one)."""
    if table.num_rows == 0:
        return 1
    average = max(1, table.nbytes // table.num_rows)
    return max(1, min(table.num_rows, budget // average))


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    raise TypeError(f"no JSON form for {type(value).__name__}")


def _jsonl_chunks(table: pa.Table, rows: int) -> Iterator[bytes]:
    for batch in table.to_batches(max_chunksize=rows):
        lines = [orjson.dumps(r, default=_jsonable, option=orjson.OPT_NON_STR_KEYS) for r in batch.to_pylist()]
        yield b"\n".join(lines) + b"\n" if lines else b""


class _Parts:
    """Part files being written: a new part once the current one holds :data:`FILE_BYTES`."""

    def __init__(self, fs: pafs.FileSystem, path: str, schema: pa.Schema, format_name: str, token: str) -> None:
        self.fs, self.path, self.schema, self.format_name, self.token = fs, path, schema, format_name, token
        self.written: list[tuple[str, str]] = []  # (final name, temporary path)
        self._sink: Any = None
        self._writer: pq.ParquetWriter | None = None
        self._bytes = 0

    def _next(self) -> None:
        self.close()
        name = f"part-{len(self.written):05d}{_EXT[self.format_name]}"
        tmp = f"{self.path}/.{name}.{self.token}.tmp"
        self.written.append((name, tmp))
        self._sink = self.fs.open_output_stream(tmp)
        if self.format_name == "parquet":
            self._writer = pq.ParquetWriter(self._sink, self.schema)
        self._bytes = 0

    def write(self, table: pa.Table) -> None:
        if self._sink is None:
            self._next()
        per_file = rows_per_group(table, FILE_BYTES)
        for start in range(0, table.num_rows, per_file):
            part = table.slice(start, per_file)
            if self._bytes and self._bytes + part.nbytes > FILE_BYTES:
                self._next()
            group = rows_per_group(part, ROW_GROUP_BYTES)
            if self._writer is not None:
                for at in range(0, part.num_rows, group):
                    self._writer.write_table(part.slice(at, group), row_group_size=group)
            else:
                for chunk in _jsonl_chunks(part, group):
                    self._sink.write(chunk)
            self._bytes += part.nbytes

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._sink is not None:
            self._sink.close()
            self._sink = None


def write_files_export(
    tables: Iterable[pa.Table],
    schema: pa.Schema,
    uri: str,
    storage_options: dict[str, str] | None,
    format_name: str,
    marker: dict[str, Any],
) -> list[str]:
    """Write ``tables`` (of ``schema``) as ``format_name`` part files under ``uri``, then the manifest; the parts.

    See the module's docstring for the order of writes that keeps a crash from showing a half export.
    """
    fs, path = filesystem(uri, storage_options)
    token = uuid.uuid4().hex[:12]
    try:
        fs.create_dir(path, recursive=True)
        old = _read_manifest(fs, path) or {}
        parts = _Parts(fs, path, schema, format_name, token)
        try:
            for table in tables:
                parts.write(table)
            if not parts.written:
                parts.write(schema.empty_table())  # an empty export is one empty part
        finally:
            parts.close()
        for name, tmp in parts.written:
            fs.move(tmp, f"{path}/{name}")
        names = [name for name, _ in parts.written]
        files = [{"name": n, "size": fs.get_file_info(f"{path}/{n}").size} for n in names]
        manifest = {"format_name": format_name, "files": files, "marker": marker}
        tmp = f"{path}/.{MANIFEST_NAME}.{token}.tmp"
        with fs.open_output_stream(tmp) as sink:
            sink.write(json.dumps(manifest, sort_keys=True).encode())
        fs.move(tmp, f"{path}/{MANIFEST_NAME}")
        stale = {e.get("name") for e in old.get("files", []) if isinstance(e, dict)} - set(names)
        for name in sorted(n for n in stale if isinstance(n, str) and "/" not in n):
            if _exists(fs, f"{path}/{name}"):
                fs.delete_file(f"{path}/{name}")
    except (OSError, ValueError) as exc:
        raise LogWriteError(f"writing the {format_name} export to {uri} failed: {str(exc)[:300]}") from None
    return names


def read_files_export(uri: str, storage_options: dict[str, str] | None = None) -> pa.Table:
    """The Parquet export at ``uri`` as one table, its parts in the manifest's order (tests, small exports)."""
    fs, path = filesystem(uri, storage_options)
    manifest = _read_manifest(fs, path)
    if manifest is None or manifest.get("format_name") != "parquet":
        raise InvalidNameError(f"{uri!r} holds no Parquet export (no {MANIFEST_NAME} naming parquet parts)")
    parts = [pq.read_table(f"{path}/{e['name']}", filesystem=fs) for e in manifest["files"]]
    return pa.concat_tables(parts)


def part_uris(uri: str, storage_options: dict[str, str] | None = None) -> list[str]:
    """The part files of the file export at ``uri``, as the manifest names them (for ``data_files=``)."""
    fs, path = filesystem(uri, storage_options)
    manifest = _read_manifest(fs, path) or {}
    base = uri.rstrip("/") if has_scheme(uri) else path
    return [f"{base}/{e['name']}" for e in manifest.get("files", [])]
