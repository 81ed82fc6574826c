"""Shared pieces of the resume-engine suites: deterministic pipelines, crash injection, log readers.

The crash worker (``workers/crash.py``) imports the pipelines from here, so a subprocess killed with
SIGKILL and the in-process baseline run exactly the same code. Everything is deterministic: a step's
output is a pure function of the item and its folded fields (seed 001 ``process_is_deterministic``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import threading
from collections import Counter
from typing import TYPE_CHECKING, Any

import lance
import pyarrow as pa

from airflow_provider_datagen.core import (
    CheckpointLog,
    Conditional,
    Loop,
    MapReduce,
    Sequence,
    Step,
    canonical_json,
    results_fingerprint,
)
from airflow_provider_datagen.core.export import collect_results
from airflow_provider_datagen.core.schema import EVENT_SCHEMA, LIGHT_COLUMNS
from airflow_provider_datagen.core.store.writer import LogWriter

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

PIPELINE = "engine"


class Crash(BaseException):
    """Stands for the process dying: not an Exception, so no handler mistakes it for an item error."""


# --- logs ----------------------------------------------------------------------------------------------


def open_log(root: str | os.PathLike[str], experiment: str, pipeline: str = PIPELINE, **options: Any) -> CheckpointLog:
    """``CheckpointLog.open`` with the suites' defaults; ``options`` go to it as given (``blob_threshold=``, ...)."""
    return CheckpointLog.open(root, pipeline=pipeline, experiment=experiment, **options)


def copy_log(log: CheckpointLog, experiment: str) -> CheckpointLog:
    """A byte copy of ``log`` under another experiment name (a manifest to branch from)."""
    target = open_log(log.root, experiment, log.pipeline)
    if log.exists():
        shutil.copytree(log.uri, target.uri)
    return open_log(log.root, experiment, log.pipeline)


def raw_events(log: CheckpointLog, columns: list[str] | None = None) -> pa.Table:
    """Every stored row of the log (duplicates included), without the blob column."""
    cols = columns or [f.name for f in EVENT_SCHEMA if f.name != "value_blob"]
    if not log.exists():
        return EVENT_SCHEMA.empty_table().select(cols)
    return lance.dataset(log.uri, storage_options=log.storage_options).to_table(columns=cols)


def light_events(log: CheckpointLog) -> pa.Table:
    return raw_events(log, [*LIGHT_COLUMNS, "event_id"])


def write_events(table: pa.Table, root: str | os.PathLike[str], experiment: str) -> CheckpointLog:
    """A new log holding exactly ``table``'s rows (a merged manifest)."""
    lg = open_log(root, experiment)
    full = table
    for f in EVENT_SCHEMA:
        if f.name not in full.column_names:
            full = full.append_column(f.name, pa.nulls(full.num_rows, f.type))
    lance.write_dataset(full.select(EVENT_SCHEMA.names).cast(EVENT_SCHEMA), lg.uri, schema=EVENT_SCHEMA)
    return open_log(root, experiment)


def results_fp(log: CheckpointLog) -> str:
    """The export fingerprint without writing the export dataset (same code path as export_results)."""
    return results_fingerprint(collect_results(log))


def statuses(log: CheckpointLog) -> dict[str, str]:
    st = log.states()
    return dict(zip(st["item_id"].to_pylist(), st["status"].to_pylist()))


# --- crash injection -------------------------------------------------------------------------------------


@contextlib.contextmanager
def crash_at_commit(k: int) -> Iterator[dict[str, int]]:
    """Every ``LogWriter.commit`` from the ``k``-th (0-based) on raises :class:`Crash` before writing.

    That is what a process killed just before its k-th commit leaves behind: commits 0..k-1 durable,
    nothing after. The yielded dict counts the commits attempted.
    """
    original = LogWriter.commit
    seen = {"commits": 0}

    def commit(self: LogWriter, batch: Any, **kw: Any) -> int:
        n = seen["commits"]
        seen["commits"] = n + 1
        if n >= k:
            raise Crash(f"crash before commit {k}")
        return original(self, batch, **kw)

    LogWriter.commit = commit  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        LogWriter.commit = original  # type: ignore[method-assign]


def count_commits(fn: Callable[[], Any]) -> int:
    with crash_at_commit(1 << 30) as seen:
        fn()
    return seen["commits"]


