"""Hostile and broken input, table-driven: each case is refused with a clear DatagenError, or works.

Every case runs against a log that already holds work: acknowledged items, items in the inbox (pulled,
never acknowledged) and an item with a FAILED row. Around each case the test snapshots the log
(``version``, the folded ``states()``, the export fingerprint, the distinct event ids and a digest of
every file) and checks that nothing already written was lost or altered:

- refused input: the error is a :class:`DatagenError` subclass whose message names the thing and the
  fix, and the whole snapshot is unchanged (no write happened, no directory was created);
- input that must work (odd keys, huge ints, large values): the new items complete and export with the
  right keys and values, and the state of every item written before is unchanged;
- a misbehaving process (non-JSON results, KeyboardInterrupt, SystemExit, a hang ended by Airflow's
  task timeout): acknowledged items are kept and a clean resume equals an uninterrupted run;
- a damaged log (truncated/deleted fragment, truncated manifest, missing ``_versions``, newer schema):
  every read path raises an error naming the dataset with restore/maintain advice, never a smaller state;
- ENOSPC on a tiny tmpfs: the failed batch is not acknowledged and the next run redoes exactly it.

The number of cases tried and passed is printed in the terminal summary.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lance
import pyarrow as pa
import pytest

from airflow_provider_datagen.core import (
    CheckpointLog,
    export_results,
    fingerprint_of,
    key_of,
    plan_resume,
    results_fingerprint,
    root_item_id,
    run_items,
)
from airflow_provider_datagen.core.events import BlobRef
from airflow_provider_datagen.core.export import collect_results
from airflow_provider_datagen.core.schema import EVENT_SCHEMA
from airflow_provider_datagen.core.store.paths import EPOCH_FILE
from airflow_provider_datagen.exceptions import (
    ConfigurationError,
    DatagenError,
    InvalidItemError,
    InvalidNameError,
    ItemFailedError,
    LogCorruptedError,
    LogWriteError,
    ProcessContractError,
    ProcessInterrupted,
    SchemaVersionError,
)
from tests._support.engine import fields_of_export

if TYPE_CHECKING:
    from collections.abc import Callable

PIPELINE = "hostile"
EXPERIMENT = "e1"
MB = 1_000_000


# --- the log every case starts from ------------------------------------------------------------------------


def seed_process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
    if item.get("boom") and ctx.attempt == 1:
        raise RuntimeError(f"seeded failure of {ctx.key}")
    ctx.append("trail", item["n"] % 3)
    return {"double": item["n"] * 2, "key": ctx.key}


SEED_ITEMS = [{"id": f"seed-{k}", "n": k} for k in range(4)] + [{"id": "seed-boom", "n": 9, "boom": True}]
INBOX_ITEMS = [{"id": "inbox-1", "n": 11}, {"id": "inbox-2", "n": 12}]


@dataclass
class Env:
    root: Path
    tmp: Path

    def open(self) -> CheckpointLog:
        return CheckpointLog.open(self.root, pipeline=PIPELINE, experiment=EXPERIMENT)

    @property
    def uri(self) -> str:
        return self.open().uri


@pytest.fixture
def env(tmp_path: Path) -> Env:
    root = tmp_path / "root" / "inner"
    e = Env(root, tmp_path)
    lg = e.open()
    report = run_items(lg, SEED_ITEMS, seed_process, checkpoint_every=2, writer_id="seed", epoch=1)
    assert report.failed == ["seed-boom"]
    with lg.writer("pulled-then-died", 2, processor_version="v1").batch() as b:
        for it in INBOX_ITEMS:
            b.item_created(str(it["id"]), input_fingerprint=fingerprint_of(it))
    return e


def tree_digest(path: str | Path) -> dict[str, str]:
    out = {}
    for dirpath, _, files in os.walk(path):
        for name in files:
            if name == EPOCH_FILE:
                continue  # the epoch counter: the run claims its epoch before it reads any input
            full = os.path.join(dirpath, name)
            with open(full, "rb") as fh:
                out[os.path.relpath(full, path)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def all_paths(path: Path) -> set[str]:
    return {os.path.relpath(os.path.join(d, n), path) for d, dirs, files in os.walk(path) for n in [*dirs, *files]}


def snapshot(lg: CheckpointLog) -> dict[str, Any]:
    states = lg.states()
    rows = sorted(states.to_pylist(), key=lambda r: r["item_id"])
    return {
        "version": lg.version,
        "states": rows,
        "results": results_fingerprint(collect_results(lg)),
        "events": sorted(set(lance.dataset(lg.uri).to_table(columns=["event_id"])["event_id"].to_pylist())),
        "failures": sorted((f.item_id, f.error_type, f.message) for f in lg.failures()),
    }


def seed_states(lg: CheckpointLog) -> dict[str, Any]:
    """What the seeded items look like: must survive every case that writes new items."""
    ids = [root_item_id(it["id"]) for it in [*SEED_ITEMS, *INBOX_ITEMS]]
    out = {}
    for iid, st in lg.item_states(ids).items():
        fields = {k: (v.digest if isinstance(v, BlobRef) else v) for k, v in st.fields.items()}
        out[iid] = (st.status.value, fields, st.failures, st.last_seq, st.input_fingerprint)
    return out


def expect_refused(
    env: Env, action: Callable[[], Any], exc_type: type[BaseException], *needles: str, log_exists: bool = True
) -> str:
    """``action`` raises ``exc_type`` (a DatagenError) naming ``needles``; nothing on disk changed."""
    lg = env.open()
    before = snapshot(lg) if log_exists else None
    files = tree_digest(env.tmp)
    with pytest.raises(exc_type) as info:
        action()
    assert isinstance(info.value, DatagenError), f"{type(info.value).__mro__} is not a DatagenError"
    message = str(info.value)
    for needle in needles:
        assert needle.lower() in message.lower(), f"{needle!r} not in the message: {message}"
    assert tree_digest(env.tmp) == files, "a refused input changed files on disk"
    if log_exists:
        assert snapshot(env.open()) == before
    return message


def run_new(env: Env, items: list[dict[str, Any]], process: Any, **kwargs: Any) -> Any:
    """Run new items on the seeded log; the seeded items' states must not change."""
    lg = env.open()
    seeded = seed_states(lg)
    kwargs.setdefault("writer_id", "case")
    kwargs.setdefault("epoch", lg.next_epoch())
    report = run_items(lg, items, process, **kwargs)
    assert seed_states(env.open()) == seeded, "writing new items altered items written before"
    return report


