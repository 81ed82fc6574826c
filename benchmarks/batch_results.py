"""Batch mode's recording cost: the per-item overhead of recording N batch results (default 100k).

A round of ``BatchRun`` over an ended batch of N rows (an in-memory client: no HTTP, no provider
latency, so what is timed is reading the rows, validating the answers, pricing the usage and writing
each item's fields, usage and completion to the log), against the same-run baseline: ``run_items``
writing the same fields and the same usage for the same items (a process that returns them at once).
Both logs start empty and hold the same fields at the end (checked). Target: <= 20 us per item. Also timed:
the same recording by a resumed task (a new ``BatchRun`` over a reopened log, as the deferred operator
resumes), whose writer knows nothing of the items yet.

Run alone: ``python -m benchmarks.batch_results [--quick]``; ``python -m benchmarks.run --only batch``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_provider_datagen.core import CheckpointLog, run_items
from airflow_provider_datagen.core.batch import BatchConfig, BatchRun, custom_id
from airflow_provider_datagen.core.batch.protocol import BatchInfo, RowResult
from airflow_provider_datagen.core.ledger.pricing import price_usd
from airflow_provider_datagen.llm import llm_batch

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence

    from airflow_provider_datagen.core.batch.protocol import RequestLine

MODEL = "gpt-4o-mini"
TARGET_US = 20.0


class _EndedClient:
    """A batch client whose one batch has ended with a succeeded row for every request submitted."""

    provider = "openai"
    max_requests = 10**9
    max_bytes = 10**15
    supports_metadata = True

    def __init__(self) -> None:
        self.rows: list[RowResult] = []

    def line_bytes(self, line: RequestLine) -> int:
        return 100

    def submit(self, lines: Sequence[RequestLine], *, metadata: Mapping[str, str]) -> str:
        self.rows = [RowResult(ln.custom_id, "succeeded", f"answer {ln.custom_id[:8]}", MODEL, 20, 10) for ln in lines]
        return "batch_bench"

    def find(self, metadata: Mapping[str, str], *, created_after: float) -> str | None:
        return None

    def retrieve(self, batch_id: str) -> BatchInfo:
        return BatchInfo(batch_id, "ended", "completed", {"succeeded": len(self.rows)})

    def results(self, batch_id: str) -> Iterator[RowResult]:
        return iter(self.rows)

    def cancel(self, batch_id: str) -> None:
        pass

    def close(self) -> None:
        pass


def _items(n: int) -> list[dict[str, Any]]:
    return [{"id": f"k{i:07d}", "text": f"prompt {i}"} for i in range(n)]


def bench_batch_results(tmp: Path, quick: bool) -> dict[str, Any]:
    n = 10_000 if quick else 100_000
    items = _items(n)
    step = llm_batch("Say {{ text }}", model_id=f"openai:{MODEL}", base_url="http://127.0.0.1:9/v1", api_key="k")
    client = _EndedClient()
    step.client().close()  # resolves the step's model (base_url= and api_key= given: no connection read)
    # genai-prices loads its table on the first price (~0.3 s, once per process): paid before either timing,
    # as the second one timed would otherwise find it loaded by the first
    price_usd(f"openai:{MODEL}", 1, 1)

    log = CheckpointLog.open(str(tmp / "batch"), pipeline="bench", experiment="batch")
    run = BatchRun(log, items, step, BatchConfig(processor_version=step.version, writer_id="w", epoch=1))
    (sub,) = run.advance(client)  # submits: ITEM_CREATED for every item, the intent and the submission
    t = time.perf_counter()
    run.advance(client)  # polls (ended) and records every row
    batch_s = time.perf_counter() - t
    assert log.summary()["completed"] == n, log.summary()

    # The Airflow path: the task submits, defers, and resumes in another process, whose new BatchRun (and
    # writer) knows nothing of the items yet.
    submitted = CheckpointLog.open(str(tmp / "resumed"), pipeline="bench", experiment="resumed")
    BatchRun(submitted, items, step, BatchConfig(processor_version=step.version, writer_id="w", epoch=1)).advance(
        client
    )
    reopened = CheckpointLog.open(str(tmp / "resumed"), pipeline="bench", experiment="resumed")
    resumed = BatchRun(reopened, items, step, BatchConfig(processor_version=step.version, writer_id="w", epoch=1))
    t = time.perf_counter()
    resumed.advance(client)
    resumed_s = time.perf_counter() - t
    assert reopened.summary()["completed"] == n, reopened.summary()

    answers = {it["id"]: f"answer {custom_id(it['id'], fp, 1)[:8]}" for it, fp in zip(items, _fps(run), strict=True)}

    def process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        ctx.record_usage(model=f"openai:{MODEL}", input_tokens=20, output_tokens=10)
        return {"output": answers[item["id"]]}

    online = CheckpointLog.open(str(tmp / "online"), pipeline="bench", experiment="online")
    t = time.perf_counter()
    run_items(online, items, process, processor_version=step.version)
    online_s = time.perf_counter() - t
    same = online.states_of([items[0]["id"]]).num_rows == 1 and (
        log.item_state(items[-1]["id"]).fields == online.item_state(items[-1]["id"]).fields
    )
    out = {
        "items": n,
        "batch_record_s": round(batch_s, 3),
        "batch_us_per_item": round(batch_s / n * 1e6, 2),
        "resumed_record_s": round(resumed_s, 3),
        "resumed_us_per_item": round(resumed_s / n * 1e6, 2),
        "run_items_s": round(online_s, 3),
        "run_items_us_per_item": round(online_s / n * 1e6, 2),
        "ratio_batch_over_run_items": round(batch_s / online_s, 3),
        "target_us_per_item": TARGET_US,
        "same_fields": same,
        "submission": sub.submission_key,
    }
    print(
        f"   recording {n:,} batch results: {out['batch_us_per_item']} us/item "
        f"(run_items writing the same fields: {out['run_items_us_per_item']} us/item; ratio "
        f"{out['ratio_batch_over_run_items']}; target <= {TARGET_US} us/item); same fields: {same}; "
        f"recorded by a resumed task (a new run and writer): {out['resumed_us_per_item']} us/item"
    )
    return out


def _fps(run: BatchRun) -> list[str]:
    return [it.fingerprint for it in run.items]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.batch_results")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="datagen-bench-batch-"))
    try:
        print(json.dumps(bench_batch_results(tmp, args.quick), indent=2))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
