"""The storage layout: ``<root>/datagen_checkpoints/<pipeline>/<experiment>/log.lance`` and its neighbours.

One home for the layout: the log opens its dataset here, the export refuses to overwrite a log by
it, and the UI lists experiments with it. Listing needs no Lance import (directory names only).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from airflow_provider_datagen.core.ids import check_name
from airflow_provider_datagen.core.uri import has_scheme, is_local, local_path
from airflow_provider_datagen.exceptions import DatagenError, InvalidItemError

CHECKPOINTS_DIR = "datagen_checkpoints"
LOG_DIR = "log.lance"
#: Beside the log: the disposable state projection, inline-source snapshots, the maintenance lease.
PROJECTION_DIR = "state.lance"
SNAPSHOTS_DIR = "sources"
#: the budget the last plan or map task set (docs/adr/0011-usage-ledger.md): one row, overwritten
BUDGET_DIR = "budget.lance"
#: the source the last plan read (core/store/source_ref.py): one row, overwritten by each plan
SOURCE_REF_DIR = "source.lance"
#: the disposable usage projection (the usage ledger's sums at a log version, core/store/usage_projection.py)
USAGE_DIR = "usage.lance"
LEASE_FILE = ".maintenance.lock"
#: The maintenance lease on an object store (an object, see core/store/lease.py).
LEASE_OBJECT = ".maintenance.lease"
#: The last epoch claimed (core/store/epochs.py): a file under a flock locally, an object under a lease on a store.
EPOCH_FILE = ".epoch"
EPOCH_LEASE_OBJECT = ".epoch.lease"
#: The highest log version a run ended at (core/store/version_mark.py): a rollback is refused by a new reader.
VERSION_MARK_FILE = ".version"


def log_uri(root: str, pipeline: str, experiment: str) -> str:
    """The URI of one experiment's event log (names must already be checked)."""
    return f"{root.rstrip('/')}/{CHECKPOINTS_DIR}/{pipeline}/{experiment}/{LOG_DIR}"


def experiment_uri(log_uri: str) -> str:
    """The experiment's directory: the log's parent, which also holds its projection and snapshots."""
    return log_uri.rsplit("/", 1)[0]


def projection_uri(log_uri: str) -> str:
    """The URI of the state projection of the log at ``log_uri``."""
    return f"{experiment_uri(log_uri)}/{PROJECTION_DIR}"


def budget_uri(log_uri: str) -> str:
    """The URI of the experiment's budget record (see :data:`BUDGET_DIR`)."""
    return f"{experiment_uri(log_uri)}/{BUDGET_DIR}"


def source_ref_uri(log_uri: str) -> str:
    """The URI of the record of the source the experiment's last plan read (see :data:`SOURCE_REF_DIR`)."""
    return f"{experiment_uri(log_uri)}/{SOURCE_REF_DIR}"


def usage_projection_uri(log_uri: str) -> str:
    """The URI of the usage projection of the log at ``log_uri`` (see :data:`USAGE_DIR`)."""
    return f"{experiment_uri(log_uri)}/{USAGE_DIR}"


def epoch_uri(log_uri: str) -> str:
    """The URI of the experiment's last claimed epoch (see :data:`EPOCH_FILE`)."""
    return f"{experiment_uri(log_uri)}/{EPOCH_FILE}"


def version_mark_uri(log_uri: str) -> str:
    """The URI of the highest version a run of the log ended at (see :data:`VERSION_MARK_FILE`)."""
    return f"{experiment_uri(log_uri)}/{VERSION_MARK_FILE}"


def snapshot_uri(log_uri: str, digest: str) -> str:
    """The URI of the content-addressed snapshot ``digest`` of an inline source, beside the log."""
    return f"{experiment_uri(log_uri)}/{SNAPSHOTS_DIR}/{digest}.lance"


def is_log_uri(uri: str) -> bool:
    """Whether ``uri`` points at a checkpoint log (an export must never overwrite one)."""
    return uri.rstrip("/").endswith(f"/{LOG_DIR}") and f"/{CHECKPOINTS_DIR}/" in uri


@dataclass(frozen=True, order=True)
class ExperimentRef:
    """One experiment found under a root."""

    pipeline: str
    experiment: str


def _valid(name: str) -> bool:
    try:
        check_name(name, "name")
    except DatagenError:
        return False
    return True


def _list_local(root: str) -> list[ExperimentRef]:
    base = os.path.join(local_path(root), CHECKPOINTS_DIR)
    refs: list[ExperimentRef] = []
    try:
        pipelines = sorted(os.listdir(base))
    except FileNotFoundError:
        return []
    for pipeline in pipelines:
        pdir = os.path.join(base, pipeline)
        if not _valid(pipeline) or not os.path.isdir(pdir):
            continue
        for experiment in sorted(os.listdir(pdir)):
            if _valid(experiment) and os.path.isdir(os.path.join(pdir, experiment, LOG_DIR)):
                refs.append(ExperimentRef(pipeline, experiment))
    return refs


# Lance storage option names (object_store's) -> pyarrow.fs.S3FileSystem arguments, for listing only.
_S3_OPTIONS = {
    "aws_access_key_id": "access_key",
    "access_key_id": "access_key",
    "aws_secret_access_key": "secret_key",
    "secret_access_key": "secret_key",
    "aws_session_token": "session_token",
    "session_token": "session_token",
    "aws_region": "region",
    "region": "region",
    "aws_endpoint": "endpoint_override",
    "aws_endpoint_url": "endpoint_override",
    "endpoint": "endpoint_override",
}