def echo(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
    return {"key": ctx.key, "value": item.get("value"), "id_seen": ctx.item_id}


def assert_works(env: Env, items: list[dict[str, Any]], process: Any = echo) -> dict[str, Any]:
    """The items complete, export with their original keys, and a second run touches nothing."""
    report = run_new(env, items, process)
    assert not report.failed, report.errors
    keys = [str(it["id"]) for it in items]
    assert sorted(report.processed) == sorted(root_item_id(k) for k in keys)
    lg = env.open()
    for it in items:
        iid = root_item_id(it["id"])
        assert key_of(iid) == str(it["id"])
        st = lg.item_state(iid)
        assert st.status.value == "completed", (iid, st.status)
    dest = env.tmp / "export.lance"
    exported = export_results(lg, str(dest))
    # a bytes field is exported as a blob-encoded binary column: read as its bytes
    rows = {r["item_id"]: r for r in lance.dataset(str(dest)).to_table(blob_handling="all_binary").to_pylist()}
    assert exported["rows"] == len(rows)
    for it in items:
        row = rows[root_item_id(it["id"])]
        assert row["key"] == str(it["id"])
        if process is echo:
            assert row["field_key"] == str(it["id"])  # a field named "key" has the column field_key
    again = run_items(env.open(), items, process, writer_id="again", epoch=env.open().next_epoch())
    assert again.processed == [] and again.invocations == 0
    return rows


# --- names -----------------------------------------------------------------------------------------------


def name_case(pipeline: str, experiment: str) -> Callable[[Env], None]:
    def case(env: Env) -> None:
        what = "pipeline" if pipeline != PIPELINE else "experiment"
        before = all_paths(env.tmp)
        expect_refused(
            env,
            lambda: CheckpointLog.open(env.root, pipeline=pipeline, experiment=experiment),
            InvalidNameError,
            what,
            "use ",
        )
        assert all_paths(env.tmp) == before

    return case


def case_operator_name(env: Env) -> None:
    from airflow_provider_datagen.operators.datagen import DatagenPlanOperator

    expect_refused(
        env,
        lambda: DatagenPlanOperator(task_id="plan", pipeline="../../etc", experiment="e1", source=[]),
        ConfigurationError,
        "pipeline",
        "not allowed",
    )


def case_hook_relative_root(env: Env) -> None:
    from airflow_provider_datagen.hooks.datagen import DatagenHook

    mp = pytest.MonkeyPatch()
    mp.setenv("AIRFLOW_CONN_DATAGEN_HOSTILE", json.dumps({"conn_type": "datagen", "host": "../relative/root"}))
    try:
        expect_refused(
            env,
            lambda: DatagenHook(datagen_conn_id="datagen_hostile").get_log(PIPELINE, EXPERIMENT),
            ConfigurationError,
            "datagen_hostile",
            "relative path",
            "absolute path",
        )
    finally:
        mp.undo()


# --- keys that must work, and keys that must be refused ----------------------------------------------------


def key_case(*keys: Any) -> Callable[[Env], None]:
    def case(env: Env) -> None:
        rows = assert_works(env, [{"id": k, "value": i} for i, k in enumerate(keys)])
        assert {r["key"] for r in rows.values()} >= {str(k) for k in keys}

    return case


def refused_key_case(key: Any, *needles: str) -> Callable[[Env], None]:
    def case(env: Env) -> None:
        items = [{"id": "fine-1", "value": 1}, {"id": key, "value": 2}]
        expect_refused(env, lambda: run_new(env, items, echo), InvalidItemError, *needles)

    return case


def case_int_and_str_key_collide(env: Env) -> None:
    items = [{"id": 7, "value": 1}, {"id": "7", "value": 2}]
    expect_refused(env, lambda: run_new(env, items, echo), InvalidItemError, "duplicate key", "de-duplicate")


# --- payloads ----------------------------------------------------------------------------------------------


def case_nan_in_source(env: Env) -> None:
    items = [{"id": "ok", "value": 1.5}, {"id": "nan", "value": float("nan")}]
    expect_refused(env, lambda: run_new(env, items, echo), InvalidItemError, "'nan'", "NaN", "replace it with null")


def _returning(value_of: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any], Any], Any]:
    def process(item: dict[str, Any], ctx: Any) -> Any:
        if item["id"] == "bad":
            return value_of(item)
        return {"fine": item["id"]}

    return process


