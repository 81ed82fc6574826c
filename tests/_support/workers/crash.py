"""A ``run_items`` worker that kills itself with SIGKILL at a chosen point (crash-injection harness).

    python -m tests._support.workers.crash --root DIR --experiment E --n-items 30 \\
        --checkpoint-every 3 --kill-mode invocation --kill-after 7 [--kind steps] [--emit-file F] \\
        [--concurrency 4]

Kill modes (``--kill-after K``):

- ``none``: run to the end and print a JSON report on stdout.
- ``invocation``: die at the start of the (K+1)-th call of a user function (K calls finished).
- ``emit``: die right after the K-th side effect was appended to ``--emit-file`` (emitted, not acked).
- ``pull``: die right after the K-th inbox pull committed: the group's ITEM_CREATED rows are durable,
  none of its acks are (the window between the pull commit and the ack commit).
- ``commit``: die right after the K-th commit of any kind landed.
- ``before-commit``: die just before the K-th commit is written (its batch is lost).

``--sleep-ms`` slows each invocation so a parent can SIGKILL the worker after a random delay instead.

``--async-process`` runs the flat process as ``async def`` (its sleep an ``asyncio.sleep``), so
``--concurrency N`` puts N calls in flight on the event loop. ``--transient`` makes every fifth item
fail its first attempt with a TimeoutError under ``retry=RetryPolicy(attempts=3)``; kill mode
``backoff`` then dies in the K-th backoff wait (after its transient row was staged).
The pipelines come from :mod:`tests._support.engine`, so an in-process baseline runs the same
deterministic code. Exit status -9 (killed) is the expected outcome of every mode but ``none``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from typing import Any

#: what each call records with ``--usage``: a priced call (the caller's cost) and an unpriced one
USAGE = {"model": "test:fixed", "input_tokens": 10, "output_tokens": 5, "cost_usd": 0.001, "calls": 1}


def _die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--root", required=True)
    p.add_argument("--pipeline", default="engine", help="the log's pipeline name")
    p.add_argument("--experiment", required=True)
    p.add_argument("--n-items", type=int, required=True)
    p.add_argument("--checkpoint-every", default="none", help="an int, or 'none' for group commit")
    p.add_argument("--kill-after", type=int, default=0)
    p.add_argument(
        "--kill-mode",
        default="none",
        choices=["none", "invocation", "emit", "pull", "commit", "before-commit", "backoff"],
    )
    p.add_argument(
        "--kind", default="flat", choices=["flat", "steps", "nested", "looped"], help="which deterministic pipeline"
    )
    p.add_argument("--emit-file", default=None, help="append one line per side effect here")
    p.add_argument("--sleep-ms", type=float, default=0.0)
    p.add_argument("--epoch", type=int, default=None, help="writer epoch (default: log.next_epoch())")
    p.add_argument("--writer-id", default="crash-worker")
    p.add_argument("--salt", default="", help="changes every item's content (an edited source)")
    p.add_argument("--concurrency", type=int, default=1, help="run_items(concurrency=N): items in threads")
    p.add_argument("--async-process", action="store_true", help="the flat process as async def")
    p.add_argument("--transient", action="store_true", help="every fifth item fails its first attempt (retried)")
    p.add_argument("--usage", action="store_true", help="each call records usage (see USAGE) through ctx")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from airflow_provider_datagen.core import run_items
    from airflow_provider_datagen.core.runner.driver import Runner as _Runner
    from airflow_provider_datagen.core.store.writer import LogWriter
    from tests._support import engine as h

    mode, k = args.kill_mode, args.kill_after
    counts = {"invocations": 0, "emits": 0, "pulls": 0, "commits": 0, "waits": 0}

    class KillingRecorder(h.Recorder):
        def __call__(self, ctx: Any) -> None:
            if mode == "invocation" and counts["invocations"] >= k:
                _die()
            counts["invocations"] += 1
            if args.usage:
                ctx.record_usage(**USAGE)
            if args.sleep_ms and not args.async_process:
                time.sleep(args.sleep_ms / 1000.0)
            super().__call__(ctx)

    emit = None
    if args.emit_file:

        def emit(key: str, payload: str) -> None:
            h.append_line(args.emit_file, key, payload)
            counts["emits"] += 1
            if mode == "emit" and counts["emits"] >= k:
                _die()

    if mode in ("commit", "before-commit"):
        original_commit = LogWriter.commit

        def commit(self: LogWriter, batch: Any, **kw: Any) -> int:
            if mode == "before-commit" and counts["commits"] + 1 >= k:
                _die()
            n = original_commit(self, batch, **kw)
            counts["commits"] += 1
            if mode == "commit" and counts["commits"] >= k:
                self.log.wait_appends()  # "landed": a pipelined append finishes first
                _die()
            return n

        LogWriter.commit = commit  # type: ignore[method-assign]
    if mode == "pull":
        original_pull = _Runner.pull

        def pull(self: _Runner, items: Any) -> None:
            original_pull(self, items)
            if items:
                counts["pulls"] += 1
                if counts["pulls"] >= k:
                    self.log.wait_appends()  # the pull's rows are durable, none of its acks
                    _die()

        _Runner.pull = pull  # type: ignore[method-assign]

    log = h.open_log(args.root, args.experiment, args.pipeline)
    ce = None if args.checkpoint_every in ("none", "None", "") else int(args.checkpoint_every)
    epoch = args.epoch if args.epoch is not None else log.next_epoch()
    recorder = KillingRecorder()
    pipeline = h.build_pipeline(args.kind, recorder, emit)
    if args.transient:
        pipeline = h.transient_first_attempts(pipeline)
    if args.async_process:
        pipeline = h.as_async(pipeline, args.sleep_ms / 1000.0)
    retry = None
    if args.transient:
        from airflow_provider_datagen.core import RetryPolicy

        def sleep(seconds: float) -> Any:
            counts["waits"] += 1
            if mode == "backoff" and counts["waits"] >= k:
                _die()  # in the wait: the transient row is staged (committed with checkpoint_every=1)
            if args.async_process:
                import asyncio

                return asyncio.sleep(0.01)
            time.sleep(0.01)
            return None

        retry = RetryPolicy(attempts=3, retry_on=(TimeoutError,), backoff=30.0, max_backoff=30.0, sleep=sleep)
    report = run_items(
        log,
        h.make_items(args.n_items, salt=args.salt),
        pipeline,
        checkpoint_every=ce,
        writer_id=args.writer_id,
        epoch=epoch,
        checkpoint_interval=3600.0,
        concurrency=args.concurrency,
        retry=retry,
    )
    print(json.dumps({"killed": False, **report.as_dict(), "counts": counts}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
