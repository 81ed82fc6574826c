"""The issue-2 contract of CheckpointLog, end to end on a real Lance dataset in ``tmp_path``."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import lance
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from airflow_provider_datagen.core import (
    DATAGEN_SCHEMA_VERSION,
    BlobRef,
    CheckpointLog,
    EventType,
    ItemStatus,
    child_item_id,
    root_item_id,
)
from airflow_provider_datagen.core.events import StepCoord
from airflow_provider_datagen.core.fold import FENCING_ERROR_TYPE, STATE_SCHEMA
from airflow_provider_datagen.core.schema import EVENT_SCHEMA, LIGHT_COLUMNS, NON_BLOB_COLUMNS
from airflow_provider_datagen.exceptions import (
    DatagenError,
    FencingError,
    InvalidEventError,
    InvalidNameError,
    InvalidValueError,
    NotALogError,
    SchemaVersionError,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from airflow_provider_datagen.core import Batch


@pytest.fixture
def log(tmp_path: Path) -> CheckpointLog:
    return CheckpointLog.open(tmp_path, pipeline="qa", experiment="e1")


def write_item(
    lg: CheckpointLog,
    item: str,
    *,
    writer: str = "w1",
    epoch: int = 1,
    fp: str = "f1",
    terminal: str | None = "completed",
) -> None:
    """One item through one step in two batches (pull, then acknowledge), as the runner does."""
    w = lg.writer(writer, epoch, processor_version="v1")
    with w.batch() as b:
        b.item_created(item, input_fingerprint=fp)
        b.step_started(item, step="gen", step_kind="Sequence")
    with w.batch() as b:
        b.field_set(item, "answer", {"text": f"answer of {item}"}, step="gen")
        b.field_append(item, "votes", 1, step="gen")
        b.step_completed(item, step="gen", step_kind="Sequence")
        if terminal:
            b.terminal(item, status=terminal)


def nothing_written(lg: CheckpointLog, body: Callable[[Batch], None], exc: type[DatagenError]) -> DatagenError:
    """Run ``body`` in a batch and check it raises ``exc`` with the log untouched."""
    before_version = lg.version
    before_rows = lg.stats()["events"]
    w = lg.writer("bad", 1)
    with pytest.raises(exc) as info, w.batch() as b:
        body(b)
    assert lg.version == before_version
    assert lg.stats()["events"] == before_rows
    return info.value


# --- opening ---------------------------------------------------------------------------------


def test_open_is_lazy_and_an_unwritten_log_reads_empty(tmp_path: Path, log: CheckpointLog) -> None:
    assert log.uri == f"{tmp_path}/datagen_checkpoints/qa/e1/log.lance"
    assert not log.exists()
    assert log.version == 0
    assert os.listdir(tmp_path) == []  # nothing created by opening or reading
    states = log.states()
    assert states.num_rows == 0
    assert states.schema == STATE_SCHEMA
    assert log.events("5") == []
    assert log.subtree("5") == []
    assert log.failures() == []
    assert log.failures("5") == []
    assert log.item_state("5").status is ItemStatus.NEVER_STARTED
    summary = log.summary()
    assert (summary["total"], summary["running"], summary["completed"], summary["log_version"]) == (0, 0, 0, 0)
    assert log.maintain() == {"skipped": True, "reason": "the log is empty"}
    assert os.listdir(tmp_path) == []  # not even a lock file


def test_uri_shape_for_paths_and_uris(tmp_path: Path) -> None:
    assert CheckpointLog.open(str(tmp_path) + "/", pipeline="p", experiment="x").uri == (
        f"{tmp_path}/datagen_checkpoints/p/x/log.lance"
    )
    rel = CheckpointLog.open("relative/root", pipeline="p", experiment="x")
    assert rel.uri == f"{os.path.abspath('relative/root')}/datagen_checkpoints/p/x/log.lance"
    as_uri = CheckpointLog.open(f"file://{tmp_path}", pipeline="p", experiment="x")
    assert as_uri.uri == f"{tmp_path}/datagen_checkpoints/p/x/log.lance"
    remote = CheckpointLog("s3://bucket/prefix/", "p", "x")  # the constructor does no I/O
    assert remote.uri == "s3://bucket/prefix/datagen_checkpoints/p/x/log.lance"


def test_first_batch_creates_the_dataset(log: CheckpointLog) -> None:
    write_item(log, "5")
    assert log.exists()
    assert log.version == 2
    ds = lance.dataset(log.uri)
    assert ds.schema.metadata[b"datagen_schema_version"] == str(DATAGEN_SCHEMA_VERSION).encode()
    assert ds.count_rows() == 6
    assert set(ds.to_table(columns=["schema_version"])["schema_version"].to_pylist()) == {2}
    # a second handle on the same path sees everything
    other = CheckpointLog.open(log.root, pipeline="qa", experiment="e1")
    assert other.item_state("5").status is ItemStatus.COMPLETED


# --- batches ---------------------------------------------------------------------------------


def test_one_batch_is_one_commit_and_a_failing_body_writes_nothing(log: CheckpointLog) -> None:
    w = log.writer("w1", 1)
    for i in range(3):
        with w.batch() as b:
            for j in range(4):
                b.item_created(root_item_id(f"{i}-{j}"), input_fingerprint="f")
        assert log.version == i + 1
    with pytest.raises(RuntimeError, match="crash"), w.batch() as b:
        b.item_created("late", input_fingerprint="f")
        b.field_set("0-0", "x", 1)
        raise RuntimeError("crash in the middle of a batch")
    assert log.version == 3
    assert log.events("late") == []
    assert "x" not in log.item_state("0-0").fields
    with w.batch():
        pass  # an empty batch commits nothing
    assert log.version == 3
    # the writer did not advance its sequence for the discarded batch
    with w.batch() as b:
        b.field_set("0-0", "x", 1)
    assert [e.item_seq for e in log.events("0-0")] == [0, 1]
    assert log.version == 4


def test_item_state_fields_cursor_open_frames_and_fingerprint(log: CheckpointLog) -> None:
    w = log.writer("w1", 1, processor_version="v1")
    with w.batch() as b:
        b.item_created("5", input_fingerprint="fp-5")
        b.step_started("5", step="loop", step_kind="Loop", iteration=0)
        b.step_started("5", step="gen", step_kind="Sequence", enclosing_step="loop", iteration=0)
        b.field_set("5", "answer", {"text": "first"})
        b.field_set("5", "answer", {"text": "second"})
        b.field_append("5", "votes", 1)
        b.field_append("5", "votes", {"v": 2})
        b.step_completed("5", step="gen", step_kind="Sequence", enclosing_step="loop", iteration=0)
    st = log.item_state("5")
    assert st.status is ItemStatus.RUNNING
    assert st.fields == {"answer": {"text": "second"}, "votes": [1, {"v": 2}]}
    assert st.input_fingerprint == "fp-5"
    assert st.processor_version == "v1"
    assert st.cursor is not None
    assert (st.cursor.step, st.cursor.coord.enclosing_step, st.cursor.iteration) == ("gen", "loop", 0)
    assert st.cursor.processor_version == "v1"
    assert [(f.step, f.step_kind, f.iteration) for f in st.open_frames] == [("loop", "Loop", 0)]
    with w.batch() as b:
        b.step_completed("5", step="loop", step_kind="Loop", iteration=0)
        b.terminal("5", status="filtered", reason={"why": "dup"})
    st = log.item_state("5")
    assert st.status is ItemStatus.FILTERED
    assert st.open_frames == []
    assert st.filter_reason == {"why": "dup"}
    assert st.last_seq == 9


def test_a_new_fingerprint_starts_a_new_generation(log: CheckpointLog) -> None:
    write_item(log, "5", fp="old")
    w = log.writer("w2", 2)
    with w.batch() as b:
        b.item_created("5", input_fingerprint="new")
        b.field_append("5", "answer", "now a list")  # a new generation may change a field's mode
    st = log.item_state("5")
    assert (st.status, st.input_fingerprint, st.fields) == (ItemStatus.RUNNING, "new", {"answer": ["now a list"]})
    assert st.cursor is None
    assert len(log.events("5")) == 8  # the old generation stays in the log
    row = log.states().to_pylist()[0]
    assert (row["status"], row["input_fingerprint"], row["created_seq"]) == ("running", "new", 6)


def test_failures_lens(log: CheckpointLog) -> None:
    w = log.writer("w1", 3, airflow={"dag_id": "d", "run_id": "r", "task_id": "t", "map_index": 2, "try_number": 1})
    with w.batch() as b:
        b.item_created("5", input_fingerprint="f")
        b.step_started("5", step="gen")
    try:
        raise ValueError("model said no")
    except ValueError as exc:
        with w.batch() as b:
            b.failed("5", error=exc, step="gen")
    with w.batch() as b:
        b.failed("5", error="plain message", step=StepCoord(step="gen", iteration=2))
    st = log.item_state("5")
    assert st.status is ItemStatus.RUNNING  # FAILED never changes the lifecycle
    assert st.failures == 2
    records = log.failures("5")
    assert [(r.error_type, r.message, r.step, r.writer_id, r.epoch) for r in records] == [
        ("ValueError", "model said no", "gen", "w1", 3),
        ("Error", "plain message", "gen", "w1", 3),
    ]
    assert records[0].traceback is not None and "model said no" in records[0].traceback
    assert records[1].coord.iteration == 2
    assert (records[0].dag_id, records[0].run_id, records[0].task_id, records[0].map_index) == ("d", "r", "t", 2)
    assert [r.item_id for r in log.failures()] == ["5", "5"]
    summary = log.summary()
    assert (summary["running"], summary["failed_items"], summary["failed_item_ids"]) == (1, 1, ["5"])
    assert log.states().to_pylist()[0]["failures"] == 2


def test_events_are_ordered_and_carry_their_writer(log: CheckpointLog) -> None:
    write_item(log, "5", writer="w-a", epoch=4)
    write_item(log, "6")
    evs = log.events("5")
    assert [e.item_seq for e in evs] == list(range(6))
    assert [e.event_type for e in evs] == [
        EventType.ITEM_CREATED,
        EventType.STEP_STARTED,
        EventType.FIELD_SET,
        EventType.FIELD_APPEND,
        EventType.STEP_COMPLETED,
        EventType.TERMINAL,
    ]
    assert {e.item_id for e in evs} == {"5"}
    assert {(e.writer_id, e.writer_epoch, e.epoch) for e in evs} == {("w-a", 4, 4)}
    assert len({e.event_id for e in evs}) == 6
    assert all(e.created_at is not None for e in evs)
    assert evs[2].field == "answer" and evs[2].value() == {"text": "answer of 5"}
    assert evs[4].step == "gen" and evs[4].processor_version == "v1"


def test_subtree_is_a_root_and_its_children(log: CheckpointLog) -> None:
    root = root_item_id("docs/a.txt")
    kid0 = child_item_id(root, "split", 0)
    kid1 = child_item_id(root, "split", 1)
    grandkid = child_item_id(kid1, "vote", 0)
    other = root_item_id("docs/a.txt.bak")  # shares a prefix, is another root
    w = log.writer("w1", 1)
    with w.batch() as b:
        for iid in (root, kid0, kid1, grandkid, other):
            b.item_created(iid, input_fingerprint="f")
    events = log.subtree(root)
    assert sorted({e.item_id for e in events}) == sorted([root, kid0, kid1, grandkid])
    assert {e.root_item_id for e in events} == {root}
    parents = {e.item_id: e.parent_item_id for e in events}
    assert parents == {root: None, kid0: root, kid1: root, grandkid: kid1}
    assert [e.item_id for e in log.subtree(other)] == [other]
    assert log.subtree(kid0) == []  # a subtree is addressed by its root


def test_states_and_summary(log: CheckpointLog) -> None:
    write_item(log, "done")
    write_item(log, "filtered", terminal="filtered")
    write_item(log, "open", terminal=None)
    write_item(log, child_item_id("done", "split", 0))
    w = log.writer("w9", 1)
    with w.batch() as b:
        b.field_set("orphan", "x", 1)  # events without ITEM_CREATED
    states = log.states()
    assert states.schema == STATE_SCHEMA
    rows = {r["item_id"]: r for r in states.to_pylist()}
    assert {k: r["status"] for k, r in rows.items()} == {
        "done": "completed",
        "filtered": "filtered",
        "open": "running",
        "done/split:0": "completed",
        "orphan": "never_started",
    }
    assert rows["done"]["input_fingerprint"] == "f1"
    assert rows["orphan"]["input_fingerprint"] is None
    assert rows["done"]["last_seq"] == 5 and rows["open"]["last_seq"] == 4
    assert rows["done"]["processor_version"] == "v1"
    summary = log.summary()
    assert {k: summary[k] for k in ("total", "completed", "filtered", "running", "never_started", "children")} == {
        "total": 4,
        "completed": 1,
        "filtered": 1,
        "running": 1,
        "never_started": 1,
        "children": 1,
    }
    assert summary["pending"] == 2
    assert summary["failed_items"] == 0
    assert summary["fencing_violations"] == 0
    assert summary["log_version"] == log.version
    assert (summary["pipeline"], summary["experiment"]) == ("qa", "e1")


def test_ids_with_quotes_newlines_and_unicode_are_exact_filters(log: CheckpointLog) -> None:
    keys = ["it's", 'say "hi"', "line\nbreak", "ü/ß:100%", "a' OR '1'='1", "5", "50"]
    w = log.writer("w1", 1)
    with w.batch() as b:
        for k in keys:
            b.item_created(root_item_id(k), input_fingerprint=k)
    for k in keys:
        evs = log.events(root_item_id(k))
        assert [(e.item_id, e.input_fingerprint) for e in evs] == [(root_item_id(k), k)]
        assert log.item_state(root_item_id(k)).input_fingerprint == k


# --- blobs -----------------------------------------------------------------------------------


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, list[Any]]]:
    """Record the columns of every Lance scan and every blob fetch."""
    calls: dict[str, list[Any]] = {"columns": [], "take_blobs": []}
    scanner = lance.LanceDataset.scanner
    take_blobs = lance.LanceDataset.take_blobs

    def spy_scanner(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls["columns"].append(kwargs.get("columns", args[0] if args else None))
        return scanner(self, *args, **kwargs)

    def spy_take_blobs(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls["take_blobs"].append((args, kwargs))
        return take_blobs(self, *args, **kwargs)

    monkeypatch.setattr(lance.LanceDataset, "scanner", spy_scanner)
    monkeypatch.setattr(lance.LanceDataset, "take_blobs", spy_take_blobs)
    yield calls


def test_large_values_go_to_the_blob_and_load_lazily(tmp_path: Path, spy: dict[str, list[Any]]) -> None:
    lg = CheckpointLog.open(tmp_path, pipeline="qa", experiment="blobs", blob_threshold=1024)
    big = {"text": "z" * 5000}
    raw = bytes(range(256)) * 40
    w = lg.writer("w1", 1)
    with w.batch() as b:
        b.item_created("5", input_fingerprint="f")
        b.field_set("5", "big", big)
        b.field_set("5", "small", {"text": "inline"})
        b.field_append("5", "images", raw)
        b.field_append("5", "images", b"tiny")
        b.terminal("5")
    spy["columns"].clear()

    st = lg.item_state("5")
    states = lg.states()
    lg.events("5")
    lg.subtree("5")
    lg.failures("5")
    lg.failures()
    lg.summary()
    # folds, trajectories and the failure lens never project the blob column nor fetch blobs
    assert spy["columns"], "the spy saw no scans"
    for cols in spy["columns"]:
        assert cols is not None and "value_blob" not in cols
    assert spy["take_blobs"] == []
    assert "value_blob" not in LIGHT_COLUMNS and "value_blob" not in NON_BLOB_COLUMNS
    assert states.to_pylist()[0]["status"] == "completed"

    assert st.fields["small"] == {"text": "inline"}
    ref = st.fields["big"]
    assert isinstance(ref, BlobRef)
    assert ref.size == len(b'{"text":"' + b"z" * 5000 + b'"}')
    assert all(isinstance(x, BlobRef) for x in st.fields["images"])
    assert spy["take_blobs"] == []
    assert ref.load() == big
    assert len(spy["take_blobs"]) == 1
    assert [x.load() for x in st.fields["images"]] == [raw, b"tiny"]
    assert lg.load_blob(ref.event_id) == b'{"text":"' + b"z" * 5000 + b'"}'
    assert lg.load_blob(st.fields["images"][0].event_id) == raw
    stored = lance.dataset(lg.uri).to_table(columns=["field", "value_json", "value_kind"]).to_pylist()
    assert {r["field"]: (r["value_json"] is None, r["value_kind"]) for r in stored if r["field"]} == {
        "big": (True, "json"),
        "small": (False, "json"),
        "images": (True, "bytes"),
    }


def test_load_blob_errors_are_clear(log: CheckpointLog) -> None:
    with pytest.raises(InvalidEventError, match="empty"):
        log.load_blob("0" * 32)
    write_item(log, "5")
    with pytest.raises(InvalidEventError, match="no event"):
        log.load_blob("0" * 32)
    inline = next(e for e in log.events("5") if e.event_type is EventType.FIELD_SET)
    with pytest.raises(InvalidEventError, match="inline"):
        log.load_blob(inline.event_id)
    created = log.events("5")[0]
    with pytest.raises(InvalidEventError, match="no value"):
        log.load_blob(created.event_id)


# --- maintenance -----------------------------------------------------------------------------


def test_maintain_keeps_every_event_and_blob(tmp_path: Path) -> None:
    lg = CheckpointLog.open(tmp_path, pipeline="qa", experiment="m", blob_threshold=64)
    w = lg.writer("w1", 1)
    for i in range(12):
        with w.batch() as b:
            b.item_created(str(i), input_fingerprint="f")
            b.field_set(str(i), "doc", {"text": str(i) * 100})
            b.field_set(str(i), "raw", f"bytes {i}".encode())
            if i % 2:
                b.terminal(str(i))
    before_states = lg.states()
    before_events = {str(i): lg.events(str(i)) for i in range(12)}
    blob_ids = [e.event_id for evs in before_events.values() for e in evs if e.field]
    assert lg.stats()["fragments"] == 12

    report = lg.maintain()
    assert report["skipped"] is False
    assert report["fragments_before"] == 12 and report["fragments_after"] == 1
    assert set(report["indices"]) == {"item_id", "root_item_id", "event_id"}
    assert lg.stats()["events"] == 12 * 3 + 6
    assert lg.states().sort_by("item_id").equals(before_states.sort_by("item_id"))
    for i in range(12):
        assert [e.event_id for e in lg.events(str(i))] == [e.event_id for e in before_events[str(i)]]
        st = lg.item_state(str(i))
        assert st.fields["doc"].load() == {"text": str(i) * 100}
        assert st.fields["raw"].load() == f"bytes {i}".encode()
    assert all(lg.load_blob(eid) for eid in blob_ids)

    # writing and maintaining again keep working (indices refreshed, new fragments covered)
    with w.batch() as b:
        b.terminal("0")
        b.item_created("100", input_fingerprint="f")
        b.field_set("100", "raw", b"after")
    assert lg.item_state("0").status is ItemStatus.COMPLETED
    assert lg.maintain()["skipped"] is False
    assert lg.item_state("0").status is ItemStatus.COMPLETED
    assert lg.item_state("100").fields["raw"].load() == b"after"
    assert lg.summary()["completed"] == 7


def test_a_second_reader_sees_every_commit_at_once_without_listing_versions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reads skip ``checkout_latest`` (a listing of every manifest) only while no newer version exists."""
    writer_log = CheckpointLog.open(tmp_path, pipeline="qa", experiment="fresh")
    reader = CheckpointLog.open(tmp_path, pipeline="qa", experiment="fresh")
    refreshes: list[int] = []
    real = lance.LanceDataset.checkout_latest

    def counting(self: lance.LanceDataset) -> None:
        refreshes.append(1)
        real(self)

    monkeypatch.setattr(lance.LanceDataset, "checkout_latest", counting)
    for i in range(4):
        write_item(writer_log, f"item-{i}")
        assert reader.item_state(f"item-{i}").status is ItemStatus.COMPLETED
        assert reader.version == writer_log.version
    refreshes.clear()
    for _ in range(5):
        reader.item_state("item-0")
    assert refreshes == []  # nothing new: a stat, not a listing
    writer_log.maintain(cleanup_older_than=__import__("datetime").timedelta(0))
    assert reader.summary()["completed"] == 4
    assert reader.version == writer_log.version
    assert refreshes  # maintenance committed new versions, so the reader refreshed


