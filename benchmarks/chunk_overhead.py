"""What one mapped task pays besides its items: its chunk's states, and the experiment's status at the end.

A mapped task (``DatagenMapOperator.execute``) opens the log, takes an epoch, runs ``run_items`` over
its chunk and pushes ``folded_status``. Each case here is that sequence on a fresh log object (a new
task process) over a synthetic log of N items (~4.9 events each, 95 % done), timed in parts:

* *nothing pending*: a chunk of 1,000 items all done (another try of a finished task);
* *pending*: a chunk of 100 fresh no-op items (new ids each repeat), the work a chunk adds.

Both on a maintained log (the projection and the indices current) and with a tail: 10 chunks of 1,000
items written after the maintenance, as the tasks before this one leave it. The *before* figures are
the same sequence with the whole-log reads this replaced, in the same run: ``run_items`` classifying
against ``states()`` (the fold of every item) and the status from ``status_of(log)`` (``states()``
and a count over all of them).

Run alone: ``python -m benchmarks.chunk_overhead [--quick]``; ``python -m benchmarks.run --only chunk``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterator

REPEATS = 3
DONE_CHUNK = 1000
PENDING_CHUNK = 100
TAIL_CHUNKS = 10


def _noop(item: dict[str, Any], ctx: Any) -> None:
    return None


@contextlib.contextmanager
def _whole_log_reads() -> Iterator[None]:
    """The reads before this change: the chunk classified against the fold of every item."""
    from airflow_provider_datagen.core.store.log import CheckpointLog

    original = CheckpointLog.states_of
    CheckpointLog.states_of = lambda self, ids: self.states()  # type: ignore[method-assign,assignment,misc]
    try:
        yield
    finally:
        CheckpointLog.states_of = original  # type: ignore[method-assign]


def _task(root: Path, items: list[dict[str, Any]], writer: str, before: bool) -> dict[str, float]:
    """One mapped task's sequence on a fresh log object, timed in parts."""
    from airflow_provider_datagen.core import CheckpointLog, run_items, status_of
    from airflow_provider_datagen.operators.base import folded_status

    t0 = time.perf_counter()
    log = CheckpointLog.open(root, pipeline="p", experiment="e")
    epoch = log.next_epoch()
    t1 = time.perf_counter()
    with _whole_log_reads() if before else contextlib.nullcontext():
        run_items(log, items, _noop, writer_id=writer, epoch=epoch)
    t2 = time.perf_counter()
    status = status_of(log) if before else folded_status(log)
    t3 = time.perf_counter()
    assert status["total"] > 0
    return {"open_epoch_s": t1 - t0, "run_items_s": t2 - t1, "status_s": t3 - t2, "total_s": t3 - t0}


def _median(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def _cases(root: Path, items: list[dict[str, Any]], label: str) -> dict[str, Any]:
    done = items[len(items) // 2 : len(items) // 2 + DONE_CHUNK]  # 95 % of them done, the rest replayed
    out: dict[str, Any] = {}
    for case in ("nothing_pending", "pending"):
        for before in (True, False):
            runs = []
            for k in range(REPEATS):
                writer = f"{label}-{case}-{'b' if before else 'a'}{k}"
                fresh = [{"id": f"{writer}-{i}", "prompt": "p"} for i in range(PENDING_CHUNK)]
                chunk = done if case == "nothing_pending" else fresh
                runs.append(_task(root, chunk, writer, before))
            out[f"{case}_{'before' if before else 'after'}"] = _median(runs)
        b, a = out[f"{case}_before"]["total_s"], out[f"{case}_after"]["total_s"]
        out[f"{case}_speedup"] = b / a
    return out


def bench_chunk_overhead(tmp: Path, quick: bool) -> dict[str, Any]:
    from airflow_provider_datagen.core import CheckpointLog, run_items
    from benchmarks.synth import build_log, source_items

    sizes = (20_000, 100_000) if quick else (100_000, 1_000_000)
    rows = []
    for n in sizes:
        root = tmp / f"chunk_overhead_{n}"
        items = source_items(n)
        log = CheckpointLog.open(root, pipeline="p", experiment="e")
        events = build_log(log, items, 0.95, appends=10)
        log.maintain()
        row: dict[str, Any] = {"items": n, "events": events, "done_chunk": DONE_CHUNK, "pending_chunk": PENDING_CHUNK}
        row["maintained"] = _cases(root, items, "m")
        log.maintain()  # the cases above wrote a little: the projection current again
        for k in range(TAIL_CHUNKS):
            tail = [{"id": f"tail-{k}-{i}", "prompt": "p"} for i in range(DONE_CHUNK)]
            run_items(log, tail, _noop, writer_id=f"tail{k}", epoch=log.next_epoch())
        row["tail_items"] = TAIL_CHUNKS * DONE_CHUNK
        row["with_tail"] = _cases(root, items, "t")
        rows.append(row)
        for where in ("maintained", "with_tail"):
            r = row[where]
            print(
                f"  {n:,} items, {where.replace('_', ' ')}: per chunk, nothing pending "
                f"{r['nothing_pending_before']['total_s'] * 1000:.0f} -> "
                f"{r['nothing_pending_after']['total_s'] * 1000:.0f} ms "
                f"({r['nothing_pending_speedup']:.1f}x), {PENDING_CHUNK} pending no-op items "
                f"{r['pending_before']['total_s'] * 1000:.0f} -> {r['pending_after']['total_s'] * 1000:.0f} ms "
                f"({r['pending_speedup']:.1f}x)",
                flush=True,
            )
    return {"sizes": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.chunk_overhead")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="datagen-chunk-") as tmp:
        print(json.dumps(bench_chunk_overhead(Path(tmp), args.quick), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
