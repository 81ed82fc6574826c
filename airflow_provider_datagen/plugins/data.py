"""The read side of the UI: find experiments under a root and turn their logs into page data.

Everything here returns plain JSON-able dicts so the HTML pages and the ``/datagen/api`` routes show
the same facts. Nothing here knows about HTTP or HTML; the only Airflow import is the hook (lazily).

Folds are the expensive part (one vectorized ``states()`` over every light column of the log), so
the per-item state table of an experiment is computed once per log *version* and kept, sorted by
item id, in a small LRU: paging, filtering and searching 100k items are then Arrow kernels over that
table. A new commit changes ``log.version`` and the next request folds again.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_datagen.core import CheckpointLog, EventType, ItemStatus
from airflow_provider_datagen.core.events import BlobRef
from airflow_provider_datagen.core.fold import failure_records, fold_events
from airflow_provider_datagen.core.ids import check_name, parent_of, root_of
from airflow_provider_datagen.exceptions import DatagenError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from airflow_provider_datagen.core import Event
    from airflow_provider_datagen.core.fold import FailureRecord

log = logging.getLogger(__name__)

CHECKPOINTS_DIR = "datagen_checkpoints"
LOG_DIR = "log.lance"

#: Filters the items table understands: the lifecycle statuses plus two failure-lens views.
STATUS_FILTERS = (
    *(s.value for s in ItemStatus),
    "failed",  # running with at least one FAILED row: what a rerun will retry
    "violations",  # fencing violations found by the fold
)
SCOPES = ("roots", "all", "children")
MAX_PAGE_SIZE = 500
#: Rows of the experiment page's failure list and of an item's children list; the rest is counted.
RECENT_FAILURES = 20
MAX_CHILDREN = 500
MAX_TI_ITEMS = 2000
_CACHE_SIZE = 8
_VALUE_PREVIEW = 300

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

# Columns of the task-instance scan: what each attempt did, never values or tracebacks.
_TI_COLUMNS = (
    "event_id",
    "item_id",
    "item_seq",
    "event_type",
    "status",
    "step",
    "field",
    "try_number",
    "map_index",
    "writer_id",
    "writer_epoch",
    "error_type",
    "error_message",
    "created_at",
)


class NotFoundError(DatagenError):
    """An experiment, item or blob the UI was asked for does not exist; the message says what."""


def redact_root(root: str) -> str:
    """A root fit for a page: user-info of a URI dropped (credentials never reach the browser)."""
    try:
        from airflow_provider_datagen.hooks.datagen import redact_uri
    except ImportError:  # pragma: no cover - the hook ships with the package
        return root
    return redact_uri(root)


def _iso(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        return value.isoformat()
    return str(value)


def _preview(value: Any) -> tuple[str, bool]:
    """Compact JSON text of a value and whether it was cut for the trajectory table."""
    text = json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
    if len(text) > _VALUE_PREVIEW:
        return text[:_VALUE_PREVIEW] + "…", True
    return text, False


# --- experiment discovery -------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class ExperimentRef:
    pipeline: str
    experiment: str


def _valid(name: str) -> bool:
    try:
        check_name(name, "name")
    except DatagenError:
        return False
    return True


def _is_local(root: str) -> bool:
    return "://" not in root or root.startswith("file://")


def _list_local(root: str) -> list[ExperimentRef]:
    base = os.path.join(root[len("file://") :] if root.startswith("file://") else root, CHECKPOINTS_DIR)
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


def _object_store_fs(root: str, storage_options: dict[str, str]) -> tuple[Any, str]:
    import pyarrow.fs as pafs

    scheme, _, rest = root.partition("://")
    if scheme in ("s3", "s3a") and storage_options:
        kwargs: dict[str, Any] = {}
        for key, value in storage_options.items():
            arg = _S3_OPTIONS.get(key.lower())
            if arg is not None:
                kwargs[arg] = value
        endpoint = kwargs.get("endpoint_override")
        if isinstance(endpoint, str) and "://" in endpoint:
            # pyarrow wants host:port plus a scheme argument; object_store takes a full URL.
            kwargs["scheme"], _, kwargs["endpoint_override"] = endpoint.partition("://")
        if str(storage_options.get("allow_http", "")).lower() == "true":
            kwargs.setdefault("scheme", "http")
        return pafs.S3FileSystem(**kwargs), rest
    return pafs.FileSystem.from_uri(root)


def _list_object_store(root: str, storage_options: dict[str, str]) -> list[ExperimentRef]:
    import pyarrow.fs as pafs

    fs, path = _object_store_fs(root, storage_options)
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
    if _is_local(root):
        return _list_local(root)
    return _list_object_store(root, storage_options or {})


# --- cached folds ---------------------------------------------------------------------------------


@dataclass
class Prepared:
    """Everything the experiment page needs that depends only on the log version."""

    version: int
    states: pa.Table  # STATE_SCHEMA + depth, sorted by item_id
    summary: dict[str, Any]
    stats: dict[str, Any]
    counts_all: dict[str, int]
    fold_seconds: float
    failures: list[dict[str, Any]] | None = None
    failures_total: int = 0


@dataclass
class _Slot:
    lock: threading.Lock = field(default_factory=threading.Lock)
    value: Any = None


class _VersionedCache:
    """A small LRU keyed by (experiment, version, extra); one computation per key at a time."""

    def __init__(self, size: int = _CACHE_SIZE) -> None:
        self._size = size
        self._slots: OrderedDict[tuple[Any, ...], _Slot] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[Any, ...], compute: Callable[[], Any]) -> Any:
        with self._lock:
            slot = self._slots.get(key)
            if slot is None:
                slot = self._slots[key] = _Slot()
                while len(self._slots) > self._size:
                    self._slots.popitem(last=False)
            else:
                self._slots.move_to_end(key)
        # A cold fold of a big log takes a while; concurrent requests wait for it instead of folding too.
        with slot.lock:
            if slot.value is None:
                slot.value = compute()
            return slot.value


def _counts(states: pa.Table, mask: pa.Array | None = None) -> dict[str, int]:
    counts = {s.value: 0 for s in ItemStatus}
    table = states.filter(mask) if mask is not None else states
    if table.num_rows:
        for entry in pc.value_counts(table["status"]).to_pylist():
            counts[entry["values"]] = int(entry["counts"])
    return counts


def _failure_dict(rec: FailureRecord, *, with_traceback: bool) -> dict[str, Any]:
    out = {
        "item_id": rec.item_id,
        "item_seq": rec.item_seq,
        "event_id": rec.event_id,
        "error_type": rec.error_type,
        "message": rec.message,
        "step": rec.step,
        "iteration": rec.coord.iteration,
        "fanout_index": rec.coord.fanout_index,
        "writer_id": rec.writer_id,
        "writer_epoch": rec.epoch,
        "input_fingerprint": rec.input_fingerprint,
        "dag_id": rec.dag_id,
        "run_id": rec.run_id,
        "task_id": rec.task_id,
        "map_index": rec.map_index,
        "try_number": rec.try_number,
        "created_at": _iso(rec.created_at),
    }
    if with_traceback:
        out["traceback"] = rec.traceback
    return out


class Reader:
    """Read access to every experiment under one root, with folds cached per log version."""

    def __init__(self, root: str, storage_options: dict[str, str] | None = None) -> None:
        self.root = root
        self.storage_options = dict(storage_options or {})
        self._logs: dict[ExperimentRef, CheckpointLog] = {}
        self._logs_lock = threading.Lock()
        self._prepared = _VersionedCache()
        self._failures = _VersionedCache()
        self._ti = _VersionedCache(size=32)
        self._items = _VersionedCache(size=64)

    @property
    def shown_root(self) -> str:
        return redact_root(self.root)

    def experiments(self) -> list[ExperimentRef]:
        return list_experiments(self.root, self.storage_options)

    def log(self, pipeline: str, experiment: str) -> CheckpointLog:
        """The open log of an existing experiment; :class:`NotFoundError` for anything else."""
        return self.open(pipeline, experiment)[0]

    def open(self, pipeline: str, experiment: str) -> tuple[CheckpointLog, int]:
        """The open log of an existing experiment and its current version (one refresh of the log)."""
        try:
            ref = ExperimentRef(check_name(pipeline, "pipeline"), check_name(experiment, "experiment"))
        except DatagenError as exc:
            raise NotFoundError(f"no experiment {pipeline!r}/{experiment!r}: {exc}") from None
        with self._logs_lock:
            lg = self._logs.get(ref)
        if lg is None:
            lg = CheckpointLog.open(
                self.root,
                pipeline=ref.pipeline,
                experiment=ref.experiment,
                storage_options=self.storage_options or None,
                # every experiment ever shown stays open here: its folds live in the bounded caches
                remember_fold=False,
            )
            with self._logs_lock:
                lg = self._logs.setdefault(ref, lg)
        # Each refresh reads the latest manifest; one per request is enough.
        version = lg.version
        if version == 0:
            raise NotFoundError(
                f"no experiment {pipeline!r}/{experiment!r} under {self.shown_root}: it has no log yet "
                f"(expected {CHECKPOINTS_DIR}/{pipeline}/{experiment}/{LOG_DIR}); check the pipeline and "
                "experiment names or the datagen connection's root"
            )
        return lg, version

    # -- experiment level ----------------------------------------------------------------------

    def prepared(self, pipeline: str, experiment: str, opened: tuple[CheckpointLog, int] | None = None) -> Prepared:
        lg, version = opened or self.open(pipeline, experiment)
        return self._prepared.get((pipeline, experiment, version), lambda: self._prepare(lg, version))

    def _prepare(self, lg: CheckpointLog, version: int) -> Prepared:
        started = time.perf_counter()
        states = lg.states()
        states = states.sort_by("item_id") if states.num_rows else states
        depth = pc.count_substring(states["item_id"], "/") if states.num_rows else pa.array([], pa.int32())
        states = states.append_column("depth", pc.cast(depth, pa.int32()))
        summary = lg.summary(states.drop_columns(["depth"]))
        # The table was folded at `version`; the summary must say so even if a commit landed since.
        summary["log_version"] = version
        fold_seconds = time.perf_counter() - started
        log.debug("folded %s at version %d in %.3f s", lg.uri, version, fold_seconds)
        return Prepared(
            version=version,
            states=states,
            summary=summary,
            stats=lg.stats(),
            counts_all=_counts(states),
            fold_seconds=fold_seconds,
        )

    def recent_failures(
        self, pipeline: str, experiment: str, opened: tuple[CheckpointLog, int] | None = None
    ) -> tuple[list[dict[str, Any]], int]:
        """The newest FAILED rows of the whole experiment (no tracebacks) and how many there are.

        One filtered scan of the FAILED rows. ``CheckpointLog.failures()`` would also fold the whole
        log again to find fencing violations, doubling the cost of a cold page; violations are counted
        by the fold the page already has (card and filter) and listed on each item's page.
        """
        lg, version = opened or self.open(pipeline, experiment)

        def compute() -> tuple[list[dict[str, Any]], int]:
            table = scan_events(lg, _FAILURE_COLUMNS, pc.field("event_type") == pa.scalar(EventType.FAILED.value))
            rows = {r["event_id"]: r for r in table.to_pylist()}  # a retried batch lands twice
            ordered = sorted(
                rows.values(),
                key=lambda r: (r["created_at"] is not None, r["created_at"] or 0, r["item_seq"]),
                reverse=True,
            )
            recent = [
                {**{k: r[k] for k in _FAILURE_COLUMNS if k != "error_message"}, "message": r["error_message"] or ""}
                | {"created_at": _iso(r["created_at"])}
                for r in ordered[:RECENT_FAILURES]
            ]
            return recent, len(rows)

        return self._failures.get((pipeline, experiment, version), compute)

    def status(self, pipeline: str, experiment: str) -> dict[str, Any]:
        """The experiment's folded status: summary counts, counts of every item, log stats, failures."""
        opened = self.open(pipeline, experiment)
        prep = self.prepared(pipeline, experiment, opened)
        failures, failures_total = self.recent_failures(pipeline, experiment, opened)
        summary = prep.summary
        done = summary["completed"] + summary["filtered"]
        return {
            **summary,
            "progress": (done / summary["total"]) if summary["total"] else 0.0,
            "counts_all_items": prep.counts_all,
            "items_all": prep.states.num_rows,
            "stats": prep.stats,
            "recent_failures": failures,
            "failure_rows": failures_total,
        }

    def items(
        self,
        pipeline: str,
        experiment: str,
        *,
        status: str | None = None,
        q: str | None = None,
        scope: str = "roots",
        offset: int = 0,
        limit: int = 50,
    ) -> dict[str, Any]:
        """One page of the items table, filtered by status, id substring and scope (roots/children)."""
        if status and status not in STATUS_FILTERS:
            raise ValueError(f"unknown status filter {status!r}; use one of {', '.join(STATUS_FILTERS)}")
        if scope not in SCOPES:
            raise ValueError(f"unknown scope {scope!r}; use one of {', '.join(SCOPES)}")
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
            if status == "failed":
                masks.append(pc.equal(table["status"], ItemStatus.RUNNING.value))
                masks.append(pc.greater(table["failures"], 0))
            elif status == "violations":
                masks.append(pc.greater(table["violations"], 0))
            elif status:
                masks.append(pc.equal(table["status"], status))
            if q:
                # Plain substring (no regex, no SQL): a search string is user data too.
                masks.append(pc.match_substring(table["item_id"], q, ignore_case=True))
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
        lg, version = self.open(pipeline, experiment)
        return self._items.get((pipeline, experiment, version, item_id), lambda: self._item(lg, version, item_id))

    def _item(self, lg: CheckpointLog, version: int, item_id: str) -> dict[str, Any]:
        pipeline, experiment = lg.pipeline, lg.experiment
        subtree = lg.subtree(root_of(item_id))
        mine = [ev for ev in subtree if ev.item_id == item_id]
        if not mine:
            raise NotFoundError(
                f"no item {item_id!r} in {pipeline}/{experiment}: the log has no event for it "
                "(item ids are the escaped source keys; search the experiment page by substring)"
            )
        state = fold_events(item_id, mine, lg.load_blob)
        rejected = {v.event_id: v.kind for v in state.violations}
        trajectory = [self._event_dict(ev, rejected.get(ev.event_id)) for ev in mine]
        prefix = item_id + "/"
        by_child: dict[str, list[Event]] = {}
        for ev in subtree:
            if ev.item_id.startswith(prefix):
                by_child.setdefault(ev.item_id, []).append(ev)
        children = []
        for cid in sorted(by_child)[:MAX_CHILDREN]:
            cst = fold_events(cid, by_child[cid])
            children.append(
                {
                    "item_id": cid,
                    "depth": cid.count("/") - item_id.count("/"),
                    "status": cst.status.value,
                    "failures": cst.failures,
                    "last_seq": cst.last_seq,
                }
            )
        versions = [
            {
                "item_seq": ev.item_seq,
                "event_id": ev.event_id,
                "input_fingerprint": ev.input_fingerprint,
                "processor_version": ev.processor_version,
                "current": ev.item_seq == state.created_seq,
                "writer_id": ev.writer_id,
                "writer_epoch": ev.writer_epoch,
                "dag_id": ev.dag_id,
                "run_id": ev.run_id,
                "task_id": ev.task_id,
                "map_index": ev.map_index,
                "try_number": ev.try_number,
                "created_at": _iso(ev.created_at),
            }
            for ev in mine
            if ev.event_type is EventType.ITEM_CREATED
        ]
        return {
            "pipeline": pipeline,
            "experiment": experiment,
            "log_version": version,
            "item_id": item_id,
            "root_item_id": root_of(item_id),
            "parent_item_id": parent_of(item_id),
            "state": {
                "status": state.status.value,
                "input_fingerprint": state.input_fingerprint,
                "processor_version": state.processor_version,
                "cursor": None
                if state.cursor is None
                else {
                    "step": state.cursor.step,
                    "iteration": state.cursor.iteration,
                    "processor_version": state.cursor.processor_version,
                    "item_seq": state.cursor.item_seq,
                },
                "open_frames": [
                    {"step": f.step, "enclosing_step": f.enclosing_step, "iteration": f.iteration}
                    for f in state.open_frames
                ],
                "created_seq": state.created_seq,
                "terminal_seq": state.terminal_seq,
                "filter_reason": state.filter_reason,
                "last_seq": state.last_seq,
                "max_epoch": state.max_epoch,
                "failures": state.failures,
                "violations": len(state.violations),
            },
            "fields": {name: self._field_value(value) for name, value in state.fields.items()},
            "failures": [_failure_dict(r, with_traceback=True) for r in failure_records(mine, state.violations)],
            "children": children,
            "children_total": len(by_child),
            "input_versions": versions,
            "events": trajectory,
        }

    @staticmethod
    def _field_value(value: Any) -> Any:
        if isinstance(value, BlobRef):
            return {"blob": {"event_id": value.event_id, "kind": value.kind, "size": value.size}}
        if isinstance(value, list) and any(isinstance(v, BlobRef) for v in value):
            return [Reader._field_value(v) for v in value]
        return value

    @staticmethod
    def _event_dict(ev: Event, rejected: str | None) -> dict[str, Any]:
        value: Any = None
        blob = None
        cut = False
        if ev.value_kind is not None:
            if ev.value_json is not None:
                value, cut = _preview(json.loads(ev.value_json))
            else:
                blob = {"event_id": ev.event_id, "kind": ev.value_kind, "size": ev.value_size}
        c = ev.coord
        return {
            "event_id": ev.event_id,
            "item_seq": ev.item_seq,
            "event_type": ev.event_type.value,
            "status": ev.status,
            "step_kind": c.step_kind,
            "step": c.step,
            "enclosing_step": c.enclosing_step,
            "selector_step": c.selector_step,
            "iteration": c.iteration,
            "fanout_index": c.fanout_index,
            "field": ev.field,
            "value_preview": value,
            "value_cut": cut,
            "blob": blob,
            "input_fingerprint": ev.input_fingerprint,
            "processor_version": ev.processor_version,
            "writer_id": ev.writer_id,
            "writer_epoch": ev.writer_epoch,
            "error_type": ev.error_type,
            "error_message": ev.error_message,
            "dag_id": ev.dag_id,
            "run_id": ev.run_id,
            "task_id": ev.task_id,
            "map_index": ev.map_index,
            "try_number": ev.try_number,
            "created_at": _iso(ev.created_at),
            "rejected": rejected,
        }

    def blob(self, pipeline: str, experiment: str, event_id: str) -> tuple[bytes, dict[str, Any]]:
        """A blob's bytes and what it is (``value_kind`` ``bytes`` or ``json``, item and field)."""
        lg = self.log(pipeline, experiment)
        meta = scan_events(
            lg,
            ("event_id", "item_id", "field", "value_kind", "value_size"),
            pc.field("event_id") == pa.scalar(event_id, pa.string()),
        ).to_pylist()
        if not meta or meta[0]["value_kind"] is None:
            raise NotFoundError(f"no blob for event {event_id!r} in {pipeline}/{experiment}")
        try:
            data = lg.load_blob(event_id)
        except DatagenError as exc:
            raise NotFoundError(f"no blob for event {event_id!r} in {pipeline}/{experiment}: {exc}") from None
        return data, meta[0]

    # -- task-instance level -------------------------------------------------------------------

    def task_instance(self, dag_id: str, run_id: str, task_id: str, map_index: int) -> dict[str, Any]:
        """What one task instance (every try) wrote, found by the Airflow coordinates on the events.

        Which experiment a task instance belongs to is not recorded anywhere but in the events, so
        every experiment under the root is scanned (a filtered read of a few light columns per log,
        cached per log version).
        """
        found = []
        for ref in self.experiments():
            try:
                opened = self.open(ref.pipeline, ref.experiment)
                version = opened[1]
                key = (ref.pipeline, ref.experiment, version, dag_id, run_id, task_id, map_index)
                result = self._ti.get(
                    key, lambda opened=opened: self._ti_result(opened, dag_id, run_id, task_id, map_index)
                )
            except DatagenError as exc:
                log.warning("skipping %s/%s in the task-instance view: %s", ref.pipeline, ref.experiment, exc)
                continue
            if result["items_total"]:
                found.append(result)
        return {
            "dag_id": dag_id,
            "run_id": run_id,
            "task_id": task_id,
            "map_index": map_index,
            "experiments": found,
        }

    def _ti_result(
        self, opened: tuple[CheckpointLog, int], dag_id: str, run_id: str, task_id: str, map_index: int
    ) -> dict[str, Any]:
        lg, version = opened
        result = self._ti_scan(lg, dag_id, run_id, task_id, map_index)
        if result["items_total"]:
            # The current status comes from the fold of the same version, so it is cached with it.
            prep = self.prepared(lg.pipeline, lg.experiment, opened)
            current = _current_status(prep.states, [row["item_id"] for row in result["items"]])
            result["items"] = [{**row, "current_status": current.get(row["item_id"])} for row in result["items"]]
        return {**result, "log_version": version}

    @staticmethod
    def _ti_scan(lg: CheckpointLog, dag_id: str, run_id: str, task_id: str, map_index: int) -> dict[str, Any]:
        flt = (
            (pc.field("dag_id") == pa.scalar(dag_id, pa.string()))
            & (pc.field("run_id") == pa.scalar(run_id, pa.string()))
            & (pc.field("task_id") == pa.scalar(task_id, pa.string()))
        )
        # An unmapped task is map index -1; writers outside a mapped task may leave the column null.
        mflt = pc.field("map_index") == pa.scalar(map_index, pa.int64())
        if map_index == -1:
            mflt = mflt | pc.field("map_index").is_null()
        table = scan_events(lg, _TI_COLUMNS, flt & mflt)
        return summarize_ti_events(lg.pipeline, lg.experiment, table)


