"""Seed 001's Properties table, row by row, on real Lance logs (Hypothesis where the seed says "arbitrary").

The process under test is deterministic (``process_is_deterministic``), so every property compares a
history against the uninterrupted run: crashes (simulated in-process by :func:`crash_at_commit`, which
makes every commit from the k-th on die before writing), edits, failures, version bumps, partitions and
merge orders must all end in the same export fingerprint. The SIGKILL version of crash-resume lives in
``tests/core/runner/test_crash_resume.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections import Counter
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_datagen.core import (
    Loop,
    Sequence,
    Step,
    canonical_json,
    export_results,
    fold_table,
    merge_results,
    plan_resume,
    results_fingerprint,
    run_items,
)
from airflow_provider_datagen.core.export import collect_results
from airflow_provider_datagen.exceptions import ExperimentNotFoundError, InvalidValueError
from tests._support.engine import (
    Crash,
    Recorder,
    build_pipeline,
    copy_log,
    crash_at_commit,
    dedupe_receiver,
    export_rows,
    flat_output,
    flat_process,
    light_events,
    make_items,
    open_log,
    raw_events,
    results_fp,
    statuses,
    write_events,
)
from tests._support.profiles import examples

SETTINGS = settings(
    max_examples=examples(8),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,
)
EVERY = st.sampled_from([1, 2, 3, None])


@pytest.fixture(scope="module")
def baselines(tmp_path_factory: Any) -> dict[tuple[str, int], tuple[dict[str, str], int, Counter[str]]]:
    """Uninterrupted runs: (kind, n) -> (results, commits at checkpoint_every=1, calls per item)."""
    root = tmp_path_factory.mktemp("baselines")
    out = {}
    for kind in ("flat", "steps"):
        for n in range(0, 7):
            log = open_log(root, f"{kind}{n}")
            rec = Recorder()
            report = run_items(log, make_items(n), build_pipeline(kind, rec), checkpoint_every=1)
            out[(kind, n)] = (collect_results(log), report.commits, rec.by_item)
    return out


def fresh_root(tmp_path: Any) -> str:
    return tempfile.mkdtemp(dir=tmp_path)


def crash_run(log: Any, items: list[dict[str, Any]], process: Any, k: int, **kw: Any) -> bool:
    """Run with a crash before commit ``k``; True if the crash happened."""
    with crash_at_commit(k):
        try:
            run_items(log, items, process, epoch=log.next_epoch(), **kw)
        except Crash:
            return True
    return False


def assert_done_implies_output(log: Any, expected: dict[str, str]) -> None:
    """done_iff_output_durable: every item the log reports done has its complete output readable."""
    for iid, text in collect_results(log).items():
        assert text == expected[iid], f"item {iid} is done but its output differs from the real one"
    for iid, status in statuses(log).items():
        if status == "completed" and "/" not in iid:
            assert iid in collect_results(log)


# --- done_marker_implies_output_readable and crash_resume_equivalent (in-process schedules) -------------


@SETTINGS
@given(
    kind=st.sampled_from(["flat", "steps"]),
    n=st.integers(1, 6),
    every=EVERY,
    schedule=st.lists(st.floats(0, 1, exclude_max=True), min_size=1, max_size=3),
)
def test_done_marker_implies_output_readable_and_crash_resume_equivalent(
    tmp_path: Any, baselines: Any, kind: str, n: int, every: int | None, schedule: list[float]
) -> None:
    expected, commits, calls = baselines[(kind, n)]
    log = open_log(fresh_root(tmp_path), "crashy")
    items = make_items(n)
    invoked: Counter[str] = Counter()
    for frac in schedule:
        rec = Recorder()
        crashed = crash_run(
            log, items, build_pipeline(kind, rec), int(frac * commits), checkpoint_every=every, reraise=(Crash,)
        )
        invoked += rec.by_item
        assert_done_implies_output(log, expected)
        if not crashed:
            break
    done_before = {iid for iid, s in statuses(log).items() if s == "completed" and "/" not in iid}
    rec = Recorder()
    run_items(log, items, build_pipeline(kind, rec), checkpoint_every=every, epoch=log.next_epoch())
    assert not done_before & {iid.split("/")[0] for iid in rec.by_item}  # acked items are never invoked again
    assert_done_implies_output(log, expected)
    assert collect_results(log) == expected
    assert results_fp(log) == results_fingerprint(expected)
    for iid in rec.by_item:  # at most the unacked work is redone
        assert rec.by_item[iid] <= calls[iid]
    assert log.summary()["fencing_violations"] == 0


# --- resumed_run_invocation_count -----------------------------------------------------------------------


@SETTINGS
@given(data=st.data(), n=st.integers(1, 8))
def test_resumed_run_invocation_count_is_n_minus_k(tmp_path: Any, data: Any, n: int) -> None:
    states = data.draw(
        st.lists(st.sampled_from(["done", "edited", "never", "failed", "inbox"]), min_size=n, max_size=n)
    )
    items = make_items(n)
    log = open_log(fresh_root(tmp_path), "count")
    by = {s: [items[i] for i in range(n) if states[i] == s] for s in set(states)}
    if by.get("done") or by.get("edited"):
        run_items(log, [*by.get("done", []), *by.get("edited", [])], flat_process())
    if by.get("failed"):
        run_items(log, by["failed"], lambda item, ctx: 1 / 0, epoch=2)
    if by.get("inbox"):
        assert crash_run(log, by["inbox"], flat_process(), 1)  # the pull lands, the acks do not
    source = [dict(it, text="changed") if states[i] == "edited" else it for i, it in enumerate(items)]
    k = states.count("done")
    rec = Recorder()
    report = run_items(log, source, flat_process(rec), epoch=log.next_epoch())
    assert report.invocations == n - k
    assert rec.by_item == Counter({str(i): 1 for i in range(n) if states[i] != "done"})
    assert sorted(report.skipped, key=int) == [str(i) for i in range(n) if states[i] == "done"]


# --- edited_item_reprocessed ----------------------------------------------------------------------------


@SETTINGS
@given(data=st.data(), n=st.integers(1, 8))
def test_edited_item_reprocessed(tmp_path: Any, data: Any, n: int) -> None:
    items = make_items(n)
    edited = set(data.draw(st.lists(st.integers(0, n - 1), unique=True)))
    log = open_log(fresh_root(tmp_path), "edit")
    run_items(log, items, flat_process())
    source = [dict(it, text=f"v2-{it['text']}") if it["id"] in edited else it for it in items]
    plan = plan_resume(log, source)
    assert sorted(plan.invalidated, key=int) == sorted(map(str, edited), key=int)
    rec = Recorder()
    run_items(log, source, flat_process(rec), epoch=2)
    assert rec.by_item == Counter({str(i): 1 for i in edited})
    expected = {str(it["id"]): canonical_json(flat_output(it)) for it in source}
    assert collect_results(log) == expected
    # A renamed key with equal content is a new item; the old key keeps its own record.
    renamed = [dict(items[0], id="renamed")]
    assert plan_resume(log, renamed).fresh == ["renamed"]


# --- failed_item_reprocessed ----------------------------------------------------------------------------


@SETTINGS
@given(data=st.data(), n=st.integers(1, 8), every=EVERY)
def test_failed_item_reprocessed_exactly_once(tmp_path: Any, data: Any, n: int, every: int | None) -> None:
    failing = set(data.draw(st.lists(st.integers(0, n - 1), unique=True, min_size=1)))
    log = open_log(fresh_root(tmp_path), "fail")

    def first(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        if item["id"] in failing:
            raise RuntimeError("first attempt fails")
        return flat_output(item)

    # every failing item raises the same error: no stop for repeated failures, each must fail on its own
    report = run_items(log, make_items(n), first, checkpoint_every=every, max_repeated_failures=None)
    assert sorted(report.failed, key=int) == sorted(map(str, failing), key=int)
    assert all(log.failures(str(i)) for i in failing)
    rec = Recorder()
    again = run_items(log, make_items(n), flat_process(rec), checkpoint_every=every, epoch=2)
    assert rec.by_item == Counter({str(i): 1 for i in failing})
    assert sorted(again.replayed, key=int) == sorted(map(str, failing), key=int)
    assert collect_results(log) == {str(it["id"]): canonical_json(flat_output(it)) for it in make_items(n)}


# --- outputs_contain_no_manifest_rows -------------------------------------------------------------------


@SETTINGS
@given(data=st.data(), n=st.integers(0, 8), kind=st.sampled_from(["flat", "steps"]))
def test_outputs_contain_no_manifest_rows(tmp_path: Any, data: Any, n: int, kind: str) -> None:
    filtered = set(data.draw(st.lists(st.integers(0, max(n - 1, 0)), unique=True)))
    failing = set(data.draw(st.lists(st.integers(0, max(n - 1, 0)), unique=True))) - filtered
    inner = build_pipeline(kind)

    def gate(item: dict[str, Any], ctx: Any) -> None:
        if item["id"] in failing:
            raise RuntimeError("no")
        if item["id"] in filtered:
            ctx.filter("dropped")

    pipe = Sequence("outer", [Step("admit", gate), inner if kind == "steps" else Step("process", inner)])
    root = fresh_root(tmp_path)
    log = open_log(root, "sidecar")
    run_items(log, make_items(n), pipe, max_repeated_failures=None)  # the same error may fail 5 in a row
    version = log.version
    dest = os.path.join(root, "exports", "out.lance")
    if n == 0:  # nothing ran, so there is no log: no export of an experiment that does not exist
        with pytest.raises(ExperimentNotFoundError, match=r"'engine'/'sidecar' does not exist"):
            export_results(log, dest)
        assert not os.path.exists(dest)
        return
    result = export_results(log, dest)
    assert log.version == version  # exporting never writes the log
    assert not os.path.abspath(dest).startswith(os.path.abspath(log.uri))
    rows = export_rows(dest)
    done = sorted(str(i) for i in range(n) if i not in filtered and i not in failing)
    assert result["rows"] == len(rows) == len(done)
    assert [r["item_id"] for r in rows] == done  # no filtered, failed or child item, no log row
    field_names = {name for text in collect_results(log).values() for name in json.loads(text)}
    assert all(set(r) == {"item_id", "key"} | field_names for r in rows)  # one column per field, nothing else
    log_ids = set(raw_events(log, ["event_id"])["event_id"].to_pylist())
    blob = "\n".join(canonical_json(r) for r in rows)
    assert not any(eid in blob for eid in log_ids)
    for word in ("ITEM_CREATED", "STEP_COMPLETED", "TERMINAL", "writer_epoch", "input_fingerprint"):
        assert word not in blob


# --- version_mismatch_invalidates_partial ---------------------------------------------------------------


def versioned(version: str, calls: list[tuple[str, str, str]]) -> Sequence:
    def a(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        calls.append((ctx.item_id, "a", version))
        out: dict[str, Any] = {"a": f"{version}-{item['text']}"}
        if version == "v1":
            out["stale"] = "only v1 writes this"
        return out

    def b(item: dict[str, Any], ctx: Any) -> None:
        calls.append((ctx.item_id, "b", version))
        ctx.append("log", f"{version}:{ctx.iteration}")

    def c(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        calls.append((ctx.item_id, "c", version))
        return {"c": len(ctx.fields["log"])}

    return Sequence("s", [Step("a", a), Loop("lp", Step("b", b), times=3), Step("c", c)])


@SETTINGS
@given(n=st.integers(1, 4), frac=st.floats(0, 1, exclude_max=True), every=EVERY)
def test_version_mismatch_invalidates_partial(tmp_path: Any, n: int, frac: float, every: int | None) -> None:
    items = make_items(n)
    root = fresh_root(tmp_path)
    calls: list[tuple[str, str, str]] = []
    base = open_log(root, "base")
    run_items(base, items, versioned("v2", calls), processor_version="v2")
    full = Counter(calls)
    log = open_log(root, "bump")
    total = run_and_count_commits(open_log(root, "count"), items, versioned("v1", []), every)
    calls.clear()
    crash_run(
        log,
        items,
        versioned("v1", calls),
        int(frac * total),
        checkpoint_every=every,
        processor_version="v1",
        reraise=(Crash,),
    )
    st1 = statuses(log)
    partial = {iid for iid, s in st1.items() if s == "running"}
    done_v1 = {iid for iid, s in st1.items() if s == "completed"}
    calls.clear()
    run_items(log, items, versioned("v2", calls), processor_version="v2", epoch=log.next_epoch())
    for iid in partial | (set(map(str, range(n))) - done_v1):
        mine = [c for c in calls if c[0] == iid]
        assert mine[0][1] == "a"  # from 0, never from the stale offset
        assert Counter(mine) == Counter({c: k for c, k in full.items() if c[0] == iid})
        state = log.item_state(iid)
        assert "stale" not in state.fields and state.fields["a"].startswith("v2-")
        assert state.fields["log"] == ["v2:0", "v2:1", "v2:2"]
        assert {c.processor_version for c in state.completed_steps} == {"v2"}
    assert not [c for c in calls if c[0] in done_v1]  # completed items are done, whatever the version


def run_and_count_commits(log: Any, items: list[dict[str, Any]], pipe: Any, every: int | None) -> int:
    return run_items(log, items, pipe, checkpoint_every=every, processor_version="v1").commits


# --- resume_composition ---------------------------------------------------------------------------------


@SETTINGS
@given(
    n=st.integers(1, 6),
    data=st.data(),
    every=EVERY,
    kind=st.sampled_from(["flat", "steps"]),
)
def test_resume_composition_associativity_and_identity(
    tmp_path: Any, baselines: Any, n: int, data: Any, every: int | None, kind: str
) -> None:
    items = make_items(n)
    expected, commits, _ = baselines[(kind, n)]
    root = fresh_root(tmp_path)
    # m: an arbitrary manifest, the leftovers of a crashed run over an arbitrary subset.
    subset = data.draw(st.lists(st.sampled_from(items), unique_by=lambda it: it["id"]))
    m = open_log(root, "m")
    if subset:
        crash_run(m, subset, build_pipeline(kind), data.draw(st.integers(0, commits)), checkpoint_every=every)
    perm = data.draw(st.permutations(items))
    cut = data.draw(st.integers(0, n))
    a, b = perm[:cut], perm[cut:]
    # resume(resume(m, a), b)
    left = copy_log(m, "left")
    for part in (a, b):
        run_items(left, part, build_pipeline(kind), checkpoint_every=every, epoch=left.next_epoch())
    # resume(m, a ++ b)
    right = copy_log(m, "right")
    run_items(right, a + b, build_pipeline(kind), checkpoint_every=every, epoch=right.next_epoch())
    assert collect_results(left) == collect_results(right) == expected
    assert statuses(left) == statuses(right)
    # identity: resume(empty manifest, items) == process_all(items)
    empty = open_log(root, "empty")
    run_items(empty, perm, build_pipeline(kind), checkpoint_every=every)
    assert collect_results(empty) == expected
    if kind == "flat":
        assert expected == {str(it["id"]): canonical_json(flat_output(it)) for it in items}


# --- results_merge_monoid / results_merge_commutative ---------------------------------------------------

universe = st.dictionaries(
    st.text("abc/%:0123", min_size=1, max_size=4),
    st.recursive(st.none() | st.integers() | st.text(max_size=5), lambda c: st.lists(c, max_size=3), max_leaves=4),
    max_size=12,
)


def parts_of(data: Any, whole: dict[str, Any]) -> list[dict[str, str]]:
    texts = {k: canonical_json(v) for k, v in whole.items()}
    return [
        {k: texts[k] for k in data.draw(st.lists(st.sampled_from(sorted(texts)), unique=True))} if texts else {}
        for _ in range(3)
    ]


@settings(max_examples=examples(100), deadline=None, derandomize=True)
@given(whole=universe, data=st.data())
def test_results_merge_monoid(whole: dict[str, Any], data: Any) -> None:
    a, b, c = parts_of(data, whole)
    assert merge_results(merge_results(a, b), c) == merge_results(a, merge_results(b, c))
    assert merge_results({}, a) == a == merge_results(a, {})
    assert merge_results() == {}
    assert results_fingerprint(merge_results(merge_results(a, b), c)) == results_fingerprint(merge_results(a, b, c))


@settings(max_examples=examples(100), deadline=None, derandomize=True)
@given(whole=universe, data=st.data())
def test_results_merge_commutative(whole: dict[str, Any], data: Any) -> None:
    a, b, _ = parts_of(data, whole)
    assert merge_results(a, b) == merge_results(b, a)
    assert results_fingerprint(merge_results(a, b)) == results_fingerprint(merge_results(b, a))
    assert merge_results(a, a) == a  # idempotent too: a semilattice, so double delivery is harmless


def test_merging_different_results_for_one_item_is_refused() -> None:
    with pytest.raises(InvalidValueError, match="item 'x' has different results"):
        merge_results({"x": "1"}, {"x": "2"})


@SETTINGS
@given(n=st.integers(1, 6), data=st.data())
def test_partial_results_of_real_runs_merge_to_the_whole(tmp_path: Any, baselines: Any, n: int, data: Any) -> None:
    items = make_items(n)
    root = fresh_root(tmp_path)
    chunks = [data.draw(st.lists(st.sampled_from(items), unique_by=lambda it: it["id"])) for _ in range(3)]
    covered = {it["id"] for ch in chunks for it in ch}
    chunks.append([it for it in items if it["id"] not in covered])
    parts = []
    for i, ch in enumerate(chunks):
        lg = open_log(root, f"part{i}")
        run_items(lg, ch, flat_process())
        parts.append(collect_results(lg))
    order = data.draw(st.permutations(range(len(parts))))
    merged = merge_results(*(parts[i] for i in order))
    assert merged == baselines[("flat", n)][0]


# --- manifest_merge_semilattice -------------------------------------------------------------------------


def canon_state(table: pa.Table) -> list[dict[str, Any]]:
    return fold_table(table).sort_by("item_id").to_pylist()


@settings(max_examples=examples(8), deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(data=st.data(), every=EVERY)
def test_manifest_merge_semilattice(tmp_path: Any, baselines: Any, data: Any, every: int | None) -> None:
    n = 5
    items = make_items(n)
    _, commits, _ = baselines[("steps", n)]
    root = fresh_root(tmp_path)
    manifests = []
    for w in range(3):
        lg = open_log(root, f"worker{w}")
        subset = data.draw(st.lists(st.sampled_from(items), unique_by=lambda it: it["id"], min_size=1))
        k = data.draw(st.integers(0, commits + 1))
        with crash_at_commit(k), contextlib.suppress(Crash):
            run_items(lg, subset, build_pipeline("steps"), writer_id=f"w{w}", epoch=w + 1, checkpoint_every=every)
        manifests.append(light_events(lg))
    m, nn, o = manifests
    empty = m.slice(0, 0)

    def union(*ts: pa.Table) -> pa.Table:
        return pa.concat_tables(ts)

    assert canon_state(union(union(m, nn), o)) == canon_state(union(m, union(nn, o)))
    assert canon_state(union(empty, m)) == canon_state(m)
    assert canon_state(union(m, m)) == canon_state(m)
    assert canon_state(union(m, nn)) == canon_state(union(nn, m))
    # The folded fields agree too: write the unions as logs and compare their results. (Workers that
    # overlap on an item at different epochs are fenced: the lower epoch's later rows count as stale,
    # whatever the merge order, so the fold stays a function of the set of events.)
    full = [raw_events(open_log(root, f"worker{w}")) for w in range(3)]
    a = write_events(pa.concat_tables([full[0], full[1], full[2]]), root, "merged_a")
    b = write_events(pa.concat_tables([full[2], full[0], full[1], full[0]]), root, "merged_b")
    assert collect_results(a) == collect_results(b)
    assert a.summary() | {"log_version": 0} == b.summary() | {"log_version": 0, "experiment": "merged_a"}
    # Resuming the merged manifest finishes the job as if nobody had crashed.
    run_items(a, items, build_pipeline("steps"), epoch=a.next_epoch())
    assert collect_results(a) == baselines[("steps", n)][0]


@pytest.mark.parametrize("kind", ["flat", "steps"])
def test_any_checkpoint_frequency_writes_the_same_manifest(tmp_path: Any, kind: str) -> None:
    ids = []
    for every in (1, 2, 5, None):
        lg = open_log(tmp_path, f"{kind}{every}")
        run_items(lg, make_items(6), build_pipeline(kind), checkpoint_every=every, writer_id=f"w{every}")
        ids.append(sorted(raw_events(lg, ["event_id"])["event_id"].to_pylist()))
    assert ids[0] == ids[1] == ids[2] == ids[3]


# --- map_chunks_uncoordinated ---------------------------------------------------------------------------


@SETTINGS
@given(n=st.integers(1, 6), data=st.data(), kind=st.sampled_from(["flat", "steps"]), every=EVERY)
def test_map_chunks_uncoordinated(
    tmp_path: Any, baselines: Any, n: int, data: Any, kind: str, every: int | None
) -> None:
    items = make_items(n)
    owner = data.draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    order = data.draw(st.permutations(range(3)))
    root = fresh_root(tmp_path)
    shared = open_log(root, "shared")
    separate = []
    for w in order:
        chunk = [it for it, o in zip(items, owner) if o == w]
        run_items(shared, chunk, build_pipeline(kind), writer_id=f"worker-{w}", epoch=w + 1, checkpoint_every=every)
        own = open_log(root, f"own{w}")
        run_items(own, chunk, build_pipeline(kind), writer_id=f"worker-{w}", checkpoint_every=every)
        separate.append(collect_results(own))
    expected = baselines[(kind, n)][0]
    assert collect_results(shared) == expected
    assert merge_results(*separate) == expected
    assert results_fingerprint(merge_results(*reversed(separate))) == results_fingerprint(expected)


def test_map_chunks_uncoordinated_with_concurrent_writers(tmp_path: Any, baselines: Any) -> None:
    import threading

    items = make_items(6)
    errors: list[BaseException] = []

    def worker(w: int) -> None:
        try:
            lg = open_log(tmp_path, "concurrent")
            run_items(lg, items[w::3], build_pipeline("steps"), writer_id=f"t{w}", epoch=w + 1, checkpoint_every=1)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    lg = open_log(tmp_path, "concurrent")
    assert collect_results(lg) == baselines[("steps", 6)][0]
    assert lg.summary()["fencing_violations"] == 0


# --- deterministic_replay -------------------------------------------------------------------------------


@SETTINGS
@given(n=st.integers(1, 6), data=st.data(), kind=st.sampled_from(["flat", "steps"]), e1=EVERY, e2=EVERY)
def test_deterministic_replay(tmp_path: Any, n: int, data: Any, kind: str, e1: int | None, e2: int | None) -> None:
    items = make_items(n)
    root = fresh_root(tmp_path)
    runs = []
    for i, (order, every) in enumerate(
        [(data.draw(st.permutations(items)), e1), (data.draw(st.permutations(items)), e2)]
    ):
        lg = open_log(root, f"replay{i}")
        run_items(lg, order, build_pipeline(kind), checkpoint_every=every, writer_id=f"w{i}")
        dest = os.path.join(root, f"export{i}.lance")
        runs.append((lg, export_results(lg, dest), export_rows(dest)))
    (la, ea, ra), (lb, eb, rb) = runs
    assert ea == eb and ra == rb
    for it in items:
        iid = str(it["id"])
        assert canonical_json(la.item_state(iid).fields) == canonical_json(lb.item_state(iid).fields)
    # Every event is the same event: only writer, epoch and time differ between the two logs.
    assert sorted(light_events(la)["event_id"].to_pylist()) == sorted(light_events(lb)["event_id"].to_pylist())


# --- replay_dedupes_emissions ---------------------------------------------------------------------------


@SETTINGS
@given(
    n=st.integers(1, 6), frac=st.floats(0, 1, exclude_max=True), every=EVERY, kind=st.sampled_from(["flat", "steps"])
)
def test_replay_dedupes_emissions(
    tmp_path: Any, baselines: Any, n: int, frac: float, every: int | None, kind: str
) -> None:
    items = make_items(n)
    root = fresh_root(tmp_path)
    clean: list[tuple[str, str]] = []
    run_items(open_log(root, "clean"), items, build_pipeline(kind, emit=lambda k, p: clean.append((k, p))))
    emitted: list[tuple[str, str]] = []
    log = open_log(root, "crashy")
    _, commits, _ = baselines[(kind, n)]
    crashed = crash_run(
        log,
        items,
        build_pipeline(kind, emit=lambda k, p: emitted.append((k, p))),
        int(frac * commits),
        checkpoint_every=every,
    )
    run_items(log, items, build_pipeline(kind, emit=lambda k, p: emitted.append((k, p))), epoch=log.next_epoch())
    assert dedupe_receiver(emitted) == dedupe_receiver(clean)
    assert len(dedupe_receiver(clean)) == len(clean)  # distinct work, distinct keys
    if not crashed:
        assert emitted == clean
    assert results_fp(log) == results_fingerprint(collect_results(open_log(root, "clean")))
