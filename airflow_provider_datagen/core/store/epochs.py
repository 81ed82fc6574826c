"""Epoch claims: every caller of ``CheckpointLog.next_epoch`` gets an epoch no other caller got.

Fencing keeps, per item, the events of the highest epoch; two writers that both read "the highest
epoch in the log is 4" before either wrote would both write at 5, and one item could then hold
fields of both generations. So an epoch is claimed, not just read: a counter beside the log (the
last epoch handed out) is raised under a lock, to ``max(counter, highest epoch in the log) + 1``.

* Local root: one host owns the files, so a blocking ``flock`` on the counter file is exact (and
  released by the kernel when its holder dies).
* Object store: no lock service is assumed and a conditional PUT is not trusted (moto's is racy
  under contention): each claim is an object of its own under ``.epochs/``, and a claim wins when
  no other claim at or above it is listed after it was written (see :func:`_claim_object`).

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
import uuid
from typing import Any

from airflow_provider_datagen.core.store.paths import (
    EPOCH_CLAIMS_DIR,
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
#: How long an object-store claimer keeps losing to others before it gives up.
CLAIM_TIMEOUT_SECONDS = 300.0


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
    """One PUT and one LIST per try: a claim of ``c`` wins when, after writing it, no other claim >= ``c`` is listed.

    S3 (and moto) list what was written before the listing began (strong read-after-write), so of
    two claimers of the same ``c`` each lists the other's object once both are written, and a later
    claimer of a lower number lists the winner's higher one: at most one claimer wins a number, and
    every win is above every earlier one. Losers try again one higher after a short jittered wait.
    No conditional PUT and no timed lease is needed, so a claim takes milliseconds.
    """
    import pyarrow.fs as pafs

    fs, path = object_store_fs(f"{experiment_uri(log_uri)}/{EPOCH_CLAIMS_DIR}", storage_options)
    token = uuid.uuid4().hex
    deadline = time.monotonic() + CLAIM_TIMEOUT_SECONDS
    try:
        while True:
            claims = _listed_claims(fs, pafs, path)
            mine = _next(max(claims, default=0) + 1, floor, log_uri)
            with fs.open_output_stream(f"{path}/{mine:010d}-{token}") as fh:
                fh.write(b"")
            rivals = [n for n, t in _listed_claim_names(fs, pafs, path) if n >= mine and t != token]
            if not rivals:
                _prune(fs, path, mine)
                return mine
            if time.monotonic() > deadline:
                raise LogWriteError(
                    f"claiming an epoch for {log_uri}: other claims kept winning for {CLAIM_TIMEOUT_SECONDS:.0f} s; "
                    "retry the task."
                )
            time.sleep(random.uniform(0.01, 0.2))  # jitter: claimers that collided do not collide again
    except OSError as exc:
        raise LogWriteError(
            f"claiming an epoch for {log_uri} failed: {exc}. Check that the object store is reachable; "
            "no epoch was claimed, retry the task."
        ) from exc


def _listed_claim_names(fs: Any, pafs: Any, path: str) -> list[tuple[int, str]]:
    """The (number, token) of every claim object under ``path``; a name not of a claim is skipped."""
    out = []
    for info in fs.get_file_info(pafs.FileSelector(path, allow_not_found=True)):
        number, _, token = info.base_name.partition("-")
        if number.isdigit() and token:
            out.append((int(number), token))
    return out


def _listed_claims(fs: Any, pafs: Any, path: str) -> list[int]:
    return [n for n, _ in _listed_claim_names(fs, pafs, path)]


def _prune(fs: Any, path: str, won: int) -> None:
    """Delete claims below ``won`` (best effort): a later claimer needs only the highest to go above it."""
    import pyarrow.fs as pafs

    for info in fs.get_file_info(pafs.FileSelector(path, allow_not_found=True)):
        number = info.base_name.partition("-")[0]
        if number.isdigit() and int(number) < won:
            try:
                fs.delete_file(info.path)
            except OSError:
                logger.debug("could not prune the epoch claim %s", info.path)