def scan_events(lg: CheckpointLog, columns: Iterable[str], flt: pc.Expression) -> pa.Table:
    """A filtered projection of the raw log (schema-version checked, errors translated)."""
    return lg.scan(list(columns), flt)


def summarize_ti_events(pipeline: str, experiment: str, table: pa.Table) -> dict[str, Any]:
    """Group a task instance's events by item and try: counts by type, terminal status, failures."""
    rows = table.to_pylist()
    seen: set[str] = set()
    per_item: dict[str, dict[int | None, dict[str, Any]]] = {}
    tries: set[int | None] = set()
    for r in sorted(rows, key=lambda r: (r["item_id"], r["try_number"] or 0, r["item_seq"])):
        if r["event_id"] in seen:  # a retried batch landed twice: the fold counts it once, so do we
            continue
        seen.add(r["event_id"])
        tries.add(r["try_number"])
        attempt = per_item.setdefault(r["item_id"], {}).setdefault(
            r["try_number"],
            {
                "try_number": r["try_number"],
                "events": 0,
                "by_type": {},
                "steps_completed": [],
                "fields": [],
                "terminal": None,
                "errors": [],
                "writer_id": r["writer_id"],
                "writer_epoch": r["writer_epoch"],
                "first_seq": r["item_seq"],
                "last_seq": r["item_seq"],
            },
        )
        attempt["events"] += 1
        et = r["event_type"]
        attempt["by_type"][et] = attempt["by_type"].get(et, 0) + 1
        attempt["last_seq"] = max(attempt["last_seq"], r["item_seq"])
        attempt["first_seq"] = min(attempt["first_seq"], r["item_seq"])
        if et == EventType.STEP_COMPLETED.value and r["step"]:
            attempt["steps_completed"].append(r["step"])
        elif et in (EventType.FIELD_SET.value, EventType.FIELD_APPEND.value) and r["field"]:
            if r["field"] not in attempt["fields"]:
                attempt["fields"].append(r["field"])
        elif et == EventType.TERMINAL.value:
            attempt["terminal"] = r["status"]
        elif et == EventType.FAILED.value:
            attempt["errors"].append({"error_type": r["error_type"], "message": (r["error_message"] or "")[:500]})
    items = [
        {"item_id": iid, "attempts": [per_item[iid][t] for t in sorted(per_item[iid], key=lambda t: t or 0)]}
        for iid in sorted(per_item)
    ]
    return {
        "pipeline": pipeline,
        "experiment": experiment,
        "tries": sorted(tries, key=lambda t: t or 0),
        "events_total": len(seen),
        "items_total": len(items),
        "items": items[:MAX_TI_ITEMS],
    }


