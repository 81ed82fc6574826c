"""The read side of the UI: the experiments under one root and the page data of each.

Everything here returns plain JSON-able dicts so the HTML pages and the ``/datagen/api`` routes show
the same facts. Nothing here knows about HTTP or HTML; the only Airflow imports are the hook and the
configuration, when the app resolves its reader.

Folds are the expensive part (one vectorized ``states()`` over every light column of the log), so
the per-item state table of an experiment is computed once per log *version* and kept, sorted by
item id, in a small LRU (:mod:`.cache`): paging, filtering and searching 100k items are then Arrow
kernels over that table. A new commit changes the log's version and the next request folds again.
The item page and the task-instance tab build their data in :mod:`.item_view` and :mod:`.ti_view`.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_datagen.core import CheckpointLog, EventType, ItemStatus
from airflow_provider_datagen.core.ids import check_name
from airflow_provider_datagen.core.status import FAILED, failed_mask
from airflow_provider_datagen.core.store.paths import CHECKPOINTS_DIR, LOG_DIR, ExperimentRef, list_experiments
from airflow_provider_datagen.core.store.source_ref import INLINE, SourceRef, recorded_source, source_stamp
from airflow_provider_datagen.core.store.tally import in_batch
from airflow_provider_datagen.exceptions import ConfigurationError, DatagenError, NotFoundError
from airflow_provider_datagen.hooks.datagen import DatagenHook, redact_uri
from airflow_provider_datagen.plugins.access import Writers
from airflow_provider_datagen.plugins.cache import VersionedCache
from airflow_provider_datagen.plugins.exchange_view import StoreUnavailable, item_exchanges, unavailable_reason
from airflow_provider_datagen.plugins.insights import next_run, open_batches, spend_panel, throughput
from airflow_provider_datagen.plugins.item_view import RESOLVED_STATUSES, attempt_facts, iso, item_data
from airflow_provider_datagen.plugins.ti_view import TaskInstanceKey, current_status, key_ranges, scan_task_instance

if TYPE_CHECKING:
    from collections.abc import Callable

    from airflow_provider_datagen.core.store.responses import ResponseEntry, ResponseStore

logger = logging.getLogger(__name__)

#: Filters the items table understands: the lifecycle statuses plus two failure-lens views.
STATUS_FILTERS = (
    *(s.value for s in ItemStatus),
    FAILED,  # running with at least one FAILED row: what a rerun will retry
    "violations",  # fencing violations found by the fold
)
SCOPES = ("roots", "all", "children")
MAX_PAGE_SIZE = 500
#: Rows of the experiment page's failure list; the rest is counted.
RECENT_FAILURES = 20

# Columns of the experiment page's failure list: never tracebacks (those are on the item page).
_FAILURE_COLUMNS = (
    "event_id",
    "item_id",
    "item_seq",
    "error_type",
    "error_message",
    "step",
    "iteration",
    "fanout_index",
    "writer_id",
    "writer_epoch",
    "input_fingerprint",
    "dag_id",
    "run_id",
    "task_id",
    "map_index",
    "try_number",
    "created_at",
)
# Read with them for the retry facts (a transient attempt, its number and wait), not shown as they are.
_ATTEMPT_COLUMNS = ("status", "value_json")


# The usage ledger's read side, in one place: ``log.usage()``, ``log.item_usage(item_id)`` and
# ``log.budget()``.
def usage_of(event_log: CheckpointLog) -> dict[str, Any]:
    """The experiment's usage totals (``log.usage()``)."""
    return dict(event_log.usage())


def item_usage_of(event_log: CheckpointLog, item_id: str) -> dict[str, Any]:
    """One item's usage totals and its attempts (``log.item_usage(item_id)``)."""
    return dict(event_log.item_usage(item_id))


def budget_of(event_log: CheckpointLog) -> dict[str, Any]:
    """The budget recorded for the experiment (``log.budget()``), None where none is set."""
    return dict(event_log.budget())


#: An open event log and the version it was read at (one refresh per request).
Opened = tuple[CheckpointLog, int]


@dataclass
class Prepared:
    """Everything the experiment page needs that depends only on the log version."""

    version: int
    states: pa.Table  # STATE_SCHEMA + depth, sorted by item_id
    summary: dict[str, Any]
    stats: dict[str, Any]
    counts_all: dict[str, int]
    fold_seconds: float