def object_store_fs(root: str, storage_options: dict[str, str]) -> tuple[Any, str]:
    """A ``pyarrow.fs`` filesystem for ``root`` and the path inside it; S3 with the connection's storage options.

    Without options, or for another scheme, pyarrow's own reading of the URI (its default credential chain).
    """
    # Deferred: pyarrow.fs loads the S3 client, which a local-only deployment never needs.
    import pyarrow.fs as pafs

    scheme, _, rest = root.partition("://")
    if scheme in ("s3", "s3a") and storage_options:
        kwargs: dict[str, Any] = {}
        for key, value in storage_options.items():
            arg = _S3_OPTIONS.get(key.lower())
            if arg is not None:
                kwargs[arg] = value
        endpoint = kwargs.get("endpoint_override")
        if isinstance(endpoint, str) and has_scheme(endpoint):
            # pyarrow wants host:port plus a scheme argument; object_store takes a full URL.
            kwargs["scheme"], _, kwargs["endpoint_override"] = endpoint.partition("://")
        if str(storage_options.get("allow_http", "")).lower() == "true":
            kwargs.setdefault("scheme", "http")
        return pafs.S3FileSystem(**kwargs), rest
    return pafs.FileSystem.from_uri(root)


def _list_object_store(root: str, storage_options: dict[str, str]) -> list[ExperimentRef]:
    # Deferred for the same reason as in object_store_fs.
    import pyarrow.fs as pafs

    fs, path = object_store_fs(root, storage_options)
    base = f"{path.rstrip('/')}/{CHECKPOINTS_DIR}"

    def dirs(prefix: str) -> list[str]:
        try:
            infos = fs.get_file_info(pafs.FileSelector(prefix, allow_not_found=True))
        except (OSError, FileNotFoundError):
            return []
        return sorted(i.base_name for i in infos if i.type == pafs.FileType.Directory)

    refs = []
    for pipeline in dirs(base):
        if not _valid(pipeline):
            continue
        for experiment in dirs(f"{base}/{pipeline}"):
            if _valid(experiment) and LOG_DIR in dirs(f"{base}/{pipeline}/{experiment}"):
                refs.append(ExperimentRef(pipeline, experiment))
    return refs


def list_experiments(root: str, storage_options: dict[str, str] | None = None) -> list[ExperimentRef]:
    """Every ``<root>/datagen_checkpoints/<pipeline>/<experiment>/log.lance``, sorted by name."""
    if is_local(root):
        return _list_local(root)
    return _list_object_store(root, storage_options or {})


# --- a source file, read with the connection's storage options ---------------------------------------

#: Storage option keys whose values an error may show (everything else, credentials first, is masked).
_SHOWN_OPTIONS = ("endpoint", "region", "allow_http")


def open_input_file(uri: str, storage_options: dict[str, str] | None = None) -> Any:
    """A binary file to read the source file at ``uri``: a local path (``open``) or an object-store URI.

    An object-store URI is opened with the connection's ``storage_options`` (see :func:`object_store_fs`),
    as its Lance sources are, so a JSONL or Parquet source on an S3-compatible endpoint reads as a local
    one does. The file is random-access (``seek``), as a chunk's read of its rows needs.

    :raises InvalidItemError: the file does not exist, or the store refuses or cannot be reached (the
        message names the URI and never a credential).
    """
    if not has_scheme(uri):
        try:
            return open(uri, "rb")
        except FileNotFoundError:
            raise _missing(uri) from None
    try:
        fs, inner = object_store_fs(uri, storage_options or {})
        return fs.open_input_file(inner)
    except FileNotFoundError:
        raise _missing(uri) from None
    except (OSError, ValueError) as exc:  # ArrowInvalid (an unknown scheme, a bad option) is a ValueError
        raise _unreadable(uri, exc, storage_options) from None


def file_size(uri: str, storage_options: dict[str, str] | None = None) -> int:
    """The size in bytes of the source file at ``uri`` (errors as :func:`open_input_file`'s)."""
    if not has_scheme(uri):
        try:
            return os.path.getsize(uri)
        except FileNotFoundError:
            raise _missing(uri) from None
    # Deferred, as in object_store_fs.
    import pyarrow.fs as pafs

    try:
        fs, inner = object_store_fs(uri, storage_options or {})
        info = fs.get_file_info(inner)
    except (OSError, ValueError) as exc:
        raise _unreadable(uri, exc, storage_options) from None
    if info.type == pafs.FileType.NotFound:
        raise _missing(uri)
    return int(info.size or 0)


def _missing(uri: str) -> InvalidItemError:
    # the wording of a missing local source (sources.source_path), whatever the store
    return InvalidItemError(f"source {uri!r} does not exist; check the path")


def _unreadable(uri: str, exc: BaseException, storage_options: dict[str, str] | None) -> InvalidItemError:
    reason = str(exc)
    for key, value in (storage_options or {}).items():
        if value and not any(word in key.lower() for word in _SHOWN_OPTIONS):
            reason = reason.replace(str(value), "***")
    return InvalidItemError(
        f"source {uri!r} cannot be read: {reason[:300]}; check the connection's storage_options "
        "(endpoint, region, credentials) and that they may read this object"
    )