def _current_status(states: pa.Table, item_ids: list[str]) -> dict[str, str]:
    if not item_ids or not states.num_rows:
        return {}
    hit = states.filter(pc.is_in(states["item_id"], pa.array(item_ids, pa.string())))
    return dict(zip(hit["item_id"].to_pylist(), hit["status"].to_pylist()))


# --- the reader the app uses ----------------------------------------------------------------------

_READER_TTL = 30.0
_reader_lock = threading.Lock()
_reader_state: dict[str, Any] = {"key": None, "reader": None, "resolved_at": 0.0}


def conn_id() -> str:
    """The connection whose root the UI shows: ``[datagen] ui_conn_id``, default ``datagen_default``."""
    try:
        from airflow.configuration import conf
    except ImportError:  # pragma: no cover - the plugin app only runs inside the API server
        return "datagen_default"
    return conf.get("datagen", "ui_conn_id", fallback="datagen_default") or "datagen_default"


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
    from airflow_provider_datagen.hooks.datagen import DatagenHook

    hook = DatagenHook(datagen_conn_id=conn_id())
    root, options = hook.root, hook.storage_options
    key = (root, json.dumps(options, sort_keys=True))
    with _reader_lock:
        if _reader_state["key"] != key or _reader_state["reader"] is None:
            _reader_state["reader"] = Reader(root, options)
            _reader_state["key"] = key
        _reader_state["resolved_at"] = now
        return _reader_state["reader"]


def reset_reader() -> None:
    """Forget the resolved connection and every cached fold (tests, and after a connection edit)."""
    with _reader_lock:
        _reader_state.update(key=None, reader=None, resolved_at=0.0)