def test_each_commit_fsyncs_exactly_its_new_data_file(log: CheckpointLog, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[str] = []
    real_open = os.open

    def spy_open(path: Any, flags: int, *args: Any) -> int:
        if flags == os.O_RDONLY:
            synced.append(os.fspath(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", spy_open)
    for i in range(3):
        synced.clear()
        write_item(log, f"item-{i}")
        data = [p for p in synced if p.endswith(".lance") and "/data/" in p]
        ds = lance.dataset(log.uri)
        newest = {df.path for f in ds.get_fragments()[-2:] for df in f.data_files()}
        # write_item is two commits (pull, then acknowledge): each synced its own file, not older ones.
        assert {os.path.basename(p) for p in data} == newest and len(data) == 2
        assert sum(p.endswith(".manifest") for p in synced) == 2


def test_maintain_keeps_one_fold_cache_not_a_copy_per_run(log: CheckpointLog) -> None:
    import datetime as dt

    for i in range(3):
        write_item(log, f"item-{i}")
        assert log.maintain(cleanup_older_than=dt.timedelta(0))["skipped"] is False
    cache = lance.dataset(log.projection_uri)
    assert len(cache.versions()) == 1
    assert cache.count_rows() == 3
    assert log.summary()["completed"] == 3


# --- idempotency and fencing -----------------------------------------------------------------


def distinct_events(lg: CheckpointLog) -> int:
    return len(set(lance.dataset(lg.uri).to_table(columns=["event_id"])["event_id"].to_pylist()))


def test_the_same_batch_written_twice_folds_the_same(log: CheckpointLog) -> None:
    def body(b: Batch) -> None:
        b.item_created("5", input_fingerprint="f")
        b.field_set("5", "answer", {"text": "hi"})
        b.field_append("5", "votes", 1)
        b.step_completed("5", step="gen")
        b.terminal("5")

    first = log.writer("w1", 1)
    with first.batch() as b:
        body(b)
    state = log.item_state("5")
    states = log.states()
    assert distinct_events(log) == 5

    # an ambiguously acknowledged batch retried by another writer that read the old sequence
    retry = log.writer("w2", 1)
    retry.prime("5", last_seq=-1)
    with retry.batch() as b:
        body(b)
    assert log.stats()["events"] == 10
    assert distinct_events(log) == 5
    assert len(log.events("5")) == 5
    assert log.item_state("5") == state
    assert log.states().equals(states)
    assert log.failures("5") == []

    # the very same Arrow table appended again
    captured: list[pa.Table] = []
    real_append = log.append

    def capture(table: pa.Table) -> None:
        captured.append(table)
        real_append(table)

    log.append = capture  # type: ignore[method-assign]
    again = log.writer("w3", 1)
    with again.batch() as b:
        b.item_created("6", input_fingerprint="f")
        b.terminal("6")
    log.append(captured[0])
    log.append(captured[0])
    assert log.stats()["events"] == 16
    assert distinct_events(log) == 7
    assert len(log.events("6")) == 2
    assert log.item_state("6").status is ItemStatus.COMPLETED
    assert log.summary()["fencing_violations"] == 0
    assert log.states().filter(pc.equal(log.states()["item_id"], "5")).equals(states)


def test_two_different_events_at_one_seq_are_reported(log: CheckpointLog) -> None:
    a = log.writer("owner-a", 1)
    with a.batch() as b:
        b.item_created("5", input_fingerprint="f")
    b_writer = log.writer("owner-b", 1)
    b_writer.prime("5", last_seq=0)  # both believe they own the item at seq 1
    with a.batch() as b:
        b.field_set("5", "answer", "from a")
    with b_writer.batch() as b:
        b.field_set("5", "answer", "from b")
    st = log.item_state("5")
    assert st.fields["answer"] in ("from a", "from b")
    records = log.failures("5")
    assert [r.error_type for r in records] == [FENCING_ERROR_TYPE]
    loser = records[0]
    assert loser.writer_id in ("owner-a", "owner-b")
    assert "item_seq 1" in loser.message
    assert st.fields["answer"] == ("from a" if loser.writer_id == "owner-b" else "from b")
    assert [r.error_type for r in log.failures()] == [FENCING_ERROR_TYPE]
    assert log.summary()["fencing_violations"] == 1
    assert log.states().to_pylist()[0]["violations"] == 1


def test_a_stale_epochs_late_writes_change_nothing(log: CheckpointLog) -> None:
    zombie = log.writer("attempt-1", 1)
    with zombie.batch() as b:
        b.item_created("5", input_fingerprint="f")
        b.step_started("5", step="gen")
    successor = log.writer("attempt-2", 2)  # looks the item up, continues at seq 2
    with successor.batch() as b:
        b.field_set("5", "answer", "good")
        b.step_completed("5", step="gen")
    good = log.item_state("5")
    good_states = log.states()
    with zombie.batch() as b:  # the zombie still believes it is at seq 1
        b.field_set("5", "answer", "zombie")
        b.step_completed("5", step="gen")
        b.terminal("5", status="filtered")
        b.field_set("5", "extra", "zombie")
    st = log.item_state("5")
    assert st.status is ItemStatus.RUNNING
    assert st.fields == good.fields == {"answer": "good"}
    assert st.cursor == good.cursor
    assert pc.equal(log.states()["status"], good_states["status"]).to_pylist() == [True]
    fencing = [r for r in log.failures("5") if r.error_type == FENCING_ERROR_TYPE]
    assert {r.writer_id for r in fencing} == {"attempt-1"}
    # seq 2: a different value (conflict); seq 3: the very same STEP_COMPLETED the successor wrote
    # (same id: a duplicate, not a violation); seqs 4 and 5: stale epoch
    assert [r.item_seq for r in fencing] == [2, 4, 5]
    assert "different FIELD_SET at item_seq 2" in fencing[0].message
    assert all("stale epoch 1" in r.message for r in fencing[1:])
    # a writer that looks the item up at an older epoch is refused before writing
    late = log.writer("attempt-0", 1)
    version = log.version
    with pytest.raises(FencingError, match="epoch 2"), late.batch() as b:
        b.field_set("5", "answer", "late")
    assert log.version == version
    assert log.next_epoch() == 3


def test_mixing_set_and_append_raises_before_writing(log: CheckpointLog) -> None:
    w = log.writer("w1", 1)
    with w.batch() as b:
        b.item_created("5", input_fingerprint="f")
        b.field_set("5", "answer", 1)

    def same_batch(b: Batch) -> None:
        b.field_append("5", "votes", 1)
        b.field_set("5", "votes", 2)

    err = nothing_written(log, same_batch, InvalidEventError)
    assert "votes" in str(err) and "FIELD_SET" in str(err) and "FIELD_APPEND" in str(err)
    # across batches, for the same writer and for a fresh writer that looks the item up
    version = log.version
    with pytest.raises(InvalidEventError, match="answer"), w.batch() as b:
        b.field_set("5", "ok", 1)
        b.field_append("5", "answer", 2)
    fresh = log.writer("w2", 1)
    with pytest.raises(InvalidEventError, match="answer"), fresh.batch() as b:
        b.field_append("5", "answer", 2)
    assert log.version == version
    assert log.item_state("5").fields == {"answer": 1}


# --- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pipeline", "experiment"),
    [
        ("a/b", "e"),
        ("..", "e"),
        ("qa", "../../etc"),
        ("", "e"),
        ("qa", ""),
        ("qa", "e\n"),
        ("qa\x00", "e"),
        ("qa", "e\x07"),
        ("/abs", "e"),
        ("ｑａ", "e"),
        ("qa", "x" * 200),
    ],
)
def test_bad_names_fail_before_any_io(tmp_path: Path, pipeline: str, experiment: str) -> None:
    with pytest.raises(InvalidNameError) as info:
        CheckpointLog.open(tmp_path / "root", pipeline=pipeline, experiment=experiment)
    assert isinstance(info.value, DatagenError)
    assert "name" in str(info.value) and "use" in str(info.value)
    assert not (tmp_path / "root").exists()


def test_unknown_terminal_status_writes_nothing(log: CheckpointLog) -> None:
    write_item(log, "5", terminal=None)

    def body(b: Batch) -> None:
        b.field_set("5", "x", 1)
        b.terminal("5", status="failed")

    err = nothing_written(log, body, InvalidEventError)
    assert "'failed'" in str(err) and "completed" in str(err) and "filtered" in str(err)
    nothing_written(log, lambda b: b.terminal("5", status="running"), InvalidEventError)
    assert log.item_state("5").status is ItemStatus.RUNNING


@pytest.mark.parametrize("value", [object(), {1, 2}, float("nan"), {"x": float("inf")}, "bad \ud800"])
def test_non_json_values_write_nothing(log: CheckpointLog, value: Any) -> None:
    write_item(log, "5", terminal=None)

    def body(b: Batch) -> None:
        b.field_set("5", "ok", 1)
        b.field_set("5", "bad", value)

    err = nothing_written(log, body, InvalidValueError)
    assert "'bad'" in str(err) and "'5'" in str(err)


def test_bad_item_ids_and_fields_write_nothing(log: CheckpointLog) -> None:
    write_item(log, "5")
    nothing_written(log, lambda b: b.item_created("", input_fingerprint="f"), DatagenError)
    nothing_written(log, lambda b: b.item_created("a\x00", input_fingerprint="f"), DatagenError)
    nothing_written(log, lambda b: b.item_created("6", input_fingerprint=""), InvalidEventError)
    nothing_written(log, lambda b: b.field_set("5", "", 1), InvalidEventError)
    nothing_written(log, lambda b: b.step_started("5", step="a/b"), InvalidNameError)
    nothing_written(log, lambda b: b.step_started("5", step="s", step_kind="Nope"), InvalidEventError)
    nothing_written(log, lambda b: b.step_started("5", step="s", iteration=-1), InvalidEventError)
    # text that is not valid Unicode (lone surrogates) is refused as a DatagenError, not a codec error
    nothing_written(log, lambda b: b.item_created("a\ud800", input_fingerprint="f"), DatagenError)
    nothing_written(log, lambda b: b.item_created("6", input_fingerprint="f\udc80"), InvalidEventError)
    nothing_written(log, lambda b: b.field_set("5", "f\ud800", 1), InvalidEventError)
    with pytest.raises(InvalidEventError, match="epoch"):
        log.writer("w", -1)
    with pytest.raises(InvalidNameError, match="writer_id"):
        log.writer("", 1)


def test_error_texts_that_are_not_valid_unicode_still_write_their_failed_row(log: CheckpointLog) -> None:
    # an OSError about a path decoded with surrogateescape must not make the failure itself unwritable
    with log.writer("w", 1).batch() as b:
        b.item_created("5", input_fingerprint="f")
        name = b"caf\xe9".decode("utf-8", "surrogateescape")
        b.failed("5", error=OSError("cannot read " + name))
    [record] = log.failures("5")
    assert record.error_type == "OSError"
    assert record.message == "cannot read caf\\udce9"


def _rows_v(version: int, tmp_path: Path) -> pa.Table:
    """A valid batch as the writer builds it, with its schema_version column set to ``version``."""
    scratch = CheckpointLog.open(tmp_path / "scratch", pipeline="qa", experiment="s")
    captured: list[pa.Table] = []
    scratch.append = captured.append  # type: ignore[method-assign]
    with scratch.writer("w", 1).batch() as b:
        b.item_created("5", input_fingerprint="f")
        b.terminal("5")
    table = captured[0]
    col = table.schema.get_field_index("schema_version")
    return table.set_column(col, table.schema.field(col), pa.array([version] * table.num_rows, pa.int32()))


def test_rows_of_a_newer_schema_version_are_refused(tmp_path: Path, log: CheckpointLog) -> None:
    write_item(log, "5")
    version = log.version
    lance.write_dataset(_rows_v(3, tmp_path), log.uri, schema=EVENT_SCHEMA, mode="append")
    fresh = CheckpointLog.open(tmp_path, pipeline="qa", experiment="e1")
    for read in (fresh.states, lambda: fresh.item_state("5"), lambda: fresh.events("5"), fresh.summary):
        with pytest.raises(SchemaVersionError) as info:
            read()
        assert "version 3" in str(info.value) and "upgrade" in str(info.value)
    # a writer that must look the item up refuses too, writing nothing
    with pytest.raises(SchemaVersionError), fresh.writer("w", 5).batch() as b:
        b.field_set("5", "x", 1)
    assert lance.dataset(log.uri).version == version + 1


def test_a_log_whose_metadata_says_version_3_is_refused_on_open(tmp_path: Path) -> None:
    uri = f"{tmp_path}/datagen_checkpoints/qa/e1/log.lance"
    schema_v3 = EVENT_SCHEMA.with_metadata({b"datagen_schema_version": b"3"})
    lance.write_dataset(_rows_v(3, tmp_path).cast(schema_v3), uri, schema=schema_v3)
    with pytest.raises(SchemaVersionError, match="upgrade airflow-provider-datagen"):
        CheckpointLog.open(tmp_path, pipeline="qa", experiment="e1")
    assert lance.dataset(uri).count_rows() == 2  # refused, not modified


def test_a_log_of_an_older_schema_version_is_refused(tmp_path: Path) -> None:
    uri = f"{tmp_path}/datagen_checkpoints/qa/e1/log.lance"
    schema_v1 = EVENT_SCHEMA.with_metadata({b"datagen_schema_version": b"1"})
    lance.write_dataset(_rows_v(1, tmp_path).cast(schema_v1), uri, schema=schema_v1)
    with pytest.raises(SchemaVersionError, match="Migrate"):
        CheckpointLog.open(tmp_path, pipeline="qa", experiment="e1")


def _log_path(tmp_path: Path) -> Path:
    path = tmp_path / "datagen_checkpoints" / "qa" / "e1" / "log.lance"
    path.parent.mkdir(parents=True)
    return path


@pytest.mark.parametrize("kind", ["dir-with-a-file", "dir-with-files", "file"])
def test_a_path_that_is_not_a_lance_dataset_is_refused(tmp_path: Path, kind: str) -> None:
    path = _log_path(tmp_path)
    if kind == "file":
        path.write_text("not a dataset")
    else:
        path.mkdir()
        (path / "notes.txt").write_text("hello")
        if kind == "dir-with-files":
            (path / "data").mkdir()
            (path / "_versions").mkdir()
    with pytest.raises(NotALogError) as info:
        CheckpointLog.open(tmp_path, pipeline="qa", experiment="e1")
    assert "log.lance" in str(info.value) and "not a Lance dataset" in str(info.value)
    assert "experiment" in str(info.value)
    if kind == "file":
        assert path.read_text() == "not a dataset"


def test_a_lance_dataset_that_is_not_ours_is_refused(tmp_path: Path) -> None:
    path = _log_path(tmp_path)
    lance.write_dataset(pa.table({"x": [1, 2, 3]}), str(path))
    with pytest.raises(NotALogError, match="not a datagen checkpoint log"):
        CheckpointLog.open(tmp_path, pipeline="qa", experiment="e1")
    assert lance.dataset(str(path)).count_rows() == 3


_FRESH_RUN = """
import sys
from airflow_provider_datagen.core import CheckpointLog, export_results, run_items, status_of
from airflow_provider_datagen.core.chunks import plan_chunks

root = sys.argv[1]
items = [{"id": i, "prompt": f"question {i}"} for i in range(20)]
log = CheckpointLog.open(root, pipeline="qa", experiment="e1")
plan_chunks(log, items, chunk_size=10)  # an inline source: its snapshot and the first projection
run_items(log, items, lambda item, ctx: {"answer": item["prompt"].upper()}, processor_version="v1",
          writer_id="w1", epoch=log.next_epoch())
log.refresh_projection(min_new_events=0)
log.maintain()
assert status_of(log)["completed"] == 20
print(export_results(log, root + "/out.lance")["rows"])
print(export_results(log, root + "/out.lance")["rows"])  # over the first export
"""


def test_a_fresh_run_prints_no_lance_warning(tmp_path: Path) -> None:
    """Creating the log, snapshot, projection and export prints no ``WARN ... it will be created``.

    Lance's Rust logger writes that line to the process's stderr (not Python's logging) for an
    overwrite that creates a dataset, so the run happens in a child process whose stderr is read.
    """
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "LANCE_LOG"}  # Lance's default level: warnings shown
    result = subprocess.run(
        [sys.executable, "-c", _FRESH_RUN, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["20", "20"]
    assert "it will be created" not in result.stderr, result.stderr
    assert "WARN" not in result.stderr, result.stderr