def running_not_failed(summary: dict[str, Any]) -> int:
    """Root items started and not finished whose attempts have not failed (``running`` minus failed).

    ``running`` in a status dict counts every started, unfinished item; the failed ones among them
    (``failed_items``, by :func:`~airflow_provider_datagen.core.status.failed_mask`) are shown apart.
    """
    return max(0, int(summary.get("running") or 0) - int(summary.get("failed_items") or 0))


def _ti_of(row: dict[str, Any]) -> TaskInstanceKey:
    """The task instance that wrote an event row (map index -1 when unmapped or not recorded)."""
    mi = row.get("map_index")
    return TaskInstanceKey(row.get("dag_id"), row.get("run_id"), row.get("task_id"), -1 if mi is None else int(mi))


def with_chunk_labels(event_log: CheckpointLog, data: dict[str, Any]) -> dict[str, Any]:
    """An item page's rows, each naming the mapped task that wrote it by its key range (``chunk_label``)."""
    lists = ("events", "failures", "input_versions")
    tis = {_ti_of(r): None for name in lists for r in data[name] if r.get("dag_id") and r.get("run_id")}
    labels = key_ranges(event_log, [ti for ti in tis if ti.task_id and ti.map_index >= 0])
    out = dict(data)
    for name in lists:
        out[name] = [
            {**r, "chunk_label": labels.get(_ti_of(r)) if r.get("dag_id") and r.get("run_id") else None}
            for r in data[name]
        ]
    return out


def _counts(states: pa.Table) -> dict[str, int]:
    counts = {s.value: 0 for s in ItemStatus}
    if states.num_rows:
        for entry in pc.value_counts(states["status"]).to_pylist():
            counts[entry["values"]] = int(entry["counts"])
    return counts