# --- items and deterministic pipelines -------------------------------------------------------------------


def make_items(n: int, *, salt: str = "") -> list[dict[str, Any]]:
    return [{"id": i, "text": f"item-{i}{salt}", "weight": (i * 7) % 5 + 1} for i in range(n)]


class Recorder:
    """Counts calls per item id (the user function's view of 'invocations')."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, ctx: Any) -> None:
        self.calls.append(ctx.item_id)

    @property
    def by_item(self) -> Counter[str]:
        return Counter(self.calls)


def flat_output(item: dict[str, Any]) -> dict[str, Any]:
    text = str(item["text"])
    return {"upper": text.upper(), "score": len(text) * int(item.get("weight", 1))}


def flat_process(recorder: Recorder | None = None, emit: Callable[[str, str], None] | None = None) -> Any:
    """One leaf: the output is a pure function of the item; optionally emits one side effect."""

    def process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        if recorder is not None:
            recorder(ctx)
        out = flat_output(item)
        if emit is not None:
            emit(ctx.idempotency_key("notify"), canonical_json({"item": ctx.item_id, **out}))
        return out

    return process


def transient_first_attempts(process: Callable[..., Any]) -> Any:
    """``process`` where every fifth item fails its first attempt with a TimeoutError (retried in place)."""

    def flaky(item: dict[str, Any], ctx: Any) -> Any:
        if item["id"] % 5 == 0 and ctx.attempt == 1:
            raise TimeoutError(f"transient error of {ctx.item_id}")
        return process(item, ctx)

    return flaky


def as_async(process: Callable[..., Any], latency: float = 0.0) -> Any:
    """``process`` as an ``async def`` that waits ``latency`` seconds (a model call) before calling it."""

    async def process_async(item: dict[str, Any], ctx: Any) -> Any:
        await asyncio.sleep(latency)
        return process(item, ctx)

    return process_async


def steps_pipeline(hook: Callable[[str, Any], None] | None = None) -> Sequence:
    """Every driver, a fan-out and a selector in one pipeline; ``hook(step, ctx)`` runs before each leaf."""

    def h(step: str, ctx: Any) -> None:
        if hook is not None:
            hook(step, ctx)

    def parse(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        h("parse", ctx)
        return {"words": str(item["text"]).split("-"), "w": int(item.get("weight", 1))}

    def refine(item: dict[str, Any], ctx: Any) -> None:
        h("refine", ctx)
        ctx.append("trail", f"{ctx.iteration}:{ctx.fields['w'] * (ctx.iteration + 1)}")

    def leaf(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        h("leaf", ctx)
        return {"sq": item["v"] * item["v"]}

    def reduce(children: list[dict[str, Any]], ctx: Any) -> dict[str, Any]:
        return {"total": sum(c["sq"] for c in children)}

    def big(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        h("big", ctx)
        return {"kind": "big", "final": ctx.fields["total"] * 2}

    def small(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        h("small", ctx)
        return {"kind": "small", "final": ctx.fields["total"] + 1}

    return Sequence(
        "main",
        [
            Step("parse", parse),
            Loop("refine_loop", Step("refine", refine), times=2),
            MapReduce(
                "fan",
                over=lambda item, ctx: [{"v": v + ctx.fields["w"]} for v in range(len(ctx.fields["words"]) + 1)],
                map=Step("leaf", leaf),
                reduce=reduce,
            ),
            Conditional(
                "gate",
                lambda item, ctx: ctx.fields["total"] % 2 == 0,
                then=Step("big", big),
                otherwise=Step("small", small),
            ),
        ],
    )


def nested_pipeline(hook: Callable[[str, Any], None]) -> MapReduce:
    """A fan-out inside a fan-out: each root split into three sections, each section into three pieces."""

    def label(section: dict[str, Any], ctx: Any) -> dict[str, Any]:
        hook("label", ctx)
        return {"label": f"s{section['s']}"}

    def piece(part: dict[str, Any], ctx: Any) -> dict[str, Any]:
        hook("piece", ctx)
        return {"sq": part["v"] * part["v"]}

    pieces = MapReduce(
        "pieces",
        over=lambda section, ctx: [{"v": section["s"] * 10 + j} for j in range(3)],
        map=Step("piece", piece),
        reduce=lambda parts, ctx: {"sum": sum(p["sq"] for p in parts)},
    )
    return MapReduce(
        "sections",
        over=lambda item, ctx: [{"s": int(item["id"]) % 5 + k} for k in range(3)],
        map=Sequence("section", [Step("label", label), pieces]),
        reduce=lambda parts, ctx: {
            "total": sum(p["sum"] for p in parts),
            "labels": "|".join(p["label"] for p in parts),
        },
    )


def looped_pipeline(hook: Callable[[str, Any], None]) -> Loop:
    """A Loop running a fan-out three times: each child id has three generations (other inputs) of two steps."""

    def first(part: dict[str, Any], ctx: Any) -> dict[str, Any]:
        hook("first", ctx)
        return {"first": part["v"] * 10 + part["gen"]}

    def second(part: dict[str, Any], ctx: Any) -> dict[str, Any]:
        hook("second", ctx)
        return {"second": ctx.fields["first"] * 2}

    fan = MapReduce(
        "split",
        # each generation's children get other inputs: a child done in one is pending in the next
        over=lambda item, ctx: [{"v": int(item["id"]) * 3 + j, "gen": ctx.iteration} for j in range(3)],
        map=Sequence("pair", [Step("first", first), Step("second", second)]),
        reduce=lambda parts, ctx: {"sum": sum(p["second"] for p in parts)},
    )
    return Loop("again", fan, times=3)


def build_pipeline(kind: str, recorder: Recorder | None = None, emit: Any = None) -> Any:
    if kind == "flat":
        return flat_process(recorder, emit)

    def hook(step: str, ctx: Any) -> None:
        if recorder is not None:
            recorder(ctx)
        if emit is not None:
            emit(ctx.idempotency_key(step), canonical_json({"item": ctx.item_id, "step": step}))

    if kind == "steps":
        return steps_pipeline(hook)
    if kind == "nested":
        return nested_pipeline(hook)
    if kind == "looped":
        return looped_pipeline(hook)
    raise ValueError(f"unknown pipeline kind {kind!r}")


# --- side-effect receiver ----------------------------------------------------------------------------------


def append_line(path: str | os.PathLike[str], key: str, payload: str) -> None:
    """An append-only side effect that survives SIGKILL (one O_APPEND write)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{key}\t{payload}\n".encode())
    finally:
        os.close(fd)


