"""OpenLineage for the datagen operators: what each task read and wrote, as the provider's ``OperatorLineage``.

With ``apache-airflow-providers-openlineage`` installed and a transport configured, its listener asks
each finished task for ``get_openlineage_facets_on_complete(task_instance)``; the plan, map, batch and
export operators answer with :func:`operator_lineage`:

* the plan: its source as an input;
* the map and batch tasks: their chunk's source as an input, the experiment's event log as the output;
* the export: the log as an input, the destination as the output with a schema facet of the exported
  columns and an output-statistics facet holding the row count.

Each operator keeps what it read and wrote on itself during ``execute`` (:func:`record`), because the
listener builds the event after the task ends, in a forked child by default: that child must not open
a Lance dataset or read a connection (both would use the parent's runtime and the supervisor's
socket), so the facets are built from strings recorded while the task ran.

Datasets are named as the OpenLineage naming spec says, with the client's ``naming`` classes: a local
path is namespace ``file`` and its absolute path; ``s3://bucket/key`` is namespace ``s3://bucket`` and
name ``key`` (``gs://`` alike); another scheme's URI is ``<scheme>://<host>`` and its path.

This module imports OpenLineage only inside the functions the listener calls, so the provider works
without it installed.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from airflow_provider_datagen.core.uri import is_local, local_path

if TYPE_CHECKING:
    from collections.abc import Sequence

    import pyarrow as pa
    from airflow.providers.openlineage.extractors import OperatorLineage

    from airflow_provider_datagen.core.chunk_spec import ChunkSpec

logger = logging.getLogger(__name__)

#: the attribute of an operator holding its :class:`Lineage` (set by :func:`record` in ``execute``)
ATTRIBUTE = "_datagen_lineage"

#: field metadata the export writes (core/export_columns.py), shown as the column's description
_JSON_ENCODING = (b"datagen_encoding", b"json")
_FIELD_NAME = b"datagen_field"
#: the Arrow extension type of a blob-encoded Lance column (the export's bytes fields)
_LANCE_BLOB = "lance.blob"


@dataclass(frozen=True)
class Column:
    """One exported column for the schema facet: its name, Arrow type and nested struct fields."""

    name: str
    type: str
    description: str | None = None
    fields: tuple[Column, ...] = ()


@dataclass(frozen=True)
class Lineage:
    """What one task read and wrote: dataset URIs or paths, and for an export its columns and rows."""

    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    #: the exported columns (None: not read, no schema facet)
    columns: tuple[Column, ...] | None = None
    #: the exported rows (None: no output-statistics facet)
    rows: int | None = None


def record(
    operator: object,
    *,
    inputs: list[str | None] | tuple[str | None, ...] = (),
    outputs: list[str | None] | tuple[str | None, ...] = (),
    columns: tuple[Column, ...] | None = None,
    rows: int | None = None,
) -> None:
    """Keep on ``operator`` what its task read and wrote (``None`` entries, e.g. an inline source, are left out)."""
    lineage = Lineage(
        inputs=tuple(u for u in inputs if u),
        outputs=tuple(u for u in outputs if u),
        columns=columns,
        rows=rows,
    )
    setattr(operator, ATTRIBUTE, lineage)


def source_uri(source: Any) -> str | None:
    """A source's path or URI; None for an inline list (its snapshot is named by the chunks)."""
    return os.fspath(source) if isinstance(source, (str, os.PathLike)) else None


def planned_source(source: Any, specs: Sequence[ChunkSpec]) -> str | None:
    """What a plan read: its path source, or an inline source's snapshot (the chunks name it; none planned: None)."""
    return source_uri(source) or (specs[0].source if specs else None)


def chunk_source(spec: ChunkSpec | None, source: Any) -> str | None:
    """What a map or batch task reads: its chunk's source (a path, or an inline source's snapshot), or its own."""
    return spec.source if spec is not None else source_uri(source)


def enabled() -> bool:
    """Whether the OpenLineage provider is installed and enabled, so an export's schema is worth reading."""
    try:
        from airflow.providers.openlineage import conf
    except ImportError:
        return False
    try:
        return not conf.is_disabled()
    except Exception:  # a configuration the provider cannot read: it will not emit either
        logger.debug("OpenLineage configuration unreadable; no schema is read for it", exc_info=True)
        return False


def dataset_id(uri: str) -> tuple[str, str]:
    """``(namespace, name)`` of a path or URI, after the OpenLineage naming spec."""
    from openlineage.client.naming.dataset import GCS, S3, LocalFileSystem

    if is_local(uri):
        naming: Any = LocalFileSystem(path=os.path.abspath(local_path(uri)))
        return naming.get_namespace(), naming.get_name()
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    host = parts.netloc.rpartition("@")[2]  # never a URI's user-info (a password) in an event
    key = parts.path.strip("/") or "/"  # a bucket's root has no key: "/" names it
    if scheme in ("s3", "s3a", "s3n") and host:
        naming = S3(bucket_name=host, object_key=key)
    elif scheme in ("gs", "gcs") and host:
        naming = GCS(bucket_name=host, object_key=key)
    else:
        return f"{scheme}://{host}", parts.path.lstrip("/") or "/"
    return naming.get_namespace(), naming.get_name()


