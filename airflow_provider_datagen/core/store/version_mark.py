"""The version mark: the highest version of a log that a run ended at, kept beside the log.

A log object remembers the highest version it has read, so it refuses the same dataset at an older
version (its newest manifest deleted: folding it would redo acknowledged work). A new process has
read nothing yet; the state projection records a version, but small logs have none. So every run
raises a mark beside the log when it ends (one small write per run, not per commit): a reader that
opens the log at a version below the mark of this same dataset (the mark names the log id, so an
experiment deleted and created again is never refused) raises :class:`LogCorruptedError`.

Locally the mark is raised under a ``flock`` (exact). On an object store it is read and written
without a lock: two runs ending at once may leave the lower of their versions, which only makes the
check weaker, never wrong, since every mark is a version that was committed.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from typing import TYPE_CHECKING

from airflow_provider_datagen.core.store.paths import is_local, local_path, object_store_fs, version_mark_uri
from airflow_provider_datagen.exceptions import LogCorruptedError

if TYPE_CHECKING:
    from collections.abc import Callable

logger = logging.getLogger(__name__)


def _parse(raw: bytes) -> tuple[str, int] | None:
    """The mark's (log id, version); None for an empty or unreadable mark (it is only a safeguard)."""
    try:
        doc = json.loads(raw.decode())
        log_id, version = doc["log_id"], doc["version"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None
    if not isinstance(log_id, str) or type(version) is not int or version < 0:
        return None
    return log_id, version


def _encode(log_id: str, version: int) -> bytes:
    return json.dumps({"log_id": log_id, "version": version}).encode()


def read_mark(log_uri: str, storage_options: dict[str, str] | None) -> tuple[str, int] | None:
    """The mark beside the log at ``log_uri``: (log id, version), or None when there is none."""
    uri = version_mark_uri(log_uri)
    try:
        if is_local(uri):
            with open(local_path(uri), "rb") as fh:
                return _parse(fh.read())
        fs, path = object_store_fs(uri, storage_options or {})
        with fs.open_input_stream(path) as fh:
            return _parse(bytes(fh.read()))
    except FileNotFoundError:
        return None
    except OSError as exc:  # a safeguard that cannot be read must not stop a read of the log
        logger.warning("could not read the version mark %s: %s", uri, exc)
        return None


def raise_mark(log_uri: str, storage_options: dict[str, str] | None, log_id: str | None, version: int) -> None:
    """Raise the mark to ``version`` of the log ``log_id`` (kept if higher; replaced if of another dataset)."""
    if log_id is None:  # a log created before identities: no mark can tell its datasets apart
        return
    uri = version_mark_uri(log_uri)
    try:
        if is_local(uri):
            _raise_local(local_path(uri), log_id, version)
            return
        fs, path = object_store_fs(uri, storage_options or {})
        try:
            with fs.open_input_stream(path) as fh:
                old = _parse(bytes(fh.read()))
        except FileNotFoundError:
            old = None
        if old is not None and old[0] == log_id and old[1] >= version:
            return
        with fs.open_output_stream(path) as fh:
            fh.write(_encode(log_id, version))
    except OSError as exc:  # the run's work is committed; only the safeguard is not raised
        logger.warning("could not raise the version mark %s to %d: %s", uri, version, exc)


def _raise_local(path: str, log_id: str, version: int) -> None:
    if not os.path.isdir(os.path.dirname(path)):
        return  # the experiment is gone (deleted while the run ended): nothing to guard
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        old = _parse(os.read(fd, 4096))
        if old is not None and old[0] == log_id and old[1] >= version:
            return
        os.lseek(fd, 0, os.SEEK_SET)
        os.ftruncate(fd, 0)
        os.write(fd, _encode(log_id, version))
    finally:
        os.close(fd)


def check_mark(
    log_uri: str,
    storage_options: dict[str, str] | None,
    log_id: str | None,
    version: int,
    refresh: Callable[[], int] | None = None,
) -> None:
    """Refuse the log ``log_id`` at ``version`` when a run of this same dataset ended at a higher one.

    ``version`` was read before the mark, so a run that ended in between (other writers committing
    and one of them raising the mark) makes it look behind although nothing is missing. ``refresh``
    reads the latest version again, now after the mark was read: only a version still below the
    mark then is a log rolled back.
    """
    if log_id is None:
        return
    mark = read_mark(log_uri, storage_options)
    if mark is None or mark[0] != log_id or mark[1] <= version:
        return
    if refresh is not None:
        version = refresh()
        if mark[1] <= version:
            return
    raise LogCorruptedError(
        f"{log_uri} is at version {version} but a run of this same log ended at version {mark[1]} "
        f"(recorded in {version_mark_uri(log_uri)}): the manifest of version {mark[1]} (and any after it) "
        "is missing, so acknowledged work would be redone. Nothing was changed. Restore the missing "
        f"_versions manifests from a backup; if the log was restored on purpose, delete "
        f"{version_mark_uri(log_uri)}."
    )
