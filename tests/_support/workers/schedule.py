"""A warm crash-schedule server: forks one child per attempt and SIGKILLs it at a chosen point.

    python -m tests._support.workers.schedule        # JSON requests on stdin, JSON replies on stdout

Starting Python and importing Lance costs about a second, so one server process imports everything
once and then forks a child per attempt. The server never touches a Lance dataset itself (Lance's
runtime is not fork-safe once started); every attempt, the resume and the export run in fresh forked
children, each a real process that dies by SIGKILL exactly as a killed Airflow worker would.

A request is one schedule::

    {"id": 7, "root": "/tmp/x", "experiment": "s7", "kind": "flat", "n_items": 30,
     "crashes": [{"checkpoint_every": 3, "mode": "in_commit", "k": 2, "delay_us": 400}, ...],
     "resume_checkpoint_every": null, "export": "/tmp/x/out7.lance"}

Every crash is an attempt that is killed (or finishes first, if the kill point is never reached); then
one clean resume runs to the end, checks that it redid exactly the unacknowledged items, and exports.
Kill modes, each counted from 1 within its attempt:

- ``invocation``: SIGKILL at the start of the k-th user-function call (k-1 calls finished).
- ``pull``: SIGKILL right after the k-th inbox pull committed (between a pull commit and its acks).
- ``commit``: SIGKILL right after the k-th commit of any kind landed.
- ``before_commit``: SIGKILL just before the k-th commit starts.
- ``in_commit``: the child tells the server when the k-th Lance append starts; the server SIGKILLs it
  ``delay_us`` later, so the kill lands inside Lance's write/commit (or shortly after it).
- ``in_maintain``: after the k-th commit the child runs ``log.maintain()``; the server SIGKILLs it
  ``delay_us`` after it started (mid compaction, index build or cleanup).
- ``wall``: the server SIGKILLs the child ``delay_us`` after forking it, wherever it is.

The reply holds, per attempt, whether the child was killed, and the resume's findings.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import sys
import time
import traceback
import warnings
from typing import Any

PIPELINE = "sched"
_SIGNAL = b"K"


# --- deterministic work ------------------------------------------------------------------------------------


def make_items(n: int) -> list[dict[str, Any]]:
    return [{"id": i, "text": f"t{i}-{'ab' * (i % 4)}", "w": i % 5 + 1} for i in range(n)]


def flat_process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
    text = str(item["text"])
    return {"upper": text.upper(), "score": len(text) * int(item["w"]), "key": ctx.key}


def run_kwargs(kind: str) -> dict[str, Any]:
    """``async``: eight calls in flight on the event loop, retrying the transient first attempts in place."""
    if kind != "async":
        return {}
    from airflow_provider_datagen.core import RetryPolicy

    return {"concurrency": 8, "retry": RetryPolicy(attempts=3, retry_on=(TimeoutError,), backoff=0.001, jitter=False)}


def build_pipeline(kind: str, counter: Any = None) -> Any:
    """``flat``: one leaf. ``steps``: a Sequence with a Loop, a MapReduce fan-out and a Conditional.
    ``async``: the flat leaf as ``async def``, every fifth item failing its first attempt (a transient
    TimeoutError retried in place, see :func:`run_kwargs`)."""

    def hooked(fn: Any) -> Any:
        def call(*args: Any) -> Any:
            if counter is not None:
                counter()
            return fn(*args)

        return call

    if kind == "flat":
        return hooked(flat_process)
    if kind == "async":
        import asyncio

        async def process(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
            if counter is not None:
                counter()  # every attempt is an invocation (a kill point too)
            await asyncio.sleep(0.001 * (item["id"] % 3))
            if item["id"] % 5 == 0 and ctx.attempt == 1:
                raise TimeoutError(f"transient error of {ctx.item_id}")
            return flat_process(item, ctx)

        return process
    from airflow_provider_datagen.core import Conditional, Loop, MapReduce, Sequence, Step

    def parse(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        return {"parts": str(item["text"]).split("-"), "w": int(item["w"])}

    def refine(item: dict[str, Any], ctx: Any) -> None:
        ctx.append("trail", f"{ctx.iteration}:{ctx.fields['w'] * (ctx.iteration + 1)}")

    def leaf(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        return {"sq": item["v"] * item["v"]}

    def reduce(children: list[dict[str, Any]], ctx: Any) -> dict[str, Any]:
        return {"total": sum(c["sq"] for c in children)}

    def even(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        return {"final": ctx.fields["total"] * 2}

    def odd(item: dict[str, Any], ctx: Any) -> dict[str, Any]:
        return {"final": ctx.fields["total"] + 1}

    return Sequence(
        "main",
        [
            Step("parse", hooked(parse)),
            Loop("refine_loop", Step("refine", hooked(refine)), times=2),
            MapReduce(
                "fan",
                over=lambda item, ctx: [{"v": v + ctx.fields["w"]} for v in range(len(ctx.fields["parts"]) + 1)],
                map=Step("leaf", hooked(leaf)),
                reduce=reduce,
            ),
            Conditional(
                "gate",
                lambda item, ctx: ctx.fields["total"] % 2 == 0,
                then=Step("even", hooked(even)),
                otherwise=Step("odd", hooked(odd)),
            ),
        ],
    )


# --- the child's side --------------------------------------------------------------------------------------


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _open_log(req: dict[str, Any]) -> Any:
    from airflow_provider_datagen.core import CheckpointLog

    return CheckpointLog.open(req["root"], pipeline=PIPELINE, experiment=req["experiment"])


def _attempt(req: dict[str, Any], crash: dict[str, Any], signal_fd: int) -> None:
    """One run of ``run_items`` with the kill point of ``crash`` armed (runs in a forked child)."""
    from airflow_provider_datagen.core import CheckpointLog, run_items
    from airflow_provider_datagen.core.runner.driver import Runner as _Runner
    from airflow_provider_datagen.core.store.writer import LogWriter

    mode, k = crash["mode"], int(crash.get("k", 1))
    counts = {"invocations": 0, "pulls": 0, "commits": 0, "appends": 0, "signalled": 0}

    def tell_server() -> None:
        counts["signalled"] = 1
        os.write(signal_fd, _SIGNAL)

    def on_invocation() -> None:
        counts["invocations"] += 1
        if mode == "invocation" and counts["invocations"] >= k:
            _die()

    original_commit = LogWriter.commit

    def commit(self: Any, batch: Any, **kw: Any) -> int:
        if mode == "before_commit" and counts["commits"] + 1 >= k:
            _die()
        n = original_commit(self, batch, **kw)
        counts["commits"] += 1
        if mode == "commit" and counts["commits"] >= k:
            self.log.wait_appends()  # "landed": a pipelined append finishes first
            _die()
        if mode == "in_maintain" and counts["commits"] == k:
            tell_server()
            self.log.maintain()
            time.sleep(5)  # the server kills us during or right after maintenance
        return n

    LogWriter.commit = commit  # type: ignore[method-assign]

    original_append = CheckpointLog.append

    def append(self: Any, table: Any) -> None:
        counts["appends"] += 1
        if mode == "in_commit" and counts["appends"] == k:
            tell_server()  # the server sleeps delay_us and sends SIGKILL while Lance writes
        original_append(self, table)

    CheckpointLog.append = append  # type: ignore[method-assign]

    original_pull = _Runner.pull

    def pull(self: Any, items: Any) -> None:
        original_pull(self, items)
        if items:
            counts["pulls"] += 1
            if mode == "pull" and counts["pulls"] >= k:
                self.log.wait_appends()  # the pull's rows are durable, none of its acks
                _die()

    _Runner.pull = pull  # type: ignore[method-assign]

    log = _open_log(req)
    ce = crash.get("checkpoint_every")
    run_items(
        log,
        make_items(req["n_items"]),
        build_pipeline(req["kind"], on_invocation),
        checkpoint_every=ce,
        writer_id=f"attempt-{os.getpid()}",
        epoch=log.next_epoch(),
        checkpoint_interval=3600.0,
        **run_kwargs(req["kind"]),
    )
    if counts["signalled"]:
        time.sleep(5)  # the kill point was reached near the very end: let the server's kill land


def _resume(req: dict[str, Any]) -> dict[str, Any]:
    """The clean resume: redo exactly what is not acknowledged, then export (runs in a forked child)."""
    from airflow_provider_datagen.core import export_results, plan_resume, run_items

    log = _open_log(req)
    items = make_items(req["n_items"])
    orphans = _orphan_data_files(log)
    before = log.states()
    done_before = {
        iid
        for iid, st in zip(before["item_id"].to_pylist(), before["status"].to_pylist())
        if st == "completed" and "/" not in iid
    }
    calls = {"n": 0}

    def count() -> None:
        calls["n"] += 1

    report = run_items(
        log,
        items,
        build_pipeline(req["kind"], count),
        checkpoint_every=req.get("resume_checkpoint_every"),
        writer_id="resume",
        epoch=log.next_epoch(),
        checkpoint_interval=3600.0,
        **run_kwargs(req["kind"]),
    )
    summary = log.summary()
    again = plan_resume(log, items)
    exported = export_results(log, req["export"])
    return {
        "orphan_data_files": orphans,
        "done_before": sorted(done_before),
        "processed": report.processed,
        "skipped": report.skipped,
        "failed": report.failed,
        "errors": report.errors,
        "invocations": calls["n"],
        "completed": summary["completed"],
        "pending": summary["pending"],
        "fencing_violations": summary["fencing_violations"],
        "pending_after": len(again.pending),
        "rows": exported["rows"],
        "fingerprint": exported["fingerprint"],
    }


def _orphan_data_files(log: Any) -> int:
    """Data files no committed version references: what a kill inside a Lance commit leaves behind."""
    import lance

    data_dir = os.path.join(log.uri, "data")
    if not os.path.isdir(data_dir):
        return 0
    present = set(os.listdir(data_dir))
    versions_dir = os.path.join(log.uri, "_versions")
    # A kill inside the very first commit can leave _versions/ without any manifest: no version
    # references anything yet (and lance.dataset would say "not found").
    if not os.path.isdir(versions_dir) or not any(n.endswith(".manifest") for n in os.listdir(versions_dir)):
        return len(present)
    referenced = set()
    for version in lance.dataset(log.uri).versions():  # a few ms each
        for frag in lance.dataset(log.uri, version=version["version"]).get_fragments():
            referenced.update(os.path.basename(f.path) for f in frag.data_files())
    return len(present - referenced)


# --- the server's side -------------------------------------------------------------------------------------


def _fork(target: Any, *args: Any) -> tuple[int, int, int]:
    """Fork a child running ``target(*args, signal_fd)``; returns (pid, signal read fd, result read fd)."""
    sig_r, sig_w = os.pipe()
    res_r, res_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 0
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)  # stdout is the server's reply channel
            os.close(sig_r)
            os.close(res_r)
            out = target(*args, sig_w)
            payload = json.dumps({"ok": True, "value": out}).encode()
        except BaseException:
            payload = json.dumps({"ok": False, "error": traceback.format_exc()}).encode()
            code = 1
        try:
            view = memoryview(payload)
            while view:
                view = view[os.write(res_w, view) :]
        finally:
            os._exit(code)
    os.close(sig_w)
    os.close(res_w)
    return pid, sig_r, res_r


def _read_all(fd: int) -> bytes:
    chunks = []
    while True:
        data = os.read(fd, 1 << 16)
        if not data:
            return b"".join(chunks)
        chunks.append(data)


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _wait_precisely(delay: float) -> None:
    """Sleep most of ``delay``, busy-wait the last millisecond: sub-millisecond kill points."""
    end = time.monotonic() + delay
    if delay > 0.002:
        time.sleep(delay - 0.001)
    while time.monotonic() < end:
        pass


def run_attempt(req: dict[str, Any], crash: dict[str, Any]) -> dict[str, Any]:
    mode = crash["mode"]
    delay = float(crash.get("delay_us", 0)) / 1e6
    pid, sig_r, res_r = _fork(lambda fd: _attempt(req, crash, fd))
    deadline = time.monotonic() + 60.0
    if mode == "wall":
        _wait_precisely(delay)
        _kill(pid)
    elif mode in ("in_commit", "in_maintain"):
        ready, _, _ = select.select([sig_r], [], [], 60.0)
        if ready and os.read(sig_r, 1) == _SIGNAL:
            _wait_precisely(delay)
            _kill(pid)
    payload = _read_all(res_r)
    os.close(sig_r)
    os.close(res_r)
    while True:
        wpid, status = os.waitpid(pid, os.WNOHANG)
        if wpid:
            break
        if time.monotonic() > deadline:
            _kill(pid)
        time.sleep(0.001)
    killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    out: dict[str, Any] = {"mode": mode, "killed": killed}
    if not killed:
        result = json.loads(payload) if payload else {"ok": False, "error": f"exit status {status}"}
        if not result["ok"]:
            out["error"] = result["error"]
    return out


def run_resume(req: dict[str, Any]) -> dict[str, Any]:
    pid, sig_r, res_r = _fork(lambda fd: _resume(req))
    payload = _read_all(res_r)
    os.close(sig_r)
    os.close(res_r)
    _, status = os.waitpid(pid, 0)
    if not payload:
        return {"ok": False, "error": f"the resume died with status {status}"}
    return json.loads(payload)


def handle(req: dict[str, Any]) -> dict[str, Any]:
    attempts = [run_attempt(req, crash) for crash in req.get("crashes", [])]
    return {"id": req["id"], "attempts": attempts, "resume": run_resume(req)}


def serve() -> None:
    warnings.filterwarnings("ignore", message="lance is not fork-safe")
    # Warm every import once (including what the first fold imports lazily); the server itself never
    # opens a dataset, so each forked child starts Lance's runtime afresh.
    import zoneinfo

    import lance
    import numpy.ma

    import airflow_provider_datagen.core
    import airflow_provider_datagen.core.runner

    del zoneinfo, lance, numpy, airflow_provider_datagen

    out = sys.stdout
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        try:
            reply = handle(req)
        except BaseException:
            reply = {"id": req.get("id"), "server_error": traceback.format_exc()}
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    serve()