class Reader:
    """Read access to every experiment under one root, with folds cached per log version."""

    def __init__(self, root: str, storage_options: dict[str, str] | None = None, conn_id: str | None = None) -> None:
        self.root = root
        self.storage_options = dict(storage_options or {})
        self.conn_id = conn_id
        self._logs: dict[ExperimentRef, CheckpointLog] = {}
        self._logs_lock = threading.Lock()
        self._prepared = VersionedCache()
        self._failures = VersionedCache()
        self._ti = VersionedCache(size=32)
        self._items = VersionedCache(size=64)
        self._insights = VersionedCache()
        # one entry per experiment: the index page asks for every experiment on each request
        self._writers = VersionedCache(size=4096)
        #: the response store under the root, opened by the first item page that shows an exchange
        #: (its lookup index is kept and extended, not rebuilt per page)
        self._responses: ResponseStore | None = None
        self._responses_lock = threading.Lock()

    @property
    def shown_root(self) -> str:
        """The root fit for a page: user-info of a URI dropped (credentials never reach the browser)."""
        return redact_uri(self.root)

    def experiments(self) -> list[ExperimentRef]:
        return list_experiments(self.root, self.storage_options)

    def log(self, pipeline: str, experiment: str) -> CheckpointLog:
        """The open event log of an existing experiment; :class:`NotFoundError` for anything else."""
        return self.open(pipeline, experiment)[0]

    def open(self, pipeline: str, experiment: str) -> Opened:
        """The open event log of an existing experiment and its current version (one refresh)."""
        try:
            ref = ExperimentRef(check_name(pipeline, "pipeline"), check_name(experiment, "experiment"))
        except DatagenError as exc:
            raise NotFoundError(f"no experiment {pipeline!r}/{experiment!r}: {exc}") from None
        with self._logs_lock:
            event_log = self._logs.get(ref)
        if event_log is None:
            event_log = CheckpointLog.open(
                self.root,
                pipeline=ref.pipeline,
                experiment=ref.experiment,
                storage_options=self.storage_options or None,
                # every experiment ever shown stays open here: its folds live in the bounded caches
                remember_fold=False,
            )
            with self._logs_lock:
                event_log = self._logs.setdefault(ref, event_log)
        # Each refresh reads the latest manifest; one per request is enough.
        version = event_log.version
        if version == 0:
            raise NotFoundError(
                f"no experiment {pipeline!r}/{experiment!r} under {self.shown_root}: it has no log yet "
                f"(expected {CHECKPOINTS_DIR}/{pipeline}/{experiment}/{LOG_DIR}); check the pipeline and "
                "experiment names or the datagen connection's root"
            )
        return event_log, version

    # -- access --------------------------------------------------------------------------------

    def writers(self, pipeline: str, experiment: str, opened: Opened | None = None) -> Writers:
        """The Dags that wrote an experiment (one scan of the ``dag_id`` column, cached per version)."""
        event_log, version = opened or self.open(pipeline, experiment)

        def compute() -> Writers:
            column = event_log.scan(["dag_id"])["dag_id"]
            dag_ids = pc.unique(column.drop_null()).to_pylist() if column.null_count < len(column) else []
            return Writers(frozenset(dag_ids), outside=column.null_count > 0)

        return self._writers.get((pipeline, experiment, version), compute)

    # -- experiment level ----------------------------------------------------------------------

    def prepared(self, pipeline: str, experiment: str, opened: Opened | None = None) -> Prepared:
        event_log, version = opened or self.open(pipeline, experiment)
        return self._prepared.get((pipeline, experiment, version), lambda: self._prepare(event_log, version))

    @staticmethod
    def _prepare(event_log: CheckpointLog, version: int) -> Prepared:
        started = time.perf_counter()
        states = event_log.states()
        states = states.sort_by("item_id") if states.num_rows else states
        depth = pc.count_substring(states["item_id"], "/") if states.num_rows else pa.array([], pa.int32())
        states = states.append_column("depth", pc.cast(depth, pa.int32()))
        summary = event_log.summary(states.drop_columns(["depth"]))
        # The table was folded at `version`; the summary must say so even if a commit landed since.
        summary["log_version"] = version
        fold_seconds = time.perf_counter() - started
        logger.debug("folded %s at version %d in %.3f s", event_log.uri, version, fold_seconds)
        return Prepared(
            version=version,
            states=states,
            summary=summary,
            stats=event_log.stats(),
            counts_all=_counts(states),
            fold_seconds=fold_seconds,
        )

    def recent_failures(
        self, pipeline: str, experiment: str, opened: Opened | None = None
    ) -> tuple[list[dict[str, Any]], int]:
        """The newest FAILED rows of the whole experiment (no tracebacks) and how many there are.

        One filtered scan of the FAILED rows. ``CheckpointLog.failures()`` would also fold the whole
        log again to find fencing violations, doubling the cost of a cold page; violations are counted
        by the fold the page already has (card and filter) and listed on each item's page.
        """
        event_log, version = opened or self.open(pipeline, experiment)

        def compute() -> tuple[list[dict[str, Any]], int]:
            flt = pc.field("event_type") == pa.scalar(EventType.FAILED.value)
            table = event_log.scan([*_FAILURE_COLUMNS, *_ATTEMPT_COLUMNS], flt)
            rows = {r["event_id"]: r for r in table.to_pylist()}  # a retried batch lands twice
            ordered = sorted(
                rows.values(),
                key=lambda r: (r["created_at"] is not None, r["created_at"] or 0, r["item_seq"]),
                reverse=True,
            )
            recent = [
                {**{k: r[k] for k in _FAILURE_COLUMNS if k != "error_message"}, "message": r["error_message"] or ""}
                | {"created_at": iso(r["created_at"])}
                | attempt_facts(r["status"], r["value_json"])
                for r in ordered[:RECENT_FAILURES]
            ]
            # A map index alone ("1") names no chunk: label each writing task by its key range.
            tis = {_ti_of(f): None for f in recent if f["dag_id"] and f["run_id"] and f["task_id"]}
            labels = key_ranges(event_log, [ti for ti in tis if ti.map_index >= 0])
            recent = [{**f, "chunk_label": labels.get(_ti_of(f))} for f in recent]
            return recent, len(rows)

        return self._failures.get((pipeline, experiment, version), compute)

    def insights(self, pipeline: str, experiment: str, opened: Opened | None = None) -> dict[str, Any]:
        """The spend, throughput and next-run panels of one log version (see :mod:`.insights`)."""
        opened = opened or self.open(pipeline, experiment)
        event_log, version = opened
        prep = self.prepared(pipeline, experiment, opened)

        source = self.source_of(event_log)

        def compute() -> dict[str, Any]:
            return {
                "spend": spend_panel(usage_of(event_log), budget_of(event_log), prep.summary),
                "throughput": throughput(event_log),
                "next_run": next_run(prep.states, prep.summary, source, self.source_options(source)),
            }

        return self._insights.get((pipeline, experiment, version, self.source_key(source)), compute)

    # -- the source the last plan recorded (core/store/source_ref.py) ---------------------------------

    def source_of(self, event_log: CheckpointLog) -> SourceRef | None:
        """The source the experiment's last plan recorded; None without one (or when its record is unreadable)."""
        try:
            return recorded_source(event_log.uri, event_log.storage_options)
        except DatagenError as exc:
            logger.warning("%s: the plan's source record cannot be read: %s", event_log.uri, exc)
            return None

    @staticmethod
    def source_key(source: SourceRef | None) -> tuple[Any, ...] | None:
        """A cache key part: the record, and a stamp of a local source (an edit in place is seen)."""
        return None if source is None else (*source.token, source_stamp(source.uri))

    def source_options(self, source: SourceRef | None) -> dict[str, str] | None:
        """Storage options to read ``source`` with: those of the connection the plan used.

        A snapshot sits beside the log (the UI's own options); a path source is read as the mapped
        tasks read it, with the plan's connection, resolved here by its id (the record holds no
        secret); the UI's own connection when it is that one or cannot be resolved.
        """
        if source is None or source.kind == INLINE or not source.conn_id or source.conn_id == self.conn_id:
            return self.storage_options or None
        try:
            return DatagenHook(datagen_conn_id=source.conn_id).storage_options or None
        except Exception as exc:  # a connection gone or broken: the read then reports what fails
            logger.warning("connection %r of the recorded source cannot be resolved: %s", source.conn_id, exc)
            return self.storage_options or None

    def status(self, pipeline: str, experiment: str) -> dict[str, Any]:
        """The experiment's folded status: summary counts, counts of every item, log stats, failures."""
        opened = self.open(pipeline, experiment)
        prep = self.prepared(pipeline, experiment, opened)
        failures, failures_total = self.recent_failures(pipeline, experiment, opened)
        # Item-level rule: a failure is resolved once its item is completed or filtered (by a later
        # attempt, or a later input version); the fold of the same log version says which are.
        now = current_status(prep.states, [f["item_id"] for f in failures])
        failures = [{**f, "resolved": now.get(f["item_id"]) in RESOLVED_STATUSES} for f in failures]
        summary = prep.summary
        done = summary["completed"] + summary["filtered"]
        return {
            **summary,
            "running_not_failed": running_not_failed(summary),
            "progress": (done / summary["total"]) if summary["total"] else 0.0,
            "counts_all_items": prep.counts_all,
            "items_all": prep.states.num_rows,
            "stats": prep.stats,
            "recent_failures": failures,
            "failure_rows": failures_total,
            **self.insights(pipeline, experiment, opened),
            # read on each view: submissions change without a new log version
            "batches": open_batches(opened[0]),
            "in_batch": in_batch(opened[0]),
        }

    def items(
        self,
        pipeline: str,
        experiment: str,
        *,
        status: str | None = None,
        q: str | None = None,
        scope: str = "roots",
        version: str | None = None,
        offset: int = 0,
        limit: int = 50,
    ) -> dict[str, Any]:
        """One page of the items table, filtered by status, id substring, scope and processor version.

        ``status="running"`` lists the running items that are not failed (``"failed"`` lists those),
        as the badges show them; ``version`` is the exact processor version of the item's generation.
        """
        if status and status not in STATUS_FILTERS:
            raise ConfigurationError(f"unknown status filter {status!r}; use one of {', '.join(STATUS_FILTERS)}")
        if scope not in SCOPES:
            raise ConfigurationError(f"unknown scope {scope!r}; use one of {', '.join(SCOPES)}")
        offset = max(0, int(offset))
        limit = min(max(1, int(limit)), MAX_PAGE_SIZE)
        prep = self.prepared(pipeline, experiment)
        table = prep.states
        masks = []
        if table.num_rows:
            if scope == "roots":
                masks.append(pc.equal(table["depth"], 0))
            elif scope == "children":
                masks.append(pc.greater(table["depth"], 0))
            if status == FAILED:
                masks.append(failed_mask(table))
            elif status == ItemStatus.RUNNING.value:
                masks.append(pc.and_(pc.equal(table["status"], status), pc.invert(failed_mask(table))))
            elif status == "violations":
                masks.append(pc.greater(table["violations"], 0))
            elif status:
                masks.append(pc.equal(table["status"], status))
            if q:
                # Plain substring (no regex, no SQL): a search string is user data too.
                masks.append(pc.match_substring(table["item_id"], q, ignore_case=True))
            if version:
                masks.append(pc.fill_null(pc.equal(table["processor_version"], version), False))
        if masks:
            mask = masks[0]
            for m in masks[1:]:
                mask = pc.and_(mask, m)
            table = table.filter(mask)
        rows = table.slice(offset, limit).to_pylist()
        return {
            "pipeline": pipeline,
            "experiment": experiment,
            "log_version": prep.version,
            "status": status or None,
            "q": q or None,
            "scope": scope,
            "version": version or None,
            "offset": offset,
            "limit": limit,
            "total": table.num_rows,
            "items": rows,
        }

    # -- item level ----------------------------------------------------------------------------

    def item(self, pipeline: str, experiment: str, item_id: str) -> dict[str, Any]:
        """An item's full trajectory, folded state, failures, fan-out children and input versions."""
        if not isinstance(item_id, str) or not item_id or "\x00" in item_id:
            raise NotFoundError(f"no item {item_id!r} in {pipeline}/{experiment}: give a non-empty item id")
        event_log, version = self.open(pipeline, experiment)
        source = self.source_of(event_log)
        data = self._items.get(
            (pipeline, experiment, version, item_id, self.source_key(source)),
            lambda: {
                **with_chunk_labels(
                    event_log, item_data(event_log, version, item_id, source, self.source_options(source))
                ),
                "usage": item_usage_of(event_log, item_id),
            },
        )
        # read per page, not cached with the log's version: the store changes on its own (another
        # experiment's replies, maintenance), and a store down now may be back on the next page
        page = {k: v for k, v in data.items() if k != "logged_exchanges"}  # the cached dict stays whole
        page["exchanges"] = self.exchanges(pipeline, experiment, data.get("logged_exchanges") or [])
        return page

    def exchanges(self, pipeline: str, experiment: str, logged: list[dict[str, Any]]) -> dict[str, Any]:
        """The item page's exchanges (:func:`~.exchange_view.item_exchanges`): its logged request keys
        read from the response store under the root in one lookup; a store that cannot be opened or
        read is said so on the page."""
        if not logged:
            return item_exchanges(logged, None, pipeline, experiment)
        try:
            store = self._response_store()
        except Exception as exc:  # unreachable, damaged, no credentials
            logger.warning("item page: the response store under %s cannot be opened: %s", self.shown_root, exc)
            return item_exchanges(logged, None, pipeline, experiment, unavailable_reason(exc))

        def lookup(keys: list[str]) -> dict[str, ResponseEntry]:
            try:
                found = store.get_many(keys)
            except Exception:
                with self._responses_lock:  # opened afresh on the next page
                    self._responses = None
                raise
            if not found and store.stats()["entries"] == 0:
                raise StoreUnavailable(f"there is no response store at {redact_uri(store.uri)} (or it is empty)")
            return found

        return item_exchanges(logged, lookup, pipeline, experiment)

    def _response_store(self) -> ResponseStore:
        from airflow_provider_datagen.core.store.responses import ResponseStore

        with self._responses_lock:
            if self._responses is None:
                self._responses = ResponseStore.open(self.root, self.storage_options or None)
            return self._responses

    def blob(self, pipeline: str, experiment: str, event_id: str) -> tuple[bytes, dict[str, Any]]:
        """A blob's bytes and what it is (``value_kind`` ``bytes`` or ``json``, item and field)."""
        event_log = self.log(pipeline, experiment)
        meta = event_log.scan(
            ["event_id", "item_id", "field", "value_kind", "value_size"],
            pc.field("event_id") == pa.scalar(event_id, pa.string()),
        ).to_pylist()
        if not meta or meta[0]["value_kind"] is None:
            raise NotFoundError(f"no blob for event {event_id!r} in {pipeline}/{experiment}")
        try:
            data = event_log.load_blob(event_id)
        except DatagenError as exc:
            raise NotFoundError(f"no blob for event {event_id!r} in {pipeline}/{experiment}: {exc}") from None
        return data, meta[0]

    # -- task-instance level -------------------------------------------------------------------

    def task_instance(
        self,
        dag_id: str,
        run_id: str,
        task_id: str,
        map_index: int,
        visible: Callable[[str, str], bool] | None = None,
    ) -> dict[str, Any]:
        """What one task instance (every try) wrote, found by the Airflow coordinates on the events.

        Which experiment a task instance belongs to is not recorded anywhere but in the events, so
        every experiment under the root is scanned (a filtered read of a few light columns per log,
        cached per log version). ``visible(pipeline, experiment)``: whether the user may read an
        experiment; the others are left out unread.
        """
        ti = TaskInstanceKey(dag_id, run_id, task_id, map_index)
        found = []
        for ref in self.experiments():
            if visible is not None and not visible(ref.pipeline, ref.experiment):
                continue
            try:
                opened = self.open(ref.pipeline, ref.experiment)
                key = (ref.pipeline, ref.experiment, opened[1], *ti)
                result = self._ti.get(key, lambda opened=opened: self._ti_result(opened, ti))
            except DatagenError as exc:
                logger.warning("skipping %s/%s in the task-instance view: %s", ref.pipeline, ref.experiment, exc)
                continue
            if result["items_total"]:
                found.append(result)
        coords = {"dag_id": ti.dag_id, "run_id": ti.run_id, "task_id": ti.task_id, "map_index": ti.map_index}
        return {**coords, "experiments": found}

    def _ti_result(self, opened: Opened, ti: TaskInstanceKey) -> dict[str, Any]:
        event_log, version = opened
        result = scan_task_instance(event_log, ti)
        if result["items_total"]:
            # The current status comes from the fold of the same version, so it is cached with it.
            prep = self.prepared(event_log.pipeline, event_log.experiment, opened)
            current = current_status(prep.states, [row["item_id"] for row in result["items"]])
            result["items"] = [{**row, "current_status": current.get(row["item_id"])} for row in result["items"]]
        return {**result, "log_version": version}


