"""Lance I/O below the log: manifests, durability, error translation, plain table reads and writes.

Nothing here knows about events: these are the facts about a Lance dataset on disk or in a bucket
that :class:`~airflow_provider_datagen.core.store.log.CheckpointLog` builds on, and the plain tables
(sources, source snapshots, exports) that other modules of ``core`` read and write without importing
``lance`` themselves. Every Lance or OS error is translated into a
:class:`~airflow_provider_datagen.exceptions.DatagenError` that names the dataset and the fix.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from typing import TYPE_CHECKING, Any, Final

import lance
import lance.fragment

from airflow_provider_datagen.core.store.paths import is_local, is_log_uri, local_path
from airflow_provider_datagen.exceptions import InvalidItemError, InvalidNameError, LogCorruptedError, LogWriteError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Sequence

    import pyarrow as pa

#: Lance data storage version: legacy blob encoding works on 2.1 and 2.2 (measured).
STORAGE_VERSION: Final = "2.1"
#: Lance's V2 manifest names count down from u64::MAX so that listings return the newest first.
U64: Final = (1 << 64) - 1

#: Object-store answers that mean "wrong bucket, endpoint or credentials", not a damaged log. (A LIST of
#: an existing bucket never answers 404; a GET of a deleted fragment does, and that is damage.)
STORE_ACCESS_ERRORS = (
    "nosuchbucket",
    "403 forbidden",
    "accessdenied",
    "invalidaccesskeyid",
    "signaturedoesnotmatch",
    "error sending request",
    "connection refused",
)

#: The errors a Lance call raises for I/O and dataset problems (translated by :func:`translate`).
LANCE_ERRORS = (OSError, ValueError, RuntimeError)


# --- manifests ------------------------------------------------------------------------------------


def manifest_path(path: str, version: int) -> str:
    """The V2 manifest file of ``version`` in the local dataset directory ``path``."""
    return os.path.join(path, "_versions", f"{U64 - version}.manifest")


def has_manifest(path: str) -> bool:
    try:
        return any(n.endswith(".manifest") for n in os.listdir(os.path.join(path, "_versions")))
    except OSError:
        return False


def later_commit_records(path: str) -> list[str]:
    """Transaction records of commits after the first: Lance names them ``<read_version>-<uuid>.txn``
    (a creation reads version 0; a record being written starts with a dot). Any of them in a directory
    without a manifest means the version history was deleted or not copied: never an empty log."""
    try:
        names = os.listdir(os.path.join(path, "_transactions"))
    except OSError:
        return []
    return [n for n in names if not n.startswith(("0-", "."))]


def being_created(path: str) -> bool:
    """A local dataset directory whose first commit is in flight: no manifest yet, nothing foreign.

    A creating writer makes the directory, then ``data/``, then ``_transactions/`` and ``_versions/``
    and renames the first manifest into place last; a reader may list it at any of those moments
    (an empty directory included) and must see an empty log, not "not a dataset".
    """
    try:
        entries = set(os.listdir(path))
    except OSError:
        return False
    if not entries <= {"data", "_transactions", "_versions"} or has_manifest(path):
        return False
    return not later_commit_records(path)


def is_latest(uri: str, ds: lance.LanceDataset, token: tuple[Any, ...] | None = None) -> bool:
    """True when no version after ``ds`` exists: one stat instead of listing every manifest.

    ``checkout_latest`` lists the whole ``_versions`` directory on a local disk (0.4 ms per 1,000
    manifests, and maintenance keeps an hour of them), which dominated point reads after many small
    commits. Versions are consecutive and Lance's V2 manifest names are ``u64::MAX - version``, so
    "no manifest for version + 1" proves ``ds`` is the latest. ``token`` (see :func:`version_token`),
    when given, must match ``ds``'s manifest: a dataset deleted and written again up to the same
    version has another one. Object stores, or a log with the old naming scheme, always refresh.
    """
    if not is_local(uri):
        return False
    path = local_path(uri)
    version = int(ds.version)
    try:
        st = os.stat(manifest_path(path, version))
    except OSError:
        return False
    if token is not None and (st.st_ino, st.st_mtime_ns) != token:
        return False
    return not os.path.exists(manifest_path(path, version + 1))


#: Schema metadata key of a log's identity, set once at creation: a log deleted and created again
#: at the same URI has another one (version numbers alone cannot tell them apart).
LOG_ID_KEY: Final = b"datagen_log_id"


def with_log_id(schema: pa.Schema) -> pa.Schema:
    """``schema`` with a new log identity in its metadata (for the first commit of a log)."""
    return schema.with_metadata({**(schema.metadata or {}), LOG_ID_KEY: uuid.uuid4().hex.encode()})


def log_id(ds: lance.LanceDataset) -> str | None:
    """The identity a log was created with; None for a log created before identities existed."""
    raw = (ds.schema.metadata or {}).get(LOG_ID_KEY)
    return None if raw is None else raw.decode("ascii", "replace")


def version_token(uri: str, version: int, ds: lance.LanceDataset) -> tuple[Any, ...] | None:
    """The identity of a version's manifest: a dataset deleted and written again reuses numbers.

    Local: the manifest file's inode and mtime (one stat). Object stores: the commit time the
    manifest records, from ``ds`` (the dataset as the caller loaded it) when it is at ``version``,
    so nothing is fetched, else from that version's manifest (one read). None when unknown.
    """
    if is_local(uri):
        try:
            st = os.stat(manifest_path(local_path(uri), version))
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns
    try:
        at = ds if int(ds.version) == version else ds.checkout_version(version)
        return ("committed", str(at.get_version()["timestamp"]))
    except LANCE_ERRORS:
        return None  # that version is gone (cleaned up): its fold cannot be proven of this dataset


def row_versions(ds: lance.LanceDataset) -> bool:
    """Whether rows carry the version that committed them (``_row_created_at_version``).

    Only with stable row ids; otherwise every row reads as version 1. Our logs always have them, a
    dataset written by another tool may not: then no delta since a version can be trusted.
    """
    return bool(getattr(ds, "has_stable_row_ids", False))


# --- errors ---------------------------------------------------------------------------------------


def translate(exc: BaseException, uri: str, action: str) -> Exception:
    """The :class:`DatagenError` for a Lance or OS error raised while ``action`` on the log at ``uri``."""
    msg = str(exc)
    low = msg.lower()
    if isinstance(exc, OSError) and ("no space" in low or getattr(exc, "errno", None) == 28):
        return LogWriteError(
            f"{action} on {uri} failed: no space left on device. The batch was not acknowledged; "
            "free space and rerun: the next run redoes exactly the unacknowledged work."
        )
    listing_404 = "list request" in low and "404" in low
    if not is_local(uri) and (listing_404 or any(s in low for s in STORE_ACCESS_ERRORS)):
        bucket = uri.split("://", 1)[1].split("/", 1)[0]
        return LogWriteError(
            f"{action} on {uri} failed: the object store refused the request or has no bucket "
            f"{bucket!r} ({msg[:200]}). Check the connection's root (bucket and prefix) and its "
            "storage_options (endpoint, region, credentials); nothing was written."
        )
    advice = (
        "Nothing was changed. Restore the dataset directory from a backup or check out an earlier "
        "version (lance restore); run maintain() after restoring."
    )
    if "not found" in low or "no such file" in low or "corrupt" in low or "invalid" in low:
        return LogCorruptedError(
            f"{action} on {uri} failed: a file of the dataset is missing or damaged ({msg[:300]}). {advice}"
        )
    return (
        LogWriteError(f"{action} on {uri} failed: {msg[:500]}")
        if isinstance(exc, OSError)
        else LogCorruptedError(f"{action} on {uri} failed: the dataset is damaged ({msg[:400]}). {advice}")
    )


# --- durability -----------------------------------------------------------------------------------


def committed_files(ds: lance.LanceDataset, seen_fragment_id: int) -> tuple[list[str], int]:
    """The data files the latest commit of ``ds`` added, and the highest fragment id seen since.

    Listing every fragment per commit grew linearly with the log (4 ms a commit at 3,000
    fragments); the transaction record names exactly the new files. Should the record be
    unreadable, fall back to the fragments with ids above ``seen_fragment_id``.
    """
    with contextlib.suppress(OSError, ValueError, RuntimeError, AttributeError):
        tx = ds.read_transaction(int(ds.version))
        frags = getattr(tx.operation, "fragments", None) if tx is not None else None
        if frags is not None:
            return [df.path for frag in frags for df in frag.files], seen_fragment_id
    files: list[str] = []
    for frag in ds.get_fragments():
        if frag.fragment_id > seen_fragment_id:
            files.extend(df.path for df in frag.data_files())
            seen_fragment_id = frag.fragment_id
    return files, seen_fragment_id


def fsync_commit(path: str, ds: lance.LanceDataset, data_files: Iterable[str]) -> None:
    """fsync a commit of the local dataset at ``path``: its data files, its manifest, their directories.

    Lance's local store does not fsync (strace shows no fsync/fdatasync, with or without a
    ``local_fsync`` storage option), so an acknowledged batch could vanish on power loss: this is the
    durability a SQLite manifest gets from ``synchronous=FULL``. Object stores are durable once a PUT
    returns and need none of it.
    """
    paths = [os.path.join(path, "data", name) for name in data_files]
    paths.append(manifest_path(path, int(ds.version)))
    paths.extend((os.path.join(path, "data"), os.path.join(path, "_versions")))
    for name in paths:
        try:
            fd = os.open(name, os.O_RDONLY)
        except FileNotFoundError:
            continue  # compacted away or an older manifest naming scheme: nothing to sync
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# --- writing --------------------------------------------------------------------------------------


def create_dataset(
    table: pa.Table,
    uri: str,
    schema: pa.Schema,
    storage_options: dict[str, str] | None,
    reopen: Callable[[], lance.LanceDataset | None],
) -> lance.LanceDataset:
    """Create the dataset with ``table`` as its first commit, or append it if another writer won.

    ``write_dataset(mode="create")`` commits an Overwrite that Lance retries onto the next version
    when writers race to create the dataset, silently replacing batches already acknowledged to the
    others (measured: 4 processes creating one log at once kept 1 to 3 of their 4 batches). So the
    first commit claims to read version 0 and is never retried: a writer that loses the race
    commits the fragments it already wrote as an Append onto the winner's dataset. ``reopen`` opens
    (and validates) the dataset as it is now, None while there is none.
    """
    try:
        frags = lance.fragment.write_fragments(
            table,
            uri,
            schema=schema,
            mode="create",
            data_storage_version=STORAGE_VERSION,
            enable_stable_row_ids=True,
            storage_options=storage_options,
        )
    except LANCE_ERRORS:
        existing = reopen()  # created since we looked: a plain append
        if existing is None:
            raise
        return append_table(table, existing, schema, storage_options)
    try:
        return lance.LanceDataset.commit(
            uri,
            lance.LanceOperation.Overwrite(schema, frags),
            read_version=0,  # "there was no dataset": a version committed since is a conflict
            max_retries=0,
            enable_stable_row_ids=True,
            storage_options=storage_options,
        )
    except LANCE_ERRORS as exc:
        lost_race: BaseException = exc
    # The winner's first version is already visible when our commit of that version failed; poll
    # briefly for stores that list lazily.
    deadline = time.monotonic() + 10.0
    ds = reopen()
    while ds is None:
        if time.monotonic() > deadline:
            raise lost_race
        time.sleep(0.05)
        ds = reopen()
    return lance.LanceDataset.commit(
        uri, lance.LanceOperation.Append(frags), read_version=ds.version, storage_options=storage_options
    )


def dataset_exists(uri: str, storage_options: dict[str, str] | None) -> bool:
    if is_local(uri):
        return os.path.isdir(os.path.join(local_path(uri), "_versions"))
    try:
        lance.dataset(uri, storage_options=storage_options)
    except LANCE_ERRORS:
        return False
    return True


def overwrite_dataset(
    table: pa.Table | pa.RecordBatchReader, uri: str, storage_options: dict[str, str] | None
) -> lance.LanceDataset:
    """``write_dataset(mode="overwrite")``, but ``mode="create"`` where there is no dataset yet.

    Lance's Rust logger prints ``WARN ... No existing dataset at <uri>, it will be created`` to stderr
    for an overwrite (or append) that creates, straight into the user's terminal or task log. A
    create that loses a race to another writer overwrites what that writer made, as asked.
    """
    if dataset_exists(uri, storage_options):
        return lance.write_dataset(table, uri, mode="overwrite", storage_options=storage_options)
    try:
        return lance.write_dataset(table, uri, mode="create", storage_options=storage_options)
    except LANCE_ERRORS:
        if not dataset_exists(uri, storage_options):
            raise
        return lance.write_dataset(table, uri, mode="overwrite", storage_options=storage_options)


#: How often a one-row setting beside the log (the budget, the plan's source record) is written
#: again after losing a race to another writer of it.
SETTING_WRITE_ATTEMPTS = 5


def overwrite_setting(
    table: pa.Table,
    uri: str,
    storage_options: dict[str, str] | None,
    what: str,
    settled: Callable[[], bool] | None = None,
) -> bool:
    """Overwrite the one-row setting at ``uri`` with ``table``; False when a lost race already left it ``settled``.

    Tasks starting together race to write the same setting; the later write wins, and a lost race
    is retried unless ``settled()`` says the value wanted is there already. ``what`` names the write
    in the error after the last attempt.
    """
    for attempt in range(SETTING_WRITE_ATTEMPTS):
        try:
            overwrite_dataset(table, uri, storage_options)
            return True
        except LANCE_ERRORS as exc:
            if settled is not None and settled():
                return False
            if attempt + 1 == SETTING_WRITE_ATTEMPTS:
                raise translate(exc, uri, what) from None
    raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises


def append_table(
    table: pa.Table, ds: lance.LanceDataset, schema: pa.Schema, storage_options: dict[str, str] | None
) -> lance.LanceDataset:
    """Append ``table`` to ``ds`` in one commit (Lance rebases an append onto the latest version)."""
    return lance.write_dataset(table, ds, schema=schema, mode="append", storage_options=storage_options)


def open_dataset(uri: str, storage_options: dict[str, str] | None) -> lance.LanceDataset:
    """``lance.dataset`` (errors are the caller's to translate: what they mean depends on the dataset)."""
    return lance.dataset(uri, storage_options=storage_options)


# --- plain tables ---------------------------------------------------------------------------------


def read_lance_table(uri: str, storage_options: dict[str, str] | None = None) -> pa.Table:
    """Read a whole Lance dataset (a source of items, a source snapshot); errors name the dataset."""
    try:
        return lance.dataset(uri, storage_options=storage_options).to_table()
    except (OSError, ValueError) as exc:
        raise InvalidItemError(f"source {uri!r} is not a readable Lance dataset: {str(exc)[:300]}") from None


def lance_source_batches(uri: str, storage_options: dict[str, str] | None, batch_size: int) -> Iterator[pa.RecordBatch]:
    """A Lance source's rows in order, a record batch at a time (a streamed plan's read)."""
    try:
        ds = lance.dataset(uri, storage_options=storage_options)
    except (OSError, ValueError) as exc:
        raise InvalidItemError(f"source {uri!r} is not a readable Lance dataset: {str(exc)[:300]}") from None
    yield from ds.to_batches(batch_size=batch_size, scan_in_order=True)


def lance_source_count(uri: str, storage_options: dict[str, str] | None) -> int:
    """How many rows a Lance source has (from its manifest)."""
    try:
        return int(lance.dataset(uri, storage_options=storage_options).count_rows())
    except (OSError, ValueError) as exc:
        raise InvalidItemError(f"source {uri!r} is not a readable Lance dataset: {str(exc)[:300]}") from None


def lance_source_rows(uri: str, rows: Sequence[int], storage_options: dict[str, str] | None) -> pa.Table:
    """The rows at these offsets of a Lance source (a chunk's read)."""
    try:
        return lance.dataset(uri, storage_options=storage_options).take(list(rows))
    except (OSError, ValueError) as exc:
        raise InvalidItemError(f"source {uri!r} is not a readable Lance dataset: {str(exc)[:300]}") from None


def write_source_snapshot(
    uri: str,
    make_table: Callable[[], pa.Table],
    storage_options: dict[str, str] | None,
    *,
    log_uri: str,
) -> None:
    """Write a content-addressed snapshot at ``uri`` unless it exists (same address, same content)."""
    try:
        lance.dataset(uri, storage_options=storage_options)
        return
    except (ValueError, OSError):
        pass
    try:
        overwrite_dataset(make_table(), uri, storage_options)
    except (OSError, ValueError) as exc:
        raise translate(exc, log_uri, "writing the source snapshot") from None


def _refuse_log(uri: str) -> None:
    if is_log_uri(uri):
        raise InvalidNameError(f"export destination {uri!r} is a checkpoint log; export to another path")


def write_results_dataset(
    table: pa.Table | pa.RecordBatchReader, uri: str, storage_options: dict[str, str] | None = None
) -> None:
    """Overwrite the export dataset at ``uri`` (the log is never touched); the table's schema metadata
    is stored with it (see :func:`export_metadata`). A reader is written as it streams."""
    _refuse_log(uri)
    try:
        overwrite_dataset(table, uri, storage_options)
    except (OSError, ValueError) as exc:
        raise LogWriteError(f"writing the export to {uri} failed: {str(exc)[:300]}") from None


def export_metadata(uri: str, storage_options: dict[str, str] | None = None) -> tuple[dict[str, str], int] | None:
    """The schema metadata and row count of the export dataset at ``uri``; None when there is none.

    What an earlier export stored about its content (``export.py`` compares it before writing). A
    destination that cannot be read counts as none: the export then writes, and reports what fails.
    """
    _refuse_log(uri)
    if is_local(uri) and not os.path.exists(local_path(uri)):
        return None  # nothing to open (and no "dataset not found" to provoke)
    try:
        ds = lance.dataset(uri, storage_options=storage_options)
        meta = ds.schema.metadata or {}
        return {k.decode(): v.decode() for k, v in meta.items()}, int(ds.count_rows())
    except LANCE_ERRORS:
        return None


def local_size_bytes(uri: str) -> int:
    """The bytes a local dataset takes on disk; 0 for an object-store URI (listing it would cost requests)."""
    if not is_local(uri):
        return 0
    size = 0
    for dirpath, _, files in os.walk(local_path(uri)):
        for name in files:
            with contextlib.suppress(OSError):
                size += os.path.getsize(os.path.join(dirpath, name))
    return size