def bad_result_case(value_of: Callable[[dict[str, Any]], Any], error_type: str, *needles: str) -> Callable[[Env], None]:
    """The process returns something the log cannot store: that item fails clearly, the others complete."""

    def case(env: Env) -> None:
        items = [{"id": "good-1"}, {"id": "bad"}, {"id": "good-2"}]
        process = _returning(value_of)
        report = run_new(env, items, process, checkpoint_every=1)
        assert report.failed == ["bad"] and sorted(report.processed) == ["good-1", "good-2"]
        lg = env.open()
        [record] = lg.failures("bad")
        assert record.error_type == error_type, record
        for needle in needles:
            assert needle.lower() in record.message.lower(), record.message
        assert lg.item_state("bad").status.value == "running"  # pending: a rerun retries it
        # fail_fast turns the same misbehaviour into a DatagenError for the whole run
        with pytest.raises(ItemFailedError) as info:
            run_items(lg, items, process, fail_fast=True, writer_id="ff", epoch=lg.next_epoch())
        assert isinstance(info.value, DatagenError) and "bad" in str(info.value)

    return case


def broken_on_every_item_case(value_of: Callable[[dict[str, Any]], Any], *needles: str) -> Callable[[Env], None]:
    """The process breaks its contract on every item: the chunk stops at the third, not after every paid call."""

    def case(env: Env) -> None:
        items = [{"id": f"item-{i}"} for i in range(10)]
        calls: list[str] = []

        def process(item: dict[str, Any], ctx: Any) -> Any:
            calls.append(item["id"])
            return value_of(item)

        with pytest.raises(ProcessContractError) as info:
            run_new(env, items, process)
        message = str(info.value)
        assert "consecutive items" in message and "'item-2'" in message and "return a dict" in message
        for needle in needles:
            assert needle.lower() in message.lower(), message
        assert calls == ["item-0", "item-1", "item-2"]
        lg = env.open()
        assert [len(lg.failures(f"item-{i}")) for i in range(4)] == [1, 1, 1, 0]
        assert plan_resume(lg, items).pending == [f"item-{i}" for i in range(10)]  # nothing was lost

    return case


def case_huge_ints(env: Env) -> None:
    big = [2**200, -(2**200), 10**400]
    items = [{"id": f"big-{i}", "value": v} for i, v in enumerate(big)]
    rows = assert_works(env, items, lambda item, ctx: {"value": item["value"], "plus_one": item["value"] + 1})
    for i, v in enumerate(big):
        fields = fields_of_export(env.tmp / "export.lance")[f"big-{i}"]
        assert fields == {"value": v, "plus_one": v + 1}  # exact: beyond 64 bits, JSON text keeps Python ints
    assert rows["big-0"]["value"] == str(big[0])