def operator_lineage(operator: object) -> OperatorLineage | None:
    """The ``OperatorLineage`` of what ``operator`` recorded; None when its task recorded nothing (it failed early)."""
    lineage = getattr(operator, ATTRIBUTE, None)
    if not isinstance(lineage, Lineage):
        return None
    from airflow.providers.common.compat.openlineage.facet import InputDataset, OutputDataset
    from airflow.providers.openlineage.extractors import OperatorLineage

    inputs = [InputDataset(*dataset_id(uri)) for uri in lineage.inputs]
    outputs = [
        OutputDataset(*dataset_id(uri), facets=_dataset_facets(lineage), outputFacets=_output_facets(lineage))
        for uri in lineage.outputs
    ]
    return OperatorLineage(inputs=inputs, outputs=outputs)


def _dataset_facets(lineage: Lineage) -> dict[str, Any]:
    if lineage.columns is None:
        return {}
    from airflow.providers.common.compat.openlineage.facet import SchemaDatasetFacet

    return {"schema": SchemaDatasetFacet(fields=[_schema_field(c) for c in lineage.columns])}


def _schema_field(column: Column) -> Any:
    from airflow.providers.common.compat.openlineage.facet import SchemaDatasetFacetFields

    return SchemaDatasetFacetFields(
        name=column.name,
        type=column.type,
        description=column.description,
        fields=[_schema_field(c) for c in column.fields],
    )


def _output_facets(lineage: Lineage) -> dict[str, Any]:
    if lineage.rows is None:
        return {}
    from airflow.providers.common.compat.openlineage.facet import OutputStatisticsOutputDatasetFacet

    return {"outputStatistics": OutputStatisticsOutputDatasetFacet(rowCount=lineage.rows)}


def columns_of(schema: pa.Schema) -> tuple[Column, ...]:
    """The schema facet's columns of an Arrow schema (struct children nested, types as Arrow names them)."""
    return tuple(_column(f) for f in schema)


def _column(field: pa.Field) -> Column:
    import pyarrow as pa

    meta = field.metadata or {}
    description = None
    if meta.get(_JSON_ENCODING[0]) == _JSON_ENCODING[1]:
        description = "canonical JSON text (the field's values do not share one Arrow type)"
    elif _FIELD_NAME in meta:
        description = f"the field {meta[_FIELD_NAME].decode()!r}"
    if isinstance(field.type, pa.ExtensionType) and field.type.extension_name.startswith(_LANCE_BLOB):
        # what a reader gets (Lance stores it as a blob; a Parquet export holds the same bytes as large_binary)
        return Column(name=field.name, type=str(pa.large_binary()), description="bytes, blob-encoded by Lance")
    children: tuple[Column, ...] = ()
    if pa.types.is_struct(field.type):
        children = tuple(_column(field.type.field(i)) for i in range(field.type.num_fields))
    return Column(name=field.name, type=str(field.type), description=description, fields=children)


def exported_columns(destination: str, storage_options: dict[str, str] | None, fmt: str) -> tuple[Column, ...] | None:
    """The columns of the export at ``destination`` as it is stored; None (logged) when it cannot be read.

    Lance: the dataset's schema. Parquet: the first part's (every part has the export's schema). JSON
    Lines stores no types: the columns are as a JSON reader infers them from the first part's first
    block (names as exported; binary columns read as base64 text). A failure never fails the export.
    """
    from airflow_provider_datagen.exceptions import DatagenError

    try:
        schema = _stored_schema(destination, storage_options, fmt)
    except (DatagenError, OSError, ValueError, RuntimeError) as exc:  # RuntimeError: Lance's (LANCE_ERRORS)
        logger.warning("could not read the export's schema for its OpenLineage facet (it is left out): %s", exc)
        return None
    return None if schema is None else columns_of(schema)


def _stored_schema(destination: str, storage_options: dict[str, str] | None, fmt: str) -> pa.Schema | None:
    # Deferred: pyarrow and Lance, which DAG parsing must not pay for.
    if fmt == "lance":
        from airflow_provider_datagen.core.store.lance_io import open_dataset

        return open_dataset(destination, storage_options).schema
    import pyarrow.json as pajson
    import pyarrow.parquet as pq

    from airflow_provider_datagen.core.export_files import filesystem, part_uris

    parts = part_uris(destination, storage_options)
    if not parts:
        return None
    fs, path = filesystem(parts[0], storage_options)
    if fmt == "parquet":
        with fs.open_input_file(path) as f:
            return pq.read_schema(f)
    with fs.open_input_stream(path) as f:
        return pajson.open_json(f).schema
