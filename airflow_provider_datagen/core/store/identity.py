"""Which dataset a log object reads, and how far it has read it: a recreated log versus a rollback.

An experiment deleted and created again is another dataset at the same URI, with the same version
numbers: a long-lived log object (the UI's reader keeps one per experiment) must read the new one
afresh. The same dataset at a version older than one already read (its newest manifest deleted) is
damage: folding it would redo acknowledged work, so it is refused, never rolled back silently. A
log's identity is a uuid set in its schema metadata at creation (:func:`lance_io.log_id`); every
check here is a comparison of cached values, so reads stay O(1).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_provider_datagen.core.store import lance_io
from airflow_provider_datagen.core.store.paths import is_local
from airflow_provider_datagen.exceptions import LogCorruptedError

if TYPE_CHECKING:
    import lance


class DatasetIdentity:
    """The dataset a log object read last: its identity, the highest version seen, its manifest's stat."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.known = False
        #: the log id (None for a log created before ids existed)
        self.log_id: str | None = None
        #: the highest version of this dataset seen: a lower one is a rollback
        self.seen_version = 0
        #: the identity of the manifest of the version read last (local logs; see lance_io.is_latest)
        self.manifest_token: tuple[Any, ...] | None = None

    def adopt(self, ds: lance.LanceDataset) -> bool:
        """Take ``ds`` as the dataset read; True when it is another dataset than the one read before.

        Raises :class:`LogCorruptedError` when it is the same dataset at an older version.
        """
        log_id = lance_io.log_id(ds)
        version = int(ds.version)
        other = self.known and log_id != self.log_id
        if other:
            self.forget()
        elif version < self.seen_version:
            raise LogCorruptedError(
                f"{self.uri} went back from version {self.seen_version} (read before) to version {version}: "
                f"the manifest of version {self.seen_version} (and any after it) is missing, so acknowledged "
                "work would be redone. Nothing was changed. Restore the missing _versions manifests from a "
                "backup; if the log was restored on purpose, open it with a new CheckpointLog (a new process)."
            )
        self.log_id, self.known = log_id, True
        self.note(ds)
        return other

    def note(self, ds: lance.LanceDataset) -> None:
        """Remember ``ds``'s version as seen (an int and, locally, one stat of its manifest)."""
        version = int(ds.version)
        self.seen_version = max(self.seen_version, version)
        self.manifest_token = lance_io.version_token(self.uri, version, ds) if is_local(self.uri) else None

    def forget(self) -> None:
        self.known, self.log_id, self.seen_version, self.manifest_token = False, None, 0, None

    def ahead(self, log_id: str | None, version: int) -> bool:
        """Whether a record of ``version`` of the log ``log_id`` is of this dataset and past what was seen."""
        return log_id is not None and self.known and log_id == self.log_id and version > self.seen_version

    def behind_error(self, current: int, what: str, uri: str, version: int) -> LogCorruptedError:
        return LogCorruptedError(
            f"{self.uri} is at version {current} but {what} {uri} records version {version} of this same log: "
            f"the manifest of version {version} (and any after it) is missing, so acknowledged work would be "
            f"redone. Nothing was changed. Restore the missing _versions manifests from a backup; if the log "
            f"was restored on purpose, delete {uri} (it is disposable and rebuilt by maintain())."
        )
