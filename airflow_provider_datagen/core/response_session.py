"""A run's side of the response store: lookups, write-behind puts, and the flush before each log commit.

:class:`ResponseSession` wraps the :class:`~airflow_provider_datagen.core.store.responses.ResponseStore`
under the log's root for one run (``run_items`` opens it when a step of the pipeline asks for it,
``uses_response_store``). Replies are put into a queue and appended in batches by a thread of the
session every :data:`FLUSH_SECONDS`, so a request's reply costs it no commit of its own; the run
calls :meth:`ResponseSession.flush` before each commit of the log (``RunShared.before_commit``), so
a reply is in the store before the item whose step it answered is acknowledged, and one that arrived
more than ``FLUSH_SECONDS`` plus an append before a crash is never asked again.

The model step finds the run's session with :func:`current_session` (the run's event loop or its
threads may not share the run's context variables, so the session is registered process-wide while
the run lasts; keys are content addresses, so with two runs at once in one process a lookup in the
other run's store still finds only right answers).
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_provider_datagen.core.store.responses import ResponseEntry, ResponseStore

logger = logging.getLogger(__name__)

#: how often the write-behind thread appends the replies that arrived
FLUSH_SECONDS = 0.1
#: a run that wrote to a store of more fragments than this compacts it as it ends (a flush adds one)
COMPACT_FRAGMENTS = 256

_ACTIVE: list[ResponseSession] = []
_ACTIVE_LOCK = threading.Lock()


class ResponseSession:
    """One run's use of the response store (see the module).

    :param store: the store (opened, so a bad one has failed already).
    :param pipeline: the run's pipeline, recorded with each entry it makes.
    :param experiment: the run's experiment, recorded with each entry it makes.
    """

    def __init__(self, store: ResponseStore, pipeline: str | None = None, experiment: str | None = None) -> None:
        self.store = store
        self.pipeline = pipeline
        self.experiment = experiment
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._pending: list[ResponseEntry] = []
        #: what this run put: answered without a read, and never put twice
        self._mine: dict[str, ResponseEntry] = {}
        self._error: BaseException | None = None
        self._wake = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        self.puts = 0

    @classmethod
    def for_log(cls, log: Any) -> ResponseSession:
        """The session of a run of ``log``: the store under the log's root, with its storage options.

        :raises ResponseStoreError: the store is not usable (before any request and any write).
        """
        from airflow_provider_datagen.core.store.responses import ResponseStore

        store = ResponseStore.open(log.root, log.storage_options)
        return cls(store, getattr(log, "pipeline", None), getattr(log, "experiment", None))

    def lookup(self, key: str) -> ResponseEntry | None:
        """The stored reply of ``key`` (this run's puts first), or None; a stored entry's
        ``request_json`` is not read (None): the request is the one being asked, same key."""
        with self._lock:
            mine = self._mine.get(key)
        if mine is not None:
            return mine
        return self.store.get_many([key], request_json=False, provenance=False).get(key)

    def lookup_many(self, keys: list[str]) -> dict[str, ResponseEntry]:
        """The stored replies of ``keys`` (this run's puts first) in one read of the store (see :meth:`lookup`)."""
        with self._lock:
            found = {k: e for k in keys if (e := self._mine.get(k)) is not None}
        rest = [k for k in keys if k not in found]
        if rest:
            found.update(self.store.get_many(rest, request_json=False, provenance=False))  # the reply answers
        return found

    def put(self, entry: ResponseEntry) -> None:
        """Queue ``entry`` for the store (appended within :data:`FLUSH_SECONDS`, or by :meth:`flush`)."""
        with self._lock:
            if entry.key in self._mine:
                return
            self._mine[entry.key] = entry
            self._pending.append(entry)
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._serve, name="datagen-responses", daemon=True)
                self._thread.start()

    def flush(self) -> None:
        """Append every queued reply, durably, before returning; a failed append raises here.

        :raises ResponseStoreError: an append failed (now or in the write-behind thread).
        """
        with self._write_lock:
            with self._lock:
                batch, self._pending = self._pending, []
                error, self._error = self._error, None
            if error is not None:
                with self._lock:
                    self._pending = batch + self._pending
                raise error
            if batch:
                try:
                    self.store.put_many(batch)
                except BaseException:
                    with self._lock:
                        self._pending = batch + self._pending
                    raise
                self.puts += len(batch)

    def _serve(self) -> None:
        while not self._closed:
            self._wake.wait(FLUSH_SECONDS)
            try:
                self.flush()
            except BaseException as exc:  # kept for the next flush() of the run, which raises it
                logger.warning("the response store %s refused an append: %s", self.store.uri, exc)
                with self._lock:
                    self._error = exc

    def close(self) -> None:
        """Stop the write-behind thread, append what is queued, and compact a store of many fragments."""
        self._closed = True
        self._wake.set()
        thread = self._thread
        if thread is not None:
            thread.join()
        self.flush()
        if self.puts:
            self.store.compact(above_fragments=COMPACT_FRAGMENTS)


def activate(session: ResponseSession) -> None:
    """Make ``session`` the one :func:`current_session` returns while its run lasts."""
    with _ACTIVE_LOCK:
        _ACTIVE.append(session)


def deactivate(session: ResponseSession) -> None:
    """The run of ``session`` ended."""
    with _ACTIVE_LOCK:
        if session in _ACTIVE:
            _ACTIVE.remove(session)


def current_session() -> ResponseSession | None:
    """The response session of the run in progress (the latest started), or None outside a run."""
    with _ACTIVE_LOCK:
        return _ACTIVE[-1] if _ACTIVE else None


def uses_response_store(step: Any) -> bool:
    """Whether a leaf step under ``step`` (``step`` included) asks for the response store."""
    fn = getattr(step, "fn", None)
    if getattr(fn, "uses_response_store", False) is True:
        return True
    children = getattr(step, "children", None)
    return callable(children) and any(uses_response_store(c) for c in children())