def _nested(depth: int) -> Any:
    v: Any = []
    for _ in range(depth):
        v = [v]
    return v


def case_deep_nesting_in_source(env: Env) -> None:
    items = [{"id": "deep", "value": _nested(100_000)}]
    expect_refused(env, lambda: run_new(env, items, echo), InvalidItemError, "'deep'", "nested too deeply", "flatten")


def case_moderate_nesting_works(env: Env) -> None:
    assert_works(env, [{"id": "nest-500", "value": _nested(500)}])
    # deeper than an Arrow type may nest: the column holds JSON text
    assert fields_of_export(env.tmp / "export.lance")["nest-500"]["value"] == _nested(500)


def case_fifty_mb_string(env: Env) -> None:
    text = "0123456789" * (5 * MB)
    rows = assert_works(env, [{"id": "big-str", "n": 1}], lambda item, ctx: {"text": text, "small": 1})
    st = env.open().item_state("big-str")
    assert isinstance(st.fields["text"], BlobRef) and st.fields["text"].size == len(text) + 2
    assert st.fields["text"].load() == text
    assert rows["big-str"]["text"] == text and rows["big-str"]["small"] == 1


def case_fifty_mb_bytes(env: Env) -> None:
    blob = os.urandom(1 << 20) * 50
    rows = assert_works(env, [{"id": "big-bytes", "n": 1}], lambda item, ctx: {"raw": blob})
    ref = env.open().item_state("big-bytes").fields["raw"]
    assert isinstance(ref, BlobRef) and ref.size == len(blob)
    assert env.open().load_blob(ref.event_id) == blob
    assert rows["big-bytes"]["raw"] == blob  # the export holds the bytes themselves (include_blobs=True)


def case_fifty_mb_source_item(env: Env) -> None:
    assert_works(env, [{"id": "big-input", "value": "y" * (50 * MB)}], lambda item, ctx: {"n": len(item["value"])})


# --- a process that interrupts, exits or hangs ----------------------------------------------------------------


RUN_ITEMS = [{"id": f"r-{k}", "n": k} for k in range(10)]


def baseline_fingerprint(env: Env, items: list[dict[str, Any]], process: Any) -> str:
    lg = CheckpointLog.open(env.tmp / "baseline", pipeline=PIPELINE, experiment=EXPERIMENT)
    run_items(lg, items, process)
    return results_fingerprint(collect_results(lg))


def subset_fingerprint(lg: CheckpointLog, items: list[dict[str, Any]]) -> str:
    ids = {root_item_id(it["id"]) for it in items}
    return results_fingerprint({k: v for k, v in collect_results(lg).items() if k in ids})


