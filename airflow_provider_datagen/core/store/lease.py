"""A lease that holds across hosts: a flock on a local root, a timed object on an object store.

On a local root one host owns the files, so a non-blocking ``flock`` is exact. On an object store
(S3, GCS, Azure) workers on many hosts share the experiment's directory and no lock service is
assumed, so the lease is an object beside the log holding ``{token, holder, expires_at}``, taken
with Fischer's timed mutual exclusion (docs/adr/0013-cross-host-leases.md):

1. read the object; a live lease of another holder means "not acquired";
2. write our record, and give up if the read-to-write span took longer than ``write_bound``;
3. wait ``settle`` (> ``write_bound``), read again: the lease is ours only if our token is there.

Two acquirers that both passed step 1 both write; whichever writes last overwrites the other, and the
first one's read-back in step 3 sees it, unless the last write landed more than ``settle`` after
the first one's, which step 2 forbids. It needs no conditional PUT (moto's is racy under
contention, and not every store has one) and relies only on read-after-write consistency, which S3,
GCS and Azure Blob all give. Lance's optimistic commit stays the last arbiter: a maintenance that
outlives its lease and races a successor loses its commit, and nothing is lost either way.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import time
import uuid
from typing import Any

from tenacity import retry, retry_if_exception, stop_after_attempt, wait_exponential

from airflow_provider_datagen.core.store.paths import is_local, local_path, object_store_fs
from airflow_provider_datagen.exceptions import LogWriteError, bad_argument

logger = logging.getLogger(__name__)

#: How long an object lease lives unless released (a holder whose host died blocks others this long).
LEASE_TTL_SECONDS = 900.0
#: The longest a read-then-write may take; a slower one gives up (its record then just expires).
WRITE_BOUND_SECONDS = 2.0
#: The wait before the read-back; must exceed the write bound (Fischer's condition).
SETTLE_SECONDS = 3.0
#: Calls of one read or write of the lease object before a transient store error is raised.
STORE_ATTEMPTS = 4


def _transient(exc: BaseException) -> bool:
    # pyarrow raises a bare OSError for what the store's client gave up on (a dropped response stream,
    # a 5xx); a missing object is an answer, not a failure.
    return isinstance(exc, OSError) and not isinstance(exc, FileNotFoundError)


#: Object-store calls of a lease: a transient error is tried again shortly (a timing step that then
#: overruns ``write_bound`` gives up as any slow step does, so a retry never weakens the exclusion).
_store_call = retry(
    retry=retry_if_exception(_transient),
    stop=stop_after_attempt(STORE_ATTEMPTS),
    wait=wait_exponential(multiplier=0.1, max=1.0),
    reraise=True,
)


class FileLease:
    """At most one holder per file on this host: a non-blocking ``flock`` (released on process death)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> bool:
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


class ObjectLease:
    """At most one holder across hosts of the lease object at ``uri`` on an object store.

    :param uri: the lease object's URI (``s3://bucket/.../.maintenance.lease``).
    :param storage_options: the log's storage options (endpoint, region, credentials).
    :param ttl: seconds the lease lives unless released.
    :param write_bound: the longest a read-then-write may take before the attempt gives up.
    :param settle: seconds between our write and the read-back; must exceed ``write_bound``.
    """

    def __init__(
        self,
        uri: str,
        storage_options: dict[str, str] | None = None,
        *,
        ttl: float = LEASE_TTL_SECONDS,
        write_bound: float = WRITE_BOUND_SECONDS,
        settle: float = SETTLE_SECONDS,
    ) -> None:
        if settle <= write_bound:
            raise bad_argument(
                self,
                "settle",
                settle,
                f"does not exceed write_bound={write_bound}",
                "make settle longer than write_bound",
            )
        self.uri = uri
        self.ttl = ttl
        self.write_bound = write_bound
        self.settle = settle
        self.token = uuid.uuid4().hex
        self.holder = f"{socket.gethostname()}:{os.getpid()}"
        self._fs, self._path = object_store_fs(uri, storage_options or {})
        self._expires_at: float | None = None

    def _store_error(self, exc: OSError, action: str) -> LogWriteError:
        return LogWriteError(
            f"{action} the lease {self.uri} failed {STORE_ATTEMPTS} times: {exc}. Check that the object "
            "store is reachable (the connection's storage_options); no lease was taken and nothing was written."
        )

    @_store_call
    def _get(self) -> bytes | None:
        try:
            with self._fs.open_input_stream(self._path) as fh:
                return bytes(fh.read())
        except FileNotFoundError:
            return None

    @_store_call
    def _put(self, payload: bytes) -> None:
        with self._fs.open_output_stream(self._path) as fh:
            fh.write(payload)

    def _read(self) -> dict[str, Any] | None:
        try:
            raw = self._get()
        except OSError as exc:
            raise self._store_error(exc, "reading") from exc
        if raw is None:
            return None
        try:
            record = json.loads(raw)
        except ValueError:
            return None  # not ours to interpret: treated as absent (an object PUT is atomic, so never partial)
        return record if isinstance(record, dict) else None

    def _write(self, record: dict[str, Any]) -> None:
        try:
            self._put(json.dumps(record).encode())
        except OSError as exc:
            raise self._store_error(exc, "writing") from exc

    def current(self) -> dict[str, Any] | None:
        """The lease record as stored now, or ``None``."""
        return self._read()

    def acquire(self) -> bool:
        """Take the lease; ``False`` when another holder's lease is live or a racer won."""
        started = time.monotonic()
        current = self._read()
        if current is not None and current.get("token") != self.token:
            if float(current.get("expires_at", 0)) > time.time():
                return False
            logger.info("taking over the expired lease %s of %s", self.uri, current.get("holder"))
        expires_at = time.time() + self.ttl
        self._write({"token": self.token, "holder": self.holder, "expires_at": expires_at})
        took = time.monotonic() - started
        if took > self.write_bound:
            # A racer may have read "free" before this write landed and still be inside its settle
            # time; only a bounded read-to-write span keeps the read-back decisive. The record stays
            # and expires (deleting it could erase a racer's valid lease).
            logger.warning(
                "lease %s: read and write took %.1f s > %.1f s; not taking it", self.uri, took, self.write_bound
            )
            return False
        time.sleep(self.settle)
        back = self._read()
        if back is None or back.get("token") != self.token:
            return False
        self._expires_at = expires_at
        return True

    def release(self) -> None:
        """Delete the lease object if it is still ours and live (an expired one may be a successor's by now)."""
        if self._expires_at is None:
            return
        expires_at, self._expires_at = self._expires_at, None
        # Leave a margin: between our read and our delete a successor must not be able to take it over.
        if time.time() > expires_at - self.write_bound - self.settle:
            return
        try:
            back = self._read()
            if back is not None and back.get("token") == self.token:
                self._delete()
        except (LogWriteError, OSError) as exc:
            # Released or not, the work under the lease is done; an undeleted record only makes the
            # next holder wait for its expiry.
            logger.warning("could not release the lease %s (%s); it expires at %.0f", self.uri, exc, expires_at)

    @_store_call
    def _delete(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._fs.delete_file(self._path)


def lease_for(uri: str, storage_options: dict[str, str] | None = None, **timing: float) -> FileLease | ObjectLease:
    """The lease at ``uri``: a :class:`FileLease` on a local path, an :class:`ObjectLease` on an object store."""
    if is_local(uri):
        return FileLease(os.path.normpath(local_path(uri)))
    return ObjectLease(uri, storage_options, **timing)
