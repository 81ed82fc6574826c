"""Epoch claims: every caller of ``CheckpointLog.next_epoch`` gets an epoch no other caller got.

Fencing keeps, per item, the events of the highest epoch; two writers that both read "the highest
epoch in the log is 4" before either wrote would both write at 5, and one item could then hold
fields of both generations. So an epoch is claimed, not just read: a counter beside the log (the
last epoch handed out) is raised under a lock, to ``max(counter, highest epoch in the log) + 1``.

* Local root: one host owns the files, so a blocking ``flock`` on the counter file is exact (and
  released by the kernel when its holder dies).
* Object store: no lock service is assumed and a conditional PUT is not trusted (moto's is racy
  under contention), so the counter object is read and written under a short
  :class:`~airflow_provider_datagen.core.store.lease.ObjectLease` (Fischer's timed exclusion:
  a few seconds per claim, once per task attempt).

The log's own highest epoch is the floor, so a log written before claims existed (or by writers
passing explicit epochs) still gets a larger epoch: newer is always larger.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import random
import time

from airflow_provider_datagen.core.store.lease import ObjectLease
from airflow_provider_datagen.core.store.paths import (
    EPOCH_LEASE_OBJECT,
    epoch_uri,
    experiment_uri,
    is_local,
    local_path,
    object_store_fs,
)
from airflow_provider_datagen.exceptions import LogCorruptedError, LogWriteError

logger = logging.getLogger(__name__)

#: Writer epochs are int32 (see core/store/writer.py).
MAX_EPOCH = (1 << 31) - 1
#: How long an object-store claim waits for the claim lease held by others before giving up.
CLAIM_TIMEOUT_SECONDS = 300.0
#: The claim lease's lifetime: a claimer whose host died blocks the others this long at most.
CLAIM_LEASE_TTL_SECONDS = 60.0


def _next(last: int, floor: int, where: str) -> int:
    epoch = max(last + 1, floor)
    if epoch > MAX_EPOCH:
        raise LogWriteError(
            f"{where}: the next epoch {epoch} exceeds {MAX_EPOCH}; writers' epochs are int32. "
            "Start a new experiment (the log cannot fence newer writers any more)."
        )
    return epoch


def _parse(raw: bytes, where: str) -> int:
    text = raw.decode("ascii", "replace").strip()
    if not text:
        return 0
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise LogCorruptedError(
            f"the epoch counter {where} holds {text[:80]!r}, not an epoch. Delete it: the next claim "
            "starts again above the highest epoch in the log."
        )
    return value


def claim_epoch(log_uri: str, storage_options: dict[str, str] | None, floor: int) -> int:
    """Claim the next epoch of the log at ``log_uri``: at least ``floor``, above every epoch claimed before."""
    if is_local(log_uri):
        return _claim_local(local_path(epoch_uri(log_uri)), floor)
    return _claim_object(log_uri, storage_options or {}, floor)


def _claim_local(path: str, floor: int) -> int:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # held for one read and one write: microseconds
        os.lseek(fd, 0, os.SEEK_SET)
        epoch = _next(_parse(os.read(fd, 64), path), floor, path)
        data = str(epoch).encode()
        os.lseek(fd, 0, os.SEEK_SET)
        os.ftruncate(fd, 0)
        os.write(fd, data)
        # A claim lost in a crash could be handed out twice after reboot; the fsync keeps it.
        os.fsync(fd)
        return epoch
    finally:
        os.close(fd)  # closing releases the flock


def _claim_object(log_uri: str, storage_options: dict[str, str], floor: int) -> int:
    uri = epoch_uri(log_uri)
    lease = ObjectLease(f"{experiment_uri(log_uri)}/{EPOCH_LEASE_OBJECT}", storage_options, ttl=CLAIM_LEASE_TTL_SECONDS)
    deadline = time.monotonic() + CLAIM_TIMEOUT_SECONDS
    while not lease.acquire():
        if time.monotonic() > deadline:
            raise LogWriteError(
                f"claiming an epoch for {log_uri}: the claim lease {lease.uri} stayed held for "
                f"{CLAIM_TIMEOUT_SECONDS:.0f} s. If no task is starting, delete that object; else retry the task."
            )
        time.sleep(random.uniform(0.2, 1.0))  # jitter: claimers that collided do not collide again
    try:
        fs, path = object_store_fs(uri, storage_options)
        try:
            with fs.open_input_stream(path) as fh:
                last = _parse(bytes(fh.read()), uri)
        except FileNotFoundError:
            last = 0
        epoch = _next(last, floor, uri)
        with fs.open_output_stream(path) as fh:
            fh.write(str(epoch).encode())
        return epoch
    except OSError as exc:
        raise LogWriteError(
            f"claiming an epoch for {log_uri} failed: {exc}. Check that the object store is reachable; "
            "no epoch was claimed, retry the task."
        ) from exc
    finally:
        lease.release()