# --- the reader the app uses ----------------------------------------------------------------------

_READER_TTL = 30.0
_reader_lock = threading.Lock()
_reader_state: dict[str, Any] = {"key": None, "reader": None, "resolved_at": 0.0}


def conn_id() -> str:
    """The connection whose root the UI shows: ``[datagen] ui_conn_id``, default ``datagen_default``."""
    # Deferred: airflow.configuration is the full Airflow config, present only where the app runs.
    try:
        from airflow.configuration import conf
    except ImportError:  # pragma: no cover - the plugin app only runs inside the API server
        return DatagenHook.default_conn_name
    return conf.get("datagen", "ui_conn_id", fallback=DatagenHook.default_conn_name) or DatagenHook.default_conn_name


def current_reader() -> Reader:
    """The reader for the configured connection's root, re-resolved at most every 30 s.

    Resolving the connection reads the secrets backends or the metadata DB; doing it per request would
    add that to every page. A changed root or storage options gets a fresh reader (and empty caches).
    """
    now = time.monotonic()
    with _reader_lock:
        reader = _reader_state["reader"]
        if reader is not None and now - _reader_state["resolved_at"] < _READER_TTL:
            return reader
    hook = DatagenHook(datagen_conn_id=conn_id())
    root, options = hook.root, hook.storage_options
    key = (root, json.dumps(options, sort_keys=True))
    with _reader_lock:
        if _reader_state["key"] != key or _reader_state["reader"] is None:
            _reader_state["reader"] = Reader(root, options, conn_id=conn_id())
            _reader_state["key"] = key
        _reader_state["resolved_at"] = now
        return _reader_state["reader"]


def reset_reader() -> None:
    """Forget the resolved connection and every cached fold (tests, and after a connection edit)."""
    with _reader_lock:
        _reader_state.update(key=None, reader=None, resolved_at=0.0)