def read_emissions(path: str | os.PathLike[str]) -> list[tuple[str, str]]:
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as fh:
        return [tuple(line.rstrip("\n").split("\t", 1)) for line in fh if line.strip()]  # type: ignore[misc]


def dedupe_receiver(emissions: list[tuple[str, str]]) -> dict[str, str]:
    """What a receiver that drops duplicate idempotency keys ends up holding."""
    out: dict[str, str] = {}
    for key, payload in emissions:
        if key in out:
            assert out[key] == payload, f"two different payloads under one idempotency key {key}"
            continue
        out[key] = payload
    return out


def export_rows(dest: str | Path) -> list[dict[str, Any]]:
    return lance.dataset(str(dest)).to_table().to_pylist()


def fields_of_export(dest: str | Path) -> dict[str, dict[str, Any]]:
    """Item id -> its fields, read back from the export's typed columns (JSON columns decoded, renamed
    columns under their field's name); a null reads as an absent field."""
    ds = lance.dataset(str(dest))
    decode = {}
    for f in ds.schema:
        if f.name in ("item_id", "key", "input"):
            continue
        meta = f.metadata or {}
        name = meta.get(b"datagen_field", f.name.encode()).decode()
        decode[f.name] = (name, meta.get(b"datagen_encoding") == b"json")
    out = {}
    for r in ds.to_table().to_pylist():
        out[r["item_id"]] = {
            name: json.loads(r[col]) if is_json else r[col]
            for col, (name, is_json) in decode.items()
            if r[col] is not None
        }
    return out


def calling_threads(monkeypatch: Any, name: str) -> list[str]:
    """The thread of every call of ``CheckpointLog.<name>`` from now on (the method still runs)."""
    threads: list[str] = []
    original = getattr(CheckpointLog, name)

    def spy(self: CheckpointLog, *args: Any, **kwargs: Any) -> Any:
        threads.append(threading.current_thread().name)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(CheckpointLog, name, spy)
    return threads
