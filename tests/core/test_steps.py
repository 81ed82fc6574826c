"""Step kinds on a real Lance log: which rows each kind writes, and resuming inside each kind.

Drivers (Sequence, Loop) write STEP_STARTED/STEP_COMPLETED frames; fan-outs (MapReduce, Branch,
SubPipeline) create child items ``parent/step:idx`` and write only their reduce STEP_COMPLETED on the
parent; selectors (Conditional, Router) write no row, their chosen child carries ``selector_step``. A
crash inside any kind resumes at the open frame, and frames already completed are never run again.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from airflow_provider_datagen.core import (
    Branch,
    Conditional,
    ItemStatus,
    Loop,
    MapReduce,
    Router,
    Sequence,
    Step,
    SubPipeline,
    run_items,
)
from airflow_provider_datagen.core.steps import validate_pipeline
from airflow_provider_datagen.exceptions import InvalidPipelineError
from tests._support.engine import Crash, open_log, raw_events, results_fp, statuses

ROW = ("event_type", "step", "step_kind", "enclosing_step", "iteration", "fanout_index", "selector_step")


def rows(log: Any, item_id: str) -> list[tuple[Any, ...]]:
    return [tuple(getattr(e, c) if c == "event_type" else _coord(e, c) for c in ROW) for e in log.events(item_id)]


def _coord(e: Any, c: str) -> Any:
    return getattr(e.coord, c)


def kinds(log: Any, item_id: str) -> list[str]:
    return [e.event_type.value for e in log.events(item_id)]


class Leaves:
    """Deterministic leaves that record each finished call and can crash once at a chosen call."""

    def __init__(self, victim: Any = None) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.victim = victim  # (step, item_id or None, iteration or None)
        self.crashed = False

    def step(self, name: str) -> Step:
        def fn(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
            if self.victim is not None and not self.crashed:
                step, iid, it = self.victim
                if step == name and (iid is None or iid == ctx.item_id) and (it is None or it == ctx.iteration):
                    self.crashed = True
                    raise Crash(f"crash in {name}")
            self.calls.append((name, ctx.item_id, ctx.iteration))
            return {name: f"{ctx.iteration}|{sorted(ctx.fields)}|{item.get('v', item.get('id'))}"}

        return Step(name, fn)


# --- rows of each kind ----------------------------------------------------------------------------------


def test_sequence_writes_one_frame_around_its_steps(tmp_path: Any) -> None:
    log = open_log(tmp_path, "seq")
    lv = Leaves()
    run_items(log, [{"id": 1}], Sequence("s", [lv.step("a"), lv.step("b")]))
    assert rows(log, "1") == [
        ("ITEM_CREATED", None, None, None, None, None, None),
        ("STEP_STARTED", "s", "Sequence", None, None, None, None),
        ("FIELD_SET", "a", None, None, None, None, None),
        ("STEP_COMPLETED", "a", "Step", "s", None, None, None),
        ("FIELD_SET", "b", None, None, None, None, None),
        ("STEP_COMPLETED", "b", "Step", "s", None, None, None),
        ("STEP_COMPLETED", "s", "Sequence", None, None, None, None),
        ("TERMINAL", None, None, None, None, None, None),
    ]


def test_loop_writes_a_frame_per_iteration_with_its_index(tmp_path: Any) -> None:
    log = open_log(tmp_path, "loop")
    lv = Leaves()
    run_items(log, [{"id": 1}], Loop("lp", lv.step("body"), times=3))
    frames = [r for r in rows(log, "1") if r[0] in ("STEP_STARTED", "STEP_COMPLETED")]
    expected = []
    for i in range(3):
        expected += [
            ("STEP_STARTED", "lp", "Loop", None, i, None, None),
            ("STEP_COMPLETED", "body", "Step", f"lp#{i}", i, None, None),
            ("STEP_COMPLETED", "lp", "Loop", None, i, None, None),
        ]
    assert frames == expected
    assert [c[2] for c in lv.calls] == [0, 1, 2]


def test_map_reduce_creates_children_and_writes_only_its_reduce_on_the_parent(tmp_path: Any) -> None:
    log = open_log(tmp_path, "mr")
    calls: list[str] = []

    def square(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        calls.append(ctx.item_id)
        return {"sq": item["v"] ** 2}

    pipe = MapReduce(
        "mr",
        over=lambda item, ctx: [{"v": v} for v in range(item["n"])],
        map=Step("square", square),
        reduce=lambda children, ctx: {"total": sum(c["sq"] for c in children)},
    )
    report = run_items(log, [{"id": 7, "n": 3}], pipe)
    assert calls == ["7/mr:0", "7/mr:1", "7/mr:2"]
    assert report.invocations == 4  # three leaves and the reduce
    assert rows(log, "7") == [
        ("ITEM_CREATED", None, None, None, None, None, None),
        ("FIELD_SET", "mr", None, None, None, None, None),
        ("STEP_COMPLETED", "mr", "MapReduce", None, None, None, None),
        ("TERMINAL", None, None, None, None, None, None),
    ]
    assert log.item_state("7").fields == {"total": 0 + 1 + 4}
    for idx in range(3):
        cid = f"7/mr:{idx}"
        ev = log.events(cid)
        created = ev[0]
        assert created.event_type.value == "ITEM_CREATED"
        assert (created.parent_item_id, created.root_item_id) == ("7", "7")
        assert (created.coord.step, created.coord.step_kind, created.coord.fanout_index) == ("mr", "MapReduce", idx)
        assert kinds(log, cid) == ["ITEM_CREATED", "FIELD_SET", "STEP_COMPLETED", "TERMINAL"]
        assert log.item_state(cid).fields == {"sq": idx * idx}
    assert statuses(log) == {"7": "completed", "7/mr:0": "completed", "7/mr:1": "completed", "7/mr:2": "completed"}


def test_branch_runs_each_branch_on_its_own_child_and_merges_their_fields(tmp_path: Any) -> None:
    log = open_log(tmp_path, "br")
    pipe = Branch(
        "br",
        [
            Step("left", lambda item, ctx: {"left": item["x"] + 1}),
            Sequence(
                "right", [Step("r1", lambda item, ctx: {"r1": item["x"] * 2}), Step("r2", lambda i, c: {"r2": 0})]
            ),
        ],
    )
    run_items(log, [{"id": "k", "x": 5}], pipe)
    assert log.item_state("k").fields == {"left": 6, "r1": 10, "r2": 0}
    assert log.item_state("k/br:0").fields == {"left": 6}
    assert log.item_state("k/br:1").fields == {"r1": 10, "r2": 0}
    assert [r[0] for r in rows(log, "k")] == [
        "ITEM_CREATED",
        "FIELD_SET",
        "FIELD_SET",
        "FIELD_SET",
        "STEP_COMPLETED",
        "TERMINAL",
    ]
    # Each child's rows live on the child: the Sequence frame of branch 1 is enclosed by the fan-out.
    assert ("STEP_STARTED", "right", "Sequence", "br", None, None, None) in rows(log, "k/br:1")


def test_sub_pipeline_runs_a_nested_pipeline_on_one_child(tmp_path: Any) -> None:
    log = open_log(tmp_path, "sub")
    inner = Sequence(
        "inner",
        [
            Step("i1", lambda item, ctx: {"a": item["q"] + "!"}),
            Step("i2", lambda item, ctx: {"b": ctx.fields["a"] * 2}),
        ],
    )
    pipe = SubPipeline(
        "sub", inner, input=lambda item, ctx: {"q": item["text"]}, reduce=lambda ch, ctx: {"answer": ch[0]["b"]}
    )
    run_items(log, [{"id": 1, "text": "hi"}], pipe)
    assert log.item_state("1").fields == {"answer": "hi!hi!"}
    assert log.item_state("1/sub:0").fields == {"a": "hi!", "b": "hi!hi!"}
    assert log.events("1/sub:0")[0].parent_item_id == "1"
    assert [r[1] for r in rows(log, "1") if r[0] == "STEP_COMPLETED"] == ["sub"]


def test_selectors_write_no_row_and_the_chosen_child_carries_selector_step(tmp_path: Any) -> None:
    log = open_log(tmp_path, "sel")
    pipe = Sequence(
        "s",
        [
            Conditional(
                "cond",
                lambda item, ctx: item["id"] % 2 == 0,
                then=Step("even", lambda item, ctx: {"parity": "even"}),
                otherwise=Sequence("odd", [Step("odd1", lambda item, ctx: {"parity": "odd"})]),
            ),
            Router(
                "route",
                lambda item, ctx: item["lang"],
                {
                    "en": Step("english", lambda item, ctx: {"hello": "hi"}),
                    "fr": Step("french", lambda i, c: {"hello": "salut"}),
                },
                default="en",
            ),
        ],
    )
    run_items(log, [{"id": 2, "lang": "fr"}, {"id": 3, "lang": "de"}], pipe)
    ev = raw_events(log, ["item_id", "step", "selector_step", "event_type"]).to_pylist()
    assert not [r for r in ev if r["step"] in ("cond", "route")]  # selectors write no row of their own
    carried = {(r["item_id"], r["event_type"], r["step"], r["selector_step"]) for r in ev if r["selector_step"]}
    assert carried == {
        ("2", "STEP_COMPLETED", "even", "cond"),
        ("2", "STEP_COMPLETED", "french", "route"),
        ("3", "STEP_STARTED", "odd", "cond"),
        ("3", "STEP_COMPLETED", "odd", "cond"),
        ("3", "STEP_COMPLETED", "english", "route"),  # the default route
    }
    assert not [r for r in ev if r["item_id"] == "2" and r["step"] in ("odd", "odd1", "english")]
    assert log.item_state("2").fields == {"parity": "even", "hello": "salut"}
    assert log.item_state("3").fields == {"parity": "odd", "hello": "hi"}


def test_a_fanout_chosen_by_a_selector_marks_its_children_and_reduce(tmp_path: Any) -> None:
    log = open_log(tmp_path, "selfan")
    fan = MapReduce(
        "fan", over=lambda item, ctx: [{"v": 1}, {"v": 2}], map=Step("m", lambda item, ctx: {"v2": item["v"]})
    )
    run_items(log, [{"id": 1}], Conditional("pick", lambda item, ctx: True, then=fan))
    ev = raw_events(log, ["item_id", "event_type", "step", "selector_step"]).to_pylist()
    assert {(r["item_id"], r["event_type"]) for r in ev if r["selector_step"] == "pick"} == {
        ("1", "STEP_COMPLETED"),
        ("1/fan:0", "ITEM_CREATED"),
        ("1/fan:1", "ITEM_CREATED"),
    }


# --- a crash inside each kind resumes at the open frame ---------------------------------------------------


def seq_pipe(lv: Leaves) -> Step:
    return Sequence("s", [lv.step("a"), lv.step("b"), lv.step("c")])


def loop_pipe(lv: Leaves) -> Step:
    return Loop("lp", Sequence("body", [lv.step("a"), lv.step("b")]), times=3)


def until_pipe(lv: Leaves) -> Step:
    inner = lv.step("grow")

    def grow(item: dict[str, Any], ctx: Any) -> None:
        inner.fn(item, ctx)
        ctx.append("trail", ctx.iteration)

    return Loop("lp", Step("grow", grow), until=lambda fields: len(fields.get("trail", [])) >= 4, max_iterations=9)


def mapreduce_pipe(lv: Leaves) -> Step:
    return MapReduce(
        "mr",
        over=lambda item, ctx: [{"v": v} for v in range(4)],
        map=Sequence("m", [lv.step("m1"), lv.step("m2")]),
        reduce=lambda ch, ctx: {"n": len(ch), "all": [c["m2"] for c in ch]},
    )


def branch_pipe(lv: Leaves) -> Step:
    return Branch("br", [lv.step("b0"), Sequence("b1", [lv.step("b1a"), lv.step("b1b")]), lv.step("b2")])


def sub_pipe(lv: Leaves) -> Step:
    return Sequence(
        "s", [lv.step("pre"), SubPipeline("sub", Sequence("inner", [lv.step("i1"), lv.step("i2")])), lv.step("post")]
    )


def conditional_pipe(lv: Leaves) -> Step:
    return Sequence(
        "s",
        [
            lv.step("pre"),
            Conditional(
                "cond",
                lambda item, ctx: "pre" in ctx.fields,
                then=Sequence("yes", [lv.step("y1"), lv.step("y2")]),
                otherwise=lv.step("no"),
            ),
            lv.step("post"),
        ],
    )


def router_pipe(lv: Leaves) -> Step:
    return Sequence(
        "s",
        [
            lv.step("pre"),
            Router(
                "rt",
                lambda item, ctx: "x" if "pre" in ctx.fields else "y",
                {"x": Sequence("rx", [lv.step("x1"), lv.step("x2")]), "y": lv.step("y")},
            ),
            lv.step("post"),
        ],
    )


def nested_pipe(lv: Leaves) -> Step:
    return Loop(
        "outer",
        MapReduce(
            "mr",
            over=lambda item, ctx: [{"v": v} for v in range(2)],
            map=Conditional(
                "c",
                lambda item, ctx: item["v"] == 0,
                then=Sequence("t", [lv.step("t1"), lv.step("t2")]),
                otherwise=lv.step("o"),
            ),
            reduce=lambda ch, ctx: {"seen": [sorted(c) for c in ch]},
        ),
        times=2,
    )


CRASHES = [
    ("sequence", seq_pipe, ("b", None, None)),
    ("loop", loop_pipe, ("b", None, 1)),
    ("loop-until", until_pipe, ("grow", None, 2)),
    ("map-reduce", mapreduce_pipe, ("m2", "1/mr:2", None)),
    ("branch", branch_pipe, ("b1b", None, None)),
    ("sub-pipeline", sub_pipe, ("i2", None, None)),
    ("conditional", conditional_pipe, ("y2", None, None)),
    ("router", router_pipe, ("x2", None, None)),
    ("nested", nested_pipe, ("t2", "1/mr:0", None)),
]


@pytest.mark.parametrize(("name", "build", "victim"), CRASHES, ids=[c[0] for c in CRASHES])
def test_a_crash_inside_any_kind_resumes_at_the_open_frame(tmp_path: Any, name: str, build: Any, victim: Any) -> None:
    items = [{"id": 1}, {"id": 2}]
    base = Leaves()
    base_log = open_log(tmp_path, "base")
    run_items(base_log, items, build(base))

    log = open_log(tmp_path, "crash")
    lv = Leaves(victim)
    with pytest.raises(Crash):
        run_items(log, items, build(lv), checkpoint_every=1, reraise=(Crash,))
    first = list(lv.calls)
    assert first, "the crash must come after some work"
    lv.calls.clear()
    report = run_items(log, items, build(lv), checkpoint_every=1, epoch=log.next_epoch())
    second = list(lv.calls)
    # Completed frames are never invoked again: each call of the uninterrupted run happens exactly once
    # over the two runs, and the resumed log folds to the same results.
    assert Counter(first + second) == Counter(base.calls)
    if len(set(base.calls)) == len(base.calls):
        assert not set(first) & set(second)
    assert results_fp(log) == results_fp(base_log)
    assert report.replayed[0] == "1" and report.failed == []
    assert statuses(log) == statuses(base_log)
    assert log.summary()["fencing_violations"] == 0


@pytest.mark.parametrize(("name", "build", "victim"), CRASHES, ids=[c[0] for c in CRASHES])
def test_a_crash_then_a_new_processor_version_reruns_everything_of_the_item(
    tmp_path: Any, name: str, build: Any, victim: Any
) -> None:
    items = [{"id": 1}]
    base = Leaves()
    run_items(open_log(tmp_path, "base"), items, build(base))
    log = open_log(tmp_path, "crash")
    lv = Leaves(victim)
    with pytest.raises(Crash):
        run_items(log, items, build(lv), checkpoint_every=1, reraise=(Crash,))
    lv.calls.clear()
    run_items(log, items, build(lv), processor_version="v2", epoch=2)
    assert Counter(lv.calls) == Counter(base.calls)  # demoted: every frame again, none skipped
    assert log.summary()["fencing_violations"] == 0
    assert results_fp(log) == results_fp(open_log(tmp_path, "base"))
    st = log.item_state("1")
    assert {c.processor_version for c in st.completed_steps} == {"v2"}


# --- regressions found while writing this suite ---------------------------------------------------------


def test_a_replayed_conditional_keeps_the_branch_it_took(tmp_path: Any) -> None:
    """The predicate reads a field its own branch writes: re-asking it on replay would flip the branch."""
    log = open_log(tmp_path, "cond")
    state = {"crash": True}

    def last(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        if state["crash"]:
            state["crash"] = False
            raise Crash
        return {"done": True}

    pipe = Sequence(
        "s",
        [
            Conditional(
                "c",
                lambda item, ctx: "flag" not in ctx.fields,
                then=Step("mark", lambda item, ctx: {"flag": True}),
                otherwise=Step("other", lambda item, ctx: {"other": True}),
            ),
            Step("last", last),
        ],
    )
    with pytest.raises(Crash):
        run_items(log, [{"id": 1}], pipe, checkpoint_every=1, reraise=(Crash,))
    run_items(log, [{"id": 1}], pipe, epoch=2)
    assert log.item_state("1").fields == {"flag": True, "done": True}


def test_replayed_steps_see_blob_stored_fields_as_values(tmp_path: Any) -> None:
    """Fields over the blob threshold (and bytes) come back as values on replay, not as references."""
    log = open_log(tmp_path, "blob")
    seen: list[Any] = []
    state = {"crash": True}

    def make(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        return {"big": "x" * 20_000, "raw": b"\x00\x01", "small": 1}

    def use(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        if state["crash"]:
            state["crash"] = False
            raise Crash
        seen.append((type(ctx.fields["big"]), ctx.fields["raw"]))
        return {"n": len(ctx.fields["big"])}

    pipe = Sequence("s", [Step("make", make), Step("use", use)])
    with pytest.raises(Crash):
        run_items(log, [{"id": 1}], pipe, checkpoint_every=1, reraise=(Crash,))
    report = run_items(log, [{"id": 1}], pipe, epoch=2)
    assert report.failed == []
    assert seen == [(str, b"\x00\x01")]
    # A finished child whose fields are blobs feeds the reduce on replay too.
    log2 = open_log(tmp_path, "blobfan")
    state["crash"] = True

    def child(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        if item["v"] == 1 and state["crash"]:
            state["crash"] = False
            raise Crash
        return {"big": str(item["v"]) * 20_000}

    fan = MapReduce("mr", over=lambda item, ctx: [{"v": 0}, {"v": 1}], map=Step("child", child))
    with pytest.raises(Crash):
        run_items(log2, [{"id": 1}], fan, checkpoint_every=1, reraise=(Crash,))
    report = run_items(log2, [{"id": 1}], fan, epoch=2)
    assert report.failed == []
    assert [len(r["big"]) for r in log2.item_state("1").fields["results"].load()] == [20_000, 20_000]


def test_a_fanout_inside_a_loop_starts_a_new_child_generation_each_iteration(tmp_path: Any) -> None:
    log = open_log(tmp_path, "loopfan")
    pipe = Loop(
        "lp",
        MapReduce(
            "mr",
            over=lambda item, ctx: [{"v": v + len(ctx.fields.get("acc", []))} for v in range(2)],
            map=Step("sq", lambda item, ctx: {"sq": item["v"] ** 2}),
            reduce=lambda ch, ctx: {"acc": [*ctx.fields.get("acc", []), sum(c["sq"] for c in ch)]},
        ),
        times=3,
    )
    run_items(log, [{"id": 1}], pipe, checkpoint_every=1)
    assert log.summary()["fencing_violations"] == 0
    assert log.item_state("1").fields == {"acc": [0 + 1, 1 + 4, 4 + 9]}
    assert log.item_state("1/mr:1").fields == {"sq": 9}  # the last generation of the child


def test_a_restarted_root_appends_to_its_children_instead_of_overwriting_them(tmp_path: Any) -> None:
    log = open_log(tmp_path, "demfan")
    lv = Leaves(("m2", "1/mr:2", None))
    with pytest.raises(Crash):
        run_items(log, [{"id": 1}], mapreduce_pipe(lv), checkpoint_every=1, reraise=(Crash,))
    lv.calls.clear()
    # An edited input and then a new processor version: both restart the root over existing children.
    run_items(log, [{"id": 1, "edit": 1}], mapreduce_pipe(lv), epoch=2)
    run_items(log, [{"id": 1, "edit": 2}], mapreduce_pipe(lv), processor_version="v2", epoch=3)
    assert log.summary()["fencing_violations"] == 0
    st = log.item_state("1/mr:3")
    assert st.status is ItemStatus.COMPLETED and st.processor_version == "v2"


# --- filters and failures inside kinds ------------------------------------------------------------------


def test_filter_ends_the_item_after_the_step(tmp_path: Any) -> None:
    log = open_log(tmp_path, "filter")
    calls: list[str] = []

    def a(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        calls.append("a")
        if item["id"] == 1:
            ctx.filter("not wanted")
        return {"a": 1}

    def b(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        calls.append("b")
        return {"b": 1}

    run_items(log, [{"id": 1}, {"id": 2}], Sequence("s", [Step("a", a), Step("b", b)]))
    assert calls == ["a", "a", "b"]
    st = log.item_state("1")
    assert st.status is ItemStatus.FILTERED and st.filter_reason == "not wanted" and st.fields == {"a": 1}


def test_a_filtered_child_does_not_filter_its_parent(tmp_path: Any) -> None:
    log = open_log(tmp_path, "childfilter")

    def m(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        if item["v"] == 1:
            ctx.filter()
        return {"v": item["v"]}

    fan = MapReduce(
        "mr", over=lambda item, ctx: [{"v": 0}, {"v": 1}], map=Step("m", m), reduce=lambda ch, ctx: {"n": len(ch)}
    )
    run_items(log, [{"id": 1}], fan)
    assert statuses(log) == {"1": "completed", "1/mr:0": "completed", "1/mr:1": "filtered"}


def test_a_failing_child_fails_its_root_and_only_that_child_is_retried(tmp_path: Any) -> None:
    log = open_log(tmp_path, "childfail")
    calls: list[tuple[str, int]] = []

    def m(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        calls.append((ctx.item_id, ctx.attempt))
        if item["v"] == 2 and ctx.attempt == 1:
            raise RuntimeError("child two broke")
        return {"v": item["v"]}

    fan = MapReduce(
        "mr",
        over=lambda item, ctx: [{"v": v} for v in range(4)],
        map=Step("m", m),
        reduce=lambda ch, ctx: {"n": len(ch)},
    )
    report = run_items(log, [{"id": 1}], fan, checkpoint_every=1)
    assert report.failed == ["1"]
    child_failure = log.failures("1/mr:2")[0]
    assert (child_failure.error_type, child_failure.step) == ("RuntimeError", "m")
    assert log.failures("1")[0].message == "child two broke"
    assert statuses(log)["1"] == "running"
    calls.clear()
    run_items(log, [{"id": 1}], fan, epoch=2)
    assert calls == [("1/mr:2", 2), ("1/mr:3", 1)]
    assert log.item_state("1").fields == {"n": 4}


# --- the step graph -------------------------------------------------------------------------------------


def test_pipeline_validation(tmp_path: Any) -> None:
    def f(item: dict[str, Any], ctx: Any) -> None:
        return None

    with pytest.raises(InvalidPipelineError, match="exactly one of times= or until="):
        Loop("lp", f)
    with pytest.raises(InvalidPipelineError, match="non-empty list"):
        Sequence("s", [])
    with pytest.raises(InvalidPipelineError, match="default route"):
        Router("r", f, {"a": f}, default="b")
    with pytest.raises(InvalidPipelineError, match="duplicate step name 'm'"):
        validate_pipeline(MapReduce("mr", over=f, map=Sequence("m", [Step("m", f)])))
    # Bare callables get derived unique names.
    pipe = validate_pipeline(Sequence("s", [f, f]))
    assert [s.name for s in pipe.steps] == ["s_0", "s_1"]