def squared(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
    return {"sq": item["n"] ** 2, "key": ctx.key}


def interrupted_case(make_exc: Callable[[], BaseException], checkpoint_every: int | None) -> Callable[[Env], None]:
    def case(env: Env) -> None:
        interrupt = {"on": True}

        def process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
            if item["n"] == 4 and interrupt["on"]:
                raise make_exc()
            return squared(item, ctx)

        expected = baseline_fingerprint(env, RUN_ITEMS, squared)
        with pytest.raises(ProcessInterrupted) as info:
            run_new(env, RUN_ITEMS, process, checkpoint_every=checkpoint_every)
        message = str(info.value)
        assert "r-4" in message and "acknowledged items were kept" in message
        assert isinstance(info.value.__cause__, type(make_exc()))
        lg = env.open()
        done = {iid for iid, st in lg.item_states([f"r-{k}" for k in range(10)]).items() if st.is_done}
        assert done == {f"r-{k}" for k in range(4)}, done  # everything before the interrupted item is acked
        interrupt["on"] = False
        report = run_new(env, RUN_ITEMS, process, checkpoint_every=checkpoint_every)
        assert sorted(report.processed) == sorted(f"r-{k}" for k in range(4, 10)) and report.invocations == 6
        assert subset_fingerprint(env.open(), RUN_ITEMS) == expected

    return case


def case_hang_ended_by_task_timeout(env: Env) -> None:
    """Airflow's execution_timeout raises AirflowTaskTimeout (a BaseException) inside the hung function."""
    from airflow.sdk.exceptions import AirflowTaskTimeout

    hang = {"on": True}

    def process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        if item["n"] == 6 and hang["on"]:
            signal.setitimer(signal.ITIMER_REAL, 0.3)  # the task's execution_timeout runs out meanwhile
            time.sleep(30)  # hangs
        return squared(item, ctx)

    def on_alarm(signum: int, frame: Any) -> None:
        raise AirflowTaskTimeout("Timeout, PID: test")  # what Airflow's timeout handler raises

    expected = baseline_fingerprint(env, RUN_ITEMS, squared)
    timer = signal.getitimer(signal.ITIMER_REAL)  # pytest-timeout's, if it uses SIGALRM
    previous = signal.signal(signal.SIGALRM, on_alarm)
    started = time.monotonic()
    try:
        with pytest.raises(AirflowTaskTimeout):
            run_new(env, RUN_ITEMS, process, checkpoint_every=2, reraise=(AirflowTaskTimeout,))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if timer[0]:
            signal.setitimer(signal.ITIMER_REAL, max(0.001, timer[0] - (time.monotonic() - started)), timer[1])
    assert time.monotonic() - started < 20
    lg = env.open()
    done = {iid for iid, st in lg.item_states([f"r-{k}" for k in range(10)]).items() if st.is_done}
    assert done == {f"r-{k}" for k in range(6)}, done
    assert lg.failures("r-6") == []  # a timeout is not the item's fault: no FAILED row
    hang["on"] = False
    report = run_new(env, RUN_ITEMS, process, checkpoint_every=2, reraise=(AirflowTaskTimeout,))
    assert sorted(report.processed) == sorted(f"r-{k}" for k in range(6, 10))
    assert report.invocations == 4
    assert subset_fingerprint(env.open(), RUN_ITEMS) == expected


# --- a damaged or foreign log ---------------------------------------------------------------------------------


READ_PATHS: dict[str, Callable[[CheckpointLog], Any]] = {
    "states": lambda lg: lg.states(),
    "item_state": lambda lg: lg.item_state("seed-1"),
    "summary": lambda lg: lg.summary(),
    "plan_resume": lambda lg: plan_resume(lg, SEED_ITEMS),
    "run_items": lambda lg: run_items(lg, SEED_ITEMS, seed_process, writer_id="late", epoch=99),
    "export": lambda lg: export_results(lg, str(Path(lg.root).parent / "damaged-export.lance")),
}


def damaged_case(damage: Callable[[str], None], *needles: str) -> Callable[[Env], None]:
    """Every read path raises LogCorruptedError naming the dataset and the fix; no smaller state, no write."""

    def case(env: Env) -> None:
        uri = env.uri
        backup = env.tmp / "backup.lance"
        shutil.copytree(uri, backup)
        before = snapshot(env.open())
        damage(uri)
        damaged_files = tree_digest(uri)
        for name, read in READ_PATHS.items():
            with pytest.raises(DatagenError) as info:
                read(env.open())
            message = str(info.value)
            assert isinstance(info.value, LogCorruptedError), f"{name}: {type(info.value).__name__}: {message}"
            assert uri in message, f"{name}: the message does not name the dataset: {message}"
            for needle in ("restore", "maintain", *needles):
                assert needle in message.lower(), f"{name}: no {needle!r} advice in: {message}"
        assert tree_digest(uri) == damaged_files, "something wrote to a damaged log"
        assert not (env.tmp / "root" / "damaged-export.lance").exists()
        # the advice works: restoring the copy gives back exactly the log as it was
        shutil.rmtree(uri)
        shutil.copytree(backup, uri)
        assert snapshot(env.open()) == before

    return case


def case_fragment_deleted_after_maintain(env: Env) -> None:
    """After maintain() the state projection may answer states() without touching the fragments: it may
    serve the state as it was (a cache of the truth), never a smaller one; reads of events fail clearly."""
    lg = env.open()
    assert lg.maintain()["skipped"] is False
    uri = lg.uri
    before = snapshot(env.open())
    for f in glob.glob(os.path.join(uri, "data", "*")):
        os.remove(f)  # compaction left one fragment: the whole log's data
    files = tree_digest(uri)
    for name in ("states", "summary", "plan_resume"):
        try:
            result = READ_PATHS[name](env.open())
        except LogCorruptedError as exc:
            assert uri in str(exc) and "restore" in str(exc).lower(), str(exc)
            continue
        if name == "states":
            assert sorted(result.to_pylist(), key=lambda r: r["item_id"]) == before["states"]
        elif name == "summary":
            assert result["completed"] == sum(r["status"] == "completed" for r in before["states"])
    for name in ("item_state", "run_items", "export"):
        with pytest.raises(LogCorruptedError) as info:
            READ_PATHS[name](env.open())
        message = str(info.value)
        assert uri in message and "restore" in message.lower() and "maintain" in message.lower(), message
    assert tree_digest(uri) == files, "something wrote to a damaged log"


def _data_files(uri: str) -> list[str]:
    return sorted(glob.glob(os.path.join(uri, "data", "*")), key=os.path.getmtime)


def truncate_fragment(uri: str) -> None:
    f = _data_files(uri)[0]
    os.truncate(f, os.path.getsize(f) // 2)


def zero_fragment(uri: str) -> None:
    os.truncate(_data_files(uri)[-1], 0)


def delete_fragment(uri: str) -> None:
    os.remove(_data_files(uri)[1])


def truncate_manifest(uri: str) -> None:
    newest = min(glob.glob(os.path.join(uri, "_versions", "*.manifest")))  # v2 naming: u64::MAX - version
    os.truncate(newest, os.path.getsize(newest) // 2)


def delete_versions(uri: str) -> None:
    shutil.rmtree(os.path.join(uri, "_versions"))


def case_newer_schema_metadata(env: Env) -> None:
    uri = env.uri
    ds = lance.dataset(uri)
    ds.replace_schema_metadata({"datagen_schema_version": "3"})
    files = tree_digest(uri)
    for what in ("open", "run"):
        with pytest.raises(SchemaVersionError) as info:
            lg = CheckpointLog.open(env.root, pipeline=PIPELINE, experiment=EXPERIMENT)
            if what == "run":
                run_items(lg, [{"id": "x"}], echo)
        message = str(info.value)
        assert uri in message and "version 3" in message and "upgrade airflow-provider-datagen" in message
        assert "not modified" in message
    assert tree_digest(uri) == files


def case_newer_schema_rows(env: Env) -> None:
    lg = env.open()
    scratch = CheckpointLog.open(env.tmp / "scratch", pipeline="s", experiment="s")
    captured: list[pa.Table] = []
    scratch.append = captured.append  # type: ignore[method-assign]
    with scratch.writer("future", 1).batch() as b:
        b.item_created("from-the-future", input_fingerprint="f")
    table = captured[0]
    col = table.schema.get_field_index("schema_version")
    table = table.set_column(col, table.schema.field(col), pa.array([3] * table.num_rows, pa.int32()))
    lance.write_dataset(table, lg.uri, schema=EVENT_SCHEMA, mode="append")
    files = tree_digest(lg.uri)
    paths = {**READ_PATHS, "item_state": lambda lg: lg.item_state("from-the-future")}
    for name, read in paths.items():
        with pytest.raises(SchemaVersionError) as info:
            read(env.open())
        assert "version 3" in str(info.value) and "upgrade" in str(info.value), name
    assert tree_digest(lg.uri) == files


# --- ENOSPC --------------------------------------------------------------------------------------------------


def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def _umount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30, check=False)


def _free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


@contextlib.contextmanager
def _injected_enospc(after_calls: int) -> Any:
    """Where mounting is not allowed: Lance's writes fail with ENOSPC after ``after_calls`` writes."""
    original = lance.write_dataset
    calls = {"n": 0}

    def failing(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] > after_calls:
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        return original(*args, **kwargs)

    lance.write_dataset = failing
    try:
        yield
    finally:
        lance.write_dataset = original


def padded(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
    return {"n": item["n"], "pad": "z" * (20_000 * (1 + item["n"] % 3))}


def case_enospc(env: Env) -> None:
    """A full disk at several fill levels: the failed batch is never acknowledged and is redone exactly."""
    items = [{"id": f"d-{k}", "n": k} for k in range(16)]
    expected = baseline_fingerprint(env, items, padded)
    mnt = env.tmp / "tmpfs"
    mounted = _mount_tmpfs(mnt, "24m")
    levels = [0, 2_000, 8_000, 30_000, 70_000, 120_000, 200_000] if mounted else [1, 2, 3]
    outcomes = []
    try:
        for level in levels:
            root = mnt / f"level-{level}" if mounted else env.tmp / f"level-{level}"
            lg = CheckpointLog.open(root, pipeline=PIPELINE, experiment=EXPERIMENT)
            run_items(lg, items[:5], padded, checkpoint_every=2, writer_id="first", epoch=1)
            before = {iid: st.status.value for iid, st in lg.item_states([f"d-{k}" for k in range(5)]).items()}
            filler = mnt / "filler"
            error: DatagenError | None = None
            if mounted:
                with open(filler, "wb") as fh:
                    fh.write(b"\0" * max(0, _free_bytes(mnt) - level))
                guard: Any = contextlib.nullcontext()
            else:
                guard = _injected_enospc(level)
            with guard:
                try:
                    run_items(lg, items, padded, checkpoint_every=3, writer_id="full", epoch=2)
                except DatagenError as exc:
                    error = exc
            if mounted:
                filler.unlink()
            outcomes.append(type(error).__name__ if error else "ok")
            if error is not None:
                assert isinstance(error, LogWriteError), f"level {level}: {type(error).__name__}: {error}"
                assert "no space left" in str(error) and "not acknowledged" in str(error) and lg.uri in str(error)
            lg = CheckpointLog.open(root, pipeline=PIPELINE, experiment=EXPERIMENT)
            states = lg.item_states([f"d-{k}" for k in range(16)])
            assert {k: states[k].status.value for k in before} == before  # acked before the full disk: kept
            pending = sorted(iid for iid, st in states.items() if not st.is_done)
            report = run_items(lg, items, padded, checkpoint_every=3, writer_id="after", epoch=3)
            assert sorted(report.processed) == pending, f"level {level}: redid {report.processed}, pending {pending}"
            assert report.invocations == len(pending)
            assert results_fingerprint(collect_results(lg)) == expected, f"level {level}"
    finally:
        if mounted:
            _umount(mnt)
    assert "LogWriteError" in outcomes, outcomes  # the disk really filled up at some level
    print(f"ENOSPC ({'tmpfs' if mounted else 'injected'}): outcomes by level {dict(zip(levels, outcomes))}")


# --- the table ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    id: str
    run: Callable[[Env], None]


def _set(item: dict[str, Any]) -> Any:
    return {1, 2, 3}


CASES = [
    # names: refused before any I/O, nothing created anywhere
    Case("pipeline-dotdot-escape", name_case("../evil", EXPERIMENT)),
    Case("experiment-dotdot-escape", name_case(PIPELINE, "a/../../b")),
    Case("experiment-absolute-path", name_case(PIPELINE, "/etc/passwd")),
    Case("experiment-dotdot", name_case(PIPELINE, "..")),
    Case("pipeline-nul", name_case("x\x00y", EXPERIMENT)),
    Case("experiment-fullwidth-unicode", name_case(PIPELINE, "ｅｘｐ")),
    Case("experiment-rtl-override", name_case(PIPELINE, "exp\u202egnp")),
    Case("pipeline-combining-accent", name_case("cafe\u0301", EXPERIMENT)),
    Case("experiment-trailing-space", name_case(PIPELINE, "exp ")),
    Case("experiment-newline", name_case(PIPELINE, "exp\nx")),
    Case("experiment-empty", name_case(PIPELINE, "")),
    Case("experiment-129-chars", name_case(PIPELINE, "e" * 129)),
    Case("operator-pipeline-escape", case_operator_name),
    Case("hook-relative-root", case_hook_relative_root),
    # keys: any string works and round-trips
    Case("key-slashes", key_case("dir/sub/file.txt", "/leading", "trailing/")),
    Case("key-colons", key_case("ns:thing:1", "x/step:0", ":")),
    Case("key-percent-and-escape-lookalikes", key_case("100% done", "a%2Fb", "a/b", "%25", "%")),
    Case("key-newlines-tabs", key_case("line1\nline2", "cr\r\n", "tab\there")),
    Case("key-quotes-sql", key_case('it\'s "quoted" \\ ; DROP TABLE x; --', "' OR '1'='1")),
    Case("key-unicode", key_case("ключ", "🔑🔑", "e\u0301", "rtl\u202eltr", "\u200bzero-width")),
    Case("key-4096-ascii", key_case("k" * 4096)),
    Case("key-10kB-utf8-in-4096-chars", key_case("€" * 3413)),
    Case("key-4096-slashes", key_case("/" * 4096)),
    Case("key-4097-refused", refused_key_case("k" * 4097, "4097 characters", "4096", "digest")),
    Case("key-10k-refused", refused_key_case("k" * 10_240, "10240 characters", "digest")),
    Case("key-lone-surrogate-refused", refused_key_case("bad\ud800key", "surrogate", "decode")),
    Case("key-nul-refused", refused_key_case("a\x00b", "NUL", "remove it")),
    Case("key-empty-refused", refused_key_case("", "empty", "non-empty key")),
    Case("key-bool-refused", refused_key_case(True, "bool", "strings or integers")),
    Case("key-float-refused", refused_key_case(1.5, "float", "strings or integers")),
    Case("key-int-str-collision", case_int_and_str_key_collide),
    # payloads
    Case("source-nan", case_nan_in_source),
    Case("result-infinity", bad_result_case(lambda i: {"x": float("inf")}, "InvalidValueError", "inf", "null")),
    Case("result-nan-nested", bad_result_case(lambda i: {"x": [1, {"y": float("nan")}]}, "InvalidValueError", "NaN")),
    Case("huge-ints", case_huge_ints),
    Case("source-100k-nesting", case_deep_nesting_in_source),
    Case(
        "result-100k-nesting",
        bad_result_case(lambda i: {"deep": _nested(100_000)}, "InvalidValueError", "nested too deeply", "flatten"),
    ),
    Case("nesting-500-works", case_moderate_nesting_works),
    Case("value-50MB-string", case_fifty_mb_string),
    Case("value-50MB-bytes", case_fifty_mb_bytes),
    Case("source-item-50MB", case_fifty_mb_source_item),
    # a misbehaving process
    Case("result-set", bad_result_case(_set, "ProcessError", "returned a set", "return a dict")),
    Case("result-object", bad_result_case(lambda i: object(), "ProcessError", "returned a object", "return a dict")),
    Case("result-list", bad_result_case(lambda i: [1, 2], "ProcessError", "returned a list", "return a dict")),
    Case("result-set-value", bad_result_case(lambda i: {"s": {1}}, "InvalidValueError", "not JSON-serializable")),
    Case("result-object-value", bad_result_case(lambda i: {"o": object()}, "InvalidValueError", "not JSON")),
    Case("result-int-field-name", bad_result_case(lambda i: {1: "x"}, "ProcessError", "field name", "strings")),
    Case("result-empty-field-name", bad_result_case(lambda i: {"": 1}, "ProcessError", "field name")),
    Case("result-nul-field-name", bad_result_case(lambda i: {"a\x00b": 1}, "ProcessError", "without NUL")),
    Case("result-list-on-every-item", broken_on_every_item_case(lambda i: [1, 2], "returned a list")),
    Case("result-object-value-on-every-item", broken_on_every_item_case(lambda i: {"o": object()}, "not JSON")),
    Case("keyboard-interrupt-per-item-acks", interrupted_case(KeyboardInterrupt, 1)),
    Case("keyboard-interrupt-group-acks", interrupted_case(KeyboardInterrupt, None)),
    Case("system-exit", interrupted_case(lambda: SystemExit(3), 3)),
    Case("hang-ended-by-airflow-task-timeout", case_hang_ended_by_task_timeout),
    # a damaged or foreign log
    Case("schema-v3-metadata", case_newer_schema_metadata),
    Case("schema-v3-rows", case_newer_schema_rows),
    Case("fragment-truncated", damaged_case(truncate_fragment)),
    Case("fragment-zeroed", damaged_case(zero_fragment)),
    Case("fragment-deleted", damaged_case(delete_fragment)),
    Case("manifest-truncated", damaged_case(truncate_manifest)),
    Case("versions-dir-deleted", damaged_case(delete_versions)),
    Case("fragments-deleted-after-maintain", case_fragment_deleted_after_maintain),
    Case("enospc", case_enospc),
]


class _Tally:
    """Counts the outcomes of this table's cases and prints them in the terminal summary."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.tried = 0
        self.passed = 0

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not report.nodeid.startswith(self.prefix):
            return
        if report.when == "call" or (report.when == "setup" and not report.passed):
            self.tried += 1
            self.passed += report.passed

    def line(self) -> str:
        return f"hostile input: {self.tried} cases tried, {self.passed} passed (of {len(CASES)} in the table)"

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        # An xdist worker's terminal summary is never shown: hand the line to the controller (tests/conftest.py).
        workeroutput = getattr(session.config, "workeroutput", None)
        if workeroutput is not None:
            workeroutput.setdefault("summary_lines", []).append(self.line())

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        terminalreporter.write_line(self.line())


@pytest.fixture(scope="module", autouse=True)
def _tally(request: pytest.FixtureRequest) -> None:
    name = "datagen-hostile-input-tally"
    if request.config.pluginmanager.get_plugin(name) is None:
        request.config.pluginmanager.register(_Tally(f"{request.node.nodeid}::test_hostile_input["), name)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input(case: Case, env: Env) -> None:
    case.run(env)
